"""Agentic RL methods compared from one SFT checkpoint on the hard tool-use problems, at equal budgets.

    python -m bench.agentic_rl --sft runs/quickstart/sft --out runs/agentic_rl_study
    python -m bench.agentic_rl --sft runs/quickstart_large/sft --out runs/agentic_rl_study_large \
        --gin_file agentic_rl_study_large --steps 200 --samples 16      # one GPU

Every method starts from ``--sft`` and trains on ``rl/TaskSpec`` (``configs/post_training_tasks.gin``:
the main job's harder slice, problems the SFT demonstrations do not cover), under one budget of
``steps x 64`` episodes with every sampling round counted:

* ``rft``: rejection-sampling fine-tuning; ``grpo``: GRPO, outcome reward only;
* ``grpo_turn``: GRPO with per-turn (process) rewards and turn-level credit (``rl_agentic``);
* ``grpo_prm``: GRPO with a process reward model's score beside the verifier (``rl_reward_model``;
  the PRM is trained first, once, on the SFT model's problems, from demonstrations, not samples);
* ``grpo_opid``: GRPO plus on-policy self-distillation from a privileged teacher
  (``rl_self_distillation``); ``dr_grpo``, ``dapo`` (dynamic sampling inside the budget), ``rloo``;
* ``ppo_turn``: PPO with a critic and GAE over turns (``rl_agentic_ppo``).

Each (method, seed) run is evaluated on the held-out problems: greedy success and pass@1 from
``--samples`` samples per problem.  The table gives means over seeds with hierarchical bootstrap
95% intervals (seeds, then problems), the paired difference to SFT, the episodes and tokens each
method generated, training wall-clock and the share of it spent generating.  ``OUT/curves/`` gets
one PNG per method (reward, held-out success, entropy, KL, response length, tool calls per
episode, every seed) and ``comparison.png``; ``OUT/results.json`` holds everything, and the
markdown report (``OUT/report.md``, also printed) ends with what the stability monitors saw.
Finished runs are skipped on a rerun, so an interrupted study resumes.
"""

from __future__ import annotations

import argparse
import json
import os

import gin
import numpy as np

import agentic_jax.registry  # noqa: F401  (every configurable, before any parsing)
from agentic_jax import config as gin_config
from agentic_jax.eval import hierarchical_bootstrap_ci
from agentic_jax.post_training.reward import train_reward_model
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.metrics import read_metrics
from bench.post_training import SAMPLES_PER_STEP, evaluate, run_method

METHODS = (
    "sft",
    "rft",
    "grpo",
    "grpo_turn",
    "grpo_prm",
    "grpo_opid",
    "dr_grpo",
    "dapo",
    "rloo",
    "ppo_turn",
)
CURVES = (
    ("reward_mean", "reward"),
    ("eval_success", "held-out success (greedy)"),
    ("entropy", "entropy"),
    ("kl", "KL to the SFT model"),
    ("response_length", "response tokens"),
    ("tool_calls", "tool calls / episode"),
)


def _prm(sft: str, out: str, files: list[str], extra: list[str]) -> str:
    """The process reward model ``grpo_prm`` scores with, trained once (resumed if interrupted)."""
    workdir = os.path.join(out, "process_reward_model")
    if not os.path.exists(os.path.join(workdir, "model", "config.json")):
        gin_config.parse(
            ["reward_model", *files],
            [f"train_reward_model.init_from = '{sft}'", "train_reward_model.kind = 'process'"]
            + extra,
        )
        train_reward_model(workdir)
    return workdir


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot(method: str, runs: dict[str, str], path: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for seed, run_dir in runs.items():
        records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
        # Held-out records share their step with a training record (step 0: before any).
        episodes = {r["step"]: r["episodes_total"] for r in records if "episodes_total" in r}
        for ax, (key, _) in zip(axes.flat, CURVES):
            points = [(episodes.get(r["step"], 0), r[key]) for r in records if key in r]
            if points:
                ax.plot(*zip(*points), marker=".", label=f"seed {seed}")
    for ax, (_, title) in zip(axes.flat, CURVES):
        ax.set_title(title)
        ax.set_xlabel("episodes")
    axes.flat[0].legend()
    fig.suptitle(method)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_comparison(results: dict, path: str) -> None:
    methods = [m for m in results if results[m]["seeds"]]
    means = [np.mean([s["pass@1"] for s in results[m]["seeds"].values()]) for m in methods]
    greedy = [np.mean([s["greedy"] for s in results[m]["seeds"].values()]) for m in methods]
    x = np.arange(len(methods))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(methods)), 4))
    ax.bar(x - 0.2, means, 0.4, label="pass@1")
    ax.bar(x + 0.2, greedy, 0.4, label="greedy")
    ax.set_xticks(x, methods, rotation=30)
    ax.set_ylabel("held-out success")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _collapse(method: str, run_dir: str) -> str:
    """One line on what a run's curves and monitors showed."""
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    curves = [r for r in records if "entropy" in r]
    if not curves:
        return f"{method}: no RL curves"
    entropy = [r["entropy"] for r in curves]
    reward = [r["reward_mean"] for r in curves]
    alarms = [f"step {r['step']}: {a}" for r in records for a in r.get("alarms", [])]
    return (
        f"{method}: entropy {entropy[0]:.3f} -> {entropy[-1]:.3f} (min {min(entropy):.3f}), "
        f"reward {reward[0]:.3f} -> {reward[-1]:.3f} (max {max(reward):.3f}), "
        f"{len(alarms)} alarms" + (f" (first: {alarms[0]})" if alarms else "")
    )


