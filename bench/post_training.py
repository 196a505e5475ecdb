"""Post-training methods side by side: same SFT start, task, sample budget and seeds.

    python -m bench.post_training --sft runs/quickstart/sft --out runs/compare [--steps 30]

Every method starts from the SFT model ``--sft`` and may sample ``steps x 64`` episodes of the
harder training problems (``configs/post_training_tasks.gin``, ``rl/TaskSpec``):

* ``sft``: no further training (the baseline);
* ``rft``: rejection-sampling fine-tuning (``train_rft``), the same samples in rounds;
* ``online_dpo``: online DPO (``train_preference``, best vs worst of 8 samples per prompt);
* ``grpo``, ``dapo``, ``dr_grpo``, ``rloo``, ``ppo``: ``train_rl`` with ``configs/rl_<method>.gin``,
  under ``RLConfig.episode_budget = steps x 64`` with every sampling round counted, so DAPO's
  dynamic sampling ends in fewer steps rather than with more episodes.

Each trained model plays every held-out problem greedily once and ``--samples`` times at
temperature 1.  The table gives held-out success (the per-problem success rate of the samples,
i.e. pass@1, with its bootstrap 95% interval), the paired difference to SFT with its interval,
greedy success, the episodes and policy tokens each method sampled (from its ``metrics.jsonl``;
a method over the budget is marked), and the wall-clock of training.  Results go to ``OUT/results.json`` and a
markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gin
import jax
import numpy as np

import agentic_jax.registry  # noqa: F401  (every configurable, before any parsing)
from agentic_jax import config as gin_config
from agentic_jax.eval import bootstrap_ci
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.evaluate import evaluate_policy
from agentic_jax.post_training.preference import train_preference
from agentic_jax.post_training.rft import train_rft
from agentic_jax.post_training.rl import train_rl
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.metrics import read_metrics

METHODS = ("sft", "rft", "online_dpo", "grpo", "dapo", "dr_grpo", "rloo", "ppo")
SAMPLES_PER_STEP = 64
# train_rl methods by the config that defines them (bench.agentic_rl adds the agentic ones).
RL_CONFIGS = {
    "grpo": "rl_grpo",
    "dapo": "rl_dapo",
    "dr_grpo": "rl_dr_grpo",
    "rloo": "rl_rloo",
    "ppo": "rl_ppo",
    "grpo_turn": "rl_agentic",
    "grpo_prm": "rl_reward_model",
    "grpo_opid": "rl_self_distillation",
    "ppo_turn": "rl_agentic_ppo",
}


def _bindings(method: str, sft: str, steps: int, seed: int) -> tuple[list[str], list[str], str]:
    """gin files, bindings and the trainer's name for one method at the shared budget."""
    common = [
        f"train_rl.init_from = '{sft}'",
        f"train_rl.steps = {steps}",
        f"train_rl.seed = {seed}",
        "train_rl.eval_every = 0",
    ]
    if method in RL_CONFIGS:
        # Every sampling round counts: DAPO's dynamic sampling ends in fewer steps, not with
        # more episodes.
        budget = f"RLConfig.episode_budget = {steps * SAMPLES_PER_STEP}"
        return [RL_CONFIGS[method]], [*common, budget], "train_rl"
    if method == "rft":
        rounds = 3
        return (
            ["post_training_tasks"],
            [
                f"train_rft.init_from = '{sft}'",
                "train_rft.tasks = @rl/TaskSpec()",
                f"train_rft.rounds = {rounds}",
                "train_rft.samples_per_prompt = 8",
                f"train_rft.prompts_per_round = {steps * SAMPLES_PER_STEP // (8 * rounds)}",
                f"train_rft.steps_per_round = {max(steps // rounds, 1)}",
                "train_rft.temperature = 0.8",
                f"train_rft.seed = {seed}",
            ],
            "train_rft",
        )
    return (
        ["post_training_tasks"],
        [
            f"train_preference.init_from = '{sft}'",
            "train_preference.tasks = @rl/TaskSpec()",
            "train_preference.online = True",
            "train_preference.samples_per_prompt = 8",
            "train_preference.prompts_per_step = 8",
            f"train_preference.steps = {steps}",
            "train_preference.peak_lr = 3e-5",
            "train_preference.temperature = 0.8",
            f"train_preference.seed = {seed}",
        ],
        "train_preference",
    )


