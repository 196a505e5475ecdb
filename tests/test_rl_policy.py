"""Policy losses: surrogate gradients, clipping, dual clip, exact reduction, stability."""

import inspect
import itertools
from functools import partial
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from agentic_jax import rl
from agentic_jax.rl import (
    AGGREGATIONS,
    DEFAULT_AGGREGATION,
    KL_ESTIMATORS,
    POLICY_LOSS_FUNCTIONS,
    POLICY_LOSSES,
    combine_outputs,
    grpo_loss,
    kl_penalty,
    policy_loss,
    ppo_loss,
    psum_output,
)

B, T = 4, 6
LENGTHS = np.array([6, 4, 3, 5])
MASK = jnp.asarray(np.arange(T)[None, :] < LENGTHS[:, None])
# Types whose gradient at ratio 1 is exactly −A·∇log π (the covariance variants may detach
# or penalise selected tokens even there).
SURROGATES = tuple(t for t in POLICY_LOSSES if t not in ("clip_cov", "kl_cov"))
SEQUENCE_LEVEL = ("gspo", "geo_mean")


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.1, 3.0, (B, T))
    log_ratio = rng.uniform(-1.6, 1.6, (B, T))
    log_ratio[0, :3] = [np.log(4.0), np.log(1.25), np.log(0.5)]  # dual-clip, DAPO band, low clip
    adv = rng.normal(0.0, 1.5, (B, T))
    adv[0, :3] = [-1.0, 1.0, -1.0]
    return [jnp.asarray(x, jnp.float32) for x in (logp, logp - log_ratio, adv)]


def _over_types(types, fn, jit):
    """Evaluates fn(loss_type, *args) for every type in one (optionally jitted) function."""

    def run(*args):
        return {loss_type: fn(loss_type, *args) for loss_type in types}

    return jax.jit(run) if jit else run


def _value(loss_type, logp, old_logp, adv, mask, **kw):
    return policy_loss(logp, old_logp, adv, mask, loss_type=loss_type, **kw).value


def _grads_at_ratio_one(loss_type, logp, adv):
    if loss_type in SEQUENCE_LEVEL:  # these use one advantage per sequence
        adv = jnp.broadcast_to(adv[:, :1], adv.shape)
    grad = jax.grad(lambda lp: _value(loss_type, lp, logp, adv, MASK, aggregation="token-mean"))(
        logp
    )
    return grad, -adv * MASK / MASK.sum()


_GRADS_AT_ONE = _over_types(SURROGATES, _grads_at_ratio_one, jit=True)


@given(
    logp=hnp.arrays(np.float32, (B, T), elements=st.floats(-8.0, -0.125, width=32)),
    adv=hnp.arrays(np.float32, (B, T), elements=st.floats(-3.0, 3.0, width=32)),
)
def test_gradient_at_ratio_one_is_minus_advantage(logp, adv):
    for loss_type, (grad, expected) in _GRADS_AT_ONE(logp, adv).items():
        np.testing.assert_allclose(grad, expected, atol=1e-6, err_msg=loss_type)


def test_tokens_clipped_in_the_direction_of_the_advantage_pass_no_gradient():
    logp, old_logp, adv = _batch()
    ratio, eps = np.exp(logp - old_logp), 0.2
    types = ("ppo", "grpo", "bnpo", "dr_grpo", "cispo")
    grads = _over_types(
        types,
        lambda lt, lp: jax.grad(lambda x: _value(lt, x, old_logp, adv, MASK, epsilon_high=eps))(lp),
        jit=True,
    )(logp)
    clipped = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    dual_clipped = (adv < 0) & (ratio > 3.0)
    assert clipped[MASK].sum() >= 3 and dual_clipped[MASK].sum() >= 1
    for loss_type in types[:-1]:
        frozen = clipped | dual_clipped if loss_type == "ppo" else clipped
        assert np.all(grads[loss_type][frozen] == 0.0), loss_type
        assert np.all(grads[loss_type][~frozen & MASK] != 0.0), loss_type
    # CISPO clips the weight, not the gradient: clipped tokens still learn.
    assert np.all(grads["cispo"][clipped & MASK] != 0.0)


