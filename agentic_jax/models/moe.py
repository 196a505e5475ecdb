"""Mixture-of-experts MLP: routing, capacity, grouped-matmul dispatch and expert parallelism.

A layer holds ``E`` SwiGLU experts and a router ``W_r [D, E]``.  Each token ``x`` gets router
logits ``s = x W_r`` (float32: routing decisions are precision-sensitive, Fedus et al. 2021's
"selective precision"), and ``k`` experts with gate weights ``g``:

* ``softmax_topk`` (Switch, GShard, DeepSeek-V2): ``p = softmax(s)``, the top-k of ``p``, and
  ``g_i = p_i`` (not renormalised);
* ``topk_softmax`` (Mixtral): the top-k of ``s`` and ``g = softmax(s_topk)`` over the k chosen;
* ``sigmoid_topk`` (DeepSeek-V3, Liu et al. 2024): ``σ = sigmoid(s)``, the top-k of ``σ + b``
  (``b`` the selection-only bias below, always present) and ``g_i = σ_i``.

Group-limited routing (DeepSeek-V3's, any router): the ``E`` experts form ``n_expert_groups``
consecutive groups, a group scores the sum of its two best selection scores, and the top-k is
taken among the experts of the ``topk_groups`` best groups only.  ``normalize_gates`` divides the
k gates by their sum (DeepSeek-V3's ``norm_topk_prob``), and ``routed_scaling_factor`` multiplies
them.

The output is ``y = Σ_{i ∈ topk} g_i · FFN_i(x)`` plus the always-on shared experts (DeepSeekMoE,
Dai et al. 2024), one SwiGLU of width ``n_shared_experts · moe_d_ff``.

Training-time noisy gating (Shazeer et al. 2017) adds ``router_noise · ε · softplus(x W_noise)``,
``ε ~ N(0, 1)``, to the logits before the top-k.  Balancing: the Switch loss (Fedus et al. 2021)
``E · Σ_i f_i P_i`` (``f_i`` the share of the ``N·k`` assignments that go to expert i, ``P_i`` its
mean router probability; 1 when uniform; for ``sigmoid_topk`` DeepSeek-V3's sequence-wise form,
see :func:`balance_loss`), the router z-loss of ST-MoE (Zoph et al. 2022)
``mean(logsumexp(s)²)``, and DeepSeek-V3's auxiliary-loss-free bias ``b``: added to the scores
for the top-k *selection only* (gates use the unbiased scores), it is no parameter of the
gradient but state moved after every step by ``b_i += γ · sign(mean_j load_j − load_i)``
(:func:`move_router_bias`), so an overloaded expert is chosen less often without any loss term
pulling on the model.

Capacity (GShard, Lepikhin et al. 2020): with a ``capacity_factor``, each expert takes at most
``C = ceil(capacity_factor · n · k / E)`` of the assignments of its dispatch group (the ``n``
tokens one device routes); the rest are dropped (their token keeps the residual only).  The
priority order is slot-major: every token's first choice before any second choice, and within a
slot the token order, so a token loses its top-1 expert only to earlier tokens' top-1s.  Decoding
routes dropless: a token's output must not depend on which other requests share its batch.

Dispatch: the ``n·k`` (token, expert) assignments are sorted by expert and run through
``jax.lax.ragged_dot``, a grouped matmul whose cost is the assignments', not ``n·E``; ``dense`` is
the one-hot reference (every expert on every token, combined with a ``[n, E]`` weight matrix).
Under a mesh the dispatch runs in ``jax.shard_map`` with each device sorting its own tokens; with
the ``expert`` mesh axis > 1, experts are sharded over it and the assignments travel to their
expert's device and back with two ``all_to_all``s (GShard's dispatch and combine).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec

from agentic_jax.models.config import TransformerConfig
from sharding.mesh import axis_sizes
from sharding.names import BTD
from sharding.rules import current_rules

GATE_AXES = ("expert", "embed", "mlp")  # a routed expert's gate/up [E, D, F], one layer
DOWN_AXES = ("expert", "mlp", "embed")  # its down projection [E, F, D]


def swiglu(x, gate, up, down):
    """``(silu(x W_gate) ⊙ x W_up) W_down`` (Shazeer 2020): one expert, or the shared experts."""
    return (jax.nn.silu(x @ gate) * (x @ up)) @ down


def route(p, x, config: TransformerConfig, key=None):
    """``(experts [n, k], gates [n, k], logits [n, E], probs [n, E])`` for tokens ``x [n, D]``.

    ``key`` (training only) draws the noisy-gating noise; ``p["router_bias"]``, when present,
    biases the selection but not the gates.
    """
    x32 = x.astype(jnp.float32)
    logits = x32 @ p["router"].astype(jnp.float32)
    noisy = logits
    if config.router_noise and key is not None:
        std = jax.nn.softplus(x32 @ p["router_noise"].astype(jnp.float32))
        noisy = logits + config.router_noise * jax.random.normal(key, logits.shape) * std
    if config.router == "sigmoid_topk":
        scores = jax.nn.sigmoid(noisy)
        probs = jax.nn.sigmoid(logits)
        probs = probs / probs.sum(-1, keepdims=True)
    else:
        scores = jax.nn.softmax(noisy, axis=-1) if config.router == "softmax_topk" else noisy
        probs = jax.nn.softmax(logits, axis=-1)
    selection = scores
    if "router_bias" in p:
        selection = scores + jax.lax.stop_gradient(p["router_bias"].astype(jnp.float32))
    if config.topk_groups < config.n_expert_groups:
        selection = limit_groups(selection, config.n_expert_groups, config.topk_groups)
    _, experts = jax.lax.top_k(selection, config.experts_per_token)
    gates = jnp.take_along_axis(scores, experts, axis=-1)
    if config.router == "topk_softmax":
        gates = jax.nn.softmax(gates, axis=-1)
    if config.normalize_gates:
        gates = gates / (gates.sum(-1, keepdims=True) + 1e-20)  # HF's epsilon
    return experts, gates * config.routed_scaling_factor, logits, probs


def limit_groups(selection, n_groups: int, topk_groups: int):
    """DeepSeek-V3's group-limited routing: ``selection [n, E]`` with the experts outside each
    token's ``topk_groups`` best groups set to ``-inf``.  The experts are ``n_groups``
    consecutive groups; a group scores the sum of its two best selection scores (its one, for
    groups of one expert)."""
    n, e = selection.shape
    grouped = selection.reshape(n, n_groups, e // n_groups)
    best_two = jax.lax.top_k(grouped, min(2, e // n_groups))[0].sum(-1)
    _, kept = jax.lax.top_k(best_two, topk_groups)
    keep = jax.nn.one_hot(kept, n_groups, dtype=bool).any(1)
    return jnp.where(keep[:, :, None], grouped, -jnp.inf).reshape(n, e)


def capacity(n_tokens: int, config: TransformerConfig) -> int | None:
    """Assignments one expert takes from a group of ``n_tokens``; None when dropless."""
    if config.capacity_factor is None:
        return None
    return math.ceil(
        config.capacity_factor * n_tokens * config.experts_per_token / config.n_experts
    )


def capacity_keep(experts, n_experts: int, cap: int | None):
    """``keep [n, k]``: the assignments within their expert's first ``cap`` in slot-major order."""
    if cap is None:
        return jnp.ones(experts.shape, bool)
    flat = experts.T.reshape(-1)  # slot-major: all first choices, then all second choices, ...
    order = jnp.argsort(flat, stable=True)
    counts = jnp.bincount(flat, length=n_experts)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.zeros_like(flat).at[order].set(jnp.arange(flat.size) - starts[flat[order]])
    return (rank < cap).reshape(experts.shape[::-1]).T


