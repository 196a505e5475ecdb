"""Token-level distillation losses between teacher and student next-token distributions.

Logits are [B, T, V], `mask` [B, T]. Both distributions are softened by the
temperature τ and the loss is multiplied by τ², which keeps gradient
magnitudes comparable across temperatures (Hinton et al. 2015, arXiv:1503.02531).
The teacher is never differentiated.
"""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.aggregation import aggregate
from agentic_jax.rl.numerics import expectation
from agentic_jax.rl.types import LossOutput

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")


def _kl(log_p, log_q):
    """Σ_v p_v·(log p_v − log q_v) over the last axis, with 0·log 0 = 0 (a masked or padded
    vocabulary entry, at −inf in both, adds nothing, not NaN)."""
    return expectation(log_p, log_p - log_q)


def _output(per_token, mask, aggregation) -> LossOutput:
    per_token = jnp.where(mask > 0, per_token, 0.0)
    total, count = aggregate(per_token, mask, aggregation)
    return LossOutput(
        total,
        count,
        {"tokens": jnp.sum(mask), "divergence": jnp.sum(jax.lax.stop_gradient(per_token))},
    )


def _logits_and_mask(student_logits, mask):
    student = check.rank("student_logits", check.floating("student_logits", student_logits), 3)
    mask = check.shape("mask", check.mask("mask", mask), student.shape[:2])
    return student, mask


def distillation_loss(
    student_logits,
    teacher_logits,
    mask,
    *,
    divergence="forward_kl",
    temperature=1.0,
    jsd_beta=0.5,
    aggregation="token-mean",
) -> LossOutput:
    """τ²·D(teacher, student) per valid token, reduced by `aggregate`.

    forward_kl: KL(p_T ‖ p_S), mean-seeking (Hinton et al. 2015, arXiv:1503.02531)
    reverse_kl: KL(p_S ‖ p_T), mode-seeking (Gu et al. 2023, MiniLLM, arXiv:2306.08543)
    jsd:        β·KL(p_T ‖ m) + (1 − β)·KL(p_S ‖ m), m = β·p_T + (1 − β)·p_S with
                β = `jsd_beta` in (0, 1); bounded, symmetric at β = ½
                (Agarwal et al. 2024, GKD, arXiv:2306.13649)
    """
    check.choice("divergence", divergence, DIVERGENCES)
    check.static_range("temperature", temperature, 0.0, float("inf"), low_open=True)
    student, mask = _logits_and_mask(student_logits, mask)
    teacher = check.shape(
        "teacher_logits", check.floating("teacher_logits", teacher_logits), student.shape
    )
    log_s = jax.nn.log_softmax(student / temperature, axis=-1)
    log_t = jax.lax.stop_gradient(jax.nn.log_softmax(teacher / temperature, axis=-1))
    if divergence == "forward_kl":
        per_token = _kl(log_t, log_s)
    elif divergence == "reverse_kl":
        per_token = _kl(log_s, log_t)
    else:
        check.static_range("jsd_beta", jsd_beta, 0.0, 1.0, low_open=True, high_open=True)
        # Floored: logaddexp(−inf, −inf) has a NaN gradient (vocabulary entries masked in both).
        floor = jnp.finfo(jnp.float32).min
        log_m = jnp.logaddexp(
            jnp.maximum(jnp.log(jsd_beta) + log_t, floor),
            jnp.maximum(jnp.log1p(-jsd_beta) + log_s, floor),
        )
        per_token = jsd_beta * _kl(log_t, log_m) + (1.0 - jsd_beta) * _kl(log_s, log_m)
    return _output(temperature**2 * per_token, mask, aggregation)


def topk_distillation_loss(
    student_logits,
    teacher_topk_logits,
    teacher_topk_ids,
    mask,
    *,
    temperature=1.0,
    aggregation="token-mean",
) -> LossOutput:
    """Forward KL from stored teacher top-k logits: τ²·Σ_k p_T,k·(log p_T,k − log p_S(id_k)).

    p_T is the softmax of the K stored logits (renormalised over the top-k);
    p_S is the student's full-vocabulary softmax read at the same ids. Storing
    K ≪ V logits makes offline distillation affordable; with K = V this is
    `distillation_loss(..., divergence="forward_kl")`, and it stays ≥ 0.
    """
    check.static_range("temperature", temperature, 0.0, float("inf"), low_open=True)
    student, mask = _logits_and_mask(student_logits, mask)
    topk_logits = check.rank(
        "teacher_topk_logits", check.floating("teacher_topk_logits", teacher_topk_logits), 3
    )
    check.shape("teacher_topk_logits", topk_logits, student.shape[:2] + topk_logits.shape[2:])
    ids = check.shape(
        "teacher_topk_ids", check.integer("teacher_topk_ids", teacher_topk_ids), topk_logits.shape
    )
    log_t = jax.lax.stop_gradient(jax.nn.log_softmax(topk_logits / temperature, axis=-1))
    log_s = jnp.take_along_axis(jax.nn.log_softmax(student / temperature, axis=-1), ids, axis=-1)
    return _output(temperature**2 * _kl(log_t, log_s), mask, aggregation)


def self_distillation_loss(
    logits,
    privileged_logits,
    mask,
    *,
    divergence="reverse_kl",
    temperature=1.0,
    aggregation="token-mean",
) -> LossOutput:
    """On-policy self-distillation: the teacher is the same model given privileged context.

    Run the model on its own samples twice, once with the plain prompt
    (`logits`) and once with privileged context such as the reference answer or
    hints (`privileged_logits`), and pull the former towards the latter. The
    privileged branch is detached, so the shared weights cannot lower the loss
    by making the teacher forget its context; the default reverse KL is the
    mode-seeking choice for on-policy samples.
    Snell et al. (2022), "Learning by Distilling Context", arXiv:2209.15189;
    Agarwal et al. (2024), GKD, arXiv:2306.13649.
    """
    return distillation_loss(
        logits,
        privileged_logits,
        mask,
        divergence=divergence,
        temperature=temperature,
        aggregation=aggregation,
    )
