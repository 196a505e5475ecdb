"""Calibration data for post-training compression (AWQ, Wanda): token rows cut from the shipped
corpus, and the input activations of every projection of the model on them."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.documents import read_documents
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.transformer import forward, record_projection_inputs


def calibration_tokens(
    tokenizer: Tokenizer, *, rows: int, length: int, split: str = "train"
) -> np.ndarray:
    """int32 ``[rows, length]``: the first ``rows * length`` tokens of the shipped corpus's
    ``split`` (documents encoded in order and concatenated), one row after another."""
    if rows <= 0 or length <= 0:
        raise ValueError(f"calibration_tokens: rows={rows} and length={length} must be > 0")
    needed, ids = rows * length, []
    for doc in read_documents(corpus_files(split)):
        ids += tokenizer.encode(doc)
        if len(ids) >= needed:
            return np.asarray(ids[:needed], np.int32).reshape(rows, length)
    raise ValueError(f"the shipped {split!r} corpus has {len(ids)} tokens, fewer than {needed}")


def projection_inputs(params, config: TransformerConfig, tokens) -> dict[str, jnp.ndarray]:
    """``{projection name: float32 [layers, tokens, In]}``: what each projection that runs through
    the transformer's ``_dense`` sees on ``tokens [B, T]`` (its input axes flattened; the layers
    are those holding the projection, in order: ``gate``/``up``/``down`` only the dense-MLP
    layers).  Runs one eager, unscanned forward."""
    eager = config.replace(scan_layers=False, remat_policy="none")
    with record_projection_inputs() as recorded:
        forward(params, eager, jnp.asarray(tokens))
    return {
        name: jnp.stack([x.reshape(math.prod(x.shape[:2]), -1).astype(jnp.float32) for x in xs])
        for name, xs in recorded.items()
    }


def dense_mlp_layers(config: TransformerConfig) -> list[int]:
    """The layer index of each row of ``params["layers"]["mlp"]`` (the layers that are not MoE)."""
    moe = set(config.moe_layer_ids)
    return [i for i in range(config.n_layers) if i not in moe]
