"""Test helper: scripted policies of known quality for the judge and arena suites.

A `Solver` answers a known subset of a suite's problems right (the demonstration's final turn)
and the rest with one fixed wrong number; an `OracleJudge` knows every answer and grades by it,
whatever the order it is shown; a `FirstJudge` always prefers the answer shown first."""

import re

from agentic_jax.agents.policies.base import AssistantMessage, PolicyError
from agentic_jax.envs.text import Arithmetic
from agentic_jax.eval.suites.suite import Suite

SUITE = Suite(name="t", generators=(Arithmetic(1, use_tools=False),), num_tasks=4)
TASKS = [t for t, _, _ in SUITE.problems()]


class Counting:
    calls = 0

    def respond(self, messages, tools=(), **sampling):
        self.calls += 1
        return AssistantMessage(self.reply(messages[-1].content))


class Solver(Counting):
    """Right on the problems whose index is in ``right``, wrong (the answer plus one) on the
    rest; ``judging`` answers judge prompts too (as a self-judge): ``"fail"`` raises
    `PolicyError`, as a model whose context the judge prompt overflows."""

    def __init__(self, right, tasks=TASKS, judging=None):
        self.by_question = {t.prompt[-1].content: (i, t) for i, t in enumerate(tasks)}
        self.right, self.judging = set(right), judging

    def reply(self, content):
        if content not in self.by_question:
            if self.judging == "fail":
                raise PolicyError("the prompt does not fit")
            return self.judging
        index, task = self.by_question[content]
        if index in self.right:
            return task.demonstration[-1].content
        return f"<think>a guess</think><answer>{task.value + 1}</answer>"


class OracleJudge(Counting):
    """Scores a right answer 9 and a wrong one 2; prefers the right answer of two, else ties."""

    def __init__(self, tasks=TASKS):
        self.truth = {t.prompt[-1].content: t.answer for t in tasks}

    def reply(self, content):
        question = re.search(r"\[Question\]\n(.*?)\n\n", content).group(1)
        right = f"<answer>{self.truth[question]}</answer>"
        if "[Answer A]" not in content:
            answer = re.search(r"\[Answer\]\n(.*?)\n\n", content).group(1)
            return f"Fine.\nScore: {9 if right in answer else 2}"
        a, b = re.search(r"\[Answer A\]\n(.*?)\n\n\[Answer B\]\n(.*?)\n\n", content).groups()
        verdict = "tie" if (right in a) == (right in b) else "A" if right in a else "B"
        return f"Compared.\nVerdict: {verdict}"


class FirstJudge(Counting):
    """Scores everything 5 and always prefers the answer shown first."""

    def reply(self, content):
        return "Verdict: A" if "[Answer A]" in content else "Score: 5"
