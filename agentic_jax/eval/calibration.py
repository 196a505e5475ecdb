"""Calibration: does a model's confidence match how often it is right?

A verifier, reward model or judge whose scores are used as probabilities (to threshold, to
weight votes, to decide when to abstain) must be calibrated, not only accurate.  The expected
calibration error and the reliability diagram measure the mismatch on binned confidences
(Guo et al. 2017, "On Calibration of Modern Neural Networks", arXiv:1706.04599); temperature
scaling, the one-parameter fix from the same paper, divides the logits by a ``T`` fitted on
held-out data, which changes the confidences but never the argmax (so never the accuracy).
"""

from __future__ import annotations

import os
import pathlib
from typing import BinaryIO

import jax
import jax.numpy as jnp
import numpy as np
import optax


def _confidences_and_correct(confidences, correct) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``confidences`` in [0, 1] (float64) and ``correct`` (bool), both 1-D."""
    confidences, correct = np.asarray(confidences), np.asarray(correct)
    if confidences.ndim != 1 or confidences.shape != correct.shape or confidences.size == 0:
        raise ValueError(
            "need confidences and correct as 1-D arrays of one nonzero length, got "
            f"{confidences.shape} and {correct.shape}"
        )
    confidences = confidences.astype(np.float64)
    if not np.all((confidences >= 0) & (confidences <= 1)):
        raise ValueError("confidences must be probabilities in [0, 1] (and not NaN)")
    if correct.dtype != bool and not np.isin(correct, (0, 1)).all():
        raise ValueError("correct must be booleans or 0/1 per prediction")
    return confidences, correct.astype(bool)


def reliability_bins(
    confidences, correct, n_bins: int = 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(count, mean_confidence, accuracy)`` per bin, each ``[n_bins]``: the equal-width bins
    ``(e_i, e_{i+1}]`` with edges ``np.linspace(0, 1, n_bins + 1)``, right-closed, the first
    also holding 0.  Empty bins have NaN mean confidence and accuracy.
    """
    confidences, correct = _confidences_and_correct(confidences, correct)
    if not isinstance(n_bins, int | np.integer) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # searchsorted(side="left") - 1 is i with e_i < x <= e_{i+1}; x = 0 gives -1, bin 0.
    bins = np.maximum(np.searchsorted(edges, confidences, side="left") - 1, 0)
    count = np.bincount(bins, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_confidence = np.bincount(bins, confidences, n_bins) / count
        accuracy = np.bincount(bins, correct.astype(np.float64), n_bins) / count
    return count, mean_confidence, accuracy


def expected_calibration_error(confidences, correct, n_bins: int = 15) -> float:
    """ECE ``= Σ_b (|B_b| / N) |acc(B_b) - conf(B_b)|`` over the equal-width confidence bins
    of :func:`reliability_bins` (Guo et al. 2017, eq. 3): the gap between accuracy and mean
    confidence, weighted by how many predictions fall in each bin.
    """
    count, mean_confidence, accuracy = reliability_bins(confidences, correct, n_bins)
    full = count > 0
    gaps = np.abs(accuracy[full] - mean_confidence[full])
    return float(np.sum(count[full] * gaps) / count.sum())


def reliability_diagram(
    confidences, correct, path, n_bins: int = 15, title: str | None = None
) -> pathlib.Path | BinaryIO:
    """Write the reliability diagram (accuracy per confidence bin against the diagonal of
    perfect calibration, with the ECE) as a PNG at ``path`` (a file name, or a binary file so
    that a caller can write it atomically); returns the path.

    Uses ``matplotlib.figure.Figure`` directly, never pyplot, so no global figure state or
    interactive backend is touched.
    """
    from matplotlib.figure import Figure

    count, mean_confidence, accuracy = reliability_bins(confidences, correct, n_bins)
    ece = expected_calibration_error(confidences, correct, n_bins)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    full = count > 0
    fig = Figure(figsize=(5, 5))
    ax = fig.add_subplot()
    ax.bar(
        edges[:-1][full],
        accuracy[full],
        width=1 / n_bins,
        align="edge",
        edgecolor="black",
        label="accuracy",
    )
    ax.bar(
        edges[:-1][full],
        (mean_confidence - accuracy)[full],
        bottom=accuracy[full],
        width=1 / n_bins,
        align="edge",
        color="red",
        alpha=0.3,
        label="gap to confidence",
    )
    ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
    ax.set_title(f"ECE = {ece:.4f}" if title is None else f"{title} (ECE = {ece:.4f})")
    ax.legend(loc="upper left")
    if isinstance(path, str | os.PathLike):
        path = pathlib.Path(path)
    fig.savefig(path, format="png", dpi=100)
    return path


def _logits_and_labels(logits, labels) -> tuple[jax.Array, jax.Array]:
    """Validated ``logits[N, C]`` (finite floats, at least float32 for the fit) and
    ``labels[N]`` (integers in [0, C))."""
    logits, labels = jnp.asarray(logits), np.asarray(labels)
    if logits.ndim != 2 or logits.shape[0] < 1 or logits.shape[1] < 2:
        raise ValueError(f"need logits [N, C] with N >= 1 and C >= 2, got shape {logits.shape}")
    if not jnp.issubdtype(logits.dtype, jnp.floating) or not jnp.all(jnp.isfinite(logits)):
        raise ValueError(f"logits must be finite floats, got dtype {logits.dtype}")
    if labels.shape != logits.shape[:1] or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels must be integers of shape ({logits.shape[0]},), got {labels.dtype} "
            f"{labels.shape}"
        )
    if np.any((labels < 0) | (labels >= logits.shape[1])):
        raise ValueError(f"labels must be class indices in [0, {logits.shape[1]})")
    return logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), jnp.asarray(labels)


