"""The serving engine: continuous batching, preemption, prefix caching and the scheduler's fairness.

All engines share one model and one capacity (4 slots, 16 blocks of 4 tokens, 48-token
sequences), so the device functions compile once for the whole module.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.inference import generate_recompute
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.block_manager import BlockManager
from agentic_jax.inference.serving.engine import Engine, EngineConfig, Request
from agentic_jax.inference.serving.scheduler import Scheduler, Sequence
from agentic_jax.models import TransformerConfig, param_shapes

CFG = TransformerConfig(
    vocab_size=61,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=48,
    max_seq_len=48,
)
ENGINE = EngineConfig(num_slots=4, block_size=4, num_blocks=16)


@pytest.fixture(scope="module")
def params():
    rng = np.random.default_rng(0)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, 0.3, s.shape), s.dtype), param_shapes(CFG)
    )


def _prompt(seed, n):
    return [int(t) for t in np.random.default_rng(seed).integers(0, CFG.vocab_size, n)]


def _alone(params, request):
    [done] = Engine(params, CFG, ENGINE).generate([request])
    assert done.preemptions == 0
    return done


def _assert_same(got, want):
    """Same tokens with the same log-probabilities: corrupt K/V that leaves the argmax alone
    still moves the logits."""
    assert got.tokens == want.tokens
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)


def test_continuous_batching_equals_each_request_alone_and_the_recompute_decoder(params):
    # Skewed output lengths, more requests than slots, and a pool that holds them all.
    lengths = [(5, 12), (5, 2), (9, 9), (7, 1), (2, 11), (6, 4)]
    requests = [
        Request(_prompt(i, p), SamplingParams(temperature=0.0, max_tokens=m))
        for i, (p, m) in enumerate(lengths)
    ]
    engine = Engine(params, CFG, ENGINE)
    done = engine.generate(requests)
    assert engine.stats["preemptions"] == 0
    assert [len(d.tokens) for d in done] == [m for _, m in lengths]
    assert all(d.finish_reason == "length" for d in done)
    for request, d in zip(requests, done):
        _assert_same(d, _alone(params, request))
    # The first two prompts have one length: one batched call of the reference decoder.
    want = generate_recompute(
        params,
        CFG,
        jnp.asarray([r.prompt for r in requests[:2]]),
        jax.random.key(0),
        max_new_tokens=12,
        temperature=0.0,
    )
    for row, d in enumerate(done[:2]):
        assert d.tokens == tuple(int(t) for t in want[row, 5 : 5 + len(d.tokens)])
    # Slots freed by short requests were refilled at once: later requests waited, and the whole
    # batch took fewer steps than static batching, which only refills an empty batch.
    assert max(d.wait_steps for d in done) > 0
    static = Engine(params, CFG, dataclasses.replace(ENGINE, batching="static"))
    assert [d.tokens for d in static.generate(requests)] == [d.tokens for d in done]
    assert engine.step_count < static.step_count
    assert engine.blocks.num_free_blocks == ENGINE.num_blocks


def test_preemption_by_recompute_gives_the_same_tokens(params):
    # Four sequences growing to ~30 tokens need ~32 blocks; the pool has 16.  Sampled rows use
    # seeds and penalties, so recompute must restore their keys and token counts too.
    sampled = SamplingParams(
        temperature=1.0,
        top_k=20,
        repetition_penalty=1.3,
        frequency_penalty=0.4,
        max_tokens=22,
        seed=7,
    )
    requests = [
        Request(_prompt(10 + i, 8), p)
        for i, p in enumerate(
            [
                SamplingParams(temperature=0.0, max_tokens=22),
                sampled,
                SamplingParams(temperature=0.0, max_tokens=24, presence_penalty=0.5),
                dataclasses.replace(sampled, seed=8),
            ]
        )
    ]
    engine = Engine(params, CFG, ENGINE)
    done = engine.generate(requests)
    assert engine.stats["preemptions"] > 0 and any(d.preemptions for d in done)
    assert not engine.has_unfinished()
    for request, d in zip(requests, done):
        _assert_same(d, _alone(params, request))
    assert engine.blocks.num_free_blocks == ENGINE.num_blocks


def test_prefix_cache_reuses_a_shared_system_prompt_and_copies_on_write(params):
    system = _prompt(20, 8)  # two full blocks
    first = Request(system + _prompt(21, 3), SamplingParams(temperature=0.0, max_tokens=3))
    followers = [
        Request(system + _prompt(22 + i, 2 + i), SamplingParams(temperature=0.0, max_tokens=4))
        for i in range(3)
    ]
    engine = Engine(params, CFG, ENGINE)
    copies = []
    real_copy = engine._copy
    engine._copy = lambda pairs: (copies.extend(pairs), real_copy(pairs))
    engine.generate([first])
    done = engine.generate(followers)
    assert [d.cached_tokens for d in done] == [8, 8, 8]
    assert engine.stats["prefix_hit_rate"] == pytest.approx(24 / (11 + 10 + 11 + 12))
    uncached = Engine(params, CFG, dataclasses.replace(ENGINE, enable_prefix_caching=False))
    assert [d.tokens for d in uncached.generate(followers)] == [d.tokens for d in done]
    assert copies == []

    # A prompt entirely in the cache, and in use: its last token runs again to produce logits,
    # which writes its K/V into a block the running twin holds -> a private copy of that block.
    twin = Request(system + _prompt(30, 4), SamplingParams(temperature=0.0, max_tokens=6))
    engine.add_request(twin)
    engine.step()
    [again] = engine.generate([dataclasses.replace(twin, request_id="twin-2")])
    assert again.cached_tokens == 11 and len(copies) == 1
    _assert_same(again, _alone(params, twin))


def test_a_burst_shares_prefixes_computed_in_the_same_step(params):
    # Admitted together: the first computes the shared blocks, the others read them in the same
    # step; the identical twin's copy-on-write must copy the block after it was written.
    shared = _prompt(50, 12)
    burst = [
        Request(shared, SamplingParams(temperature=0.0, max_tokens=5)),
        Request(shared, SamplingParams(temperature=0.0, max_tokens=5)),
        Request(shared[:8] + _prompt(51, 3), SamplingParams(temperature=0.0, max_tokens=5)),
    ]
    done = Engine(params, CFG, ENGINE).generate(burst)
    assert [d.cached_tokens for d in done] == [0, 11, 8]
    assert [d.wait_steps for d in done] == [0, 0, 0]
    for request, d in zip(burst, done):
        _assert_same(d, _alone(params, request))


def test_stream_stops_and_validation(params):
    class Letters:  # a stand-in tokenizer: id i is the letter chr(97 + i % 26)
        eos_id = None

        def decode(self, ids):
            return "".join(chr(97 + i % 26) for i in ids)

    engine = Engine(params, CFG, ENGINE, tokenizer=Letters())
    request = Request(_prompt(40, 5), SamplingParams(temperature=0.0, max_tokens=8))
    events = list(engine.stream(request))
    tokens = [e.token for e in events]
    assert [e.finished for e in events] == [False] * 7 + [True]
    assert tuple(tokens) == events[-1].completion.tokens
    _assert_same(events[-1].completion, _alone(params, request))

    stop = Letters().decode(tokens[3:5])
    [by_id, by_text] = engine.generate(
        [
            Request(
                request.prompt, dataclasses.replace(request.params, stop_token_ids=(tokens[2],))
            ),
            Request(request.prompt, dataclasses.replace(request.params, stop_strings=(stop,))),
        ]
    )
    assert by_id.tokens == tuple(tokens[: tokens.index(tokens[2]) + 1])
    # Cut at the first token whose text completes the stop string.
    cut = next(k for k in range(9) if stop in Letters().decode(tokens[:k]))
    assert by_text.tokens == tuple(tokens[:cut])
    assert by_id.finish_reason == by_text.finish_reason == "stop"
    eos = Engine(params, CFG, ENGINE, eos_id=tokens[1])
    assert eos.generate([request])[0].tokens == tuple(tokens[: tokens.index(tokens[1]) + 1])

    with pytest.raises(ValueError, match="prompt length"):
        engine.add_request(Request(_prompt(0, CFG.max_seq_len)))
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request(Request([CFG.vocab_size]))
    with pytest.raises(ValueError, match="tokenizer"):
        Engine(params, CFG, ENGINE).add_request(Request([1], SamplingParams(stop_strings=("x",))))
    engine.add_request(Request([1], request_id="dup"))
    with pytest.raises(ValueError, match="in flight"):
        engine.add_request(Request([2], request_id="dup"))
    with pytest.raises(ValueError, match="cannot hold"):
        Engine(params, CFG, EngineConfig(block_size=4, num_blocks=11))


def test_abort_frees_a_request_and_leaves_the_others_unchanged(params):
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    requests = [Request(_prompt(i, 6), greedy, f"r{i}") for i in range(6)]  # 6 for 4 slots
    engine = Engine(params, CFG, ENGINE)
    for r in requests:
        engine.add_request(r)
    for _ in range(3):
        engine.step()
    assert engine.abort_request("r1")  # running
    assert engine.abort_request("r5")  # still waiting for a slot
    assert not engine.abort_request("r1") and not engine.abort_request("nope")
    done = {}
    while engine.has_unfinished():
        for event in engine.step():
            assert event.request_id not in ("r1", "r5")
            if event.finished:
                done[event.request_id] = event.completion
    assert sorted(done) == ["r0", "r2", "r3", "r4"]
    for r in requests:
        if r.request_id in done:
            _assert_same(done[r.request_id], _alone(params, r))
    assert engine.blocks.num_free_blocks == ENGINE.num_blocks
    # A stream the consumer stops reading aborts its request.
    stream = engine.stream(Request(_prompt(9, 6), greedy))
    next(stream)
    stream.close()
    assert not engine.has_unfinished() and engine.blocks.num_free_blocks == ENGINE.num_blocks


def test_rejected_requests_leave_the_engine_unchanged(params):
    # A sampled request's key comes from its arrival number: rejections must not consume one.
    request = Request(_prompt(41, 4), SamplingParams(temperature=1.0, max_tokens=6))
    engine = Engine(params, CFG, ENGINE)
    bad = [
        Request([CFG.vocab_size]),
        Request([1], request_id="req-0"),
        Request([1], SamplingParams(stop_strings=("x",))),
    ]
    for r in bad:
        with pytest.raises(ValueError):
            engine.add_request(r)
    # A batch is checked whole before any of it is queued.
    for batch in ([request, bad[0]], [Request([1], request_id="a"), Request([2], request_id="a")]):
        with pytest.raises(ValueError, match=r"token ids|repeat"):
            engine.generate(batch)
        assert not engine.has_unfinished()
    [done] = engine.generate([request])
    want = _alone(params, request)
    assert done.request_id == want.request_id == "req-0"
    _assert_same(done, want)


# ------------------------------------------------------------------ the scheduler on its own
def _simulate(scheduler, arrivals, max_steps):
    """Runs the scheduler with a stand-in model (every computed token is 7); returns the step at
    which each sequence finished."""
    finished, pending = {}, sorted(arrivals, key=lambda a: a[0])
    for step in range(max_steps):
        while pending and pending[0][0] == step:
            scheduler.add(pending.pop(0)[1])
        plan = scheduler.schedule(step)
        assert len(scheduler.running) <= scheduler.num_slots
        for seq in plan.prefills + plan.decodes:
            seq.num_computed = len(seq.tokens)
            scheduler.blocks.commit(seq.request_id, seq.tokens, seq.num_computed)
            seq.output.append(7)
            if len(seq.output) == seq.params.max_tokens:
                scheduler.finish(seq)
                finished[seq.request_id] = step
        if not pending and not scheduler.has_unfinished():
            break
    return finished


def _seq(i, arrival, prompt_len, max_tokens):
    return Sequence(
        f"r{i}",
        tuple(range(i, i + prompt_len)),
        SamplingParams(max_tokens=max_tokens),
        np.zeros(2, np.uint32),
        arrival_step=arrival,
        arrival_time=0.0,
    )


@settings(max_examples=25)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 20), st.integers(1, 12)),
        min_size=1,
        max_size=12,
    )
)
def test_fifo_admission_and_every_request_finishes_in_bounded_time(spec):
    blocks = BlockManager(9, 4)  # 36 tokens: small enough to force preemptions
    scheduler = Scheduler(blocks, 3, watermark_blocks=1)
    arrivals, t = [], 0
    for i, (gap, prompt_len, max_tokens) in enumerate(spec):
        t += gap
        arrivals.append((t, _seq(i, t, prompt_len, max_tokens)))
    finished = _simulate(scheduler, arrivals, 10_000)
    # Some sequence makes progress at every busy step, so all work is done within the total
    # number of tokens to generate after the last arrival.
    assert len(finished) == len(arrivals)
    assert max(finished.values()) <= t + sum(m for _, _, m in spec)
    admitted = [seq.admitted_step for _, seq in arrivals]
    assert admitted == sorted(admitted)  # first come, first served
    assert blocks.num_free_blocks == 9


def test_a_large_request_is_not_starved_by_a_stream_of_small_ones():
    # Small requests arrive every other step and keep a few blocks busy at all times; the large
    # one needs 10 of the 12 blocks.  A scheduler that admitted whatever fits would never run it.
    blocks = BlockManager(12, 4)
    scheduler = Scheduler(blocks, 4)
    small = [(2 * i, _seq(i, 2 * i, 6, 6)) for i in range(40)]
    big = _seq(99, 5, 38, 2)
    finished = _simulate(scheduler, small + [(5, big)], 1000)
    assert len(finished) == 41
    assert big.admitted_step - big.arrival_step <= 8  # the small ones ahead of it drain first
    assert max(s.admitted_step - s.arrival_step for _, s in small) <= 10
