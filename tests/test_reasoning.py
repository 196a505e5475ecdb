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
from agentic_jax.models import forward
from agentic_jax.reasoning import (
    Budget,
    State,
    StepModel,
    best_of_n,
    budget_forcing,
    depth_first_search,
    maj_at_k,
    majority_vote,
    rollout_scorer,
    root,
    self_evaluation_scorer,
    step_beam_search,
    step_scores,
    token_scorer,
    vote_scorer,
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
    for subtrees, beam in ((1, width), (width, 1)):  # a beam, then DVTS
        budget = Budget(model_calls=calls, tokens=tokens)
        result = step_beam_search(
            model,
            prompt,
            _parity_score,
            key=jax.random.key(2),
            width=beam,
            subtrees=subtrees,
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


def _parity_score(states):
    """A deterministic stand-in for a PRM: how many generated token ids are even, scaled."""
    return np.array([sum(t % 2 == 0 for t in s.generated) / 10 for s in states], float)


def test_token_scorer_masks_exactly_the_generated_tokens(tiny):
    config, params, tokenizer, prompt, _ = tiny
    model = StepModel(params, config, tokenizer, delimiters=(" ",), max_step_tokens=5)
    samples = model.complete([root(prompt)] * 3, key=jax.random.key(4), max_steps=2)
    seen = token_scorer(lambda tokens, mask: mask.sum(1))(samples)
    np.testing.assert_array_equal(seen, [len(s.generated) for s in samples])


@pytest.mark.parametrize("aggregation", ["last", "min", "mean"])
@pytest.mark.parametrize("search", ["beam", "dvts"])
def test_search_values_are_the_aggregated_path_scores(tiny, search, aggregation):
    config, params, tokenizer, prompt, _ = tiny
    model = StepModel(params, config, tokenizer, delimiters=(" ",), max_step_tokens=5)
    kwargs = dict(key=jax.random.key(5), expansions=2, max_steps=3, aggregation=aggregation)
    if search == "beam":
        result = step_beam_search(model, prompt, _parity_score, width=3, **kwargs)
    else:
        result = step_beam_search(model, prompt, _parity_score, subtrees=3, width=1, **kwargs)
    assert 1 <= len(result.candidates) <= 3
    for state, value in zip(result.candidates, result.values):
        # Recompute the path from scratch: the scorer on every prefix that ends a step.
        ends = np.cumsum([len(step) for step in state.steps])
        prefixes = [
            State(state.tokens[: state.prompt_length + e], state.prompt_length) for e in ends
        ]
        path = _parity_score(prefixes)
        scores, mask = step_scores(_parity_score, [state])
        np.testing.assert_allclose(scores[0, : len(path)], path, atol=1e-6)
        assert mask.sum() == len(path)
        expected = {"last": path[-1], "min": path.min(), "mean": path.mean()}[aggregation]
        assert value == pytest.approx(expected, abs=1e-6)
    assert result.best == result.candidates[int(np.argmax(result.values))]


def _forcing_model(tiny, stop):
    config, params, tokenizer, prompt, continuation = tiny
    return StepModel(params, config, tokenizer, stop_token_ids=(stop,)), prompt, continuation


def test_budget_forcing_replaces_an_early_end_by_the_cue(tiny):
    # The greedy continuation's third token is made the end of turn: the model "stops" early.
    model, prompt, continuation = _forcing_model(tiny, stop=tiny[4][2])
    cue = model.tokenizer.encode("Wait,")
    assert continuation[2] not in cue
    budget = Budget()
    (state,) = budget_forcing(
        model, [prompt], key=jax.random.key(0), min_tokens=12, max_tokens=40, budget=budget
    )
    generated = list(state.generated)
    assert generated[:2] == continuation[:2] and generated[2 : 2 + len(cue)] == cue
    assert len(generated) >= 12
    # Every early end was removed: the stop token can only be the very last token.
    assert continuation[2] not in generated[:-1]
    # The model was charged for what it sampled: not the cues, but the removed early ends.
    cues, answer = cue_count(generated, cue), model.tokenizer.encode("<answer>")
    forced = cue_count(generated, answer)
    assert budget.tokens_spent == len(generated) - cues * len(cue) - forced * len(answer) + cues


def cue_count(tokens, cue):
    return sum(tokens[i : i + len(cue)] == cue for i in range(len(tokens)))


def test_budget_forcing_cuts_at_max_tokens_and_asks_for_the_answer(tiny):
    model, prompt, continuation = _forcing_model(tiny, stop=model_free_id(tiny))
    answer = model.tokenizer.encode("<answer>")
    (state,) = budget_forcing(
        model, [prompt], key=jax.random.key(0), max_tokens=8, answer_tokens=5, temperature=0.0
    )
    generated = list(state.generated)
    assert generated[:8] == continuation[:8]
    assert generated[8 : 8 + len(answer)] == answer
    assert len(generated) == 8 + len(answer) + 5 and state.done
    with pytest.raises(ValueError, match="min_tokens < max_tokens"):
        budget_forcing(model, [prompt], key=jax.random.key(0), min_tokens=8, max_tokens=8)


def model_free_id(tiny):
    """A token id the greedy continuation never produces, as an end that never comes."""
    return next(t for t in range(tiny[2].vocab_size) if t not in tiny[4])


def test_depth_first_search_with_one_greedy_expansion_is_greedy_decoding(tiny):
    config, params, tokenizer, prompt, continuation = tiny
    delimiter = tokenizer.decode(continuation[3:4], skip_special_tokens=True)
    model = StepModel(params, config, tokenizer, delimiters=(delimiter,), max_step_tokens=12)
    result = depth_first_search(
        model,
        prompt,
        lambda s: np.zeros(len(s)),
        key=jax.random.key(1),
        expansions=1,
        threshold=-np.inf,
        temperature=0.0,
        max_steps=5,
        max_expansions=5,  # exactly the depth: the last expansion's child still counts
    )
    flat = [t for step in result.best.steps for t in step]
    assert len(result.best.steps) == 5 and flat == continuation[: len(flat)]
    assert [s.steps for s in result.candidates] == [result.best.steps]


class _Counting(StepModel):
    """A StepModel that records every state it is asked to expand."""

    def expand(self, states, k, **kwargs):
        self.expanded = getattr(self, "expanded", []) + list(states)
        return super().expand(states, k, **kwargs)


def test_depth_first_search_never_expands_a_pruned_thought_and_backtracks(tiny):
    config, params, tokenizer, prompt, _ = tiny
    model = _Counting(params, config, tokenizer, delimiters=(" ",), max_step_tokens=4)
    budget = Budget(model_calls=40)
    result = depth_first_search(
        model,
        prompt,
        _parity_score,
        key=jax.random.key(2),
        expansions=3,
        threshold=0.1,
        max_steps=3,
        max_expansions=12,
        budget=budget,
        accept=lambda s: False,
    )
    for state in model.expanded[1:]:  # the root is never scored
        prefix_values = _parity_score(
            [
                State(state.tokens[: state.prompt_length + e], state.prompt_length)
                for e in np.cumsum([len(s) for s in state.steps])
            ]
        )
        assert prefix_values[-1] >= 0.1
    # Nothing was accepted, so the search went on until it ran out of expansions or thoughts.
    assert len(model.expanded) <= 12 and budget.calls_spent <= 40
    assert all(len(s.steps) == 3 or s.done for s in result.candidates)


class _Voter:
    """A stand-in model that answers the vote prompt from a script."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers = tokenizer, answers

    def complete(self, states, **kwargs):
        return [
            State(tuple(s.tokens) + tuple(self.tokenizer.encode(a)), len(s.tokens))
            for s, a in zip(states, self.answers)
        ]

    def text(self, tokens):
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)


@given(st.lists(st.one_of(st.integers(0, 5), st.just(-1)), min_size=1, max_size=8))
def test_vote_scores_are_each_candidates_share_of_valid_votes(tiny, picks):
    tokenizer = tiny[2]
    answers = [f"best {p}" if p >= 0 else "none" for p in picks]
    score = vote_scorer(
        _Voter(tokenizer, answers), lambda s: [1, 2], key=jax.random.key(0), votes=len(picks)
    )
    states = [root([1]), root([2]), root([3])]
    expected = np.array([sum(p == i + 1 for p in picks) for i in range(3)]) / len(picks)
    np.testing.assert_allclose(score(states), expected)


def test_self_evaluation_reads_p_yes_of_each_rendered_state_alone(tiny):
    config, params, tokenizer, prompt, _ = tiny
    model = StepModel(params, config, tokenizer)
    single = [i for i in range(30, 300) if tokenizer.encode(tokenizer.decode([i])) == [i]]
    (a, b), (yes, no) = single[:2], [tokenizer.decode([i]) for i in single[:2]]
    question = tokenizer.encode(" is it right?")
    render = lambda state: state.tokens + tuple(question)  # noqa: E731
    states = [root(prompt), root(prompt[:3]), root(prompt[:1] + prompt)]
    scores = self_evaluation_scorer(model, render, yes=yes, no=no)(states)
    for state, got in zip(states, scores):
        logits = forward(params, config, jnp.asarray([render(state)]))[0, -1]
        want = jax.nn.softmax(logits[jnp.array([a, b])])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4)
    with pytest.raises(ValueError, match="one token"):
        self_evaluation_scorer(model, render, yes=yes + no + yes, no=no)


def test_a_rollout_value_is_the_reward_of_the_states_completion(tiny):
    config, params, tokenizer, prompt, _ = tiny
    model = StepModel(params, config, tokenizer, delimiters=(" ",), max_step_tokens=4)
    reward = lambda state: float(len(state.generated))  # noqa: E731
    budget = Budget()
    states = [root(prompt), root(prompt[:2])]
    values = rollout_scorer(
        model, reward, key=jax.random.key(0), temperature=0.0, max_steps=3, budget=budget
    )(states)
    greedy = model.complete(states, key=jax.random.key(9), temperature=0.0, max_steps=3)
    np.testing.assert_array_equal(values, [reward(s) for s in greedy])
    assert budget.tokens_spent == sum(len(s.generated) for s in greedy)
