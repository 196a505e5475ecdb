"""``agentic-jax eval --suite judge``: an LLM judge grades the evaluated model's answers.

The evaluated policy answers an agent `Suite`'s held-out problems through the harness; each
final answer is graded pointwise against a rubric and compared pairwise, in both orders, with
the task's reference answer (MT-Bench's single-answer grading and reference-guided pairwise
comparison, Zheng et al. 2023, arXiv:2306.05685).  The report puts beside every number what
makes it trustworthy or not: verdicts whose two orders disagree (position bias), the win rate
at equal length (Dubois et al. 2024, arXiv:2404.04475), the agreement of several judges, the
judge's scores of answers the task's verifier found right and wrong, and the sha256 of every
judge prompt.

Judges are policies bound in gin (``eval.JudgeSuite.judges = {"name": @.../agents.JaxPolicy()}``
or an ``HTTPPolicy``).  With none bound, the evaluated model judges its own answers: that run
is labelled self-judged throughout, since a model favours its own answers (Zheng et al. 2023's
self-enhancement bias) and a small model may not follow a judge prompt at all; its scores are a
smoke test of the pipeline, not a measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import gin
import numpy as np
from matplotlib.figure import Figure
from tqdm import tqdm

from agentic_jax.agents.policies.base import Policy
from agentic_jax.eval.judge import (
    DEFAULT_RUBRIC,
    POINTWISE_PROMPT,
    JudgePanel,
    JudgePrompt,
    PairwiseJudge,
    PanelResult,
    PointwiseJudge,
    length_controlled_win_rate,
    outcomes,
    position_bias_report,
)
from agentic_jax.eval.metrics import bootstrap_ci
from agentic_jax.eval.suites.judging import (
    WIN,
    Answer,
    JudgedSuite,
    RecordedJudge,
    answers,
    success_interval,
    table,
)
from agentic_jax.eval.suites.report import write_files


def mean_interval(values: Sequence[float], confidence: float, seed: int) -> list | None:
    """``[mean, low, high]`` with a BCa bootstrap interval; the interval is None for one value,
    the whole None for none."""
    if not values:
        return None
    if len(values) == 1:
        return [float(values[0]), None, None]
    return list(bootstrap_ci(values, confidence=confidence, seed=seed))


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _cell(interval: list | None) -> str:
    if interval is None:
        return "–"
    mean, low, high = interval
    return _number(mean) if low is None else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _prompt_id(prompt: JudgePrompt) -> dict:
    return {"name": prompt.name, "version": prompt.version, "sha256": prompt.sha256}


@gin.configurable(module="eval")
@dataclasses.dataclass(frozen=True)
class JudgeSuite(JudgedSuite):
    """``judges``: name -> judge policy, or None for the evaluated model judging itself.
    ``pointwise``: rubric scores on ``scale`` under ``pointwise_prompt``; ``pairwise``:
    both-order comparisons with the reference answer.  Intervals are BCa bootstrap intervals
    (see `JudgedSuite` for the rest)."""

    judges: Mapping[str, Policy] | None = None
    pointwise: bool = True
    pairwise: bool = True
    rubric: str = DEFAULT_RUBRIC
    scale: tuple[int, int] = (1, 10)
    pointwise_prompt: JudgePrompt = POINTWISE_PROMPT

    def __post_init__(self):
        super().__post_init__()
        if not (self.pointwise or self.pairwise):
            raise ValueError("JudgeSuite needs pointwise or pairwise judging (or both)")
        if self.judges is not None and not self.judges:
            raise ValueError("JudgeSuite.judges is empty: bind judges, or None for self-judging")

    def settings(self) -> dict:
        return {
            **super().settings(),
            "pointwise": self.pointwise,
            "pairwise": self.pairwise,
            "rubric": self.rubric,
            "scale": list(self.scale),
        }

    def evaluate(
        self, policy: Policy, out_dir: str | Path, *, evaluated: str, progress: bool = True
    ) -> dict:
        """Answers, judges and reports into ``out_dir`` (resuming its journals); returns the
        result also written to ``results.json``."""
        out_dir = Path(out_dir)
        items = answers(self.tasks, policy, out_dir, progress=progress)
        if not items:
            raise ValueError("the judge suite's tasks have no problems: bind eval.Suite.generators")
        self_judged = self.judges is None
        judges = {f"self: {evaluated}": policy} if self_judged else dict(self.judges)
        recorded = [RecordedJudge(p, n, out_dir / "judgements.jsonl") for n, p in judges.items()]
        sampling = {"temperature": 0.0, "max_tokens": self.max_tokens}
        pointwise = [
            PointwiseJudge(j, self.pointwise_prompt, self.rubric, self.scale, sampling, j.name)
            for j in recorded
            if self.pointwise
        ]
        pairwise = [
            PairwiseJudge(j, self.pairwise_prompt, sampling, j.name)
            for j in recorded
            if self.pairwise
        ]
        graded = [(a.question, a.text) for a in items]
        compared = [(a.question, a.text, a.reference) for a in items]
        calls = len(items) * (len(pointwise) + 2 * len(pairwise))
        with tqdm(total=calls, desc="judging", disable=not progress) as bar:

            def each(judge_fn, arguments, calls_per_item):
                out = []
                for item in arguments:
                    out.append(judge_fn(*item))
                    bar.update(calls_per_item)
                return out

            scores = {j.name: each(j.score, graded, 1) for j in pointwise}
            verdicts = {j.name: each(j.compare_both_orders, compared, 2) for j in pairwise}
        result = {
            **self.header(evaluated, "judging"),
            "self_judged": self_judged,
            "judges": list(judges),
            "judge_prompts": {
                "pointwise": _prompt_id(self.pointwise_prompt),
                "pairwise": _prompt_id(self.pairwise_prompt),
            },
            "verifier": success_interval(items),
            "judge_failures": {j.name: j.failure_summary() for j in recorded},
            "pointwise": {n: self._pointwise(s, items) for n, s in scores.items()},
            "pairwise": {n: self._pairwise(v, items) for n, v in verdicts.items()},
            "items": [
                {
                    "task_id": a.episode.task_id,
                    "seed": a.episode.seed,
                    "trial": a.episode.trial,
                    "question": a.question,
                    "reference": a.reference,
                    "answer": a.episode.answer,
                    "success": a.episode.success,
                    "scores": {n: s[i].score for n, s in scores.items()},
                    "verdicts": {n: v[i].winner for n, v in verdicts.items()},
                    "positions": {n: list(v[i].positions) for n, v in verdicts.items()},
                }
                for i, a in enumerate(items)
            ],
        }
        if len(judges) > 1:  # the panel re-reads the journaled replies: no judge is asked again
            result["panel"] = {}
            if pointwise:
                panel = JudgePanel(pointwise).score(graded)
                consensus = [c for c in panel.consensus if c is not None]
                result["panel"]["pointwise"] = {
                    **_agreement(panel),
                    "consensus_mean_score": mean_interval(consensus, self.confidence, self.seed),
                }
            if pairwise:
                panel = JudgePanel(pairwise).compare(compared)
                wins = [WIN[c] for c in panel.consensus if c is not None]
                result["panel"]["pairwise"] = {
                    **_agreement(panel),
                    "consensus_win_rate": mean_interval(wins, self.confidence, self.seed),
                }
        plots = {"judge.png": lambda f: plot_judgements(result, f)}
        write_files(out_dir, result, markdown(result), plots)
        return result

    def _pointwise(self, scores, items: Sequence[Answer]) -> dict:
        parsed = [s.score for s in scores if s.score is not None]
        by_verifier = {
            label: [
                s.score
                for s, a in zip(scores, items)
                if s.score is not None and a.episode.success == right
            ]
            for label, right in (("verifier_right", True), ("verifier_wrong", False))
        }
        return {
            "prompt_sha256": scores[0].prompt_sha256,
            "scored": len(parsed),
            "unparseable": len(scores) - len(parsed),
            "mean_score": mean_interval(parsed, self.confidence, self.seed),
            **{
                f"mean_score_{label}": float(np.mean(values)) if values else None
                for label, values in by_verifier.items()
            },
        }

    def _pairwise(self, verdicts, items: Sequence[Answer]) -> dict:
        decided = [(v, a) for v, a in zip(verdicts, items) if v.winner is not None]
        wins = outcomes([v for v, _ in decided])
        try:
            lc = dataclasses.asdict(
                length_controlled_win_rate(
                    wins, [len(a.text) - len(a.reference) for _, a in decided]
                )
            )
        except ValueError as e:  # no decided verdict, or length alone separates the outcomes
            lc = {"error": str(e)}
        return {
            "prompt_sha256": verdicts[0].prompt_sha256,
            "decided": len(decided),
            "undecided": len(verdicts) - len(decided),
            "wins": int(np.sum(wins == 1)),
            "ties": int(np.sum(wins == 0.5)),
            "losses": int(np.sum(wins == 0)),
            "win_rate": mean_interval(wins.tolist(), self.confidence, self.seed),
            "length_controlled": lc,
            "position_bias": dataclasses.asdict(position_bias_report(verdicts)),
        }


def _agreement(panel: PanelResult) -> dict:
    names = panel.judges
    return {
        "judges": list(names),
        "agreement_items": panel.agreement_items,
        "mean_cohen_kappa": panel.mean_cohen_kappa,
        "fleiss_kappa": panel.fleiss_kappa,
        "cohen_kappa": {
            f"{names[j]} vs {names[k]}": v for (j, k), v in panel.pairwise_kappa.items()
        },
    }


def markdown(result: dict) -> str:
    """The report: tables of scores, win rates, position bias and panel agreement."""
    settings = result["settings"]
    judging = settings["judging"]
    verifier = result["verifier"]
    low, high = verifier["interval"]
    lines = [
        f"# Evaluation: suite `{result['suite']}` (LLM-as-judge)",
        "",
        f"Evaluated: `{result['evaluated']}`; {len(result['items'])} answers to held-out "
        f"problems, temperature {settings['temperature']}; right by the task's verifier: "
        f"{verifier['success']:.3f} [{low:.3f}, {high:.3f}] (Wilson 95%).",
        "",
        "Judges: "
        + ", ".join(f"`{j}`" for j in result["judges"])
        + "; prompts "
        + ", ".join(
            f"`{p['name']}` v{p['version']} (sha256 `{p['sha256'][:16]}`)"
            for kind, p in result["judge_prompts"].items()
            if judging[kind]
        )
        + ".",
    ]
    if result["self_judged"]:
        lines += [
            "",
            "> **Self-judged**: no judge was configured, so the evaluated model graded its own "
            "answers. Models favour their own answers (self-enhancement bias, Zheng et al. "
            "2023) and a small model may not follow a judge prompt at all: read these numbers "
            "as a check of the pipeline, not a measurement. Bind `eval.JudgeSuite.judges` for "
            "a real judge.",
        ]
    failures = {n: f for n, f in result["judge_failures"].items() if f["failed_calls"]}
    for name, failure in failures.items():
        lines += [
            "",
            f"Judge `{name}`: {failure['failed_calls']} calls failed (read as unparseable), "
            f"e.g. {failure['first_failure']}",
        ]
    level = f"{judging['confidence']:.0%}"
    if result["pointwise"]:
        lo, hi = judging["scale"]
        rows = [
            [
                f"`{name}`",
                f"{s['scored']} / {s['scored'] + s['unparseable']}",
                _cell(s["mean_score"]),
                _number(s["mean_score_verifier_right"]),
                _number(s["mean_score_verifier_wrong"]),
            ]
            for name, s in result["pointwise"].items()
        ]
        lines += [
            "",
            f"## Pointwise rubric scores ({lo}–{hi})",
            "",
            *table(
                [
                    "judge",
                    "parsed",
                    f"mean score [{level} bootstrap]",
                    "verifier: right",
                    "verifier: wrong",
                ],
                rows,
            ),
            "",
            "A judge that measures correctness scores the answers the verifier found right "
            "above those it found wrong.",
        ]
    if result["pairwise"]:
        rows = []
        for name, p in result["pairwise"].items():
            bias = p["position_bias"]
            lc = p["length_controlled"]
            rows.append(
                [
                    f"`{name}`",
                    f"{p['decided']} / {p['decided'] + p['undecided']}",
                    _cell(p["win_rate"]),
                    f"{p['wins']} / {p['ties']} / {p['losses']}",
                    _number(lc.get("length_controlled")),
                    f"{bias['inconsistent']} / {bias['pairs']}",
                    f"{bias['first_position_wins']} / {bias['second_position_wins']} / {bias['ties']}",
                ]
            )
        lines += [
            "",
            "## Pairwise against the reference answer, both orders",
            "",
            *table(
                [
                    "judge",
                    "decided",
                    f"win rate [{level} bootstrap]",
                    "wins / ties / losses",
                    "LC win rate",
                    "inconsistent / pairs",
                    "position wins: 1st / 2nd / tie",
                ],
                rows,
            ),
            "",
            "An answer wins only if it wins in both orders, and orders that disagree are a tie "
            "(Zheng et al. 2023); a tie counts half a win. *Inconsistent*: pairs whose two "
            "orders disagreed; an unbiased judge wins as often in the first position as in the "
            "second. *LC*: the win rate at equal length, from a logistic fit on the length "
            "difference (Dubois et al. 2024); – where no fit exists (see results.json).",
        ]
    panel = result.get("panel", {})
    if panel:
        rows = [
            [
                kind,
                str(p["agreement_items"]),
                f"{p['mean_cohen_kappa']:.3f}",
                f"{p['fleiss_kappa']:.3f}",
                _cell(p.get("consensus_mean_score", p.get("consensus_win_rate"))),
            ]
            for kind, p in panel.items()
        ]
        lines += [
            "",
            f"## Judge panel ({len(result['judges'])} judges)",
            "",
            *table(
                ["judging", "items all parsed", "mean Cohen's κ", "Fleiss' κ", "consensus"],
                rows,
            ),
            "",
            "Cohen's κ between each pair of judges (quadratic weights on scores), averaged; "
            "consensus: the median score, or the plurality verdict's win rate.",
        ]
    lines += ["", "![judgements](judge.png)"]
    return "\n".join(lines) + "\n"


def plot_judgements(result: dict, file) -> None:
    """A PNG: each judge's score distribution, and its win rate against the reference with its
    interval beside the length-controlled one."""
    panels = [k for k in ("pointwise", "pairwise") if result[k]]
    fig = Figure(figsize=(5.0 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, kind in zip(axes, panels):
        names = list(result[kind])
        if kind == "pointwise":
            low, high = result["settings"]["judging"]["scale"]
            grid = np.arange(low, high + 1)
            width = 0.8 / len(names)
            for j, name in enumerate(names):
                given = [
                    i["scores"][name] for i in result["items"] if i["scores"][name] is not None
                ]
                counts = [given.count(v) for v in grid]
                ax.bar(grid + (j - (len(names) - 1) / 2) * width, counts, width, label=name)
            ax.set_xticks(grid)
            ax.set_xlabel("score")
            ax.set_ylabel("answers")
            ax.legend(fontsize=7)
        else:
            x = np.arange(len(names))
            rates = [result[kind][n]["win_rate"] or [np.nan, None, None] for n in names]
            means = np.array([r[0] for r in rates])
            errors = [
                [0.0 if r[1] is None else max(0.0, r[0] - r[1]) for r in rates],
                [0.0 if r[2] is None else max(0.0, r[2] - r[0]) for r in rates],
            ]
            ax.bar(x, means, 0.5, yerr=errors, capsize=4, label="win rate")
            controlled = [
                result[kind][n]["length_controlled"].get("length_controlled") for n in names
            ]
            ax.plot(x, [np.nan if c is None else c for c in controlled], "kx", label="LC win rate")
            ax.axhline(0.5, color="grey", lw=0.8, ls="--")
            ax.set_xticks(x, names, rotation=20, ha="right", fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_ylabel("win rate vs the reference")
            ax.legend(fontsize=7)
        ax.set_title(kind)
    fig.tight_layout()
    fig.savefig(file, format="png", dpi=120)
