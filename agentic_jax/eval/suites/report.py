"""A suite's results as a researcher reports them: ``results.json``, ``report.md`` and plots.

``results.json`` holds the suite's settings, seeds, prompt and chat-template hashes, what was
evaluated, every aggregate and every episode (failed and errored ones included), so that
`compare` can refuse two results whose settings differ and pair the rest task by task.
Robustness variants are reported against the original interface as paired differences of
per-task success with bootstrap intervals.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

import numpy as np
from matplotlib.figure import Figure

from agentic_jax.eval.agent_metrics import Episode, check_comparable, summarize
from agentic_jax.eval.metrics import bootstrap_ci
from agentic_jax.eval.stats import wilson_interval
from agentic_jax.eval.suites.consistency import (
    calibration,
    calibration_markdown,
    write_reliability,
)
from agentic_jax.eval.suites.robustness import variant
from agentic_jax.eval.suites.suite import Suite, prompt_hashes
from agentic_jax.eval.suites.training_data import (
    TrainingData,
    contamination,
    contamination_markdown,
)
from agentic_jax.files import atomic_write

COLUMNS = (
    ("success", "success"),
    ("pass@k", None),
    ("pass^k", None),
    ("steps", "steps"),
    ("tokens", "tokens"),
    ("efficiency", "efficiency"),
    ("tool P", "tool_precision"),
    ("tool R", "tool_recall"),
    ("invalid calls", "invalid_call_rate"),
    ("recovery", "recovery_rate"),
    ("latency p50 s", "latency_p50_s"),
    ("latency p90 s", "latency_p90_s"),
)


def per_task_success(episodes) -> dict[str, float]:
    """Mean success over each task's trials."""
    by: dict[str, list[bool]] = {}
    for e in episodes:
        by.setdefault(e.task_id, []).append(e.success)
    return {t: float(np.mean(v)) for t, v in by.items()}


def paired_difference(episodes, baseline, seed: int = 0) -> tuple[float, float, float]:
    """Mean difference of per-task success (``episodes`` minus ``baseline``) and its bootstrap
    interval, over the tasks both cover."""
    a, b = per_task_success(episodes), per_task_success(baseline)
    tasks = sorted(set(a) & set(b))
    if len(tasks) < 2:
        raise ValueError("a paired difference needs at least 2 tasks in common")
    return bootstrap_ci([a[t] for t in tasks], paired_with=[b[t] for t in tasks], seed=seed)


def build_result(
    suite: Suite,
    episodes: dict[str, list[Episode]],
    evaluated: str,
    training_data: TrainingData | None = None,
) -> dict:
    """Aggregates per variant, the contamination check against ``training_data`` (skipped
    when None) and the self-consistency calibration, beside every episode."""
    variants = {}
    for name, eps in episodes.items():
        successes = sum(e.success for e in eps)
        low, high = wilson_interval(successes, len(eps))
        variants[name] = {
            "changes": variant(name).changes,
            "summary": summarize(eps, max_steps=suite.max_steps, ks=suite.ks),
            "success_interval": [low, high],
        }
        if name != "original":
            mean, low, high = paired_difference(eps, episodes["original"])
            variants[name]["difference_vs_original"] = [mean, low, high]
    return {
        "suite": suite.name,
        "settings": suite.settings(),
        "seeds": list(suite.seeds),
        "hashes": prompt_hashes(suite),
        "evaluated": evaluated,
        "variants": variants,
        "contamination": contamination(suite, episodes, training_data),
        "calibration": {n: calibration(eps) for n, eps in episodes.items()},
        "episodes": {n: [e.to_json() for e in eps] for n, eps in episodes.items()},
    }