def test_dual_clip_bounds_the_loss_for_negative_advantages():
    adv, mask, logp = jnp.full((1, 1), -2.0), jnp.ones((1, 1)), jnp.full((1, 1), -1.0)

    @jax.jit
    def losses(old):
        ppo = jax.value_and_grad(
            lambda lp: policy_loss(lp, old, adv, mask, loss_type="ppo", dual_clip=3.0).value
        )
        return ppo(logp), policy_loss(logp, old, adv, mask, loss_type="grpo").value

    for log_ratio in [np.log(3.5), 5.0, 19.0, 50.0]:
        (ppo, ppo_grad), grpo = losses(jnp.full((1, 1), -log_ratio - 1.0))
        assert ppo == pytest.approx(3.0 * 2.0) and grpo > ppo and ppo_grad == 0.0
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, logp, adv, mask, loss_type="ppo", dual_clip=0.5)


def test_dapo_decouples_the_upper_clip():
    logp, old_logp, adv = _batch()
    assert np.exp(logp - old_logp)[0, 1] == pytest.approx(1.25) and adv[0, 1] > 0

    def grad_and_metrics(loss_type, logp):
        grad = jax.grad(lambda lp: _value(loss_type, lp, old_logp, adv, MASK))(logp)
        return grad[0, 1], policy_loss(logp, old_logp, adv, MASK, loss_type=loss_type).metrics

    results = _over_types(("grpo", "dapo"), grad_and_metrics, jit=True)(logp)
    assert results["grpo"][0] == 0.0 and results["dapo"][0] != 0.0
    assert results["dapo"][1]["clip_frac_high"] == results["grpo"][1]["clip_frac_high"] - 1


@pytest.mark.parametrize("jit", [False, True])
def test_every_loss_type_gives_its_own_value(jit):
    logp, old_logp, adv = _batch()
    values = _over_types(POLICY_LOSSES, _value, jit)(logp, old_logp, adv, MASK)
    for a, b in itertools.combinations(POLICY_LOSSES, 2):
        assert not np.isclose(values[a], values[b], rtol=1e-5), (a, b)


def _numpy_values(logp, old_logp, adv, mask):
    """Independent float64 loss values from the papers' formulas (ε = 0.2, dual clip 3, defaults)."""
    eps, rows = 0.2, [np.flatnonzero(m) for m in mask]
    log_ratio = logp - old_logp
    ratio = np.exp(log_ratio)

    def surrogate(r, a, eps_high=eps):  # −min(ρA, clip(ρ, 1 − ε, 1 + ε_high)·A)
        return -np.minimum(r * a, np.clip(r, 1 - eps, 1 + eps_high) * a)

    def token_mean(x):
        return x[mask].mean()

    def seq_mean(x):
        return np.mean([x[b, idx].mean() for b, idx in enumerate(rows)])

    ppo = surrogate(ratio, adv)
    ppo = np.where(adv < 0, np.minimum(ppo, -3.0 * adv), ppo)
    seq_ratio = np.array([np.exp(log_ratio[b, idx].mean()) for b, idx in enumerate(rows)])
    seq_adv = np.array([adv[b, idx].mean() for b, idx in enumerate(rows)])
    # GMPO clips log ρ on the side the advantage pushes it: above for A > 0, below for A < 0.
    gmpo_log_ratio = np.where(adv > 0, np.minimum(log_ratio, eps), np.maximum(log_ratio, -eps))
    gmpo = [-seq_adv[b] * np.exp(gmpo_log_ratio[b, idx].mean()) for b, idx in enumerate(rows)]
    tau = np.where(adv > 0, 1.0, 1.05)
    return {
        "ppo": token_mean(ppo),
        "grpo": seq_mean(surrogate(ratio, adv)),
        "bnpo": token_mean(surrogate(ratio, adv)),
        "dr_grpo": surrogate(ratio, adv)[mask].sum() / (mask.shape[1] * mask.shape[0]),
        "dapo": token_mean(surrogate(ratio, adv, eps_high=0.28)),
        "gspo": np.mean(surrogate(seq_ratio, seq_adv)),
        "gspo_token": seq_mean(surrogate(seq_ratio[:, None], adv)),
        "cispo": token_mean(-np.clip(ratio, 1 - eps, 1 + eps) * adv * logp),
        "sapo": seq_mean(-(4 / tau) / (1 + np.exp(-tau * (ratio - 1))) * adv),
        "gpg": token_mean(-adv * logp),
        "geo_mean": np.mean(gmpo),
    }


