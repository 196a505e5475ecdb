"""Attention benchmark: memory of the dense reference vs the flash kernel, and GPU speed.

    python -m bench.attention            # CPU: memory at T = 8k and 32k; GPU: speed table too
    python -m bench.attention --quick    # tiny sizes, a smoke test

Memory (any backend) is XLA's compiled memory analysis -- compile only, nothing runs -- of
``reference_attention`` (materialises [B, N, T, S] logits), of the model's ``xla_chunked``
attention (online softmax over key/value chunks in plain jnp) and of ``flash_attention``.  On
CPU the flash figure is the Pallas kernel itself in interpret mode (the same kernel source,
lowered to XLA loops); its memory is what the algorithm needs, its speed means nothing.
Going from T to 4T the reference grows ~16x (quadratic), xla_chunked and flash ~4x (linear).

Speed (GPU only): causal bf16 attention, forward and forward+backward, for XLA (the
dense reference), ``xla_chunked``, cuDNN (``jax.nn.dot_product_attention``), tokamax
when installed, and ``pallas``: this package's ``flash_attention``, which on a GPU runs its
Triton kernels (``pallas_kernels.flash_triton``, default tiles).  FLOPs count the visible
half of the causal T x S score matrix: forward 4 B N T S H / 2, backward 2.5x forward.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

from agentic_jax.models import chunked_attention
from pallas_kernels import BlockSizes, flash_attention, reference_attention
from pallas_kernels.benchmarking import compiled_memory, describe_device, median_seconds
from pallas_kernels.dispatch import tokamax_module


def _shapes(b, t, n, k, h, dtype):
    return (
        jax.ShapeDtypeStruct((b, t, n, h), dtype),
        jax.ShapeDtypeStruct((b, t, k, h), dtype),
        jax.ShapeDtypeStruct((b, t, k, h), dtype),
    )


def _with_grad(fn):
    """Forward + backward: gradients of a scalar function of the output w.r.t. q, k, v."""
    return jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))


def memory_table(seq_lens, b, n, k, h, dtype, blocks):
    """Peak memory of the dense reference, the jnp online-softmax scan (``xla_chunked``, the
    model's memory-linear XLA path) and the Pallas kernel, with ratios to the reference."""
    backend = jax.default_backend()
    interpret = backend not in ("tpu", "gpu")
    impls = {
        "reference": reference_attention,
        "xla_chunked": functools.partial(chunked_attention, chunk_size=blocks.block_kv),
        # On GPU the Triton kernels keep their own register-sized default tiles.
        "flash": functools.partial(
            flash_attention, block_sizes=None if backend == "gpu" else blocks, interpret=interpret
        ),
    }
    print(
        f"\nPeak compiled memory (MiB), causal {jnp.dtype(dtype).name}, B={b} N={n} K={k} H={h}; "
        f"flash = Pallas kernel{' (interpret mode)' if interpret else ''}"
    )
    print(
        f"{'T':>7} {'pass':>8} {'reference':>11} {'xla_chunked':>12} {'flash':>9} "
        f"{'ref/chunked':>12} {'ref/flash':>10}"
    )
    previous = {}
    for t in seq_lens:
        args = _shapes(b, t, n, k, h, dtype)
        for name, wrap in (("fwd", lambda f: f), ("fwd+bwd", _with_grad)):
            mib = {key: compiled_memory(wrap(fn), *args).peak / 2**20 for key, fn in impls.items()}
            growth = ""
            if name in previous:
                t0, m0 = previous[name]
                growth = f"   T x{t / t0:g}: " + ", ".join(
                    f"{key} x{mib[key] / m0[key]:.1f}" for key in impls
                )
            previous[name] = (t, mib)
            ref = mib["reference"]
            print(
                f"{t:>7} {name:>8} {ref:>11.1f} {mib['xla_chunked']:>12.1f} {mib['flash']:>9.1f} "
                f"{ref / mib['xla_chunked']:>11.1f}x {ref / mib['flash']:>9.1f}x{growth}"
            )


def _implementations():
    """The GPU contenders; ``pallas`` is ``flash_attention``, i.e. its Triton kernels."""
    impls = {
        "xla": reference_attention,
        "pallas": functools.partial(flash_attention, causal=True),
        "xla_chunked": functools.partial(chunked_attention, chunk_size=512),
        "cudnn": functools.partial(
            jax.nn.dot_product_attention, is_causal=True, implementation="cudnn"
        ),
    }
    tokamax = tokamax_module()
    if tokamax is not None:
        impls["tokamax"] = functools.partial(tokamax.dot_product_attention, is_causal=True)
    return impls


def speed_table(configs, h, k, iters):
    print(f"\nCausal bf16 attention on {describe_device()}: ms (TFLOP/s), H={h} K={k}")
    impls = _implementations()
    print(f"{'B':>3} {'T':>6} {'N':>3} {'pass':>8} " + "".join(f"{name:>20}" for name in impls))
    failures = []
    for b, t, n in configs:
        key_q, key_k, key_v = jax.random.split(jax.random.key(0), 3)
        q = jax.random.normal(key_q, (b, t, n, h), jnp.bfloat16)
        kv = [jax.random.normal(key, (b, t, k, h), jnp.bfloat16) for key in (key_k, key_v)]
        fwd_flops = 4 * b * n * t * t * h / 2
        for name, wrap, flops in (
            ("fwd", lambda f: f, fwd_flops),
            ("fwd+bwd", _with_grad, 3.5 * fwd_flops),
        ):
            cells = []
            for impl, fn in impls.items():
                try:
                    seconds = median_seconds(wrap(fn), q, *kv, iters=iters)
                    cells.append(f"{seconds * 1e3:9.2f} ({flops / seconds / 1e12:6.1f})")
                except Exception as err:
                    oom = "RESOURCE_EXHAUSTED" in str(err)
                    cells.append("OOM" if oom else type(err).__name__[:18])
                    if not oom:
                        failures.append(
                            f"{impl} {name} B={b} T={t} N={n}: "
                            f"{str(err).strip().splitlines()[0][:300]}"
                        )
            print(
                f"{b:>3} {t:>6} {n:>3} {name:>8} " + "".join(f"{c:>20}" for c in cells), flush=True
            )
    for failure in failures:
        print(failure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    args = parser.parse_args(argv)
    print(f"device: {describe_device()}")
    if args.quick:
        memory_table(
            (256, 1024),
            b=1,
            n=4,
            k=2,
            h=64,
            dtype=jnp.bfloat16,
            blocks=BlockSizes(128, 128, 128, 128),
        )
    else:
        memory_table(
            (8192, 32768),
            b=1,
            n=8,
            k=2,
            h=128,
            dtype=jnp.bfloat16,
            blocks=BlockSizes(512, 512, 512, 512),
        )
    if jax.default_backend() == "gpu":
        configs = (
            ((1, 1024, 16),)
            if args.quick
            else ((4, 4096, 16), (4, 4096, 32), (2, 16384, 16), (8, 8192, 32))
        )
        speed_table(configs, h=128, k=8, iters=3 if args.quick else 5)


if __name__ == "__main__":
    main()
