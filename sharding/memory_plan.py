"""Per-device memory of a training or serving run, before anything is allocated.

Each tensor the run keeps (parameters, their fp32 master copy, gradients, optimizer moments,
activations saved for the backward pass, KV cache) is given logical axes and laid out with the
same rules as the real arrays (:mod:`sharding.diagnostics`), so the figures follow the actual
sharding: per-device bytes = product of the sharded shape x bytes per element.

Assumptions, stated so the numbers can be checked by hand:

* Parameters are those of the Llama-style transformer (``agentic_jax.models``): embedding,
  per-layer q/k/v/o (+ optional qkv biases), SwiGLU gate/up/down, two RMSNorms, final norm,
  untied LM head unless ``tie_embeddings``.  Gradients and optimizer state are sharded like the
  parameters (ZeRO-3 / FSDP).
* Activations saved per layer and token (remat "none"): the two norm inputs and outputs (4 x d),
  q, k, v and the attention output, the fp32 log-sum-exp of a fused attention kernel (attention
  probabilities are never stored), and the MLP gate, up and gated product (3 x d_ff).  "dots"
  keeps only matmul outputs and the layer input; "full" keeps only the layer input; both add one
  layer's recomputed working set as transient peak.  The head keeps the final norm's input and
  output and fp32 logits for the loss.
* Serving (``optimizer=None``): parameters, the KV cache ``2 x layers x batch x seq x kv_heads x
  head_dim`` and one layer's working set for the prompt plus last-position logits.
* Adapters (``adapters=Adapters(...)``: LoRA, DoRA, QLoRA as ``agentic_jax.models.lora`` trains
  them): the base is frozen (no master copy, gradient or optimizer state; the activations are
  those of full fine-tuning: the backward still runs through every layer); only the adapters
  ``A [L, in..., r]``, ``B [L, r, out...]`` (and DoRA's ``m [L, out...]``) have master copies,
  gradients and moments.  The adapters' own activations (``x A``, ``[B, T, r]`` per target) are
  not counted.  ``base_format="nf4"`` (QLoRA) holds the projections q/k/v/o, gate/up/down (and
  MLA's) at 4 + 8/64 + 32/(64 x 256) = 4.127 bits per parameter (``NF4_BITS``: 4-bit codes,
  float8 absmax per 64, float32 scale per 256 absmax); embeddings, norms and the LM head stay in
  the parameter precision.  Double quantisation's padding to 256 and one float32 offset per
  layer are not counted.
* Multi-head latent attention (``attention_type="mla"``): its projections replace q/k/v/o, its
  training activations are the materialised per-head q, k, v (widths ``qk_nope + qk_rope`` and
  ``v_head_dim``) beside the latent, and its cache is ``layers x batch x seq x (kv_lora_rank +
  qk_rope_head_dim)``: the latent and the shared rope key, nothing per head.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sharding.diagnostics import array_layouts
from sharding.names import BTD, BTF, BTKH, BTNH, BTV
from sharding.rules import AxisRules, current_rules


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of state."""

    param: int
    master: int  # fp32 master copy kept beside low-precision params (0 if none)
    grad: int
    state: int  # per optimizer moment
    activation: int


PRECISIONS = {
    "mixed": Precision(param=2, master=4, grad=2, state=4, activation=2),  # 16 B/param with Adam
    "bf16": Precision(param=2, master=0, grad=2, state=2, activation=2),
    "fp32": Precision(param=4, master=0, grad=4, state=4, activation=4),
}
OPTIMIZER_MOMENTS = {"sgd": 0, "momentum": 1, "lion": 1, "adam": 2, "adamw": 2}
REMAT = ("none", "dots", "full")
# QLoRA's NF4 bytes per parameter: 4-bit codes, a float8 absmax per 64 weights, a float32 scale
# per 256 absmax (Dettmers et al. 2023): 2113/4096 bytes = 4.127 bits.
NF4_BYTES = Fraction(1, 2) + Fraction(1, 64) + Fraction(4, 64 * 256)
NF4_BITS = float(8 * NF4_BYTES)
QUANTIZED = ("q", "k", "v", "o", "gate", "up", "down", "q_a", "q_b", "kv_a")
ADAPTER_INPUT_DIMS = {"o": 2}  # every other adapter target has one input axis


