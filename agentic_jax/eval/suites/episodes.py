"""One agent episode on one environment task, through the agent harness, as an `Episode`.

The task's tools (the environment's, or a robustness variant's) are bound to the task and
handed to the ReAct loop as harness tools, so a checkpoint (``JaxPolicy``), an
OpenAI-compatible endpoint (``HTTPPolicy``) or a script is evaluated by the same loop that
`agentic-jax agent` runs, on the conversation the environments train on.  The verifier is the
task family's reward on the final answer.

A stateful task (``envs.stateful``, tau-bench's setting) plays on a fresh copy of its database
and is a conversation with a simulated user (``envs.users``), every user turn recorded; its
verifier reads the final database and everything the agent told the user.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from agentic_jax.agents.loops.agent import AgentResult, StopReason
from agentic_jax.agents.loops.react import ReActAgent
from agentic_jax.agents.policies.base import Policy
from agentic_jax.agents.tools.base import Tool, ToolArgumentError
from agentic_jax.agents.tools.budget import Budget
from agentic_jax.data.chat import ToolCall, tools_system_prompt
from agentic_jax.envs.stateful import StatefulTask
from agentic_jax.envs.text import Task
from agentic_jax.envs.users import RuleUser, is_done
from agentic_jax.eval.agent_metrics import OK, Episode, call_key
from agentic_jax.eval.suites.robustness import Variant


def state_hash(task: Task) -> str:
    """A hash of everything the episode starts from: prompt, reference answer and tool data,
    and a stateful task's initial database and its user's instruction."""
    parts = [
        [dataclasses.asdict(m) for m in task.prompt],
        task.answer,
        task.value,
        list(task.numbers),
        [list(f) for f in task.facts],
        list(task.documents),
    ]
    if isinstance(task, StatefulTask):
        parts += [task.initial_hash, describe(task.instruction)]
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def describe(value):
    """A value as JSON-able data, objects by class name and attributes (no memory addresses)."""
    if isinstance(value, list | tuple):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in value.items()}
    if hasattr(value, "__dict__"):
        return {type(value).__name__: describe(vars(value))}
    return value if isinstance(value, str | int | float | bool | None) else repr(value)


def verifier_id(reward) -> str:
    """The verifier's class and a hash of its settings (nested verifiers included)."""
    settings = json.dumps(describe(reward), sort_keys=True)
    return f"{type(reward).__name__}:{hashlib.sha256(settings.encode()).hexdigest()[:8]}"


def task_id(task: Task) -> str:
    return f"{task.family}/d{task.difficulty}/s{task.seed}"


@dataclasses.dataclass(frozen=True)
class TaskTool(Tool):
    """An environment tool bound to one task, as a harness tool with the env tool's schema."""

    env_tool: object = None
    task: Task | None = None

    @property
    def parameters(self) -> dict:
        return self.env_tool.spec.parameters

    def validate(self, arguments):
        argument = self.env_tool.host_argument(dict(arguments))
        if argument is None:
            raise ToolArgumentError(
                f"invalid arguments for {self.name}: expected {json.dumps(self.parameters)}"
            )
        return {"argument": argument}


def task_tools(env_tools: Sequence, task: Task) -> list[TaskTool]:
    return [
        TaskTool(
            t.name,
            t.spec.description,
            lambda argument, t=t: t.run_host(argument, task),
            None,
            env_tool=t,
            task=task,
        )
        for t in env_tools
    ]


def system_prompt(task: Task, env_tools: Sequence) -> str:
    """The task's system message without its tools' section (the harness adds the section of
    the tools it is given, which a variant changes)."""
    content = task.prompt[0].content
    section = "\n\n" + tools_system_prompt([t.spec for t in env_tools])
    return content[: -len(section)] if env_tools and content.endswith(section) else content


def golden_calls(task: Task, env_tools: Sequence, variant: Variant) -> tuple[ToolCall, ...]:
    """The demonstration's tool calls as the variant's interface takes them."""
    return tuple(variant.adapt(c, env_tools) for m in task.demonstration for c in m.tool_calls)


