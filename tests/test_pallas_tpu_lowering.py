"""The kernels lower to Mosaic for real TPU generations, checked from a CPU host.

``lower_for_tpu`` builds the programs for an abstract TPU device, so Pallas runs its Mosaic
lowering (block shapes against the (8, 128) tile, layouts, every op in the kernel bodies)
exactly as it would on the TPU host; only the TPU runtime's final compile is left out.
Shapes here are production-sized (head_dim 128, 512-wide tiles) because that is where
Mosaic's layout rules bite; nothing is executed, so they cost only tracing time.
"""

import importlib

import jax
import jax.numpy as jnp
import pytest

from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.training.step import BATCH_KEYS, batch_loss
from pallas_kernels import BlockSizes, choose_attention_backend, flash_attention, paged_attention
from pallas_kernels.backend import lower_for_tpu, resolve_interpret, target_platform
from pallas_kernels.block_sizes import plan_tiling

TPUS = ["TPU v4", "TPU v5 lite", "TPU v5p", "TPU v6 lite"]
Spec = jax.ShapeDtypeStruct


def mosaic_calls(lowered) -> int:
    """How many Pallas kernels were lowered to Mosaic custom calls."""
    return lowered.as_text().count("tpu_custom_call")


def attention_args(t, s, dtype=jnp.bfloat16, n=8, k=2, h=128, b=2):
    return Spec((b, t, n, h), dtype), Spec((b, s, k, h), dtype), Spec((b, s, k, h), dtype)


FLASH_CASES = {
    "causal_gqa": dict(causal=True),
    "bidirectional_mqa": dict(causal=False, kv_heads=1),
    "window": dict(causal=True, sliding_window=384),
    "soft_cap": dict(causal=True, logits_soft_cap=30.0),
    "segments": dict(causal=True, segments=True),
    "prefix_t_lt_s": dict(causal=True, t=512),
    "length_not_tile_multiple": dict(causal=True, t=1000, s=1000),
    "float32": dict(causal=True, dtype=jnp.float32),
}


@pytest.mark.parametrize("device_kind", TPUS)
@pytest.mark.parametrize("case", sorted(FLASH_CASES))
def test_flash_attention_forward_and_backward_lower_to_mosaic(case, device_kind):
    opts = dict(FLASH_CASES[case])
    t, s = opts.pop("t", 2048), opts.pop("s", 2048)
    args = attention_args(t, s, opts.pop("dtype", jnp.bfloat16), k=opts.pop("kv_heads", 2))
    if opts.pop("segments", False):
        args += (Spec((2, t), jnp.int32), Spec((2, s), jnp.int32))

    def loss(q, k, v, *segments):
        out = flash_attention(q, k, v, segment_ids=segments or None, **opts)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    assert mosaic_calls(lower_for_tpu(loss, *args, device_kind=device_kind)) == 1  # forward
    grads = jax.grad(loss, argnums=(0, 1, 2))
    assert mosaic_calls(lower_for_tpu(grads, *args, device_kind=device_kind)) == 3  # fwd, dQ, dK/dV


@pytest.mark.parametrize("device_kind", TPUS)
def test_paged_attention_lowers_to_mosaic(device_kind):
    pages = Spec((256, 16, 8, 128), jnp.bfloat16)
    args = (
        Spec((4, 32, 128), jnp.bfloat16),
        pages,
        pages,
        Spec((4, 64), jnp.int32),
        Spec((4,), jnp.int32),
    )

    def decode(*args):
        return paged_attention(*args, sliding_window=300, logits_soft_cap=30.0)

    assert mosaic_calls(lower_for_tpu(decode, *args, device_kind=device_kind)) == 1


def test_a_pallas_model_train_step_lowers_for_tpu():
    """Loss and gradients of a bf16 model whose attention is the kernel: one forward and
    two backward kernels per layer body (the layers are scanned, so the body appears once)."""
    config = TransformerConfig(
        vocab_size=1024,
        d_model=256,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=128,
        d_ff=512,
        max_seq_len=1024,
        dtype="bfloat16",
        attention_impl="pallas",
    )
    params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    batch = {key: Spec((2, 1024), jnp.int32) for key in BATCH_KEYS}

    def grads(params, batch):
        return jax.grad(lambda p: batch_loss(p, config, batch)[0])(params)

    assert mosaic_calls(lower_for_tpu(grads, params, batch)) == 3


def test_tpu_target_compiles_kernels_and_enforces_the_lane_tile():
    q, k, v = attention_args(2048, 2048)
    assert target_platform() == "cpu" and resolve_interpret(None, "x")
    with pytest.raises(ValueError, match="block_kv=64 must be a multiple of 128 on TPU"):
        lower_for_tpu(
            lambda q, k, v: flash_attention(q, k, v, block_sizes=BlockSizes(block_kv=64)), q, k, v
        )

    def inspect(q, k, v):
        assert target_platform() == "tpu" and not resolve_interpret(None, "x")
        assert choose_attention_backend(q, k, v) == "pallas"
        assert BlockSizes.default() == BlockSizes.default("tpu")
        return flash_attention(q, k, v)

    assert mosaic_calls(lower_for_tpu(inspect, q, k, v)) == 1


def test_the_tiling_rule_is_mosaics_own(monkeypatch):
    """A key tile the planner refuses on TPU is one Mosaic's lowering refuses too, so the
    planner's error (which names the block size to change) is not stricter than needed."""
    module = importlib.import_module("pallas_kernels.flash_attention")

    def unchecked(blocks, t, s, check_tpu_layout):
        return plan_tiling(blocks, t, s, check_tpu_layout=False)

    monkeypatch.setattr(module, "plan_tiling", unchecked)
    q, k, v = attention_args(2048, 2048)
    segments = (Spec((2, 2048), jnp.int32), Spec((2, 2048), jnp.int32))

    def attend(q, k, v, *segments):
        return flash_attention(q, k, v, segment_ids=segments, block_sizes=BlockSizes(block_kv=64))

    with pytest.raises(ValueError, match="divisible by 8 and 128"):
        lower_for_tpu(attend, q, k, v, *segments)
