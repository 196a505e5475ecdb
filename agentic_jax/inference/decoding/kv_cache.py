"""A contiguous per-sequence KV cache and the two ways of running the model against it.

The cache holds keys and values ``[L, B, S, K, H]`` (layers, batch, slots, kv heads, head dim) —
grouped-query sized, so it is ``n_heads / n_kv_heads`` times smaller than the query side.  A
multi-head latent attention model caches instead one array ``[L, B, S, 1, r + d_rope]``: each
token's latent and its shared rope key, which are the key and the value of the absorbed
attention (:class:`LatentKVCache`; ``kv_lora_rank + qk_rope_head_dim`` elements per token and
layer against GQA's ``2 n_kv_heads head_dim``).  Row
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
from pallas_kernels.reference import soft_cap as cap_logits
from sharding import with_logical_constraint

CACHE_AXES = ("layers", "cache_batch", "cache_length", "cache_kv_heads", "head_dim")
# MLA's one latent "kv head" is never split over devices; the latent width stays whole.
LATENT_CACHE_AXES = ("layers", "cache_batch", "cache_length", None, "kv_lora")


class KVCache(NamedTuple):
    k: jax.Array  # [L, B, S, K, H]
    v: jax.Array  # [L, B, S, K, H]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


class LatentKVCache(NamedTuple):
    """Multi-head latent attention's cache: per token the normed latent and the rope key."""

    kv: jax.Array  # [L, B, S, 1, kv_lora_rank + qk_rope_head_dim]

    @property
    def max_len(self) -> int:
        return self.kv.shape[2]


def cache_logical_axes(config: TransformerConfig) -> KVCache | LatentKVCache:
    """Logical axes of each cache array (for ``sharding.logical_to_sharding``)."""
    if config.mla:
        return LatentKVCache(LATENT_CACHE_AXES)
    return KVCache(CACHE_AXES, CACHE_AXES)


def init_cache(config: TransformerConfig, batch: int, max_len: int) -> KVCache | LatentKVCache:
    """A zeroed cache of ``max_len`` slots per row in the compute dtype, laid out by logical axes."""
    if config.mla:
        shape = (config.n_layers, batch, max_len, 1, config.kv_cache_width)
    else:
        shape = (config.n_layers, batch, max_len, config.n_kv_heads, config.head_dim)
    axes = cache_logical_axes(config)
    zeros = jnp.zeros(shape, config.compute_dtype)
    return type(axes)(*(with_logical_constraint(zeros, a) for a in axes))


def reorder_rows(cache, rows):
    """The cache with batch rows gathered by ``rows[B']`` (beam reordering, forking a prompt)."""
    return type(cache)(*(jnp.take(a, rows, axis=1) for a in cache))


def move_slots(cache, src, dst):
    """Copies each row's slots ``src[B, n]`` to slots ``dst[B, n]`` in every layer (compaction)."""
    rows = jnp.arange(src.shape[0])[:, None]

    def move(a):
        return a.at[:, rows, dst].set(a[:, rows, src], mode="drop")

    return type(cache)(*(move(a) for a in cache))