def _report(results: dict, steps: int, seeds: list[int]) -> str:
    budget = steps * SAMPLES_PER_STEP
    # SFT is one model: its one evaluation is every seed's baseline.
    sft = next(iter(results.get("sft", {}).get("seeds", {}).values()), None)
    lines = [
        f"Budget: {budget:,} episodes per method and seed ({steps} steps x {SAMPLES_PER_STEP}); "
        f"seeds {seeds}; a method that sampled more is marked *.",
        "",
        "| method | pass@1 (95% CI) | vs SFT (95% CI) | greedy (95% CI) | greedy vs SFT "
        "| episodes | generated tokens | training s | generation share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method, entry in results.items():
        runs = entry["seeds"]
        if not runs:
            continue
        cells = []
        for key in ("pass@1", "greedy"):
            values = np.array([runs[s][key] for s in runs])
            mean, low, high = hierarchical_bootstrap_ci(values)
            cells.append(f"{mean:.3f} [{low:.3f}, {high:.3f}]")
            if method == "sft" or sft is None:
                cells.append("")
                continue
            base = np.array([sft[key]] * len(runs))
            d, dl, dh = hierarchical_bootstrap_ci(values, paired_with=base)
            cells.append(f"{d:+.3f} [{dl:+.3f}, {dh:+.3f}]")
        episodes = [r["episodes"] for r in runs.values()]
        tokens = np.mean([r["generated_tokens"] for r in runs.values()])
        seconds = np.mean([r["seconds"] for r in runs.values()])
        share = (
            np.mean([r["generation_seconds"] / r["seconds"] for r in runs.values()])
            if seconds
            else 0.0
        )
        lines.append(
            f"| {method} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} "
            f"| {np.mean(episodes):,.0f}{'*' if max(episodes) > budget else ''} | {tokens:,.0f} "
            f"| {seconds:.0f} | {share:.0%} |"
        )
    lines += ["", "What the curves and the stability monitors showed, run by run:", ""]
    for method, entry in results.items():
        for seed, run in entry["seeds"].items():
            if method != "sft":
                lines.append(f"- {_collapse(f'{method} seed {seed}', run['run_dir'])}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft", required=True, help="the SFT run every method starts from")
    parser.add_argument("--out", required=True, help="directory for the runs and results")
    parser.add_argument("--steps", type=int, default=15, help="budget: steps x 64 episodes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--samples", type=int, default=4, help="samples per held-out problem")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--gin_file",
        action="append",
        help="a study config for every run (default: agentic_rl_study; repeatable)",
    )
    parser.add_argument("--gin_param", action="append", default=[], help="a binding; repeatable")
    args = parser.parse_args()
    files, extra = args.gin_file or ["agentic_rl_study"], args.gin_param
    os.makedirs(os.path.join(args.out, "curves"), exist_ok=True)
    results_path = os.path.join(args.out, "results.json")
    results = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = json.load(f)
    gin_config.parse(["post_training_tasks", *files], extra)
    with gin.config_scope("rl"):
        spec = TaskSpec()
    for method in args.methods:
        entry = results.setdefault(method, {"seeds": {}})
        for seed in [args.seeds[0]] if method == "sft" else args.seeds:
            if str(seed) in entry["seeds"]:
                continue
            bindings = list(extra)
            if method == "grpo_prm":
                prm = _prm(args.sft, args.out, files, extra)
                bindings.append(f"train_rl.reward_model = '{prm}'")
            run_dir, seconds, spent = run_method(
                method,
                args.sft,
                args.out,
                args.steps,
                seed,
                bindings,
                workdir=os.path.join(args.out, method, f"seed{seed}"),
                gin_files=files,
            )
            entry["seeds"][str(seed)] = {
                **evaluate(run_dir, spec, args.samples, seed),
                "run_dir": run_dir,
                "seconds": seconds,
                **spent,
            }
            with open(results_path, "w") as f:
                json.dump(results, f)
            mean = np.mean(entry["seeds"][str(seed)]["pass@1"])
            print(f"{method} seed {seed}: held-out pass@1 {mean:.3f} ({seconds:.0f} s)", flush=True)
        if method != "sft":
            runs = {s: r["run_dir"] for s, r in entry["seeds"].items()}
            _plot(method, runs, os.path.join(args.out, "curves", f"{method}.png"))
    _plot_comparison(results, os.path.join(args.out, "curves", "comparison.png"))
    report = _report(results, args.steps, args.seeds)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
