"""Multi-agent debate: agents answer, read each other's answers, and answer again.

Du et al. 2023, *Improving Factuality and Reasoning in Language Models through Multiagent
Debate*: in round 1 every debater answers alone; in each later round it sees the others'
previous answers and gives an updated one.  Every answer is broadcast to the other debaters
still in (not to those excluded after a failure), so n debaters and r rounds send n·r ``answer``
messages.

The debate ends

* when every remaining debater gives the same answer (after normalisation, see ``voting.py``):
  stop reason ``answer``;
* otherwise after ``max_rounds`` rounds, or after ``patience`` rounds in a row in which no
  remaining debater's answer changed (``no_progress``; a debater dropping out is no change).
  Then a ``judge``, if there is one, reads the last answers and decides (stop reason
  ``answer``; its verdict is a ``verdict`` message to the debaters); without a judge, or if it
  fails, the tally of the last answers (confidence-weighted when ``weighted``) is the answer,
  and the stop reason says the debate did not converge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gin

from agentic_jax.agents.multi_agent.team import Pattern, Team, TeamLimits, TeamMember
from agentic_jax.agents.multi_agent.voting import ANSWER_FORMAT, normalize, parse_vote, tally
from agentic_jax.agents.tools.budget import Pricing, StopReason

FIRST_PROMPT = "{task}\n\n" + ANSWER_FORMAT
LATER_PROMPT = (
    "{task}\n\nYour previous answer: {own}\n\nThe other agents answered:\n{others}\n\n"
    "Weigh their reasoning against yours and give your updated answer. " + ANSWER_FORMAT
)
JUDGE_PROMPT = (
    "{task}\n\nThe debaters' final answers:\n{answers}\n\nJudge which answer is "
    "right. " + ANSWER_FORMAT
)


@gin.configurable(module="multi_agent")
class Debate(Pattern):
    """``debaters`` argue for up to ``max_rounds`` rounds; see the module docstring."""

    name = "debate"

    def __init__(
        self,
        debaters: Sequence[TeamMember],
        *,
        judge: TeamMember | None = None,
        weighted: bool = False,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        if len(debaters) < 2:
            raise ValueError(f"a debate needs at least two debaters, got {len(debaters)}")
        self.debaters, self.judge, self.weighted = list(debaters), judge, weighted

    def members(self) -> list[TeamMember]:
        return [*self.debaters, *([self.judge] if self.judge else [])]

    def body(self, team: Team, task: str, artifacts: dict[str, Any]):
        debaters = [d.name for d in self.debaters]
        replies: dict[str, str] = {}  # the latest reply of each debater still in
        history = artifacts.setdefault("rounds", [])
        last: dict[str, str] = {}  # the previous round's normalised answers
        while team.next_round():
            previous = dict(replies)
            for name in team.available(debaters):
                if name in previous:
                    others = (
                        "\n".join(
                            f"- {n}: {parse_vote(r)[0]}" for n, r in previous.items() if n != name
                        )
                        or "(none)"
                    )
                    prompt = LATER_PROMPT.format(
                        task=task, own=parse_vote(previous[name])[0], others=others
                    )
                else:
                    prompt = FIRST_PROMPT.format(task=task)
                reply = team.turn(name, prompt)
                replies.pop(name, None)
                if reply is not None:
                    team.send(
                        name, [d for d in team.available(debaters) if d != name], "answer", reply
                    )
                    replies[name] = reply
            if not replies:
                return None, StopReason.AGENTS_FAILED, "every debater failed"
            answers = {n: normalize(parse_vote(r)[0]) for n, r in replies.items()}
            history.append(answers)
            if len(set(answers.values())) == 1:
                team.decide("agreement", f"all {len(answers)} debaters agree")
                return (
                    parse_vote(next(iter(replies.values())))[0],
                    StopReason.ANSWER,
                    f"all {len(answers)} debaters agreed in round {team.round}",
                )
            # Only the debaters still in: one dropping out changes nobody's answer.
            changed = any(last.get(n) != a for n, a in answers.items())
            last = answers
            if team.progress(changed):
                return self._conclude(
                    team,
                    task,
                    replies,
                    StopReason.NO_PROGRESS,
                    f"no answer changed for {team.limits.patience} rounds",
                )
        return self._conclude(
            team,
            task,
            replies,
            StopReason.MAX_ROUNDS,
            f"no agreement after max_rounds={team.limits.max_rounds}",
        )

    def _conclude(
        self, team: Team, task: str, replies: dict[str, str], reason: StopReason, detail: str
    ) -> tuple[str, StopReason, str]:
        """The judge's verdict, or else the tally of the last answers."""
        if self.judge is not None:
            answers = "\n".join(f"- {n}: {r}" for n, r in replies.items())
            verdict = team.turn(self.judge.name, JUDGE_PROMPT.format(task=task, answers=answers))
            if verdict is not None:
                team.send(self.judge.name, list(replies), "verdict", verdict)
                return parse_vote(verdict)[0], StopReason.ANSWER, f"{detail}; the judge decided"
        votes = [parse_vote(r) for r in replies.values()]
        result = tally([a for a, _ in votes], [c if self.weighted else 1.0 for _, c in votes])
        team.decide(
            "tally",
            f"{detail}; {result.weight:g} of {result.total:g} votes for the winner",
            tally=result.weights,
        )
        return result.winner, reason, f"{detail}; the vote decided"
