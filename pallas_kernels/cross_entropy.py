"""LM-head cross-entropy without materialising the [B, T, V] logits.

``loss[b, t] = logsumexp_v(h W)[v] - (h W)[label]`` is computed by a scan over vocabulary
chunks of W: each step forms one [B*T, C] logits chunk, folds it into a running
log-sum-exp (the online softmax of FlashAttention, applied to the vocabulary axis) and
picks out the label logit if the chunk holds it.  The custom VJP saves only the
log-sum-exp and recomputes each chunk's logits to form ``dlogits = softmax - onehot``,
from which it accumulates dH and emits the chunk's columns of dW (the idea behind
Liger-Kernel's fused linear cross-entropy and "Cut Your Losses", Wijmans et al. 2024).
Peak memory is O(B T C) instead of O(B T V) in both passes.

This is plain JAX rather than a Pallas kernel on purpose: the work is two large matmuls
per chunk, which XLA already runs at peak on every backend; the saving comes from the
chunking and the recomputing VJP, not from a custom inner loop.  The last chunk is
anchored at ``V - C`` when C does not divide V, and columns that an earlier chunk already
covered are masked out, so no padded copy of W is made.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax


def _chunk_starts(vocab: int, chunk: int) -> tuple[int, ...]:
    return tuple(min(c * chunk, vocab - chunk) for c in range(-(-vocab // chunk)))


def _chunk_logits(x, w, start, chunk: int, index):
    """f32 logits of columns [start, start + chunk) and which of them are new to this chunk."""
    w_c = jax.lax.dynamic_slice_in_dim(w, start, chunk, axis=1)
    logits = jnp.dot(x, w_c, preferred_element_type=jnp.float32)
    cols = start + jnp.arange(chunk)
    return w_c, logits, cols, cols >= index * chunk


def _forward(x, w, labels, chunk: int):
    n = x.shape[0]
    starts = jnp.asarray(_chunk_starts(w.shape[1], chunk))

    def step(carry, xs):
        m, l, picked = carry
        index, start = xs
        _, logits, cols, fresh = _chunk_logits(x, w, start, chunk, index)
        logits = jnp.where(fresh, logits, -jnp.inf)
        m_new = jnp.maximum(m, logits.max(axis=-1))
        l = l * jnp.exp(m - m_new) + jnp.exp(logits - m_new[:, None]).sum(axis=-1)
        hit = fresh & (cols[None, :] == labels[:, None])
        picked = picked + jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
        return (m_new, l, picked), None

    init = (jnp.full((n,), -jnp.inf), jnp.zeros((n,)), jnp.zeros((n,)))
    (m, l, picked), _ = jax.lax.scan(step, init, (jnp.arange(starts.size), starts))
    lse = m + jnp.log(l)
    return lse - picked, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _token_losses(x, w, labels, chunk: int):
    return _forward(x, w, labels, chunk)[0]


def _token_losses_fwd(x, w, labels, chunk):
    loss, lse = _forward(x, w, labels, chunk)
    return loss, (x, w, labels, lse)


def _token_losses_bwd(chunk, residuals, g):
    x, w, labels, lse = residuals
    starts = _chunk_starts(w.shape[1], chunk)

    def step(carry, xs):
        dx, dw = carry
        index, start = xs
        w_c, logits, cols, fresh = _chunk_logits(x, w, start, chunk, index)
        onehot = cols[None, :] == labels[:, None]
        dlogits = (jnp.exp(logits - lse[:, None]) - onehot) * g[:, None]
        dlogits = jnp.where(fresh, dlogits, 0.0)
        dx = dx + jnp.dot(dlogits.astype(w.dtype), w_c.T, preferred_element_type=jnp.float32)
        dw_c = jnp.dot(x.T, dlogits.astype(x.dtype), preferred_element_type=jnp.float32)
        # Written in place into the dW carry; columns an earlier chunk owns keep their value.
        owned = jax.lax.dynamic_slice_in_dim(dw, start, chunk, axis=1)
        dw_c = jnp.where(fresh, dw_c.astype(w.dtype), owned)
        return (dx, jax.lax.dynamic_update_slice_in_dim(dw, dw_c, start, axis=1)), None

    init = (jnp.zeros(x.shape, jnp.float32), jnp.zeros(w.shape, w.dtype))
    (dx, dw), _ = jax.lax.scan(step, init, (jnp.arange(len(starts)), jnp.asarray(starts)))
    return dx.astype(x.dtype), dw, None


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)


def fused_cross_entropy(hidden, w, labels, *, ignore_index: int = -100, vocab_chunk: int = 4096):
    """Per-token cross-entropy of ``hidden[B,T,D] @ w[D,V]`` against int ``labels[B,T]``.

    Returns f32 losses [B, T], zero (with zero gradient) where ``labels == ignore_index``;
    average them over the non-ignored tokens for the usual mean loss.  Differentiable in
    ``hidden`` and ``w``; logits are formed ``vocab_chunk`` columns at a time.
    """
    if hidden.ndim != 3 or w.ndim != 2 or hidden.shape[-1] != w.shape[0]:
        raise ValueError(f"expected hidden [B,T,D] and w [D,V]; got {hidden.shape}, {w.shape}")
    if labels.shape != hidden.shape[:2]:
        raise ValueError(f"labels {labels.shape} must be [B,T] = {hidden.shape[:2]}")
    if vocab_chunk <= 0:
        raise ValueError(f"vocab_chunk must be positive, got {vocab_chunk}")
    b, t, d = hidden.shape
    valid = labels != ignore_index
    safe_labels = jnp.where(valid, labels, 0).reshape(-1).astype(jnp.int32)
    losses = _token_losses(hidden.reshape(b * t, d), w, safe_labels, min(vocab_chunk, w.shape[1]))
    return jnp.where(valid, losses.reshape(b, t), 0.0)


def cross_entropy_reference(hidden, w, labels, *, ignore_index: int = -100):
    """The same losses from materialised f32 logits and optax (memory O(B T V))."""
    logits = jnp.einsum("btd,dv->btv", hidden, w, preferred_element_type=jnp.float32)
    valid = labels != ignore_index
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(valid, labels, 0))
    return jnp.where(valid, losses, 0.0)