def _grouped_swiglu(rows, group_sizes, gate, up, down):
    """SwiGLU of each row with its group's expert: rows sorted by expert, ``group_sizes [G]``;
    rows past ``sum(group_sizes)`` (padding) give zeros."""
    hidden = jax.nn.silu(jax.lax.ragged_dot(rows, gate, group_sizes)) * jax.lax.ragged_dot(
        rows, up, group_sizes
    )
    return jax.lax.ragged_dot(hidden, down, group_sizes)


def _exchange(rows, sorted_experts, counts, gate, up, down, axis: str):
    """Expert parallelism: rows (sorted by expert, dropped ones last with id ``E``) go to the
    device owning their expert, run there, and come back in their order.

    Each device sends every other one a fixed-size block (``all_to_all`` needs equal shapes)
    big enough for all its rows: the worst case, since any device may route everything to one.
    """
    shards, local = jax.lax.axis_size(axis), gate.shape[0]
    n, d = rows.shape
    dest = sorted_experts // local  # == shards for dropped rows: scattered out of bounds
    per_dest = counts.reshape(shards, local)
    starts = jnp.cumsum(per_dest.sum(1)) - per_dest.sum(1)
    slot = jnp.arange(n) - starts[jnp.minimum(dest, shards - 1)]
    send = jnp.zeros((shards, n, d), rows.dtype).at[dest, slot].set(rows, mode="drop")
    recv = jax.lax.all_to_all(send, axis, 0, 0)  # recv[j]: the rows device j sent here
    recv_counts = jax.lax.all_to_all(per_dest, axis, 0, 0)  # [source, local expert]
    ends = jnp.cumsum(recv_counts, axis=1)
    expert_of = jax.vmap(lambda e: jnp.searchsorted(e, jnp.arange(n), side="right"))(ends)
    order = jnp.argsort(expert_of.reshape(-1), stable=True)
    out = _grouped_swiglu(recv.reshape(-1, d)[order], recv_counts.sum(0), gate, up, down)
    out = jnp.zeros_like(out).at[order].set(out).reshape(shards, n, d)
    back = jax.lax.all_to_all(out, axis, 0, 0)  # back[j]: results of the rows sent to j
    return jnp.where((dest < shards)[:, None], back[jnp.minimum(dest, shards - 1), slot], 0)


