"""Voting: independent answers combined by plurality, or by confidence-weighted consensus.

Sampling several answers and keeping the most common one (self-consistency, Wang et al. 2023,
*Self-Consistency Improves Chain of Thought Reasoning in Language Models*) is the simplest way a
team beats its members.  :func:`tally` counts answers after normalisation (case, surrounding
whitespace and a final full stop do not matter); each carries a weight: 1 for a plain majority,
the member's stated confidence for confidence-weighted consensus.

**Tie-break (deterministic).**  The largest total weight wins; among answers with equal totals,
the one given first wins (in the order of the votes, which is member order).  So a tie never
depends on hashing, timing or the order in which a pattern happened to collect replies.  Totals
are equal up to float round-off (relative 1e-9): confidences such as 0.1 + 0.2 and 0.3 tie,
though their float sums differ in the last bit.

**Delphi rounds** (:class:`Delphi`; Dalkey & Helmer 1963, *An Experimental Application of the
Delphi Method to the Use of Experts*, Management Science 9(3)).  Panelists answer alone; in each
later round each one reads the previous round's answers *anonymised* (:func:`panel_summary`:
every distinct answer with how many gave it, and for numbers the median and interquartile
range, never who said what) beside its own, and revises.  Anonymity is the point: revisions
follow the arguments' numbers, not the standing of whoever made them.  The panel has converged
when all answers agree, or, for numeric estimates, when their interquartile range is at most
``tolerance``; the panel's answer is then the median (numbers) or the tally (otherwise).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

import gin
import numpy as np

from agentic_jax.agents.multi_agent.team import Pattern, Team, TeamLimits, TeamMember
from agentic_jax.agents.tools.budget import Pricing, StopReason

ANSWER_FORMAT = (
    "Reply with your answer on a line 'ANSWER: <answer>' and, on another line, "
    "'CONFIDENCE: <a number from 0 to 1>'."
)
VOTE_PROMPT = "{task}\n\n" + ANSWER_FORMAT
DELPHI_PROMPT = (
    "{task}\n\nYour previous answer: {own}\n\nThe panel's answers in the previous round "
    "(anonymous):\n{summary}\n\nReconsider and give your revised answer. " + ANSWER_FORMAT
)
FACILITATOR = "(facilitator)"  # no member name has parentheses

# A closing punctuation mark ("CONFIDENCE: 0.8.") is common in model output.
_CONFIDENCE = re.compile(r"(?im)^\s*confidence\s*[:=]\s*(\d*\.?\d+)\s*(%?)\s*[.,;!]?\s*$")
_ANSWER = re.compile(r"(?im)^\s*(?:final\s+)?answer\s*[:=]\s*(.*?)\s*$")


class Tally(NamedTuple):
    winner: str  # the winning answer as first given
    weight: float  # its total weight
    total: float  # all votes' weight
    weights: dict[str, float]  # normalised answer -> total weight, in order of first appearance


def normalize(answer: str) -> str:
    return " ".join(answer.casefold().split()).rstrip(".")


def parse_vote(text: str) -> tuple[str, float]:
    """``(answer, confidence)`` from a reply: the answer is the last ``ANSWER:`` line (else the
    whole reply without its confidence line), the confidence the ``CONFIDENCE:`` line (a number
    in [0, 1] or a percentage, clipped to [0, 1], maybe followed by a punctuation mark; 1 when
    absent)."""
    confidence = 1.0
    found = _CONFIDENCE.findall(text)
    if found:
        value, percent = found[-1]
        confidence = min(1.0, max(0.0, float(value) / (100 if percent else 1)))
    answers = _ANSWER.findall(text)
    answer = answers[-1] if answers else _CONFIDENCE.sub("", text)
    return answer.strip(), confidence


def tally(answers: Sequence[str], weights: Sequence[float] | None = None) -> Tally:
    """Weighted plurality over ``answers`` (weight 1 each unless given), with the module's
    tie-break."""
    if not answers:
        raise ValueError("tally needs at least one answer")
    weights = [1.0] * len(answers) if weights is None else [float(w) for w in weights]
    if len(weights) != len(answers):
        raise ValueError(f"tally got {len(weights)} weights for {len(answers)} answers")
    if any(not w >= 0 for w in weights):
        raise ValueError(f"vote weights must be non-negative numbers, got {weights}")
    totals: dict[str, float] = {}
    first: dict[str, str] = {}
    for answer, weight in zip(answers, weights):
        key = normalize(answer)
        totals[key] = totals.get(key, 0.0) + weight
        first.setdefault(key, answer)
    best = max(totals.values())
    key = next(
        k
        for k, w in totals.items()  # dicts keep first-appearance order
        if math.isclose(w, best, rel_tol=1e-9)
    )
    return Tally(first[key], totals[key], sum(weights), totals)


@gin.configurable(module="multi_agent")
class Vote(Pattern):
    """Each member answers the task on its own; the tally of their answers (a majority, or with
    ``weighted`` their confidences) is the team's answer.  Members that fail are left out."""

    name = "vote"

    def __init__(
        self,
        voters: Sequence[TeamMember],
        *,
        weighted: bool = False,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        self.voters, self.weighted = list(voters), weighted

    def members(self) -> list[TeamMember]:
        return self.voters

    def body(self, team: Team, task: str, artifacts: dict):
        team.next_round()
        names, answers, weights = [], [], []
        for name in team.available():
            reply = team.turn(name, VOTE_PROMPT.format(task=task))
            if reply is None:
                continue
            team.send(name, "tally", "answer", reply)
            answer, confidence = parse_vote(reply)
            names.append(name)
            answers.append(answer)
            weights.append(confidence if self.weighted else 1.0)
        artifacts["votes"] = list(zip(names, answers, weights))
        if not answers:
            return None, StopReason.AGENTS_FAILED, "no member gave an answer"
        result = tally(answers, weights)
        artifacts["tally"] = result.weights
        detail = f"{result.weight:g} of {result.total:g} votes for the winner"
        team.decide("tally", detail, tally=result.weights)
        return result.winner, StopReason.ANSWER, detail


def _number(x: float) -> str:
    return f"{x:.15g}"


def numbers(answers: Sequence[str]) -> list[float] | None:
    """The answers as finite numbers, or ``None`` if any is not one."""
    try:
        values = [float(normalize(a).replace(",", "")) for a in answers]
    except ValueError:
        return None
    return values if all(map(math.isfinite, values)) else None


def panel_summary(answers: Sequence[str]) -> str:
    """A Delphi round's anonymous feedback: each distinct answer and how many gave it (most
    first, then alphabetically, so the listing says nothing of who answered first), and for
    numeric answers the median and interquartile range (linear quartiles)."""
    counts = tally(answers).weights
    lines = [
        f"- {answer} ({count:g} of {len(answers)})"
        for answer, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    values = numbers(answers)
    if values is not None:
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        lines.append(
            f"median {_number(median)}, interquartile range {_number(q1)} to {_number(q3)}"
        )
    return "\n".join(lines)


@gin.configurable(module="multi_agent")
class Delphi(Pattern):
    """``panelists`` revise their answers over anonymous rounds until they converge (see the
    module docstring), for at most ``limits.max_rounds`` rounds; ``patience`` rounds in a row
    without a changed answer also end it.  Each round sends every answer to the facilitator
    (``estimate``) and, after the first, the summary to the panel (``feedback``)."""

    name = "delphi"

    def __init__(
        self,
        panelists: Sequence[TeamMember],
        *,
        tolerance: float = 0.0,
        weighted: bool = False,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        if len(panelists) < 2:
            raise ValueError(f"a Delphi panel needs at least two panelists, got {len(panelists)}")
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be a non-negative number, got {tolerance!r}")
        self.panelists, self.tolerance, self.weighted = list(panelists), tolerance, weighted

    def members(self) -> list[TeamMember]:
        return self.panelists

    def body(self, team: Team, task: str, artifacts: dict):
        votes: dict[str, tuple[str, float]] = {}  # the latest (answer, confidence) of each
        history = artifacts.setdefault("rounds", [])
        while team.next_round():
            previous = dict(votes)
            summary = panel_summary([a for a, _ in previous.values()]) if previous else None
            if summary is not None:
                team.send(FACILITATOR, team.available(), "feedback", summary)
            for name in team.available():
                prompt = (
                    VOTE_PROMPT.format(task=task)
                    if name not in previous
                    else DELPHI_PROMPT.format(task=task, own=previous[name][0], summary=summary)
                )
                reply = team.turn(name, prompt)
                votes.pop(name, None)
                if reply is not None:
                    team.send(name, FACILITATOR, "estimate", reply)
                    votes[name] = parse_vote(reply)
            if not votes:
                return None, StopReason.AGENTS_FAILED, "every panelist failed"
            history.append({n: a for n, (a, _) in votes.items()})
            answer, converged, spread = self._consensus(list(votes.values()))
            if converged:
                team.decide("consensus", spread)
                return answer, StopReason.ANSWER, f"the panel converged in round {team.round}"
            changed = any(
                normalize(a) != normalize(previous.get(n, ("",))[0]) for n, (a, _) in votes.items()
            )
            if team.progress(changed):
                detail = f"no answer changed for {team.limits.patience} rounds"
                return answer, StopReason.NO_PROGRESS, f"{detail}; {spread}"
        detail = f"no consensus after max_rounds={team.limits.max_rounds}"
        return answer, StopReason.MAX_ROUNDS, f"{detail}; {spread}"

    def _consensus(self, votes: list[tuple[str, float]]) -> tuple[str, bool, str]:
        """The panel's answer, whether it has converged, and its spread in words: the median
        and interquartile range of numbers, else the tally's winner and the distinct answers."""
        answers = [a for a, _ in votes]
        values = numbers(answers)
        if values is not None:
            q1, median, q3 = np.percentile(values, [25, 50, 75])
            spread = f"interquartile range {_number(q3 - q1)}, tolerance {_number(self.tolerance)}"
            return _number(median), q3 - q1 <= self.tolerance, spread
        result = tally(answers, [c if self.weighted else 1.0 for _, c in votes])
        return result.winner, len(result.weights) == 1, f"{len(result.weights)} distinct answers"
