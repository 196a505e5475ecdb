"""ReAct (Yao et al. 2023, *ReAct: Synergizing Reasoning and Acting in Language Models*).

The model interleaves reasoning (its turn's text) with actions (tool calls); each action's
observation (the tool result) is appended and the model goes on, until it replies without a tool
call: that reply is the answer, unless the token limit cut it off (then the model is told so and
goes on).  Around that core the loop enforces

* termination: the :class:`Budget` (steps, tokens, cost, wall time) before every model call;
* loop detection (``loop_detection.py``): a repeated identical call is not run but redirected, and
  stops the run if it persists; so do steps that bring no new results;
* context management (``context.py``), when given a :class:`ContextManager`: the prompt is built
  within the window, and the model may compact its own history with the ``compact_context`` tool.

`ReActAgent.converse` runs the loop once per user message of a conversation (tau-bench's
setting, a simulated user answering the agent), each continuing the same history.

A run may start by replaying an earlier one (a :class:`Replay`, the web UI's retry from a step):
the recorded model turns and tool results stand in for the policy and the tools until they run
out, so the loop rebuilds that run's history itself (its harness notes, loop-detector counts,
budget and step numbers included) and the trace holds every step, replayed or not.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from agentic_jax.agents.context.manager import ContextManager, compaction_tool
from agentic_jax.agents.context.tracing import Tracer
from agentic_jax.agents.loops.agent import DATA_RULE, AgentResult, BudgetExceeded, Outcome, Run
from agentic_jax.agents.policies.base import AssistantMessage, Policy, PolicyError
from agentic_jax.agents.tools.base import Tool
from agentic_jax.agents.tools.budget import Budget, BudgetTracker, Pricing, StopReason
from agentic_jax.agents.tools.executor import ToolExecutor, ToolResult, as_executor
from agentic_jax.agents.tools.loop_detection import REDIRECT, STOP, LoopDetector
from agentic_jax.data.chat import Message

SYSTEM_PROMPT = (
    "You are a careful assistant that solves tasks step by step. Call a tool whenever "
    "it helps; when you know the answer, reply with it and call no tool. " + DATA_RULE
)
HARNESS_NOTE = "Note from the agent harness: "
CUT_OFF = (
    "your last reply was cut off at the token limit, so it is not taken as your answer; "
    "give the final answer more briefly, or call a tool"
)


class Replay(NamedTuple):
    """What a run takes from an earlier run of the same task instead of asking the policy and
    running the tools: ``turns``, that run's first model turns, and ``results``, its first tool
    results, each in the order the run made them.  ``origin`` (which run, from which step) is
    added to the new run's ``run_start`` event."""

    turns: Sequence[AssistantMessage] = ()
    results: Sequence[ToolResult] = ()
    origin: Mapping[str, Any] = MappingProxyType({})


class _Replayed:
    """``policy`` after ``turns``: the recorded turns first, in order, then its own."""

    def __init__(self, turns: Sequence[AssistantMessage], policy: Policy):
        self.turns, self.policy = deque(turns), policy

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        if self.turns:
            return self.turns.popleft()
        return self.policy.respond(messages, tools, **sampling)


