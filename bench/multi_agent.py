"""Multi-agent learning side by side: MARL trainers on their games, self-play on a board game, the
bandit router's regret, and team RL against single-agent RL at equal tokens.

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

* **COMA** (``classic_rl.coma``) beside IPPO and MAPPO on a common-payoff coordination game
  (``COORDINATION``: the optimum (0, 0) pays 10, miscoordinating on it costs 5, a safe (2, 2)
  pays 4) and the signalling game; the share of seeds whose greedy joint action is the optimum.
* **Board-game self-play** (``classic_rl.board_self_play``): league self-play on pgx's
  tic-tac-toe, the learner's win / draw / loss rates against a uniformly random player and
  against its first checkpoint after each generation.
* **Team RL vs single-agent RL at equal tokens** (with ``--sft``, a run directory to start
  from, e.g. ``runs/quickstart/sft``): the solver-verifier team (``post_training.team_rl``)
  trains ``--team_steps`` steps on ``rl/TaskSpec`` (``configs/post_training_tasks.gin``),
  counting the tokens both roles generate; plain GRPO from the same start then trains until it
  has generated as many.  Held-out success (pass@1 of ``--team_samples`` samples per problem)
  before and after, with bootstrap 95% intervals and the paired difference to the start.

``OUT/results.json`` holds every number, ``OUT/report.md`` the tables (also printed), ``--plot``
the figure: return curves per game and critic, the routers' regret curves, the self-play win
rates.

    python -m bench.multi_agent --out runs/multi_agent --sft runs/quickstart/sft
"""

from __future__ import annotations

import argparse
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax import config as gin_config
from agentic_jax.agents.multi_agent import router
from agentic_jax.classic_rl.board_self_play import BoardSelfPlayConfig, make_board_self_play
from agentic_jax.classic_rl.coma import COMAConfig, make_coma
from agentic_jax.classic_rl.marl import MARLConfig, make_marl, policy_logits
from agentic_jax.envs import MatrixGame, PgxEnv, SignallingGame
from agentic_jax.eval import bootstrap_ci
from agentic_jax.eval.suites.report import write_files
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.evaluate import evaluate_policy
from agentic_jax.post_training.rl import RLConfig, init_learner, make_setup, rl_step
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.post_training.team_rl import TeamRLConfig, make_team_setup, team_step
from bench.figures import save_figure
from pallas_kernels.benchmarking import describe_device

TRAINERS = ("independent", "centralised", "coma")
QUICK = {
    "iterations": 20,
    "seeds": 1,
    "requests": 200,
    "generations": 2,
    "self_play_iterations": 5,
    "team_steps": 1,
    "team_samples": 2,
}
COORDINATION = [[[10.0, -5.0, 0.0], [-5.0, 6.0, 0.0], [0.0, 0.0, 4.0]]] * 2


def games(targets: int) -> dict:
    return {
        "prisoners_dilemma": MatrixGame("prisoners_dilemma"),
        "stag_hunt": MatrixGame("stag_hunt"),
        "coordination": MatrixGame(COORDINATION),
        "signalling": SignallingGame(targets),
    }


def trainer(name: str, envs: int, steps: int, iterations: int):
    """``train(key) -> (params, metrics)`` of an IPPO / MAPPO critic or COMA at one budget."""
    if name == "coma":
        config = COMAConfig(num_envs=envs, num_steps=steps, num_iterations=iterations)
        return lambda game: make_coma(game, config)
    config = MARLConfig(critic=name, num_envs=envs, num_steps=steps, num_iterations=iterations)
    return lambda game: make_marl(game, config)


def marl_rows(args) -> dict:
    """Per game and trainer: the return curve of each seed, the final return and Nash gap, and in
    a common-payoff game the share of seeds whose greedy joint action is the optimum."""
    rows = {}
    for name in args.games:
        game = games(args.targets)[name]
        # two steps per episode in the signalling game, one in a matrix game: whole episodes
        steps = 2 * args.steps if isinstance(game, SignallingGame) else args.steps
        for method in args.trainers:
            train = jax.jit(jax.vmap(trainer(method, args.envs, steps, args.iterations)(game)))
            start = time.perf_counter()
            params, metrics = train(jax.random.split(jax.random.key(0), args.seeds))
            returns = np.asarray(metrics["episode_return"]).mean(-1)  # [seeds, iterations]
            row = {
                "game": name,
                "trainer": method,
                "env_steps_per_seed": args.iterations * args.envs * steps,
                "seconds": time.perf_counter() - start,
                "curves": returns.tolist(),
                "final_return": returns[:, -5:].mean(1).tolist(),
            }
            if isinstance(game, MatrixGame):
                obs, _ = game.reset(jax.random.key(0))
                policies = np.asarray(
                    jax.nn.softmax(jax.vmap(policy_logits, (0, None))(params, obs))
                )
                row["nash_conv"] = [game.nash_conv(p) for p in policies]
                if np.array_equal(game.payoffs[0], game.payoffs[1]):
                    optimum = np.unravel_index(game.payoffs[0].argmax(), game.payoffs[0].shape)
                    row["optimum_reached"] = float(
                        np.mean((policies.argmax(-1) == optimum).all(-1))
                    )
            rows[f"{name} / {method}"] = row
            print(f"{name}, {method}: {row['final_return']}", flush=True)
    return rows


