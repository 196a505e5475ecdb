"""Self-improvement of an agent's harness from its failures, behind a held-out gate.

SIA (the June-2026 digest's agents that improve their own harness and weights) edits what
surrounds a model: its instructions, tool descriptions, skill library and retries.  The book's
safeguards for any self-modifying loop are kept here: no change without an evaluation gate, a
record of every change, and a stop when held-out success drops.  `improve_harness` is the outer
loop (a prompt optimiser in the manner of OPRO, Yang et al. 2023, fed Reflexion-style failure
transcripts, Shinn et al. 2023, but an edit is kept only when it generalises):

1. measure the incumbent harness on the held-out split.  Round 1's measurement is the starting
   level; later rounds measure again, because the policy may change between rounds (it samples,
   or it is an endpoint whose weights are being trained), and a level below the start stops the
   loop;
2. run the incumbent on the train split and collect its failures with their transcripts;
3. ask the proposer for one edit (`HarnessEdit`) from those failures;
4. evaluate the candidate on the held-out split (the same problems, seeds and trials);
5. `Gate`: accept only if held-out success does not drop (optionally: only a significant gain).

The loop also ends after ``rounds`` rounds, after ``patience`` rounds in a row without an
accepted edit, or when the train split has no failure left.  Every measurement, proposal and
decision is a line of ``changes.jsonl`` (`ChangeLog`), flushed and synced before the loop goes
on, so a crash loses nothing already decided.

`improve_harness_job` is the loop as a job: ``agentic-jax train --gin_file self_improve_harness``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import gin
import numpy as np

from agentic_jax import config as gin_config
from agentic_jax.agents.policies.base import AssistantMessage, Policy, PolicyError
from agentic_jax.agents.protocols.skills import Skill, with_skills
from agentic_jax.agents.tools.base import tool_specs
from agentic_jax.agents.tools.budget import StopReason
from agentic_jax.data.chat import Message, ToolSpec
from agentic_jax.envs.users import RuleUser
from agentic_jax.eval.agent_metrics import Episode, call_key, check_comparable
from agentic_jax.eval.stats import mcnemar_test
from agentic_jax.eval.suites.episodes import play, state_hash, task_id
from agentic_jax.eval.suites.robustness import Variant
from agentic_jax.eval.suites.suite import Suite
from agentic_jax.files import write_json

EDITABLE = ("system_prompt", "tool_descriptions", "skills", "retries")
RETRY_SEED = 1_000_003  # a retry's sampling seed is the attempt's plus this, times the retry


@gin.configurable(module="eval")
@dataclasses.dataclass(frozen=True)
class Harness:
    """The editable parts of the harness around a fixed policy: ``system_prompt``, instructions
    put before each task's own system message; ``tool_descriptions``, tool name -> the
    description shown in place of the tool's own (a mapping, kept as sorted pairs);
    ``skills``, the skill library's entries (`Skill`s or their fields as mappings), all shown
    after the system message (`protocols.skills.with_skills`); ``retries``, new attempts at a
    task whose run ended without an answer (a loop stop, a budget, a policy error), never at a
    wrong answer, which only the verifier knows."""

    system_prompt: str = ""
    tool_descriptions: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
    skills: tuple[Skill, ...] = ()
    retries: int = 0

    def __post_init__(self):
        if not isinstance(self.system_prompt, str):
            raise ValueError(f"Harness.system_prompt must be text, got {self.system_prompt!r}")
        try:
            descriptions = dict(self.tool_descriptions)
        except (TypeError, ValueError):
            raise ValueError(
                f"Harness.tool_descriptions must map tool names to text, got "
                f"{self.tool_descriptions!r}"
            ) from None
        if not all(isinstance(v, str) and isinstance(k, str) for k, v in descriptions.items()):
            raise ValueError(f"Harness.tool_descriptions must map names to text: {descriptions}")
        object.__setattr__(self, "tool_descriptions", tuple(sorted(descriptions.items())))
        skills = []
        for skill in self.skills:
            try:
                skills.append(skill if isinstance(skill, Skill) else Skill(**skill))
            except TypeError as e:
                raise ValueError(f"Harness.skills: {skill!r} is not a skill ({e})") from None
        names = [s.name for s in skills]
        if len(set(names)) != len(names):
            raise ValueError(f"Harness.skills names a skill twice: {names}")
        object.__setattr__(self, "skills", tuple(skills))
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"Harness.retries must be an integer >= 0, got {self.retries!r}")

    def shown(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` as the policy sees them under this harness: the system message is the
        harness's instructions, the task's own system text, then the skills."""
        messages = list(messages)
        own = messages.pop(0).content if messages and messages[0].role == "system" else ""
        system = with_skills("\n\n".join(p for p in (self.system_prompt, own) if p), self.skills)
        return [Message("system", system), *messages] if system else messages

    def check_tools(self, names: set[str]) -> None:
        """A ``ValueError`` when a description names a tool that is not among ``names``."""
        unknown = sorted(set(dict(self.tool_descriptions)) - names)
        if unknown:
            raise ValueError(
                f"tool_descriptions name unknown tools {unknown}; the tasks have {sorted(names)}"
            )

    def to_json(self) -> dict:
        return {
            "system_prompt": self.system_prompt,
            "tool_descriptions": dict(self.tool_descriptions),
            "skills": [dataclasses.asdict(s) for s in self.skills],
            "retries": self.retries,
        }


