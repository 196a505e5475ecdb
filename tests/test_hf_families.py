"""HF families beyond Llama / Mistral / Qwen2: logits equal transformers', exports round-trip.

Each case is a tiny random model of one family built from its ``transformers`` config class (no
download), saved by ``save_pretrained`` in several shards.  We load it (shard by shard), compare
float32 logits, then export random parameters of the same config and check that they read back
identical and that ``transformers`` computes our logits from them.
"""

import re

import hf_oracle as oracle
import numpy as np
import pytest

from agentic_jax.models import hf

SMALL = dict(oracle.TINY, head_dim=8)
DEEPSEEK = dict(
    num_key_value_heads=4,  # HF's MLA repeats keys for n_heads / num_key_value_heads groups
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=6,
    head_dim=6,  # HF's rotary width; its config sets it to qk_rope_head_dim when not given
    v_head_dim=12,
    first_k_dense_replace=SMALL["num_hidden_layers"],
    rms_norm_eps=1e-6,
)
# name -> (HF config class, fields beyond SMALL)
CASES = {
    # A window shorter than the sequence; top-k then softmax.
    "mixtral": (
        "MixtralConfig",
        dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=5, rope_theta=500.0),
    ),
    # Dense, MoE, MoE layers (mlp_only_layers) with renormalised top-k gates; QK-norm.
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            num_hidden_layers=3,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            mlp_only_layers=[1],
            norm_topk_prob=True,
            tie_word_embeddings=True,
        ),
    ),
    # Every other layer MoE, gates not renormalised (softmax then top-k).
    "qwen3_moe_step2": (
        "Qwen3MoeConfig",
        dict(
            num_experts=4,
            num_experts_per_tok=3,
            moe_intermediate_size=24,
            decoder_sparse_step=2,
            norm_topk_prob=False,
        ),
    ),
    # QK-norm and a window on the layers from max_window_layers on only.
    "qwen3": (
        "Qwen3Config",
        dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    ),
    # MLA with a query bottleneck, interleaved RoPE dimensions and widths all different; dense
    # layers only (first_k_dense_replace): its MoE router is not in models.moe.
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(DEEPSEEK, q_lora_rank=24, rope_interleave=True),
    ),
    # MLA with a full query projection and rotate-half RoPE.
    "deepseek_v3_full_q": (
        "DeepseekV3Config",
        dict(DEEPSEEK, q_lora_rank=None, rope_interleave=False, tie_word_embeddings=True),
    ),
    # A dense layer, then MoE layers: sigmoid router with a random selection bias, top-3 of the
    # experts of the 2 best of 4 groups, renormalised gates times 2.5, one shared expert.
    "deepseek_v3_routed": (
        "DeepseekV3Config",
        dict(
            DEEPSEEK,
            q_lora_rank=24,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=16,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
        ),
    ),
    # YaRN with mscale and mscale_all_dim: cos/sin scaled by their ratio, MLA's softmax scale by
    # mscale(factor, mscale_all_dim)^2.
    "deepseek_v3_yarn": (
        "DeepseekV3Config",
        dict(
            DEEPSEEK,
            q_lora_rank=None,
            rope_parameters=dict(
                rope_type="yarn",
                factor=4.0,
                original_max_position_embeddings=16,
                mscale=0.707,
                mscale_all_dim=1.0,
            ),
        ),
    ),
    # Every layer MoE, softmax then top-k; QK-norm over the full width of q and of k.
    "olmoe": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)),
    # Sandwich 1 + w norms, GeGLU, scaled embeddings, every other layer windowed (shorter than
    # the sequence), query_pre_attn_scalar != head_dim, soft-caps small enough to bite.
    "gemma2": (
        "Gemma2Config",
        dict(
            sliding_window=4,
            query_pre_attn_scalar=12,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=2.0,
        ),
    ),
    # Explicit layer_types, no soft-caps, the default attention scale; untied head.
    "gemma2_types": (
        "Gemma2Config",
        dict(
            num_hidden_layers=3,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            sliding_window=3,
            query_pre_attn_scalar=8,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            tie_word_embeddings=False,
        ),
    ),
}
ARCHITECTURE = {
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
}