def self_play_rows(args) -> dict:
    """League self-play on tic-tac-toe: per generation the win / draw / loss rates against a
    uniformly random player and against the first checkpoint, mean over seeds."""
    config = BoardSelfPlayConfig(
        generations=args.generations,
        iterations=args.self_play_iterations,
        eval_games=args.eval_games,
    )
    train = jax.jit(jax.vmap(make_board_self_play(PgxEnv("tic_tac_toe"), config)))
    print(f"self-play: {args.seeds} seeds x {args.generations} generations, one call", flush=True)
    start = time.perf_counter()
    _, metrics = train(jax.random.split(jax.random.key(0), args.seeds))
    rates = {k: np.asarray(v).mean(0).tolist() for k, v in metrics.items() if k.startswith("vs_")}
    print(f"self-play: {time.perf_counter() - start:.0f} s", flush=True)
    return {
        "game": "tic_tac_toe",
        "generations": args.generations,
        "training_games_per_seed": args.generations * config.iterations * config.batch,
        "eval_games": args.eval_games,
        "seconds": time.perf_counter() - start,
        **rates,
    }


def success(params, config, env, samples: int) -> dict:
    """Held-out pass@1 per problem (of ``samples`` samples) and greedy success."""
    result = evaluate_policy(params, config, env, samples=samples, key=jax.random.key(1))
    return {
        "pass@1": (result.sampled_correct / samples).tolist(),
        "greedy": float(result.success.mean()),
    }