def _status(event: dict) -> str:
    """``ok``, or why the call failed: the executor's status, or ``error_result`` for a tool
    that answered with an error message (as the environments count it)."""
    if event["status"] != OK:
        return event["status"]
    return "error_result" if str(event["content"]).startswith("error") else OK


class Transcript:
    """One conversation with a simulated user: everything the user said (``user_turns``, the
    opening first) and everything the agent told it (``agent_turns``)."""

    def __init__(self):
        self.user_turns: list[str] = []
        self.agent_turns: list[str] = []

    def play(self, agent: ReActAgent, user, max_turns: int) -> AgentResult:
        """``agent`` converses with ``user`` (one episode's) until the user says it is done."""
        self.user_turns.append(user.opening())

        def answer(message: str) -> str | None:
            self.agent_turns.append(message)
            self.user_turns.append(user.reply(message))
            return None if is_done(self.user_turns[-1]) else self.user_turns[-1]

        return agent.converse(self.user_turns[0], answer, max_turns=max_turns)


def play(
    policy: Policy,
    task: Task,
    env_tools: Sequence,
    reward,
    *,
    variant: Variant = Variant(),
    max_steps: int = 6,
    sampling: dict | None = None,
    seed: int = 0,
    trial: int = 0,
    success_threshold: float = 0.5,
    user=RuleUser(),
    max_user_turns: int = 10,
) -> Episode:
    """One episode of ``task`` by ``policy`` under ``variant``; ``seed`` goes into sampling.
    A stateful task is a conversation with ``user`` (an ``envs.users`` user, started with
    ``seed``) of at most ``max_user_turns`` replies to it.  A run that raises is kept as a
    failed episode with its error."""
    stateful = isinstance(task, StatefulTask)
    world = task.start() if stateful else task
    tools = variant.tools(env_tools)
    agent = ReActAgent(
        policy,
        task_tools(tools, world),
        system_prompt=system_prompt(task, env_tools),
        budget=Budget(max_steps=max_steps),
        sampling={**(sampling or {}), "seed": seed},
    )
    common = dict(
        task_id=task_id(task),
        state_hash=state_hash(task),
        verifier_id=verifier_id(reward),
        trial=trial,
        seed=seed,
        golden_calls=tuple(
            call_key(c.name, c.arguments) for c in golden_calls(task, env_tools, variant)
        ),
        user_id=user.id if stateful else "",
    )
    transcript = Transcript()
    try:
        if stateful:
            result = transcript.play(agent, user.start(task, seed), max_user_turns)
        else:
            result = agent.run(task.prompt[-1].content)
    except Exception as e:  # an errored sample stays in the results, as a failure
        result, error = None, f"{type(e).__name__}: {e}"
    else:
        # the policy's failure (a prompt too long, a search that could not sample), in words
        error = result.detail if result.stop_reason is StopReason.POLICY_ERROR else None
    if stateful:
        common.update(
            user_turns=tuple(transcript.user_turns),
            agent_turns=tuple(transcript.agent_turns),
            final_state=world.state_hash(),
            goal_state=task.goal_hash,
        )
    if result is None:
        return Episode(success=False, error=error, **common)
    calls = [e for e in result.trace if e["kind"] == "tool_call"]
    content = "\n\n".join(transcript.agent_turns) if stateful else result.answer
    score = reward.host(content, world) if content is not None and error is None else 0.0
    return Episode(
        success=score >= success_threshold,  # as the environments' rollouts count success
        reward=float(score),
        steps=result.steps,
        prompt_tokens=result.usage.prompt_tokens,
        completion_tokens=result.usage.completion_tokens,
        cost=result.cost,
        wall_s=result.wall_s,
        latencies_s=tuple(e["latency_s"] for e in result.trace if e["kind"] == "model_call"),
        tool_calls=tuple(call_key(e["name"], e["arguments"]) for e in calls),
        tool_statuses=tuple(map(_status, calls)),
        stop_reason=result.stop_reason.value,
        answer=result.answer,
        error=error,
        **common,
    )
