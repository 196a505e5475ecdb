"""Core env API: auto-reset, truncation bootstrap, vmap equivalence, static shapes, spaces, wrappers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax import envs, rl
from agentic_jax.envs.classic import BernoulliBandit, CartPole, chain_mdp


@struct.dataclass
class CounterState:
    count: jax.Array


class Counter(envs.Env):
    """Observation counts up by the action; terminates on reaching `goal`."""

    def __init__(self, goal=3):
        self.goal = goal

    def reset_env(self, key, params):
        return jnp.int32(0), CounterState(jnp.int32(0))

    def step_env(self, key, state, action, params):
        count = state.count + action
        return (
            count,
            CounterState(count),
            jnp.float32(1.0),
            count >= self.goal,
            jnp.bool_(False),
            {},
        )

    def observation_space(self, params=None):
        return envs.Discrete(self.goal + 1)

    def action_space(self, params=None):
        return envs.Discrete(2)


def test_auto_reset_returns_reset_obs_and_true_final_obs():
    env, key = Counter(goal=2), jax.random.key(0)
    obs, state = env.reset(key)
    obs, state, *_ = env.step(key, state, 1)
    obs, state, reward, terminated, truncated, info = env.step(key, state, 1)
    assert bool(terminated) and not bool(truncated) and float(reward) == 1.0
    assert int(obs) == 0 and int(state.count) == 0  # a fresh episode
    assert int(info["final_observation"]) == 2  # the true terminal observation
    obs, _, _, terminated, _, info = env.step(key, state, 1)
    assert int(obs) == 1 and int(info["final_observation"]) == 1 and not bool(terminated)


def test_cartpole_auto_reset_after_the_pole_falls():
    env, params, key = CartPole(), CartPole().default_params, jax.random.key(1)
    _, state = env.reset(key)
    state = state.replace(physics=jnp.array([0.0, 0.0, 0.2, 2.0]))
    obs, new_state, _, terminated, truncated, info = env.step(key, state, 1, params)
    assert bool(terminated) and not bool(truncated)
    assert float(jnp.abs(info["final_observation"][2])) > params.theta_limit
    assert float(jnp.max(jnp.abs(obs))) <= 0.05 and int(new_state.time) == 0


def test_time_limit_truncates_without_terminating_and_keeps_bootstrap():
    env = envs.TimeLimit(Counter(goal=100), max_steps=3)
    tr = envs.rollout(
        env, lambda key, obs: jnp.int32(1), jax.random.key(0), None, num_envs=2, num_steps=7
    )
    np.testing.assert_array_equal(tr.truncated[:, 0], [0, 0, 1, 0, 0, 1, 0])
    assert not bool(jnp.any(tr.terminated))
    np.testing.assert_array_equal(tr.final_obs[:, 0], [1, 2, 3, 1, 2, 3, 1])
    np.testing.assert_array_equal(tr.next_obs[:, 0], [1, 2, 0, 1, 2, 0, 1])
    # Termination on the limit step wins: the flags stay exclusive.
    tr = envs.rollout(
        envs.TimeLimit(Counter(goal=3), 3), lambda k, o: jnp.int32(1), jax.random.key(0), None, 1, 3
    )
    assert bool(tr.terminated[-1, 0]) and not bool(tr.truncated[-1, 0])


def test_bootstrap_inputs_bootstrap_on_truncation_only():
    gamma, final_value = 0.9, jnp.array([5.0, 5.0, 5.0])
    reward, discount = envs.bootstrap_inputs(
        jnp.array([1.0, 1.0, 1.0]),
        jnp.array([False, True, False]),
        jnp.array([False, False, True]),
        final_value,
        gamma,
    )
    np.testing.assert_allclose(reward, [1.0, 1.0, 1.0 + 0.9 * 5.0])
    np.testing.assert_allclose(discount, [0.9, 0.0, 0.0])
    # GAE over a truncated stream: the advantage at the cut is r + γ·V(final) − V(s).
    values = jnp.array(
        [2.0, 3.0, 4.0, 7.0]
    )  # V(obs_t) for t = 0..2, then V(next_obs_2) = V(reset obs)
    adv = rl.gae(reward, values, discount, 0.95)
    np.testing.assert_allclose(adv[2], 1.0 + 0.9 * 5.0 - 4.0, rtol=1e-6)
    np.testing.assert_allclose(adv[1], 1.0 - 3.0, rtol=1e-6)


def _trajectory(env, params, num_steps):
    """One environment, random actions from per-step keys: the reference 'alone' loop."""

    def run(key):
        key_reset, key_run = jax.random.split(key)
        obs, state = env.reset(key_reset, params)

        def body(carry, step_key):
            obs, state = carry
            key_action, key_step = jax.random.split(step_key)
            action = env.action_space(params).sample(key_action)
            next_obs, state, reward, terminated, truncated, info = env.step(
                key_step, state, action, params
            )
            return (next_obs, state), (
                obs,
                action,
                reward,
                terminated,
                truncated,
                info["final_observation"],
            )

        return jax.lax.scan(body, (obs, state), jax.random.split(key_run, num_steps))[1]

    return run


def test_vmap_over_1_7_1024_matches_each_environment_alone():
    env = envs.TimeLimit(CartPole(), 25)
    run = _trajectory(env, env.default_params, 40)
    keys = jax.random.split(jax.random.key(0), 1024)
    alone = jax.jit(lambda ks: jax.lax.map(run, ks))(keys)  # unbatched body, one env at a time
    assert (
        int(jnp.sum(alone[3])) > 0 and int(jnp.sum(alone[4])) > 0
    )  # both kinds of episode end occur
    for num_envs in (1, 7, 1024):
        batched = jax.jit(jax.vmap(run))(keys[:num_envs])
        assert batched[0].shape == (num_envs, 40, 4)
        for got, want in zip(batched, alone, strict=True):
            np.testing.assert_allclose(got, want[:num_envs], rtol=1e-5, atol=1e-6)


def test_vectorized_with_batched_params():
    env = envs.Vectorized(BernoulliBandit(probs=(0.0, 1.0)), batched_params=True)
    params = BernoulliBandit().default_params.replace(
        probs=jnp.array([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    )
    keys = jax.random.split(jax.random.key(0), 3)
    _, state = env.reset(keys, params)
    _, _, reward, terminated, _, _ = env.step(keys, state, jnp.array([1, 1, 0]), params)
    np.testing.assert_array_equal(reward, [1.0, 0.0, 1.0])
    assert bool(jnp.all(terminated))


def test_step_jit_compiles_once_with_static_shapes():
    env, traces = chain_mdp(6), []

    def step(key, state, action):
        traces.append(1)
        return env.step(key, state, action)

    step = jax.jit(step)
    obs, state = env.reset(jax.random.key(0))
    for i in range(5):
        new_obs, state, reward, _terminated, _truncated, _info = step(
            jax.random.key(i), state, jnp.int32(i % 2)
        )
        assert new_obs.shape == obs.shape and new_obs.dtype == obs.dtype and reward.shape == ()
    assert len(traces) == 1
    out_shapes = jax.eval_shape(
        CartPole().step, jax.random.key(0), CartPole().reset(jax.random.key(0))[1], 0
    )
    assert out_shapes[0].shape == CartPole().observation_space().shape


def test_rollout_shapes_and_continuity():
    env = envs.EpisodeStatistics(envs.TimeLimit(CartPole(), 30))
    tr = jax.jit(envs.rollout, static_argnums=(0, 1, 4, 5))(
        env,
        lambda key, obs: jax.random.bernoulli(key).astype(jnp.int32),
        jax.random.key(3),
        None,
        5,
        70,
    )
    assert tr.obs.shape == (70, 5, 4) and tr.action.shape == (70, 5) and tr.reward.shape == (70, 5)
    np.testing.assert_array_equal(tr.obs[1:], tr.next_obs[:-1])
    same = ~tr.done[..., None]
    np.testing.assert_array_equal(jnp.where(same, tr.final_obs, 0), jnp.where(same, tr.next_obs, 0))
    # Episode statistics: every finished episode paid 1 per step.
    done = tr.info["episode_done"]
    assert int(done.sum()) >= 5
    np.testing.assert_array_equal(
        tr.info["episode_return"][done], tr.info["episode_length"][done].astype(jnp.float32)
    )
    assert int(tr.info["episode_length"][done].max()) <= 30


def test_policy_params_and_extras():
    env = BernoulliBandit(probs=(0.0, 1.0))

    def policy(arm, key, obs):
        return envs.ActionOutput(arm, {"logp": jnp.float32(-1.0)})

    tr = envs.rollout(env, policy, jax.random.key(0), None, 4, 3, policy_params=jnp.int32(1))
    assert bool(jnp.all(tr.reward == 1.0)) and tr.extras["logp"].shape == (3, 4)


def test_transform_wrappers():
    one_hot = envs.TransformObservation(
        Counter(goal=2), lambda o: jax.nn.one_hot(o, 3), envs.Box(0, 1, (3,))
    )
    env = envs.TransformReward(one_hot, lambda r: 2 * r)
    tr = envs.rollout(env, lambda key, obs: jnp.int32(1), jax.random.key(0), None, 1, 3)
    np.testing.assert_array_equal(tr.obs[:, 0], jnp.eye(3)[jnp.array([0, 1, 0])])
    np.testing.assert_array_equal(tr.final_obs[1, 0], [0.0, 0.0, 1.0])
    assert bool(jnp.all(tr.reward == 2.0)) and env.observation_space().shape == (3,)
    assert env.unwrapped.goal == 2
    with pytest.raises(TypeError, match="outside"):
        envs.TimeLimit(envs.EpisodeStatistics(Counter()), 5).reset(jax.random.key(0))
    # Statistics of a batch would start as scalars and come back as [N] arrays (a scan carry mismatch).
    with pytest.raises(TypeError, match="Vectorized\\(EpisodeStatistics"):
        envs.EpisodeStatistics(envs.Vectorized(Counter()))


SPACES = [
    envs.Discrete(5),
    envs.MultiDiscrete([3, 4, 2]),
    envs.Tokens(vocab_size=7, length=6),
    envs.Box(-1.0, 3.0, (4, 2)),
    envs.Box(-jnp.inf, jnp.inf, (3,)),
    envs.Box([0.0, -jnp.inf], [1.0, 0.0], (2,)),
    envs.Dict({"tokens": envs.Tokens(7, 6), "position": envs.Discrete(6)}),
]
_sample_and_check = jax.jit(lambda key: [space.contains(space.sample(key)) for space in SPACES])


@given(st.integers(0, 2**31 - 1))
def test_spaces_sample_inside(seed):
    assert all(bool(inside) for inside in _sample_and_check(jax.random.key(seed)))


def test_spaces_reject_outside():
    assert not bool(envs.Discrete(5).contains(5)) and not bool(envs.Discrete(5).contains(-1))
    assert not bool(envs.Discrete(5).contains(jnp.zeros((2,), jnp.int32)))
    assert not bool(envs.Tokens(7, 6).contains(jnp.full((6,), 7)))
    assert not bool(envs.Tokens(7, 6).contains(jnp.zeros((5,), jnp.int32)))
    assert not bool(envs.Box(-1.0, 1.0, (2,)).contains(jnp.array([0.0, 1.5])))
    assert not bool(envs.Box(-1.0, 1.0, (2,)).contains(jnp.zeros((3,))))
    assert not bool(SPACES[-1].contains({"tokens": jnp.zeros((6,), jnp.int32)}))


def test_space_validation():
    with pytest.raises(ValueError):
        envs.Discrete(0)
    with pytest.raises(ValueError):
        envs.Tokens(vocab_size=4, length=3, pad_id=4)
    with pytest.raises(ValueError):
        envs.Box(1.0, 0.0, (2,))