@dataclasses.dataclass(frozen=True)
class HarnessEdit:
    """One proposed change: ``field`` of the harness gets the new ``value`` (whole)."""

    field: str
    value: Any
    rationale: str = ""

    def __post_init__(self):
        if self.field not in EDITABLE:
            raise ValueError(f"a harness edit changes one of {EDITABLE}, not {self.field!r}")

    def apply(self, harness: Harness) -> Harness:
        return dataclasses.replace(harness, **{self.field: self.value})


@dataclasses.dataclass(frozen=True)
class DescribedTool:
    """An environment tool shown with another description (the members `episodes.TaskTool`
    reads: ``name``, ``spec``, ``host_argument``, ``run_host``)."""

    base: Any
    description: str

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def spec(self) -> ToolSpec:
        return self.base.spec._replace(description=self.description)

    def host_argument(self, arguments):
        return self.base.host_argument(arguments)

    def run_host(self, argument, task):
        return self.base.run_host(argument, task)


class Described(Variant):
    """The harness's tool descriptions as a tool interface of `episodes.play` (names and
    arguments unchanged, so the golden calls need no adapting)."""

    name, changes = "harness", "tool descriptions (the harness's)"

    def __init__(self, descriptions: Sequence[tuple[str, str]]):
        self.descriptions = dict(descriptions)

    def tools(self, tools):
        return [
            DescribedTool(t, self.descriptions[t.name]) if t.name in self.descriptions else t
            for t in tools
        ]


class HarnessedPolicy:
    """``policy`` seen through ``harness`` (`Harness.shown`).  It keeps the last conversation
    it was shown, the tools offered and its reply: after an episode, the whole trajectory."""

    def __init__(self, policy: Policy, harness: Harness):
        self.policy, self.harness = policy, harness
        self.messages: list[Message] = []
        self.tools: list[ToolSpec] = []
        self.reply: AssistantMessage | None = None

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        self.messages, self.tools, self.reply = (
            self.harness.shown(messages),
            tool_specs(tools),
            None,
        )
        self.reply = self.policy.respond(self.messages, tools, **sampling)
        return self.reply

    def transcript(self) -> tuple[Message, ...]:
        return (*self.messages, *([self.reply.to_message()] if self.reply else []))


class Attempt(NamedTuple):
    """One task played under a harness: its `Episode`, the trajectory the policy saw (the last
    try's, when the harness retried) and the tools it was offered."""

    episode: Episode
    transcript: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]


def attempt(
    policy: Policy,
    harness: Harness,
    problem: tuple,
    *,
    seed: int,
    trial: int = 0,
    max_steps: int = 6,
    sampling: dict | None = None,
    user=RuleUser(),
    max_user_turns: int = 10,
) -> Attempt:
    """``problem`` (a suite's ``(task, tools, reward)``) by ``policy`` under ``harness``:
    `episodes.play` with the harness's prompt and tool descriptions, played again while a run
    ends without an answer, ``harness.retries`` times at most (retry ``n`` samples with seed
    ``seed + n * RETRY_SEED``)."""
    task, tools, reward = problem
    seen = HarnessedPolicy(policy, harness)
    for retry in range(harness.retries + 1):
        episode = play(
            seen,
            task,
            tools,
            reward,
            variant=Described(harness.tool_descriptions),
            max_steps=max_steps,
            sampling=sampling,
            seed=seed + retry * RETRY_SEED,
            trial=trial,
            user=user,
            max_user_turns=max_user_turns,
        )
        if episode.stop_reason == StopReason.ANSWER.value:
            break
    return Attempt(episode, seen.transcript(), tuple(seen.tools))


