"""Environment and classic-agent benchmarks: JAX-native loops vs Python loops, PPO seeds.

    python -m bench.envs                 # steps/s for 1, 64, 1024, 8192 envs; PPO 1 vs 16 seeds
    python -m bench.envs --quick         # tiny sizes, a smoke test
    python -m bench.envs --plot docs/envs_learning_curves.png   # also the agents' learning curves

Steps per second on CartPole (random actions, auto-reset included):
* "jax scan": `envs.rollout` — `vmap` over environments inside one `lax.scan`
  over time, one jitted program (timed after compilation);
* "py jit": a Python loop over steps and environments, calling the *jitted*
  single-environment `env.step` once per environment per step (gym style);
* "py eager": the same loop with the un-jitted `env.step` (op-by-op dispatch),
  measured for 1 environment only (it is the same per-step cost at any N).
Python-loop rates are measured on a few thousand steps and do not depend on N.

PPO on CartPole (`PPOConfig()` defaults: 16 envs × 128 steps × 30 updates =
61,440 steps per seed): compile and run time for 1 seed and for 16 seeds
vmapped in one program, and how many seeds reach a greedy return ≥ 475 (CartPole-v1 solved).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax import classic_rl, envs
from agentic_jax.envs.classic import BernoulliBandit, CartPole, chain_mdp, value_iteration
from pallas_kernels.benchmarking import describe_device

SOLVED = 475.0  # CartPole-v1 threshold


def random_policy(key, obs):
    return jax.random.bernoulli(key).astype(jnp.int32)


def jax_steps_per_second(env, num_envs: int, num_steps: int) -> float:
    def run(key):  # reduce over the observations so that XLA cannot drop the dynamics
        traj = envs.rollout(env, random_policy, key, None, num_envs, num_steps)
        return traj.final_obs.sum() + traj.done.sum()

    run = jax.jit(run)
    jax.block_until_ready(run(jax.random.key(0)))
    start = time.perf_counter()
    jax.block_until_ready(run(jax.random.key(1)))
    return num_envs * num_steps / (time.perf_counter() - start)


def python_steps_per_second(env, step_fn, num_envs: int, num_steps: int) -> float:
    keys = list(jax.random.split(jax.random.key(0), num_envs * (num_steps + 1)))
    states = [env.reset(k)[1] for k in keys[:num_envs]]
    actions = np.random.default_rng(0).integers(2, size=(num_steps, num_envs)).tolist()
    jax.block_until_ready(step_fn(keys[0], states[0], 0))  # warm-up (compiles the jitted variant)
    start = time.perf_counter()
    for t in range(num_steps):
        for i in range(num_envs):
            _, states[i], *_ = step_fn(keys[num_envs * (t + 1) + i], states[i], actions[t][i])
    jax.block_until_ready(states)
    return num_envs * num_steps / (time.perf_counter() - start)


def bench_steps(quick: bool):
    env = CartPole()
    print(
        "\nCartPole steps/s (random policy, auto-reset); py loops measured once, independent of N"
    )
    py_jit = python_steps_per_second(env, jax.jit(env.step), 4, 50 if quick else 500)
    py_eager = python_steps_per_second(env, env.step, 1, 20 if quick else 100)
    print(
        f"{'envs':>6} {'jax scan':>14} {'py jit':>10} {'py eager':>10} {'vs py jit':>10} {'vs eager':>10}"
    )
    for num_envs in (1, 64, 1024, 8192):
        num_steps = max(64 if quick else 512, (2**14 if quick else 2**21) // num_envs)
        rate = jax_steps_per_second(env, num_envs, num_steps)
        print(
            f"{num_envs:>6} {rate:>14,.0f} {py_jit:>10,.0f} {py_eager:>10,.0f} "
            f"{rate / py_jit:>9,.0f}x {rate / py_eager:>9,.0f}x"
        )


def bench_ppo(quick: bool):
    config = classic_rl.PPOConfig(num_updates=3 if quick else 30)
    train = classic_rl.make_ppo(CartPole(), config)
    greedy = jax.jit(
        jax.vmap(
            lambda p, k: classic_rl.evaluate(CartPole(), classic_rl.greedy_policy, p, k, 8, 1000)
        )
    )
    steps = config.num_envs * config.num_steps * config.num_updates
    print(
        f"\nPPO on CartPole, {steps:,} env steps per seed; solved = greedy return >= {SOLVED:.0f}"
    )
    print(
        f"{'seeds':>6} {'compile s':>10} {'run s':>8} {'s/seed':>8} {'steps/s':>12} {'solved':>7} "
        f"{'greedy return':>14}"
    )
    for num_seeds in (1, 16):
        fn = jax.jit(jax.vmap(train))
        keys = jax.random.split(jax.random.key(0), num_seeds)
        start = time.perf_counter()
        compiled = fn.lower(keys).compile()
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        params, _ = jax.block_until_ready(compiled(keys))
        run_s = time.perf_counter() - start
        returns = np.asarray(greedy(params, jax.random.split(jax.random.key(1), num_seeds)))
        print(
            f"{num_seeds:>6} {compile_s:>10.1f} {run_s:>8.2f} {run_s / num_seeds:>8.3f} "
            f"{steps * num_seeds / run_s:>12,.0f} {int(np.sum(returns >= SOLVED)):>4}/{num_seeds:<2} "
            f"{np.median(returns):>9.0f} med"
        )


def _seeds(train, num_seeds: int):
    return jax.jit(jax.vmap(train))(jax.random.split(jax.random.key(0), num_seeds))[1][
        "episode_return"
    ]


def learning_curves(path: str, quick: bool):
    """Returns vs environment steps (mean and min–max over seeds) and tabular errors vs budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = 2 if quick else 4
    scale = 10 if quick else 1
    fig, (ax_cart, ax_bandit, ax_chain) = plt.subplots(1, 3, figsize=(16, 4.5))

    def band(ax, x, curves, label):
        curves = np.asarray(curves)
        ax.plot(x, np.nanmean(curves, 0), label=label)
        ax.fill_between(x, np.nanmin(curves, 0), np.nanmax(curves, 0), alpha=0.2)

    ppo = classic_rl.PPOConfig(num_updates=max(3, 60 // scale))
    reinforce = classic_rl.ReinforceConfig(num_steps=128, num_updates=max(3, 120 // scale))
    dqn = classic_rl.DQNConfig(num_iterations=max(300, 12000 // scale), log_every=200)
    for name, train, per_point in (
        ("PPO", classic_rl.make_ppo(CartPole(), ppo), ppo.num_envs * ppo.num_steps),
        (
            "REINFORCE + baseline",
            classic_rl.make_reinforce(CartPole(), reinforce),
            reinforce.num_envs * reinforce.num_steps,
        ),
        (
            "DQN (double, uniform replay)",
            classic_rl.make_dqn(CartPole(), dqn),
            dqn.num_envs * dqn.log_every,
        ),
        (
            "DQN (double, prioritised replay)",
            classic_rl.make_dqn(CartPole(), dqn.__class__(**{**dqn.__dict__, "prioritized": True})),
            dqn.num_envs * dqn.log_every,
        ),
    ):
        curves = _seeds(train, seeds)
        band(ax_cart, per_point * np.arange(1, curves.shape[1] + 1), curves, name)
    ax_cart.set(
        title=f"CartPole ({seeds} seeds, vmapped)",
        xlabel="environment steps",
        ylabel="episode return",
    )
    ax_cart.legend(fontsize=8)

    bandit = BernoulliBandit()
    small = dict(num_envs=16, num_steps=8, hidden=(16,))
    for name, train in (
        (
            "PPO",
            classic_rl.make_ppo(
                bandit,
                classic_rl.PPOConfig(
                    **small, num_updates=40, update_epochs=2, num_minibatches=2, learning_rate=1e-2
                ),
            ),
        ),
        (
            "REINFORCE + baseline",
            classic_rl.make_reinforce(
                bandit, classic_rl.ReinforceConfig(**small, num_updates=40, learning_rate=3e-2)
            ),
        ),
    ):
        curves = _seeds(train, seeds)
        band(ax_bandit, 128 * np.arange(1, curves.shape[1] + 1), curves, name)
    ax_bandit.axhline(float(jnp.max(bandit.probs)), color="k", ls="--", label="optimal arm")
    ax_bandit.set(
        title="Bernoulli bandit, p = (0.2, 0.5, 0.8, 0.35)", xlabel="pulls", ylabel="mean reward"
    )
    ax_bandit.legend(fontsize=8)

    mdp, gamma = chain_mdp(8, slip=0.1), 0.9
    env = envs.TimeLimit(mdp, 50)
    v_star, q_star = value_iteration(mdp.default_params, gamma)
    alive = np.asarray(~mdp.default_params.terminal)
    budgets = [100, 200, 400, 800, 1600] + ([] if quick else [3200, 6400])
    q_err, v_err = [], []
    optimal = jax.nn.one_hot(jnp.argmax(q_star, 1), 2)
    keys = jax.random.split(jax.random.key(0), seeds)
    for iters in budgets:
        q = jax.jit(
            jax.vmap(
                classic_rl.make_q_learning(
                    env, classic_rl.QLearningConfig(num_iterations=iters, gamma=gamma)
                )
            )
        )(keys)[0]
        q_err.append(np.abs(np.asarray(q - q_star))[:, alive].max(axis=(1, 2)))
        td = classic_rl.TDLambdaConfig(num_updates=max(1, iters // 32), gamma=gamma)
        v = jax.jit(jax.vmap(classic_rl.make_td_lambda(env, optimal, td)))(keys)[0]
        v_err.append(np.abs(np.asarray(v - v_star))[:, alive].max(axis=1))
    transitions = 16 * np.asarray(budgets)
    band(ax_chain, transitions, np.stack(q_err, 1), "Q-learning: |Q − Q*|∞")
    band(ax_chain, transitions, np.stack(v_err, 1), "TD(0.8) on π*: |V − V*|∞")
    ax_chain.set(
        title="8-state chain, slip 0.1, γ = 0.9 (vs value iteration)",
        xlabel="transitions (final)",
        ylabel="max error",
        xscale="log",
        yscale="log",
    )
    ax_chain.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nlearning curves written to {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument(
        "--plot", metavar="PNG", help="also train every classic agent and plot learning curves"
    )
    parser.add_argument("--skip-steps", action="store_true", help="skip the steps/s table")
    parser.add_argument("--skip-ppo", action="store_true", help="skip the PPO seeds table")
    args = parser.parse_args(argv)
    print(f"device: {describe_device()}")
    if not args.skip_steps:
        bench_steps(args.quick)
    if not args.skip_ppo:
        bench_ppo(args.quick)
    if args.plot:
        learning_curves(args.plot, args.quick)


if __name__ == "__main__":
    main()
