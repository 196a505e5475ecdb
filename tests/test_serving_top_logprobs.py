"""The engine's top log-probabilities: each generated token's ``k`` likeliest tokens equal the
top-k of ``log_softmax`` of the plain forward pass over the same prefix, the sampled token's
entry equals its ``logprobs`` value, in a continuous batch with preemption and beside a
speculating request; bad values are refused."""

import jax
import numpy as np
import pytest
from decoding_oracle import random_params
from hypothesis import given, settings
from hypothesis import strategies as st
from test_inference_engine import CFG, ENGINE, _prompt

from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.engine import MAX_TOP_LOGPROBS, Engine, Request
from agentic_jax.models import forward


@pytest.fixture(scope="module")
def params():
    return random_params(CFG)


@jax.jit
def _log_softmax(params, tokens):
    """``log_softmax`` of the plain forward pass over ``tokens[T]``."""
    return jax.nn.log_softmax(forward(params, CFG, tokens[None])[0])


def _assert_top_matches_forward(params, completion, k):
    """Every step's top ``k`` are the forward pass's ``k`` highest log-probabilities (ids by
    a numpy stable sort, values within float tolerance), and the sampled token's logprob is
    the reference's and, where it is among them, its entry's."""
    tokens = list(completion.prompt) + list(completion.tokens)
    padded = np.zeros(CFG.max_seq_len, np.int32)  # causal: the padding changes no earlier row
    padded[: len(tokens)] = tokens
    logp = np.asarray(_log_softmax(params, padded))
    steps = logp[len(completion.prompt) - 1 : len(tokens) - 1]
    assert len(completion.top_logprobs) == len(completion.tokens)
    for step, token, logprob, top in zip(
        steps, completion.tokens, completion.logprobs, completion.top_logprobs
    ):
        want = np.argsort(-step, kind="stable")[:k]
        assert [i for i, _ in top] == want.tolist()
        np.testing.assert_allclose([v for _, v in top], step[want], atol=2e-4)
        np.testing.assert_allclose(logprob, step[token], atol=2e-4)
        for i, v in top:
            if i == token:
                assert v == pytest.approx(logprob, abs=1e-6)


def test_top_logprobs_match_the_forward_pass_in_a_preempting_batch(params):
    """Four requests that outgrow the 16-block pool (so some are preempted and recomputed),
    asking for 0, 5, 20 and 3 alternatives, greedy and sampled; the greedy token is its own
    top-1, and events stream what the completion holds."""
    sampled = SamplingParams(temperature=1.0, top_k=20, max_tokens=20, seed=5)
    greedy = SamplingParams(temperature=0.0, max_tokens=22)
    asked = [0, 5, MAX_TOP_LOGPROBS, 3]
    requests = [
        Request(_prompt(i, 8), (greedy, sampled)[i % 2], top_logprobs=k)
        for i, k in enumerate(asked)
    ]
    engine = Engine(params, CFG, ENGINE)
    ids = [engine.add_request(r) for r in requests]
    streamed = {i: [] for i in ids}
    done = {}
    while engine.has_unfinished():
        for event in engine.step():
            streamed[event.request_id].append(event.top_logprobs)
            if event.finished:
                done[event.request_id] = event.completion
    assert engine.counters.preemptions > 0
    for request_id, k in zip(ids, asked):
        completion = done[request_id]
        assert list(completion.top_logprobs) == streamed[request_id]
        if k == 0:
            assert set(completion.top_logprobs) == {()}
            continue
        assert all(len(top) == k for top in completion.top_logprobs)
        _assert_top_matches_forward(params, completion, k)
    greedy_done = done[ids[2]]
    assert [top[0][0] for top in greedy_done.top_logprobs] == list(greedy_done.tokens)


@settings(max_examples=6, deadline=None)
@given(k=st.integers(1, MAX_TOP_LOGPROBS), seed=st.integers(0, 2**16), length=st.integers(1, 12))
def test_any_k_matches_the_forward_pass(params, k, seed, length):
    engine = Engine(params, CFG, ENGINE)
    sampling = SamplingParams(temperature=0.7, max_tokens=6, seed=seed)
    [done] = engine.generate([Request(_prompt(seed, length), sampling, top_logprobs=k)])
    _assert_top_matches_forward(params, done, k)


def test_a_speculating_neighbour_pauses_but_keeps_its_tokens(params):
    """A batch holding a top-logprobs request does not speculate (verification takes no
    top-k): the prompt-lookup request beside it still gives its greedy tokens alone."""
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    repetitive = _prompt(30, 4) * 3
    speculating = Request(repetitive, greedy, speculation="prompt_lookup")
    [alone] = Engine(params, CFG, ENGINE).generate([speculating])
    engine = Engine(params, CFG, ENGINE)
    asking = Request(_prompt(31, 6), greedy, top_logprobs=4)
    beside, top = engine.generate([speculating, asking])
    assert beside.tokens == alone.tokens
    assert engine.stats["speculation"]["prompt_lookup"]["proposed"] == 0
    _assert_top_matches_forward(params, top, 4)


@pytest.mark.parametrize(
    ("top_logprobs", "speculation", "match"),
    [
        (MAX_TOP_LOGPROBS + 1, "none", "out of range"),
        (-1, "none", "out of range"),
        (True, "none", "not an integer"),
        (2.0, "none", "not an integer"),
        (3, "prompt_lookup", "speculation"),
    ],
)
def test_bad_top_logprobs_are_refused(params, top_logprobs, speculation, match):
    engine = Engine(params, CFG, ENGINE)
    request = Request([1, 2, 3], top_logprobs=top_logprobs, speculation=speculation)
    with pytest.raises(RequestError, match=match):
        engine.add_request(request)
