"""Token-level aggregation: how per-token losses become one number.

The choice matters (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783): per-sequence
token means weight a token of a short answer more than one of a long answer,
which biases the policy towards long wrong answers. Every mode returns
`(total, count)` so that a batch split into micro-batches or shards reduces to
the same value as the whole batch (`sum(totals) / sum(counts)`).

Packed rows hold several sequences; `segment_ids[B, T]` (non-negative ints
below T) says which one each token belongs to. Tokens with mask 0 are ignored
whatever their id.
"""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.numerics import safe_div

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def _inputs(per_token, mask, segment_ids):
    per_token = check.rank("per_token", check.floating("per_token", per_token), 2)
    mask = check.shape("mask", check.mask("mask", mask), per_token.shape)
    if segment_ids is not None:
        segment_ids = check.shape(
            "segment_ids", check.integer("segment_ids", segment_ids), per_token.shape
        )
    return per_token, mask, segment_ids


def _masked(x: jax.Array, mask: jax.Array) -> jax.Array:
    """x on valid tokens, 0 elsewhere: inf or NaN in padding never leaks into sums."""
    return jnp.where(mask > 0, x, 0.0)


def _sequence_sums(x: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """Per-sequence sums, [B, S]: S = 1 without packing, S = T with packing."""
    if segment_ids is None:
        return jnp.sum(x, axis=-1, keepdims=True)
    num_segments = x.shape[-1]
    return jax.vmap(lambda row, ids: jax.ops.segment_sum(row, ids, num_segments))(x, segment_ids)


def segment_mean(x, mask, segment_ids=None) -> jax.Array:
    """Masked mean of `x` over each sequence, broadcast back to its tokens, [B, T].

    Used for sequence-level quantities (GSPO's ratio, GMPO's geometric mean,
    sequence advantages) so that they work on padded and packed rows alike.
    """
    x, mask, segment_ids = _inputs(x, mask, segment_ids)
    means = safe_div(
        _sequence_sums(_masked(x, mask), segment_ids), _sequence_sums(mask, segment_ids)
    )
    if segment_ids is None:
        return jnp.broadcast_to(means, x.shape)
    return jnp.take_along_axis(means, segment_ids, axis=-1)


def aggregate(per_token, mask, mode: str = "token-mean", *, segment_ids=None, max_length=None):
    """Reduces `per_token[B, T]` over valid tokens to `(total, count)`.

    With n_s the number of valid tokens of sequence s and L the fixed length:
      token-mean:              total = Σ_t m·x,            count = Σ_t m
      seq-mean-token-mean:     total = Σ_s (Σ_{t∈s} m·x)/n_s, count = #{s: n_s > 0}
      seq-mean-token-sum:      total = Σ_t m·x,            count = #{s: n_s > 0}
      seq-mean-token-sum-norm: total = Σ_t m·x / L,        count = #{s: n_s > 0}
    The last is Dr. GRPO's constant normaliser; L defaults to T (pass it
    explicitly for packed rows). Sequences without valid tokens are not counted.
    """
    check.choice("aggregation mode", mode, AGGREGATIONS)
    per_token, mask, segment_ids = _inputs(per_token, mask, segment_ids)
    masked = _masked(per_token, mask)
    if mode == "token-mean":
        return jnp.sum(masked), jnp.sum(mask)
    token_counts = _sequence_sums(mask, segment_ids)
    num_sequences = jnp.sum(token_counts > 0).astype(jnp.float32)
    if mode == "seq-mean-token-mean":
        return jnp.sum(safe_div(_sequence_sums(masked, segment_ids), token_counts)), num_sequences
    if mode == "seq-mean-token-sum":
        return jnp.sum(masked), num_sequences
    length = per_token.shape[-1] if max_length is None else max_length
    check.static_range("max_length", length, 0, float("inf"), low_open=True)
    return jnp.sum(masked) / length, num_sequences
