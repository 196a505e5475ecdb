"""What the judge and arena suites share: the answers judged, judges that never ask twice,
Markdown tables.

The answers are an agent `Suite`'s episodes (its problems at held-out seeds, played through the
harness by `run_suite`, so resumed from ``episodes.jsonl``); each is judged against the
question and the task's reference answer.  A judge's replies are journaled in
``judgements.jsonl`` as they arrive, so an interrupted run, or a panel re-reading items its
judges already graded, asks nothing twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import gin

from agentic_jax.agents.policies.base import AssistantMessage, Policy, PolicyError
from agentic_jax.eval.agent_metrics import Episode
from agentic_jax.eval.judge import PAIRWISE_PROMPT, JudgePrompt
from agentic_jax.eval.stats import wilson_interval
from agentic_jax.eval.suites.episodes import task_id
from agentic_jax.eval.suites.suite import Suite, prompt_hashes, run_suite

WIN = {"A": 1.0, "tie": 0.5, "B": 0.0}  # a verdict as the outcome of the answer shown as A


@gin.configurable(module="eval")
def environment_variable(name: str = gin.REQUIRED) -> str:
    """The value of the environment variable ``name``: a judge endpoint's key in gin
    (``judge/agents.HTTPPolicy.api_key = @judge/eval.environment_variable()``), so that the
    configs saved beside a report name the variable, never the secret."""
    if name not in os.environ:
        raise KeyError(f"the environment variable {name!r} is not set")
    return os.environ[name]


@dataclasses.dataclass(frozen=True)
class Answer:
    """One episode's final answer, with what a judge sees beside it: the user's question (the
    system message's format rules are instructions to the model, not the question) and the
    final turn of the task's correct demonstration as the reference answer."""

    episode: Episode
    question: str
    reference: str

    @property
    def text(self) -> str:
        """The answer (empty when the episode ended without one: it is judged as given)."""
        return self.episode.answer or ""


@dataclasses.dataclass(frozen=True)
class JudgedSuite:
    """What the judge and arena suites share.  ``tasks``: the agent suite whose problems are
    answered (the gin-configured `Suite` when None); a judge replies greedily in at most
    ``max_tokens`` tokens, comparing two answers under ``pairwise_prompt``; intervals are at
    ``confidence``, resampled from ``seed``."""

    tasks: Suite | None = None
    pairwise_prompt: JudgePrompt = PAIRWISE_PROMPT
    max_tokens: int = 256
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if self.tasks is None:
            object.__setattr__(self, "tasks", Suite())

    def settings(self) -> dict:
        return {"max_tokens": self.max_tokens, "confidence": self.confidence, "seed": self.seed}

    def header(self, evaluated, key: str) -> dict:
        """What a result starts with, as the agent suites' results do: the tasks' suite, their
        settings with this suite's under ``key``, sampling seeds, prompt hashes, what was
        evaluated."""
        return {
            "suite": self.tasks.name,
            "settings": {**self.tasks.settings(), key: self.settings()},
            "seeds": list(self.tasks.seeds),
            "hashes": prompt_hashes(self.tasks),
            "evaluated": evaluated,
        }


def answers(suite: Suite, policy: Policy, out_dir: str | Path, *, progress: bool) -> list[Answer]:
    """Every episode of ``suite`` played by ``policy`` (resuming ``out_dir/episodes.jsonl``), in
    the suite's order: policies played on one suite give answers to the same problems, item by
    item."""
    tasks = {task_id(t): t for t, _, _ in suite.problems()}
    played = run_suite(suite, policy, out_dir, progress=progress)
    return [
        Answer(e, tasks[e.task_id].prompt[-1].content, tasks[e.task_id].demonstration[-1].content)
        for episodes in played.values()
        for e in episodes
    ]


def success_interval(items: Sequence[Answer]) -> dict:
    """The verifier's success rate over ``items`` with its Wilson 95% interval."""
    successes = sum(a.episode.success for a in items)
    return {"success": successes / len(items), "interval": wilson_interval(successes, len(items))}


class RecordedJudge:
    """A judge policy whose replies are appended to ``path`` (JSONL) as they arrive and replayed
    from it.  A reply is keyed by the judge's name, the conversation and the sampling settings,
    so a reworded prompt is asked again.  A failed call (`PolicyError`: a server that is down,
    a prompt longer than the model's context) reads as an empty, unparseable reply, is counted
    in ``failures``, and is not journaled: a later run asks it again."""

    def __init__(self, policy: Policy, name: str, path: str | Path):
        self.policy, self.name, self.path = policy, name, Path(path)
        self.replies: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    self.replies[record["key"]] = record["text"]

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        conversation = [[m.role, m.content] for m in messages]
        blob = json.dumps([self.name, conversation, sampling], sort_keys=True)
        key = hashlib.sha256(blob.encode()).hexdigest()
        if key not in self.replies and key not in self.failures:
            try:
                text = self.policy.respond(messages, tools, **sampling).text
            except PolicyError as e:
                self.failures[key] = f"{type(e).__name__}: {e}"
                return AssistantMessage("")
            with self.path.open("a", encoding="utf-8") as sink:
                sink.write(json.dumps({"key": key, "judge": self.name, "text": text}) + "\n")
            self.replies[key] = text
        return AssistantMessage(self.replies.get(key, ""))

    def failure_summary(self) -> dict:
        """How many of this run's calls failed, and the first failure's message."""
        first = next(iter(self.failures.values()), None)
        return {"failed_calls": len(self.failures), "first_failure": first}


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]
