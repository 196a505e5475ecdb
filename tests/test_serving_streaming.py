"""StreamingLLM requests in the serving engine: the same tokens as ``generate`` with the same
``StreamingCache``, a bounded number of blocks per streaming sequence, evicted blocks reused by
another request of the same batch, and the combinations refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_oracle import prompts, random_params
from test_inference_streaming import CONFIGS, POLICY, greedy

from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.block_manager import EVICTED
from agentic_jax.inference.serving.engine import Engine, EngineConfig, Request

BLOCK = 4


def _held(engine, request_id):
    return [b for b in engine.blocks.block_table(request_id) if b != EVICTED]


def _bound(policy):
    """Blocks of the sinks, of the window, and the one the next token starts."""
    return -(-policy.sink_tokens // BLOCK) + -(-policy.window // BLOCK) + 1


def _run(engine, requests):
    """Steps ``requests`` to completion; returns their completions and, per step, the blocks each
    running request holds."""
    ids = [engine.add_request(r) for r in requests]
    done, trace = {}, []
    while engine.has_unfinished():
        for event in engine.step():
            if event.finished:
                done[event.request_id] = event.completion
        trace.append({i: _held(engine, i) for i in ids if i in engine.blocks})
    return [done[i] for i in ids], trace


def _assert_matches_generate(params, config, completion, policy):
    """Greedy tokens and their log-probabilities are ``generate``'s with the same policy (its
    first ones, where ``max_model_len`` cut the completion short)."""
    out = greedy(params, config, [list(completion.prompt)], 24, policy)
    n = len(completion.tokens)
    assert list(completion.tokens) == np.asarray(out.tokens[0, :n]).tolist()
    logp = jax.nn.log_softmax(out.logits[0, :n])
    picked = jnp.take_along_axis(logp, jnp.asarray(completion.tokens)[:, None], axis=1)[:, 0]
    np.testing.assert_allclose(completion.logprobs, picked, atol=2e-4)


@pytest.fixture(scope="module")
def model():
    """A model with a windowed and a global layer, and a context (16) shorter than the runs."""
    return random_params(CONFIGS["gqa"]), CONFIGS["gqa"]


def _engine(params, config):
    """Two slots over 12 blocks of 4: a plain 40-token sequence takes 10 of them."""
    ec = EngineConfig(num_slots=2, block_size=BLOCK, num_blocks=12, max_model_len=40)
    return Engine(params, config, ec)


GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_streaming_engine_equals_generate_in_bounded_blocks(name, model):
    """A streaming prompt longer than sinks + window and 24 new tokens (several blocks evicted)
    beside a plain request (cut at 40 tokens): ``generate``'s tokens with and without the
    policy, and never more than the bound's blocks held by the streaming one.  Also with
    multi-head latent attention."""
    params, config = model if name == "gqa" else (random_params(CONFIGS[name]), CONFIGS[name])
    engine = _engine(params, config)
    rows = prompts(config, (9, 20))
    requests = [Request(rows[0], GREEDY, streaming=POLICY), Request(rows[1], GREEDY)]
    (streamed, plain), trace = _run(engine, requests)
    _assert_matches_generate(params, config, streamed, POLICY)
    _assert_matches_generate(params, config, plain, None)
    held = [len(step[streamed.request_id]) for step in trace if streamed.request_id in step]
    assert max(held) <= _bound(POLICY) < -(-(9 + 24) // BLOCK)
    assert engine.stats["free_blocks"] == engine.num_blocks


def test_evicted_blocks_serve_another_request_of_the_batch(model):
    """A streaming request decodes alone until 5 never-used blocks are left; a plain request of
    a 20-token prompt (5 blocks) is admitted at once beside it and grows into blocks the
    streaming one gave back (unevicted, it would have had to wait), and both give their tokens."""
    params, config = model
    engine = _engine(params, config)
    first, second = prompts(config, (9, 20))
    s_id = engine.add_request(Request(first, GREEDY, streaming=POLICY))
    ever_held = set()
    while len(ever_held) < 7:
        engine.step()
        ever_held |= set(_held(engine, s_id))
    p_id = engine.add_request(Request(second, GREEDY))
    done, reused = {}, set()
    while engine.has_unfinished():
        for event in engine.step():
            if event.finished:
                done[event.request_id] = event.completion
        if p_id in engine.blocks and s_id in engine.blocks:
            reused |= set(_held(engine, p_id)) & (ever_held - set(_held(engine, s_id)))
    assert done[p_id].wait_steps == 0 and engine.stats["preemptions"] == 0
    assert reused, "the plain request holds no block the streaming one gave back"
    _assert_matches_generate(params, config, done[s_id], POLICY)
    _assert_matches_generate(params, config, done[p_id], None)


SHORT = SamplingParams(temperature=0.0, max_tokens=2)


def test_streaming_stays_outside_the_prefix_cache_and_refuses_speculation(model):
    engine = _engine(*model)
    prompt = prompts(model[1], (13,))[0]
    [first] = engine.generate([Request(prompt, SHORT, streaming=POLICY)])
    [plain] = engine.generate([Request(prompt, SHORT)])
    [again] = engine.generate([Request(prompt, SHORT, streaming=POLICY)])
    assert first.cached_tokens == 0 and plain.cached_tokens == 0 and again.cached_tokens == 0
    [cached] = engine.generate([Request(prompt, SHORT)])
    assert cached.cached_tokens == 12  # the plain request's blocks are cached as ever
    with pytest.raises(RequestError, match="cannot speculate"):
        engine.add_request(Request(prompt, speculation="prompt_lookup", streaming=POLICY))
    with pytest.raises(RequestError, match="StreamingCache"):
        engine.add_request(Request(prompt, streaming=(1, 4)))
