"""Optimisers and learning-rate schedules (optax), configured from gin.

``make_optimizer.kind`` chooses AdamW (every parameter) or Muon (the hidden matrices) with AdamW
(the rest); ``make_schedule.kind`` the learning rate's shape.  docs/training.md has the formulas.
"""

from __future__ import annotations

import re

import gin
import jax
import optax

from sharding.partition import path_str

SCHEDULES = ("constant", "cosine", "linear", "wsd", "cosine_restarts")
OPTIMIZERS = ("adamw", "muon")


@gin.configurable
def make_schedule(
    peak_lr: float = 3e-3,
    total_steps: int = 1000,
    *,
    kind: str = "cosine",
    warmup_steps: int = 50,
    final_lr_ratio: float = 0.1,
    decay_fraction: float = 0.2,
    restart_period: int = 100,
    restart_mult: int = 1,
) -> optax.Schedule:
    """Learning rate by step: linear warmup from 0 to ``peak_lr``, then

    * ``constant``: peak_lr;
    * ``cosine``: cosine decay to ``final_lr_ratio * peak_lr`` at ``total_steps`` (Loshchilov & Hutter 2017);
    * ``linear``: linear decay to ``final_lr_ratio * peak_lr``;
    * ``wsd``: warmup-stable-decay (Hu et al. 2024, MiniCPM): flat until the last
      ``decay_fraction`` of training (or the end of warmup, if later), then linear decay to
      ``final_lr_ratio * peak_lr`` at ``total_steps``;
    * ``cosine_restarts``: SGDR (Loshchilov & Hutter 2017, "SGDR: stochastic gradient descent
      with warm restarts"): cosine cycles from ``peak_lr`` down to ``final_lr_ratio * peak_lr``,
      the first ``restart_period`` steps long and each next one ``restart_mult`` times longer;
      at every restart the rate jumps back to ``peak_lr``.  Restarts let a run that is extended
      keep annealing without knowing its length in advance, and each cycle's end is a
      low-rate snapshot worth evaluating.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"make_schedule.kind={kind!r}; expected one of {SCHEDULES}")
    if kind == "cosine_restarts" and (restart_period < 1 or restart_mult < 1):
        raise ValueError(
            f"make_schedule.restart_period={restart_period} and restart_mult={restart_mult} "
            "must be >= 1"
        )
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
    elif kind == "cosine_restarts":
        after = optax.sgdr_schedule(
            _restart_cycles(peak_lr, final, rest, restart_period, restart_mult)
        )
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


def _restart_cycles(peak: float, final: float, steps: int, period: int, mult: int) -> list[dict]:
    """``optax.sgdr_schedule``'s cycles: lengths ``period * mult**i`` until they cover ``steps``."""
    cycles, covered, length = [], 0, period
    while covered < max(steps, 1):
        cycles.append(
            dict(
                init_value=peak,
                peak_value=peak,
                warmup_steps=0,
                decay_steps=length,
                end_value=final,
            )
        )
        covered, length = covered + length, length * mult
    return cycles


DEFAULT_NO_DECAY = (r"norm", r"bias", r"embed")


@gin.configurable
def weight_decay_mask(params, exclude: tuple[str, ...] = DEFAULT_NO_DECAY):
    """True for parameters that get weight decay: those whose path matches no ``exclude`` regex.

    Norm scales, biases and embeddings are excluded by default (decaying them hurts and has no
    regularising purpose; Loshchilov & Hutter 2019, and common LLM practice).
    """
    patterns = [re.compile(p) for p in exclude]

    def decays(path, _):
        return not any(p.search(path_str(path)) for p in patterns)

    return jax.tree_util.tree_map_with_path(decays, params)


