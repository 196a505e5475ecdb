"""Multi-agent learning side by side: MARL critics on their games, and the bandit router's regret.

    python -m bench.multi_agent --out runs/multi_agent --plot docs/multi_agent.png
    python -m bench.multi_agent --out /tmp/ma --quick          # tiny budgets, a smoke run

* **Markov games** (``classic_rl.marl``): independent critics (IPPO) and a centralised critic
  (MAPPO) on the prisoner's dilemma and the stag hunt (``envs.MatrixGame``: the Nash gap of the
  learned profile, ``nash_conv``, 0 at an equilibrium) and the Lewis signalling game
  (``envs.SignallingGame``: the optimum return is 1, guessing earns 1 / targets).  Every method
  gets the same budget: ``--iterations`` x ``--envs`` x ``--steps`` environment steps per seed,
  counted and printed; ``--seeds`` seeds each (mean and range).
* **Router** (``agents.multi_agent.router``): a simulated workload of ``--requests`` requests of
  ``--kinds`` kinds and ``--arms`` arms (models or agents); arm ``a`` solves a request of kind
  ``k`` with a probability drawn once per (k, a), at a cost that grows with the arm's index
  (bigger models cost more), and reward = outcome − ``--cost_weight`` x cost.  The contexts are a
  one-hot of the kind, a bias and noise features.  LinUCB and linear Thompson sampling against a
  uniform random router and the best fixed arm in hindsight: cumulative pseudo-regret (on the
  expected rewards; the routers learn from sampled outcomes) against the best arm per request
  (``cumulative_regret(per_step=True)``) and against the best fixed arm, mean reward, the same
  requests for every router.

``OUT/results.json`` holds every number, ``OUT/report.md`` the tables (also printed), ``--plot``
the figure: return curves per game and critic, and the routers' regret curves.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.agents.multi_agent import router
from agentic_jax.classic_rl.marl import MARLConfig, make_marl, policy_logits
from agentic_jax.envs import MatrixGame, SignallingGame
from agentic_jax.eval.suites.report import write_files
from bench.figures import save_figure
from pallas_kernels.benchmarking import describe_device

CRITICS = ("independent", "centralised")
QUICK = {"iterations": 20, "seeds": 1, "requests": 200}


def games(targets: int) -> dict:
    return {
        "prisoners_dilemma": MatrixGame("prisoners_dilemma"),
        "stag_hunt": MatrixGame("stag_hunt"),
        "signalling": SignallingGame(targets),
    }


def marl_rows(args) -> dict:
    """Per game and critic: the return curve of each seed, the final return and Nash gap."""
    rows = {}
    for name in args.games:
        game = games(args.targets)[name]
        # two steps per episode in the signalling game, one in a matrix game: whole episodes
        steps = 2 * args.steps if isinstance(game, SignallingGame) else args.steps
        for critic in CRITICS:
            config = MARLConfig(
                critic=critic, num_envs=args.envs, num_steps=steps, num_iterations=args.iterations
            )
            train = jax.jit(jax.vmap(make_marl(game, config)))
            start = time.perf_counter()
            params, metrics = train(jax.random.split(jax.random.key(0), args.seeds))
            returns = np.asarray(metrics["episode_return"]).mean(-1)  # [seeds, iterations]
            row = {
                "game": name,
                "critic": critic,
                "env_steps_per_seed": args.iterations * args.envs * steps,
                "seconds": time.perf_counter() - start,
                "curves": returns.tolist(),
                "final_return": returns[:, -5:].mean(1).tolist(),
            }
            if isinstance(game, MatrixGame):
                obs, _ = game.reset(jax.random.key(0))
                policies = jax.nn.softmax(jax.vmap(policy_logits, (0, None))(params, obs))
                row["nash_conv"] = [game.nash_conv(p) for p in np.asarray(policies)]
            rows[f"{name} / {critic}"] = row
            print(f"{name}, {critic}: {row['final_return']}", flush=True)
    return rows


def workload(args) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(contexts [T, d], outcomes [T, arms] in {0, 1}, their probabilities [T, arms], costs
    [arms]) of the simulated requests."""
    rng = np.random.default_rng(args.workload_seed)
    solve = rng.uniform(0.1, 0.95, (args.kinds, args.arms))
    kinds = rng.integers(0, args.kinds, args.requests)
    noise = rng.normal(0.0, 0.1, (args.requests, 2))
    contexts = np.concatenate([np.eye(args.kinds)[kinds], np.ones((args.requests, 1)), noise], 1)
    outcomes = (rng.uniform(size=(args.requests, args.arms)) < solve[kinds]).astype(np.float32)
    costs = np.linspace(0.0, 1.0, args.arms, dtype=np.float32)
    return contexts.astype(np.float32), outcomes, solve[kinds], costs


