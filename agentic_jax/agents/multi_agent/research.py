"""A research workflow: a planner, a researcher with local search, a writer and a critic.

The planner turns the task into research questions (a numbered list); the researcher answers
each with the ``search`` tool over a local corpus (BM25, ``retrieval.py``; by default the notes
shipped in ``agentic_jax/data/research_corpus``), citing the passages it used; the writer
drafts a report from the notes; the critic replies ``ACCEPT`` or says what to fix, and the
writer revises until the critic accepts (stop reason ``answer``), a draft repeats the previous
one ``patience`` times (``no_progress``), or ``max_rounds`` drafts were rejected
(``max_rounds``; the answer is then the last draft).

Messages: ``question`` (planner to researcher), ``notes`` (researcher to writer), ``draft``
(writer to critic), ``feedback`` or ``accept`` (critic to writer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gin

from agentic_jax.agents.loops.plan_execute import parse_plan
from agentic_jax.agents.loops.workflows import accepts
from agentic_jax.agents.multi_agent.team import Pattern, Team, TeamLimits, TeamMember
from agentic_jax.agents.multi_agent.voting import normalize
from agentic_jax.agents.tools.budget import Pricing, StopReason
from agentic_jax.agents.tools.retrieval import Retriever, retrieval_tool

RESEARCH_CORPUS = Path(__file__).resolve().parents[2] / "data" / "research_corpus"

PLAN_PROMPT = (
    "Task: {task}\n\nWrite the research questions that must be answered for this task: "
    "a numbered list, one question per line, nothing else."
)
RESEARCH_PROMPT = (
    "Task: {task}\nResearch question: {question}\n\nUse the search tool to find "
    "the answer in the document collection. Reply with short notes that answer "
    "the question, citing the passages by their [id]."
)
WRITE_PROMPT = "Task: {task}\n\nResearch notes:\n{notes}\n\nWrite the report."
REVISE_PROMPT = (
    "Task: {task}\n\nResearch notes:\n{notes}\n\nYour previous draft:\n{draft}\n\n"
    "The critic's feedback:\n{feedback}\n\nWrite the revised report."
)
CRITIQUE_PROMPT = (
    "Task: {task}\n\nResearch notes:\n{notes}\n\nDraft report:\n{draft}\n\nIf the "
    "report is accurate to the notes and complete, reply ACCEPT. Otherwise say "
    "what to fix."
)


@gin.configurable(module="multi_agent")
class ResearchWorkflow(Pattern):
    """See the module docstring; ``corpus`` is what :meth:`Retriever.from_path` reads, ``k`` the
    number of passages a search returns unless the researcher asks for another."""

    name = "research"

    def __init__(
        self,
        planner: TeamMember,
        researcher: TeamMember,
        writer: TeamMember,
        critic: TeamMember,
        *,
        corpus: str | Path = RESEARCH_CORPUS,
        k: int = 2,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        self.planner, self.researcher, self.writer, self.critic = (
            planner,
            researcher,
            writer,
            critic,
        )
        self.search = retrieval_tool(Retriever.from_path(corpus), default_k=k)

    def members(self) -> list[TeamMember]:
        return [self.planner, self.researcher, self.writer, self.critic]

    def body(self, team: Team, task: str, artifacts: dict[str, Any]):
        planner, researcher = self.planner.name, self.researcher.name
        writer, critic = self.writer.name, self.critic.name
        team.next_round()
        plan = team.turn(planner, PLAN_PROMPT.format(task=task))
        if plan is None:
            return None, StopReason.AGENTS_FAILED, "the planner failed"
        notes = artifacts.setdefault("notes", [])
        for question in parse_plan(plan) or [task]:
            team.send(planner, researcher, "question", question)
            found = team.turn(
                researcher, RESEARCH_PROMPT.format(task=task, question=question), [self.search]
            )
            if found is None:
                return None, StopReason.AGENTS_FAILED, f"the researcher failed on {question!r}"
            team.send(researcher, writer, "notes", found)
            notes.append({"question": question, "notes": found})
        notes_text = "\n".join(f"- {n['question']}\n  {n['notes']}" for n in notes)
        drafts = artifacts.setdefault("drafts", [])
        feedback = None
        while True:
            prompt = (
                WRITE_PROMPT.format(task=task, notes=notes_text)
                if feedback is None
                else REVISE_PROMPT.format(
                    task=task, notes=notes_text, draft=drafts[-1], feedback=feedback
                )
            )
            draft = team.turn(writer, prompt)
            if draft is None:
                return (
                    (drafts[-1] if drafts else None),
                    StopReason.AGENTS_FAILED,
                    "the writer failed",
                )
            repeated = bool(drafts) and normalize(draft) == normalize(drafts[-1])
            drafts.append(draft)
            team.send(writer, critic, "draft", draft)
            review = team.turn(
                critic, CRITIQUE_PROMPT.format(task=task, notes=notes_text, draft=draft)
            )
            if review is None:
                return draft, StopReason.AGENTS_FAILED, "the critic failed"
            accepted = accepts(review)
            team.send(critic, writer, "accept" if accepted else "feedback", review)
            if accepted:
                return draft, StopReason.ANSWER, f"the critic accepted draft {len(drafts)}"
            feedback = review
            if team.progress(not repeated):
                return (
                    draft,
                    StopReason.NO_PROGRESS,
                    (f"the writer repeated its draft {team.limits.patience} times"),
                )
            if not team.next_round():
                return (
                    draft,
                    StopReason.MAX_ROUNDS,
                    (f"the critic accepted none of {len(drafts)} drafts"),
                )