@dataclasses.dataclass(frozen=True)
class Adapters:
    """Adapter fine-tuning over a frozen base: ``rank``, the ``targets`` adapted, DoRA's
    ``magnitude`` vectors, and the base's ``base_format`` (None: the parameter precision;
    ``"nf4"``: QLoRA)."""

    rank: int = 16
    targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
    magnitude: bool = False
    base_format: str | None = None

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"Adapters.rank={self.rank} must be >= 1")
        if self.base_format not in (None, "nf4"):
            raise ValueError(f"Adapters.base_format={self.base_format!r}; expected None or 'nf4'")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The shape-determining fields of ``TransformerConfig``; any object with them will do."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    attention_type: str = "gqa"
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0


LLAMA3_8B = ModelShape(
    vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=14336
)
LLAMA3_70B = ModelShape(
    vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128, d_ff=28672
)
PRESETS = {"llama3-8b": LLAMA3_8B, "llama3-70b": LLAMA3_70B}


def _arrays(table):
    """``{name: (logical axes, shape)}`` -> (axes tree, ShapeDtypeStruct tree)."""
    axes = {name: a for name, (a, _) in table.items()}
    shapes = {name: jax.ShapeDtypeStruct(s, jnp.float32) for name, (_, s) in table.items()}
    return axes, shapes


def transformer_params(c):
    """(axes tree, shapes tree) of the transformer's parameters, flat by name."""
    L, D, N, K, H, F, V = (
        c.n_layers,
        c.d_model,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.d_ff,
        c.vocab_size,
    )
    table = {
        "embed": (("vocab", "embed"), (V, D)),
        "q": (("layers", "embed", "q_heads", "head_dim"), (L, D, N, H)),
        "k": (("layers", "embed", "kv_heads", "head_dim"), (L, D, K, H)),
        "v": (("layers", "embed", "kv_heads", "head_dim"), (L, D, K, H)),
        "o": (("layers", "q_heads", "head_dim", "embed"), (L, N, H, D)),
        "gate": (("layers", "embed", "mlp"), (L, D, F)),
        "up": (("layers", "embed", "mlp"), (L, D, F)),
        "down": (("layers", "mlp", "embed"), (L, F, D)),
        "attn_norm": (("layers", "norm"), (L, D)),
        "mlp_norm": (("layers", "norm"), (L, D)),
        "final_norm": (("norm",), (D,)),
    }
    if c.attention_type == "mla":
        for name in ("q", "k", "v", "o"):
            del table[name]
        table.update(_mla_params(c))
    if c.qkv_bias:
        table["q_bias"] = (("layers", "q_heads", "head_dim"), (L, N, H))
        table["k_bias"] = (("layers", "kv_heads", "head_dim"), (L, K, H))
        table["v_bias"] = (("layers", "kv_heads", "head_dim"), (L, K, H))
    if not c.tie_embeddings:
        table["lm_head"] = (("embed", "vocab"), (D, V))
    return _arrays(table)


def _mla_params(c) -> dict:
    """Multi-head latent attention's projections, as ``agentic_jax.models.transformer`` has them."""
    L, D, N, r = c.n_layers, c.d_model, c.n_heads, c.kv_lora_rank
    qk, heads = (
        c.qk_nope_head_dim + c.qk_rope_head_dim,
        ("layers", "kv_lora", "q_heads", "head_dim"),
    )
    table = {
        "kv_a": (("layers", "embed", "kv_lora"), (L, D, r + c.qk_rope_head_dim)),
        "kv_a_norm": (("layers", "norm"), (L, r)),
        "k_up": (heads, (L, r, N, c.qk_nope_head_dim)),
        "v_up": (heads, (L, r, N, c.v_head_dim)),
        "o": (("layers", "q_heads", "head_dim", "embed"), (L, N, c.v_head_dim, D)),
    }
    if c.q_lora_rank:
        rq = c.q_lora_rank
        table["q_a"] = (("layers", "embed", "q_lora"), (L, D, rq))
        table["q_a_norm"] = (("layers", "norm"), (L, rq))
        table["q_b"] = (("layers", "q_lora", "q_heads", "head_dim"), (L, rq, N, qk))
    else:
        table["q"] = (("layers", "embed", "q_heads", "head_dim"), (L, D, N, qk))
    return table


