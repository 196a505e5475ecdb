"""Test helper: a training workdir's layout (``model/`` + ``tokenizer.json``) with a random model."""

import os
import pathlib
import re

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
    return _random_model(
        path, task_tokenizer(path), max_seq_len=max_seq_len, n_layers=n_layers, seed=seed
    )


def _random_model(path, tokenizer, *, max_seq_len, n_layers=1, seed=0, init_std=0.02):
    """A random d=32 model over ``tokenizer``, saved as ``path/model``."""
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_layers=n_layers,
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        d_ff=64,
        max_seq_len=max_seq_len,
        init_std=init_std,
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


def retrieval_model_dir(path, *, max_seq_len: int = 64, init_std: float = 0.02):
    """A run directory holding a random d=32 model over a 1000-token BPE of the tiny corpus
    (common words are one token each, as :func:`dictionary_splits` needs).  Returns
    ``(config, params, tokenizer)``."""
    tokenizer = train_tokenizer(path / "tokenizer.json", files=[CORPUS], vocab_size=1000)
    return _random_model(path, tokenizer, max_seq_len=max_seq_len, init_std=init_std)


def _words(words) -> str:
    """Words each after a space, so each is the one token it is after a space."""
    return "".join(f" {w}" for w in words)


def dictionary_splits(
    tokenizer, *, words: int = 8, hard_negatives: int = 1, translate: bool = True, seed: int = 0
):
    """A retrieval task an untrained encoder is at chance on and a few steps learn: a passage is
    five words of one list, its query the counterparts (same position in a second list, sharing
    no token with the first) of three of them, so only a learned dictionary matches the two;
    with ``translate=False``, three of its own words (a lexical match).  ``{"train": 200 queries,
    "heldout": 60}``, one query per passage, as ``RetrievalSplit``s."""
    from agentic_jax.retrieval.training_data import RetrievalSplit

    vocab = sorted(set(re.findall(r"[a-z]{4,}", pathlib.Path(CORPUS).read_text())))
    single = [w for w in vocab if len(tokenizer.encode(f" {w}")) == 1]
    chosen = np.random.default_rng(seed).permutation(single)[: 2 * words]
    query_words, passage_words = chosen[:words], chosen[words:]
    if not translate:
        query_words = passage_words
    rng = np.random.default_rng(seed)

    def split(n):
        picks = [rng.choice(words, 5, replace=False) for _ in range(n)]
        negatives = [
            rng.choice(np.delete(np.arange(n), i), hard_negatives, replace=False) for i in range(n)
        ]
        return RetrievalSplit(
            passages=tuple(_words(passage_words[p]) for p in picks),
            documents=tuple(str(i) for i in range(n)),
            queries=tuple(_words(query_words[rng.choice(p, 3, replace=False)]) for p in picks),
            kinds=("dictionary",) * n,
            positives=np.arange(n, dtype=np.int32),
            hard_negatives=np.asarray(negatives, np.int32),
        )

    return {"train": split(200), "heldout": split(60)}


def packed_batch(rng: np.random.Generator, rows: int, length: int, vocab_size: int) -> dict:
    """A pretraining batch of ``rows`` rows packing two documents each (split at a random place
    per row, positions restarting at the second), random tokens and targets, and the last
    target of every row masked out."""
    idx = np.arange(length)[None, :]
    split = rng.integers(3, length - 3, size=(rows, 1))
    loss_mask = np.ones((rows, length), np.int32)
    loss_mask[:, -1] = 0
    return {
        "tokens": rng.integers(0, vocab_size, (rows, length), dtype=np.int32),
        "targets": rng.integers(0, vocab_size, (rows, length), dtype=np.int32),
        "segment_ids": np.where(idx < split, 1, 2).astype(np.int32),
        "positions": np.where(idx < split, idx, idx - split).astype(np.int32),
        "loss_mask": loss_mask,
    }


def tiny_mla(config: TransformerConfig) -> TransformerConfig:
    """``config`` with tiny multi-head latent attention (DeepSeek-V2): queries and keys of a
    no-position and a RoPE part, smaller values, low-rank query and key-value projections."""
    return config.replace(
        attention_type="mla", n_kv_heads=config.n_heads, q_lora_rank=8, kv_lora_rank=8,
        qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6,
    )  # fmt: skip