def team_rows(args) -> dict:
    """Team RL and plain GRPO from ``--sft`` on ``rl/TaskSpec`` at equal generated tokens.

    The team (a solver and a verifier sharing one policy, ``TeamRLConfig``'s defaults) trains
    ``--team_steps`` steps; its tokens are the solver's (``generated_tokens``) plus the
    verifier's (its mean verdict length x the verdicts).  GRPO (the same ``RLConfig``, the same
    learning rate) then takes steps until it has generated at least as many, so it overshoots by
    less than one step's tokens.  Both are evaluated on the held-out problems with the start."""
    gin_config.parse(["post_training_tasks"], args.gin_param)
    with gin.config_scope("rl"):
        spec = TaskSpec()
    config, base, tokenizer = load_checkpoint(args.sft)
    env, heldout = spec.env(tokenizer, "train"), spec.env(tokenizer, "heldout")
    algo = RLConfig(
        loss_type="grpo",
        advantage="grpo",
        group_size=args.group_size,
        prompts_per_step=args.prompts_per_step,
        temperature=1.0,
    )
    kwargs = {"peak_lr": args.team_lr, "warmup_steps": 0}
    team = make_team_setup(
        config,
        base,
        env,
        spec.tasks("train"),
        algo,
        TeamRLConfig(),
        steps=args.team_steps,
        **kwargs,
    )
    learner, tokens = init_learner(team.rl), {"solver": 0, "verifier": 0}
    start = time.perf_counter()
    for step in range(1, args.team_steps + 1):
        learner, record = team_step(team, learner, step)
        tokens["solver"] += record["generated_tokens"]
        tokens["verifier"] += round(record["verifier_tokens"] * record["episodes"])
        print(f"team step {step}/{args.team_steps}: {sum(tokens.values()):,} tokens", flush=True)
    rows = {
        "start": {
            "steps": 0,
            "generated_tokens": 0,
            **success(base, config, heldout, args.team_samples),
        },
        "team": {
            "steps": args.team_steps,
            "generated_tokens": sum(tokens.values()),
            "solver_tokens": tokens["solver"],
            "verifier_tokens": tokens["verifier"],
            "seconds": time.perf_counter() - start,
            **success(team.rl.policy_params(learner), config, heldout, args.team_samples),
        },
    }
    budget = rows["team"]["generated_tokens"]
    grpo = make_setup(config, base, env, algo, steps=args.team_steps, **kwargs)
    learner, spent, step = init_learner(grpo), 0, 0
    start = time.perf_counter()
    while spent < budget:
        step += 1
        learner, record = rl_step(grpo, learner, step)
        spent += record["generated_tokens"]
        print(f"grpo step {step}: {spent:,} of {budget:,} tokens", flush=True)
    rows["grpo"] = {
        "steps": step,
        "generated_tokens": spent,
        "seconds": time.perf_counter() - start,
        **success(grpo.policy_params(learner), config, heldout, args.team_samples),
    }
    before = rows["start"]["pass@1"]
    for name, row in rows.items():
        row["success"] = bootstrap_ci(row["pass@1"])
        if name != "start":
            row["vs_start"] = bootstrap_ci(row["pass@1"], paired_with=before)
        print(
            f"{name}: {row['generated_tokens']:,} tokens, pass@1 {row['success'][0]:.3f}",
            flush=True,
        )
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
        f"**Markov games** ({s['seeds']} seeds; every method {s['iterations']} iterations x "
        f"{s['envs']} environments; mean return per agent over the last 5 iterations, Nash gap "
        "of the learned profile (0 at an equilibrium), and in a common-payoff game the share of "
        "seeds whose greedy joint action is the optimum):",
        "",
        "| game | trainer | env steps / seed | final return (mean, range) | Nash gap (mean) "
        "| optimum reached |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["marl"].values():
        final = np.asarray(r["final_return"])
        gap = f"{np.mean(r['nash_conv']):.3f}" if "nash_conv" in r else ""
        optimum = f"{r['optimum_reached']:.2f}" if "optimum_reached" in r else ""
        lines.append(
            f"| {r['game']} | {r['trainer']} | {r['env_steps_per_seed']:,} | {final.mean():.3f} "
            f"[{final.min():.3f}, {final.max():.3f}] | {gap} | {optimum} |"
        )
    sp = results["self_play"]
    lines += [
        "",
        f"**Self-play** (league self-play on {sp['game']}, {s['seeds']} seeds, "
        f"{sp['training_games_per_seed']:,} training games per seed; the learner's rates over "
        f"{sp['eval_games']} games after each generation, mean over seeds):",
        "",
        "| generation | vs random: win, draw, loss | vs first checkpoint: win, draw, loss |",
        "|---|---|---|",
    ]
    for g in range(sp["generations"]):
        cells = [
            ", ".join(f"{sp[f'{who}_{r}'][g]:.3f}" for r in ("win", "draw", "loss"))
            for who in ("vs_random", "vs_first")
        ]
        lines.append(f"| {g + 1} | {cells[0]} | {cells[1]} |")
    if "team" in results:
        lines += [
            "",
            f"**Team RL vs single-agent RL at equal tokens** (from {s['sft']}; held-out pass@1 "
            f"of {s['team_samples']} samples per problem, bootstrap 95% intervals; the team's "
            "tokens are the solver's and the verifier's):",
            "",
            "| arm | steps | generated tokens | held-out success (95% CI) | vs start (95% CI) "
            "| greedy success |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in results["team"].items():
            mean, low, high = r["success"]
            diff = "{:+.3f} [{:+.3f}, {:+.3f}]".format(*r["vs_start"]) if "vs_start" in r else ""
            lines.append(
                f"| {name} | {r['steps']} | {r['generated_tokens']:,} | {mean:.3f} "
                f"[{low:.3f}, {high:.3f}] | {diff} | {r['greedy']:.3f} |"
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
    """Return curves per game (one line per trainer, the seeds' mean), regret curves and the
    self-play win rates per generation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["game"] for r in results["marl"].values()))
    fig, axes = plt.subplots(1, len(names) + 2, figsize=(4.5 * (len(names) + 2), 3.8))
    for ax, name in zip(axes, names):
        for r in results["marl"].values():
            if r["game"] == name:
                ax.plot(np.mean(r["curves"], axis=0), label=r["trainer"])
        ax.set(title=name, xlabel="iteration", ylabel="return per agent")
        ax.legend(fontsize=8)
    router_ax, self_play_ax = axes[-2:]
    for name, r in results["router"].items():
        router_ax.plot(r["curve"], label=name)
    router_ax.set(title="router", xlabel="request", ylabel="pseudo-regret vs best arm per request")
    router_ax.legend(fontsize=8)
    sp = results["self_play"]
    generations = np.arange(1, sp["generations"] + 1)
    for who, label in (("vs_random", "vs random"), ("vs_first", "vs first checkpoint")):
        self_play_ax.plot(generations, sp[f"{who}_win"], marker="o", label=label)
    self_play_ax.set(title=f"self-play, {sp['game']}", xlabel="generation", ylabel="win rate")
    self_play_ax.legend(fontsize=8)
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
    parser.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    parser.add_argument("--generations", type=int, default=6, help="of tic-tac-toe self-play")
    parser.add_argument("--self_play_iterations", type=int, default=50, help="per generation")
    parser.add_argument("--eval_games", type=int, default=512, help="per self-play evaluation")
    parser.add_argument("--sft", help="a run to start team RL and GRPO from (skipped if absent)")
    parser.add_argument("--team_steps", type=int, default=30)
    parser.add_argument("--team_samples", type=int, default=8, help="per held-out problem")
    parser.add_argument("--team_lr", type=float, default=1e-4)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--prompts_per_step", type=int, default=8)
    parser.add_argument(
        "--gin_param", action="append", default=[], help="a binding for the text task; repeatable"
    )
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, min(getattr(args, name), value))
    device = describe_device()
    print(device, flush=True)
    results = {"setup": {**vars(args), "device": device}}
    results["marl"] = marl_rows(args)
    results["router"] = router_rows(args)
    results["self_play"] = self_play_rows(args)
    if args.sft:
        results["team"] = team_rows(args)
    text = report(results)
    write_files(args.out, results, text + "\n", {})
    plot(results, args.plot)
    print(text)
    return results


if __name__ == "__main__":
    main()