def adapter_params(c, adapters: Adapters):
    """(axes tree, shapes tree) of the trainable adapters, flat as ``"<target>.<a|b|m>"``, laid out
    as ``agentic_jax.models.lora.lora_axes`` lays them out (the rank replicated)."""
    weights, shapes = transformer_params(c)
    missing = [t for t in adapters.targets if t not in weights]
    if missing:
        raise ValueError(f"Adapters.targets {missing} are not projections of this model")
    table = {}
    for name in adapters.targets:
        axes, shape = weights[name], shapes[name].shape
        n_in = 1 + ADAPTER_INPUT_DIMS.get(name, 1)
        table[f"{name}.a"] = (axes[:n_in] + ("lora_rank",), shape[:n_in] + (adapters.rank,))
        table[f"{name}.b"] = (
            axes[:1] + ("lora_rank",) + axes[n_in:],
            shape[:1] + (adapters.rank,) + shape[n_in:],
        )
        if adapters.magnitude:
            table[f"{name}.m"] = (axes[:1] + axes[n_in:], shape[:1] + shape[n_in:])
    return _arrays(table)


def kv_cache_shape(c, batch: int, seq: int) -> tuple[tuple, tuple, int]:
    """``(logical axes, shape, arrays)`` of the decode-time cache: keys and values (2 arrays) or
    MLA's one latent array."""
    if c.attention_type == "mla":
        width = c.kv_lora_rank + c.qk_rope_head_dim
        axes = ("layers", "cache_batch", "cache_length", "kv_lora")
        return axes, (c.n_layers, batch, seq, width), 1
    axes = ("layers", "cache_batch", "cache_length", "cache_kv_heads", "head_dim")
    return axes, (c.n_layers, batch, seq, c.n_kv_heads, c.head_dim), 2


class Saved(NamedTuple):
    """An activation: logical axes, shape, whether it is fp32, remat policies that keep it."""

    axes: tuple
    shape: tuple
    fp32: bool = False
    kept_by: frozenset = frozenset()


def _layer_activations(c, batch, seq) -> dict[str, Saved]:
    """What one layer stores for its backward pass, by name."""
    B, T, D, N, K, H, F = batch, seq, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff
    every, dots, none = frozenset(REMAT), frozenset({"none", "dots"}), frozenset({"none"})
    if c.attention_type == "mla":  # per-head keys and values materialised from the latent
        qk, kv_heads, v_dim = c.qk_nope_head_dim + c.qk_rope_head_dim, N, c.v_head_dim
        k_axes = BTNH
        latent = {"latent": Saved(BTD[:2] + ("kv_lora",), (B, T, c.kv_lora_rank), kept_by=dots)}
    else:
        qk, kv_heads, v_dim, k_axes, latent = H, K, H, BTKH, {}
    return {
        "layer_input": Saved(BTD, (B, T, D), kept_by=every),
        "attn_norm_out": Saved(BTD, (B, T, D), kept_by=none),
        **latent,
        "q": Saved(BTNH, (B, T, N, qk), kept_by=dots),
        "k": Saved(k_axes, (B, T, kv_heads, qk), kept_by=dots),
        "v": Saved(k_axes, (B, T, kv_heads, v_dim), kept_by=dots),
        "attn_out": Saved(BTNH, (B, T, N, v_dim), kept_by=dots),
        "attn_lse": Saved(BTNH[:3], (B, T, N), fp32=True, kept_by=none),
        "mlp_norm_in": Saved(BTD, (B, T, D), kept_by=dots),
        "mlp_norm_out": Saved(BTD, (B, T, D), kept_by=none),
        "gate": Saved(BTF, (B, T, F), kept_by=dots),
        "up": Saved(BTF, (B, T, F), kept_by=dots),
        "hidden": Saved(BTF, (B, T, F), kept_by=none),
    }


