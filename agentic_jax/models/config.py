"""The transformer's hyper-parameters: one frozen, hashable dataclass (usable as a jit static arg)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.core
import gin
import jax.numpy as jnp

ATTENTION_IMPLS = ("xla", "xla_chunked", "pallas", "cudnn", "ring")
ROPE_SCALING_TYPES = ("linear", "dynamic", "ntk", "yarn", "llama3")
REMAT_POLICIES = ("none", "full", "dots", "dots_with_no_batch_dims")
ROUTERS = ("softmax_topk", "topk_softmax", "sigmoid_topk")
MOE_DISPATCH = ("ragged", "dense")
ATTENTION_TYPES = ("gqa", "mla")
NORM_TYPES = ("rms", "layer", "rms_plus_one")
QK_NORM_SCOPES = ("head", "full")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")
NORM_POSITIONS = ("pre", "post", "sandwich")
LAYER_KINDS = ("sliding_attention", "full_attention")  # Hugging Face's ``layer_types`` names
MATMUL_PRECISIONS = ("default", "fp8")
QUANTIZED_MATMULS = ("xla", "pallas")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer (Llama / Mistral / Qwen2 family).

    ``dtype`` is the compute dtype, ``param_dtype`` the storage dtype of parameters (float32 master
    weights with bfloat16 compute is the usual mixed-precision recipe). ``matmul_precision="fp8"``
    runs every dense projection (attention and MLP, not MoE experts, the embedding or the LM head)
    as an FP8 matmul with per-tile scales (:mod:`agentic_jax.models.fp8`).  ``quantized_matmul``
    is how those projections run when their weights are int8 / int4 ``QuantizedWeight``s: ``xla``
    dequantises the weight in the jitted graph, then multiplies; ``pallas`` runs
    ``pallas_kernels.dequant_matmul``, which reads the packed codes (Mosaic on TPU, Triton on
    GPU, interpreted on CPU).  ``rope_scaling`` is None or a
    mapping with ``type`` in linear | dynamic | ntk | yarn | llama3 and that method's parameters.

    Mixture of experts (:mod:`agentic_jax.models.moe`; 0 ``n_experts`` is a dense model): the
    MLP of the layers named by ``moe_layers`` (an int N: every N-th layer, ``(i + 1) % N == 0``;
    or a tuple of layer indices) is ``n_experts`` SwiGLU experts of width ``moe_d_ff`` (default
    ``d_ff``), ``experts_per_token`` of them per token, chosen by ``router`` with Shazeer's noisy
    gating scaled by ``router_noise`` (training only), each expert taking at most
    ``capacity_factor * tokens * k / n_experts`` assignments (None: dropless), plus
    ``n_shared_experts`` always-on experts.  ``router_aux_loss_coef`` weights the Switch
    load-balancing loss, ``router_z_loss_coef`` the ST-MoE router z-loss, and
    ``aux_free_bias_rate`` > 0 turns on DeepSeek-V3's auxiliary-loss-free balancing bias.
    ``moe_dispatch`` is ``ragged`` (grouped matmul) or ``dense`` (the one-hot reference).
    DeepSeek-V3's routing: ``router="sigmoid_topk"`` (sigmoid scores, with a selection-only
    ``router_bias`` always present), group-limited top-k (the experts split into
    ``n_expert_groups`` groups, top-k among those of the ``topk_groups`` best groups; 1 and 1:
    no limit), ``normalize_gates`` (the chosen gates divided by their sum) and
    ``routed_scaling_factor`` (multiplying the gates); the last three apply to every router.

    Multi-head latent attention (``attention_type="mla"``, DeepSeek-V2/V3; ``head_dim`` and
    ``n_kv_heads`` are then unused): queries through a ``q_lora_rank`` bottleneck (None or 0: a
    full projection), keys and values from a ``kv_lora_rank`` latent, per-head query/key widths
    ``qk_nope_head_dim`` (no position) + ``qk_rope_head_dim`` (RoPE, one key shared by all heads),
    value width ``v_head_dim``.  Decoders cache only the latent and the rope key.

    Variants that imported models need (docs/models.md, "Attention and norm variants"):
    ``qk_norm`` (RMSNorm of q and k before RoPE, over each head's ``head_dim`` when
    ``qk_norm_scope="head"``, Qwen3, or over all heads' width at once when ``"full"``, OLMoE);
    ``sliding_window_pattern`` (an int N: every N-th layer global, the others windowed by
    ``sliding_window``, Gemma 2 with N = 2, Gemma 3 with N = 6; or one ``LAYER_KINDS`` name per
    layer, Hugging Face's ``layer_types``); ``attn_logit_softcap`` and ``final_logit_softcap``
    (``c tanh(x / c)`` on the attention and output logits, Gemma 2); ``norm_type`` (``rms``;
    ``layer``: LayerNorm with a bias; ``rms_plus_one``: RMSNorm scaled by ``1 + w``, Gemma) and
    ``norm_position`` (``pre``: ``x + f(norm(x))``; ``post``: ``x + norm(f(x))``, OLMo 2;
    ``sandwich``: ``x + norm(f(norm(x)))``, Gemma 2); ``mlp_activation`` (``silu``: SwiGLU;
    ``gelu_tanh``: GeGLU with tanh-approximate GELU, Gemma; dense MLPs only);
    ``scale_embeddings`` (embeddings times ``sqrt(d_model)``, Gemma); ``query_pre_attn_scalar``
    (attention logits scaled by its inverse square root, not ``head_dim``'s: Gemma 2).  The
    defaults are today's Llama model.
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
    n_experts: int = 0
    experts_per_token: int = 2
    moe_d_ff: int | None = None
    n_shared_experts: int = 0
    moe_layers: int | tuple[int, ...] = 1
    router: str = "softmax_topk"
    router_noise: float = 0.0
    capacity_factor: float | None = None
    router_aux_loss_coef: float = 0.01
    router_z_loss_coef: float = 0.001
    aux_free_bias_rate: float = 0.0
    moe_dispatch: str = "ragged"
    n_expert_groups: int = 1
    topk_groups: int = 1
    normalize_gates: bool = False
    routed_scaling_factor: float = 1.0
    attention_type: str = "gqa"
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_norm: bool = False
    qk_norm_scope: str = "head"
    sliding_window_pattern: int | tuple[str, ...] | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    norm_type: str = "rms"
    norm_position: str = "pre"
    matmul_precision: str = "default"
    quantized_matmul: str = "xla"
    mlp_activation: str = "silu"
    scale_embeddings: bool = False
    query_pre_attn_scalar: float | None = None

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
        self._check_moe()
        self._check_attention()
        self._check_matmul_precision()

    def _check_matmul_precision(self):
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"TransformerConfig.matmul_precision={self.matmul_precision!r}; expected one of "
                f"{MATMUL_PRECISIONS}"
            )
        if self.matmul_precision == "fp8" and self.n_experts:
            raise ValueError(
                "TransformerConfig.matmul_precision='fp8' covers the dense projections; the "
                "mixture-of-experts layers' grouped matmuls have no FP8 path (n_experts=0 or "
                "matmul_precision='default')"
            )
        if self.quantized_matmul not in QUANTIZED_MATMULS:
            raise ValueError(
                f"TransformerConfig.quantized_matmul={self.quantized_matmul!r}; expected one of "
                f"{QUANTIZED_MATMULS}"
            )
        if self.quantized_matmul == "pallas" and self.matmul_precision == "fp8":
            raise ValueError(
                "TransformerConfig.quantized_matmul='pallas' runs the quantised projections "
                "through the dequantising kernel, which has no FP8 path: pick one of it and "
                "matmul_precision='fp8'"
            )

    def _check_attention(self):
        for name, allowed in (
            ("attention_type", ATTENTION_TYPES),
            ("norm_type", NORM_TYPES),
            ("norm_position", NORM_POSITIONS),
            ("qk_norm_scope", QK_NORM_SCOPES),
            ("mlp_activation", MLP_ACTIVATIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"TransformerConfig.{name}={getattr(self, name)!r}; expected one of {allowed}"
                )
        if self.qk_norm_scope != "head" and not self.qk_norm:
            raise ValueError(
                f"TransformerConfig.qk_norm_scope={self.qk_norm_scope!r} needs qk_norm=True"
            )
        if self.mlp_activation != "silu" and self.n_experts:
            raise ValueError(
                f"TransformerConfig.mlp_activation={self.mlp_activation!r}: mixture-of-experts "
                "layers are SwiGLU (silu) only"
            )
        if self.query_pre_attn_scalar is not None and self.mla:
            raise ValueError(
                "TransformerConfig.query_pre_attn_scalar is for attention_type='gqa' (MLA scales "
                "by its qk_head_dim)"
            )
        for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"TransformerConfig.{name} must be positive or None, got {value}")
        if self.attention_type == "mla":
            self._check_mla()
        pattern = self.sliding_window_pattern
        if pattern is None:
            return
        if self.sliding_window is None:
            raise ValueError(
                "TransformerConfig.sliding_window_pattern needs sliding_window (the local "
                "layers' window)"
            )
        if isinstance(pattern, int):
            if pattern <= 0:
                raise ValueError(
                    f"TransformerConfig.sliding_window_pattern={pattern}: an interval must be >= 1"
                )
            return
        # gin passes lists; a tuple keeps the config hashable (a static jit argument).
        pattern = tuple(pattern)
        if len(pattern) != self.n_layers or any(k not in LAYER_KINDS for k in pattern):
            raise ValueError(
                f"TransformerConfig.sliding_window_pattern={pattern} must name one of "
                f"{LAYER_KINDS} for each of the {self.n_layers} layers"
            )
        object.__setattr__(self, "sliding_window_pattern", pattern)

    def _check_mla(self):
        if self.q_lora_rank is not None and self.q_lora_rank < 0:
            raise ValueError(
                f"TransformerConfig.q_lora_rank must be >= 0 or None, got {self.q_lora_rank}"
            )
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"TransformerConfig.{name} must be positive for attention_type='mla', "
                    f"got {getattr(self, name)}"
                )
        if self.qk_rope_head_dim % 2:
            raise ValueError(
                f"TransformerConfig.qk_rope_head_dim={self.qk_rope_head_dim} must be even for RoPE"
            )
        if self.qk_norm or self.qkv_bias:
            raise ValueError(
                "TransformerConfig: qk_norm and qkv_bias are for attention_type='gqa' (MLA "
                "normalises its latents instead)"
            )

    @property
    def mla(self) -> bool:
        return self.attention_type == "mla"

    @property
    def rope_dim(self) -> int:
        """The width RoPE rotates: ``qk_rope_head_dim`` under MLA, else ``head_dim``."""
        return self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys (``sm_scale`` is its inverse square root)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None: global), from ``sliding_window_pattern``."""
        pattern = self.sliding_window_pattern
        if pattern is None:
            return (self.sliding_window,) * self.n_layers
        if isinstance(pattern, int):
            local = [(i + 1) % pattern != 0 for i in range(self.n_layers)]
        else:
            local = [kind == "sliding_attention" for kind in pattern]
        return tuple(self.sliding_window if is_local else None for is_local in local)

    @property
    def kv_cache_width(self) -> int:
        """Cached elements per token and layer: ``2 n_kv_heads head_dim`` (keys and values), or
        MLA's ``kv_lora_rank + qk_rope_head_dim`` (the latent and the shared rope key)."""
        if self.mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    def _check_moe(self):
        if self.n_experts < 0:
            raise ValueError(f"TransformerConfig.n_experts must be >= 0, got {self.n_experts}")
        if not self.n_experts:
            return
        if not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(
                f"TransformerConfig.experts_per_token={self.experts_per_token} must be in "
                f"[1, n_experts={self.n_experts}]"
            )
        if self.moe_d_ff is not None and self.moe_d_ff <= 0:
            raise ValueError(f"TransformerConfig.moe_d_ff must be positive, got {self.moe_d_ff}")
        if self.n_shared_experts < 0:
            raise ValueError(
                f"TransformerConfig.n_shared_experts must be >= 0, got {self.n_shared_experts}"
            )
        if self.router not in ROUTERS:
            raise ValueError(f"TransformerConfig.router={self.router!r}; expected one of {ROUTERS}")
        if self.moe_dispatch not in MOE_DISPATCH:
            raise ValueError(
                f"TransformerConfig.moe_dispatch={self.moe_dispatch!r}; expected one of "
                f"{MOE_DISPATCH}"
            )
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(
                f"TransformerConfig.capacity_factor must be positive or None (dropless), "
                f"got {self.capacity_factor}"
            )
        for name in ("router_noise", "router_aux_loss_coef", "router_z_loss_coef"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"TransformerConfig.{name} must be >= 0, got {getattr(self, name)}"
                )
        if self.aux_free_bias_rate < 0:
            raise ValueError(
                f"TransformerConfig.aux_free_bias_rate must be >= 0, got {self.aux_free_bias_rate}"
            )
        if not self.routed_scaling_factor > 0:
            raise ValueError(
                f"TransformerConfig.routed_scaling_factor must be positive, got "
                f"{self.routed_scaling_factor}"
            )
        self._check_expert_groups()
        layers = self.moe_layers
        if isinstance(layers, int):
            if layers <= 0:
                raise ValueError(f"TransformerConfig.moe_layers={layers}: an interval must be >= 1")
        else:
            # gin passes lists; a tuple keeps the config hashable (a static jit argument).
            layers = tuple(int(i) for i in layers)
            if not layers or any(not 0 <= i < self.n_layers for i in layers):
                raise ValueError(
                    f"TransformerConfig.moe_layers={layers} must be non-empty layer indices "
                    f"in [0, n_layers={self.n_layers})"
                )
            object.__setattr__(self, "moe_layers", tuple(sorted(set(layers))))
        if not self.moe_layer_ids:
            raise ValueError(
                f"TransformerConfig.moe_layers={self.moe_layers} selects none of the "
                f"{self.n_layers} layers"
            )

    def _check_expert_groups(self):
        groups, best = self.n_expert_groups, self.topk_groups
        if groups < 1 or self.n_experts % groups:
            raise ValueError(
                f"TransformerConfig.n_expert_groups={groups} must be >= 1 and divide "
                f"n_experts={self.n_experts}"
            )
        if not 1 <= best <= groups:
            raise ValueError(
                f"TransformerConfig.topk_groups={best} must be in [1, n_expert_groups={groups}]"
            )
        if self.experts_per_token > best * (self.n_experts // groups):
            raise ValueError(
                f"TransformerConfig.experts_per_token={self.experts_per_token} exceeds the "
                f"{best * (self.n_experts // groups)} experts of the topk_groups={best} groups"
            )

    @property
    def has_router_bias(self) -> bool:
        """Whether MoE layers hold a selection-only router bias: DeepSeek-V3's sigmoid router
        always does (``e_score_correction_bias``), any router with ``aux_free_bias_rate``."""
        return self.router == "sigmoid_topk" or self.aux_free_bias_rate > 0

    @property
    def moe_layer_ids(self) -> tuple[int, ...]:
        """The indices of the layers whose MLP is a mixture of experts (empty: a dense model)."""
        if not self.n_experts:
            return ()
        if isinstance(self.moe_layers, int):
            return tuple(i for i in range(self.n_layers) if (i + 1) % self.moe_layers == 0)
        return self.moe_layers

    @property
    def expert_d_ff(self) -> int:
        """One routed expert's hidden width (``moe_d_ff``, else ``d_ff``)."""
        return self.d_ff if self.moe_d_ff is None else self.moe_d_ff

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes) -> TransformerConfig:
        return dataclasses.replace(self, **changes)
