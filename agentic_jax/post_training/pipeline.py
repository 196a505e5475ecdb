"""The main job: a tool-using agent from scratch -- tokenizer, pretraining, SFT, RL, evaluation.

``post_training(workdir)`` runs, each stage in its own directory and each resumable::

    tokenizer.json   byte-level BPE on the shipped corpus plus rendered task conversations
    pretrain/        next-token pretraining on the shipped corpus (``training.loop.train``)
    sft/             SFT on tool-use demonstrations (``train_sft``)
    rl/              RL (GRPO by default) on the RL problems (``train_rl``)
    report.json      held-out success (greedy), pass@k (temperature 1), tool calls per episode
                     and mean reward of the SFT and the RL model on new problems of the RL task,
                     paired bootstrap 95% intervals of the RL - SFT differences, the RL curves
    report.png       reward, success, KL and response length over RL steps

A stage whose ``model/`` exists is skipped, so running the command again after an interruption
continues where it stopped (stages resume from their own checkpoints too).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence

import gin
import jax
import numpy as np

from agentic_jax.data.chat import render
from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.tokenizer import train_tokenizer
from agentic_jax.eval import bootstrap_ci
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.evaluate import evaluate_policy
from agentic_jax.post_training.rl import train_rl
from agentic_jax.post_training.sft import train_sft
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.loop import train
from agentic_jax.training.metrics import read_metrics

CURVES = (
    ("reward_mean", "reward"),
    ("success_rate", "success rate"),
    ("kl", "KL to reference"),
    ("response_length", "response tokens"),
)


def _done(stage_dir: str) -> bool:
    return os.path.exists(os.path.join(stage_dir, "model", "config.json"))


def task_tokenizer(
    path: str, specs: list[TaskSpec], vocab_size: int, corpus: list[str] | None = None
) -> None:
    """Trains the BPE on ``corpus`` (default: the shipped one) plus the specs' rendered train
    conversations, so that numbers, tags and tool-call JSON get compact tokens."""
    text = os.path.join(os.path.dirname(path), "task_conversations.txt")
    with open(text, "w") as f:
        f.write(
            "\n\n".join(render(t.conversation()) for spec in specs for t in spec.tasks("train"))
        )
    files = corpus_files("train") if corpus is None else list(corpus)
    train_tokenizer(path, files=files + [text], vocab_size=vocab_size)


def evaluate_run(
    run_dir: str, tasks: TaskSpec, samples: int, seed: int, name: str = "heldout_eval"
) -> dict:
    """Held-out metrics (and per-task greedy successes) of a run's model on ``tasks``, kept in
    ``run_dir/<name>.json`` so that a rerun of the pipeline does not evaluate again; a kept
    result of other problems, samples or seed is evaluated anew."""
    path = os.path.join(run_dir, f"{name}.json")
    problems = [(t.prompt[-1].content, t.answer) for t in tasks.tasks("heldout")]
    setting = hashlib.sha256(json.dumps([problems, samples, seed]).encode()).hexdigest()[:16]
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)
        if kept.get("setting") == setting:
            return kept
    config, params, tokenizer = load_checkpoint(run_dir)
    result = evaluate_policy(
        params, config, tasks.env(tokenizer, "heldout"), samples=samples, key=jax.random.key(seed)
    )
    out = {
        **result.summary(),
        "per_task_success": result.success.astype(int).tolist(),
        "per_task_sampled_correct": result.sampled_correct.tolist(),
        "samples": samples,
        "setting": setting,
    }
    with open(path, "w") as f:
        json.dump(out, f)
    return out


def plot_report(records: list[dict], path: str, title: str) -> None:
    """Reward, success, KL and length by RL step, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.2))
    for ax, (key, label) in zip(axes, CURVES):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax.plot(*zip(*points), label="train batch")
        if key == "success_rate":
            held = [(r["step"], r["eval_success"]) for r in records if "eval_success" in r]
            if held:
                ax.plot(*zip(*held), marker="o", label="held-out (greedy)")
            ax.legend()
        ax.set_title(label)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def by_slice(tasks: TaskSpec, before: dict, after: dict, samples: int) -> dict:
    """Held-out greedy success and pass@1 of both models on each (family, difficulty) slice of
    ``tasks`` (from the per-task results, in bank order), e.g. ``"Arithmetic/3"``."""
    slices = [f"{t.family}/{t.difficulty}" for t in tasks.tasks("heldout")]
    out = {}
    for name in dict.fromkeys(slices):
        rows = [i for i, s in enumerate(slices) if s == name]
        out[name] = {
            "problems": len(rows),
            **{
                f"{key}_{model}": float(np.mean(np.take(run[f"per_task_{field}"], rows)) / scale)
                for model, run in (("sft", before), ("rl", after))
                for key, field, scale in (
                    ("success", "success", 1),
                    ("pass@1", "sampled_correct", samples),
                )
            },
        }
    return out


def _print_slices(slices: dict) -> None:
    for name, row in slices.items():
        print(
            f"  {name} ({row['problems']} problems): greedy {row['success_sft']:.3f} -> "
            f"{row['success_rl']:.3f}, pass@1 {row['pass@1_sft']:.3f} -> {row['pass@1_rl']:.3f}",
            flush=True,
        )


