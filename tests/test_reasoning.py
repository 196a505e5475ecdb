"""Test-time selection and step search against independent references."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tiny_models import make_model_dir

from agentic_jax.eval import pass_at_k
from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.reasoning import (
    Budget,
    StepModel,
    aggregate_steps,
    best_of_n,
    maj_at_k,
    majority_vote,
    root,
    step_beam_search,
)

answer_lists = st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=1, max_size=12)


@given(answer_lists)
def test_majority_vote_is_a_counter_majority_with_first_seen_ties(answers):
    counts = collections.Counter(a for a in answers if a is not None)
    # Counter.most_common orders equal counts by first occurrence: the documented tie rule.
    expected = counts.most_common(1)[0][0] if counts else None
    assert majority_vote(answers) == expected


@given(st.data())
def test_weighted_vote_matches_a_numpy_reference(data):
    answers = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=12))
    # Integer-valued weights sum exactly in any order, so ties are ties for both sides.
    weights = data.draw(st.lists(st.integers(0, 5), min_size=len(answers), max_size=len(answers)))
    values, first, inverse = np.unique(answers, return_index=True, return_inverse=True)
    totals = np.bincount(inverse, weights=np.asarray(weights, float))
    tied = values[totals == totals.max()]
    expected = min(tied, key=lambda v: first[np.searchsorted(values, v)])
    assert majority_vote(answers, np.asarray(weights, float)) == expected


def test_maj_at_k_votes_over_the_first_k_samples():
    answers = [["1", "2", "2"], ["3", None, "3"], [None, None, "5"]]
    np.testing.assert_array_equal(maj_at_k(answers, ["2", "3", "5"], 3), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(maj_at_k(answers, ["2", "3", "5"], 1), [0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="maj@4"):
        maj_at_k(answers, ["2", "3", "5"], 4)


@given(
    hnp.arrays(np.int8, st.tuples(st.integers(1, 6), st.integers(1, 8)), elements=st.integers(0, 1))
)
def test_oracle_best_of_n_has_the_success_of_pass_at_n(correct):
    chosen = best_of_n(correct)
    success = correct[np.arange(len(correct)), chosen]
    n = correct.shape[1]
    expected = pass_at_k(np.full(len(correct), n), correct.sum(1).astype(int), n)
    np.testing.assert_array_equal(success, expected)


def _reference(scores, mask, how):
    out = []
    for row, keep in zip(scores, mask):
        real = row[keep]
        out.append(
            {"min": real.min(), "product": real.prod(), "last": real[-1], "mean": real.mean()}[how]
        )
    return np.array(out)


@settings(max_examples=50)
@given(st.data(), st.sampled_from(["min", "product", "last", "mean"]))
def test_step_aggregation_matches_numpy(data, how):
    shape = data.draw(st.tuples(st.integers(1, 5), st.integers(1, 7)))
    scores = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(0, 1, width=32)))
    mask = data.draw(hnp.arrays(bool, shape))
    mask[:, 0] |= ~mask.any(1)  # every solution has a step
    got = jax.jit(aggregate_steps, static_argnames="how")(scores, mask, how=how)
    np.testing.assert_allclose(got, _reference(scores, mask, how), rtol=1e-5, atol=1e-6)


def test_step_aggregation_rejects_unknown_names_and_shapes():
    with pytest.raises(ValueError, match="unknown aggregation 'max'"):
        aggregate_steps(jnp.ones((2, 3)), jnp.ones((2, 3), bool), "max")
    with pytest.raises(ValueError, match="differ in shape"):
        aggregate_steps(jnp.ones((2, 3)), jnp.ones((2, 4), bool))


def test_budget_counts_and_refuses_an_overrun():
    budget = Budget(model_calls=5, tokens=40)
    assert budget.affordable(8, 10) == 4
    budget.charge(3, 25)
    assert budget.affordable(8, 10) == 1
    with pytest.raises(RuntimeError, match="overrun"):
        budget.charge(3, 0)
    with pytest.raises(ValueError, match=r"Budget\.tokens"):
        Budget(tokens=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    config, params, tokenizer = make_model_dir(tmp_path_factory.mktemp("reasoning"), max_seq_len=96)
    prompt = tokenizer.encode("the model reads", add_bos=True)
    greedy = generate(
        params,
        config,
        [prompt],
        sampling=SamplingParams(temperature=0, max_tokens=60),
        key=jax.random.key(0),
        pad_id=tokenizer.pad_id or 0,
    )
    continuation = np.asarray(greedy.tokens[0, : int(greedy.lengths[0])]).tolist()
    return config, params, tokenizer, prompt, continuation


def test_width_one_step_beam_is_greedy_step_decoding(tiny):
    config, params, tokenizer, prompt, continuation = tiny
    # A delimiter the greedy text really contains, so the continuation splits into several steps.
    delimiter = tokenizer.decode(continuation[3:4], skip_special_tokens=True)
    assert delimiter
    model = StepModel(params, config, tokenizer, delimiters=(delimiter,), max_step_tokens=12)
    result = step_beam_search(
        model,
        prompt,
        lambda states: np.zeros(len(states)),
        key=jax.random.key(1),
        width=1,
        expansions=1,
        temperature=0.0,
        max_steps=30,
        budget=Budget(tokens=24),
    )
    steps = result.best.steps
    assert len(steps) >= 2
    flat = [t for step in steps for t in step]
    assert flat == continuation[: len(flat)]
    for step in steps[:-1]:  # each step ends at the delimiter's first appearance
        assert delimiter in model.text(step) and delimiter not in model.text(step[:-1])


@settings(max_examples=8, deadline=None)
@given(
    calls=st.one_of(st.none(), st.integers(1, 12)),
    tokens=st.one_of(st.none(), st.integers(1, 80)),
    width=st.integers(1, 3),
    expansions=st.integers(1, 3),
)
def test_every_method_stops_within_its_budget(tiny, calls, tokens, width, expansions):
    config, params, tokenizer, prompt, _ = tiny
    model = StepModel(params, config, tokenizer, delimiters=(" ",), max_step_tokens=6)
    budget = Budget(model_calls=calls, tokens=tokens)
    result = step_beam_search(
        model,
        prompt,
        lambda s: np.array([len(x.tokens) % 3 for x in s], float),
        key=jax.random.key(2),
        width=width,
        expansions=expansions,
        max_steps=4,
        budget=budget,
    )
    assert len(result.candidates) <= width
    assert calls is None or budget.calls_spent <= calls
    assert tokens is None or budget.tokens_spent <= tokens
    budget = Budget(model_calls=calls, tokens=tokens)
    samples = model.complete([root(prompt)] * 3, key=jax.random.key(3), max_steps=3, budget=budget)
    # Sampling from the root, every charged step is in exactly one sample.
    assert budget.tokens_spent == sum(len(s.generated) for s in samples)
    assert budget.calls_spent == sum(len(s.steps) for s in samples)
    assert calls is None or budget.calls_spent <= calls
    assert tokens is None or budget.tokens_spent <= tokens
