"""ChatML-style chat template with tool calls, its exact inverse, and the SFT assistant mask.

A conversation renders as (every line ends with a newline)::

    <|im_start|>system
    You are terse.<|im_end|>
    <|im_start|>user
    Weather in Oslo?<|im_end|>
    <|im_start|>assistant
    Checking.<tool_call>
    {"name": "weather", "arguments": {"city": "Oslo"}}
    </tool_call><|im_end|>
    <|im_start|>tool
    <tool_result>
    {"temp_c": 3}
    </tool_result><|im_end|>
    <|im_start|>assistant

where the last line is the generation prompt.  Tool-call JSON escapes ``<`` as ``\\u003c``, so
no argument can forge a special token; message text may not contain special-token strings at
all, which keeps ``parse`` an exact inverse of ``render``.  This is the built-in template;
``chat_template`` puts it behind one interface with Hugging Face Jinja templates.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from agentic_jax.data.tokenizer import (
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TOOL_RESULT,
    TOOL_RESULT_END,
    Tokenizer,
)
from agentic_jax.data.tool_formats import AgenticJax, ToolCall

ROLES = ("system", "user", "assistant", "tool")
TOOL_FORMAT = AgenticJax()  # how assistant turns carry their tool calls


class ToolSpec(NamedTuple):
    """What a model is told about a tool (an OpenAI ``function`` object's fields).  Empty
    ``parameters`` mean a tool without arguments and render as the empty object schema, as an
    OpenAI spec without ``parameters`` does."""

    name: str
    description: str
    parameters: dict

    @property
    def schema(self) -> dict:
        return self.parameters or {"type": "object", "properties": {}}

    def openai(self) -> dict:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.schema,
            },
        }

    @classmethod
    def from_openai(cls, spec: Mapping[str, Any]) -> ToolSpec:
        function = spec.get("function", spec)
        return cls(
            function["name"],
            function.get("description", ""),
            dict(function.get("parameters") or {"type": "object", "properties": {}}),
        )


def as_data(text: str) -> str:
    """Tool output with chat-template tokens defused (``<`` written ``\\u003c``, as tool-call JSON
    does), so text a tool returns is always rendered as data inside its tool turn."""
    for token in SPECIAL_TOKENS:
        text = text.replace(token, "\\u003c" + token[1:])
    return text


def tools_system_prompt(specs: Sequence[ToolSpec]) -> str:
    """The tool section of a system message: a heading, then one JSON line per tool (keys
    sorted, so that equal specs always render to the same tokens).  How to call is the chat
    format's, taught by the demonstrations; every prompt carries this section, so it is short."""
    lines = [
        json.dumps(
            {"name": s.name, "description": s.description, "parameters": s.schema},
            ensure_ascii=False,
            sort_keys=True,
        ).replace("<", "\\u003c")
        for s in specs
    ]
    return as_data("\n".join(["# Tools", *lines]))


@dataclasses.dataclass(frozen=True)
class Message:
    """One turn.  ``tool_calls`` only on assistant turns; a ``tool`` turn's content is a result."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))  # lists compare unequal.


MessageLike = Message | Mapping[str, Any]


def as_tool_call(call: ToolCall | Mapping[str, Any]) -> ToolCall:
    """A ``ToolCall`` from itself or a dict with name and arguments (a mapping or JSON text),
    bare or under ``function`` as the OpenAI API nests them."""
    if isinstance(call, ToolCall):
        return call
    call = call.get("function", call)
    arguments = call.get("arguments", {})
    return ToolCall(call["name"], dict(arguments) if isinstance(arguments, Mapping) else arguments)


def as_message(message: MessageLike) -> Message:
    """A ``Message`` from itself or a dict with role, content, tool_calls [{name, arguments}]."""
    if isinstance(message, Message):
        return message
    calls = tuple(map(as_tool_call, message.get("tool_calls") or ()))
    return Message(message["role"], message.get("content") or "", calls)


class _Piece(NamedTuple):
    """A span of the rendered text: a special token or plain text, trained on or not."""

    text: str
    special: bool
    assistant: bool


def with_tools(messages: Sequence[MessageLike], specs: Sequence[ToolSpec]) -> list[Message]:
    """``messages`` with the tool section appended to the system message (added if absent).

    The one way tools reach a prompt: the text environments build their tasks' prompts with it
    and the serving layer renders a request's tools with it, so a model trained on the tasks is
    served the prompt it learned on."""
    messages = [as_message(m) for m in messages]
    if not specs:
        return messages
    section = tools_system_prompt(specs)
    if messages and messages[0].role == "system":
        return [Message("system", f"{messages[0].content}\n\n{section}"), *messages[1:]]
    return [Message("system", section), *messages]


def split_tools(messages: Sequence[MessageLike]) -> tuple[list[Message], list[ToolSpec]]:
    """The inverse of `with_tools`: the messages without the tool section and the specs it
    lists (none, and the messages as they are, when the system message has no such section).
    A prompt built for this template is rendered through a model's own template this way."""
    messages = [as_message(m) for m in messages]
    if not messages or messages[0].role != "system":
        return messages, []
    system = messages[0].content
    head, sep, section = system.rpartition("\n\n# Tools\n")
    if not sep:
        head, section = None, system.removeprefix("# Tools\n")
    try:
        specs = [
            ToolSpec(t["name"], t["description"], t["parameters"])
            for t in map(json.loads, section.split("\n"))
        ]
    except (ValueError, KeyError, TypeError):
        return messages, []
    rest = messages[1:] if head is None else [Message("system", head), *messages[1:]]
    if with_tools(rest, specs) != messages:
        return messages, []
    return rest, specs


def _check_plain(text: str, what: str) -> None:
    for token in SPECIAL_TOKENS:
        if token in text:
            raise ValueError(f"{what} contains the reserved token {token!r}")


def _message_pieces(message: Message) -> list[_Piece]:
    if message.role not in ROLES:
        raise ValueError(f"unknown role {message.role!r}; expected one of {ROLES}")
    if message.tool_calls and message.role != "assistant":
        raise ValueError(f"only assistant messages carry tool calls, not {message.role!r}")
    _check_plain(message.content, f"{message.role} message")
    trained = message.role == "assistant"
    pieces = [_Piece(IM_START, True, False), _Piece(f"{message.role}\n", False, False)]
    if message.role == "tool":
        pieces += [
            _Piece(TOOL_RESULT, True, False),
            _Piece(f"\n{message.content}\n", False, False),
            _Piece(TOOL_RESULT_END, True, False),
        ]
    else:
        pieces.append(_Piece(message.content, False, trained))
    for call in message.tool_calls:  # the agentic_jax tool-call format, token by token
        pieces += [
            _Piece(TOOL_FORMAT.open, True, True),
            _Piece(TOOL_FORMAT.call_body(call), False, True),
            _Piece(TOOL_FORMAT.close, True, True),
        ]
    return pieces + [_Piece(IM_END, True, trained), _Piece("\n", False, False)]


def _pieces(messages: Iterable[MessageLike], add_generation_prompt: bool) -> list[_Piece]:
    pieces = [p for m in messages for p in _message_pieces(as_message(m))]
    if add_generation_prompt:
        pieces += [_Piece(IM_START, True, False), _Piece("assistant\n", False, False)]
    return pieces


def render(messages: Iterable[MessageLike], *, add_generation_prompt: bool = False) -> str:
    """The conversation as text, ending with an open assistant turn if ``add_generation_prompt``."""
    return "".join(p.text for p in _pieces(messages, add_generation_prompt))


class RenderedIds(NamedTuple):
    ids: np.ndarray  # int32 [n]
    assistant_mask: np.ndarray  # int32 [n]: 1 on assistant content, tool calls and their <|im_end|>


def render_ids(
    messages: Iterable[MessageLike],
    tokenizer: Tokenizer,
    *,
    add_generation_prompt: bool = False,
    add_bos: bool = True,
) -> RenderedIds:
    """Token ids of ``render(messages)`` and the per-token assistant mask for SFT.

    Each span is tokenized on its own (special tokens by id), so assistant tokens never merge
    with the header before them and the prompt of a generation is a prefix of the training
    sequence; ``tokenizer.decode(ids)`` equals ``render(messages)`` (after a BOS, if added).
    """
    ids = tokenizer.encode("", add_bos=add_bos)  # [BOS] or []; raises if there is no BOS.
    mask = [0] * len(ids)
    for piece in _pieces(messages, add_generation_prompt):
        piece_ids = (
            [tokenizer.token_id(piece.text)] if piece.special else tokenizer.encode(piece.text)
        )
        ids += piece_ids
        mask += [int(piece.assistant)] * len(piece_ids)
    return RenderedIds(np.asarray(ids, np.int32), np.asarray(mask, np.int32))


def parse_assistant(text: str) -> Message:
    """Parses an assistant turn's body, e.g. what a model generated after the generation prompt.

    A trailing ``<|im_end|>`` is allowed; JSON inside ``<tool_call>`` may have any whitespace.
    Calls are read by the ``agentic_jax`` tool-call format; its first error is a ``ValueError``.
    """
    content, calls, errors = TOOL_FORMAT.parse(text.removesuffix(IM_END))
    if errors:
        raise ValueError(errors[0])
    return Message("assistant", content, calls)


def _parse_body(role: str, body: str) -> Message:
    if role == "assistant":
        return parse_assistant(body)
    if role == "tool":
        prefix, suffix = f"{TOOL_RESULT}\n", f"\n{TOOL_RESULT_END}"
        if not (
            body.startswith(prefix)
            and body.endswith(suffix)
            and len(body) >= len(prefix) + len(suffix)
        ):
            raise ValueError(f"tool message must be wrapped in {TOOL_RESULT}: {body!r}")
        body = body[len(prefix) : -len(suffix)]
    _check_plain(body, f"{role} message")
    return Message(role, body)


def parse(text: str) -> list[Message]:
    """Inverse of ``render``: ``parse(render(ms)) == ms``; a final generation prompt is dropped."""
    messages, pos = [], 0
    while pos < len(text):
        if not text.startswith(IM_START, pos):
            raise ValueError(f"expected {IM_START} at offset {pos}")
        header_end = text.find("\n", pos)
        role = text[pos + len(IM_START) : header_end] if header_end >= 0 else None
        if role not in ROLES:
            raise ValueError(f"bad turn header at offset {pos}")
        end = text.find(IM_END, header_end)
        if end < 0:
            if role == "assistant" and header_end + 1 == len(text):
                break  # the generation prompt
            raise ValueError(f"unterminated {role} turn at offset {pos}")
        messages.append(_parse_body(role, text[header_end + 1 : end]))
        pos = end + len(IM_END)
        if not text.startswith("\n", pos):
            raise ValueError(f"expected a newline after {IM_END} at offset {pos}")
        pos += 1
    return messages
