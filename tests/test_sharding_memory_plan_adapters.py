"""The memory planner's adapter, QLoRA and RLHF modes against hand-computed Llama-3 8B bytes."""

import dataclasses

import jax
import pytest

from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.models.lora import LoRA, LoraConfig
from sharding import Adapters, array_layouts, plan_memory, plan_rlhf
from sharding.memory_plan import LLAMA3_8B, NF4_BITS, adapter_params

SEQ = 4096
N = 8_030_261_248  # Llama-3 8B's parameters
# Rank 16 on all seven projections, per layer r · (in + out): q and o 16 · (4096 + 4096), k and v
# 16 · (4096 + 1024), gate, up and down 16 · (4096 + 14336); 32 layers.
LORA_16 = 32 * 16 * (2 * 8192 + 2 * 5120 + 3 * 18432)
# The projections' weights (NF4 under QLoRA): 32 layers of q, o 4096², k, v 4096 · 1024 and
# gate, up, down 4096 · 14336; the rest (embedding, LM head, norms) stays bf16.
PROJ = 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
REST = N - PROJ


def test_hand_counts():
    assert LORA_16 == 41_943_040
    assert PROJ == 6_979_321_856 and REST == 2 * 128256 * 4096 + 65 * 4096
    assert NF4_BITS == 4 + 8 / 64 + 32 / (64 * 256) == 4.126953125


def test_lora_trains_only_the_adapters():
    full = plan_memory(LLAMA3_8B, {}, 1, SEQ)
    plan = plan_memory(LLAMA3_8B, {}, 1, SEQ, adapters=Adapters(rank=16))
    assert (plan.n_params, plan.n_trainable) == (N + LORA_16, LORA_16)
    # The base frozen in bf16 (no master copy, gradient or moments); mixed-precision AdamW on
    # the adapters: bf16 values and gradients, fp32 master and two fp32 moments.
    assert (plan.params, plan.master_params, plan.grads, plan.optimizer) == (
        2 * N + 2 * LORA_16,
        4 * LORA_16,
        2 * LORA_16,
        8 * LORA_16,
    )
    assert plan.activations == full.activations
    assert full.total - plan.total == 14 * N - 16 * LORA_16 == 111_752_568_832


def test_dora_adds_a_magnitude_per_output_unit():
    plan = plan_memory(LLAMA3_8B, {}, 1, SEQ, adapters=Adapters(rank=16, magnitude=True))
    magnitudes = 32 * (4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096)
    assert plan.n_trainable == LORA_16 + magnitudes == 43_319_296


def test_qlora_holds_the_projections_in_nf4():
    plan = plan_memory(LLAMA3_8B, {}, 1, SEQ, adapters=Adapters(rank=16, base_format="nf4"))
    nf4 = PROJ // 2 + PROJ // 64 + 4 * PROJ // (64 * 256)  # codes, fp8 absmax, fp32 scales
    assert nf4 == 3_600_416_768
    assert plan.params == nf4 + 2 * REST + 2 * LORA_16 == 5_786_181_632
    assert plan.master_params == 4 * LORA_16 and plan.optimizer == 8 * LORA_16
    # FSDP over 8 devices: the projections and the embeddings split 8 ways, the norms do not.
    sharded = plan_memory(
        LLAMA3_8B, {"fsdp": 8}, 8, SEQ, adapters=Adapters(rank=16, base_format="nf4")
    )
    norms = 65 * 4096
    frozen = nf4 // 8 + 2 * ((REST - norms) // 8 + norms)
    adapters = sharded.grads // 2  # bf16 gradients: one per adapter element on the device
    assert sharded.params == frozen + 2 * adapters
    assert LORA_16 // 8 <= adapters < LORA_16


def test_rlhf_four_models():
    full = plan_memory(LLAMA3_8B, {}, 1, SEQ)
    lora = Adapters(rank=16)
    plan = plan_rlhf(LLAMA3_8B, {}, 1, SEQ, adapters=lora)
    assert plan.policy == plan_memory(LLAMA3_8B, {}, 1, SEQ, adapters=lora)
    assert plan.critic == full  # the critic trains in full
    assert plan.reference.params == 0  # the policy's frozen base is the reference
    assert plan.reward.params == 2 * N and plan.reward.total == 2 * N
    assert plan.total == plan.policy.total + 2 * N + full.total
    # Full fine-tuning: 16 bytes per parameter for each trained model, 2 for each frozen one.
    every = plan_rlhf(LLAMA3_8B, {}, 1, SEQ)
    assert every.total == 2 * (16 * N + full.activations) + 2 * 2 * N == 296_648_589_312
    # QLoRA: the NF4 base is not the float reference, which is held beside it.
    qlora = plan_rlhf(LLAMA3_8B, {}, 1, SEQ, adapters=Adapters(base_format="nf4"))
    assert qlora.reference.params == 2 * N


def test_adapter_shapes_agree_with_the_model():
    config = TransformerConfig(
        vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48
    )
    lora = LoRA(LoraConfig(rank=4, targets=("q", "o", "down"), variant="dora"))
    base = jax.eval_shape(lambda key: init_params(config, key), jax.random.key(0))
    shapes = jax.eval_shape(lora.init, base, jax.random.key(1))
    rows = array_layouts(
        *adapter_params(config, Adapters(rank=4, targets=("q", "o", "down"), magnitude=True)), {}
    )
    planned = {row.path: row.shape for row in rows}
    assert planned == {
        f"{name}.{part}": shapes[name][part].shape for name in shapes for part in shapes[name]
    }


@pytest.mark.parametrize(
    "adapters, match",
    [
        (dataclasses.replace(Adapters(), targets=("q", "wq")), r"\['wq'\] are not projections"),
    ],
)
def test_bad_adapters_are_named(adapters, match):
    with pytest.raises(ValueError, match=match):
        plan_memory(LLAMA3_8B, {}, 1, SEQ, adapters=adapters)
    with pytest.raises(ValueError, match="rank=0"):
        Adapters(rank=0)
    with pytest.raises(ValueError, match="base_format='int3'"):
        Adapters(base_format="int3")