def masked_attention(q, k, v, mask, soft_cap=None):
    """``softmax(cap(q k^T / sqrt(H)) + mask) v`` for ``q[B,T,N,H]``, ``k/v[B,S,K,H]``,
    ``mask[B,T,S]``, with the optional logit soft-cap ``cap(x) = c tanh(x / c)``.

    Grouped-query attention: query heads ``g * K .. (g + 1) * K - 1`` share kv head ``g``.
    """
    b, t, n, h = q.shape
    kh = k.shape[2]
    qg = q.reshape(b, t, kh, n // kh, h)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = cap_logits(scores * h**-0.5, soft_cap)
    scores = jnp.where(mask[:, None, None], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(b, t, n, h).astype(q.dtype)


def _write(layer_cache, slots, k, v):
    """This layer's cache with the new keys and values at ``slots[B, T]``; a latent cache's one
    array takes ``k`` (the absorbed attention's key, which is its value too)."""
    rows = jnp.arange(k.shape[0])[:, None]
    axes = CACHE_AXES[1:] if len(layer_cache) == 2 else LATENT_CACHE_AXES[1:]
    return tuple(
        with_logical_constraint(c.at[rows, slots].set(x.astype(c.dtype), mode="drop"), axes)
        for c, x in zip(layer_cache, (k, v))
    )


def _keys_values(layer_cache):
    """``(keys, values)`` of a layer's cache: a latent cache's one array is both."""
    return layer_cache[0], layer_cache[-1]


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

    def attend(q, k, v, layer_cache, window):
        o = attention(
            q,
            k,
            v,
            causal=True,
            segment_ids=(segments, segments),
            sliding_window=window,
            logits_soft_cap=config.attn_logit_softcap,
            implementation=config.attention_impl,
            chunk_size=config.attention_chunk_size,
        )
        return o, _write(layer_cache, slots, k, v)

    h, layer_state = hidden_states(
        params, config, prompt, positions=positions, attend=attend, layer_state=tuple(cache)
    )
    return h, type(cache)(*layer_state)


class Tree(NamedTuple):
    """The shape of a block of new tokens: ``ancestors[T, T]`` (t sees u; reflexive), or
    ``[B, T, T]`` for a tree of its own per row, and ``depth[T]``."""

    ancestors: jax.Array
    depth: jax.Array


def chain(t: int) -> Tree:
    """A causal block: token ``t`` sees tokens ``0..t``."""
    return Tree(jnp.tril(jnp.ones((t, t), bool)), jnp.arange(t))


def extend_mask(window: int | None, max_len: int, start, write, tree: Tree):
    """``[B, T, S]`` visibility of cache slots for a block of new tokens at ``write + [0, T)``
    in a layer attending over ``window`` positions (None: all)."""
    t = tree.depth.shape[0]
    j = jnp.arange(max_len)[None, None, :]
    q_pos = (write - start)[:, None, None] + tree.depth[None, :, None]
    cached = (j >= start[:, None, None]) & (j < write[:, None, None])
    offset = j - write[:, None, None]
    in_block = (offset >= 0) & (offset < t)
    u = jnp.clip(offset, 0, t - 1)
    ancestors = tree.ancestors if tree.ancestors.ndim == 3 else tree.ancestors[None]
    block = in_block & jnp.take_along_axis(
        jnp.broadcast_to(ancestors, (start.shape[0], t, t)),
        jnp.broadcast_to(u, (start.shape[0], t, max_len)),
        axis=2,
    )
    if window is not None:
        k_pos = jnp.where(
            in_block, (write - start)[:, None, None] + tree.depth[u], j - start[:, None, None]
        )
        return (cached | block) & (q_pos - k_pos < window)
    return cached | block


def cached_attend(config: TransformerConfig, cache, start, write, tree: Tree):
    """``(attend, positions[B, T])`` for a block of new tokens shaped like ``tree`` at slots
    ``write + [0, T)``: the ``attend`` hook of ``models.transformer`` that writes their keys and
    values into ``cache`` and attends over what each may see (:func:`extend_mask`)."""
    t = tree.depth.shape[0]
    slots = write[:, None] + jnp.arange(t)[None, :]
    positions = (write - start)[:, None] + tree.depth[None, :]
    masks = {
        w: extend_mask(w, cache.max_len, start, write, tree) for w in set(config.layer_windows)
    }

    def attend(q, k, v, layer_cache, window):
        layer_cache = _write(layer_cache, slots, k, v)
        keys, values = _keys_values(layer_cache)
        o = masked_attention(q, keys, values, masks[window], config.attn_logit_softcap)
        return o, layer_cache

    return attend, positions


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
    attend, positions = cached_attend(config, cache, start, write, tree)
    h, layer_state = hidden_states(
        params, config, tokens, positions=positions, attend=attend, layer_state=tuple(cache)
    )
    return h, type(cache)(*layer_state)


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
