"""Decoding benchmarks, every comparison side by side in one run.

    python bench/decode.py            # a quickstart-sized model (d=128, 4 layers)
    python bench/decode.py --large    # d=1024, 8 layers, 32k vocab: for an accelerator
    python bench/decode.py --quick    # tiny sizes, a smoke test

Serving engine (``agentic_jax.inference.serving.engine``), same model, same slots, random weights, greedy
decoding with EOS off so every request produces exactly its ``max_tokens``:

* **continuous vs static batching** on skewed output lengths (most requests short, one in eight
  long).  Static batching refills only an empty batch, so each batch lasts as long as its longest
  request; continuous batching (Orca) refills a slot the step after it frees.  Throughput is
  generated tokens per second of wall time, compilation excluded (a warm-up run compiles first).
* **prefix caching**: a burst of requests sharing a long system prompt, with the prefix cache on
  and off, and requests with unique prompts of the same length.  Reports the prompt tokens served
  from the cache and the time to first token (queueing included: all requests arrive at once),
  from the fastest of three runs.

KV cache vs recompute (``agentic_jax.inference.decoding.generate`` vs ``generate_recompute``), same model,
greedy, at two output lengths: decode tokens/s of each (compilation excluded) and their ratio;
the recompute decoder runs a full forward pass over the whole buffer for every token.

Speculative decoding (``agentic_jax.inference.speculative_generate``): a small draft model and a
larger target, both trained briefly with ``agentic_jax.training`` on the shipped corpus (same
tokenizer, same batches), prompts cut from the held-out split.  Single stream and batch 64,
greedy (outputs checked token-identical to plain greedy decoding) and temperature 0.8: acceptance
rate, tokens per target pass and wall-clock speedup over plain cached decoding, for a draft-model
chain, a draft-model tree and n-gram prompt lookup, plus what ``advise_speculation`` predicts
from the measured acceptance and draft cost.

    python bench/decode.py --part cache          # or speculative, serving (default: all)
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import jax
import numpy as np

from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.documents import read_documents
from agentic_jax.data.pipeline import train_data
from agentic_jax.data.tokenizer import train_tokenizer
from agentic_jax.inference import (
    advise_speculation,
    generate,
    generate_recompute,
    speculative_generate,
)
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.engine import Engine, EngineConfig, Request
from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step

SIZES = {
    "quick": TransformerConfig(
        vocab_size=256,
        d_model=32,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        d_ff=64,
        max_seq_len=128,
    ),
    "default": TransformerConfig(
        vocab_size=4096,
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        d_ff=352,
        max_seq_len=512,
    ),
    "large": TransformerConfig(
        vocab_size=32000,
        d_model=1024,
        n_layers=8,
        n_heads=16,
        n_kv_heads=4,
        head_dim=64,
        d_ff=2816,
        max_seq_len=1024,
        dtype="bfloat16",
    ),
}


def _requests(rng, vocab, prompt_lens, max_tokens, shared=()):
    return [
        Request(
            [*shared, *rng.integers(0, vocab, n).tolist()],
            SamplingParams(temperature=0.0, max_tokens=m),
        )
        for n, m in zip(prompt_lens, max_tokens)
    ]


def _run(params, config, engine_config, requests, repeats=1):
    """(wall seconds, completions, engine) of the fastest of ``repeats`` timed runs on fresh
    engines, after an untimed warm-up run of the same prompts (capped at 2 new tokens) that
    compiles every shape the timed runs use."""
    warm = [
        dataclasses.replace(r, params=dataclasses.replace(r.params, max_tokens=2)) for r in requests
    ]
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
    print(
        f"\ncontinuous vs static batching: {n} requests, {slots} slots, outputs of 8 tokens "
        f"and 1 in 8 of {long_len}"
    )
    print(f"{'batching':<14}{'steps':>8}{'seconds':>10}{'tokens/s':>12}{'ratio':>8}")
    base = None
    for batching in ("static", "continuous"):
        ec = EngineConfig(num_slots=slots, batching=batching)
        seconds, done, engine = _run(params, config, ec, requests)
        rate = sum(len(d.tokens) for d in done) / seconds
        base = base or rate
        print(
            f"{batching:<14}{engine.step_count:>8}{seconds:>10.3f}{rate:>12.1f}{rate / base:>8.2f}"
        )


def bench_prefix_cache(params, config, scale: str) -> None:
    sizes = {"quick": (8, 4, 64), "default": (32, 8, 384), "large": (64, 16, 768)}
    n, slots, system_len = sizes[scale]
    user_len, new = 32, 8
    rng = np.random.default_rng(1)
    system = rng.integers(0, config.vocab_size, system_len).tolist()
    shared = _requests(rng, config.vocab_size, [user_len] * n, [new] * n, shared=system)
    unique = _requests(rng, config.vocab_size, [system_len + user_len] * n, [new] * n)
    print(
        f"\nprefix caching: {n} requests arriving at once, {slots} slots, prompts of "
        f"{system_len + user_len} tokens, {new} new tokens each"
    )
    print(f"{'workload':<32}{'hit rate':>10}{'TTFT ms':>10}{'p90 ms':>10}{'seconds':>10}")
    rows = (
        ("shared system prompt, cache on", shared, True),
        ("shared system prompt, cache off", shared, False),
        ("unique prompts, cache on", unique, True),
    )
    for name, requests, caching in rows:
        ec = EngineConfig(num_slots=slots, enable_prefix_caching=caching)
        seconds, done, engine = _run(params, config, ec, requests, repeats=3)
        ttft = np.array([d.time_to_first_token for d in done]) * 1e3
        print(
            f"{name:<32}{engine.stats['prefix_hit_rate']:>10.1%}{ttft.mean():>10.1f}"
            f"{np.percentile(ttft, 90):>10.1f}{seconds:>10.3f}"
        )


def best_time(fn, *args, repeats: int = 3, **kwargs):
    """(seconds, result) of the fastest of ``repeats`` calls, after one untimed (compiling) call."""
    jax.block_until_ready(fn(*args, **kwargs))
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = jax.block_until_ready(fn(*args, **kwargs))
        runs.append((time.perf_counter() - start, result))
    return min(runs, key=lambda run: run[0])


def bench_cache_vs_recompute(params, config, scale: str) -> None:
    batch, prompt_len = {"quick": 2, "default": 8, "large": 16}[scale], 16
    lengths = {"quick": (16, 48), "default": (64, 256), "large": (128, 512)}[scale]
    prompt = jax.random.randint(jax.random.key(1), (batch, prompt_len), 0, config.vocab_size)
    key = jax.random.key(0)
    print(f"\nKV cache vs recompute: batch {batch}, prompts of {prompt_len} tokens, greedy")
    print(
        f"{'new tokens':<12}{'cache tok/s':>14}{'recompute tok/s':>18}{'ratio':>8}{'same tokens':>13}"
    )
    for new in lengths:
        greedy = SamplingParams(temperature=0.0, max_tokens=new)
        cached_s, cached = best_time(generate, params, config, prompt, sampling=greedy, key=key)
        recompute_s, recomputed = best_time(
            generate_recompute,
            params,
            config,
            prompt,
            key,
            max_new_tokens=new,
            temperature=0.0,
            repeats=1,
        )
        same = np.array_equal(cached.tokens, recomputed[:, prompt_len:])
        rate, base = batch * new / cached_s, batch * new / recompute_s
        print(
            f"{new:<12}{rate:>14.1f}{base:>18.1f}{rate / base:>8.1f}{'yes' if same else 'NO':>13}"
        )


# Speculative decoding: target, draft, train steps of each, new tokens, batches (the first is 1).
SPECULATION = {
    "quick": (
        TransformerConfig(
            vocab_size=512,
            d_model=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            head_dim=16,
            d_ff=160,
            max_seq_len=256,
        ),
        TransformerConfig(
            vocab_size=512,
            d_model=32,
            n_layers=1,
            n_heads=2,
            n_kv_heads=1,
            head_dim=16,
            d_ff=96,
            max_seq_len=256,
        ),
        (20, 20),
        32,
        (1, 8),
    ),
    "default": (
        TransformerConfig(
            vocab_size=1024,
            d_model=256,
            n_layers=4,
            n_heads=8,
            n_kv_heads=2,
            head_dim=32,
            d_ff=704,
            max_seq_len=512,
        ),
        TransformerConfig(
            vocab_size=1024,
            d_model=64,
            n_layers=1,
            n_heads=4,
            n_kv_heads=1,
            head_dim=16,
            d_ff=176,
            max_seq_len=512,
        ),
        (250, 250),
        128,
        (1, 64),
    ),
    "large": (
        TransformerConfig(
            vocab_size=8192,
            d_model=1024,
            n_layers=12,
            n_heads=16,
            n_kv_heads=4,
            head_dim=64,
            d_ff=2816,
            max_seq_len=1024,
            dtype="bfloat16",
        ),
        TransformerConfig(
            vocab_size=8192,
            d_model=256,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            head_dim=64,
            d_ff=704,
            max_seq_len=1024,
            dtype="bfloat16",
        ),
        (1000, 1000),
        256,
        (1, 64),
    ),
}


def train_lm(
    config: TransformerConfig,
    tokenizer,
    steps: int,
    *,
    seq_len: int = 64,
    batch_size: int = 16,
    seed: int = 0,
):
    """Parameters after ``steps`` AdamW steps on the shipped corpus; the last training loss."""
    schedule = make_schedule(3e-3, steps, warmup_steps=max(1, steps // 10))
    optimizer = make_optimizer(schedule)
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(seed))
    state = TrainState.create(params, optimizer, seed)
    step = jax.jit(make_train_step(config, optimizer, schedule), donate_argnums=0)
    batches = iter(train_data(tokenizer, seq_len=seq_len, batch_size=batch_size, seed=seed))
    for _ in range(steps):
        state, metrics = step(state, next(batches))
    return state.params, float(metrics["loss"])


def _heldout_prompts(tokenizer, count: int, length: int, seed: int = 0):
    ids = np.concatenate(
        [
            np.asarray(ids)
            for ids in tokenizer.encode_batch(list(read_documents(corpus_files("heldout"))))
        ]
    )
    starts = np.random.default_rng(seed).integers(0, len(ids) - length, count)
    return jax.numpy.asarray(np.stack([ids[s : s + length] for s in starts]), dtype=jax.numpy.int32)


def bench_speculative(scale: str) -> None:
    target_config, draft_config, (target_steps, draft_steps), new, batches = SPECULATION[scale]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = train_tokenizer(f"{tmp}/tokenizer.json", vocab_size=target_config.vocab_size)
    start = time.perf_counter()
    target, target_loss = train_lm(target_config, tokenizer, target_steps)
    draft, draft_loss = train_lm(draft_config, tokenizer, draft_steps)
    print(
        f"\nspeculative decoding: target d={target_config.d_model} L={target_config.n_layers} "
        f"({target_steps} steps, loss {target_loss:.2f}), draft d={draft_config.d_model} "
        f"L={draft_config.n_layers} ({draft_steps} steps, loss {draft_loss:.2f}), trained on the "
        f"shipped corpus in {time.perf_counter() - start:.0f} s; {new} new tokens, gamma 4"
    )
    key = jax.random.key(0)
    prompts = {batch: _heldout_prompts(tokenizer, batch, 32) for batch in batches}
    greedy = SamplingParams(temperature=0.0, max_tokens=new)
    # Calibrate the policy's cost model: a step at batch B costs max(1, B / ridge) steps at batch 1.
    step_s = {
        batch: best_time(generate, target, target_config, prompts[batch], sampling=greedy, key=key)[
            0
        ]
        / new
        for batch in batches
    }
    ridge = max(1.0, batches[-1] * step_s[batches[0]] / step_s[batches[-1]])
    print(
        f"target decode step: {step_s[batches[0]] * 1e3:.2f} ms at batch {batches[0]}, "
        f"{step_s[batches[-1]] * 1e3:.2f} ms at batch {batches[-1]} (compute-bound beyond "
        f"~{ridge:.1f} rows: the policy's ridge_batch)"
    )
    methods = {
        "draft model, chain": {"draft_params": draft, "draft_config": draft_config, "gamma": 4},
        "draft model, tree 2x4": {
            "draft_params": draft,
            "draft_config": draft_config,
            "gamma": 4,
            "branches": 2,
        },
        "prompt lookup, chain": {"gamma": 4, "max_ngram": 3},
    }
    print(
        f"{'batch':>5} {'sampling':<9}{'method':<24}{'accept':>8}{'tok/pass':>10}{'tok/s':>10}"
        f"{'speedup':>9}{'same':>6}  advice"
    )
    for batch in batches:
        for temperature in (0.0, 0.8):
            sampling = SamplingParams(temperature=temperature, max_tokens=new)
            plain_s, plain = best_time(
                generate, target, target_config, prompts[batch], sampling=sampling, key=key
            )
            draft_s, _ = best_time(
                generate, draft, draft_config, prompts[batch], sampling=sampling, key=key
            )
            label = "greedy" if temperature == 0 else f"T={temperature}"
            print(
                f"{batch:>5} {label:<9}{'plain decoding':<24}{'':>8}{1.0:>10.2f}"
                f"{batch * new / plain_s:>10.1f}{1.0:>9.2f}"
            )
            for name, kwargs in methods.items():
                seconds, result = best_time(
                    speculative_generate,
                    target,
                    target_config,
                    prompts[batch],
                    sampling=sampling,
                    key=key,
                    **kwargs,
                )
                accept = result.acceptance_rate
                same = (
                    ("yes" if np.array_equal(result.generation.tokens, plain.tokens) else "NO")
                    if temperature == 0
                    else "-"
                )
                cost = draft_s / plain_s if "draft_params" in kwargs else 0.0
                advice = advise_speculation(
                    acceptance_rate=accept,
                    draft_cost=cost,
                    batch=batch,
                    output_tokens=new,
                    ridge_batch=ridge,
                )
                print(
                    f"{batch:>5} {label:<9}{name:<24}{accept:>8.2f}{result.tokens_per_step:>10.2f}"
                    f"{batch * new / seconds:>10.1f}{plain_s / seconds:>9.2f}{same:>6}  "
                    f"{'speculate' if advice.speculate else 'plain'} ({advice.reason})"
                )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a tiny model, for smoke tests")
    size.add_argument("--large", action="store_true", help="a model sized for an accelerator")
    parser.add_argument("--part", choices=("all", "serving", "cache", "speculative"), default="all")
    args = parser.parse_args()
    scale = "quick" if args.quick else "large" if args.large else "default"
    config = SIZES[scale]
    params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
    print(
        f"device: {jax.devices()[0].device_kind}; model d={config.d_model} L={config.n_layers} "
        f"V={config.vocab_size} {config.dtype}"
    )
    if args.part in ("all", "serving"):
        bench_continuous_vs_static(params, config, scale)
        bench_prefix_cache(params, config, scale)
    if args.part in ("all", "cache"):
        bench_cache_vs_recompute(params, config, scale)
    if args.part in ("all", "speculative"):
        bench_speculative(scale)


if __name__ == "__main__":
    main()
