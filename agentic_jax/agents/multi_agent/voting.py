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
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

import gin

from agentic_jax.agents.multi_agent.team import Pattern, Team, TeamLimits, TeamMember
from agentic_jax.agents.tools.budget import Pricing, StopReason

ANSWER_FORMAT = (
    "Reply with your answer on a line 'ANSWER: <answer>' and, on another line, "
    "'CONFIDENCE: <a number from 0 to 1>'."
)
VOTE_PROMPT = "{task}\n\n" + ANSWER_FORMAT

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
