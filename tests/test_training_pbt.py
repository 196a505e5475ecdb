"""Population-based training: exploit/explore's rules as properties, and on a problem whose best
learning rate is known PBT's population ends better than the same population left alone."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.training.pbt import (
    PBTConfig,
    Range,
    exploit_explore,
    population_based_training,
    set_hyperparams,
)

SPACE = {"learning_rate": Range(1e-3, 1.0, log=True), "momentum": Range(0.0, 0.9)}


@settings(max_examples=15, deadline=None)
@given(
    population=st.integers(2, 6),
    truncation=st.sampled_from([0.1, 0.25, 0.5]),
    resample=st.sampled_from([0.0, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_only_the_bottom_exploits_the_top_and_explores_within_bounds(
    population, truncation, resample, seed
):
    config = PBTConfig(population=population, truncation=truncation, resample=resample)
    rng = np.random.default_rng(seed)
    scores = rng.permutation(population).astype(np.float32)  # distinct: ranks are unambiguous
    hypers = {
        "learning_rate": jnp.asarray(rng.uniform(1e-3, 1.0, population), jnp.float32),
        "momentum": jnp.asarray(rng.uniform(0.0, 0.9, population), jnp.float32),
    }
    source, new = exploit_explore(jax.random.key(seed), scores, hypers, SPACE, config)
    source = np.asarray(source)
    cut = max(1, int(population * truncation))
    ranked = np.argsort(scores)
    bottom, top = set(ranked[:cut].tolist()), set(ranked[-cut:].tolist())
    for i in range(population):
        if i in bottom:
            assert source[i] in top
        else:
            assert source[i] == i
            for name in SPACE:
                assert new[name][i] == hypers[name][i]
    for name, r in SPACE.items():
        values = np.asarray(new[name])
        assert np.all((values >= r.low - 1e-6) & (values <= r.high + 1e-6))
        if resample == 0.0:  # each replaced value is its donor's times a perturb factor, clipped
            for i in bottom:
                options = [
                    np.clip(hypers[name][source[i]] * f, r.low, r.high) for f in config.perturb
                ]
                assert np.isclose(options, values[i], rtol=1e-5).any()


def test_a_diverged_member_is_replaced():
    scores = np.array([1.0, np.nan, 3.0, 2.0], np.float32)
    hypers = {"learning_rate": jnp.ones(4), "momentum": jnp.zeros(4)}
    source, _ = exploit_explore(jax.random.key(0), scores, hypers, SPACE, PBTConfig(population=4))
    assert int(source[1]) == 2 and list(np.asarray(source)[[0, 2, 3]]) == [0, 2, 3]


def quadratic_member():
    """SGD with momentum on ||w − 1||² in 16 dimensions; score = −loss after the interval."""
    optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.0)

    def loss(w):
        return jnp.sum(jnp.square(w - 1.0))

    def init(key, hypers):
        w = jax.random.normal(key, (16,)) * 3.0
        return w, set_hyperparams(optimizer.init(w), hypers)

    def step(state, hypers, key):
        w, opt_state = state
        opt_state = set_hyperparams(opt_state, hypers)

        def sgd(carry, _):
            w, opt_state = carry
            updates, opt_state = optimizer.update(jax.grad(loss)(w), opt_state, w)
            return (optax.apply_updates(w, updates), opt_state), None

        (w, opt_state), _ = jax.lax.scan(sgd, (w, opt_state), None, 3)
        return (w, opt_state), -jnp.log(loss(w) + 1e-30)

    return init, step


def test_pbt_beats_the_same_population_left_alone_at_the_same_budget():
    init, step = quadratic_member()
    config = PBTConfig(population=8, rounds=8, truncation=0.25)
    runs = {
        explore: population_based_training(
            init, step, SPACE, jax.random.key(0), config, explore=explore, log=None
        )
        for explore in (True, False)
    }
    pbt, alone = runs[True], runs[False]
    assert pbt.scores.shape == alone.scores.shape == (8, 8)  # the same number of steps each
    assert np.median(pbt.scores[-1]) > np.median(alone.scores[-1])
    assert not (pbt.sources == np.arange(8)).all()  # somebody exploited
    assert (alone.history["learning_rate"] == alone.history["learning_rate"][0]).all()


def test_set_hyperparams_refuses_what_the_optimiser_does_not_have():
    state = optax.inject_hyperparams(optax.adam)(learning_rate=0.1).init(jnp.zeros(2))
    assert float(set_hyperparams(state, {"learning_rate": 0.5}).hyperparams["learning_rate"]) == 0.5
    with pytest.raises(ValueError, match="no hyperparameter"):
        set_hyperparams(state, {"momentum": 0.5})
    with pytest.raises(ValueError, match="inject_hyperparams"):
        set_hyperparams(optax.adam(0.1).init(jnp.zeros(2)), {"learning_rate": 0.5})


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"population": 1}, "population"),
        ({"truncation": 0.7}, "truncation"),
        ({"perturb": ()}, "perturb"),
    ],
)
def test_bad_configs_are_refused_by_name(kwargs, error):
    with pytest.raises(ValueError, match=error):
        PBTConfig(**kwargs)