def _dispatch(x, experts, gates, gate, up, down, *, n_experts, cap, expert_axis=None):
    """``(y [n, D], dropped)`` for one dispatch group: the ragged (grouped-matmul) path."""
    n, k = experts.shape
    keep = capacity_keep(experts, n_experts, cap)
    flat = jnp.where(keep, experts, n_experts).reshape(-1)  # dropped: a sentinel group, last
    order = jnp.argsort(flat, stable=True)
    rows = x[order // k]
    counts = jnp.bincount(flat, length=n_experts + 1)[:n_experts]
    if expert_axis is None:
        out = _grouped_swiglu(rows, counts, gate, up, down)
    else:
        out = _exchange(rows, flat[order], counts, gate, up, down, expert_axis)
    out = jnp.zeros_like(out).at[order].set(out)
    weights = jnp.where(keep, gates, 0).astype(out.dtype).reshape(-1, 1)
    return (out * weights).reshape(n, k, -1).sum(1), jnp.sum(~keep)


def dense_dispatch(x, experts, gates, gate, up, down, *, n_experts, cap):
    """The one-hot reference: every expert on every token, ``y = Σ_e combine[:, e] FFN_e(x)``."""
    keep = capacity_keep(experts, n_experts, cap)
    combine = jnp.einsum(
        "nk,nke->ne", jnp.where(keep, gates, 0), jax.nn.one_hot(experts, n_experts)
    ).astype(x.dtype)
    every = jax.vmap(swiglu, in_axes=(None, 0, 0, 0))(x, gate, up, down)  # [E, n, D]
    return jnp.einsum("ne,end->nd", combine, every), jnp.sum(~keep)


def _gather(w, axes, dim):
    """All-gathers a weight's ``dim`` over the mesh axes it is sharded on (ZeRO-3 in shard_map)."""
    return w if axes is None else jax.lax.all_gather(w, axes, axis=dim, tiled=True)


def _sharded_dispatch(x, experts, gates, gate, up, down, *, config, dropless, mesh):
    """:func:`_dispatch` in ``shard_map``: tokens and experts laid out by the rule table.

    Each device routes its own tokens (its dispatch group); experts' ``embed`` dimension is
    gathered over its axes (FSDP), their ``mlp`` dimension stays split (tensor parallelism: the
    partial outputs are summed), and the ``expert`` axis exchanges tokens.
    """
    rules, sizes = current_rules(), axis_sizes(mesh)
    x_spec = rules.resolve(BTD, sizes, shape=x.shape, path="moe/x")
    route_spec = PartitionSpec(*x_spec[:2], None)
    gate_spec = rules.resolve(GATE_AXES, sizes, shape=gate.shape, path="moe/gate")
    down_spec = rules.resolve(DOWN_AXES, sizes, shape=down.shape, path="moe/down")
    token_axes = tuple(
        a for part in x_spec[:2] if part for a in ((part,) if isinstance(part, str) else part)
    )
    expert_axis = gate_spec[0]
    if isinstance(expert_axis, tuple):
        raise ValueError(f"the expert dimension must map to one mesh axis; got {gate_spec}")

    def body(x, experts, gates, gate, up, down):
        b, t, d = x.shape
        gate, up = (_gather(w, gate_spec[1], 1) for w in (gate, up))
        down = _gather(down, down_spec[2], 2)
        y, dropped = _dispatch(
            x.reshape(b * t, d),
            experts.reshape(b * t, -1),
            gates.reshape(b * t, -1),
            gate,
            up,
            down,
            n_experts=config.n_experts,
            cap=None if dropless else capacity(b * t, config),
            expert_axis=expert_axis,
        )
        if gate_spec[2] is not None:
            y = jax.lax.psum(y, gate_spec[2])
        if token_axes:
            dropped = jax.lax.psum(dropped, token_axes)
        return y.reshape(b, t, d), dropped

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(x_spec, route_spec, route_spec, gate_spec, gate_spec, down_spec),
        out_specs=(x_spec, PartitionSpec()),
    )(x, experts, gates, gate, up, down)


