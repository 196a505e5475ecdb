"""Branching draft trees: grown level by level from a drafter's top-k, verified in one pass.

**Shape** (:class:`TreeShape`): a root (the last emitted token) and ``depth`` levels of draft
nodes, stored depth-major: level ``d`` holds ``widths[d]`` nodes, each the child of a node of
level ``d - 1``.  The widths grow by ``branching`` per level (1, k, k², ...) until the node
``budget`` (draft nodes, root excluded) runs out, keeping one node for every later level.  Node
depths are therefore the same for every row, while who is whose parent is chosen per row.

**Growing** (:func:`grow_tree`; EAGLE-2's dynamic tree, Li et al. 2024): at each level every
frontier node proposes its ``branching`` most likely children under the drafter, and the
``widths[d]`` candidates of highest path log-probability (the sum of the drafter's
log-probabilities from the root) become the next level.  So a likely node gets several children
and an unlikely one none: the tree branches wherever the drafter is unsure, not only at the root.

**Verification** (:func:`verify_tree`): the target scores the root and every node in one pass
with a per-row tree attention mask (:func:`tree_ancestors`, ``kv_cache.Tree``).  Then, from the
root down, the children of the current node are tried in order with the multi-candidate
speculative sampling rule (SpecInfer, Miao et al. 2024; as EAGLE implements it for deterministic
drafts): a proposal ``x`` is a point mass, so it is accepted with probability ``p(x)``, and after
a rejection ``p`` becomes the residual ``norm(max(0, p - δ_x))``: ``p`` with ``x`` removed.  The
first accepted child becomes the current node (its own ``p`` from the target); when every child
is rejected the round ends with a token drawn from the residual, and after the last level with
one from the leaf's ``p``.  Siblings are distinct and chosen without the target's randomness,
so every emitted token is distributed exactly as the target's sampling distribution; greedy rows
(one-hot ``p``) accept exactly the target's argmax, which makes the output equal to greedy
decoding token for token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.inference.decoding.kv_cache import Tree


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """``depth`` levels of draft nodes, at most ``branching`` children per node, ``budget`` draft
    nodes in all (the root excluded)."""

    depth: int = 4
    branching: int = 2
    budget: int = 12

    def __post_init__(self):
        if self.depth < 1 or self.branching < 1:
            raise ValueError(
                f"TreeShape needs depth >= 1 and branching >= 1; got {self.depth}, {self.branching}"
            )
        if self.budget < self.depth:
            raise ValueError(
                f"TreeShape.budget={self.budget} cannot hold one node at each of "
                f"depth={self.depth} levels"
            )

    @property
    def widths(self) -> tuple[int, ...]:
        """Nodes per level: ``branching`` times the last, within what the budget leaves."""
        widths, left = [], self.budget
        for level in range(self.depth):
            width = min(
                (widths[-1] if widths else 1) * self.branching, left - (self.depth - level - 1)
            )
            widths.append(width)
            left -= width
        return tuple(widths)

    @property
    def nodes(self) -> int:
        """The root and every draft node."""
        return 1 + sum(self.widths)

    @property
    def levels(self) -> tuple[tuple[int, int], ...]:
        """``(first node, width)`` of each level; node 0 is the root."""
        starts = 1 + np.cumsum((0,) + self.widths[:-1])
        return tuple((int(s), w) for s, w in zip(starts, self.widths))

    @property
    def node_depth(self) -> np.ndarray:
        """``[nodes]`` depth of each node (the root's is 0)."""
        return np.repeat(np.arange(self.depth + 1), (1,) + self.widths).astype(np.int32)


class DraftTree(NamedTuple):
    """A drafted tree per row: the tokens and parents of nodes ``1..nodes - 1``."""

    tokens: jax.Array  # [B, nodes - 1]
    parents: jax.Array  # [B, nodes - 1] the parent's node index (0: the root)


def _top_children(cum, child_logp, width: int, branching: int):
    """The ``width`` best of each frontier node's ``branching`` best children by path log-prob:
    ``(frontier index, token, path log-prob)``, each ``[B, width]``."""
    b = cum.shape[0]
    k = min(branching, child_logp.shape[-1])
    logp, tokens = jax.lax.top_k(child_logp, k)  # [B, W, k]
    best, idx = jax.lax.top_k((cum[..., None] + logp).reshape(b, -1), width)
    return idx // k, jnp.take_along_axis(tokens.reshape(b, -1), idx, axis=1), best


def grow_tree(
    shape: TreeShape, root_logp, children: Callable | None = None, carry=None
) -> DraftTree:
    """Grows a tree level by level from the drafter's log-probabilities.

    ``root_logp[B, V]``: the root's children.  ``children(level, tree, carry)`` returns
    ``(logp, carry)``: ``logp[B, width, V]``, the log-probabilities of the children of level
    ``level``'s nodes (``level >= 1``), given the tree so far (levels ``<= level`` filled in,
    later nodes 0), and whatever the drafter threads from one level to the next.
    """
    b = root_logp.shape[0]
    size = shape.nodes - 1
    tree = DraftTree(jnp.zeros((b, size), jnp.int32), jnp.zeros((b, size), jnp.int32))
    cum, logp, frontier = jnp.zeros((b, 1)), root_logp[:, None], 0
    for level, (first, width) in enumerate(shape.levels):
        if level:
            logp, carry = children(level, tree, carry)
        parent, token, cum = _top_children(cum, logp, width, shape.branching)
        tree = DraftTree(
            tree.tokens.at[:, first - 1 : first - 1 + width].set(token.astype(jnp.int32)),
            tree.parents.at[:, first - 1 : first - 1 + width].set(
                frontier + parent.astype(jnp.int32)
            ),
        )
        frontier = first
    return tree


def tree_ancestors(shape: TreeShape, parents) -> jax.Array:
    """``[B, nodes, nodes]``: node t sees node u (u is t or one of its ancestors; the root is
    everyone's), from ``parents[B, nodes - 1]``."""
    b, t = parents.shape[0], shape.nodes
    eye = jnp.eye(t, dtype=bool)
    ancestors = jnp.broadcast_to(eye, (b, t, t))
    for first, width in shape.levels:
        nodes = slice(first, first + width)
        above = jnp.take_along_axis(
            ancestors, parents[:, nodes.start - 1 : nodes.stop - 1, None], 1
        )
        ancestors = ancestors.at[:, nodes].set(above | eye[nodes])
    return ancestors


def tree_mask(shape: TreeShape, parents) -> Tree:
    """The per-row ``kv_cache.Tree`` that scores the root and every node in one pass."""
    return Tree(tree_ancestors(shape, parents), jnp.asarray(shape.node_depth))


class TreeVerdict(NamedTuple):
    accepted: jax.Array  # [B] draft nodes accepted (along one path from the root)
    path: jax.Array  # [B, depth] node index at each depth (valid below ``accepted``)
    final: jax.Array  # [B] the correction or bonus token


def _pick(x, idx):
    """``x[b, idx[b]]`` along axis 1."""
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 1)), axis=1)[:, 0]