# The hidden matrices Muon owns, each with how many axes after the leading layer axis are its
# input (contracted) axes: the rest are its output axes.  ``q``: [L, D, N, H] is a D x (N H)
# matrix per layer, ``o``: [L, N, H, D] an (N H) x D one.  Multi-head latent attention's
# projections are Muon's too, as in Kimi K2 (an MLA model trained by MuonClip).
MUON_MATRICES = {
    "layers/attn/q": 1,
    "layers/attn/k": 1,
    "layers/attn/v": 1,
    "layers/attn/o": 2,
    "layers/attn/q_a": 1,
    "layers/attn/q_b": 1,
    "layers/attn/kv_a": 1,
    "layers/attn/k_up": 1,
    "layers/attn/v_up": 1,
    "layers/mlp/gate": 1,
    "layers/mlp/up": 1,
    "layers/mlp/down": 1,
}


def muon_labels(params):
    """``"muon"`` for the hidden matrices of :data:`MUON_MATRICES`, ``"adamw"`` for the rest.

    Embeddings and the LM head stay on AdamW as in Jordan et al. (2024) and Liu et al. (2025):
    an embedding row is updated only when its token occurs, and orthogonalising the head's
    [D, V] update would spread a step evenly over the vocabulary's directions, which neither
    wants.  Norm scales and biases are vectors, which Muon does not define.
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "muon" if path_str(path) in MUON_MATRICES else "adamw", params
    )


def muon_dimension_numbers(params):
    """``MuonDimensionNumbers`` of each Muon matrix (None for the rest).

    The leading ``layers`` axis of the stacked (scanned) layers is left out of both the
    reduction and the output axes, so optax treats it as a batch axis and orthogonalises every
    layer's matrix on its own (a ``vmap``), never the [L D, N H] stack as one matrix.
    """

    def dims(path, x):
        inputs = MUON_MATRICES.get(path_str(path))
        if inputs is None:
            return None
        return optax.contrib.MuonDimensionNumbers(
            reduction_axis=tuple(range(1, 1 + inputs)),
            output_axis=tuple(range(1 + inputs, x.ndim)),
        )

    return jax.tree_util.tree_map_with_path(dims, params)


@gin.configurable
def make_optimizer(
    schedule: optax.Schedule,
    *,
    kind: str = "adamw",
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    clip_norm: float | None = 1.0,
    muon_beta: float = 0.95,
    muon_ns_steps: int = 5,
    muon_consistent_rms: float | None = 0.2,
) -> optax.GradientTransformation:
    """Global-norm clipping, then

    * ``adamw``: AdamW (decoupled weight decay on the :func:`weight_decay_mask` parameters);
    * ``muon``: Muon (Jordan et al. 2024) on the hidden matrices of :func:`muon_labels`:
      Nesterov momentum ``muon_beta`` orthogonalised by ``muon_ns_steps`` Newton-Schulz steps
      (``optax.contrib.muon``), scaled to an RMS of ``muon_consistent_rms`` so that one
      learning rate serves Muon and AdamW (Liu et al. 2025, "Muon is scalable for LLM
      training"; None: Jordan's ``sqrt(max(1, fan_out / fan_in))`` instead), with decoupled
      weight decay; AdamW as above on everything else.

    Both follow ``schedule``.  The AdamW side is ``optax.adamw`` itself rather than the AdamW
    inside ``optax.contrib.muon``, which is Nesterov-Adam and decays every parameter it holds
    (embeddings and norms included), unlike the project's AdamW.
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"make_optimizer.kind={kind!r}; expected one of {OPTIMIZERS}")
    adamw = optax.adamw(
        schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=weight_decay_mask
    )
    optimizer = adamw
    if kind == "muon":
        muon = optax.contrib.muon(
            schedule,
            ns_steps=muon_ns_steps,
            beta=muon_beta,
            eps=eps,
            weight_decay=weight_decay,
            muon_weight_dimension_numbers=muon_dimension_numbers,
            consistent_rms=muon_consistent_rms,
        )
        optimizer = optax.multi_transform({"muon": muon, "adamw": adamw}, muon_labels)
    if clip_norm is None:
        return optimizer
    return optax.chain(optax.clip_by_global_norm(clip_norm), optimizer)