def _bytes(
    table: dict[str, Saved], mesh, rules, precision: Precision, keep=lambda saved: True
) -> int:
    chosen = {name: (saved.axes, saved.shape) for name, saved in table.items() if keep(saved)}
    layouts = array_layouts(*_arrays(chosen), mesh, rules)
    return sum(
        row.device_elements * (4 if table[row.path].fp32 else precision.activation)
        for row in layouts
    )


def _frozen_bytes(row, precision: Precision, base_format: str | None) -> int:
    """Per-device bytes of a frozen base parameter: NF4 for QLoRA's projections."""
    if base_format == "nf4" and row.path in QUANTIZED:
        return math.ceil(row.device_elements * NF4_BYTES)
    return row.device_elements * precision.param


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes by kind of state; ``n_params`` is the global parameter count (the base's
    and the adapters'), ``n_trainable`` the trained ones among them."""

    n_params: int
    n_trainable: int
    params: int
    master_params: int
    grads: int
    optimizer: int
    activations: int
    kv_cache: int

    @property
    def total(self) -> int:
        return (
            self.params
            + self.master_params
            + self.grads
            + self.optimizer
            + self.activations
            + self.kv_cache
        )


def plan_memory(
    config,
    mesh,
    batch: int,
    seq_len: int,
    optimizer: str | None = "adamw",
    precision: str = "mixed",
    remat: str = "full",
    rules: AxisRules | None = None,
    adapters: Adapters | None = None,
) -> MemoryPlan:
    """Per-device memory of training (``optimizer`` set) or serving (``optimizer=None``).

    ``config``: any object with the ``ModelShape`` fields (e.g. ``TransformerConfig``); ``mesh``: a
    Mesh, MeshSpec or ``{axis: size}``; ``batch``: global sequences; ``precision``: a
    ``PRECISIONS`` key; ``remat``: one of ``REMAT``; ``adapters``: train (or serve) adapters over
    a frozen base instead of every parameter.  Raises ``ShardingError`` if a tensor does not
    divide its mesh axes (batch must divide data x fsdp, seq_len the sequence axis, ...).
    """
    if remat not in REMAT:
        raise ValueError(f"remat={remat!r}; expected one of {REMAT}")
    if optimizer is not None and optimizer not in OPTIMIZER_MOMENTS:
        raise ValueError(
            f"optimizer={optimizer!r}; expected None or one of {sorted(OPTIMIZER_MOMENTS)}"
        )
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; expected one of {sorted(PRECISIONS)}")
    p = PRECISIONS[precision]
    rules = AxisRules(current_rules() if rules is None else rules)
    base_rows = array_layouts(*transformer_params(config), mesh, rules)
    if adapters is None:
        trained_rows, frozen_rows = base_rows, []
    else:
        trained_rows, frozen_rows = (
            array_layouts(*adapter_params(config, adapters), mesh, rules),
            base_rows,
        )
    frozen = sum(_frozen_bytes(row, p, adapters.base_format) for row in frozen_rows)
    n_trainable = sum(math.prod(row.shape) for row in trained_rows)
    n_params = n_trainable + sum(math.prod(row.shape) for row in frozen_rows)
    shard = sum(row.device_elements for row in trained_rows)
    params = frozen + shard * p.param
    layer = _layer_activations(config, batch, seq_len)
    one_layer = _bytes(layer, mesh, rules, p)
    if optimizer is None:
        head = {"logits": Saved(BTV, (batch, 1, config.vocab_size), fp32=True)}
        cache_axes, cache_shape, arrays = kv_cache_shape(config, batch, seq_len)
        kv = arrays * _bytes({"cache": Saved(cache_axes, cache_shape)}, mesh, rules, p)
        return MemoryPlan(
            n_params, 0, params, 0, 0, 0, one_layer + _bytes(head, mesh, rules, p), kv
        )
    kept = _bytes(layer, mesh, rules, p, keep=lambda saved: remat in saved.kept_by)
    head = {
        "final_norm_in": Saved(BTD, (batch, seq_len, config.d_model)),
        "final_norm_out": Saved(BTD, (batch, seq_len, config.d_model)),
        "logits": Saved(BTV, (batch, seq_len, config.vocab_size), fp32=True),
    }
    activations = config.n_layers * kept + (one_layer - kept) + _bytes(head, mesh, rules, p)
    return MemoryPlan(
        n_params,
        n_trainable,
        params,
        shard * p.master,
        shard * p.grad,
        shard * p.state * OPTIMIZER_MOMENTS[optimizer],
        activations,
        0,
    )


@dataclasses.dataclass(frozen=True)
class RLHFPlan:
    """Per-device memory of RLHF's four models: the trained ``policy`` and ``critic`` (PPO's value
    model) and the frozen ``reference`` (the KL anchor) and ``reward`` model.  ``total`` holds all
    four at once with both trained models' activations: an upper bound, since they train one
    after the other."""

    policy: MemoryPlan
    reference: MemoryPlan
    reward: MemoryPlan
    critic: MemoryPlan

    @property
    def total(self) -> int:
        return sum(plan.total for plan in (self.policy, self.reference, self.reward, self.critic))


def plan_rlhf(
    config,
    mesh,
    batch: int,
    seq_len: int,
    optimizer: str = "adamw",
    precision: str = "mixed",
    remat: str = "full",
    rules: AxisRules | None = None,
    adapters: Adapters | None = None,
) -> RLHFPlan:
    """The four models as ``agentic_jax.post_training.rl`` holds them (arguments as
    :func:`plan_memory`'s; ``adapters`` is the policy's fine-tuning).  The critic and the reward
    model are the policy's whole transformer with a scalar head (its ``D + 1`` parameters are not
    counted); the critic is trained in full whatever the policy's adapters.  The reference is the
    base the policy starts from: under unquantised adapters it *is* the policy's frozen base
    (0 bytes of its own), otherwise a copy in the parameter precision (QLoRA keeps the float
    reference beside the NF4 base).  Frozen models count their parameters only: their forward
    passes' activations are transient and smaller than training's."""
    policy = plan_memory(config, mesh, batch, seq_len, optimizer, precision, remat, rules, adapters)
    critic = plan_memory(config, mesh, batch, seq_len, optimizer, precision, remat, rules)
    rules = AxisRules(current_rules() if rules is None else rules)
    rows = array_layouts(*transformer_params(config), mesh, rules)
    n_params = sum(math.prod(row.shape) for row in rows)
    frozen = sum(_frozen_bytes(row, PRECISIONS[precision], None) for row in rows)
    reward = MemoryPlan(n_params, 0, frozen, 0, 0, 0, 0, 0)
    shared = adapters is not None and adapters.base_format is None
    reference = dataclasses.replace(reward, params=0) if shared else reward
    return RLHFPlan(policy, reference, reward, critic)


GiB = 1 << 30


def memory_report(
    models=("llama3-8b", "llama3-70b"), device_counts=(8, 256), seq_len: int = 4096
) -> str:
    """Table of planned per-device GiB: mixed-precision AdamW training with full remat (one
    sequence per data x fsdp shard) on an FSDP and an FSDP x TP8 mesh, and bf16 serving on TP8
    replicas with one sequence per replica."""
    header = (
        "model",
        "devices",
        "run",
        "mesh",
        "batch",
        "params",
        "master",
        "grads",
        "opt",
        "activ",
        "kv",
        "total",
    )
    rows = []
    for name in models:
        for n in device_counts:
            runs = (
                ("train", {"fsdp": n}, n, "adamw", "mixed"),
                ("train", {"fsdp": n // 8, "tensor": 8}, n // 8, "adamw", "mixed"),
                ("serve", {"data": n // 8, "tensor": 8}, n // 8, None, "bf16"),
            )
            for run, mesh, batch, optimizer, precision in runs:
                plan = plan_memory(
                    PRESETS[name], mesh, batch, seq_len, optimizer, precision, "full"
                )
                gib = [
                    f"{b / GiB:.2f}"
                    for b in (
                        plan.params,
                        plan.master_params,
                        plan.grads,
                        plan.optimizer,
                        plan.activations,
                        plan.kv_cache,
                        plan.total,
                    )
                ]
                rows.append(
                    (
                        name,
                        str(n),
                        run,
                        "x".join(f"{k}{v}" for k, v in mesh.items()),
                        str(batch),
                        *gib,
                    )
                )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    return "\n".join([f"per-device GiB, seq_len={seq_len}, remat=full", *lines])
