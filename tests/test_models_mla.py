"""Multi-head latent attention: the absorbed decoding path (latent KV cache, contiguous and
paged) equals the training path's logits token by token; cache size and accounting."""

import jax
import pytest
from decoding_oracle import (
    assert_engine_matches_forward,
    assert_generate_matches_forward,
    loss_decreases,
    prompts,
    random_params,
)

from agentic_jax.inference.decoding.kv_cache import LatentKVCache, init_cache
from agentic_jax.inference.serving.paged_cache import PagedKVCache, PagedLatentCache
from agentic_jax.models import TransformerConfig, flops_per_token, param_axes, param_count
from sharding.memory_plan import plan_memory

MLA = TransformerConfig(
    vocab_size=61,
    d_model=32,
    n_layers=2,
    n_heads=4,
    d_ff=48,
    max_seq_len=32,
    attention_type="mla",
    q_lora_rank=12,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
)


def test_absorbed_decoding_equals_training_path():
    """``generate`` (prefill and decoding against the latent cache) vs the full forward pass."""
    assert_generate_matches_forward(random_params(MLA), MLA, prompts(MLA))


def test_paged_engine_decodes_mla_like_the_training_path():
    assert_engine_matches_forward(random_params(MLA), MLA, prompts(MLA))


def test_cache_holds_only_latent_and_rope_key():
    width = MLA.kv_lora_rank + MLA.qk_rope_head_dim
    assert MLA.kv_cache_width == width
    cache = init_cache(MLA, batch=2, max_len=8)
    assert isinstance(cache, LatentKVCache) and cache.kv.shape == (2, 2, 8, 1, width)
    paged = PagedKVCache.create(MLA, num_blocks=3, block_size=4)
    assert isinstance(paged, PagedLatentCache) and paged.kv.shape == (2, 3, 4, 1, width)
    plan = plan_memory(MLA, {"data": 1}, batch=2, seq_len=8, optimizer=None, precision="bf16")
    assert plan.kv_cache == 2 * MLA.n_layers * 2 * 8 * width


def test_param_count_and_flops():
    c, n = MLA, MLA.n_heads
    qk, r, dr = c.qk_head_dim, c.kv_lora_rank, c.qk_rope_head_dim
    attn = (
        c.d_model * c.q_lora_rank
        + c.q_lora_rank
        + c.q_lora_rank * n * qk  # q_a, norm, q_b
        + c.d_model * (r + dr)
        + r  # kv_a, kv_a_norm
        + r * n * (c.qk_nope_head_dim + c.v_head_dim)  # k_up, v_up
        + n * c.v_head_dim * c.d_model  # o
    )
    layer = attn + 2 * c.d_model + 3 * c.d_model * c.d_ff
    assert param_count(c) == c.n_layers * layer + c.vocab_size * c.d_model + c.d_model
    t = 16
    attention = 6 * c.n_layers * n * (qk + c.v_head_dim) * t / 2
    assert flops_per_token(c, t) == 6 * param_count(c) + attention
    axes = jax.tree.leaves(param_axes(c), is_leaf=lambda x: isinstance(x, tuple))
    assert all(isinstance(a, str) for leaf in axes for a in leaf)


def test_mla_trains():
    first, last = loss_decreases(MLA)
    assert last < first


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(kv_lora_rank=0), "kv_lora_rank"),
        (dict(qk_rope_head_dim=3), "even"),
        (dict(qk_norm=True), "qk_norm"),
        (dict(attention_type="mqa"), "attention_type"),
    ],
)
def test_invalid_mla_configs(changes, match):
    with pytest.raises(ValueError, match=match):
        MLA.replace(**changes)


def test_training_path_pads_to_common_width():
    """v wider than q/k (and queries without a bottleneck): the zero padding and the query
    rescale leave the score scale at 1/sqrt(d_qk)."""
    config = MLA.replace(v_head_dim=16, q_lora_rank=None)
    assert_generate_matches_forward(random_params(config), config, prompts(config, (4,)))
