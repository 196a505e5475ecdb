"""Prometheus metrics of the serving engine: an ``EngineLoop`` serving requests that share a
prefix, in a pool small enough to preempt, read back through the text exposition format and
compared with the tokens actually prompted and generated; the KV-cache use against the block
tables it summarises; the engine's totals across a reset."""

import pytest
from decoding_oracle import random_params
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from test_inference_engine import CFG, ENGINE, _prompt

from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.engine import Engine, Request
from agentic_jax.inference.serving.engine_loop import EngineLoop
from agentic_jax.inference.serving.metrics import ServingMetrics


@pytest.fixture(scope="module")
def params():
    return random_params(CFG)


def _samples(metrics: ServingMetrics) -> dict:
    """``{(sample name, labels): value}`` parsed back from the exposition text."""
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def _value(samples, name, **labels):
    return samples[(f"agentic_jax_{name}", tuple(sorted(labels.items())))]


def test_an_engine_loop_records_what_it_served(params):
    """Four requests sharing an 8-token system prompt grow to ~30 tokens each in a 16-block
    pool: the prefix cache hits, the pool preempts, and every counter equals what was served."""
    system = _prompt(0, 8)
    prompts = [system + _prompt(1 + i, 3 + i) for i in range(4)]
    sampling = [
        SamplingParams(temperature=0.0, max_tokens=22),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=20, seed=3),
    ]
    metrics = ServingMetrics()
    engine = Engine(params, CFG, ENGINE)
    loop = EngineLoop(engine, metrics).start()
    try:
        streams = [loop.submit(p, sampling[i % 2]) for i, p in enumerate(prompts)]
        events = [list(s) for s in streams]
    finally:
        loop.stop()
    metrics.request_finished("/v1/chat/completions", 200)
    metrics.request_finished("/v1/chat/completions", 200)
    metrics.request_finished("/v1/completions", 400)

    samples = _samples(metrics)
    generated = sum(len(e) for e in events)
    assert [len(e) for e in events] == [22, 20, 22, 20]
    assert _value(samples, "prompt_tokens_total") == sum(map(len, prompts))
    assert _value(samples, "generation_tokens_total") == generated
    assert _value(samples, "time_to_first_token_seconds_count") == len(prompts)
    assert _value(samples, "inter_token_latency_seconds_count") == generated - len(prompts)
    first_latencies = sum(e[0].latency for e in events)
    assert _value(samples, "time_to_first_token_seconds_sum") == pytest.approx(first_latencies)
    hits = _value(samples, "prefix_cache_hits_total")
    assert 0 < hits <= _value(samples, "prefix_cache_queries_total")
    assert hits >= 3 * len(system)  # the followers' system prompt, at least
    preempted = sum(e[-1].completion.preemptions for e in events)
    assert _value(samples, "preemptions_total") == engine.counters.preemptions == preempted > 0
    assert _value(samples, "requests_waiting") == _value(samples, "requests_running") == 0
    assert 0.0 <= _value(samples, "kv_cache_usage_ratio") <= 1.0
    assert _value(samples, "requests_total", endpoint="/v1/chat/completions", status="200") == 2
    assert _value(samples, "requests_total", endpoint="/v1/completions", status="400") == 1


def test_separate_metrics_do_not_share_counts():
    """Each ``ServingMetrics`` has its own registry: a second one starts from zero and both
    can be created in one process."""
    first, second = ServingMetrics(), ServingMetrics()
    first.request_finished("/health", 200)
    assert ("agentic_jax_requests_total", (("endpoint", "/health"), ("status", "200"))) in (
        _samples(first)
    )
    assert not any(name == "agentic_jax_requests_total" for name, _ in _samples(second))


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 10)), min_size=1, max_size=6),
    shared=st.integers(0, 8),
)
def test_counters_and_kv_use_follow_every_step(params, lengths, shared):
    """Stepping an engine by hand: after every step the KV-cache use is the distinct blocks of
    the running sequences' tables over the pool, and the gauges are the scheduler's queue and
    batch; at the end the counters equal the completions' sums and the engine's totals."""
    prefix = _prompt(50, shared)
    requests = [
        Request(prefix + _prompt(60 + i, p), SamplingParams(temperature=0.0, max_tokens=m))
        for i, (p, m) in enumerate(lengths)
    ]
    engine, metrics = Engine(params, CFG, ENGINE), ServingMetrics()
    for r in requests:
        engine.add_request(r)
    done = []
    while engine.has_unfinished():
        events = engine.step()
        metrics.record_step(engine, events)
        done += [e.completion for e in events if e.finished]
        held = {
            b for s in engine.scheduler.running for b in engine.blocks.block_table(s.request_id)
        }
        samples = _samples(metrics)
        assert _value(samples, "kv_cache_usage_ratio") == pytest.approx(
            len(held) / engine.num_blocks
        )
        assert _value(samples, "requests_running") == len(engine.scheduler.running)
        assert _value(samples, "requests_waiting") == len(engine.scheduler.waiting)
    samples = _samples(metrics)
    assert _value(samples, "prompt_tokens_total") == sum(len(d.prompt) for d in done)
    assert _value(samples, "generation_tokens_total") == sum(len(d.tokens) for d in done)
    assert _value(samples, "time_to_first_token_seconds_count") == len(requests)
    totals = engine.counters
    assert _value(samples, "prefix_cache_hits_total") == totals.prefix_hit_tokens
    assert _value(samples, "prefix_cache_queries_total") == totals.prefix_queried_tokens
    assert totals.prefix_hit_tokens == engine.blocks.hit_tokens


def test_the_engine_totals_survive_a_reset(params):
    """``reset`` (after a failed step) drops the scheduler and block pool but not the totals a
    monitor reads increments of; recording after it adds nothing."""
    engine, metrics = Engine(params, CFG, ENGINE), ServingMetrics()
    engine.add_request(Request(_prompt(7, 9), SamplingParams(temperature=0.0, max_tokens=3)))
    while engine.has_unfinished():
        metrics.record_step(engine, engine.step())
    before, samples = engine.counters, _samples(metrics)
    assert before.prompt_tokens == 9 and before.generated_tokens == 3
    assert before.prefix_queried_tokens == 9
    engine.reset()
    assert engine.counters == before
    metrics.record_step(engine, [])
    after = _samples(metrics)
    for name in ("prompt_tokens_total", "generation_tokens_total", "prefix_cache_queries_total"):
        assert _value(after, name) == _value(samples, name)
