"""Monte Carlo tree search with ``mctx``, and keeping the chosen subtree between moves.

``mctx`` runs batched MCTS inside ``jit``: ``muzero_policy`` (PUCT selection, Schrittwieser et al.
2020, arXiv:1911.08265) and ``gumbel_muzero_policy`` (Gumbel top-k and sequential halving at
the root, Danihelka et al. 2022, ICLR).  Each search starts from a fresh root.  An agent that
acts, then searches again from the state it moved to, would throw away everything the previous
search learnt about that state; :func:`reuse_subtree` makes the chosen child's subtree the new
root's tree (visit counts, values, priors and embeddings kept, indices renumbered) and
:func:`continue_search` runs more PUCT simulations on it, growing the tree past its old size.
Every search spends exactly ``num_simulations`` calls of ``recurrent_fn``.

Reuse is for PUCT search: Gumbel MuZero's sequential halving schedules root visits from zero,
so :func:`search` with ``policy="gumbel"`` always starts fresh.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import mctx
import numpy as np
from mctx._src import search as mctx_search  # the simulate / expand / backward steps

POLICIES = ("muzero", "gumbel")


def search(
    params,
    key,
    root: mctx.RootFnOutput,
    recurrent_fn: mctx.RecurrentFn,
    *,
    num_simulations: int,
    policy: str = "muzero",
    max_depth: int | None = None,
    temperature: float = 1.0,
    gumbel_scale: float = 1.0,
    max_num_considered_actions: int = 16,
) -> mctx.PolicyOutput:
    """A fresh search from ``root`` with one of the ``mctx`` policies (jit-able).

    ``temperature`` draws PUCT's move from its visit counts (0: the most visited);
    ``gumbel_scale`` 0 makes Gumbel MuZero's move deterministic.  ``max_depth`` (edges from the
    root) should be the horizon when the task has one: ``mctx`` knows no terminal states, and a
    simulation that passes a terminal node (discount 0) spends itself on nodes below it.
    """
    if num_simulations < 1:
        raise ValueError(f"num_simulations must be >= 1, got {num_simulations}")
    options = {
        "muzero": (mctx.muzero_policy, {"temperature": temperature}),
        "gumbel": (
            mctx.gumbel_muzero_policy,
            {
                "gumbel_scale": gumbel_scale,
                "max_num_considered_actions": max_num_considered_actions,
            },
        ),
    }
    if policy in options:
        run, extra = options[policy]
        return run(params, key, root, recurrent_fn, num_simulations, max_depth=max_depth, **extra)
    raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")


def tree_size(tree: mctx.Tree) -> np.ndarray:
    """``[B]``: nodes the search has created (the root included)."""
    return np.asarray((tree.node_visits > 0).sum(axis=1))


def reuse_subtree(tree: mctx.Tree, action) -> mctx.Tree:
    """The subtree under the root's child ``action[b]``, renumbered so that child is node 0.

    Host-side (between moves).  Nodes outside the subtree are cleared; the array size is kept,
    so :func:`continue_search` can grow the tree back.  A child the search never expanded gives
    an empty tree: search it afresh with :func:`search`.
    """
    t = jax.tree.map(np.asarray, tree)
    action = np.broadcast_to(np.asarray(action), t.node_visits.shape[:1])
    batch = t.node_visits.shape[0]
    unvisited, none = mctx.Tree.UNVISITED, mctx.Tree.NO_PARENT
    per_node = ("node_visits", "raw_values", "node_values", "parents", "action_from_parent")
    per_child = (
        "children_index",
        "children_prior_logits",
        "children_values",
        "children_visits",
        "children_rewards",
        "children_discounts",
    )
    out = {name: np.zeros_like(getattr(t, name)) for name in per_node + per_child}
    out["parents"][:] = none
    out["action_from_parent"][:] = none
    out["children_index"][:] = unvisited
    embeddings = jax.tree.map(np.zeros_like, t.embeddings)
    for b in range(batch):
        start = int(t.children_index[b, mctx.Tree.ROOT_INDEX, action[b]])
        if start == unvisited:
            continue
        order = [start]
        for old in order:  # breadth first: a node's children get indices after it
            for child in t.children_index[b, old]:
                if child != unvisited:
                    order.append(int(child))
        old_ids = np.asarray(order)
        for name in per_node + per_child:
            out[name][b, : len(order)] = getattr(t, name)[b, old_ids]
        renumber = np.full(t.node_visits.shape[1], unvisited, np.int32)
        renumber[old_ids] = np.arange(len(order))
        kids = out["children_index"][b, : len(order)]
        kids[...] = np.where(kids == unvisited, unvisited, renumber[np.maximum(kids, 0)])
        parents = out["parents"][b, : len(order)]
        parents[...] = np.where(parents == none, none, renumber[np.maximum(parents, 0)])
        out["parents"][b, 0] = out["action_from_parent"][b, 0] = none
        for leaf_out, leaf_in in zip(jax.tree.leaves(embeddings), jax.tree.leaves(t.embeddings)):
            leaf_out[b, : len(order)] = leaf_in[b, old_ids]
    return tree.replace(
        **{k: jnp.asarray(v) for k, v in out.items()},
        embeddings=jax.tree.map(jnp.asarray, embeddings),
        root_invalid_actions=jnp.zeros_like(tree.root_invalid_actions),
    )


def _grown(tree: mctx.Tree, extra: int) -> mctx.Tree:
    """``tree`` with room for ``extra`` more nodes."""

    def pad(x, fill):
        widths = [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)
        return jnp.pad(x, widths, constant_values=fill)

    unvisited, none = mctx.Tree.UNVISITED, mctx.Tree.NO_PARENT
    return tree.replace(
        node_visits=pad(tree.node_visits, 0),
        raw_values=pad(tree.raw_values, 0),
        node_values=pad(tree.node_values, 0),
        parents=pad(tree.parents, none),
        action_from_parent=pad(tree.action_from_parent, none),
        children_index=pad(tree.children_index, unvisited),
        children_prior_logits=pad(tree.children_prior_logits, 0),
        children_values=pad(tree.children_values, 0),
        children_visits=pad(tree.children_visits, 0),
        children_rewards=pad(tree.children_rewards, 0),
        children_discounts=pad(tree.children_discounts, 0),
        embeddings=jax.tree.map(lambda x: pad(x, 0), tree.embeddings),
    )


@functools.partial(jax.jit, static_argnames=("recurrent_fn", "num_simulations", "max_depth"))
def _simulations(params, key, tree, first_free, recurrent_fn, num_simulations, max_depth):
    batch_range = jnp.arange(tree.node_visits.shape[0])

    def body(sim, carry):
        key, tree = carry
        key, simulate_key, expand_key = jax.random.split(key, 3)
        parent, action = mctx_search.simulate(
            jax.random.split(simulate_key, batch_range.size),
            tree,
            mctx.muzero_action_selection,
            max_depth,
        )
        child = tree.children_index[batch_range, parent, action]
        child = jnp.where(child == mctx.Tree.UNVISITED, first_free + sim, child)
        tree = mctx_search.expand(params, expand_key, tree, recurrent_fn, parent, action, child)
        return key, mctx_search.backward(tree, child)

    return jax.lax.fori_loop(0, num_simulations, body, (key, tree))[1]


def continue_search(
    params,
    key,
    tree: mctx.Tree,
    recurrent_fn: mctx.RecurrentFn,
    *,
    num_simulations: int,
    max_depth: int | None = None,
    temperature: float = 1.0,
) -> mctx.PolicyOutput:
    """``num_simulations`` more PUCT simulations on a (reused) ``tree``, and the action drawn
    from the root's visit counts as ``mctx.muzero_policy`` draws it."""
    if num_simulations < 1:
        raise ValueError(f"num_simulations must be >= 1, got {num_simulations}")
    if tree.node_visits.ndim != 2:
        raise ValueError(f"need a batched tree [B, N], got node_visits {tree.node_visits.shape}")
    if np.any(np.asarray(tree.node_visits[:, mctx.Tree.ROOT_INDEX]) == 0):
        raise ValueError("the tree has an empty root (the reused child was never expanded)")
    first_free = jnp.asarray(tree_size(tree), jnp.int32)
    tree = _grown(tree, num_simulations)
    tree = _simulations(
        params,
        key,
        tree,
        first_free,
        recurrent_fn,
        num_simulations,
        num_simulations + int(tree.node_visits.shape[1]) if max_depth is None else max_depth,
    )
    visits = tree.children_visits[:, mctx.Tree.ROOT_INDEX]
    weights = visits / jnp.maximum(visits.sum(-1, keepdims=True), 1)
    logits = jnp.where(
        visits > 0, jnp.log(jnp.maximum(visits, 1)) / max(temperature, 1e-6), -jnp.inf
    )
    action = jax.random.categorical(jax.random.fold_in(key, 1), logits)
    return mctx.PolicyOutput(action=action, action_weights=weights, search_tree=tree)
