"""``agentic-jax eval --suite arena``: two or more policies in pairwise battles, rated.

Every contestant plays the same held-out problems of an agent `Suite` through the harness;
every pair of contestants then meets once on every problem.  A battle is decided by the
task's verifier (the environment's reward on each final answer: the higher wins, equal rewards
tie; cheap and exact), or, with ``judge`` bound, by an LLM judge comparing the two answers in
both orders (Zheng et al. 2023, arXiv:2306.05685).  The battles give Chatbot Arena's report
(`agentic_jax.eval.arena`): Bradley-Terry ratings with bootstrap intervals refitted under
``jax.vmap``, the same with length and markdown covariates (style control), online Elo, the
win-rate matrix and a leaderboard.

Contestants come from the command line: ``--checkpoint`` and ``--endpoint`` given once each per
contestant (``eval.run.evaluate`` opens them); each is named by its path or URL and model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from collections.abc import Mapping
from pathlib import Path

import gin
import numpy as np
from tqdm import tqdm

from agentic_jax.agents.policies.base import Policy
from agentic_jax.eval import arena
from agentic_jax.eval.judge import PairwiseJudge, position_bias_report
from agentic_jax.eval.suites import judging
from agentic_jax.eval.suites.episodes import verifier_id
from agentic_jax.eval.suites.report import write_files


def contestant_dir(name: str) -> str:
    """A directory name for a contestant's episodes: readable, and unique by a hash of the full
    name, so a resumed run finds each contestant's episodes whatever the order given."""
    slug = re.sub(r"[^\w.-]+", "_", name).strip("_")[-40:]
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


@gin.configurable(module="eval")
@dataclasses.dataclass(frozen=True)
class ArenaSuite(judging.JudgedSuite):
    """``judge``: None to decide battles by the verifier, or a judge policy named
    ``judge_name``.  Ratings: ``resamples`` bootstrap refits (percentile intervals); Elo with
    step ``elo_k`` (see `JudgedSuite` for the rest)."""

    judge: Policy | None = None
    judge_name: str = "judge"
    resamples: int = 1000
    elo_k: float = 4.0

    def settings(self) -> dict:
        return {
            **super().settings(),
            "judged_by": "verifier" if self.judge is None else self.judge_name,
            "resamples": self.resamples,
            "elo_k": self.elo_k,
        }

    def evaluate(
        self, policies: Mapping[str, Policy], out_dir: str | Path, *, progress: bool = True
    ) -> dict:
        """Plays, judges and rates ``policies`` (name -> policy) into ``out_dir`` (resuming its
        journals); returns the result also written to ``results.json``."""
        names = list(policies)
        if len(names) < 2:
            raise ValueError(
                f"the arena needs at least two contestants, got {len(names)}: give "
                "--checkpoint and --endpoint once per contestant"
            )
        out_dir = Path(out_dir)
        played = [
            judging.answers(
                self.tasks,
                policies[n],
                out_dir / "contestants" / contestant_dir(n),
                progress=progress,
            )
            for n in names
        ]
        schedule = [
            (item, a, b)
            for item in range(len(played[0]))
            for a, b in itertools.combinations(range(len(names)), 2)
        ]
        if self.judge is None:
            sign = {1: "A", -1: "B", 0: "tie"}  # of reward a - reward b
            winners = [
                sign[int(np.sign(played[a][i].episode.reward - played[b][i].episode.reward))]
                for i, a, b in schedule
            ]
            verdicts = None
        else:
            judge = PairwiseJudge(
                judging.RecordedJudge(self.judge, self.judge_name, out_dir / "judgements.jsonl"),
                self.pairwise_prompt,
                {"temperature": 0.0, "max_tokens": self.max_tokens},
                self.judge_name,
            )
            verdicts = [
                judge.compare_both_orders(
                    played[a][i].question, played[a][i].text, played[b][i].text
                )
                for i, a, b in tqdm(schedule, desc="arena battles", disable=not progress)
            ]
            winners = [v.winner for v in verdicts]
        decided = [(s, w) for s, w in zip(schedule, winners) if w is not None]
        if not decided:
            raise ValueError(
                f"no battle was decided: none of the judge's replies had a 'Verdict:' line "
                f"(see {out_dir / 'judgements.jsonl'})"
            )
        battles = arena.Battles(
            np.array([a for (_, a, _), _ in decided]),
            np.array([b for (_, _, b), _ in decided]),
            np.array([judging.WIN[w] for _, w in decided]),
            arena.style_features(
                [played[a][i].text for (i, a, _), _ in decided],
                [played[b][i].text for (i, _, b), _ in decided],
            ),
        )
        matrix = arena.win_rate_matrix(battles, len(names))
        result = {
            **self.header(names, "arena"),
            "judged_by": (
                {"verifier": sorted({verifier_id(r) for _, _, r in self.tasks.problems()})}
                if self.judge is None
                else {"judge": self.judge_name, "prompt_sha256": self.pairwise_prompt.sha256}
            ),
            "schedule": {
                "problems": len(played[0]),
                "pairs": len(names) * (len(names) - 1) // 2,
                "battles": len(schedule),
                "decided": len(decided),
            },
            "success": {n: judging.success_interval(p) for n, p in zip(names, played)},
            **self._ratings(len(names), battles),
            "win_rates": [[None if np.isnan(v) else float(v) for v in row] for row in matrix],
            "battles": [
                {
                    "task_id": played[a][i].episode.task_id,
                    "seed": played[a][i].episode.seed,
                    "trial": played[a][i].episode.trial,
                    "a": names[a],
                    "b": names[b],
                    "reward_a": played[a][i].episode.reward,
                    "reward_b": played[b][i].episode.reward,
                    "winner": w,
                }
                for (i, a, b), w in zip(schedule, winners)
            ],
        }
        if verdicts is not None:
            result["position_bias"] = dataclasses.asdict(position_bias_report(verdicts))
        plots = {
            "ratings.png": lambda f: arena.plot_ratings(
                names, *(result["ratings"][k] for k in ("rating", "low", "high")), f
            ),
            "win_rates.png": lambda f: arena.plot_win_rates(names, matrix, f),
        }
        write_files(out_dir, result, markdown(result), plots)
        return result

    def _ratings(self, m: int, battles: arena.Battles) -> dict:
        """Bradley-Terry with and without style control, their bootstrap intervals, Elo and
        battle counts of ``m`` contestants, each as lists in contestant order."""
        boot = dict(resamples=self.resamples, seed=self.seed, confidence=self.confidence)
        out = {}
        for key, style in (("ratings", None), ("style_ratings", True)):
            fit = arena.bt_ratings(battles, m, style=style)
            interval = arena.bootstrap_ratings(battles, m, style=style, **boot)
            out[key] = {
                "rating": fit.ratings.tolist(),
                "low": interval.low.tolist(),
                "high": interval.high.tolist(),
            }
            if style:
                out["style_coefficients"] = dict(zip(arena.STYLE_FEATURES, fit.style.tolist()))
        return {
            **out,
            "elo": arena.elo(battles, m, k=self.elo_k).tolist(),
            "battle_counts": arena.battle_counts(battles, m).tolist(),
        }


