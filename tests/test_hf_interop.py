"""HF checkpoint interop: converted checkpoints reproduce transformers' logits, and back.

The torch tests build tiny random Llama / Mistral / Qwen2 models from configs (nothing downloads),
randomise every parameter (HF initialises biases to zero and norms to one, which would hide layout
mistakes), and compare fp32 eval-mode logits with ours.
"""

import json

import jax
import numpy as np
import pytest
from hf_oracle import (
    SEQ,
    TINY,
    assert_trees_equal,
    hf_logits,
    hf_model,
    load_hf_model,
    our_logits,
    random_params,
)
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from agentic_jax.data.documents import write_documents
from agentic_jax.data.tokenizer import IM_END, Tokenizer, train_tokenizer
from agentic_jax.models import TransformerConfig
from agentic_jax.models.hf import (
    INDEX_FILE,
    SINGLE_FILE,
    from_hf_config,
    hf_model_type,
    load_hf_checkpoint,
    save_hf_checkpoint,
    to_hf_config,
)

# name -> (HF config class, config fields beyond TINY, save_pretrained max_shard_size)
HF_CASES = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False), "20KB"),
    "llama_llama3": (
        "LlamaConfig",
        dict(
            head_dim=16,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        None,
    ),
    "llama_linear": (
        "LlamaConfig",
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
        None,
    ),
    # Dynamic NTK only acts past max_position_embeddings, so the test sequence runs past it.
    "llama_dynamic": (
        "LlamaConfig",
        dict(max_position_embeddings=SEQ - 4, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
        None,
    ),
    "mistral": ("MistralConfig", dict(sliding_window=4, tie_word_embeddings=False), None),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), None),
    "qwen2_yarn_window": (
        "Qwen2Config",
        dict(
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=0,
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        None,
    ),
}


@pytest.fixture(scope="module", params=list(HF_CASES))
def hf_case(request, tmp_path_factory):
    """(name, checkpoint dir, HF logits) of a tiny random HF model saved with save_pretrained."""
    cls_name, fields, shard = HF_CASES[request.param]
    torch, model = hf_model(cls_name, **{**TINY, **fields})
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return request.param, path, hf_logits(model, torch)


def test_converted_checkpoint_reproduces_hf_logits(hf_case):
    name, path, expected = hf_case
    config, params = load_hf_checkpoint(path)
    assert hf_model_type(config) == HF_CASES[name][0].removesuffix("Config").lower()
    np.testing.assert_allclose(our_logits(params, config), expected, atol=1e-4, rtol=1e-4)


def test_hf_loads_our_checkpoint_with_the_same_logits(hf_case, tmp_path):
    name, path, expected = hf_case
    config, params = load_hf_checkpoint(path)
    save_hf_checkpoint(tmp_path, config, params)
    torch, model = load_hf_model(tmp_path)
    assert type(model).__name__ == HF_CASES[name][0].replace("Config", "ForCausalLM")
    np.testing.assert_allclose(hf_logits(model, torch), expected, atol=1e-4, rtol=1e-4)