def run_split(policy: Policy, harness: Harness, suite: Suite) -> list[Attempt]:
    """Every (seed, trial, problem) of ``suite`` under ``harness``, in `run_suite`'s order and
    with its sampling seeds, so two harnesses' attempts pair item by item.  The suite's
    robustness variants are not played: the harness's tool descriptions are the interface."""
    problems = suite.problems()
    sampling = {"temperature": suite.temperature, "max_tokens": suite.max_tokens}
    return [
        attempt(
            policy,
            harness,
            problem,
            seed=seed * 1000 + trial,
            trial=trial,
            max_steps=suite.max_steps,
            sampling=sampling,
            user=suite.user,
            max_user_turns=suite.max_user_turns,
        )
        for seed in suite.seeds
        for trial in range(suite.trials)
        for problem in problems
    ]


def success_rate(episodes: Sequence[Episode]) -> float:
    return float(np.mean([e.success for e in episodes]))


class ChangeLog:
    """An append-only JSON Lines record: each `write` is one line, flushed and synced to disk
    (``os.fsync``) before it returns, so a crash loses at most the line being written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields) -> dict:
        record = {"event": event, "time": datetime.datetime.now(datetime.UTC).isoformat()}
        record.update(fields)
        with self.path.open("a", encoding="utf-8") as sink:
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
        return record

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


@gin.configurable(module="eval")
@dataclasses.dataclass(frozen=True)
class Gate:
    """Accepts a candidate whose held-out success is at least the incumbent's, on the same
    problems, seeds and trials (`check_comparable`; the episodes pair by position).

    ``significance``: accept only a gain that McNemar's exact test (McNemar 1947; paired by
    episode, `eval.stats.mcnemar_test`) finds at that level, for evaluations so noisy that "not
    lower" would let chance edits through."""

    significance: float | None = None

    def __post_init__(self):
        if self.significance is not None and not 0 < self.significance < 1:
            raise ValueError(f"Gate.significance must be in (0, 1), got {self.significance}")

    def decide(self, candidate: Sequence[Episode], incumbent: Sequence[Episode]) -> dict:
        """``{"accepted", "reason", "candidate", "incumbent"}`` (held-out success rates), and
        McNemar's ``p_value`` with a significance level."""
        check_comparable(candidate, incumbent)
        if [e.task_id for e in candidate] != [e.task_id for e in incumbent]:
            raise ValueError("the candidate's and the incumbent's episodes are in another order")
        new, old = success_rate(candidate), success_rate(incumbent)
        out = {"candidate": new, "incumbent": old}
        if new < old:
            return {
                **out,
                "accepted": False,
                "reason": f"held-out success drops {old:.3f} -> {new:.3f}",
            }
        if self.significance is None:
            return {**out, "accepted": True, "reason": f"held-out success {old:.3f} -> {new:.3f}"}
        p = mcnemar_test([e.success for e in candidate], [e.success for e in incumbent])
        accepted = new > old and p <= self.significance
        verdict = "a significant" if accepted else "no significant"
        reason = f"{verdict} gain {old:.3f} -> {new:.3f} (McNemar p = {p:.3g})"
        return {**out, "accepted": accepted, "reason": reason, "p_value": p}


class ProposalError(ValueError):
    """A proposer that could not make an edit (an unparseable reply, a failed policy call)."""


Proposer = Callable[[Harness, Sequence[Attempt]], HarnessEdit | None]


def failure_text(failure: Attempt, max_chars: int | None = None) -> str:
    """A failed attempt in words: how it ended and its transcript after the system message
    (tool calls as ``name(arguments)``), cut to ``max_chars``."""
    e = failure.episode
    ending = f"stopped: {e.stop_reason or 'error'}" + (f" ({e.error})" if e.error else "")
    if e.stop_reason == StopReason.ANSWER.value:
        ending = "answered; the verifier rejected the answer"
    lines = [f"task {e.task_id}: {ending}"]
    for m in failure.transcript:
        if m.role != "system":
            calls = "; ".join(call_key(c.name, c.arguments) for c in m.tool_calls)
            lines.append(f"{m.role}: {m.content}" + (f" [calls {calls}]" if calls else ""))
    text = "\n".join(lines)
    return text if max_chars is None or len(text) <= max_chars else text[:max_chars] + " [cut]"


