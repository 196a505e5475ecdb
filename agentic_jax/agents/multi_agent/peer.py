"""Peer-to-peer message passing: agents address each other directly, with no coordinator.

Every member gets two tools besides its own: ``send_message(to, content)``, which puts a message
in a peer's mailbox (the recipient is checked against the team's names by the tool's schema), and
``final_answer(answer)``, which ends the run after the caller's turn.  The router delivers in
synchronous rounds (as in the bulk-synchronous model): the messages sent in round r are read in
round r + 1, where each member with mail takes one turn (in member order) on the task and its
inbox.  What a member says outside ``send_message`` stays with it.

Round 1 delivers the task to the ``entry`` member.  The run stops when someone gives the final
answer, when no message is in flight (``no_progress``: nobody can act again), or at
``max_rounds`` / ``max_messages``.  A final answer stands even if the same turn then hits a
limit: it was given within them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import gin

from agentic_jax.agents.multi_agent.team import (
    AgentMessage,
    Pattern,
    Team,
    TeamLimits,
    TeamMember,
    TeamStop,
    inbox,
)
from agentic_jax.agents.tools.base import Tool, ToolError, tool
from agentic_jax.agents.tools.budget import Pricing, StopReason

USER = "(user)"  # no member name has parentheses, so no peer can be mistaken for the user
PEER_PROMPT = (
    "Team task: {task}\nYour peers: {peers}.\n\nYour messages:\n{inbox}\n\nAct on them: "
    "use send_message to ask or tell a peer something, final_answer when the team's "
    "answer is ready; then end your turn with a short note."
)


@gin.configurable(module="multi_agent")
class PeerNetwork(Pattern):
    """Members message each other through mailboxes; see the module docstring."""

    name = "peer_network"

    def __init__(
        self,
        peers: Sequence[TeamMember],
        *,
        entry: str | None = None,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        self.peers = list(peers)
        names = [p.name for p in self.peers]
        self.entry = names[0] if entry is None and names else entry
        if self.entry not in names:
            raise ValueError(f"entry {entry!r} is not one of the peers {names}")

    def members(self) -> list[TeamMember]:
        return self.peers

    def body(self, team: Team, task: str, artifacts: dict[str, Any]):
        mailboxes: dict[str, list[AgentMessage]] = {name: [] for name in team.members}
        final: dict[str, str] = {}
        mailboxes[self.entry].append(team.send(USER, self.entry, "task", task))
        while team.next_round():
            delivered = {n: box for n, box in mailboxes.items() if box}
            mailboxes = {name: [] for name in team.members}
            if not delivered:
                return None, StopReason.NO_PROGRESS, "no message is in flight and nobody answered"
            for name in team.available(delivered):
                peers = [p for p in team.members if p != name]
                prompt = PEER_PROMPT.format(
                    task=task, peers=", ".join(peers) or "none", inbox=inbox(delivered[name])
                )
                try:
                    team.turn(name, prompt, _peer_tools(team, name, peers, mailboxes, final))
                    team.check()  # a message limit hit inside a tool
                except TeamStop:
                    if not final:
                        raise
                if final:  # given within the limits, so it stands even if the turn then hit one
                    artifacts["final_answer_by"] = final["agent"]
                    return final["answer"], StopReason.ANSWER, f"{final['agent']} gave the answer"
        return (
            None,
            StopReason.MAX_ROUNDS,
            (f"no final answer within max_rounds={team.limits.max_rounds}"),
        )


def _peer_tools(
    team: Team,
    sender: str,
    peers: list[str],
    mailboxes: dict[str, list[AgentMessage]],
    final: dict[str, str],
) -> list[Tool]:
    def send_message(to: str, content: str) -> str:
        """Send a message to a peer; it reads it in the next round.

        Args:
            to: the peer's name.
            content: the message.
        """
        try:
            message = team.send(sender, to, "message", content)
        except TeamStop as stop:  # raised again by the pattern after this turn
            team.pending = stop
            raise ToolError(stop.detail) from None
        mailboxes[to].append(message)
        return f"sent to {to}"

    # The schema names the peers (an enum), so a model cannot address anyone else.
    send_message.__annotations__["to"] = Literal[tuple(peers)]

    def final_answer(answer: str) -> str:
        """Give the team's final answer; the run ends after your turn.

        Args:
            answer: the answer to the team task.
        """
        final.update(agent=sender, answer=answer)
        return "recorded; end your turn"

    return [tool(send_message), tool(final_answer)] if peers else [tool(final_answer)]
