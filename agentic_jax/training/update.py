"""The one update path every trainer uses: micro-batches, exact reduction, one optax apply.

A loss is a sum and a count, never a pre-divided mean (``rl.LossOutput``): ``loss_fn(params,
batch, key) -> (total, count, metrics)``.  :func:`make_update` splits the batch into
``accum_steps`` micro-batches and scans over them, adding the gradients of the totals; the
totals, counts and metrics of the micro-batches are reduced by the project's rule (sums add,
counts add, a metric named ``*_max`` / ``*_min`` reduces by max / min, see ``rl.types``); the
gradient is divided once by the whole count and applied with one optax update.  So the update
equals the one-batch update whatever ``accum_steps``: accumulation changes memory, not maths.

What is trained is chosen by a *finetune*: :class:`FullFinetune` trains every parameter; LoRA
(``models.lora.LoRA``) trains adapters over a frozen base.  The train state holds the trainable
tree (so the optimizer sees only it) and the frozen ``base`` travels beside it;
``finetune.model_params(trainable, base, key)`` gives the parameters the model runs with.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from agentic_jax.rl.types import LossOutput, combine_outputs
from agentic_jax.training.state import TrainState


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


def split_micro(batch, accum_steps: int):
    """``[B, ...] -> [accum_steps, B / accum_steps, ...]`` for every array of ``batch``."""
    rows = {x.shape[0] for x in jax.tree.leaves(batch)}
    if len(rows) != 1:
        raise ValueError(f"batch arrays disagree on the number of rows: {sorted(rows)}")
    (rows,) = rows
    if accum_steps < 1 or rows % accum_steps:
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
    after_update=None,
):
    """``update(state, base, batch) -> (state, metrics)``, not yet jitted (callers jit it, with
    shardings where they have them).

    ``state`` is a :class:`TrainState` over the trainable tree, ``base`` the frozen one (or
    None).  Micro-batch ``i`` gets the key ``fold_in(state.step_key(), i)`` (dropout, sampling
    inside a loss).  ``dropout=False`` runs the model without dropout: on-policy RL compares its
    log-probs with ``old_logp`` computed without it, and dropout noise would move the importance
    ratio off 1 and trip the clip before the policy changed (TRL disables dropout for PPO and
    GRPO too).  Metrics: the reduced ``metrics`` of ``loss_fn``, ``loss = total / count``,
    ``count`` and ``grad_norm`` (of the gradient the optimizer receives, before its clipping).

    ``after_update(old, new, metrics) -> params`` changes the trainable tree after the optimiser,
    outside the gradient, from the step's reduced metrics: state that is no parameter of the
    loss, such as a mixture of experts' balancing bias (``models.moe.router_bias_update``), whose
    optimiser update it discards.
    """

    def grads_of(trainable, base, micro, key):
        def objective(t):
            params = finetune.model_params(t, base, key if dropout else None)
            total, count, metrics = loss_fn(params, micro, key)
            return total, (count, metrics)

        return jax.value_and_grad(objective, has_aux=True)(trainable)

    def update(state: TrainState, base, batch):
        micro = split_micro(batch, accum_steps)
        key = state.step_key()

        def body(grad_sum, xs):
            index, mb = xs
            (total, (count, metrics)), grads = grads_of(
                state.params, base, mb, jax.random.fold_in(key, index)
            )
            return jax.tree.map(jnp.add, grad_sum, grads), LossOutput(total, count, metrics)

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        grads, stacked = jax.lax.scan(body, zeros, (jnp.arange(accum_steps), micro))
        out = combine_outputs(
            [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(accum_steps)]
        )
        denom = jnp.maximum(out.count, 1e-9)
        grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if after_update is not None:
            params = after_update(state.params, params, out.metrics)
        metrics = {
            **out.metrics,
            "loss": out.total / denom,
            "count": out.count,
            "grad_norm": optax.tree.norm(grads),
        }
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return update
