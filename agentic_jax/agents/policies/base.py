"""The policy protocol: whatever maps a conversation and a tool list to the next assistant turn.

Agent loops only ever call :meth:`Policy.respond`, so the same loop runs on a local JAX model
(``jax_policy.JaxPolicy``), on any OpenAI-compatible server (``http_policy.HTTPPolicy``) or on a
fixed script (:class:`ScriptedPolicy`, which makes loops testable without a model).  Sampling
settings travel as keywords with the OpenAI API's names (``temperature``, ``top_p``,
``max_tokens``, ``seed``, ``stop``, ``tool_choice``); a backend ignores those it cannot honour.

A policy that can hand out a turn while it is generated is a :class:`StreamingPolicy`;
:class:`StreamedPolicy` makes any policy one that streams to a callback where it can (the web UI
shows tokens and tool-call arguments as they come this way).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

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


class Delta(NamedTuple):
    """A piece of an assistant turn as it is generated: ``text``, or a piece of the JSON
    ``arguments`` of the turn's call number ``call`` (its first piece also carries ``name``)."""

    text: str = ""
    call: int | None = None
    name: str = ""
    arguments: str = ""


OnDelta = Callable[[Delta], None]


@runtime_checkable
class StreamingPolicy(Policy, Protocol):
    def respond_streaming(
        self, messages: Sequence[Message], tools: Sequence, on_delta: OnDelta, **sampling: Any
    ) -> AssistantMessage:
        """:meth:`Policy.respond`, handing ``on_delta`` the turn's pieces as they come; the
        pieces of the text, and of each call's arguments, join to the returned turn's."""


class StreamedPolicy:
    """``policy``, whose turns stream to ``on_delta`` when it is a :class:`StreamingPolicy`
    (a policy that is not answers whole turns, and ``on_delta`` sees nothing)."""

    def __init__(self, policy: Policy, on_delta: OnDelta):
        self.policy, self.on_delta = policy, on_delta

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        if isinstance(self.policy, StreamingPolicy):
            return self.policy.respond_streaming(messages, tools, self.on_delta, **sampling)
        return self.policy.respond(messages, tools, **sampling)


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


ARGUMENT_PIECE = 8  # characters of a scripted call's arguments per streamed piece


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

    def respond_streaming(self, messages, tools, on_delta: OnDelta, **sampling) -> AssistantMessage:
        """The next turn, handed to ``on_delta`` word by word (its calls' arguments in pieces
        of ``ARGUMENT_PIECE`` characters) as a model's would stream."""
        turn = self.respond(messages, tools, **sampling)
        for word in re.findall(r"\S+\s*|\s+", turn.text):
            on_delta(Delta(text=word))
        for i, call in enumerate(turn.tool_calls):
            arguments = call.arguments_text()
            on_delta(Delta(call=i, name=call.name, arguments=arguments[:ARGUMENT_PIECE]))
            for start in range(ARGUMENT_PIECE, len(arguments), ARGUMENT_PIECE):
                on_delta(Delta(call=i, arguments=arguments[start : start + ARGUMENT_PIECE]))
        return turn