@gin.configurable
def post_training(
    workdir: str,
    *,
    sft_tasks: TaskSpec = TaskSpec(),
    rl_tasks: TaskSpec = TaskSpec(),
    vocab_size: int = 4096,
    tokenizer_corpus: list[str] | None = None,
    tokenizer_tasks: Sequence[TaskSpec] = (),
    eval_samples: int = 4,
    seed: int = 0,
) -> dict:
    """Runs the stages (see the module docstring) and returns the report.

    The stages' own settings come from gin: ``train.*`` (pretraining), ``train_sft.*`` and
    ``train_rl.*``; their ``tasks`` are ``sft_tasks`` and ``rl_tasks``.  The SFT and the RL model
    are evaluated on ``rl_tasks``' held-out problems, and on ``sft_tasks``' (``retention``: what
    RL kept of what SFT learned, the easier slices RL did not train on included).  The tokenizer is fit on
    ``tokenizer_corpus`` (default: the shipped corpus) plus the train conversations of the tasks
    and of ``tokenizer_tasks`` (more of the family than SFT and RL train on: their numbers then
    get tokens of their own).
    """
    os.makedirs(workdir, exist_ok=True)
    stage = {name: os.path.join(workdir, name) for name in ("pretrain", "sft", "rl")}
    tokenizer_path = os.path.join(workdir, "tokenizer.json")
    if not os.path.exists(tokenizer_path):
        print(f"[1/4] tokenizer -> {tokenizer_path}", flush=True)
        task_tokenizer(
            tokenizer_path, [sft_tasks, rl_tasks, *tokenizer_tasks], vocab_size, tokenizer_corpus
        )
    if not _done(stage["pretrain"]):
        print("[2/4] pretraining", flush=True)
        os.makedirs(stage["pretrain"], exist_ok=True)
        shutil.copy(tokenizer_path, os.path.join(stage["pretrain"], "tokenizer.json"))
        train(stage["pretrain"])
    if not _done(stage["sft"]):
        print("[3/4] SFT on tool-use demonstrations", flush=True)
        train_sft(stage["sft"], init_from=stage["pretrain"], tasks=sft_tasks)
    if not _done(stage["rl"]):
        print("[4/4] RL", flush=True)
        train_rl(stage["rl"], init_from=stage["sft"], tasks=rl_tasks)

    print("evaluating the SFT and RL models on held-out problems", flush=True)
    before = evaluate_run(stage["sft"], rl_tasks, eval_samples, seed)
    after = evaluate_run(stage["rl"], rl_tasks, eval_samples, seed)
    greedy = bootstrap_ci(
        after["per_task_success"], paired_with=before["per_task_success"], seed=seed
    )
    sampled = bootstrap_ci(
        np.divide(after["per_task_sampled_correct"], eval_samples),
        paired_with=np.divide(before["per_task_sampled_correct"], eval_samples),
        seed=seed,
    )
    kept = [
        evaluate_run(stage[name], sft_tasks, eval_samples, seed, "sft_heldout_eval")
        for name in ("sft", "rl")
    ]
    retention = bootstrap_ci(
        kept[1]["per_task_success"], paired_with=kept[0]["per_task_success"], seed=seed
    )
    records = read_metrics(os.path.join(stage["rl"], "metrics.jsonl"))
    report = {
        "before_rl": before,
        "after_rl": after,
        "improvement": {
            "success_difference": greedy[0],
            "success_ci95": list(greedy[1:]),
            "pass@1_difference": sampled[0],
            "pass@1_ci95": list(sampled[1:]),
        },
        "by_slice": by_slice(rl_tasks, before, after, eval_samples),
        "retention": {
            "success_sft": kept[0]["success"],
            "success_rl": kept[1]["success"],
            "success_difference": retention[0],
            "success_ci95": list(retention[1:]),
            "by_slice": by_slice(sft_tasks, *kept, eval_samples),
        },
        "rl_curves": [
            {k: r[k] for k in r if k == "step" or k in dict(CURVES) or k.startswith("eval_")}
            for r in records
        ],
    }
    with open(os.path.join(workdir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot_report(
        records,
        os.path.join(workdir, "report.png"),
        "RL on the training problems; held-out success",
    )
    for name, key, (mean, low, high) in (
        ("greedy success", "success", greedy),
        ("pass@1", "pass@1", sampled),
    ):
        print(
            f"held-out {name}: {before[key]:.3f} (SFT) -> {after[key]:.3f} (RL), difference {mean:+.3f}, "
            f"95% CI [{low:+.3f}, {high:+.3f}]",
            flush=True,
        )
    _print_slices(report["by_slice"])
    mean, low, high = retention
    print(
        f"SFT's held-out problems (retention): greedy {kept[0]['success']:.3f} (SFT) -> "
        f"{kept[1]['success']:.3f} (RL), difference {mean:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}]",
        flush=True,
    )
    _print_slices(report["retention"]["by_slice"])
    print(
        f"tool calls per episode {before['tool_calls']:.2f} -> {after['tool_calls']:.2f}",
        flush=True,
    )
    return {
        "success_sft": before["success"],
        "success_rl": after["success"],
        "pass@1_sft": before["pass@1"],
        "pass@1_rl": after["pass@1"],
    }
