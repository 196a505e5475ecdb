"""Test helper: a training workdir's layout (``model/`` + ``tokenizer.json``) with a random model."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.data.tokenizer import SPECIAL_TOKENS, train_tokenizer
from agentic_jax.models import TransformerConfig, init_params, param_shapes
from agentic_jax.models.export import load_model, save_model
from sharding.partition import path_str

CORPUS = os.path.join(os.path.dirname(__file__), "data", "tiny_corpus.txt")


def make_model_dir(path, *, max_seq_len: int):
    """Writes a 1-layer random model and a 300-token tokenizer under ``path``.

    Special tokens get zero logits (tied embeddings), so greedy decoding prints plain text.
    Returns ``(config, params, tokenizer)``.
    """
    tokenizer = train_tokenizer(path / "tokenizer.json", files=[CORPUS], vocab_size=300)
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        d_ff=32,
        max_seq_len=max_seq_len,
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: rng.normal(0.0, 0.5, s.shape).astype(s.dtype), param_shapes(config)
    )
    params["embed"][: len(SPECIAL_TOKENS)] = 0.0
    params = jax.tree.map(jnp.asarray, params)
    save_model(path / "model", config, params)
    return config, params, tokenizer


def task_tokenizer(path):
    """A small BPE fit on prose plus rendered arithmetic tasks, so that digits merge."""
    from agentic_jax.data.chat import render
    from agentic_jax.envs.text import Arithmetic

    (path / "tasks.txt").write_text(
        "\n".join(render(t.conversation()) for t in Arithmetic(3).tasks(range(300)))
    )
    return train_tokenizer(
        path / "tokenizer.json", files=[CORPUS, path / "tasks.txt"], vocab_size=500
    )


def task_model_dir(path, *, max_seq_len: int, n_layers: int = 1, seed: int = 0):
    """A run directory (``model/`` + ``tokenizer.json``) holding a random d=32 model over
    :func:`task_tokenizer`, for post-training trainers to start from.  Returns
    ``(config, params, tokenizer)``."""
    tokenizer = task_tokenizer(path)
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_layers=n_layers,
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        d_ff=64,
        max_seq_len=max_seq_len,
    )
    params = init_params(config, jax.random.key(seed))
    save_model(path / "model", config, params)
    return config, params, tokenizer


def changed_weights(base_dir, merged_dir) -> set[str]:
    """Paths ("layers/attn/q", ...) of the saved weights that differ between two models."""
    _, base = load_model(base_dir)
    _, merged = load_model(merged_dir)
    differs = jax.tree.map(lambda a, b: not np.array_equal(a, b), base, merged)
    return {path_str(path) for path, d in jax.tree_util.tree_leaves_with_path(differs) if d}