def test_hf_matches_native_only_features(tmp_path):
    """Static NTK has no HF type (it is saved as a larger rope_theta); q/k/v biases with a window
    on every layer become Qwen2 with max_window_layers=0; head_dim != hidden / heads."""
    config = TransformerConfig(
        vocab_size=128,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        d_ff=48,
        qkv_bias=True,
        tie_embeddings=False,
        sliding_window=5,
        rope_scaling={"type": "ntk", "factor": 4.0},
    )
    params = random_params(config)
    save_hf_checkpoint(tmp_path, config, params)
    torch, model = load_hf_model(tmp_path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    np.testing.assert_allclose(
        hf_logits(model, torch), our_logits(params, config), atol=1e-4, rtol=1e-4
    )


BASE = TransformerConfig(
    vocab_size=128,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=48,
    max_seq_len=64,
)
ROUND_TRIP = {
    "llama": BASE.replace(tie_embeddings=False),
    "llama3_head16": BASE.replace(
        head_dim=16,
        rope_scaling={
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "mistral_dynamic": BASE.replace(
        sliding_window=4,
        rope_scaling={"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64},
    ),
    "qwen2_yarn": BASE.replace(
        qkv_bias=True,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    ),
    "bf16": BASE.replace(qkv_bias=True, param_dtype="bfloat16"),
}


@pytest.mark.parametrize("name", list(ROUND_TRIP))
@pytest.mark.parametrize("max_shard_bytes", [5 * 10**9, 20_000])
def test_save_load_round_trip_is_exact(name, max_shard_bytes, tmp_path):
    config = ROUND_TRIP[name]
    params = random_params(config)
    save_hf_checkpoint(tmp_path, config, params, max_shard_bytes=max_shard_bytes)
    assert (tmp_path / INDEX_FILE).exists() == (max_shard_bytes < 10**9)
    assert (tmp_path / SINGLE_FILE).exists() == (max_shard_bytes > 10**9)
    loaded_config, loaded = load_hf_checkpoint(tmp_path, param_dtype=config.param_dtype)
    assert loaded_config == config
    assert_trees_equal(loaded, params)


def test_bf16_checkpoint_loads_as_float32(tmp_path):
    config = BASE.replace(param_dtype="bfloat16")
    params = random_params(config)
    save_hf_checkpoint(tmp_path, config, params)
    with safe_open(str(tmp_path / SINGLE_FILE), framework="numpy") as f:
        assert f.get_slice("model.norm.weight").get_dtype() == "BF16"
    loaded_config, loaded = load_hf_checkpoint(tmp_path)
    assert loaded_config.param_dtype == "float32"
    assert_trees_equal(loaded, jax.tree.map(lambda a: a.astype("float32"), params))


@pytest.fixture
def saved(tmp_path):
    """A small single-file checkpoint and its tensors, to corrupt."""
    params = random_params(BASE)
    save_hf_checkpoint(tmp_path, BASE, params)
    tensors = load_file(str(tmp_path / SINGLE_FILE))
    return tmp_path, tensors, params


def _rewrite(path, tensors):
    (path / SINGLE_FILE).unlink()
    save_file(tensors, str(path / SINGLE_FILE), metadata={"format": "pt"})


def test_rotary_buffers_and_tied_head_copies_are_ignored(saved):
    path, tensors, params = saved
    extra = {
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32),
        "lm_head.weight": tensors["model.embed_tokens.weight"],
    }
    _rewrite(path, {**tensors, **extra})
    _, loaded = load_hf_checkpoint(path)
    assert_trees_equal(loaded, params)


def test_unknown_and_missing_tensors_are_named(saved):
    path, tensors, _ = saved
    _rewrite(path, {**tensors, "model.layers.0.mlp.extra.weight": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match=r"unknown.*model\.layers\.0\.mlp\.extra\.weight"):
        load_hf_checkpoint(path)
    _rewrite(path, {k: v for k, v in tensors.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match=r"missing.*model\.norm\.weight"):
        load_hf_checkpoint(path)


def test_shape_mismatch_is_named(saved):
    path, _, _ = saved
    hf = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**hf, "intermediate_size": 40}))
    with pytest.raises(ValueError, match=r"mlp\.\w+_proj\.weight has shape"):
        load_hf_checkpoint(path)


def test_unknown_model_type_is_named(saved):
    path, _, _ = saved
    hf = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**hf, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="'gpt2'"):
        load_hf_checkpoint(path)


def test_unsupported_hf_features_fail_loudly():
    hf = to_hf_config(BASE)
    with pytest.raises(NotImplementedError, match="attention_bias"):
        from_hf_config({**hf, "attention_bias": True})
    with pytest.raises(NotImplementedError, match="longrope"):
        from_hf_config({**hf, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})
    with pytest.raises(NotImplementedError, match="per-layer-type"):
        from_hf_config({**hf, "rope_parameters": {"full_attention": {"rope_type": "default"}}})
    mixed = {**to_hf_config(BASE.replace(qkv_bias=True, sliding_window=4)), "max_window_layers": 1}
    with pytest.raises(NotImplementedError, match="some layers only"):
        from_hf_config(mixed)


def test_missing_files_are_named(tmp_path, saved):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        load_hf_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_hf_checkpoint(tmp_path / "empty")
    path, _, _ = saved
    (path / SINGLE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=SINGLE_FILE):
        load_hf_checkpoint(path)


def test_missing_shard_is_named(tmp_path):
    save_hf_checkpoint(tmp_path, BASE, random_params(BASE), max_shard_bytes=20_000)
    shard = json.loads((tmp_path / INDEX_FILE).read_text())["weight_map"]["model.norm.weight"]
    (tmp_path / shard).unlink()
    with pytest.raises(FileNotFoundError, match=shard):
        load_hf_checkpoint(tmp_path)


def test_index_without_weight_map_is_named(tmp_path):
    save_hf_checkpoint(tmp_path, BASE, random_params(BASE), max_shard_bytes=20_000)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ValueError, match=INDEX_FILE):
        load_hf_checkpoint(tmp_path)


def test_saved_config_carries_the_tokenizer_ids(tmp_path):
    """``generate`` reads BOS/EOS/PAD from config.json; Llama's defaults (1, 2) are not ours."""
    transformers = pytest.importorskip("transformers")
    write_documents(tmp_path / "docs.txt", ["some text"])
    trained = train_tokenizer(
        tmp_path / "tokenizer.json", files=[tmp_path / "docs.txt"], vocab_size=300
    )
    tokenizer = Tokenizer(trained.backend, eos_token=IM_END, pad_token=None)
    save_hf_checkpoint(tmp_path / "hf", BASE, random_params(BASE), tokenizer=tokenizer)
    hf = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert (hf.bos_token_id, hf.eos_token_id) == (tokenizer.bos_id, tokenizer.token_id(IM_END))
    assert hf.pad_token_id is None


def test_save_refuses_mismatched_params_and_existing_weights(tmp_path):
    params = random_params(BASE)
    with pytest.raises(ValueError, match="lm_head"):
        save_hf_checkpoint(tmp_path / "a", BASE.replace(tie_embeddings=False), params)
    save_hf_checkpoint(tmp_path / "b", BASE, params)
    with pytest.raises(FileExistsError, match="already holds"):
        save_hf_checkpoint(tmp_path / "b", BASE, params)