def _nll(log_temperature, logits, labels):
    """Mean negative log-likelihood of ``labels`` under ``softmax(logits / exp(log_t))``."""
    log_probs = jax.nn.log_softmax(logits / jnp.exp(log_temperature), axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=-1))


@jax.jit
def _fit_log_temperature(logits, labels):
    """``log T`` minimising :func:`_nll`, by L-BFGS from ``T = 1`` until the gradient vanishes."""

    def nll(log_t):
        return _nll(log_t, logits, labels)

    optimizer = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(nll)

    def step(carry):
        log_t, state = carry
        value, grad = value_and_grad(log_t, state=state)
        updates, state = optimizer.update(grad, state, log_t, value=value, grad=grad, value_fn=nll)
        return optax.apply_updates(log_t, updates), state

    def going(carry):
        _, state = carry
        count = optax.tree_utils.tree_get(state, "count")
        grad = optax.tree_utils.tree_get(state, "grad")
        return (count == 0) | ((count < 100) & (jnp.abs(grad) > 1e-6))

    log_t = jnp.zeros((), logits.dtype)
    log_t, _ = jax.lax.while_loop(going, step, (log_t, optimizer.init(log_t)))
    return log_t


def fit_temperature(logits, labels) -> float:
    """Temperature scaling (Guo et al. 2017, §4.2): the ``T > 0`` minimising the mean NLL of
    ``labels`` under ``softmax(logits / T)``, fitted over ``log T`` (so ``T`` stays positive)
    with L-BFGS (``optax.lbfgs``), jit-compiled.  Fit it on held-out data, not training data.
    Where the logits rank every label first the NLL falls towards 0 as ``T -> 0``; the fit then
    stops at the small ``T`` where the gradient underflows.
    """
    logits, labels = _logits_and_labels(logits, labels)
    log_t = float(_fit_log_temperature(logits, labels))
    if not np.isfinite(log_t):
        raise ValueError("the temperature fit diverged (NaN or infinite log T)")
    return float(np.exp(log_t))


def apply_temperature(logits, temperature: float) -> jax.Array:
    """``logits / T``, the calibrated logits (softmax them for the calibrated probabilities)."""
    if not temperature > 0 or not np.isfinite(temperature):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    logits = jnp.asarray(logits)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"logits must be floats, got dtype {logits.dtype}")
    return logits / temperature