def verify_tree(shape: TreeShape, p, tree: DraftTree, key) -> TreeVerdict:
    """The multi-candidate rule of the module docstring on a drafted tree.

    ``p[B, nodes, V]``: the target's sampling distribution at the root and at every node;
    ``key``: ``[B]`` keys.  Rows are independent.
    """
    b = p.shape[0]
    keys = jax.vmap(lambda k: jax.random.split(k, 2))(key)
    u = jax.vmap(lambda k: jax.random.uniform(k, (shape.nodes,)))(keys[:, 0])
    rows = jnp.arange(b)
    current = jnp.zeros((b,), jnp.int32)
    running = jnp.ones((b,), bool)
    accepted = jnp.zeros((b,), jnp.int32)
    path = jnp.zeros((b, shape.depth), jnp.int32)
    p_cur = p[:, 0]
    for level, (first, width) in enumerate(shape.levels):
        taken = jnp.zeros((b,), bool)
        chosen = current
        for node in range(first, first + width):
            x = tree.tokens[:, node - 1]
            trying = running & ~taken & (tree.parents[:, node - 1] == current)
            accept = trying & (u[:, node] < p_cur[rows, x])
            residual = p_cur.at[rows, x].set(0.0)
            residual /= jnp.maximum(residual.sum(-1, keepdims=True), 1e-30)
            p_cur = jnp.where((trying & ~accept)[:, None], residual, p_cur)
            taken |= accept
            chosen = jnp.where(accept, node, chosen)
        accepted += taken
        path = path.at[:, level].set(chosen)
        p_cur = jnp.where(taken[:, None], _pick(p, chosen), p_cur)
        current = chosen
        running &= taken
    final = jax.vmap(jax.random.categorical)(keys[:, 1], jnp.log(p_cur)).astype(jnp.int32)
    return TreeVerdict(accepted, path, final)
