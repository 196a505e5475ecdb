"""Decoding benchmarks, every comparison side by side in one run.

    python bench/decode.py            # a quickstart-sized model (d=128, 4 layers)
    python bench/decode.py --large    # d=1024, 8 layers, 32k vocab: for an accelerator
    python bench/decode.py --quick    # tiny sizes, a smoke test

Serving engine (``agentic_jax.inference.engine``), same model, same slots, random weights, greedy
decoding with EOS off so every request produces exactly its ``max_tokens``:

* **continuous vs static batching** on skewed output lengths (most requests short, one in eight
  long).  Static batching refills only an empty batch, so each batch lasts as long as its longest
  request; continuous batching (Orca) refills a slot the step after it frees.  Throughput is
  generated tokens per second of wall time, compilation excluded (a warm-up run compiles first).
* **prefix caching**: a burst of requests sharing a long system prompt, with the prefix cache on
  and off, and requests with unique prompts of the same length.  Reports the prompt tokens served
  from the cache and the time to first token (queueing included: all requests arrive at once),
  from the fastest of three runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

from agentic_jax.inference.engine import Engine, EngineConfig, Request
from agentic_jax.inference.sampling import SamplingParams
from agentic_jax.models import TransformerConfig, init_params

SIZES = {
    "quick": TransformerConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                               head_dim=16, d_ff=64, max_seq_len=128),
    "default": TransformerConfig(vocab_size=4096, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
                                 head_dim=32, d_ff=352, max_seq_len=512),
    "large": TransformerConfig(vocab_size=32000, d_model=1024, n_layers=8, n_heads=16, n_kv_heads=4,
                               head_dim=64, d_ff=2816, max_seq_len=1024, dtype="bfloat16"),
}


def _requests(rng, vocab, prompt_lens, max_tokens, shared=()):
    return [Request([*shared, *rng.integers(0, vocab, n).tolist()],
                    SamplingParams(temperature=0.0, max_tokens=m))
            for n, m in zip(prompt_lens, max_tokens)]


def _run(params, config, engine_config, requests, repeats=1):
    """(wall seconds, completions, engine) of the fastest of ``repeats`` timed runs on fresh
    engines, after an untimed warm-up run of the same prompts (capped at 2 new tokens) that
    compiles every shape the timed runs use."""
    warm = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_tokens=2))
            for r in requests]
    Engine(params, config, engine_config).generate(warm)
    runs = []
    for _ in range(repeats):
        engine = Engine(params, config, engine_config)
        start = time.perf_counter()
        done = engine.generate(requests)
        runs.append((time.perf_counter() - start, done, engine))
    return min(runs, key=lambda run: run[0])


def bench_continuous_vs_static(params, config, scale: str) -> None:
    sizes = {"quick": (8, 4, 32), "default": (32, 8, 128), "large": (64, 16, 256)}
    n, slots, long_len = sizes[scale]
    rng = np.random.default_rng(0)
    max_tokens = [long_len if i % 8 == 0 else 8 for i in range(n)]
    requests = _requests(rng, config.vocab_size, rng.integers(8, 33, n), max_tokens)
    print(f"\ncontinuous vs static batching: {n} requests, {slots} slots, outputs of 8 tokens "
          f"and 1 in 8 of {long_len}")
    print(f"{'batching':<14}{'steps':>8}{'seconds':>10}{'tokens/s':>12}{'ratio':>8}")
    base = None
    for batching in ("static", "continuous"):
        ec = EngineConfig(num_slots=slots, batching=batching)
        seconds, done, engine = _run(params, config, ec, requests)
        rate = sum(len(d.tokens) for d in done) / seconds
        base = base or rate
        print(f"{batching:<14}{engine.step_count:>8}{seconds:>10.3f}{rate:>12.1f}"
              f"{rate / base:>8.2f}")


def bench_prefix_cache(params, config, scale: str) -> None:
    sizes = {"quick": (8, 4, 64), "default": (32, 8, 384), "large": (64, 16, 768)}
    n, slots, system_len = sizes[scale]
    user_len, new = 32, 8
    rng = np.random.default_rng(1)
    system = rng.integers(0, config.vocab_size, system_len).tolist()
    shared = _requests(rng, config.vocab_size, [user_len] * n, [new] * n, shared=system)
    unique = _requests(rng, config.vocab_size, [system_len + user_len] * n, [new] * n)
    print(f"\nprefix caching: {n} requests arriving at once, {slots} slots, prompts of "
          f"{system_len + user_len} tokens, {new} new tokens each")
    print(f"{'workload':<32}{'hit rate':>10}{'TTFT ms':>10}{'p90 ms':>10}{'seconds':>10}")
    rows = (("shared system prompt, cache on", shared, True),
            ("shared system prompt, cache off", shared, False),
            ("unique prompts, cache on", unique, True))
    for name, requests, caching in rows:
        ec = EngineConfig(num_slots=slots, enable_prefix_caching=caching)
        seconds, done, engine = _run(params, config, ec, requests, repeats=3)
        ttft = np.array([d.time_to_first_token for d in done]) * 1e3
        print(f"{name:<32}{engine.stats['prefix_hit_rate']:>10.1%}{ttft.mean():>10.1f}"
              f"{np.percentile(ttft, 90):>10.1f}{seconds:>10.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a tiny model, for smoke tests")
    size.add_argument("--large", action="store_true", help="a model sized for an accelerator")
    args = parser.parse_args()
    scale = "quick" if args.quick else "large" if args.large else "default"
    config = SIZES[scale]
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
    print(f"device: {jax.devices()[0].device_kind}; model d={config.d_model} L={config.n_layers} "
          f"V={config.vocab_size} {config.dtype}")
    bench_continuous_vs_static(params, config, scale)
    bench_prefix_cache(params, config, scale)


if __name__ == "__main__":
    main()
