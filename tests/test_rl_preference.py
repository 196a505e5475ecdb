"""Preference losses: DPO properties, every loss_type's distinctness and stability, KTO."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.rl import (
    F_DIVERGENCES,
    PREFERENCE_LOSSES,
    REFERENCE_FREE_LOSSES,
    kto_loss,
    kto_reference_point,
    preference_loss,
    preference_metrics,
)

B = 4
# Numeric hyperparameters such as beta stay traced under jit (so they may follow a schedule);
# label smoothing is static because its range checks only run on Python numbers.
STATIC = ("loss_type", "f_divergence", "label_smoothing")
VARIANTS = {"eager": preference_loss, "jit": jax.jit(preference_loss, static_argnames=STATIC)}
logps = hnp.arrays(np.float32, B, elements=st.floats(-200.0, -0.5, width=32))


@pytest.fixture(params=sorted(VARIANTS), scope="module")
def loss_fn(request):
    return VARIANTS[request.param]


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    chosen, rejected = -rng.uniform(5, 60, B), -rng.uniform(5, 60, B)
    ref_chosen, ref_rejected = chosen + rng.normal(0, 3, B), rejected + rng.normal(0, 3, B)
    lengths = dict(chosen_lengths=rng.integers(3, 20, B), rejected_lengths=rng.integers(3, 20, B))
    return [
        jnp.asarray(x, jnp.float32) for x in (chosen, rejected, ref_chosen, ref_rejected)
    ], lengths


@given(chosen=logps, rejected=logps, beta=st.sampled_from([0.05, 0.1, 1.0]))
def test_dpo_is_log2_at_the_reference_for_every_f_divergence(loss_fn, chosen, rejected, beta):
    for f_divergence in F_DIVERGENCES:
        losses = loss_fn(chosen, rejected, chosen, rejected, beta=beta, f_divergence=f_divergence)
        np.testing.assert_allclose(losses, math.log(2.0), rtol=1e-6)


@given(chosen=logps, rejected=logps, shift=logps)
def test_dpo_gradient_raises_chosen_and_lowers_rejected(loss_fn, chosen, rejected, shift):
    ref_chosen, ref_rejected = chosen + shift / 10, rejected - shift / 10
    grad_c, grad_r = jax.grad(
        lambda c, r: loss_fn(c, r, ref_chosen, ref_rejected).sum(), argnums=(0, 1)
    )(chosen, rejected)
    assert np.all(grad_c < 0) and np.all(grad_r > 0)


@given(chosen=logps, rejected=logps, shift=logps)
def test_half_label_smoothing_erases_the_preference_label(loss_fn, chosen, rejected, shift):
    """At ε = ½ cDPO is a BCE towards ½: swapping chosen and rejected changes nothing,
    and policy = reference is a stationary point (the labels carry no signal)."""
    refs = (chosen + shift / 10, rejected - shift / 10)
    forward = loss_fn(chosen, rejected, *refs, label_smoothing=0.5)
    swapped = loss_fn(rejected, chosen, refs[1], refs[0], label_smoothing=0.5)
    np.testing.assert_allclose(forward, swapped, rtol=1e-5)
    grad = jax.grad(lambda c: loss_fn(c, rejected, chosen, rejected, label_smoothing=0.5).sum())(
        chosen
    )
    np.testing.assert_allclose(grad, 0.0, atol=1e-7)


def test_robust_at_zero_smoothing_is_dpo_and_cdpo_is_smoothed_dpo(loss_fn):
    arrays, _ = _inputs()
    np.testing.assert_allclose(loss_fn(*arrays, loss_type="robust"), loss_fn(*arrays), rtol=1e-6)
    np.testing.assert_allclose(
        loss_fn(*arrays, loss_type="cdpo", label_smoothing=0.2),
        loss_fn(*arrays, label_smoothing=0.2),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="label_smoothing"):
        loss_fn(*arrays, loss_type="cdpo")
    with pytest.raises(ValueError, match="label_smoothing"):
        loss_fn(*arrays, loss_type="robust", label_smoothing=0.5)


@given(chosen=logps, rejected=logps, beta=st.sampled_from([0.1, 0.5]))
def test_ipo_minimum_is_at_length_averaged_margin_of_one_over_two_beta(
    loss_fn, chosen, rejected, beta
):
    lengths = dict(
        chosen_lengths=jnp.array([2, 5, 7, 11]), rejected_lengths=jnp.array([3, 1, 4, 9])
    )
    ref_chosen, ref_rejected = chosen - 1.0, rejected + 2.0
    target = 1.0 / (2.0 * beta)
    # Choose the chosen log-probs that put the averaged margin exactly at 1/(2β).
    optimum = lengths["chosen_lengths"] * (
        ref_chosen / lengths["chosen_lengths"]
        + (rejected - ref_rejected) / lengths["rejected_lengths"]
        + target
    )

    def loss(c):
        return loss_fn(c, rejected, ref_chosen, ref_rejected, loss_type="ipo", beta=beta, **lengths)

    np.testing.assert_allclose(loss(optimum), 0.0, atol=1e-3)
    np.testing.assert_allclose(jax.grad(lambda c: loss(c).sum())(optimum), 0.0, atol=1e-3)
    assert np.all(loss(optimum + 3.0) > loss(optimum)) and np.all(
        loss(optimum - 3.0) > loss(optimum)
    )


def test_reference_free_losses_need_no_reference(loss_fn):
    arrays, lengths = _inputs()
    for loss_type in REFERENCE_FREE_LOSSES:
        without = loss_fn(*arrays[:2], loss_type=loss_type, **lengths)
        with_refs = loss_fn(*arrays, loss_type=loss_type, **lengths)
        np.testing.assert_array_equal(without, with_refs)
        assert np.all(np.isfinite(without))
    assert set(REFERENCE_FREE_LOSSES) == {"simpo", "orpo", "cpo", "alphapo"}


@pytest.mark.parametrize("avg_logp", [0.0, -1e-9, -1e-4, -1e4, -3e4])
def test_orpo_is_finite_near_zero_and_far_below(loss_fn, avg_logp):
    lengths = dict(chosen_lengths=jnp.full(B, 7), rejected_lengths=jnp.full(B, 7))
    chosen = jnp.full(B, 7 * avg_logp, jnp.float32)
    rejected = jnp.array([0.0, -1e-6, -30.0, -7e4], jnp.float32)

    def loss(c, r):
        return loss_fn(c, r, loss_type="orpo", **lengths).sum()

    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(chosen, rejected)
    assert np.isfinite(value) and all(np.all(np.isfinite(g)) for g in grads)


def _numpy_reference(
    chosen, rejected, ref_chosen, ref_rejected, chosen_lengths, rejected_lengths, eps
):
    """Independent float64 formulas of every loss, as written in TRL and the papers (beta = 0.1,
    label smoothing `eps`, other settings at their defaults), and of the f-divergence margins."""
    beta, gamma, tau, alpha = 0.1, 0.5, 0.05, 0.25
    sig = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731
    nls = lambda x: np.logaddexp(0.0, -x)  # −log σ(x)  # noqa: E731
    smoothed = lambda x: (1 - eps) * nls(x) + eps * nls(-x)  # noqa: E731
    rw, rl = chosen - ref_chosen, rejected - ref_rejected
    x = beta * (rw - rl)
    avg_c, avg_r = chosen / chosen_lengths, rejected / rejected_lengths
    log1mexp = lambda a: np.log(-np.expm1(a))  # noqa: E731
    alpha_reward = lambda a: (1.0 - np.exp(-alpha * a)) / alpha  # noqa: E731
    z_w, z_l = max(rw.mean(), 0.0), max(rl.mean(), 0.0)
    losses = {
        "sigmoid": smoothed(x),
        "cdpo": smoothed(x),
        "robust": ((1 - eps) * nls(x) - eps * nls(-x)) / (1 - 2 * eps),
        "hinge": np.maximum(0.0, 1.0 - x),
        "ipo": (rw / chosen_lengths - rl / rejected_lengths - 1 / (2 * beta)) ** 2,
        "exo_pair": sig(x) * (-nls(x) - np.log(1 - eps)) + sig(-x) * (-nls(-x) - np.log(eps)),
        "nca_pair": nls(beta * rw) + 0.5 * nls(-beta * rw) + 0.5 * nls(-beta * rl),
        "bco_pair": nls(beta * rw) + nls(-beta * rl),
        "sppo_hard": (rw - 5.0) ** 2 + (rl + 5.0) ** 2,
        "aot": smoothed(beta * (np.sort(chosen - rejected) - np.sort(ref_chosen - ref_rejected))),
        "aot_unpaired": smoothed(beta * (np.sort(rw) - np.sort(rl))),
        "apo_zero": 1.0 - sig(beta * rw) + sig(beta * rl),
        "apo_down": sig(beta * rw) + 1.0 - sig(x),
        "discopop": (1 - sig(x / tau)) * nls(x) + sig(x / tau) * np.exp(-x),
        "sigmoid_norm": nls(beta * (rw / chosen_lengths - rl / rejected_lengths)),
        "rpo": smoothed(x) - avg_c,
        "kto_pair": (1 - sig(beta * (rw - z_l))) + (1 - sig(beta * (z_w - rl))),
        "simpo": nls(beta * (avg_c - avg_r) - gamma),
        "orpo": -avg_c + beta * nls((avg_c - log1mexp(avg_c)) - (avg_r - log1mexp(avg_r))),
        "cpo": nls(beta * (chosen - rejected)) - avg_c,
        "alphapo": nls(beta * (alpha_reward(avg_c) - alpha_reward(avg_r)) - gamma),
    }
    # Wang et al. (2023): the margin f'(u_w) − f'(u_l), u = π/π_ref, in smoothed DPO.
    margins = {
        "forward_kl": np.exp(-rl) - np.exp(-rw),
        "js": np.log(2 * sig(rw)) - np.log(2 * sig(rl)),
        "alpha": (np.exp(-0.5 * rl) - np.exp(-0.5 * rw)) / 0.5,
    }
    return losses, {f: smoothed(beta * m) for f, m in margins.items()}


def test_every_loss_and_f_divergence_matches_a_float64_reference():
    arrays, lengths = _inputs(seed=3)
    eps = 0.1
    losses, f_losses = _numpy_reference(
        *[np.float64(a) for a in arrays], **{k: np.float64(v) for k, v in lengths.items()}, eps=eps
    )
    assert set(losses) == set(PREFERENCE_LOSSES) and set(f_losses) == set(F_DIVERGENCES[1:])
    for loss_type, expected in losses.items():
        actual = preference_loss(*arrays, loss_type=loss_type, label_smoothing=eps, **lengths)
        np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=1e-6, err_msg=loss_type)
    for f_divergence, expected in f_losses.items():
        actual = preference_loss(*arrays, label_smoothing=eps, f_divergence=f_divergence)
        np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=1e-6, err_msg=f_divergence)


@pytest.mark.parametrize("jit", [False, True])
def test_every_loss_type_gives_its_own_value(jit):
    arrays, lengths = _inputs(seed=1)

    def all_types(*arrays):
        return {
            lt: preference_loss(*arrays, loss_type=lt, label_smoothing=0.1, **lengths)
            for lt in PREFERENCE_LOSSES
        }

    values = (jax.jit(all_types) if jit else all_types)(*arrays)
    for a, b in itertools.combinations(PREFERENCE_LOSSES, 2):
        if {a, b} == {"sigmoid", "cdpo"}:  # documented alias at equal label smoothing
            np.testing.assert_array_equal(values[a], values[b])
        else:
            assert not np.allclose(values[a], values[b]), (a, b)


def test_f_divergences_are_distinct_and_alpha_one_is_forward_kl(loss_fn):
    arrays, _ = _inputs(seed=2)
    values = {f: np.asarray(loss_fn(*arrays, f_divergence=f)) for f in F_DIVERGENCES}
    for a, b in itertools.combinations(F_DIVERGENCES, 2):
        assert not np.allclose(values[a], values[b]), (a, b)
    np.testing.assert_allclose(
        loss_fn(*arrays, f_divergence="alpha", f_alpha=1.0), values["forward_kl"], rtol=1e-6
    )
    with pytest.raises(ValueError, match="margin-based"):
        loss_fn(
            *arrays,
            loss_type="ipo",
            f_divergence="js",
            chosen_lengths=jnp.ones(B),
            rejected_lengths=jnp.ones(B),
        )


@pytest.mark.parametrize("jit, dtype", [(True, jnp.float32), (False, jnp.bfloat16)])
def test_every_loss_is_finite_for_extreme_log_probs(jit, dtype):
    chosen = jnp.array([-1e4, 0.0, -1e-6, -5e3], dtype)
    rejected = jnp.array([0.0, -1e4, -1e-6, -1.0], dtype)
    refs = jnp.array([0.0, -1e4, -3e3, -1e-6], dtype), jnp.array([-1e4, 0.0, -1.0, -5e3], dtype)
    lengths = dict(
        chosen_lengths=jnp.array([1, 4096, 3, 0]), rejected_lengths=jnp.array([4096, 1, 2, 5])
    )
    variants = [(lt, "reverse_kl") for lt in PREFERENCE_LOSSES] + [
        ("sigmoid", f) for f in F_DIVERGENCES[1:]
    ]

    def values_and_grads(c, r):
        def loss(c, r, loss_type, f_divergence):
            kw = dict(
                loss_type=loss_type, label_smoothing=0.1, f_divergence=f_divergence, **lengths
            )
            return preference_loss(c, r, *refs, **kw).sum()

        return {v: jax.value_and_grad(loss, argnums=(0, 1))(c, r, *v) for v in variants}

    results = (jax.jit(values_and_grads) if jit else values_and_grads)(chosen, rejected)
    for variant, (value, grads) in results.items():
        assert value.dtype == jnp.float32 and np.isfinite(value), variant
        assert all(np.all(np.isfinite(np.float32(g))) for g in grads), variant


def test_aot_total_is_invariant_to_the_order_of_pairs():
    arrays, _ = _inputs(seed=4)
    permuted = [a[jnp.array([2, 0, 3, 1])] for a in arrays]
    for loss_type in ["aot", "aot_unpaired"]:
        np.testing.assert_allclose(
            preference_loss(*arrays, loss_type=loss_type).sum(),
            preference_loss(*permuted, loss_type=loss_type).sum(),
            rtol=1e-6,
        )


def test_errors_name_the_argument_and_the_valid_values():
    arrays, _ = _inputs()
    with pytest.raises(
        ValueError, match=r"unknown loss_type 'dpo'; valid values: sigmoid, cdpo, .*kto_pair, simpo"
    ):
        preference_loss(*arrays, loss_type="dpo")
    with pytest.raises(ValueError, match=r"rejected_logps must have shape \(4,\), got \(3,\)"):
        preference_loss(arrays[0], arrays[1][:3], *arrays[2:])
    with pytest.raises(ValueError, match="chosen_logps must be a floating-point array"):
        preference_loss(jnp.arange(B), *arrays[1:])
    with pytest.raises(ValueError, match="ref_chosen_logps is required for loss_type='sigmoid'"):
        preference_loss(*arrays[:2])
    with pytest.raises(ValueError, match="chosen_lengths is required for loss_type='simpo'"):
        preference_loss(*arrays, loss_type="simpo")
    with pytest.raises(ValueError, match="unknown f_divergence"):
        preference_loss(*arrays, f_divergence="hellinger")


def test_metrics_report_implicit_rewards_margins_and_accuracy():
    chosen, rejected = jnp.array([-1.0, -5.0]), jnp.array([-3.0, -2.0])
    metrics = preference_metrics(chosen, rejected, jnp.zeros(2), jnp.zeros(2), beta=0.5)
    np.testing.assert_allclose(metrics["chosen_rewards"], [-0.5, -2.5])
    np.testing.assert_allclose(metrics["margins"], [1.0, -1.5])
    np.testing.assert_array_equal(metrics["accuracies"], [1.0, 0.0])
    reference_free = preference_metrics(
        chosen, rejected, beta=1.0, chosen_lengths=[1, 5], rejected_lengths=[3, 1]
    )
    np.testing.assert_allclose(reference_free["margins"], [0.0, 1.0])


def test_kto_reference_point_is_clamped_and_detached():
    kl_logps, ref_kl_logps = jnp.array([-5.0, -6.0]), jnp.array([-4.0, -4.0])
    assert kto_reference_point(kl_logps, ref_kl_logps) == 0.0
    assert kto_reference_point(ref_kl_logps, kl_logps) == pytest.approx(1.5)
    grad = jax.grad(lambda x: kto_reference_point(x, kl_logps))(ref_kl_logps)
    np.testing.assert_array_equal(grad, 0.0)
    logps, ref = jnp.array([-3.0, -3.0]), jnp.array([-4.0, -2.0])
    desirable = jnp.array([True, False])
    grad_z = jax.grad(lambda z: kto_loss(logps, ref, desirable, reference_point=z).sum())(
        jnp.float32(0.3)
    )
    assert grad_z == 0.0


@pytest.mark.parametrize("jit", [False, True])
def test_kto_matches_its_formula_with_class_weights(jit):
    static = ("loss_type", "beta", "desirable_weight", "undesirable_weight")
    fn = jax.jit(kto_loss, static_argnames=static) if jit else kto_loss
    logps, ref = jnp.array([-3.0, -3.0, -1.0]), jnp.array([-4.0, -2.0, -1.5])
    desirable = jnp.array([1, 0, 1])
    rho, z0, sig = np.array([1.0, -1.0, 0.5]), 0.25, lambda x: 1 / (1 + np.exp(-x))
    kto = fn(
        logps,
        ref,
        desirable,
        beta=0.5,
        desirable_weight=1.0,
        undesirable_weight=1.5,
        reference_point=z0,
    )
    expected = np.where([1, 0, 1], 1 - sig(0.5 * (rho - z0)), 1.5 * (1 - sig(0.5 * (z0 - rho))))
    np.testing.assert_allclose(kto, expected, rtol=1e-6)
    apo = fn(logps, ref, desirable, loss_type="apo_zero_unpaired", beta=0.5)
    np.testing.assert_allclose(
        apo, np.where([1, 0, 1], 1 - sig(0.5 * rho), sig(0.5 * rho)), rtol=1e-6
    )
    with pytest.raises(ValueError, match="reference_point is required"):
        kto_loss(logps, ref, desirable)