def test_loss_values_match_a_float64_reference():
    logp, old_logp, adv = _batch(seed=6)
    mask = np.asarray(MASK)
    expected = _numpy_values(*[np.float64(x) for x in (logp, old_logp, adv)], mask)
    sequence_adv = np.float64(adv[:, :1]) * np.ones(
        (B, T)
    )  # GSPO and GMPO take one advantage per sequence
    for name in SEQUENCE_LEVEL:
        expected[name] = _numpy_values(np.float64(logp), np.float64(old_logp), sequence_adv, mask)[
            name
        ]
    actual = _over_types(tuple(expected), _value, jit=True)(logp, old_logp, adv, MASK)
    actual.update(
        _over_types(SEQUENCE_LEVEL, _value, jit=True)(
            logp, old_logp, jnp.float32(sequence_adv), MASK
        )
    )
    for loss_type, value in expected.items():
        np.testing.assert_allclose(actual[loss_type], value, rtol=1e-5, err_msg=loss_type)


def test_gspo_token_equals_gspo_for_sequence_level_advantages():
    logp, old_logp, adv = _batch()

    def value_and_grad(loss_type, advantages):
        return jax.value_and_grad(lambda lp: _value(loss_type, lp, old_logp, advantages, MASK))(
            logp
        )

    run = _over_types(("gspo", "gspo_token"), value_and_grad, jit=True)
    for advantages in (adv[:, 0], jnp.broadcast_to(adv[:, :1], (B, T))):
        (value, grad), (token_value, token_grad) = run(advantages).values()
        np.testing.assert_allclose(value, token_value, rtol=1e-6)
        np.testing.assert_allclose(grad, token_grad, rtol=1e-5, atol=1e-7)
    # With mixed-sign advantages inside a sequence, the token form differs (see the distinctness test).


def test_micro_batches_reduce_exactly():
    logp, old_logp, adv = _batch(seed=5)
    ref = logp + 0.3
    entropy = jnp.abs(adv)

    def outputs(loss_type, logp, old_logp, adv, mask, ref, entropy):
        kw = dict(
            loss_type=loss_type, ref_logp=ref, kl_coef=0.1, entropy=entropy, entropy_coef=0.01
        )
        whole = policy_loss(logp, old_logp, adv, mask, **kw)
        parts = [
            policy_loss(
                *(x[s] for x in (logp, old_logp, adv, mask)),
                **{**kw, "ref_logp": ref[s], "entropy": entropy[s]},
            )
            for s in (slice(0, 1), slice(1, 4))
        ]
        return whole, combine_outputs(parts)

    types = (
        "ppo",
        "grpo",
        "dr_grpo",
        "gspo",
        "geo_mean",
        "sapo",
    )  # every aggregation and sequence path
    results = _over_types(types, outputs, jit=True)(logp, old_logp, adv, MASK, ref, entropy)
    for loss_type, (whole, combined) in results.items():
        np.testing.assert_allclose(combined.value, whole.value, rtol=1e-5, err_msg=loss_type)
        for key in whole.metrics:
            np.testing.assert_allclose(
                combined.metrics[key], whole.metrics[key], rtol=1e-5, err_msg=key
            )


def test_data_parallel_shards_reduce_exactly():
    rng = np.random.default_rng(1)
    logp = jnp.asarray(-rng.uniform(0.1, 3, (16, T)), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.3, (16, T)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=16), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(16, T)) > 0.3)
    mesh = jax.make_mesh((8,), ("data",))
    sharded = [jax.device_put(x, NamedSharding(mesh, P("data"))) for x in (logp, old, adv, mask)]
    types = ("grpo", "dr_grpo", "gspo")

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=P("data"), out_specs=P())
    def reduced(*shard):
        return {t: psum_output(policy_loss(*shard, loss_type=t), "data") for t in types}

    whole = _over_types(types, lambda t, *args: policy_loss(*args, loss_type=t), jit=True)(
        logp, old, adv, mask
    )
    for loss_type, out in reduced(*sharded).items():
        np.testing.assert_allclose(out.value, whole[loss_type].value, rtol=1e-5, err_msg=loss_type)
        for key in ("ratio_min", "ratio_max", "clip_frac_low", "tokens"):
            np.testing.assert_allclose(
                out.metrics[key], whole[loss_type].metrics[key], rtol=1e-6, err_msg=key
            )