def run_method(
    method: str,
    sft: str,
    out: str,
    steps: int,
    seed: int,
    extra: list[str],
    workdir: str | None = None,
    gin_files: tuple[str, ...] | list[str] = (),
) -> tuple[str, float, dict]:
    """Trains one method in ``workdir`` (default ``out/method``; resuming if its run exists), with
    ``gin_files`` parsed after the method's own config;
    returns its run directory, seconds, and the episodes, policy tokens and generation seconds it
    spent (every record of its ``metrics.jsonl``)."""
    if method == "sft":
        return sft, 0.0, {"episodes": 0, "generated_tokens": 0, "generation_seconds": 0.0}
    files, bindings, trainer = _bindings(method, sft, steps, seed)
    gin_config.parse([*files, *gin_files], bindings + extra)
    workdir = workdir or os.path.join(out, method)
    start = time.perf_counter()
    {"train_rl": train_rl, "train_rft": train_rft, "train_preference": train_preference}[trainer](
        workdir
    )
    seconds = time.perf_counter() - start
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    spent = {
        k: sum(r.get(k, 0) for r in records)
        for k in ("episodes", "generated_tokens", "generation_seconds")
    }
    return workdir, seconds, spent


def evaluate(run_dir: str, spec: TaskSpec, samples: int, seed: int) -> dict:
    """A run's model on ``spec``'s held-out problems: per-problem pass@1 from ``samples``
    samples, per-problem greedy success, and tool calls per greedy episode."""
    config, params, tokenizer = load_checkpoint(run_dir)
    result = evaluate_policy(
        params, config, spec.env(tokenizer, "heldout"), samples=samples, key=jax.random.key(seed)
    )
    return {
        "pass@1": (result.sampled_correct / samples).tolist(),
        "greedy": result.success.astype(int).tolist(),
        "tool_calls": float(result.tool_calls.mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft", required=True, help="the SFT run every method starts from")
    parser.add_argument("--out", required=True, help="directory for the runs and results.json")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--samples", type=int, default=4, help="samples per held-out problem (pass@1)"
    )
    parser.add_argument(
        "--gin_param", action="append", default=[], help="a binding for every run; repeatable"
    )
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.json")
    results = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = json.load(f)
    gin_config.parse(["post_training_tasks"], args.gin_param)
    with gin.config_scope("rl"):
        spec = TaskSpec()
    for method in args.methods:
        if method in results:
            continue
        run_dir, seconds, spent = run_method(
            method, args.sft, args.out, args.steps, args.seed, args.gin_param
        )
        results[method] = {
            **evaluate(run_dir, spec, args.samples, args.seed),
            "seconds": seconds,
            **spent,
        }
        with open(results_path, "w") as f:
            json.dump(results, f)
        print(
            f"{method}: held-out pass@1 {np.mean(results[method]['pass@1']):.3f} ({seconds:.0f} s)",
            flush=True,
        )
    budget = args.steps * SAMPLES_PER_STEP
    print(
        f"\nbudget: {budget} episodes per method ({args.steps} steps x {SAMPLES_PER_STEP}); "
        "a method that sampled more is marked *"
    )
    print(
        "\n| method | held-out success, pass@1 (95% CI) | vs SFT (95% CI) | greedy success "
        "| tool calls / episode | episodes | generated tokens | training s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for method in args.methods:
        r = results[method]
        mean, low, high = bootstrap_ci(r["pass@1"], seed=args.seed)
        diff = (
            bootstrap_ci(r["pass@1"], paired_with=results["sft"]["pass@1"], seed=args.seed)
            if "sft" in results and method != "sft"
            else None
        )
        versus = "" if diff is None else f"{diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}]"
        print(
            f"| {method} | {mean:.3f} [{low:.3f}, {high:.3f}] | {versus} | {np.mean(r['greedy']):.3f} | "
            f"{r['tool_calls']:.2f} | {r['episodes']:,}{'*' if r['episodes'] > budget else ''} | "
            f"{r['generated_tokens']:,} | {r['seconds']:.0f} |"
        )


if __name__ == "__main__":
    main()
