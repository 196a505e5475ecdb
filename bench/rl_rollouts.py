"""One GRPO step with its rollouts decoded by padded `generate` calls vs by the serving engine.

    python -m bench.rl_rollouts --init_from runs/quickstart/sft     # about 10 min on 2 cores
    python -m bench.rl_rollouts --init_from runs/quickstart/sft --quick   # 2 prompts x 2, 1 step

Both arms run the same `rl_step` (sample → score → advantages → learn) of the main job's RL stage
(`configs/quickstart.gin`: the calculator tasks of ``rl/TaskSpec``, GRPO, 8 prompts x 8 samples at
temperature 1) from the same learner, on the same step seeds, so they draw the same prompts and
spend the same budget: the same episodes per step and the same number of steps.  Only the decoder
differs:

* "generate": one padded, jitted `generate` per turn over all 64 rows, finished rows included,
  until the turn's longest reply ends;
* "engine": each unfinished row's turn is a request to the serving engine (paged KV cache,
  continuous batching over 16 slots, prefix caching across an episode's turns), so a short reply
  frees its slot at once and a finished episode costs nothing.

Every measured step starts from the initial learner, so both arms sample from the identical
policy; the first step of each arm (compilation) is timed apart.  Steps alternate between the arms
(generate, engine, generate, ...) so that a change in the machine's load hits both.  The table
counts episodes and the policy tokens each arm sampled, and reports generation and training
seconds per step (the step's own ``generation_seconds`` / ``training_seconds``) and their ratio.
The two samplers use different random streams (the engine seeds each row's request), so their
rewards agree in distribution, not token for token.
"""

from __future__ import annotations

import argparse

import gin
import numpy as np

from agentic_jax import config as gin_config
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.rl import RLConfig, init_learner, make_setup, rl_step
from agentic_jax.post_training.tasks import TaskSpec
from pallas_kernels.benchmarking import describe_device

BACKENDS = ("generate", "engine")


def main_job_tasks() -> TaskSpec:
    """The main job's RL tasks: ``rl/TaskSpec`` of ``configs/post_training_tasks.gin``."""
    gin_config.parse(["post_training_tasks"], [])
    with gin.config_scope("rl"):
        tasks = TaskSpec()
    gin.clear_config()
    return tasks


def measure(
    init_from: str,
    tasks: TaskSpec,
    *,
    steps: int = 3,
    prompts: int = 8,
    group_size: int = 8,
) -> dict[str, list[dict]]:
    """``{backend: [the step's record, ...]}``: a compile step (record 0) then ``steps`` measured
    steps per arm, alternating arms, each from the initial learner."""
    config, base, tokenizer = load_checkpoint(init_from)
    env = tasks.env(tokenizer, "train")
    algo = RLConfig(group_size=group_size, prompts_per_step=prompts, temperature=1.0)
    setups = {
        backend: make_setup(
            config, base, env, algo, steps=steps + 1, peak_lr=1e-4, seed=0, backend=backend
        )
        for backend in BACKENDS
    }
    learner = init_learner(setups["generate"])
    records = {backend: [] for backend in BACKENDS}
    for step in range(1, steps + 2):
        for backend, setup in setups.items():
            _, record = rl_step(setup, learner, step)
            record["episodes"] = prompts * group_size
            record["policy_tokens"] = round(record["response_length"] * prompts * group_size)
            records[backend].append(record)
    return records


def summarize(records: dict[str, list[dict]]) -> dict[str, dict]:
    """Per arm: totals over the measured steps (record 0, the compile step, left out)."""
    out = {}
    for backend, rs in records.items():
        measured = rs[1:]
        out[backend] = {
            "steps": len(measured),
            "episodes": sum(r["episodes"] for r in measured),
            "policy_tokens": sum(r["policy_tokens"] for r in measured),
            "generation_s": float(np.mean([r["generation_seconds"] for r in measured])),
            "training_s": float(np.mean([r["training_seconds"] for r in measured])),
            "compile_step_s": rs[0]["generation_seconds"] + rs[0]["training_seconds"],
            "success_rate": float(np.mean([r["success_rate"] for r in measured])),
        }
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init_from", required=True, help="a run directory (model/, tokenizer)")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per arm")
    parser.add_argument("--quick", action="store_true", help="2 prompts x 2 samples, 1 step")
    args = parser.parse_args()
    size = dict(steps=1, prompts=2, group_size=2) if args.quick else dict(steps=args.steps)
    print(describe_device())
    table = summarize(measure(args.init_from, main_job_tasks(), **size))
    print(
        f"{'backend':>9} {'steps':>5} {'episodes':>8} {'tokens':>7} {'gen s/step':>10} "
        f"{'train s/step':>12} {'compile s':>9} {'success':>7}"
    )
    for backend, row in table.items():
        print(
            f"{backend:>9} {row['steps']:>5} {row['episodes']:>8} {row['policy_tokens']:>7} "
            f"{row['generation_s']:>10.2f} {row['training_s']:>12.2f} "
            f"{row['compile_step_s']:>9.1f} {row['success_rate']:>7.3f}"
        )
    generate, engine = table["generate"], table["engine"]
    step_s = {name: row["generation_s"] + row["training_s"] for name, row in table.items()}
    print(
        f"generation: engine is {generate['generation_s'] / engine['generation_s']:.2f}x the "
        f"speed of generate; whole step: {step_s['generate'] / step_s['engine']:.2f}x"
    )


if __name__ == "__main__":
    main()