def test_packed_sequences_match_padded_ones():
    logp, old_logp, adv = _batch(seed=2)
    # Rows 1 (4 tokens) and 2 (3 tokens) of the padded batch, packed into one row of 7 + padding.
    packed = [
        jnp.concatenate([x[1, :4], x[2, :3], jnp.zeros(1)])[None] for x in (logp, old_logp, adv)
    ]
    segment_ids = jnp.array([[0, 0, 0, 0, 1, 1, 1, 0]])
    packed_mask = jnp.array([[1, 1, 1, 1, 1, 1, 1, 0]])
    types = ("grpo", "gspo", "geo_mean", "dr_grpo")

    def both(loss_type):
        padded = policy_loss(
            logp[1:3], old_logp[1:3], adv[1:3], MASK[1:3], loss_type=loss_type, max_length=8
        )
        pack = policy_loss(
            *packed, packed_mask, loss_type=loss_type, segment_ids=segment_ids, max_length=8
        )
        return padded, pack

    for loss_type, (padded, pack) in _over_types(types, both, jit=True)().items():
        np.testing.assert_allclose(pack.value, padded.value, rtol=1e-5, err_msg=loss_type)
        assert pack.count == padded.count == 2


@pytest.mark.parametrize("jit", [False, True])
def test_finite_for_extreme_log_probs_and_all_zero_masks(jit):
    logp = jnp.array([[-1e4, 0.0, -1e-6], [-30.0, -1e4, 0.0]])
    old = jnp.array([[0.0, -1e4, -1e-6], [-1e4, -1e-6, -jnp.inf]])
    adv = jnp.array([[5.0, -5.0, 1.0], [-1.0, 2.0, 0.0]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    ref = jnp.array([[0.0, -1e4, -50.0], [-1e-6, 0.0, jnp.nan]])

    def check(loss_type, logp, mask):
        def value(lp):
            out = policy_loss(lp, old, adv, mask, loss_type=loss_type, ref_logp=ref, kl_coef=0.1)
            return out.value, out.metrics

        if not jit:  # eager gradients of every variant cost more compile time than they add
            return value(logp), jnp.zeros_like(logp)
        return jax.value_and_grad(value, has_aux=True)(logp)

    run = _over_types(POLICY_LOSSES, check, jit)
    for mask_case in (mask, jnp.zeros_like(mask)):
        for loss_type, ((value, metrics), grad) in run(logp, mask_case).items():
            assert np.isfinite(value) and np.all(np.isfinite(grad)), loss_type
            assert all(np.isfinite(m) for m in metrics.values()), loss_type
            if not mask_case.any():
                assert value == 0.0 and np.all(grad == 0.0), loss_type


def test_kl_and_entropy_terms_enter_the_loss():
    logp, old_logp, adv = _batch(seed=3)
    ref = logp - 0.4
    entropy = jnp.full((B, T), 2.0)
    base = policy_loss(logp, old_logp, adv, MASK, loss_type="bnpo").value
    kl = np.sum(kl_penalty(logp, ref, "k3") * MASK) / MASK.sum()
    with_kl = policy_loss(logp, old_logp, adv, MASK, loss_type="bnpo", ref_logp=ref, kl_coef=0.5)
    np.testing.assert_allclose(with_kl.value, base + 0.5 * kl, rtol=1e-5)
    np.testing.assert_allclose(with_kl.metric_means()["kl"], kl, rtol=1e-5)
    with_entropy = policy_loss(
        logp, old_logp, adv, MASK, loss_type="bnpo", entropy=entropy, entropy_coef=0.01
    )
    np.testing.assert_allclose(with_entropy.value, base - 0.02, rtol=1e-5)
    with pytest.raises(ValueError, match="ref_logp is required when kl_coef is non-zero"):
        policy_loss(logp, old_logp, adv, MASK, kl_coef=0.1)


def test_metrics_count_clipped_tokens_and_ratio_range():
    logp, old_logp, adv = _batch()
    ratio = np.exp(logp - old_logp)
    out = policy_loss(logp, old_logp, adv, MASK, loss_type="ppo")
    means = out.metric_means()
    assert means["tokens"] == MASK.sum()
    np.testing.assert_allclose(
        means["clip_frac_low"], np.mean(((adv < 0) & (ratio < 0.8))[MASK]), rtol=1e-6
    )
    np.testing.assert_allclose(
        means["clip_frac_high"], np.mean(((adv > 0) & (ratio > 1.2))[MASK]), rtol=1e-6
    )
    np.testing.assert_allclose(out.metrics["ratio_max"], ratio[MASK].max(), rtol=1e-5)
    np.testing.assert_allclose(out.metrics["ratio_min"], ratio[MASK].min(), rtol=1e-5)
    np.testing.assert_allclose(
        means["approx_kl"], np.mean((ratio - 1 - np.log(ratio))[MASK]), rtol=1e-4
    )


def test_clip_cov_randomises_its_selection_with_a_key():
    logp, old_logp, adv = _batch(seed=4)
    kw = dict(loss_type="clip_cov", cov_fraction=0.2, clip_cov_bounds=(-10.0, 10.0))
    a = policy_loss(logp, old_logp, adv, MASK, key=jax.random.key(0), **kw).value
    b = policy_loss(logp, old_logp, adv, MASK, key=jax.random.key(1), **kw).value
    deterministic = policy_loss(logp, old_logp, adv, MASK, **kw).value
    assert (
        a != b and deterministic != policy_loss(logp, old_logp, adv, MASK, loss_type="bnpo").value
    )


def _covariance_reference(logp, old_logp, adv, mask, fraction):
    """float64 clip_cov (by highest covariance, no key, covariance bounds admitting every token)
    and kl_cov losses: verl's selection of max(1, ⌊fraction·n_valid⌋) tokens (Cui et al. 2025)."""
    valid = mask > 0
    ratio = np.exp(logp - old_logp)
    cov = (adv - adv[valid].mean()) * (logp - logp[valid].mean())
    count = max(1, int(fraction * valid.sum()))

    def top(eligible):
        index = np.flatnonzero(eligible)
        selected = np.zeros(cov.size, bool)
        selected[index[np.argsort(-cov.ravel()[index])[:count]]] = True
        return selected.reshape(cov.shape)

    surrogate = -np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv)
    clipped = np.clip(ratio, 0.8, 1.2) * adv < ratio * adv
    return {
        "clip_cov": np.where(top(valid & ~clipped), 0.0, surrogate)[valid].mean(),
        "kl_cov": (-adv * ratio + np.where(top(valid), np.abs(np.log(ratio)), 0.0))[valid].mean(),
    }


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    lengths=st.lists(st.integers(1, 8), min_size=4, max_size=4),
    fraction=st.integers(1, 40).map(lambda k: k / 64),
)  # k/64: exact in float32 and float64
def test_covariance_selection_counts_valid_tokens_not_padding(seed, lengths, fraction):
    rng = np.random.default_rng(seed)
    shape = (4, 8)
    logp = -rng.uniform(0.1, 3.0, shape)
    old_logp = logp - rng.uniform(-0.5, 0.5, shape)
    adv = rng.normal(size=shape)
    mask = np.arange(8)[None, :] < np.asarray(lengths)[:, None]
    expected = _covariance_reference(logp, old_logp, adv, mask, fraction)
    for loss_type, value in expected.items():
        actual = policy_loss(
            *(jnp.float32(x) for x in (logp, old_logp, adv)),
            jnp.asarray(mask),
            loss_type=loss_type,
            cov_fraction=fraction,
            clip_cov_bounds=(-10.0, 10.0),
        ).value
        np.testing.assert_allclose(actual, value, rtol=1e-5, err_msg=loss_type)


