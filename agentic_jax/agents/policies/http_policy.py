"""A policy served by any OpenAI-compatible chat-completions endpoint (``agentic-jax serve``,
vLLM, llama.cpp's server, hosted APIs), through the official ``openai`` SDK.

**Streaming** (the default) asks for the turn as server-sent chunks and assembles it here: text
deltas are joined and tool calls are put together from their deltas by ``index``, name and
argument pieces concatenated in order (the OpenAI chunk shape, as the SDK's own accumulator reads
it).  :meth:`HTTPPolicy.respond_streaming` (a :class:`~.base.StreamingPolicy`) also hands each
piece on as a :class:`~.base.Delta` as it comes.  A stream's ``timeout_s`` is the longest silence
between chunks, so a long turn never times out while it is still producing.

**Retries** are the SDK's: a 408, 409, 429, 5xx or a connection failure before the reply begins is
retried up to ``max_retries`` times, after the wait the server's ``Retry-After`` (or
``retry-after-ms``) asks for when it says one (up to two minutes), else after exponential backoff
(0.5 s doubling to 8 s, less up to 25% jitter).  A stream that fails once begun is not retried.
Whatever still fails is a :class:`PolicyError`.

The SDK insists on a key: without ``api_key`` it sends a placeholder, which a server without
authentication ignores.  The ``OPENAI_API_KEY`` of the environment is never used: it would go to
whatever ``base_url`` names.

Tool-call ids are a wire detail the harness does not keep: outgoing assistant calls are numbered
by position and each tool message answers the next unanswered call, which is how the harness
orders them anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import gin
import openai

from agentic_jax.agents.policies.base import AssistantMessage, Delta, OnDelta, PolicyError, Usage
from agentic_jax.agents.tools.base import tool_specs
from agentic_jax.data.chat import Message, ToolCall

NO_API_KEY = "EMPTY"  # what the SDK sends for a server without authentication (vLLM's convention)


def openai_messages(messages: Sequence[Message]) -> list[dict]:
    """Chat messages in the OpenAI wire format, with positional tool-call ids."""
    out, pending = [], []
    for turn, m in enumerate(messages):
        if m.role == "tool":
            call_id = pending.pop(0) if pending else f"call_orphan_{turn}"
            out.append({"role": "tool", "tool_call_id": call_id, "content": m.content})
            continue
        entry = {"role": m.role, "content": m.content}
        if m.tool_calls:
            ids = [f"call_{turn}_{i}" for i in range(len(m.tool_calls))]
            pending = list(ids)
            entry["content"] = m.content or None
            entry["tool_calls"] = [
                {
                    "id": i,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_text()},
                }
                for i, c in zip(ids, m.tool_calls)
            ]
        out.append(entry)
    return out


def _usage(usage) -> Usage:
    """The reply's token counts (zero when the server sends none)."""
    if usage is None:
        return Usage()
    return Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0)


def assemble_stream(chunks: Iterable, on_delta: OnDelta | None = None) -> AssistantMessage:
    """The turn that the stream's ``chat.completion.chunk`` objects carry (choice 0): its text
    deltas joined, each tool call's name and argument pieces joined by the call's ``index``, the
    last finish reason and the usage chunk's counts; ``on_delta`` sees each piece as it comes.
    Arguments that are not a JSON object stay text, for the executor to report."""
    text, calls, finish, usage = [], {}, None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta is not None and delta.content:
                text.append(delta.content)
                if on_delta is not None:
                    on_delta(Delta(text=delta.content))
            for piece in (delta.tool_calls if delta is not None else None) or ():
                name, arguments = calls.setdefault(piece.index, ([], []))
                if piece.function is not None:
                    name.append(piece.function.name or "")
                    arguments.append(piece.function.arguments or "")
                    if on_delta is not None:
                        on_delta(Delta(call=piece.index, name=name[-1], arguments=arguments[-1]))
            finish = choice.finish_reason or finish
    tool_calls = tuple(
        ToolCall("".join(name), "".join(arguments) or "{}")
        for _, (name, arguments) in sorted(calls.items())
    )
    return AssistantMessage("".join(text), tool_calls, _usage(usage), finish or "stop")


def _whole_reply(completion) -> AssistantMessage:
    """The turn of a non-streamed ``chat.completion``: choice 0's message."""
    choice = completion.choices[0]
    message = choice.message
    calls = tuple(
        ToolCall(c.function.name, c.function.arguments or "{}") for c in message.tool_calls or ()
    )
    return AssistantMessage(
        message.content or "", calls, _usage(completion.usage), choice.finish_reason or "stop"
    )


@gin.configurable(module="agents")
class HTTPPolicy:
    """``base_url`` ends in ``/v1``; ``defaults`` are sampling keywords every request gets (sent
    as given, so a server's own extensions such as ``top_k`` pass too).

    ``timeout_s``: how long one attempt may wait to connect, or for the next bytes of the reply;
    ``max_retries``: retries after the first attempt (see the module's docstring);
    ``stream``: whether :meth:`respond` asks for the reply as chunks
    (:meth:`respond_streaming` always does).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        stream: bool = True,
        defaults: dict | None = None,
    ):
        if not timeout_s > 0:
            raise ValueError(f"HTTPPolicy.timeout_s must be positive, got {timeout_s!r}")
        if max_retries < 0:
            raise ValueError(f"HTTPPolicy.max_retries must be >= 0, got {max_retries!r}")
        self.base_url, self.model, self.stream = base_url, model, stream
        self.defaults = dict(defaults or {})
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or NO_API_KEY,
            max_retries=max_retries,
            timeout=timeout_s,
        )

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        return self._turn(messages, tools, sampling, self.stream, None)

    def respond_streaming(self, messages, tools, on_delta: OnDelta, **sampling) -> AssistantMessage:
        """:meth:`respond`, streamed, with each piece of text and of a call's arguments handed to
        ``on_delta`` as it comes."""
        return self._turn(messages, tools, sampling, True, on_delta)

    def _turn(self, messages, tools, sampling: dict, stream: bool, on_delta) -> AssistantMessage:
        body = {**self.defaults, **{k: v for k, v in sampling.items() if v is not None}}
        specs = tool_specs(tools)
        if specs:
            body["tools"] = [s.openai() for s in specs]
        else:  # a tool_choice with no tools left (all cut off, say) is a plain turn
            body.pop("tool_choice", None)
        if stream:
            body["stream_options"] = {"include_usage": True}
        try:
            reply = self.client.chat.completions.create(
                model=self.model,
                messages=openai_messages(messages),
                stream=stream,
                extra_body=body,
            )
            if stream:
                with reply:
                    return assemble_stream(reply, on_delta)
            return _whole_reply(reply)
        except openai.APIStatusError as e:
            raise PolicyError(f"HTTP {e.status_code} from {self.base_url}: {e.message}") from None
        except openai.APIConnectionError as e:
            raise PolicyError(f"cannot reach {self.base_url}: {e}") from None
        except openai.APIError as e:  # an error event in the stream
            raise PolicyError(f"error from {self.base_url}: {e.message}") from None
        except (IndexError, AttributeError, TypeError) as e:
            raise PolicyError(f"unexpected response from {self.base_url}: {e!r}") from None
