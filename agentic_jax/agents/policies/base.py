"""The policy protocol: whatever maps a conversation and a tool list to the next assistant turn.

Agent loops only ever call :meth:`Policy.respond`, so the same loop runs on a local JAX model
(``jax_policy.JaxPolicy``), on any OpenAI-compatible server (``http_policy.HTTPPolicy``) or on a
fixed script (:class:`ScriptedPolicy`, which makes loops testable without a model).  Sampling
settings travel as keywords with the OpenAI API's names (``temperature``, ``top_p``,
``max_tokens``, ``seed``, ``stop``, ``tool_choice``); a backend ignores those it cannot honour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import gin

from agentic_jax.agents.context.tokens import TokenCounter, approx_tokens, messages_tokens
from agentic_jax.agents.tools.base import tool_specs
from agentic_jax.data.chat import Message, ToolCall, as_tool_call


class PolicyError(RuntimeError):
    """The policy could not produce a turn (server error, unparseable output)."""


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


@dataclasses.dataclass(frozen=True)
class AssistantMessage:
    """One assistant turn: text and tool calls.  ``finish_reason``: ``stop``, ``tool_calls`` or
    ``length`` (cut off by ``max_tokens``)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    finish_reason: str = "stop"

    def __post_init__(self):
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))

    def to_message(self) -> Message:
        return Message("assistant", self.text, self.tool_calls)


@runtime_checkable
class Policy(Protocol):
    def respond(
        self, messages: Sequence[Message], tools: Sequence = (), **sampling: Any
    ) -> AssistantMessage:
        """The next assistant turn after ``messages``; ``tools`` are ``Tool``s, ``ToolSpec``s or
        OpenAI tool dicts the turn may call."""


def as_assistant_message(response: AssistantMessage | str | Mapping[str, Any]) -> AssistantMessage:
    """A turn from itself, plain text, or ``{"text", "tool_calls": [{"name", "arguments"}]}``."""
    if isinstance(response, AssistantMessage):
        return response
    if isinstance(response, str):
        return AssistantMessage(response)
    calls = tuple(map(as_tool_call, response.get("tool_calls") or ()))
    return AssistantMessage(
        response.get("text") or "", calls, finish_reason="tool_calls" if calls else "stop"
    )


@gin.configurable(module="agents")
class ScriptedPolicy:
    """Replays fixed turns in order, whatever it is asked (for tests and deterministic demos).

    Usage is counted with ``count_tokens`` so that budgets behave as with a real model; every
    request is kept in ``calls`` as ``(messages, tool names, sampling)``.  Running out of turns
    raises :class:`PolicyError`.
    """

    def __init__(
        self,
        responses: Sequence[AssistantMessage | str | Mapping[str, Any]],
        count_tokens: TokenCounter = approx_tokens,
    ):
        self.responses = [as_assistant_message(r) for r in responses]
        self.count_tokens = count_tokens
        self.calls: list[tuple[list[Message], list[str], dict]] = []

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        index = len(self.calls)
        self.calls.append((list(messages), [s.name for s in tool_specs(tools)], dict(sampling)))
        if index >= len(self.responses):
            raise PolicyError(f"ScriptedPolicy has only {len(self.responses)} responses")
        turn = self.responses[index]
        usage = Usage(
            messages_tokens(messages, self.count_tokens),
            messages_tokens([turn.to_message()], self.count_tokens),
        )
        return dataclasses.replace(turn, usage=usage)
