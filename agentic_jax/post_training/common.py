"""What every post-training trainer shares: per-token log-probs, scalar heads, fingerprints.

Conventions (all trainers):

* A sequence batch is ``tokens[B, L]`` with a 0/1 ``mask[B, L]`` on the tokens that are trained
  (a completion's or an assistant turn's tokens).  :func:`token_logprobs` scores position ``t``
  as the log-probability of ``tokens[:, t]`` given ``tokens[:, :t]``, so its result lines up with
  ``tokens`` and ``mask`` (column 0, which has no context, is 0).
* Every trainer updates through ``training.make_update`` (micro-batches, exact reduction, one
  optax apply); what is trained is its *finetune*: ``training.FullFinetune`` or LoRA
  (``agentic_jax.models.lora``) over a frozen base.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.models import TransformerConfig, hidden_states, logits_from_hidden
from agentic_jax.rl.numerics import expectation


def token_logits(
    params,
    config: TransformerConfig,
    tokens,
    *,
    segment_ids=None,
    positions=None,
    temperature: float = 1.0,
):
    """``z[B, L, V]``: the logits (divided by ``temperature``) that predict ``tokens[:, t]``, read
    at position ``t − 1``, so they line up with ``tokens`` and a loss mask (column 0, which has no
    context, is 0).  Float32."""
    tokens = jnp.asarray(tokens)
    h = hidden_states(params, config, tokens, positions=positions, segment_ids=segment_ids)
    z = logits_from_hidden(params, config, h)[:, :-1].astype(jnp.float32) / temperature
    return jnp.concatenate([jnp.zeros_like(z[:, :1]), z], axis=1)


def logprobs_of(z, tokens, *, segment_ids=None, with_entropy: bool = False):
    """``log softmax(z)[b, t, tokens[b, t]]`` from `token_logits` ``z`` (0 in column 0 and, for
    packed rows, at each segment's first token); with ``with_entropy`` also the entropy of each
    distribution, ``H_t = −Σ p·log p`` with ``0·log 0 = 0`` (logits of −inf, a masked
    vocabulary entry, give no NaN: ``rl.numerics.expectation``)."""
    tokens = jnp.asarray(tokens)
    log_probs = jax.nn.log_softmax(z, axis=-1)
    logp = jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]
    no_context = jnp.arange(tokens.shape[1]) == 0
    first = no_context
    if segment_ids is not None:  # a segment's first token is predicted from the previous segment
        first = first | (segment_ids != jnp.roll(segment_ids, 1, axis=1))
    logp = jnp.where(first, 0.0, logp)
    if not with_entropy:
        return logp
    return logp, jnp.where(no_context, 0.0, -expectation(log_probs, log_probs))


def token_logprobs(
    params,
    config: TransformerConfig,
    tokens,
    *,
    segment_ids=None,
    positions=None,
    temperature: float = 1.0,
    with_entropy: bool = False,
):
    """``logp[B, L]``: log π(tokens[:, t] | tokens[:, :t]) under ``softmax(logits / temperature)``.

    Column 0 is 0 (no context).  With ``with_entropy`` also returns the entropy ``[B, L]`` of the
    distribution each token was drawn from (`logprobs_of`).  Float32.  Packed rows
    (``segment_ids``) score a segment's first token as 0 as well.
    """
    z = token_logits(
        params,
        config,
        tokens,
        segment_ids=segment_ids,
        positions=positions,
        temperature=temperature,
    )
    return logprobs_of(z, tokens, segment_ids=segment_ids, with_entropy=with_entropy)


def sequence_logprobs(params, config: TransformerConfig, tokens, mask, **kwargs):
    """``(Σ_t mask·logp, Σ_t mask)`` per row ``[B]``: a completion's log-likelihood and length."""
    mask = jnp.asarray(mask, jnp.float32)
    logp = token_logprobs(params, config, tokens, **kwargs)
    return jnp.sum(logp * mask, axis=1), jnp.sum(mask, axis=1)


def init_scalar_head(config: TransformerConfig) -> dict:
    """A zero-initialised linear head ``{"w": [D], "b": []}`` (rewards / values start at 0)."""
    return {"w": jnp.zeros((config.d_model,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def token_scores(params, config: TransformerConfig, tokens, *, segment_ids=None, positions=None):
    """Scalar per position ``[B, L]`` from ``params = {"trunk": transformer params, "head": ...}``.

    The trunk's final-norm hidden state times the head: a reward model reads it at a sequence's
    last token, a process reward model at each step's last token, a critic through `token_values`.
    """
    h = hidden_states(
        params["trunk"], config, jnp.asarray(tokens), positions=positions, segment_ids=segment_ids
    )
    return jnp.einsum("bld,d->bl", h.astype(jnp.float32), params["head"]["w"]) + params["head"]["b"]


def token_values(params, config: TransformerConfig, tokens):
    """``V[B, L]``: a critic's value of the state each token is drawn from, ``V(tokens[:, :t])``.

    Read at position ``t − 1``, like ``token_logprobs`` (column 0 is 0): the score at ``t`` has
    already seen ``tokens[:, t]``, so it would value the action rather than the state and GAE
    would credit every token with its successor's advantage.
    """
    scores = token_scores(params, config, tokens)
    return jnp.concatenate([jnp.zeros_like(scores[:, :1]), scores[:, :-1]], axis=1)


def last_index(mask) -> jax.Array:
    """``[B]`` index of each row's last nonzero ``mask`` entry (0 for an empty row)."""
    mask = jnp.asarray(mask) > 0
    idx = jnp.arange(mask.shape[1])
    return jnp.max(jnp.where(mask, idx, 0), axis=1)


def tree_fingerprint(tree) -> str:
    """A short SHA-256 of a pytree's structure and values: the identity of a frozen model
    (a resumed run checks its reference model is the one it started with)."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.ascontiguousarray(jax.device_get(leaf)).tobytes())
    return digest.hexdigest()[:16]


def on_device(tree):
    """``tree`` with every array committed to the default device.

    A fresh ``TrainState`` mixes uncommitted arrays (step, RNG, optimizer counts) with committed
    ones (parameters loaded from a checkpoint), and its first update returns them all committed;
    ``jit`` compiles one program per commitment pattern, so without this the update would
    compile twice.
    """
    return jax.device_put(tree, jax.devices()[0])


def next_prompts(position: int, count: int, num_tasks: int, seed: int) -> np.ndarray:
    """Tasks ``position .. position+count-1`` of the stream of per-epoch seeded permutations."""
    out = []
    for p in range(position, position + count):
        epoch, index = divmod(p, num_tasks)
        out.append(np.random.default_rng([seed, epoch]).permutation(num_tasks)[index])
    return np.asarray(out, np.int32)
