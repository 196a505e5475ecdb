"""The native model format (config.json + orbax params) and the HF <-> native converters."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.data.documents import write_documents
from agentic_jax.data.tokenizer import IM_END, load_tokenizer, train_tokenizer
from agentic_jax.models import TransformerConfig, param_shapes
from agentic_jax.models.export import (
    CONFIG_FILE,
    PARAMS_DIR,
    hf_to_native,
    load_model,
    native_to_hf,
    save_model,
)
from agentic_jax.models.hf import INDEX_FILE, load_hf_checkpoint, save_hf_checkpoint

CONFIG = TransformerConfig(
    vocab_size=128,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=48,
    max_seq_len=64,
    qkv_bias=True,
    sliding_window=6,
    rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
)


def _random_params(config, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, 0.1, s.shape), s.dtype), param_shapes(config)
    )


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(
    "config",
    [
        CONFIG,
        # Fields a HF config cannot carry survive the native format.
        CONFIG.replace(
            tie_embeddings=False,
            param_dtype="bfloat16",
            dtype="bfloat16",
            attention_impl="xla_chunked",
            remat_policy="dots",
            rope_scaling=None,
        ),
    ],
)
def test_save_load_round_trip_is_exact(config, tmp_path):
    params = _random_params(config)
    save_model(tmp_path / "model", config, params)
    loaded_config, loaded = load_model(tmp_path / "model")
    assert loaded_config == config
    _assert_trees_equal(loaded, params)


def test_load_names_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere" / CONFIG_FILE)):
        load_model(tmp_path / "nowhere")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / CONFIG_FILE).write_text("{}")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "half" / PARAMS_DIR)):
        load_model(tmp_path / "half")


def test_unknown_config_fields_fail(tmp_path):
    save_model(tmp_path, CONFIG, _random_params(CONFIG))
    fields = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**fields, "n_wings": 8}))
    with pytest.raises(ValueError, match="n_wings"):
        load_model(tmp_path)


def test_save_refuses_params_of_another_config(tmp_path):
    with pytest.raises(ValueError, match="q_bias"):
        save_model(tmp_path, CONFIG.replace(qkv_bias=False), _random_params(CONFIG))
    assert not (tmp_path / CONFIG_FILE).exists()


def test_hf_native_conversions_are_exact(tmp_path):
    params = _random_params(CONFIG)
    save_hf_checkpoint(tmp_path / "hf", CONFIG, params)
    assert hf_to_native(tmp_path / "hf", tmp_path / "native") == CONFIG
    config, native = load_model(tmp_path / "native")
    assert config == CONFIG
    _assert_trees_equal(native, params)
    native_to_hf(tmp_path / "native", tmp_path / "hf2", max_shard_bytes=20_000)
    assert (tmp_path / "hf2" / INDEX_FILE).exists()
    config, back = load_hf_checkpoint(tmp_path / "hf2")
    assert config == CONFIG
    _assert_trees_equal(back, params)


def test_conversions_carry_the_tokenizer(tmp_path):
    """A training workdir keeps ``tokenizer.json`` beside ``model/``; both conversions must take
    it (and the config naming its special tokens) along, or the result cannot encode a prompt."""
    write_documents(tmp_path / "docs.txt", ["some text to learn merges from"])
    tokenizer = train_tokenizer(
        tmp_path / "run" / "tokenizer.json", files=[tmp_path / "docs.txt"], vocab_size=300
    )
    (tmp_path / "run" / "tokenizer_config.json").write_text(json.dumps({"eos_token": IM_END}))
    save_model(tmp_path / "run" / "model", CONFIG, _random_params(CONFIG))
    native_to_hf(tmp_path / "run" / "model", tmp_path / "hf")
    hf_to_native(tmp_path / "hf", tmp_path / "native")
    for out in ("hf", "native"):
        loaded = load_tokenizer(tmp_path / out)
        assert loaded.fingerprint == tokenizer.fingerprint
        assert loaded.eos_id == tokenizer.token_id(IM_END) != tokenizer.eos_id
    # transformers' generate stops at the config's eos_token_id, not at the tokenizer's.
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["eos_token_id"] == tokenizer.token_id(IM_END)


def test_convert_names_missing_input(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        hf_to_native(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        native_to_hf(tmp_path / "nowhere", tmp_path / "out")