class ReActAgent:
    """A ReAct loop over ``policy`` and ``tools`` (a list of :class:`Tool` or a configured
    :class:`ToolExecutor`); ``sampling`` keywords go to every model call."""

    def __init__(
        self,
        policy: Policy,
        tools: ToolExecutor | Sequence[Tool] = (),
        *,
        system_prompt: str = SYSTEM_PROMPT,
        budget: Budget = Budget(),
        pricing: Pricing = Pricing(),
        context: ContextManager | None = None,
        compaction: bool = True,
        loop_detector: LoopDetector = LoopDetector(),
        tracer: Tracer | None = None,
        sampling: dict | None = None,
    ):
        self.policy, self.executor = policy, as_executor(tools)
        self.system_prompt, self.budget, self.pricing = system_prompt, budget, pricing
        self.context, self.tracer = context, tracer
        self.loop_detector = loop_detector
        self.sampling = dict(sampling or {})
        # The harness's own tools (compaction) are not subject to the allow-list.
        self.harness = ToolExecutor([compaction_tool(context)] if context and compaction else [])

    def run(
        self, task: str, *, retrieved: Sequence[str] = (), replay: Replay | None = None
    ) -> AgentResult:
        """A run on ``task``; given a ``replay``, it begins as the earlier run it replays."""
        run = Run(BudgetTracker(self.budget, self.pricing), self.tracer)
        run.start(task, "react", **(replay.origin if replay else {}))
        return run.finish(task, self.loop(run, task, retrieved=retrieved, replay=replay))

    def converse(
        self, opening: str, user: Callable[[str], str | None], *, max_turns: int = 10
    ) -> AgentResult:
        """A conversation that ``opening``, the user's first message, starts: each reply of the
        agent without a tool call goes to ``user``, whose answer continues the same history,
        until ``user`` returns None (done: stop reason ``answer``), ``max_turns`` replies have
        gone to a user who is not done (``max_turns``), or the loop stops otherwise (a budget,
        a loop, a policy error).  One budget and one trace cover the whole conversation; the
        answer is the agent's last reply."""
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        run = Run(BudgetTracker(self.budget, self.pricing), self.tracer)
        run.start(opening, "react")
        history, message = [], opening
        for turn in range(1, max_turns + 1):
            outcome = self.loop(run, message, history=history)
            if outcome.reason is not StopReason.ANSWER:
                break
            message = user(outcome.answer)
            if message is None:
                run.decide("answer", "the user ended the conversation")
                break
            run.tracer.message(turn, "user", ["agent"], "reply", message)
            history = outcome.messages
        else:
            detail = f"{max_turns} replies went to the user, who did not end the conversation"
            run.decide("stop", detail, reason=StopReason.MAX_TURNS.value)
            messages = [*outcome.messages, Message("user", message)]
            outcome = Outcome(outcome.answer, StopReason.MAX_TURNS, detail, messages)
        return run.finish(opening, outcome)

    def _tools(self) -> list[Tool]:
        return self.executor.available() + self.harness.available()

    def _prompt(
        self, system: str, history: list[Message], retrieved: Sequence[str], tools: list[Tool]
    ) -> list[Message]:
        if self.context is None:
            if retrieved:
                system += "\n\n# Retrieved context\n" + "\n\n".join(retrieved)
            return [Message("system", system), *history]
        schemas = json.dumps([t.spec.openai() for t in tools])
        return self.context.build(system, history, retrieved, reserved=self.context.count(schemas))

    def _execute(self, call, recorded: deque[ToolResult]) -> ToolResult:
        """The result of ``call``: the next ``recorded`` one while any is left (a replay)."""
        harness = call.name in self.harness.tools
        if recorded:
            result = recorded.popleft()
            if result.call != call:
                raise ValueError(
                    f"the replayed run calls {call.name}({call.arguments_text()}) where its record "
                    f"has {result.call.name}({result.call.arguments_text()})"
                )
            if not harness:
                return result
            # The harness's own tools (compaction) change only the context: they run again.
        return (self.harness if harness else self.executor).execute(call)

    def loop(
        self,
        run: Run,
        task: str,
        *,
        system_prompt: str | None = None,
        retrieved: Sequence[str] = (),
        history: Sequence[Message] = (),
        replay: Replay | None = None,
    ) -> Outcome:
        """The ReAct loop inside ``run`` (whose budget and trace it shares) on the user message
        ``task``, which continues the conversation ``history`` (none: a new one), beginning with
        the turns and results of ``replay``."""
        system = self.system_prompt if system_prompt is None else system_prompt
        policy = self.policy if replay is None else _Replayed(replay.turns, self.policy)
        recorded = deque(replay.results if replay else ())
        detector = dataclasses.replace(self.loop_detector)  # fresh counts
        if self.context is not None and not history:
            self.context.new_history()
        history = [*history, Message("user", task)]
        while True:
            tools = self._tools()
            try:
                prompt = self._prompt(system, history, retrieved, tools)
                reply = run.model(policy, prompt, tools, **self.sampling)
            except BudgetExceeded as e:
                return Outcome(None, e.reason, e.detail, history)
            except PolicyError as e:
                run.decide("stop", str(e), reason=StopReason.POLICY_ERROR.value)
                return Outcome(None, StopReason.POLICY_ERROR, str(e), history)
            history.append(reply.to_message())
            if not reply.tool_calls and reply.finish_reason == "length":
                # A truncated reply (perhaps a tool call cut off mid-JSON) is no answer.
                run.decide("redirect", "the reply was cut off at the token limit")
                history.append(Message("user", HARNESS_NOTE + CUT_OFF))
                continue
            if not reply.tool_calls:
                run.decide("answer", "the model replied without a tool call")
                return Outcome(reply.text, StopReason.ANSWER, "the model gave its answer", history)
            results = []
            for i, call in enumerate(reply.tool_calls):
                verdict = detector.check_call(call)
                if verdict.action == STOP:
                    run.decide("stop", verdict.message, reason=verdict.reason.value)
                    # Every call gets a result, so that the history stays valid to continue from
                    # (chat APIs reject a call without one).
                    history += [
                        Message("tool", "error: not run, the run stopped: " + verdict.message)
                    ] * (len(reply.tool_calls) - i)
                    return Outcome(None, verdict.reason, verdict.message, history)
                if verdict.action == REDIRECT:
                    run.decide("redirect", verdict.message, reason=verdict.reason.value)
                    history.append(Message("tool", "error: " + verdict.message))
                    results.append((False, verdict.message))
                    continue
                result = self._execute(call, recorded)
                run.tracer.tool_call(run.step, result)
                history.append(result.message())
                results.append((result.ok, result.content))
            verdict = detector.check_step(results)
            if verdict.action == STOP:
                run.decide("stop", verdict.message, reason=verdict.reason.value)
                return Outcome(None, verdict.reason, verdict.message, history)
            if verdict.action == REDIRECT:
                run.decide("redirect", verdict.message, reason=verdict.reason.value)
                history.append(Message("user", HARNESS_NOTE + verdict.message))