def _family(name: str) -> str:
    return re.sub(r"_(step2|full_q|routed|yarn|types)$", "", name)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(name, sharded checkpoint dir, HF logits) of a tiny random model of one family."""
    cls_name, fields = CASES[request.param]
    torch, model = oracle.hf_model(cls_name, **{**SMALL, **fields})
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, max_shard_size="20KB")
    return request.param, path, oracle.hf_logits(model, torch)


def test_hf_checkpoint_gives_transformers_logits(case):
    name, path, expected = case
    config, params = hf.load_hf_checkpoint(path)
    assert hf.hf_model_type(config) == _family(name)
    np.testing.assert_allclose(oracle.our_logits(params, config), expected, atol=1e-4, rtol=1e-4)


def test_shards_are_streamed_one_at_a_time(case, monkeypatch):
    """Each shard is opened once, and never while another is open."""
    _, path, _ = case
    assert (path / hf.INDEX_FILE).exists()
    opened, open_now, most = [], [0], [0]
    real = hf.safe_open

    class Counting:
        def __init__(self, file, **kwargs):
            opened.append(file)
            self.f = real(file, **kwargs)

        def __enter__(self):
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
            return self.f.__enter__()

        def __exit__(self, *exc):
            open_now[0] -= 1
            return self.f.__exit__(*exc)

    monkeypatch.setattr(hf, "safe_open", Counting)
    hf.load_hf_checkpoint(path)
    shards = sorted(str(p) for p in path.glob("model-*.safetensors"))
    assert len(shards) > 2
    assert sorted(opened) == shards and most[0] == 1


def test_export_round_trips_and_transformers_reproduces_our_logits(case, tmp_path):
    """Our random parameters (norms and routers included) -> HF shards -> identical params, and
    ``transformers`` computes our logits from the export."""
    name, path, _ = case
    config = hf.load_hf_checkpoint(path)[0]
    params = oracle.random_params(config, seed=1)
    hf.save_hf_checkpoint(tmp_path, config, params, max_shard_bytes=20_000)
    assert (tmp_path / hf.INDEX_FILE).exists()
    loaded_config, loaded = hf.load_hf_checkpoint(tmp_path)
    assert loaded_config == config
    oracle.assert_trees_equal(loaded, params)
    torch, model = oracle.load_hf_model(tmp_path)
    assert type(model).__name__ == ARCHITECTURE[_family(name)]
    np.testing.assert_allclose(
        oracle.hf_logits(model, torch), oracle.our_logits(params, config), atol=1e-4, rtol=1e-4
    )


# A Mixtral-shaped config: top-k then softmax, every layer MoE, no QK-norm.
MOE = hf.from_hf_config(
    {"model_type": "mixtral", **SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}
)


def test_export_picks_the_family_that_holds_the_config():
    assert hf.hf_model_type(MOE) == "mixtral"
    # Qwen3-MoE spells the expert width apart from the dense one, and MoE layers by a step.
    qwen = MOE.replace(qk_norm=True, moe_d_ff=24, moe_layers=2, router="softmax_topk")
    assert hf.hf_model_type(qwen) == "qwen3_moe"
    assert hf.from_hf_config(hf.to_hf_config(qwen)) == qwen
    # Mixtral's one width is the experts': the unused dense width is not part of the model.
    wide = MOE.replace(d_ff=1000, moe_d_ff=24)
    assert hf.from_hf_config(hf.to_hf_config(wide)).expert_d_ff == 24
    assert hf.hf_model_type(MOE.replace(n_experts=0, qk_norm=True)) == "qwen3"


@pytest.mark.parametrize(
    "changes, lost",
    [
        # Mixtral renormalises its gates, Qwen3-MoE (the other softmax router) has QK-norm.
        (dict(router="softmax_topk"), "router='softmax_topk'"),
        (dict(n_shared_experts=1), "n_shared_experts=1"),
        (dict(router_noise=1.0), "layers/moe/router_noise"),
        (dict(aux_free_bias_rate=0.01), "layers/moe/router_bias"),
    ],
)
def test_configs_no_family_holds_are_refused_with_the_reason(changes, lost, tmp_path):
    config = MOE.replace(**changes)
    with pytest.raises(NotImplementedError, match=f"mixtral: .*{lost}"):
        hf.hf_model_type(config)
    with pytest.raises(NotImplementedError, match="no HF family"):
        hf.save_hf_checkpoint(tmp_path, config, oracle.random_params(config))
    assert not list(tmp_path.iterdir())


def test_an_explicit_family_that_cannot_hold_the_config_is_refused():
    with pytest.raises(NotImplementedError, match=r"llama: cannot express .*n_experts=4"):
        hf.to_hf_config(MOE, model_type="llama")
    with pytest.raises(ValueError, match="'olmo'"):
        hf.to_hf_config(MOE, model_type="olmo")


def test_deepseek_v3_moe_layers_read_as_the_sigmoid_router():
    dense = hf.to_hf_config(hf.from_hf_config({"model_type": "deepseek_v3", **SMALL, **DEEPSEEK}))
    assert dense["first_k_dense_replace"] == SMALL["num_hidden_layers"]
    # The MoE fields this config.json leaves out are DeepseekV3Config's defaults.
    routed = hf.from_hf_config({**dense, "first_k_dense_replace": 1})
    assert routed.moe_layer_ids == (1,) and routed.router == "sigmoid_topk"
    assert (routed.n_experts, routed.experts_per_token, routed.n_shared_experts) == (256, 8, 1)
    assert (routed.n_expert_groups, routed.topk_groups, routed.normalize_gates) == (8, 4, True)
    assert (routed.routed_scaling_factor, routed.router_aux_loss_coef) == (2.5, 0.001)
    assert hf.hf_model_type(routed) == "deepseek_v3"
    # DeepSeek's MoE layers are the last ones, all routed by sigmoid scores.
    deeper = routed.replace(n_layers=3, moe_layers=(1,))
    with pytest.raises(NotImplementedError, match="deepseek_v3: cannot express moe_layers"):
        hf.to_hf_config(deeper, model_type="deepseek_v3")
    with pytest.raises(NotImplementedError, match="deepseek_v3: cannot express router"):
        hf.to_hf_config(routed.replace(router="softmax_topk"), model_type="deepseek_v3")


GEMMA2 = hf.from_hf_config({"model_type": "gemma2", **SMALL})
OLMOE = hf.from_hf_config(
    {"model_type": "olmoe", **SMALL, "num_experts": 4, "num_experts_per_tok": 2}
)


def test_qk_norm_scope_and_gemma_fields_pick_the_family():
    assert hf.hf_model_type(OLMOE) == "olmoe"
    # Per-head QK-norm scales are Qwen3-MoE's.
    assert hf.hf_model_type(OLMOE.replace(qk_norm_scope="head")) == "qwen3_moe"
    assert hf.hf_model_type(GEMMA2) == "gemma2"
    with pytest.raises(NotImplementedError, match=r"gemma2: .*whole number"):
        hf.hf_model_type(GEMMA2.replace(query_pre_attn_scalar=10.5))
    with pytest.raises(NotImplementedError, match="gemma2: cannot express norm_type='rms'"):
        hf.hf_model_type(GEMMA2.replace(norm_type="rms"))


def test_gemma2_with_every_layer_global_exports_for_transformers(tmp_path):
    """HF's Gemma 2 builds a sliding mask whatever its layers, so it is written some window."""
    config = GEMMA2.replace(
        sliding_window=None, sliding_window_pattern=None, query_pre_attn_scalar=10.0
    )
    params = oracle.random_params(config, seed=2)
    hf.save_hf_checkpoint(tmp_path, config, params)
    assert hf.load_hf_checkpoint(tmp_path)[0] == config
    torch, model = oracle.load_hf_model(tmp_path)
    np.testing.assert_allclose(
        oracle.hf_logits(model, torch), oracle.our_logits(params, config), atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize(
    "model_type, fields, match",
    [
        ("olmoe", dict(num_experts=4, num_experts_per_tok=2, clip_qkv=8.0), "clip_qkv"),
        ("olmoe", dict(num_experts=4, num_experts_per_tok=2, head_dim=16), "head_dim=16"),
        ("gemma2", dict(use_bidirectional_attention=True), "causal"),
        ("llama", dict(hidden_act="relu"), "'relu'"),
    ],
)
def test_what_the_model_cannot_compute_is_refused_on_import(model_type, fields, match):
    with pytest.raises(NotImplementedError, match=match):
        hf.from_hf_config({"model_type": model_type, **SMALL, **fields})