def markdown(result: dict) -> str:
    """The report: leaderboards with and without style control, Elo, win rates, success."""
    names = result["evaluated"]
    schedule = result["schedule"]
    arena_settings = result["settings"]["arena"]
    judged = result["judged_by"]
    how = (
        "the task's verifier (the higher reward on the final answer wins, equal rewards tie)"
        if "verifier" in judged
        else f"the judge `{judged['judge']}` in both orders (prompt sha256 "
        f"`{judged['prompt_sha256'][:16]}`; a win needs both orders)"
    )
    level = f"{arena_settings['confidence']:.0%}"
    counts = result["battle_counts"]

    def board(key):
        r = result[key]
        return arena.leaderboard(names, r["rating"], r["low"], r["high"], counts).rstrip()

    lines = [
        f"# Arena: suite `{result['suite']}`",
        "",
        f"{len(names)} contestants, {schedule['problems']} problems, every pair once per "
        f"problem: {schedule['battles']} battles ({schedule['decided']} decided), judged by "
        f"{how}.",
        "",
        f"## Leaderboard (Bradley-Terry, {level} bootstrap over "
        f"{arena_settings['resamples']} resamples)",
        "",
        board("ratings"),
        "",
        "## Style-controlled (length, headers, list items, bold as covariates)",
        "",
        board("style_ratings"),
        "",
        "Style coefficients (log-odds per standard deviation of the difference): "
        + ", ".join(f"{k} {v:+.3f}" for k, v in result["style_coefficients"].items())
        + ".",
        "",
        "## Elo, win rates and verifier success",
        "",
    ]
    rows = []
    for i, name in enumerate(names):
        s = result["success"][name]
        low, high = s["interval"]
        rates = ["–" if v is None else f"{v:.2f}" for v in result["win_rates"][i]]
        rows.append(
            [
                f"{i + 1}. `{name}`",
                f"{result['elo'][i]:.0f}",
                f"{s['success']:.3f} [{low:.3f}, {high:.3f}]",
                *rates,
            ]
        )
    lines += judging.table(
        ["contestant", f"Elo (k={arena_settings['elo_k']:g})", "success [Wilson 95%]"]
        + [f"vs {j + 1}" for j in range(len(names))],
        rows,
    )
    lines += [
        "",
        "*vs j*: the share of battles won against contestant j (rows in the order above, a tie "
        "counting half). Elo depends on battle order; Bradley-Terry does not (Chiang et al. "
        "2024).",
    ]
    if "position_bias" in result:
        bias = result["position_bias"]
        lines += [
            "",
            f"Position bias of the judge: {bias['inconsistent']} of {bias['pairs']} battles had "
            f"orders that disagreed; the answer shown first won {bias['first_position_wins']} of "
            f"{bias['judgements']} judgements, the second {bias['second_position_wins']}.",
        ]
    lines += ["", "![ratings](ratings.png)", "", "![win rates](win_rates.png)"]
    return "\n".join(lines) + "\n"
