"""The transformer's hyper-parameters: one frozen, hashable dataclass (usable as a jit static arg)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.core
import gin
import jax.numpy as jnp

ATTENTION_IMPLS = ("xla", "xla_chunked", "pallas", "cudnn")
ROPE_SCALING_TYPES = ("linear", "dynamic", "ntk", "yarn", "llama3")
REMAT_POLICIES = ("none", "full", "dots", "dots_with_no_batch_dims")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer (Llama / Mistral / Qwen2 family).

    ``dtype`` is the compute dtype, ``param_dtype`` the storage dtype of parameters (float32 master
    weights with bfloat16 compute is the usual mixed-precision recipe).  ``rope_scaling`` is None or a
    mapping with ``type`` in linear | dynamic | ntk | yarn | llama3 and that method's parameters.
    """

    vocab_size: int = 512
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    d_ff: int = 172
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    tie_embeddings: bool = True
    qkv_bias: bool = False
    sliding_window: int | None = None
    max_seq_len: int = 2048
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_impl: str = "xla"
    attention_chunk_size: int = 128
    remat_policy: str = "none"
    scan_layers: bool = True
    init_std: float = 0.02

    def __post_init__(self):
        positive = (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "d_ff",
            "max_seq_len",
            "attention_chunk_size",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"TransformerConfig.{name} must be positive, got {getattr(self, name)}"
                )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"TransformerConfig.n_heads={self.n_heads} must be a multiple of "
                f"n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"TransformerConfig.head_dim={self.head_dim} must be even for RoPE")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"TransformerConfig.attention_impl={self.attention_impl!r}; "
                f"expected one of {ATTENTION_IMPLS}"
            )
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"TransformerConfig.remat_policy={self.remat_policy!r}; "
                f"expected one of {REMAT_POLICIES}"
            )
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(
                f"TransformerConfig.sliding_window must be positive or None, "
                f"got {self.sliding_window}"
            )
        for name in ("dtype", "param_dtype"):
            try:
                jnp.dtype(getattr(self, name))
            except TypeError as e:
                raise ValueError(
                    f"TransformerConfig.{name}={getattr(self, name)!r} is not a dtype"
                ) from e
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("type", self.rope_scaling.get("rope_type"))
            if kind not in ROPE_SCALING_TYPES:
                raise ValueError(
                    f"TransformerConfig.rope_scaling type {kind!r}; expected one of "
                    f"{ROPE_SCALING_TYPES}"
                )
            # rope.py reads these without defaults: fail here, not with a KeyError inside jit.
            required = (
                ("factor", "original_max_position_embeddings") if kind == "yarn" else ("factor",)
            )
            for key in required:
                value = self.rope_scaling.get(key)
                if value is None or not value > 0:
                    raise ValueError(
                        f"TransformerConfig.rope_scaling of type {kind!r} needs a positive "
                        f"{key!r}; got {dict(self.rope_scaling)}"
                    )
            # A FrozenDict keeps the config hashable, so it can be a static jit argument.
            object.__setattr__(
                self, "rope_scaling", flax.core.FrozenDict({**self.rope_scaling, "type": kind})
            )

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes) -> TransformerConfig:
        return dataclasses.replace(self, **changes)