def moe_mlp(p, x, config: TransformerConfig, *, key=None, dropless: bool = False):
    """The MoE MLP on ``x [B, T, D]``: ``(y [B, T, D], stats)``.

    ``p`` is one layer's ``moe`` parameters (storage dtype; the router stays float32).
    ``stats``: ``balance_loss``, ``z_loss``, ``entropy`` (mean router entropy, nats),
    ``load [E]`` (assignments per expert before capacity) and ``dropped`` (assignments dropped).
    """
    b, t, d = x.shape
    dtype = config.compute_dtype
    experts, gates, logits, probs = route(p, x.reshape(b * t, d), config, key)
    weights = {name: p[name].astype(dtype) for name in ("gate", "up", "down")}
    mesh = jax.sharding.get_abstract_mesh()
    if config.moe_dispatch == "dense" or mesh.empty or AxisType.Manual in mesh.axis_types:
        dispatch = functools.partial(
            dense_dispatch if config.moe_dispatch == "dense" else _dispatch,
            n_experts=config.n_experts,
            cap=None if dropless else capacity(b * t, config),
        )
        y, dropped = dispatch(x.reshape(b * t, d), experts, gates, **weights)
        y = y.reshape(b, t, d)
    else:
        y, dropped = _sharded_dispatch(
            x,
            experts.reshape(b, t, -1),
            gates.reshape(b, t, -1),
            **weights,
            config=config,
            dropless=dropless,
            mesh=mesh,
        )
    if config.n_shared_experts:
        s = p["shared"]
        y = y + swiglu(x, *(s[name].astype(dtype) for name in ("gate", "up", "down")))
    load = jnp.bincount(experts.reshape(-1), length=config.n_experts)
    stats = {
        "balance_loss": balance_loss(experts, probs, config, rows=b),
        "z_loss": jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1))),
        "entropy": -jnp.mean(jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1)),
        "load": load,
        "dropped": dropped,
    }
    return y.astype(x.dtype), stats


def balance_loss(experts, probs, config: TransformerConfig, *, rows: int):
    """``E · Σ_i f_i P_i`` (``f_i`` the share of the assignments expert i gets, ``P_i`` its mean
    router probability), over the whole batch for the softmax routers (Switch), and per sequence
    (each of the ``rows`` rows of tokens), then averaged, for ``sigmoid_topk``: DeepSeek-V3's
    sequence-wise balance loss, whose ``P`` is the sigmoid scores normalised to sum to 1."""
    groups = rows if config.router == "sigmoid_topk" else 1
    per_group = experts.reshape(groups, -1)
    share = jax.vmap(lambda e: jnp.bincount(e, length=config.n_experts))(per_group)
    share = share / per_group.shape[1]
    mean_probs = probs.reshape(groups, -1, config.n_experts).mean(1)
    return config.n_experts * jnp.mean(jnp.sum(share * mean_probs, axis=-1))


def aux_loss(stats, config: TransformerConfig):
    """The weighted auxiliary loss of stacked per-layer ``stats``: means over the MoE layers, so
    a coefficient means the same whatever the depth."""
    return config.router_aux_loss_coef * jnp.mean(
        stats["balance_loss"]
    ) + config.router_z_loss_coef * jnp.mean(stats["z_loss"])


_FORWARDS = contextvars.ContextVar("moe_forwards", default=None)


