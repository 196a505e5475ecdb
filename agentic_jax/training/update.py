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
``finetune.model_params(trainable, base, key)`` gives the parameters the model runs with, and
``finetune.scale_updates(updates)`` the optimiser's updates as applied (LoRA+'s ratio for ``B``);
``finetune.frozen(base)`` is that frozen tree as the trainers keep it (None for full fine-tuning,
QLoRA's quantised base).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_jax.models import moe
from agentic_jax.models.quantization import is_quantized
from agentic_jax.rl.types import LossOutput, combine_outputs
from agentic_jax.training.loss_scale import DynamicLossScale, keep_if_finite
from agentic_jax.training.state import TrainState


@dataclasses.dataclass(frozen=True)
class FullFinetune:
    """Trains every parameter: the trainable tree *is* the model's parameters; no frozen base."""

    def init(self, params, key=None):
        """``params`` themselves; a compressed model's quantised weights cannot take gradient
        steps, so those fail here (train LoRA adapters over them instead: QLoRA)."""
        del key
        if any(is_quantized(w) for w in jax.tree.leaves(params, is_leaf=is_quantized)):
            raise ValueError(
                "full fine-tuning cannot train a compressed model's quantised weights; train "
                "LoRA adapters over them (QLoRA: finetune = @LoRA()), or start from the float "
                "model it was compressed from"
            )
        return params

    def model_params(self, trainable, base=None, key=None):
        del base, key
        return trainable

    def merged(self, trainable, base=None):
        """The plain model parameters to save or serve."""
        del base
        return trainable

    def scale_updates(self, updates):
        """The optimiser's updates as applied (per-parameter learning-rate ratios; none here)."""
        return updates

    def frozen(self, base):
        """The frozen tree ``update`` gets beside the trainable one: none here."""
        del base
        return None


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
    router_bias_rate: float | None = None,
    loss_scale: DynamicLossScale | None = None,
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

    A mixture of experts trains the same way in every trainer: the forward passes a loss runs
    on the model's plain forward are collected (``models.moe.collect_aux``), their auxiliary loss
    (load balancing and router z-loss) is added to the total as ``aux · count`` and their router
    metrics are logged (``models.moe.step_metrics``).  ``router_bias_rate`` (the model's
    ``aux_free_bias_rate``, required when it has a router bias; 0 holds a sigmoid router's bias
    where it is) moves every ``router_bias`` of the trainable tree after the optimiser
    by the step's expert loads (``models.moe.move_router_bias``), outside the gradient; under
    LoRA the bias is part of the frozen base and stays where it is.

    ``loss_scale`` (float16 compute; :mod:`~agentic_jax.training.loss_scale`) differentiates the
    total times ``state.loss_scale.scale``, divides the gradients by it, skips a step whose
    gradients are not all finite and adjusts the scale; it logs ``loss_scale`` and ``skipped``.
    """

    def grads_of(trainable, base, micro, key, scale):
        def objective(t):
            params = finetune.model_params(t, base, key if dropout else None)
            with moe.collect_aux() as forwards:
                total, count, metrics = loss_fn(params, micro, key)
            total, metrics = moe.with_aux_loss(total, count, metrics, moe.merge_aux(forwards))
            return total * scale, (total, count, metrics)

        return jax.value_and_grad(objective, has_aux=True)(trainable)

    def update(state: TrainState, base, batch):
        if moe.has_router_bias(state.params) and router_bias_rate is None:
            raise ValueError(
                "the model has a router bias (aux_free_bias_rate > 0, or the sigmoid router): pass "
                "make_update(router_bias_rate=config.aux_free_bias_rate)"
            )
        if loss_scale is not None and state.loss_scale is None:
            raise ValueError(
                "make_update(loss_scale=...) needs a state made with "
                "TrainState.create(..., loss_scale=...)"
            )
        micro = split_micro(batch, accum_steps)
        key = state.step_key()
        scale = 1.0 if loss_scale is None else state.loss_scale.scale

        def body(grad_sum, xs):
            index, mb = xs
            (_, (total, count, metrics)), grads = grads_of(
                state.params, base, mb, jax.random.fold_in(key, index), scale
            )
            return jax.tree.map(jnp.add, grad_sum, grads), LossOutput(total, count, metrics)

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        grads, stacked = jax.lax.scan(body, zeros, (jnp.arange(accum_steps), micro))
        out = combine_outputs(
            [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(accum_steps)]
        )
        denom = jnp.maximum(out.count, 1e-9)
        grads = jax.tree.map(lambda g, p: (g / scale / denom).astype(p.dtype), grads, state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, finetune.scale_updates(updates))
        metrics = dict(out.metrics)
        if "moe_expert_load" in metrics:
            router = {k: metrics.pop(k) for k in list(metrics) if k.startswith("moe_")}
            params = moe.move_router_bias(
                state.params, params, router["moe_expert_load"], router_bias_rate or 0.0
            )
            metrics.update(moe.step_metrics(router, out.count))
        if loss_scale is not None:
            state, params, opt_state, scaling = keep_if_finite(
                loss_scale, state, grads, params, opt_state
            )
            metrics.update(scaling)
        metrics = {
            **metrics,
            "loss": out.total / denom,
            "count": out.count,
            "grad_norm": optax.tree.norm(grads),
        }
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return update


def router_metrics(*updates) -> dict[str, float]:
    """The mixture-of-experts router metrics (``moe_*``) of one or more updates' metrics, as
    floats averaged over the updates: what a trainer logs of them (``{}`` for a dense model)."""
    names = [name for name in updates[0] if name.startswith("moe_")] if updates else []
    return {name: float(np.mean([m[name] for m in updates])) for name in names}