@gin.configurable(module="eval")
class RuleProposer:
    """A deterministic proposer.  ``rules`` are ``(pattern, field, value)``: it proposes the
    edit of the first rule, not proposed before, whose regular expression ``pattern`` occurs in
    a failure (`failure_text`); None when no rule applies."""

    def __init__(self, rules: Sequence[tuple[str, str, Any]]):
        self.rules = [
            (re.compile(pattern), HarnessEdit(field, value, f"failures match {pattern!r}"))
            for pattern, field, value in rules
        ]
        self.proposed: set[int] = set()

    def __call__(self, harness: Harness, failures: Sequence[Attempt]) -> HarnessEdit | None:
        del harness
        texts = [failure_text(f) for f in failures]
        for index, (pattern, edit) in enumerate(self.rules):
            if index not in self.proposed and any(pattern.search(t) for t in texts):
                self.proposed.add(index)
                return edit
        return None


PROPOSER_PROMPT = (
    "You improve the harness of an AI agent: the instructions, tool descriptions, skills and "
    "retry count wrapped around a fixed model. You are shown the current harness and "
    "transcripts of tasks the agent failed. Propose ONE edit that would fix failures like "
    "these without hurting other tasks. Reply with one JSON object only: "
    '{"field": "system_prompt" | "tool_descriptions" | "skills" | "retries", '
    '"value": <the complete new value of the field>, "rationale": "<one sentence>"}. '
    "system_prompt is text; tool_descriptions an object from tool name to description; "
    'skills a list of {"name", "description", "instructions"}; retries an integer.'
)


def parse_edit(text: str) -> HarnessEdit:
    """The `HarnessEdit` of a proposer's reply: its outermost JSON object (fences or prose
    around it are ignored); a `ProposalError` quoting the reply when there is none."""
    start, end = text.find("{"), text.rfind("}")
    try:
        data = json.loads(text[start : end + 1]) if 0 <= start < end else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not {"field", "value"} <= set(data):
        raise ProposalError(f"no JSON object with field and value in the reply {text[:300]!r}")
    try:
        return HarnessEdit(data["field"], data["value"], str(data.get("rationale", "")))
    except ValueError as e:
        raise ProposalError(str(e)) from None


@gin.configurable(module="eval")
class PolicyProposer:
    """A proposer that asks ``policy`` (a model behind the `Policy` interface) for one edit from
    the first ``max_failures`` failure transcripts (each cut to ``max_chars``), given the
    current harness as JSON (`PROPOSER_PROMPT`); ``sampling`` goes to the call."""

    def __init__(
        self,
        policy: Policy,
        *,
        max_failures: int = 4,
        max_chars: int = 2000,
        sampling: Mapping[str, Any] | None = None,
    ):
        if max_failures < 1 or max_chars < 1:
            raise ValueError(f"need max_failures, max_chars >= 1: {max_failures}, {max_chars}")
        self.policy, self.max_failures, self.max_chars = policy, max_failures, max_chars
        self.sampling = {"temperature": 0.0, "max_tokens": 512, **(sampling or {})}

    def __call__(self, harness: Harness, failures: Sequence[Attempt]) -> HarnessEdit:
        shown = failures[: self.max_failures]
        request = "\n\n".join(
            [
                "Current harness:\n" + json.dumps(harness.to_json(), indent=1),
                f"{len(failures)} failed tasks; {len(shown)} of them:",
                *(failure_text(f, self.max_chars) for f in shown),
            ]
        )
        messages = [Message("system", PROPOSER_PROMPT), Message("user", request)]
        try:
            reply = self.policy.respond(messages, **self.sampling)
        except PolicyError as e:
            raise ProposalError(f"the proposer's policy failed: {e}") from None
        return parse_edit(reply.text)


@dataclasses.dataclass(frozen=True)
class Improvement:
    """What `improve_harness` ended with: the ``harness`` (the last accepted), the held-out
    success it started from and its last measured one, the rounds run, why it stopped
    (``rounds``, ``patience``, ``no_failures`` or ``heldout_dropped``) and the edits accepted."""

    harness: Harness
    start_success: float
    success: float
    rounds: int
    stop_reason: str
    accepted: int


def _check_disjoint(train: Suite, heldout: Suite) -> None:
    ids = {state_hash(t): task_id(t) for t, _, _ in heldout.problems()}
    shared = sorted(ids[h] for h in {state_hash(t) for t, _, _ in train.problems()} & set(ids))
    if shared:
        raise ValueError(
            f"the held-out split shares {len(shared)} problems with the train split "
            f"(e.g. {shared[:3]}): a gate on it would not measure generalisation"
        )