@contextlib.contextmanager
def collect_aux(enabled: bool = True):
    """Collects the auxiliary outputs of the forward passes run inside it that do not hand them
    to their caller (``hidden_states(..., return_aux=False)``, so every loss built on the model's
    plain forward): ``with collect_aux() as forwards:`` leaves a list of their aux dicts.  This is
    how ``training.make_update`` adds a mixture of experts' router losses to any trainer's loss
    (flax's ``sow`` in spirit).  ``enabled=False`` hides the forwards inside it from an outer
    collector (a frozen teacher's).  The forwards must run in the collector's own trace, not
    inside a ``jit``, ``vmap`` or ``scan`` of their own: JAX would report a leaked tracer."""
    forwards = [] if enabled else None
    token = _FORWARDS.set(forwards)
    try:
        yield forwards
    finally:
        _FORWARDS.reset(token)


def report_aux(aux) -> None:
    """Hands a forward's auxiliary outputs to the active :func:`collect_aux`, if any."""
    forwards = _FORWARDS.get()
    if aux and forwards is not None:
        forwards.append(aux)


def merge_aux(forwards):
    """One aux dict of several forward passes' (``{}`` for none): their losses and per-token
    statistics averaged, their expert loads and dropped assignments added."""
    if len(forwards) <= 1:
        return forwards[0] if forwards else {}
    return {
        name: sum(f[name] for f in forwards) / (1 if name in ("load", "dropped") else len(forwards))
        for name in forwards[0]
    }


def with_aux_loss(total, count, metrics, aux):
    """``(total, metrics)`` of a loss with a forward's ``aux`` added: its auxiliary loss, a
    per-token mean, as ``aux · count`` (so ``total / count`` is the loss plus it) and the router
    metrics of :func:`loss_metrics`.  Unchanged for a dense model (``aux == {}``)."""
    if not aux:
        return total, metrics
    return total + aux["loss"] * count, {**metrics, **loss_metrics(aux, count)}


def loss_metrics(stats, count):
    """Router metrics of one (micro-)batch as sums, so micro-batches add exactly; ``count`` is the
    batch's loss count, weighting its per-token means.  :func:`step_metrics` normalises them."""
    return {
        "moe_balance_loss": jnp.mean(stats["balance_loss"]) * count,
        "moe_z_loss": jnp.mean(stats["z_loss"]) * count,
        "moe_entropy": jnp.mean(stats["entropy"]) * count,
        "moe_expert_load": stats["load"].astype(jnp.float32),  # [MoE layers, E]
        "moe_dropped": jnp.sum(stats["dropped"]).astype(jnp.float32),
    }


def step_metrics(metrics, count):
    """Scalar router metrics of a step from the summed :func:`loss_metrics`: the balance and
    z-losses, router entropy, the dropped share of assignments and each expert's share of
    them (``moe_load_<i>``, over all MoE layers; ``1 / E`` each when balanced)."""
    load = metrics["moe_expert_load"].sum(0)
    share = load / jnp.maximum(load.sum(), 1.0)
    denom = jnp.maximum(count, 1e-9)
    return {
        "moe_balance_loss": metrics["moe_balance_loss"] / denom,
        "moe_z_loss": metrics["moe_z_loss"] / denom,
        "moe_router_entropy": metrics["moe_entropy"] / denom,
        "moe_dropped_fraction": metrics["moe_dropped"]
        / jnp.maximum(metrics["moe_expert_load"].sum(), 1.0),
        **{f"moe_load_{i}": share[i] for i in range(share.shape[0])},
    }


def _is_router_bias(path) -> bool:
    return getattr(path[-1], "key", None) == "router_bias"


def has_router_bias(tree) -> bool:
    """Whether ``tree`` holds a router bias (a model built with ``aux_free_bias_rate > 0``)."""
    return any(_is_router_bias(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree))


def move_router_bias(old, new, load, rate: float):
    """``new`` with every ``router_bias`` leaf set to ``old + γ · sign(mean load − load)``: the
    auxiliary-loss-free bias step (DeepSeek-V3, Wang et al. 2024) from the step's expert loads
    ``load [MoE layers, E]``, wherever the model sits in the tree (a reward model's ``trunk``).

    The bias ignores whatever the optimiser did to it, so it stays outside the gradient and the
    optimiser (its gradient is zero: it only moves a top-k)."""
    step = rate * jnp.sign(load.mean(-1, keepdims=True) - load)

    def move(path, o, n):
        return (o + step).astype(o.dtype) if _is_router_bias(path) else n

    return jax.tree_util.tree_map_with_path(move, old, new)
