"""Attention sinks with a StreamingLLM cache (Xiao et al. 2023, arXiv:2309.17453).

A decoder whose cache only keeps the last ``W`` tokens fails as soon as the first tokens are
evicted: softmax attention parks its excess mass on the first few tokens (the *attention
sinks*), whatever they say.  StreamingLLM keeps those ``S`` sink tokens for good plus a rolling
window of the last ``W``, so memory and per-token cost stay ``O(S + W)`` for any length.

The cache is an ordinary :class:`~agentic_jax.inference.decoding.kv_cache.KVCache` (or MLA's
``LatentKVCache``) of ``S + W`` slots used as a ring: position ``p < S`` lives in slot ``p``,
position ``p >= S`` in slot ``S + (p - S) mod W``.  Which position a slot holds is a function
of how many tokens ``n`` the row has written (:meth:`StreamingCache.slot_positions`), so the
cache stores no positions and every generic cache operation (``reorder_rows`` for ``fork``, the
latent cache) applies unchanged.  Query position ``q`` sees key position ``k`` when the model's
own mask allows it (``k <= q``, and ``q - k < w`` in a layer windowed by ``w``) *and* the key is
still resident, ``k < S or q - k < W``.  The cache policy only ever removes keys, so with
``S + W`` at least the sequence length this is plain decoding.

Positions: keys are cached after RoPE at their absolute positions and queries rotate by theirs.
The paper instead re-numbers positions within the cache (sinks ``0..S-1``, the window
``S..S+W-1``), which needs keys cached *before* rotation and re-rotated at every step; here the
distance between a query and the window stays below ``W`` (in distribution), but its distance to
the sinks is the absolute position, which exceeds anything seen in training once generation
passes the model's context (``max_seq_len``).  Nothing stops that: ``generate`` never enforces
``max_seq_len`` (callers that need it check it), and RoPE has a table for every position, so
generation runs on, with the sinks' part of attention out of distribution past ``max_seq_len``
(and float32 angles exact only below ``2^24`` positions).  Under ``dynamic`` RoPE scaling the
base grows with the position past ``max_seq_len``, so cached keys keep the base of the step that
wrote them while the query uses the current one, as in plain cached decoding.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from agentic_jax.inference.decoding.kv_cache import (
    KVCache,
    LatentKVCache,
    _keys_values,
    _write,
    masked_attention,
)
from agentic_jax.models import TransformerConfig
from agentic_jax.models.transformer import hidden_states, logits_from_hidden


@dataclasses.dataclass(frozen=True)
class StreamingCache:
    """``sink_tokens`` (S) first tokens kept for good plus a ``window`` (W) of the latest ones.

    A decoding choice, not a property of the model, hence an argument of ``generate`` rather
    than a ``TransformerConfig`` field.  ``sink_tokens=0`` is the plain rolling window the paper
    shows failing (and, on a model whose every layer is windowed by at most ``W``, Mistral's
    exact rolling-buffer cache).  Frozen and hashable: a static ``jit`` argument.
    """

    sink_tokens: int
    window: int

    def __post_init__(self):
        for name, least in (("sink_tokens", 0), ("window", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"StreamingCache.{name} must be an int >= {least}, got {value!r}")

    @property
    def slots(self) -> int:
        """The cache's length: ``S + W``."""
        return self.sink_tokens + self.window

    def slot(self, positions):
        """The slot of each position: ``p`` for a sink, ``S + (p - S) mod W`` after."""
        s = self.sink_tokens
        return jnp.where(positions < s, positions, s + (positions - s) % self.window)

    def slot_positions(self, lengths):
        """``[B, S + W]``: the position each slot holds once row ``b`` has written positions
        ``[0, lengths[b])`` one after another (-1: never written).

        Ring slot ``S + r`` last took the largest ``p < n`` with ``p = S + r (mod W)``.
        """
        s, w = self.sink_tokens, self.window
        n = lengths[:, None]
        j = jnp.arange(self.slots)[None, :]
        latest = j + w * (jnp.maximum(n - 1 - j, 0) // w)
        held = jnp.where(j < s, j, latest)
        return jnp.where(j < n, held, -1)

    def resident(self, q_pos, k_pos):
        """Whether the cache still holds key position ``k_pos`` when position ``q_pos`` queries."""
        return (k_pos < self.sink_tokens) | (q_pos - k_pos < self.window)


def _run_block(
    params,
    config: TransformerConfig,
    policy: StreamingCache,
    cache: KVCache | LatentKVCache,
    tokens,
    positions,
    real,
    lengths,
):
    """Runs ``tokens[B, T]`` at ``positions`` (``real``: not padding) after the ``lengths[B]``
    tokens already cached; returns ``(hidden[B, T, D], cache)``.

    Each query attends over the cache followed by the block itself, so block tokens see keys
    that a later block token evicts (writing first would lose them when ``T > 1``); then only
    the tokens still resident after the block are written, which leaves every slot exactly as
    feeding the tokens one at a time would and keeps the scatter's slots distinct.  Dense masked
    attention, ``O(T (S + W + T))``: the kernels have no sink mask.
    """
    if cache.max_len != policy.slots:
        raise ValueError(
            f"a StreamingCache with sink_tokens + window = {policy.slots} needs a cache of that "
            f"many slots; got {cache.max_len}"
        )
    block = jnp.where(real, positions, -1)
    k_pos = jnp.concatenate([policy.slot_positions(lengths), block], axis=1)[:, None, :]
    q_pos = positions[:, :, None]
    seen = (k_pos >= 0) & (k_pos <= q_pos) & policy.resident(q_pos, k_pos)
    masks = {
        w: seen if w is None else seen & (q_pos - k_pos < w) for w in set(config.layer_windows)
    }
    end = (lengths + real.sum(axis=1))[:, None]
    kept = real & ((positions < policy.sink_tokens) | (positions >= end - policy.window))
    slots = jnp.where(kept, policy.slot(positions), policy.slots)  # out of range: dropped

    def attend(q, k, v, layer_cache, window):
        keys, values = _keys_values(layer_cache)
        keys = jnp.concatenate([keys, k.astype(keys.dtype)], axis=1)
        values = jnp.concatenate([values, v.astype(values.dtype)], axis=1)
        o = masked_attention(q, keys, values, masks[window], config.attn_logit_softcap)
        return o, _write(layer_cache, slots, k, v)

    h, layer_state = hidden_states(
        params, config, tokens, positions=positions, attend=attend, layer_state=tuple(cache)
    )
    return h, type(cache)(*layer_state)


def streaming_prefill(
    params, config: TransformerConfig, cache, prompt, start, end, *, policy: StreamingCache
):
    """:func:`kv_cache.prefill` for a streaming cache: ``prompt[B, P]`` (row ``b``'s tokens in
    ``[start[b], end[b])``) into an empty cache of ``policy.slots`` slots, each prompt token
    attending as it would have decoded, so a prompt longer than the cache is fine."""
    idx = jnp.arange(prompt.shape[1])[None, :]
    real = (idx >= start[:, None]) & (idx < end[:, None])
    positions = jnp.maximum(idx - start[:, None], 0)
    return _run_block(params, config, policy, cache, prompt, positions, real, jnp.zeros_like(start))


def streaming_extend_logits(
    params, config: TransformerConfig, cache, tokens, start, write, *, policy: StreamingCache
):
    """:func:`kv_cache.extend_logits` for a streaming cache: ``tokens[B, T]`` at positions
    ``write - start + [0, T)`` (``write - start`` tokens already written, as ``generate``
    counts them); returns ``(logits[B, T, V], hidden[B, T, D], cache)``."""
    lengths = write - start
    positions = lengths[:, None] + jnp.arange(tokens.shape[1])[None, :]
    h, cache = _run_block(
        params, config, policy, cache, tokens, positions, jnp.ones(tokens.shape, bool), lengths
    )
    return logits_from_hidden(params, config, h), h, cache
