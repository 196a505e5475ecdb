"""The paged KV cache on the device and the model forward pass that reads and writes it.

K/V live in physical blocks ``[n_layers, num_blocks, block_size, K, H]`` (the layout of
``pallas_kernels.paged_attention``, Kwon et al. 2023); which blocks a sequence owns is the host's
business (``block_manager.py``).  A forward step gets, for each of its ``[B, T]`` tokens, the flat
slot ``block * block_size + offset`` its K/V goes to, plus each row's block table and length
after the step.  Through the transformer's ``attend`` hook, every layer first scatters the new K/V
into its pages, then attends:

* one token per row (decode): the paged decode-attention kernel (on TPU) or its jnp reference;
* several (prefill of a prompt, or of its uncached suffix): the row's pages are gathered into a
  contiguous context, rotated so its ``length`` valid keys come last; the queries are the row's
  last ``T`` positions, which is exactly the causal convention of :func:`models.attention`, and
  key segment ids hide the rotated-in padding.  Rows are left-padded, so the last query is the
  row's last token in both cases.

Padding tokens get an out-of-range slot and their writes are dropped.  A batch with StreamingLLM
rows (attention sinks plus a recent window) attends densely over the gathered pages with that
mask written out, for every ``T``.

A multi-head latent attention model pages one array instead of two (:class:`PagedLatentCache`,
``[n_layers, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]``): each token's latent
and rope key, the key and the value of the absorbed attention (multi-query, one kv head), so the
same kernels read it with the pages passed as both keys and values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.inference.decoding.kv_cache import masked_attention
from agentic_jax.models.attention import attention
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.transformer import hidden_states, logits_from_hidden
from pallas_kernels import paged_attention, paged_attention_reference
from pallas_kernels.backend import target_platform

DECODE_ATTENTION = {"pallas": paged_attention, "reference": paged_attention_reference}


def decode_attention_fn(name: str = "auto") -> Callable:
    """``pallas`` (the kernel; interpreted off TPU), ``reference`` (gather + dense attention), or
    ``auto``: the kernel where Mosaic compiles it (TPU), the reference elsewhere."""
    if name == "auto":
        name = "pallas" if target_platform() == "tpu" else "reference"
    if name not in DECODE_ATTENTION:
        raise ValueError(
            f"decode attention {name!r}; expected auto or one of {sorted(DECODE_ATTENTION)}"
        )
    return DECODE_ATTENTION[name]


class _Pages:
    """Sizes read off the first page array (shared by both cache layouts)."""

    __slots__ = ()

    @property
    def num_blocks(self) -> int:
        return self[0].shape[1]

    @property
    def block_size(self) -> int:
        return self[0].shape[2]


class _KeyValuePages(NamedTuple):
    k: jax.Array  # [n_layers, num_blocks, block_size, K, H]
    v: jax.Array


class _LatentPages(NamedTuple):
    kv: jax.Array  # [n_layers, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]


class PagedLatentCache(_Pages, _LatentPages):
    """Multi-head latent attention's pages: per token the latent and the rope key."""


class PagedKVCache(_Pages, _KeyValuePages):
    """Grouped-query attention's key and value pages."""

    @classmethod
    def create(cls, config: TransformerConfig, num_blocks: int, block_size: int):
        """The zeroed cache the config's attention needs: keys and values, or MLA's latents."""
        if config.mla:
            shape = (config.n_layers, num_blocks, block_size, 1, config.kv_cache_width)
            return PagedLatentCache(jnp.zeros(shape, config.compute_dtype))
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        return cls(jnp.zeros(shape, config.compute_dtype), jnp.zeros(shape, config.compute_dtype))


class PagedBatch(NamedTuple):
    """Where a step's tokens ``[B, T]`` sit and what they see."""

    positions: jax.Array  # int32 [B, T] absolute positions (anything on padding)
    slot_mapping: jax.Array  # int32 [B, T] flat K/V slot; >= num_blocks * block_size on padding
    block_tables: jax.Array  # int32 [B, max_blocks]
    lengths: jax.Array  # int32 [B] cached tokens after the step (0: an idle row)
    # StreamingLLM rows (``serving/engine.py``): key ``k`` stays visible to query ``q`` only while
    # ``k < sink_tokens`` or ``q - k < stream_window``; int32 [B] (0 and 2^30 on other rows).
    # None: no row streams, and decoding keeps the fast paths.
    sink_tokens: jax.Array | None = None
    stream_window: jax.Array | None = None


def copy_blocks(cache, src, dst):
    """Copy-on-write on the device: block ``dst[i]`` of every layer becomes a copy of ``src[i]``
    (pairs with ``dst`` out of range are skipped)."""
    return type(cache)(*(pages.at[:, dst].set(pages[:, src], mode="drop") for pages in cache))