def router_rows(args) -> dict:
    """Regret and mean reward of each router on the same requests.  Routers learn from the
    sampled outcomes; regret is measured on the expected rewards (pseudo-regret), so an
    oracle's is 0 and the sampling noise does not grow it."""
    contexts, outcomes, solve, costs = workload(args)
    rewards = np.asarray(router.reward(outcomes, costs, args.cost_weight))
    expected = np.asarray(router.reward(solve, costs, args.cost_weight))
    chosen = {}
    for method in router.METHODS:
        state = router.init(args.arms, contexts.shape[1])
        chosen[method] = np.asarray(
            router.replay(
                state,
                jnp.asarray(contexts),
                jnp.asarray(outcomes),
                jnp.asarray(costs),
                jax.random.key(1),
                method=method,
                cost_weight=args.cost_weight,
            )[1]
        )
    chosen["uniform random"] = np.random.default_rng(2).integers(0, args.arms, args.requests)
    chosen["best fixed arm"] = np.full(args.requests, int(expected.sum(0).argmax()))
    rows = {}
    for name, arms in chosen.items():
        per_step = np.asarray(router.cumulative_regret(expected, arms, per_step=True))
        fixed = np.asarray(router.cumulative_regret(expected, arms))
        rows[name] = {
            "requests": args.requests,
            "mean_reward": float(rewards[np.arange(args.requests), arms].mean()),
            "expected_reward": float(expected[np.arange(args.requests), arms].mean()),
            "regret_per_request_best": float(per_step[-1]),
            "regret_best_fixed": float(fixed[-1]),
            "regret_first_half": float(per_step[args.requests // 2 - 1]),
            "curve": per_step.tolist(),
        }
    return rows


def report(results: dict) -> str:
    s = results["setup"]
    lines = [
        f"On {s['device']}.",
        "",
        f"**Markov games** ({s['seeds']} seeds; every method {s['iterations']} PPO iterations x "
        f"{s['envs']} environments; mean return per agent over the last 5 iterations, Nash gap "
        "of the learned profile (0 at an equilibrium)):",
        "",
        "| game | critic | env steps / seed | final return (mean, range) | Nash gap (mean) |",
        "|---|---|---|---|---|",
    ]
    for r in results["marl"].values():
        final = np.asarray(r["final_return"])
        gap = f"{np.mean(r['nash_conv']):.3f}" if "nash_conv" in r else ""
        lines.append(
            f"| {r['game']} | {r['critic']} | {r['env_steps_per_seed']:,} | {final.mean():.3f} "
            f"[{final.min():.3f}, {final.max():.3f}] | {gap} |"
        )
    lines += [
        "",
        f"**Router** ({s['requests']} requests of {s['kinds']} kinds, {s['arms']} arms, reward = "
        f"outcome − {s['cost_weight']} x cost; the same requests for every router):",
        "",
        "| router | requests | mean reward (sampled, expected) | pseudo-regret vs the best arm "
        "per request (first half, all) | vs the best fixed arm |",
        "|---|---|---|---|---|",
    ]
    for name, r in results["router"].items():
        lines.append(
            f"| {name} | {r['requests']} | {r['mean_reward']:.3f}, {r['expected_reward']:.3f} | "
            f"{r['regret_first_half']:.1f}, {r['regret_per_request_best']:.1f} | "
            f"{r['regret_best_fixed']:.1f} |"
        )
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    """Return curves per game (one line per critic, the seeds' mean) and regret curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["game"] for r in results["marl"].values()))
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4.5 * (len(names) + 1), 3.8))
    for ax, name in zip(axes, names):
        for r in results["marl"].values():
            if r["game"] == name:
                ax.plot(np.mean(r["curves"], axis=0), label=r["critic"])
        ax.set(title=name, xlabel="PPO iteration", ylabel="return per agent")
        ax.legend(fontsize=8)
    for name, r in results["router"].items():
        axes[-1].plot(r["curve"], label=name)
    axes[-1].set(title="router", xlabel="request", ylabel="pseudo-regret vs best arm per request")
    axes[-1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    save_figure(fig, path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="results.json and report.md")
    parser.add_argument("--plot", default="docs/multi_agent.png")
    parser.add_argument("--quick", action="store_true", help="tiny budgets, a smoke run")
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="whole episodes per rollout")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--targets", type=int, default=3, help="of the signalling game")
    parser.add_argument("--games", nargs="+", choices=list(games(2)), default=list(games(2)))
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--kinds", type=int, default=4)
    parser.add_argument("--arms", type=int, default=4)
    parser.add_argument("--cost_weight", type=float, default=0.3)
    parser.add_argument("--workload_seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, min(getattr(args, name), value))
    device = describe_device()
    print(device, flush=True)
    results = {"setup": {**vars(args), "device": device}}
    results["marl"] = marl_rows(args)
    results["router"] = router_rows(args)
    text = report(results)
    write_files(args.out, results, text + "\n", {})
    plot(results, args.plot)
    print(text)
    return results


if __name__ == "__main__":
    main()
