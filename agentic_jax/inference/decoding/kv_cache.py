"""A contiguous per-sequence KV cache and the two ways of running the model against it.

The cache holds keys and values ``[L, B, S, K, H]`` (layers, batch, slots, kv heads, head dim) —
grouped-query sized, so it is ``n_heads / n_kv_heads`` times smaller than the query side.  Row
``b`` keeps its tokens in the slots ``[start[b], write[b])``; a token's RoPE position is its slot
minus ``start[b]``.  That one convention covers both padded layouts:

* left-padded prompts ``[B, P]``: ``start = P - length``, ``write = P`` (every row writes the same
  slot at each step);
* right-padded prompts: ``start = 0``, ``write = length`` (each row writes its own slot, first
  over its padding).

Slots at or after ``write[b]`` may hold stale keys (padding, rejected drafts, unchosen candidates):
masks never let a query see them, so rolling back is just lowering ``write``.

* :func:`prefill` runs the prompts in one pass with the model's own attention implementation
  (padding masked by segment ids) and writes slots ``[0, P)``.
* :func:`extend` runs ``T`` new tokens per row at slots ``write + [0, T)`` against everything
  cached.  By default the block is causal; a ``tree`` (ancestor matrix and depths) instead lets each
  token see only its ancestors, which verifies several draft branches in one pass (tree attention,
  SpecInfer, Miao et al. 2024) or scores sibling candidates side by side (contrastive search).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.models import TransformerConfig
from agentic_jax.models.attention import attention
from agentic_jax.models.transformer import hidden_states, logits_from_hidden
from pallas_kernels.masks import MASK_VALUE
from sharding import with_logical_constraint

CACHE_AXES = ("layers", "cache_batch", "cache_length", "cache_kv_heads", "head_dim")
_LAYER_AXES = CACHE_AXES[1:]


class KVCache(NamedTuple):
    k: jax.Array  # [L, B, S, K, H]
    v: jax.Array  # [L, B, S, K, H]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


def init_cache(config: TransformerConfig, batch: int, max_len: int) -> KVCache:
    """A zeroed cache of ``max_len`` slots per row in the compute dtype, laid out by logical axes."""
    shape = (config.n_layers, batch, max_len, config.n_kv_heads, config.head_dim)
    zeros = with_logical_constraint(jnp.zeros(shape, config.compute_dtype), CACHE_AXES)
    return KVCache(zeros, zeros)


def cache_logical_axes() -> KVCache:
    """Logical axes of each cache array (for ``sharding.logical_to_sharding``)."""
    return KVCache(CACHE_AXES, CACHE_AXES)


def reorder_rows(cache: KVCache, rows) -> KVCache:
    """The cache with batch rows gathered by ``rows[B']`` (beam reordering, forking a prompt)."""
    return KVCache(*(jnp.take(a, rows, axis=1) for a in cache))


def move_slots(cache: KVCache, src, dst) -> KVCache:
    """Copies each row's slots ``src[B, n]`` to slots ``dst[B, n]`` in every layer (compaction)."""
    rows = jnp.arange(src.shape[0])[:, None]

    def move(a):
        return a.at[:, rows, dst].set(a[:, rows, src], mode="drop")

    return KVCache(*(move(a) for a in cache))


def masked_attention(q, k, v, mask):
    """``softmax(q k^T / sqrt(H) + mask) v`` for ``q[B,T,N,H]``, ``k/v[B,S,K,H]``, ``mask[B,T,S]``.

    Grouped-query attention: query heads ``g * K .. (g + 1) * K - 1`` share kv head ``g``.
    """
    b, t, n, h = q.shape
    kh = k.shape[2]
    qg = q.reshape(b, t, kh, n // kh, h)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores * h**-0.5, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(b, t, n, h).astype(q.dtype)


def _write(layer_cache, slots, k, v):
    rows = jnp.arange(k.shape[0])[:, None]
    k_cache = layer_cache[0].at[rows, slots].set(k.astype(layer_cache[0].dtype), mode="drop")
    v_cache = layer_cache[1].at[rows, slots].set(v.astype(layer_cache[1].dtype), mode="drop")
    return (
        with_logical_constraint(k_cache, _LAYER_AXES),
        with_logical_constraint(v_cache, _LAYER_AXES),
    )


def prefill(params, config: TransformerConfig, cache: KVCache, prompt, start, end):
    """Runs ``prompt[B, P]`` (row ``b``'s tokens in ``[start[b], end[b])``) into slots ``[0, P)``.

    Returns ``(hidden[B, P, D], cache)``; padding positions hold junk that nothing attends to.
    """
    p = prompt.shape[1]
    idx = jnp.arange(p)[None, :]
    real = (idx >= start[:, None]) & (idx < end[:, None])
    segments = real.astype(jnp.int32)
    positions = jnp.maximum(idx - start[:, None], 0)
    slots = jnp.broadcast_to(idx, prompt.shape)

    def attend(q, k, v, layer_cache):
        o = attention(
            q,
            k,
            v,
            causal=True,
            segment_ids=(segments, segments),
            sliding_window=config.sliding_window,
            implementation=config.attention_impl,
            chunk_size=config.attention_chunk_size,
        )
        return o, _write(layer_cache, slots, k, v)

    h, cache = hidden_states(
        params, config, prompt, positions=positions, attend=attend, layer_state=cache
    )
    return h, KVCache(*cache)


class Tree(NamedTuple):
    """The shape of a block of new tokens: ``ancestors[T, T]`` (t sees u; reflexive) and ``depth[T]``."""

    ancestors: jax.Array
    depth: jax.Array


def chain(t: int) -> Tree:
    """A causal block: token ``t`` sees tokens ``0..t``."""
    return Tree(jnp.tril(jnp.ones((t, t), bool)), jnp.arange(t))


def extend_mask(config: TransformerConfig, max_len: int, start, write, tree: Tree):
    """``[B, T, S]`` visibility of cache slots for a block of new tokens at ``write + [0, T)``."""
    t = tree.depth.shape[0]
    j = jnp.arange(max_len)[None, None, :]
    q_pos = (write - start)[:, None, None] + tree.depth[None, :, None]
    cached = (j >= start[:, None, None]) & (j < write[:, None, None])
    offset = j - write[:, None, None]
    in_block = (offset >= 0) & (offset < t)
    u = jnp.clip(offset, 0, t - 1)
    block = in_block & jnp.take_along_axis(
        jnp.broadcast_to(tree.ancestors[None], (start.shape[0], t, t)),
        jnp.broadcast_to(u, (start.shape[0], t, max_len)),
        axis=2,
    )
    if config.sliding_window is not None:
        k_pos = jnp.where(
            in_block, (write - start)[:, None, None] + tree.depth[u], j - start[:, None, None]
        )
        return (cached | block) & (q_pos - k_pos < config.sliding_window)
    return cached | block


def extend(
    params,
    config: TransformerConfig,
    cache: KVCache,
    tokens,
    start,
    write,
    tree: Tree | None = None,
):
    """Runs ``tokens[B, T]`` at slots ``write + [0, T)`` against the cache.

    Returns ``(hidden[B, T, D], cache)``; the caller advances ``write`` by what it keeps.
    """
    tree = chain(tokens.shape[1]) if tree is None else tree
    slots = write[:, None] + jnp.arange(tokens.shape[1])[None, :]
    positions = (write - start)[:, None] + tree.depth[None, :]
    mask = extend_mask(config, cache.max_len, start, write, tree)

    def attend(q, k, v, layer_cache):
        k_cache, v_cache = _write(layer_cache, slots, k, v)
        return masked_attention(q, k_cache, v_cache, mask), (k_cache, v_cache)

    h, cache = hidden_states(
        params, config, tokens, positions=positions, attend=attend, layer_state=cache
    )
    return h, KVCache(*cache)


def extend_logits(
    params,
    config: TransformerConfig,
    cache: KVCache,
    tokens,
    start,
    write,
    tree: Tree | None = None,
):
    """:func:`extend` followed by the LM head: ``(logits[B, T, V], hidden[B, T, D], cache)``."""
    h, cache = extend(params, config, cache, tokens, start, write, tree)
    return logits_from_hidden(params, config, h), h, cache