def _cell(value) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def markdown(result: dict) -> str:
    ks = result["settings"]["ks"]
    k = max(ks)
    # Stateful tasks: the final database against the goal state, beside success.
    stateful = any("goal_state" in v["summary"] for v in result["variants"].values())
    columns = (COLUMNS[0], ("goal state", "goal_state"), *COLUMNS[1:]) if stateful else COLUMNS
    lines = [
        f"# Evaluation: suite `{result['suite']}`",
        "",
        f"Evaluated: `{result['evaluated']}`; sampling seeds {result['seeds']}; "
        f"temperature {result['settings']['temperature']}; "
        f"chat template `{result['hashes']['chat_template']}`.",
        "",
        "| variant | episodes | "
        + " | ".join(c.replace("k", str(k)) if c.startswith("pass") else c for c, _ in columns)
        + " |",
        "|" + " --- |" * (len(columns) + 2),
    ]
    for name, v in result["variants"].items():
        s = v["summary"]
        cells = [
            _cell(s.get(c.replace("k", str(k)))) if key is None else _cell(s.get(key))
            for c, key in columns
        ]
        low, high = v["success_interval"]
        cells[0] = f"{s['success']:.3f} [{low:.3f}, {high:.3f}]"
        lines.append(f"| {name} | {s['episodes']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Success with a Wilson 95% interval; pass@{k}: some of {k} trials of a task succeed, "
        f"pass^{k}: all {k} do. Latency per model call."
        + (
            " Goal state: the episode's final database equals the task's goal state (the "
            "golden actions applied to its initial state); success also needs every answer the "
            "user asked for."
            if stateful
            else ""
        ),
    ]
    robust = {n: v for n, v in result["variants"].items() if "difference_vs_original" in v}
    if robust:
        lines += [
            "",
            "## Robustness: each variant against the original interface",
            "",
            "| variant | what changes | success | difference [95% CI] |",
            "| --- | --- | --- | --- |",
        ]
        for name, v in robust.items():
            mean, low, high = v["difference_vs_original"]
            lines.append(
                f"| {name} | {v['changes']} | {v['summary']['success']:.3f} | "
                f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] |"
            )
    spread = {n: v["summary"] for n, v in result["variants"].items()}
    lines += [
        "",
        "Run-to-run standard deviation of success (one run per sampling seed): "
        + ", ".join(
            f"{n} {s['run_success_std']:.3f} over {s['runs']} runs" for n, s in spread.items()
        )
        + ".",
    ]
    lines += contamination_markdown(result["contamination"])
    lines += calibration_markdown(result["calibration"])
    return "\n".join(lines) + "\n"


def plot_success(result: dict, path) -> None:
    names = list(result["variants"])
    rates = [result["variants"][n]["summary"]["success"] for n in names]
    # Clipped at 0: at 0 or n successes a Wilson bound equals the rate up to rounding.
    lows = [
        max(0.0, r - result["variants"][n]["success_interval"][0]) for n, r in zip(names, rates)
    ]
    highs = [
        max(0.0, result["variants"][n]["success_interval"][1] - r) for n, r in zip(names, rates)
    ]
    fig = Figure(figsize=(max(4, 1.2 * len(names)), 3.2))
    ax = fig.add_subplot()
    ax.bar(names, rates, yerr=[lows, highs], capsize=4, color="#4c72b0")
    ax.set_ylim(0, 1)
    ax.set_ylabel("success (Wilson 95%)")
    ax.set_title(f"suite {result['suite']}")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)


def write_files(
    out_dir: str | Path,
    result: dict,
    report: str,
    plots: Mapping[str, Callable[[IO], None]],
) -> list[Path]:
    """Writes ``results.json``, ``report.md`` and each plot (``file name -> draw(file)``) into
    ``out_dir``, each atomically; returns their paths.  Every suite's report goes through it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "report.md"]
    for path, text in zip(paths, (json.dumps(result, indent=1, sort_keys=True), report)):
        with atomic_write(path) as f:
            f.write(text)
    for name, draw in plots.items():
        paths.append(out_dir / name)
        with atomic_write(paths[-1], "wb") as f:
            draw(f)
    return paths


def write_report(result: dict, out_dir: str | Path) -> list[Path]:
    """Writes ``results.json``, ``report.md``, ``success.png`` and, when calibration was
    measured, ``reliability.png`` (the first variant's); returns their paths."""
    plots = {"success.png": functools.partial(plot_success, result)}
    paths = write_files(out_dir, result, markdown(result), plots)
    name, section = next(iter(result["calibration"].items()))
    title = f"suite {result['suite']}, {name}"
    if write_reliability(section, Path(out_dir) / "reliability.png", title):
        paths.append(Path(out_dir) / "reliability.png")
    return paths


def load_result(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.exists():
        raise FileNotFoundError(f"no evaluation result at {path}")
    return json.loads(path.read_text())


def compare(a: dict, b: dict) -> dict:
    """Paired differences (``b`` minus ``a``) of per-task success, variant by variant.  Refuses
    (``ValueError``) results whose settings, seeds or prompt and template hashes differ, or
    whose episodes do not start from the same tasks, states and verifiers."""
    for field in ("suite", "settings", "seeds", "hashes"):
        if a[field] != b[field]:
            raise ValueError(f"the results differ in {field}: not comparable")
    out = {}
    for name in a["episodes"]:
        ea = [Episode.from_json(e) for e in a["episodes"][name]]
        eb = [Episode.from_json(e) for e in b["episodes"][name]]
        check_comparable(ea, eb)
        out[name] = paired_difference(eb, ea)
    return out