def _write(pages, new, slot_mapping):
    """Scatters ``new[B, T, K, H]`` into ``pages[P, page, K, H]`` at flat slots, except padding."""
    flat = pages.reshape(-1, *pages.shape[2:])
    new = new.reshape(-1, *new.shape[2:]).astype(pages.dtype)
    flat = flat.at[slot_mapping.reshape(-1)].set(new, mode="drop")
    return flat.reshape(pages.shape)


def _right_aligned_context(pages, block_tables, lengths):
    """Each row's pages as contiguous ``[B, S, K, H]`` with its valid keys last, and their mask."""
    block_size = pages.shape[1]
    s = block_tables.shape[1] * block_size
    shift = (s - lengths)[:, None]
    logical = (jnp.arange(s)[None, :] - shift) % s
    blocks = jnp.take_along_axis(block_tables, logical // block_size, axis=1)
    context = pages.reshape(-1, *pages.shape[2:])[blocks * block_size + logical % block_size]
    return context, jnp.arange(s)[None, :] >= shift


def _streaming_attention(config: TransformerConfig, batch: PagedBatch, q, k_pages, v_pages, window):
    """Dense attention over each row's gathered pages with the StreamingLLM mask written out:
    key ``k`` is seen by query ``q`` iff ``k <= q``, ``k < sinks or q - k < W`` (the row's
    policy, as ``decoding.streaming``) and ``q - k < window`` in a windowed layer.  Positions
    the engine has evicted read whatever their table entry points at; the mask hides them."""
    k_ctx, valid = _right_aligned_context(k_pages, batch.block_tables, batch.lengths)
    v_ctx, _ = _right_aligned_context(v_pages, batch.block_tables, batch.lengths)
    s = k_ctx.shape[1]
    k_pos = (jnp.arange(s)[None, :] - s + batch.lengths[:, None])[:, None, :]
    q_pos = batch.positions[:, :, None]
    resident = (k_pos < batch.sink_tokens[:, None, None]) | (
        q_pos - k_pos < batch.stream_window[:, None, None]
    )
    seen = valid[:, None, :] & (k_pos <= q_pos) & resident
    if window is not None:
        seen &= q_pos - k_pos < window
    return masked_attention(q, k_ctx, v_ctx, seen, config.attn_logit_softcap)


def paged_attend(config: TransformerConfig, batch: PagedBatch, decode_attention: Callable):
    """The ``attend`` hook of :func:`models.transformer.hidden_states` over one layer's pages."""

    def attend(q, k, v, pages, window):
        pages = tuple(_write(p, x, batch.slot_mapping) for p, x in zip(pages, (k, v)))
        k_pages, v_pages = pages[0], pages[-1]  # a latent cache's one array is both
        if batch.sink_tokens is not None:
            o = _streaming_attention(config, batch, q, k_pages, v_pages, window)
        elif q.shape[1] == 1:
            o = decode_attention(
                q[:, 0],
                k_pages,
                v_pages,
                batch.block_tables,
                batch.lengths,
                sliding_window=window,
                logits_soft_cap=config.attn_logit_softcap,
            )[:, None]
        else:
            k_ctx, valid = _right_aligned_context(k_pages, batch.block_tables, batch.lengths)
            v_ctx, _ = _right_aligned_context(v_pages, batch.block_tables, batch.lengths)
            segments = (jnp.ones(q.shape[:2], jnp.int32), valid.astype(jnp.int32))
            o = attention(
                q,
                k_ctx,
                v_ctx,
                causal=True,
                segment_ids=segments,
                sliding_window=window,
                logits_soft_cap=config.attn_logit_softcap,
                implementation=config.attention_impl,
                chunk_size=config.attention_chunk_size,
            )
        return o, pages

    return attend


def paged_hidden(
    params,
    config: TransformerConfig,
    cache: PagedKVCache | PagedLatentCache,
    tokens,
    batch: PagedBatch,
    *,
    decode_attention: Callable = paged_attention_reference,
):
    """Runs ``tokens[B, T]`` through the model against the cache; returns their final-norm
    hidden states ``[B, T, D]`` (what draft heads read) and the cache with their K/V written."""
    h, pages = hidden_states(
        params,
        config,
        tokens,
        positions=batch.positions,
        attend=paged_attend(config, batch, decode_attention),
        layer_state=tuple(cache),
    )
    return h, type(cache)(*pages)


def paged_forward(
    params,
    config: TransformerConfig,
    cache: PagedKVCache | PagedLatentCache,
    tokens,
    batch: PagedBatch,
    *,
    decode_attention: Callable = paged_attention_reference,
):
    """:func:`paged_hidden`, returning the float32 logits ``[B, V]`` of each row's last token
    and the cache with the tokens' K/V written."""
    h, cache = paged_hidden(params, config, cache, tokens, batch, decode_attention=decode_attention)
    return logits_from_hidden(params, config, h[:, -1:])[:, 0], cache