def test_errors_name_the_argument_and_the_valid_values():
    logp, old_logp, adv = _batch()
    with pytest.raises(
        ValueError, match=r"unknown loss_type 'reinforce'; valid values: ppo, grpo, .*kl_cov"
    ):
        policy_loss(logp, old_logp, adv, MASK, loss_type="reinforce")
    with pytest.raises(ValueError, match=r"advantages must have shape \(4,\), got \(3,\)"):
        policy_loss(logp, old_logp, adv[:3, 0], MASK)
    with pytest.raises(ValueError, match=r"old_logp must have shape \(4, 6\)"):
        policy_loss(logp, old_logp[:, :5], adv, MASK)
    with pytest.raises(ValueError, match="logp must be a floating-point array"):
        policy_loss(jnp.zeros((B, T), jnp.int32), old_logp, adv, MASK)
    with pytest.raises(ValueError, match="unknown aggregation mode 'mean'"):
        policy_loss(logp, old_logp, adv, MASK, aggregation="mean")
    with pytest.raises(ValueError, match="unknown kl_estimator"):
        policy_loss(logp, old_logp, adv, MASK, kl_estimator="k4")
    with pytest.raises(ValueError, match=r"advantages must be per token \[B, T\] with segment_ids"):
        policy_loss(logp, old_logp, adv[:, 0], MASK, segment_ids=jnp.zeros((B, T), jnp.int32))
    with pytest.raises(ValueError, match="cov_fraction"):
        policy_loss(logp, old_logp, adv, MASK, loss_type="kl_cov", cov_fraction=2.0)