def _propose(
    proposer: Proposer, harness: Harness, failures: Sequence[Attempt], tool_names: set[str]
) -> tuple[Harness | None, dict]:
    """The proposer's candidate (None: no edit, or one that cannot apply) and its log fields."""
    try:
        edit = proposer(harness, failures)
        if edit is None:
            return None, {"edit": None}
        candidate = edit.apply(harness)
        candidate.check_tools(tool_names)
    except ValueError as e:  # a ProposalError, or an edit the harness rejects
        return None, {"edit": None, "error": str(e)}
    value = candidate.to_json()[edit.field]
    return candidate, {"edit": {"field": edit.field, "value": value, "rationale": edit.rationale}}


@gin.configurable(module="eval")
def improve_harness(
    policy: Policy,
    proposer: Proposer,
    out_dir: str | Path,
    *,
    train: Suite,
    heldout: Suite,
    harness: Harness = Harness(),
    rounds: int = 5,
    patience: int = 2,
    gate: Gate = Gate(),
) -> Improvement:
    """Improves ``harness`` around ``policy`` with ``proposer``'s edits from the failures on
    ``train``, each kept only if ``gate`` passes it on ``heldout`` (see the module docstring);
    every step is logged to ``out_dir/changes.jsonl``."""
    if rounds < 1 or patience < 1:
        raise ValueError(f"improve_harness needs rounds, patience >= 1: {rounds}, {patience}")
    _check_disjoint(train, heldout)
    names = {t.name for s in (train, heldout) for _, tools, _ in s.problems() for t in tools}
    harness.check_tools(names)
    log = ChangeLog(Path(out_dir) / "changes.jsonl")
    log.write(
        "start",
        harness=harness.to_json(),
        train=train.name,
        heldout=heldout.name,
        rounds=rounds,
        patience=patience,
        gate=dataclasses.asdict(gate),
    )
    start = success = None
    stale = accepted = 0
    stop = "rounds"
    for round_ in range(1, rounds + 1):
        incumbent = [a.episode for a in run_split(policy, harness, heldout)]
        success = success_rate(incumbent)
        log.write("measure", round=round_, split="heldout", success=success)
        if start is None:
            start = success
        elif success < start:
            stop = "heldout_dropped"
            break
        tried = run_split(policy, harness, train)
        failures = [a for a in tried if not a.episode.success]
        log.write(
            "measure", round=round_, split="train", success=success_rate([a.episode for a in tried])
        )
        if not failures:
            stop = "no_failures"
            break
        candidate, proposal = _propose(proposer, harness, failures, names)
        log.write("proposal", round=round_, failures=len(failures), **proposal)
        if candidate is not None:
            evaluated = [a.episode for a in run_split(policy, candidate, heldout)]
            verdict = gate.decide(evaluated, incumbent)
            log.write("decision", round=round_, **verdict)
            if verdict["accepted"]:
                harness, success = candidate, verdict["candidate"]
                accepted, stale = accepted + 1, 0
                continue
        stale += 1
        if stale >= patience:
            stop = "patience"
            break
    log.write(
        "stop", reason=stop, round=round_, harness=harness.to_json(), start=start, success=success
    )
    return Improvement(harness, start, success, round_, stop, accepted)


def write_report(workdir: str | Path, report: Mapping[str, Any]) -> None:
    """``workdir/report.json``, written atomically (a reader never sees half of it)."""
    write_json(Path(workdir) / "report.json", dict(report))


@gin.configurable(module="eval")
def improve_harness_job(workdir: str, *, policy: Policy, proposer: Proposer) -> dict:
    """`improve_harness` as a job of ``agentic-jax train`` (``configs/self_improve_harness.gin``;
    the splits, rounds and gate are `improve_harness`'s gin bindings).  Writes into ``workdir``
    the change log (``changes.jsonl``), ``report.json`` (the `Improvement`, the final harness
    among it) and the parsed and operative configs; returns the held-out success rates and the
    counts, as floats (what the command prints)."""
    gin_config.save_config(workdir, operative=False)
    result = improve_harness(policy, proposer, workdir)
    write_report(
        workdir,
        {**dataclasses.asdict(result), "harness": result.harness.to_json()},
    )
    gin_config.save_config(workdir, operative=True)
    return {
        "start_success": float(result.start_success),
        "success": float(result.success),
        "rounds": float(result.rounds),
        "accepted": float(result.accepted),
    }
