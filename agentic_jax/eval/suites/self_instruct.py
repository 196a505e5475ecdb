"""Agentic self-instruct: tasks generated, solved by the agent, verified, filtered by difficulty,
and the successful trajectories written as SFT data.

Self-Instruct (Wang et al. 2022) grows training data from a model's own generations, filtered
for validity and novelty; STaR (Zelikman et al. 2022) fine-tunes a model on its own solutions
that reached a verified answer; Autodata (the June-2026 digest) does both for agents: tasks
written, solved with tools, checked and kept by difficulty.  `self_instruct` is that pipeline
with the safeguards the book names:

* a task is only as good as its verifier: a generated task gets its reference answer by
  execution (`WrittenArithmetic` computes each expression the policy writes with the
  environment's calculator) or comes with one (`SeededTasks`, the project's generators); one
  that cannot be checked is rejected;
* duplicates (the same question after `eval.contamination.normalise`, operators and brackets
  kept as tokens: Self-Instruct's ROUGE-L filter drops them and would call ``3 + 4`` and
  ``3 * 4`` one question) and the problems of an evaluation suite (``exclude``: training on
  them would contaminate it) are rejected before any attempt;
* each task is solved ``attempts`` times and kept only when its solve rate ``p`` is inside the
  band, ``low < p < high``; the default ``(0, 1)`` is the learnable band: a task always or never
  solved teaches nothing (a group of equal rewards has zero advantage, DAPO's dynamic sampling);
* only trajectories the task's verifier passed are written, at most ``per_task`` distinct ones
  per task.

Output in ``out_dir``: ``sft.jsonl``, OpenAI chat records with their tools (``{"messages",
"tools"}``), what ``train_sft(chats_file=...)`` reads (`data.datasets.read_conversations`),
written atomically at the end; and ``self_instruct.jsonl``, one line per generated task (its
question, kept or not and why, its solve rate) appended as each is decided, then a summary.

`self_instruct_job` runs it in rounds with a learner between them (the SFT or RL step), and
stops when held-out success falls below the start: ``agentic-jax train --gin_file
self_instruct``.  `SFTLearner` is STaR's learner: each round fine-tunes the latest checkpoint on
the round's ``sft.jsonl`` with the project's SFT trainer (``--gin_file self_instruct_sft``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import gin

from agentic_jax import config as gin_config
from agentic_jax.agents.policies.base import Policy
from agentic_jax.agents.policies.http_policy import openai_messages
from agentic_jax.agents.policies.jax_policy import JaxPolicy
from agentic_jax.data.chat import Message
from agentic_jax.envs.text import Arithmetic, Generator, calculator
from agentic_jax.envs.text.generators import FORMAT, task_prompt
from agentic_jax.envs.text.tasks import Task
from agentic_jax.eval.contamination import normalise
from agentic_jax.eval.suites.episodes import task_id
from agentic_jax.eval.suites.self_improvement import (
    ChangeLog,
    Harness,
    attempt,
    run_split,
    success_rate,
    write_report,
)
from agentic_jax.eval.suites.suite import Suite
from agentic_jax.files import atomic_write
from agentic_jax.post_training.sft import train_sft

SYMBOLS = "+-*/=()"  # kept as tokens when questions are compared


class Generated(NamedTuple):
    """A generated task: its ``text`` (the question), and the ``problem`` (``(task, tools,
    reward)``, as a suite's) or, for text that is no checkable task, None and the ``reason``."""

    text: str
    problem: tuple | None
    reason: str = ""


TaskSource = Callable[[], Sequence[Generated]]


@gin.configurable(module="eval")
@dataclasses.dataclass(frozen=True)
class SeededTasks:
    """A parametric task generator: ``count`` tasks of each of the project's ``generators``,
    from seed ``first_seed`` (the train seeds by default, as no suite draws from them)."""

    generators: Sequence[Generator] = (Arithmetic(2),)
    count: int = 20
    first_seed: int = 0

    def __call__(self) -> list[Generated]:
        seeds = range(self.first_seed, self.first_seed + self.count)
        return [
            Generated(t.prompt[-1].content, (t, g.tools, g.reward))
            for g in self.generators
            for t in g.tasks(seeds)
        ]


WRITER_PROMPT = (
    "You write practice problems for an agent that has a calculator tool. Write each problem "
    "on its own line, exactly as 'What is <expression>?', where the expression uses integers, "
    "+ - * / and parentheses. Write nothing else."
)
_QUESTION = re.compile(r"(?:\d+[.)]\s*)?What is (?P<expression>[0-9+\-*/() ]+)\?")


@gin.configurable(module="eval")
class WrittenArithmetic:
    """Arithmetic tasks the ``policy`` writes (Self-Instruct's generation step): asked for
    ``count`` questions of ``difficulty`` operators (`WRITER_PROMPT`), one per line.  The
    environment's calculator computes each expression, which gives the task its reference
    answer; the `Arithmetic` family's verifier scores it.  A line that is no such question, an
    expression the calculator rejects (syntax, division by zero, overflow) and an inexact
    division (the calculator floors it, so the natural answer would be graded wrong) are
    rejected with the reason."""

    def __init__(
        self,
        policy: Policy,
        *,
        count: int = 20,
        difficulty: int = 2,
        sampling: dict[str, Any] | None = None,
    ):
        if count < 1:
            raise ValueError(f"WrittenArithmetic.count must be >= 1, got {count}")
        self.policy, self.count, self.family = policy, count, Arithmetic(difficulty)
        self.sampling = {"temperature": 1.0, "max_tokens": 40 * count, **(sampling or {})}

    def _task(self, line: str, index: int) -> Generated:
        match = _QUESTION.fullmatch(line.strip())
        if match is None:
            return Generated(line, None, "not a 'What is <expression>?' question")
        expression = match["expression"].strip()
        tool = self.family.tools[0]
        result = calculator.evaluate_text(expression, tool.argument_bytes)
        if result.error != calculator.OK:
            why = calculator.ERROR_MESSAGES[result.error].removeprefix("error: ")
            return Generated(line, None, f"the calculator rejects it: {why}")
        if result.inexact:
            return Generated(line, None, "an inexact division (the calculator floors it)")
        question = f"What is {expression}?"
        task = Task(
            task_prompt(FORMAT, question, self.family.tools),
            str(result.value),
            value=result.value,
            seed=index,
            difficulty=sum(map(expression.count, "+-*/")),
            family=self.family.family,
        )
        return Generated(question, (task, self.family.tools, self.family.reward))

    def __call__(self) -> list[Generated]:
        request = f"Write {self.count} new problems, each with {self.family.difficulty} operators."
        messages = [Message("system", WRITER_PROMPT), Message("user", request)]
        reply = self.policy.respond(messages, **self.sampling)
        lines = [line for line in reply.text.splitlines() if line.strip()]
        return [self._task(line, index) for index, line in enumerate(lines)]


def question_key(task: Task) -> tuple[str, ...]:
    """The question as the user poses it, normalised: what duplicates share."""
    return tuple(normalise(task.prompt[-1].content, SYMBOLS))


@gin.configurable(module="eval")
def self_instruct(
    policy: Policy,
    generate: TaskSource,
    out_dir: str | Path,
    *,
    attempts: int = 4,
    band: tuple[float, float] = (0.0, 1.0),
    per_task: int = 1,
    harness: Harness = Harness(),
    exclude: Suite | None = None,
    max_steps: int = 6,
    temperature: float = 1.0,
    max_tokens: int = 128,
    seed: int = 0,
) -> dict:
    """Generates tasks with ``generate``, solves each ``attempts`` times with ``policy`` under
    ``harness`` (attempt ``n`` samples with seed ``seed * 1000 + n``), keeps those whose solve
    rate is inside ``band`` (exclusive) and writes their verified trajectories to
    ``out_dir/sft.jsonl`` (see the module docstring).  Returns the counts written last to
    ``out_dir/self_instruct.jsonl``."""
    low, high = band
    if attempts < 1 or per_task < 1:
        raise ValueError(f"self_instruct needs attempts, per_task >= 1: {attempts}, {per_task}")
    if not 0 <= low < high or low >= 1:
        raise ValueError(f"band must be (low, high) with 0 <= low < 1 and low < high, got {band}")
    out_dir = Path(out_dir)
    log = ChangeLog(out_dir / "self_instruct.jsonl")
    excluded = {question_key(t) for t, _, _ in exclude.problems()} if exclude else set()
    seen: set[tuple[str, ...]] = set()
    sampling = {"temperature": temperature, "max_tokens": max_tokens}
    records, counts = [], {"generated": 0, "kept": 0, "rejected": 0, "trajectories": 0}
    for item in generate():
        counts["generated"] += 1
        reason = item.reason
        if item.problem is not None:
            key = question_key(item.problem[0])
            if key in excluded:
                reason = "a problem of the excluded evaluation suite"
            elif key in seen:
                reason = "a duplicate of an earlier task"
        if item.problem is None or reason:
            counts["rejected"] += 1
            log.write("task", question=item.text, kept=False, reason=reason)
            continue
        seen.add(key)
        tried = [
            attempt(
                policy,
                harness,
                item.problem,
                seed=seed * 1000 + n,
                trial=n,
                max_steps=max_steps,
                sampling=sampling,
            )
            for n in range(attempts)
        ]
        solved = [a for a in tried if a.episode.success]
        rate = len(solved) / attempts
        about = {"question": item.text, "task_id": task_id(item.problem[0]), "solve_rate": rate}
        if not low < rate < high:
            counts["rejected"] += 1
            reason = f"solve rate {rate:.3f} outside the band ({low}, {high})"
            log.write("task", **about, kept=False, reason=reason)
            continue
        distinct = {}
        for a in solved:
            record = {
                "messages": openai_messages(a.transcript),
                "tools": [spec.openai() for spec in a.tools],
            }
            distinct.setdefault(json.dumps(record, sort_keys=True), record)
        kept = list(distinct.values())[:per_task]
        records += kept
        counts["kept"] += 1
        counts["trajectories"] += len(kept)
        log.write("task", **about, kept=True, reason="in the band", trajectories=len(kept))
    with atomic_write(out_dir / "sft.jsonl", encoding="utf-8") as sink:
        sink.writelines(json.dumps(r) + "\n" for r in records)
    log.write("summary", **counts, band=list(band), attempts=attempts)
    return counts


Learner = Callable[[Policy, Path, Path], Policy]


@gin.configurable(module="eval")
class SFTLearner:
    """STaR's learning step (Zelikman et al. 2022), a `Learner`: supervised fine-tuning of the
    current checkpoint on the round's verified trajectories.  Each round it fine-tunes the
    checkpoint it trained last (``init_from``, the start policy's, the first time) on the
    round's ``sft.jsonl`` with `train_sft` into ``round_dir/sft`` (steps, learning rate, LoRA,
    ... bound by gin, as for ``agentic-jax train --gin_file sft``), and returns a `JaxPolicy`
    of the new model (its engine and sampling defaults bound by gin too).  A round that kept no
    trajectory trains nothing: its policy stays.  The learner follows one chain of checkpoints,
    so it must be given back the policy it returned last."""

    def __init__(self, init_from: str):
        self.checkpoint = str(init_from)
        self._trained: JaxPolicy | None = None

    def __call__(self, policy: Policy, sft_file: Path, round_dir: Path) -> Policy:
        if self._trained is not None and policy is not self._trained:
            raise ValueError(
                f"SFTLearner fine-tunes the checkpoint it trained last ({self.checkpoint}): give "
                f"it back the policy it returned, not {policy!r}"
            )
        if Path(sft_file).stat().st_size == 0:
            return policy
        workdir = Path(round_dir) / "sft"
        train_sft(str(workdir), init_from=self.checkpoint, chats_file=str(sft_file))
        trained = JaxPolicy(str(workdir))
        if self._trained is not None:
            self._trained.close()  # the last round's model: the job holds the new one from now
        self.checkpoint, self._trained = str(workdir), trained
        return trained


def heldout_success(policy: Policy, harness: Harness, heldout: Suite) -> float:
    return success_rate([a.episode for a in run_split(policy, harness, heldout)])


@gin.configurable(module="eval")
def self_instruct_job(
    workdir: str,
    *,
    policy: Policy,
    generate: TaskSource,
    heldout: Suite,
    learn: Learner | None = None,
    rounds: int = 1,
    harness: Harness = Harness(),
) -> dict:
    """Agentic self-instruct as a job of ``agentic-jax train`` (``configs/self_instruct.gin``),
    in rounds: measure ``policy`` on ``heldout``, then each round generate and filter data with
    it (`self_instruct`, configured by gin, ``heldout``'s problems excluded) into
    ``workdir/round_<n>/`` and, given a learner ``learn``, train on that round's ``sft.jsonl``
    (``learn(policy, sft_file, round_dir)`` returns the trained policy: the SFT or RL step,
    STaR's loop) and measure the new policy on ``heldout``.  It stops after ``rounds`` rounds
    or as soon as held-out success falls below the start: the book's safeguard against a
    self-training loop that degrades.  Every measurement and round is a line of
    ``workdir/rounds.jsonl``; ``report.json`` sums it up beside the parsed and operative configs.
    Returns the held-out success rates and data counts, as floats."""
    if rounds < 1 or (learn is None and rounds > 1):
        raise ValueError(
            f"self_instruct_job needs rounds >= 1, and a learner for more than one round (each "
            f"round would replay the same policy): rounds={rounds}, learn={learn!r}"
        )
    gin_config.save_config(workdir, operative=False)
    log = ChangeLog(Path(workdir) / "rounds.jsonl")
    start = success = heldout_success(policy, harness, heldout)
    log.write("measure", round=0, split="heldout", success=start)
    totals = {"generated": 0, "kept": 0, "rejected": 0, "trajectories": 0}
    stop, round_ = "rounds", 0
    for round_ in range(1, rounds + 1):
        round_dir = Path(workdir) / f"round_{round_}"
        counts = self_instruct(policy, generate, round_dir, harness=harness, exclude=heldout)
        totals = {k: totals[k] + counts[k] for k in totals}
        log.write("round", round=round_, **counts)
        if learn is None:
            break
        policy = learn(policy, round_dir / "sft.jsonl", round_dir)
        success = heldout_success(policy, harness, heldout)
        log.write("measure", round=round_, split="heldout", success=success)
        if success < start:
            stop = "heldout_dropped"
            break
    log.write("stop", reason=stop, round=round_, start=start, success=success)
    report = {"rounds": round_, "stop_reason": stop, "start_success": start, "success": success}
    write_report(workdir, {**report, **totals})
    gin_config.save_config(workdir, operative=True)
    return {k: float(v) for k, v in {**report, **totals}.items() if k != "stop_reason"}
