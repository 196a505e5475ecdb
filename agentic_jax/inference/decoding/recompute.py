"""Sampling by recomputing the whole prefix at every step: no cache, the simplest exact decoder.

Each new token costs a full forward pass over the fixed-size buffer, O(T^2) work in total.  It is
the baseline a KV-cache decoder is checked and benchmarked against.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from agentic_jax.models import TransformerConfig, forward


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens"))
def generate_recompute(
    params, config: TransformerConfig, prompt, key, *, max_new_tokens: int, temperature: float = 1.0
):
    """Extends ``prompt[B, P]`` by ``max_new_tokens`` sampled tokens; returns ``[B, P + new]``.

    ``temperature == 0`` is greedy decoding.  Rows share the prompt length (no padding).
    """
    b, p = prompt.shape
    total = p + max_new_tokens
    buffer = jnp.zeros((b, total), prompt.dtype).at[:, :p].set(prompt)

    def body(i, carry):
        tokens, key = carry
        key, sub = jax.random.split(key)
        logits = forward(params, config, tokens)[:, i - 1]
        greedy = jnp.argmax(logits, axis=-1)
        sampled = jax.random.categorical(sub, logits / jnp.maximum(temperature, 1e-6), axis=-1)
        nxt = jnp.where(temperature > 0, sampled, greedy).astype(tokens.dtype)
        return tokens.at[:, i].set(nxt), key

    tokens, _ = jax.lax.fori_loop(p, total, body, (buffer, key))
    return tokens