# --- One public function per loss type; policy_loss dispatches to them -----------------------

SHARED_OPTIONS = {
    "epsilon",
    "epsilon_high",
    "aggregation",
    "max_length",
    "segment_ids",
    "ref_logp",
    "kl_coef",
    "kl_estimator",
    "entropy",
    "entropy_coef",
}
OWN_OPTIONS = {
    "ppo": {"dual_clip"},
    "sapo": {"sapo_tau_pos", "sapo_tau_neg"},
    "clip_cov": {"cov_fraction", "clip_cov_bounds", "key"},
    "kl_cov": {"cov_fraction", "kl_cov_coef"},
}


def _options_of(loss_type):
    return SHARED_OPTIONS | OWN_OPTIONS.get(loss_type, set())


def test_one_public_function_per_loss_type_with_only_its_own_options():
    docs = (Path(__file__).parents[1] / "docs" / "rl_losses.md").read_text()
    assert tuple(POLICY_LOSS_FUNCTIONS) == POLICY_LOSSES
    for loss_type, fn in POLICY_LOSS_FUNCTIONS.items():
        name = f"{loss_type}_loss"
        assert getattr(rl, name) is fn and name in rl.__all__, name
        parameters = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in parameters[:4]] == ["logp", "old_logp", "advantages", "mask"]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[4:]), name
        assert {p.name for p in parameters[4:]} == _options_of(loss_type), name
        assert "arXiv:" in fn.__doc__ and "ℓ" in fn.__doc__, name
        assert f"`{name}(" in docs, name


def test_default_aggregations_are_the_functions_defaults():
    assert DEFAULT_AGGREGATION == {
        "ppo": "token-mean",
        "grpo": "seq-mean-token-mean",
        "bnpo": "token-mean",
        "dr_grpo": "seq-mean-token-sum-norm",
        "dapo": "token-mean",
        "gspo": "seq-mean-token-mean",
        "gspo_token": "seq-mean-token-mean",
        "cispo": "token-mean",
        "sapo": "seq-mean-token-mean",
        "gpg": "token-mean",
        "geo_mean": "seq-mean-token-mean",
        "clip_cov": "token-mean",
        "kl_cov": "token-mean",
    }


