"""LM-head cross-entropy benchmark: fused (vocab-chunked, recomputing VJP) vs naive logits.

    python -m bench.cross_entropy            # B*T = 8192 tokens, D = 4096, V = 128256
    python -m bench.cross_entropy --quick    # tiny sizes, a smoke test

Memory (any backend): XLA's compiled memory analysis of the loss and of loss+gradients
(w.r.t. hidden states and the LM-head weight); the naive version materialises the f32
[B*T, V] logits (and their gradient), the fused one only [B*T, chunk] at a time.
Time: measured only on an accelerator (a 128k-vocabulary LM head is ~4 TFLOP per step).
Inputs are bf16 on accelerators but f32 on CPU, where XLA computes bf16 dots in f32 and
hoists an f32 copy of the whole weight out of the chunk loop -- a CPU artefact that would
hide the chunking's effect.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

from pallas_kernels import cross_entropy_reference, fused_cross_entropy
from pallas_kernels.benchmarking import compiled_memory, describe_device, median_seconds


def _mean_loss(fn):
    return lambda h, w, labels: jnp.mean(fn(h, w, labels))


def _loss_and_grads(fn):
    return jax.value_and_grad(_mean_loss(fn), argnums=(0, 1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--vocab-chunk", type=int, default=4096)
    args = parser.parse_args(argv)
    tokens, d, vocab = (512, 256, 32000) if args.quick else (8192, 4096, 128256)
    timed = jax.default_backend() != "cpu"
    dtype = jnp.bfloat16 if timed else jnp.float32
    impls = {
        "naive": cross_entropy_reference,
        "fused": functools.partial(fused_cross_entropy, vocab_chunk=args.vocab_chunk),
    }
    print(f"device: {describe_device()}")
    print(
        f"\nLM-head cross-entropy, {jnp.dtype(dtype).name}, tokens={tokens} D={d} V={vocab} "
        f"chunk={args.vocab_chunk}"
    )
    shapes = (
        jax.ShapeDtypeStruct((1, tokens, d), dtype),
        jax.ShapeDtypeStruct((d, vocab), dtype),
        jax.ShapeDtypeStruct((1, tokens), jnp.int32),
    )
    if timed:
        kh, kw, kl = jax.random.split(jax.random.key(0), 3)
        arrays = (
            jax.random.normal(kh, shapes[0].shape, dtype),
            (jax.random.normal(kw, shapes[1].shape) / d**0.5).astype(dtype),
            jax.random.randint(kl, shapes[2].shape, 0, vocab),
        )
    print("MiB: peak = arguments + outputs + temporaries; temp = temporaries alone")
    print(
        f"{'pass':>10} {'naive peak':>11} {'fused peak':>11} {'ratio':>7} {'naive temp':>11} "
        f"{'fused temp':>11} {'ratio':>7}"
        + (f" {'naive ms':>9} {'fused ms':>9} {'speedup':>8}" if timed else "")
    )
    for name, wrap in (("loss", _mean_loss), ("loss+grad", _loss_and_grads)):
        mem = {k: compiled_memory(wrap(fn), *shapes) for k, fn in impls.items()}
        naive, fused = mem["naive"], mem["fused"]
        row = (
            f"{name:>10} {naive.peak / 2**20:>11.1f} {fused.peak / 2**20:>11.1f} "
            f"{naive.peak / fused.peak:>6.1f}x {naive.temp / 2**20:>11.1f} "
            f"{fused.temp / 2**20:>11.1f} {naive.temp / max(fused.temp, 1):>6.1f}x"
        )
        if timed:
            ms = {k: median_seconds(wrap(fn), *arrays) * 1e3 for k, fn in impls.items()}
            row += f" {ms['naive']:>9.2f} {ms['fused']:>9.2f} {ms['naive'] / ms['fused']:>7.2f}x"
        print(row)


if __name__ == "__main__":
    main()
