"""ECE against hand-computed bins and a slow loop reference, the reliability diagram's PNG, and
temperature scaling recovering a known temperature (checked against scipy's 1-D minimiser)."""

import itertools

import numpy as np
import pytest
import scipy.optimize
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.eval.calibration import (
    apply_temperature,
    expected_calibration_error,
    fit_temperature,
    reliability_bins,
    reliability_diagram,
)


def ece_reference(confidences, correct, n_bins) -> float:
    """Guo et al.'s loop: bins (lo, hi] over np.linspace edges, the first also holding 0."""
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        members = [j for j, x in enumerate(confidences) if lo < x <= hi or (i == 0 and x == 0)]
        if members:
            confidence = np.mean([confidences[j] for j in members])
            accuracy = np.mean([correct[j] for j in members])
            total += len(members) / len(confidences) * abs(accuracy - confidence)
    return total


def test_ece_of_constructed_bins_is_the_hand_computed_value():
    # Bin (0.6, 0.8]: confidences 0.7, 0.7, 0.7, 0.7 with 2 of 4 right: gap 0.2, weight 4/10.
    # Bin (0.8, 1.0]: confidences 0.9 x 6 with 6 of 6 right: gap 0.1, weight 6/10.
    confidences = [0.7] * 4 + [0.9] * 6
    correct = [1, 1, 0, 0] + [1] * 6
    assert expected_calibration_error(confidences, correct, n_bins=5) == pytest.approx(
        0.4 * 0.2 + 0.6 * 0.1
    )
    count, confidence, accuracy = reliability_bins(confidences, correct, 5)
    np.testing.assert_array_equal(count, [0, 0, 0, 4, 6])
    np.testing.assert_allclose(confidence[3:], [0.7, 0.9])
    np.testing.assert_allclose(accuracy[3:], [0.5, 1.0])
    assert np.isnan(confidence[:3]).all() and np.isnan(accuracy[:3]).all()


def test_ece_is_zero_when_accuracy_equals_confidence_in_every_bin():
    # In each bin a fraction q of the predictions (all at confidence q) are right.
    confidences, correct = [], []
    for q, size in [(0.25, 4), (0.5, 10), (0.75, 8), (1.0, 3)]:
        confidences += [q] * size
        correct += [1] * round(q * size) + [0] * (size - round(q * size))
    assert expected_calibration_error(confidences, correct, n_bins=10) == pytest.approx(0.0)


EDGES = [0.0, 1 / 15, 2 / 15, 7 / 15, 0.5, 14 / 15, 1.0]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.sampled_from(EDGES), st.floats(0, 1)), st.booleans()),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([1, 2, 10, 15]),
)
def test_ece_matches_the_loop_reference_including_bin_edges(predictions, n_bins):
    confidences, correct = map(list, zip(*predictions))
    assert expected_calibration_error(confidences, correct, n_bins) == pytest.approx(
        ece_reference(confidences, correct, n_bins), abs=1e-12
    )
    assert reliability_bins(confidences, correct, n_bins)[0].sum() == len(confidences)


def test_bins_are_right_closed_with_zero_in_the_first():
    count, _, _ = reliability_bins([0.0, 1 / 15, 1 / 15 + 1e-9, 1.0], [1, 0, 1, 1], 15)
    assert count[0] == 2 and count[1] == 1 and count[14] == 1


def test_ece_rejects_bad_input():
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        expected_calibration_error([0.5, 1.2], [1, 0])
    with pytest.raises(ValueError, match="one nonzero length"):
        expected_calibration_error([0.5, 0.2], [1])
    with pytest.raises(ValueError, match="0/1"):
        expected_calibration_error([0.5, 0.2], [1, 2])
    with pytest.raises(ValueError, match="n_bins"):
        expected_calibration_error([0.5], [1], n_bins=0)


def test_reliability_diagram_writes_a_png(tmp_path):
    rng = np.random.default_rng(0)
    confidences = rng.uniform(0, 1, 200)
    correct = rng.uniform(0, 1, 200) < confidences**2
    path = reliability_diagram(confidences, correct, tmp_path / "reliability", title="judge")
    assert path == tmp_path / "reliability"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def sampled_labels(logits, temperature, seed):
    """One label per row, drawn from softmax(logits / temperature)."""
    rng = np.random.default_rng(seed)
    probabilities = scipy.special.softmax(logits.astype(np.float64) / temperature, axis=1)
    return (probabilities.cumsum(1) > rng.random((len(logits), 1))).argmax(1)


def nll(logits, labels, temperature) -> float:
    log_probs = scipy.special.log_softmax(logits.astype(np.float64) / temperature, axis=1)
    return float(-log_probs[np.arange(len(labels)), labels].mean())


def test_temperature_scaling_recovers_the_temperature_that_made_the_labels():
    logits = (3.0 * np.random.default_rng(0).normal(size=(30000, 6))).astype(np.float32)
    labels = sampled_labels(logits, 2.5, seed=1)
    fit, held_out = slice(0, 20000), slice(20000, None)
    temperature = fit_temperature(logits[fit], labels[fit])
    assert temperature == pytest.approx(2.5, rel=0.05)
    reference = scipy.optimize.minimize_scalar(
        lambda t: nll(logits[fit], labels[fit], t), bounds=(0.05, 20), method="bounded"
    ).x
    assert temperature == pytest.approx(reference, rel=1e-3)
    assert nll(logits[held_out], labels[held_out], temperature) <= nll(
        logits[held_out], labels[held_out], 1.0
    )
    np.testing.assert_allclose(apply_temperature(logits[:4], temperature), logits[:4] / temperature)


def test_temperature_below_one_sharpens_underconfident_logits():
    logits = np.random.default_rng(2).normal(size=(4000, 3)).astype(np.float32)
    labels = sampled_labels(logits, 0.5, seed=3)
    assert fit_temperature(logits, labels) == pytest.approx(0.5, rel=0.1)


def test_temperature_functions_validate_shapes_and_dtypes():
    logits = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"logits \[N, C\]"):
        fit_temperature(logits[0], [0, 1, 2])
    with pytest.raises(ValueError, match="finite floats"):
        fit_temperature(np.zeros((4, 3), np.int32), [0, 1, 2, 0])
    with pytest.raises(ValueError, match="finite floats"):
        fit_temperature(np.full((4, 3), np.nan, np.float32), [0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"integers of shape \(4,\)"):
        fit_temperature(logits, [0, 1, 2])
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\)"):
        fit_temperature(logits, [0, 1, 3, 0])
    with pytest.raises(ValueError, match="positive finite"):
        apply_temperature(logits, 0.0)
    with pytest.raises(ValueError, match="floats"):
        apply_temperature(np.zeros((2, 2), np.int32), 2.0)
    assert fit_temperature(logits, [0, 1, 2, 0]) == 1.0  # flat logits: every T is optimal
