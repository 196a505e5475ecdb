"""Prometheus metrics of a serving engine and the server in front of it.

:class:`ServingMetrics` owns its own ``CollectorRegistry`` (never the process-wide one), so
several servers, or tests, in one process keep separate counts.  What it measures follows vLLM's
``/metrics`` (names prefixed ``agentic_jax_``):

* ``requests_total{endpoint, status}``: finished HTTP requests, counted by the server
  (:meth:`ServingMetrics.request_finished`);
* ``prompt_tokens_total``, ``generation_tokens_total``: tokens prefilled (once per request) and
  generated;
* ``time_to_first_token_seconds`` and ``inter_token_latency_seconds``: histograms over every
  token (the first token's latency is counted from the request's arrival in the engine);
* ``requests_waiting``, ``requests_running``: the scheduler's queue and batch after each step;
* ``kv_cache_usage_ratio``: the fraction of the paged KV cache's blocks held by sequences;
* ``prefix_cache_queries_total``, ``prefix_cache_hits_total``: prompt tokens looked up in the
  prefix cache and those found (the hit rate is ``hits / queries``, e.g. in PromQL
  ``rate(hits) / rate(queries)``);
* ``preemptions_total``: sequences preempted for recompute.

The engine's quantities are read by :meth:`ServingMetrics.record_step` after each engine step
(``EngineLoop(engine, metrics=...)`` calls it), the counters as increments of the engine's
running totals (``Engine.counters``), which survive an engine reset.
"""

from __future__ import annotations

from collections.abc import Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agentic_jax.inference.serving.engine import Engine, EngineCounters, StepOutput

PREFIX = "agentic_jax"
# After vLLM's buckets: from a millisecond (a small model's decode step) to minutes (a long queue).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)  # fmt: skip
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip


class ServingMetrics:
    """The metrics of one engine and its server, in a registry of their own (see the module
    docstring).  Updated from the engine loop's thread and the server's; prometheus-client's
    metrics are thread-safe."""

    def __init__(self):
        self.registry = CollectorRegistry()

        def metric(kind, name, doc, **kwargs):
            return kind(f"{PREFIX}_{name}", doc, registry=self.registry, **kwargs)

        self.requests = metric(
            Counter, "requests", "Finished HTTP requests.", labelnames=("endpoint", "status")
        )
        self.prompt_tokens = metric(Counter, "prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = metric(Counter, "generation_tokens", "Tokens generated.")
        self.time_to_first_token = metric(
            Histogram,
            "time_to_first_token_seconds",
            "Seconds from a request's arrival in the engine to its first token.",
            buckets=TTFT_BUCKETS,
        )
        self.inter_token_latency = metric(
            Histogram,
            "inter_token_latency_seconds",
            "Seconds between consecutive tokens of a request.",
            buckets=ITL_BUCKETS,
        )
        self.requests_waiting = metric(Gauge, "requests_waiting", "Requests queued for a slot.")
        self.requests_running = metric(Gauge, "requests_running", "Requests in the batch.")
        self.kv_cache_usage = metric(
            Gauge, "kv_cache_usage_ratio", "Fraction of the paged KV cache's blocks in use."
        )
        self.prefix_cache_queries = metric(
            Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = metric(
            Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        self.preemptions = metric(Counter, "preemptions", "Sequences preempted for recompute.")
        self._engine_counters = {  # EngineCounters' fields
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generation_tokens,
            "preemptions": self.preemptions,
            "prefix_queried_tokens": self.prefix_cache_queries,
            "prefix_hit_tokens": self.prefix_cache_hits,
        }
        self._seen = EngineCounters()  # the engine's totals at the last record_step

    def request_finished(self, endpoint: str, status: int | str) -> None:
        """Counts one finished HTTP request to ``endpoint`` (``/v1/chat/completions``) that
        answered ``status`` (200, 400, ...)."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def record_step(self, engine: Engine, events: Sequence[StepOutput]) -> None:
        """After one ``engine.step()`` that returned ``events``: their latencies, the increments
        of the engine's totals since the last call, and its queue, batch and KV-cache use.  One
        ``ServingMetrics`` follows one engine."""
        for event in events:
            latencies = self.time_to_first_token if event.index == 0 else self.inter_token_latency
            latencies.observe(event.latency)
        totals = engine.counters
        for name, counter in self._engine_counters.items():
            counter.inc(getattr(totals, name) - getattr(self._seen, name))
        self._seen = totals
        self.requests_waiting.set(len(engine.scheduler.waiting))
        self.requests_running.set(len(engine.scheduler.running))
        self.kv_cache_usage.set(engine.kv_cache_usage)

    def exposition(self) -> tuple[bytes, str]:
        """``(body, content type)`` of a ``/metrics`` response: the Prometheus text format."""
        return (
            prometheus_client.generate_latest(self.registry),
            prometheus_client.CONTENT_TYPE_LATEST,
        )
