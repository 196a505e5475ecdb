"""What every post-training trainer shares: per-token log-probs, a scalar head, and what is trained.

Conventions (all trainers):

* A sequence batch is ``tokens[B, L]`` with a 0/1 ``mask[B, L]`` on the tokens that are trained
  (a completion's or an assistant turn's tokens).  :func:`token_logprobs` scores position ``t``
  as the log-probability of ``tokens[:, t]`` given ``tokens[:, :t]``, so its result lines up with
  ``tokens`` and ``mask`` (column 0, which has no context, is 0).
* What is trained is chosen by a `Finetune`: `FullFinetune` trains every parameter; LoRA
  (``agentic_jax.models.lora``) trains adapters over a frozen base.  A trainer holds the
  *trainable* tree in its ``TrainState`` (so the optimizer only sees it) and the frozen base
  apart, and calls ``finetune.model_params(trainable, base, key)`` to get the parameters the
  model runs with.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_jax.models import TransformerConfig, hidden_states, logits_from_hidden
from agentic_jax.rl.numerics import expectation


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
    distribution each token was drawn from, ``H_t = −Σ p·log p`` with ``0·log 0 = 0`` (logits of
    −inf, a masked vocabulary entry, give no NaN: ``rl.numerics.expectation``).  Float32.
    Packed rows (``segment_ids``) score a segment's first token as 0 as well.
    """
    tokens = jnp.asarray(tokens)
    h = hidden_states(params, config, tokens, positions=positions, segment_ids=segment_ids)
    z = logits_from_hidden(params, config, h)[:, :-1] / temperature
    log_z = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, tokens[:, 1:, None], axis=-1)[..., 0] - log_z
    pad = jnp.zeros_like(logp[:, :1])
    if segment_ids is not None:  # a segment's first token is predicted from the previous segment
        logp = jnp.where(segment_ids[:, 1:] == segment_ids[:, :-1], logp, 0.0)
    logp = jnp.concatenate([pad, logp], axis=1)
    if not with_entropy:
        return logp
    log_probs = z - log_z[..., None]
    entropy = -expectation(log_probs, log_probs)
    return logp, jnp.concatenate([pad, entropy], axis=1)


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


@dataclasses.dataclass(frozen=True)
class FullFinetune:
    """Trains every parameter: the trainable tree *is* the model's parameters; no frozen base."""

    def init(self, params, key=None):
        del key
        return params

    def model_params(self, trainable, base=None, key=None):
        del base, key
        return trainable

    def merged(self, trainable, base=None):
        """The plain model parameters to save or serve."""
        del base
        return trainable


def tree_fingerprint(tree) -> str:
    """A short SHA-256 of a pytree's structure and values: the identity of a frozen model
    (a resumed run checks its reference model is the one it started with)."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.ascontiguousarray(jax.device_get(leaf)).tobytes())
    return digest.hexdigest()[:16]


def split_micro(batch: dict, accum_steps: int) -> dict:
    """``[B, ...] -> [accum_steps, B / accum_steps, ...]`` for every array of ``batch``."""
    rows = {x.shape[0] for x in jax.tree.leaves(batch)}
    if len(rows) != 1:
        raise ValueError(f"batch arrays disagree on the number of rows: {sorted(rows)}")
    (rows,) = rows
    if rows % accum_steps:
        raise ValueError(
            f"a batch of {rows} rows does not split into accum_steps={accum_steps} micro-batches"
        )
    return jax.tree.map(lambda x: x.reshape(accum_steps, rows // accum_steps, *x.shape[1:]), batch)


def make_update(
    loss_fn,
    optimizer: optax.GradientTransformation,
    finetune=FullFinetune(),
    *,
    accum_steps: int = 1,
    dropout: bool = True,
):
    """A jitted ``update(state, base, batch) -> (state, metrics)`` for a sum-and-count loss.

    ``loss_fn(params, batch, key) -> (total, count, metrics)`` (sums, like ``rl.LossOutput``).
    The batch is split into ``accum_steps`` micro-batches whose totals, counts, metric sums and
    gradients are *summed*; the gradient is divided once by the whole count, so the update equals
    the one-batch update whatever ``accum_steps`` (the exact accumulation the losses are designed
    for).  ``state`` is a ``TrainState`` over the trainable tree; ``base`` the frozen one (or
    None).  The key of micro-batch ``i`` is ``fold_in(state.step_key(), i)`` (dropout, sampling
    inside losses).  ``dropout=False`` runs the model without dropout: on-policy RL compares
    its log-probs with ``old_logp`` computed without it, and dropout noise would move the
    importance ratio off 1 and trip the clip before the policy changed (TRL disables dropout for
    PPO and GRPO too).  Metrics: the summed ``metrics``, ``loss = total / count``, ``count``,
    ``grad_norm`` (before clipping).
    """

    def grads_of(trainable, base, micro, key):
        def objective(t):
            total, count, metrics = loss_fn(
                finetune.model_params(t, base, key if dropout else None), micro, key
            )
            return total, (count, metrics)

        return jax.value_and_grad(objective, has_aux=True)(trainable)

    @jax.jit
    def update(state, base, batch):
        micro = split_micro(batch, accum_steps)
        key = state.step_key()

        def body(carry, xs):
            index, mb = xs
            (total, (count, metrics)), grads = grads_of(
                state.params, base, mb, jax.random.fold_in(key, index)
            )
            acc = jax.tree.map(jnp.add, carry, (grads, total, count, metrics))
            return acc, None

        shapes = jax.eval_shape(
            lambda: grads_of(state.params, base, jax.tree.map(lambda x: x[0], micro), key)
        )
        (_, (_, metric_shapes)), _ = shapes
        zeros = jax.tree.map(
            lambda p: jnp.zeros(p.shape, jnp.float32),
            (state.params, jnp.zeros(()), jnp.zeros(()), metric_shapes),
        )
        (grads, total, count, metrics), _ = jax.lax.scan(
            body, zeros, (jnp.arange(accum_steps), micro)
        )
        denom = jnp.maximum(count, 1e-9)
        grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            **metrics,
            "loss": total / denom,
            "count": count,
            "grad_norm": optax.tree.norm(grads),
        }
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return update


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
