"""HF families beyond Llama / Mistral / Qwen2: logits equal transformers', exports round-trip.

Each case is a tiny random model of one family built from its ``transformers`` config class (no
download), saved by ``save_pretrained`` in several shards.  We load it (shard by shard), compare
float32 logits, then export random parameters of the same config and check that they read back
identical and that ``transformers`` computes our logits from them.
"""

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
}
ARCHITECTURE = {
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}


def _family(name: str) -> str:
    return name.removesuffix("_step2").removesuffix("_full_q")


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


def test_deepseek_v3_moe_layers_are_refused_naming_the_router():
    dense = hf.to_hf_config(hf.from_hf_config({"model_type": "deepseek_v3", **SMALL, **DEEPSEEK}))
    assert dense["first_k_dense_replace"] == SMALL["num_hidden_layers"]
    with pytest.raises(NotImplementedError, match="routed_scaling_factor"):
        hf.from_hf_config({**dense, "first_k_dense_replace": 1})