def test_policy_loss_ignores_the_options_of_other_types_and_rejects_unknown_ones():
    logp, old_logp, adv = _batch()
    others = dict(
        dual_clip=1.5, sapo_tau_pos=9.0, cov_fraction=0.5, kl_cov_coef=7.0, key=jax.random.key(0)
    )
    chex.assert_trees_all_equal(
        policy_loss(logp, old_logp, adv, MASK, loss_type="grpo", aggregation=None, **others),
        grpo_loss(logp, old_logp, adv, MASK),
    )
    chex.assert_trees_all_equal(
        policy_loss(logp, old_logp, adv, MASK, loss_type="ppo", dual_clip=1.5),
        ppo_loss(logp, old_logp, adv, MASK, dual_clip=1.5),
    )
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) epsilon_low"):
        policy_loss(logp, old_logp, adv, MASK, epsilon_low=0.1)
    with pytest.raises(TypeError, match="dual_clip"):
        grpo_loss(logp, old_logp, adv, MASK, dual_clip=3.0)
    # An ignored option is still range-checked: a bad value never passes unseen.
    for bad in ({"dual_clip": 0.5}, {"sapo_tau_neg": 0.0}, {"cov_fraction": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            policy_loss(logp, old_logp, adv, MASK, loss_type="grpo", **bad)


@st.composite
def _policy_cases(draw):
    """Inputs and options, for every loss type at once: arrays, static options, array options."""
    batch, length = draw(st.sampled_from([(1, 1), (2, 3), (3, 5)]))

    def tokens(low, high):
        elements = st.floats(low, high, width=32)
        return draw(hnp.arrays(np.float32, (batch, length), elements=elements))

    logp = tokens(-6.0, -0.125)
    old_logp = logp + tokens(-1.5, 1.5)
    adv = tokens(-3.0, 3.0)
    per_sequence = draw(st.booleans())
    mask = draw(hnp.arrays(np.bool_, (batch, length)))
    with_ref, with_entropy = draw(st.booleans()), draw(st.booleans())
    static = dict(
        epsilon=draw(st.sampled_from([0.1, 0.2])),
        epsilon_high=draw(st.sampled_from([None, 0.3])),
        aggregation=draw(st.sampled_from([None, *AGGREGATIONS])),
        max_length=draw(st.sampled_from([None, length + 2])),
        kl_coef=0.1 if with_ref else 0.0,
        kl_estimator=draw(st.sampled_from(KL_ESTIMATORS)),
        entropy_coef=draw(st.sampled_from([0.0, 0.01])),
        dual_clip=draw(st.sampled_from([None, 3.0])),
        sapo_tau_pos=draw(st.sampled_from([1.0, 2.0])),
        sapo_tau_neg=draw(st.sampled_from([1.05, 0.5])),
        cov_fraction=draw(st.sampled_from([0.2, 0.5])),
        clip_cov_bounds=draw(st.sampled_from([(1.0, 5.0), (-10.0, 10.0)])),
        kl_cov_coef=draw(st.sampled_from([0.5, 1.0])),
    )
    arrays = dict(
        ref_logp=logp + tokens(-1.0, 1.0) if with_ref else None,
        entropy=np.abs(tokens(0.0, 3.0)) if with_entropy else None,
        key=jax.random.key(draw(st.integers(0, 3))) if draw(st.booleans()) else None,
        segment_ids=None if per_sequence else np.zeros((batch, length), np.int32),
    )
    return (logp, old_logp, adv[:, 0] if per_sequence else adv, mask), static, arrays


class PolicyLossFunctionsTest(chex.TestCase):
    """Each public loss function equals policy_loss(loss_type=...), with and without jit."""

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=4)
    @given(case=_policy_cases())
    def test_each_function_equals_policy_loss(self, case):
        inputs, static, arrays = case

        def direct_and_dispatched(inputs, arrays):
            options = {**static, **arrays}
            results = {}
            for loss_type, fn in POLICY_LOSS_FUNCTIONS.items():
                own = {
                    name: value
                    for name, value in options.items()
                    if name in _options_of(loss_type) and (name, value) != ("aggregation", None)
                }
                results[loss_type] = (
                    fn(*inputs, **own),
                    policy_loss(*inputs, loss_type=loss_type, **options),
                )
            return results

        results = self.variant(direct_and_dispatched)(inputs, arrays)
        for loss_type, (direct, dispatched) in results.items():
            chex.assert_trees_all_equal(direct, dispatched, custom_message=loss_type)
            chex.assert_shape((direct.total, direct.count), ())
            chex.assert_type(direct.total, jnp.float32)
            chex.assert_tree_all_finite(direct)
