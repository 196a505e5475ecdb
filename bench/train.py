"""Training throughput, MFU and compile time of the quickstart model, variants side by side.

    python bench/train.py [--steps 20] [--quick]

Every variant trains the same model on the same random batches in one process; the table reports
compile time, steady-state tokens/s and MFU, and each variant's throughput as a ratio to the
first row.  On CPU, MFU is relative to a measured float32 matmul rate (see training/mfu.py).
"""

from __future__ import annotations

import argparse
import time

import gin
import jax
import numpy as np

import agentic_jax.registry  # noqa: F401  (registers the configurables the config binds)
from agentic_jax import config as gin_config
from agentic_jax.models import TransformerConfig, flops_per_token, init_params
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step
from agentic_jax.training.mfu import peak_flops_per_device

VARIANTS = {
    "xla attention (baseline)": {},
    "xla_chunked attention": {"attention_impl": "xla_chunked", "attention_chunk_size": 32},
    "remat full": {"remat_policy": "full"},
    "unrolled layers": {"scan_layers": False},
    "bf16 compute": {"dtype": "bfloat16"},
}


def quickstart_setup() -> tuple[TransformerConfig, int, int]:
    gin_config.parse(["pretrain"], [])
    model = TransformerConfig()  # reads the pretraining config's TransformerConfig bindings
    return (
        model.replace(vocab_size=gin.query_parameter("train_tokenizer.vocab_size")),
        gin.query_parameter("train.batch_size"),
        gin.query_parameter("train.seq_len"),
    )


def measure(config: TransformerConfig, batch: dict, steps: int) -> tuple[float, float]:
    """(compile seconds, steady-state seconds per step)."""
    schedule = make_schedule(1e-3, 1000, kind="constant", warmup_steps=0)
    optimizer = make_optimizer(schedule)
    state = TrainState.create(init_params(config, jax.random.key(0)), optimizer, seed=0)
    step = jax.jit(make_train_step(config, optimizer, schedule), donate_argnums=0)
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    state, _ = compiled(state, batch)  # warm-up
    jax.block_until_ready(state)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    return compile_s, (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="a tiny model, for smoke tests")
    args = parser.parse_args()
    model, batch_size, seq_len = quickstart_setup()
    if args.quick:
        model = model.replace(d_model=32, n_layers=1, d_ff=64, vocab_size=256)
        batch_size, seq_len, args.steps = 2, 16, 2
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.vocab_size, (batch_size, seq_len + 1), dtype=np.int32)
    batch = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": np.ones((batch_size, seq_len), np.int32),
        "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch_size, seq_len)),
        "loss_mask": np.ones((batch_size, seq_len), np.int32),
    }
    peak = peak_flops_per_device()
    flops = flops_per_token(model, seq_len)
    print(
        f"device: {jax.devices()[0].device_kind}, peak {peak / 1e9:.1f} GFLOP/s; model "
        f"d={model.d_model} L={model.n_layers} V={model.vocab_size}; batch {batch_size}x{seq_len}"
    )
    print(f"{'variant':<28}{'compile s':>10}{'ms/step':>10}{'tokens/s':>12}{'MFU':>8}{'ratio':>8}")
    base = None
    for name, change in VARIANTS.items():
        compile_s, step_s = measure(model.replace(**change), batch, args.steps)
        tps = batch_size * seq_len / step_s
        base = base or tps
        print(
            f"{name:<28}{compile_s:>10.2f}{step_s * 1e3:>10.1f}{tps:>12,.0f}"
            f"{tps * flops / peak:>8.1%}{tps / base:>8.2f}"
        )


if __name__ == "__main__":
    main()
