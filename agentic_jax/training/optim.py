"""Optimiser and learning-rate schedules (optax), configured from gin."""

from __future__ import annotations

import re

import gin
import jax
import optax

SCHEDULES = ("constant", "cosine", "linear", "wsd")


@gin.configurable
def make_schedule(
    peak_lr: float = 3e-3,
    total_steps: int = 1000,
    *,
    kind: str = "cosine",
    warmup_steps: int = 50,
    final_lr_ratio: float = 0.1,
    decay_fraction: float = 0.2,
) -> optax.Schedule:
    """Learning rate by step: linear warmup from 0 to ``peak_lr``, then

    * ``constant``: peak_lr;
    * ``cosine``: cosine decay to ``final_lr_ratio * peak_lr`` at ``total_steps`` (Loshchilov & Hutter 2017);
    * ``linear``: linear decay to ``final_lr_ratio * peak_lr``;
    * ``wsd``: warmup-stable-decay (Hu et al. 2024, MiniCPM): flat until the last
      ``decay_fraction`` of training (or the end of warmup, if later), then linear decay to
      ``final_lr_ratio * peak_lr`` at ``total_steps``.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"make_schedule.kind={kind!r}; expected one of {SCHEDULES}")
    if kind == "wsd" and not 0 < decay_fraction <= 1:
        raise ValueError(f"make_schedule.decay_fraction={decay_fraction} must be in (0, 1]")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(
            f"make_schedule.warmup_steps={warmup_steps} must be in [0, total_steps={total_steps}]"
        )
    final = peak_lr * final_lr_ratio
    warmup = optax.linear_schedule(0.0, peak_lr, max(warmup_steps, 1))
    rest = total_steps - warmup_steps
    if kind == "constant":
        after = optax.constant_schedule(peak_lr)
    elif kind == "cosine":
        after = optax.cosine_decay_schedule(peak_lr, max(rest, 1), alpha=final_lr_ratio)
    elif kind == "linear":
        after = optax.linear_schedule(peak_lr, final, max(rest, 1))
    else:
        # A warmup reaching into the last ``decay_fraction`` shortens the decay, which must still
        # end at ``total_steps``.
        decay_steps = min(max(round(total_steps * decay_fraction), 1), max(rest, 1))
        stable = max(rest - decay_steps, 0)
        after = optax.join_schedules(
            [optax.constant_schedule(peak_lr), optax.linear_schedule(peak_lr, final, decay_steps)],
            [stable],
        )
    return optax.join_schedules([warmup, after], [warmup_steps])


DEFAULT_NO_DECAY = (r"norm", r"bias", r"embed")


@gin.configurable
def weight_decay_mask(params, exclude: tuple[str, ...] = DEFAULT_NO_DECAY):
    """True for parameters that get weight decay: those whose path matches no ``exclude`` regex.

    Norm scales, biases and embeddings are excluded by default (decaying them hurts and has no
    regularising purpose; Loshchilov & Hutter 2019, and common LLM practice).
    """
    patterns = [re.compile(p) for p in exclude]

    def decays(path, _):
        name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        return not any(p.search(name) for p in patterns)

    return jax.tree_util.tree_map_with_path(decays, params)


@gin.configurable
def make_optimizer(
    schedule: optax.Schedule,
    *,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """AdamW (decoupled weight decay on the masked parameters) after global-norm clipping."""
    adamw = optax.adamw(
        schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=weight_decay_mask
    )
    if clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(clip_norm), adamw)
