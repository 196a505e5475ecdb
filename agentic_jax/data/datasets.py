"""The dataset files people already have, read into this project's records.

Files are JSON Lines (``.jsonl``, ``.json``, ``.jsonl.gz``: one record a line) or Parquet
(``.parquet``, ``.pq``: one record a row).  The formats, told apart by their keys
(:func:`detect_format`) or named:

* ``openai``: ``{"messages": [...], "tools": [...]}``, OpenAI's chat format.  Assistant turns
  carry ``tool_calls`` (``{"id", "type": "function", "function": {"name", "arguments":
  "<JSON text>"}}``) answered by ``tool`` turns (``tool_call_id``, ``content``); the legacy
  ``function_call`` / ``function`` role form and ``functions`` list read the same way.
  ``developer`` turns are system turns; content may be text parts.
* ``sharegpt``: ``{"conversations": [{"from", "value"}, ...], "tools": ...}`` with ``from`` one
  of ``system``, ``human``, ``gpt``, ``function_call`` (a JSON call, or a list of them) and
  ``observation`` (a tool result).
* ``preference`` (TRL): ``prompt``, ``chosen``, ``rejected``, each text or a message list; with
  no ``prompt`` (the implicit-prompt form) the longest shared prefix of ``chosen`` and
  ``rejected`` is the prompt (whole messages; in text, whole words).
* ``kto`` (TRL's unpaired form): ``prompt``, ``completion`` and a boolean ``label``.
* ``prompt`` (RL): ``prompt`` (text or messages), the reference ``answer`` and an optional
  ``verifier`` name (the environment that scores it says which it knows).

Text in place of messages is a user turn in a prompt and an assistant turn in a completion.
Conversations become :class:`Conversation`; the others keep their messages as ``Message``
tuples.  A record that does not fit raises :class:`DatasetError` naming the file, the line
(JSONL, from 1) or row (Parquet, from 0) and the field, e.g. ``messages[2].tool_calls[0].
function.arguments``.  Tool-call ids are checked (a tool turn answers a call made before it)
and dropped: the chat template matches results to calls by order.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from agentic_jax.data.chat import Message, ToolCall, ToolSpec, with_tools

PARQUET_SUFFIXES = (".parquet", ".pq")


class DatasetError(ValueError):
    """A record that does not fit its format: ``path``, ``where`` (``line 3`` / ``row 2``),
    ``field`` (None for the record as a whole)."""

    def __init__(self, path: str, where: str, field: str | None, problem: str):
        self.path, self.where, self.field = path, where, field
        at = f", field {field!r}" if field else ""
        super().__init__(f"{path}, {where}{at}: {problem}")


class Source(NamedTuple):
    """Where a record came from: the file and ``line n`` or ``row n``."""

    path: str
    where: str

    def error(self, field: str | None, problem: str) -> DatasetError:
        return DatasetError(self.path, self.where, field, problem)


_SOURCE = dataclasses.field(default=Source("", ""), compare=False)


@dataclasses.dataclass(frozen=True)
class Conversation:
    """A chat for SFT: its messages and the tools offered (``tools`` of the record)."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    source: Source = _SOURCE

    def rendered_messages(self) -> list[Message]:
        """The messages with the tools in the system message (``chat.with_tools``)."""
        return with_tools(self.messages, self.tools)


@dataclasses.dataclass(frozen=True)
class Preference:
    """A preference pair: ``chosen`` and ``rejected`` continue ``prompt``."""

    prompt: tuple[Message, ...]
    chosen: tuple[Message, ...]
    rejected: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    source: Source = _SOURCE


@dataclasses.dataclass(frozen=True)
class Unpaired:
    """KTO's example: one ``completion`` of ``prompt``, ``desirable`` or not."""

    prompt: tuple[Message, ...]
    completion: tuple[Message, ...]
    desirable: bool
    tools: tuple[ToolSpec, ...] = ()
    source: Source = _SOURCE


@dataclasses.dataclass(frozen=True)
class PromptTask:
    """An RL problem: the ``prompt``, its reference ``answer`` and the ``verifier`` to score it
    with (None: the environment's default)."""

    prompt: tuple[Message, ...]
    answer: str
    verifier: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    source: Source = _SOURCE


def read_records(path: str | os.PathLike) -> Iterator[tuple[Source, dict]]:
    """``(source, record)`` of every record of a JSONL or Parquet file (blank lines skipped)."""
    path = os.fspath(path)
    if path.endswith(PARQUET_SUFFIXES):
        import pyarrow.parquet as pq

        row = 0
        for batch in pq.ParquetFile(path).iter_batches():
            for record in batch.to_pylist():
                yield Source(path, f"row {row}"), record
                row += 1
        return
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            source = Source(path, f"line {number}")
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise source.error(None, f"not JSON ({e})") from None
            if not isinstance(record, dict):
                raise source.error(None, f"expected a JSON object, got {type(record).__name__}")
            yield source, record


def _present(record: Mapping[str, Any], key: str) -> bool:
    """Whether the record has ``key`` (Parquet gives absent struct fields as None)."""
    return record.get(key) is not None


def detect_format(record: Mapping[str, Any]) -> str | None:
    """The format a record's keys say (see the module docstring), or None."""
    if _present(record, "messages"):
        return "openai"
    if _present(record, "conversations"):
        return "sharegpt"
    if _present(record, "chosen") or _present(record, "rejected"):
        return "preference"
    if _present(record, "completion") or _present(record, "label"):
        return "kto"
    if _present(record, "prompt"):
        return "prompt"
    return None


def _require(source: Source, value, kind: type | tuple[type, ...], field: str, what: str):
    if not isinstance(value, kind):
        raise source.error(field, f"expected {what}, got {_describe(value)}")
    return value


def _describe(value) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {json.dumps(value)[:60]}"


def _text(source: Source, value, field: str) -> str:
    """Message content: text, nothing, or OpenAI's text parts (joined)."""
    if value is None or isinstance(value, str):
        return value or ""
    parts = _require(source, value, list, field, "text or a list of text parts")
    texts = []
    for i, part in enumerate(parts):
        text = part.get("text") if isinstance(part, dict) else None
        if not isinstance(text, str) or part.get("type", "text") != "text":
            raise source.error(f"{field}[{i}]", 'expected a {"type": "text", "text": ...} part')
        texts.append(text)
    return "".join(texts)


def _call(source: Source, call, field: str) -> ToolCall:
    """A ``{"name", "arguments"}`` call; arguments a JSON object or its text."""
    call = _require(source, call, dict, field, "a tool call object")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise source.error(f"{field}.name", f"expected a tool name, got {_describe(name)}")
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise source.error(f"{field}.arguments", f"not JSON ({e})") from None
    if arguments is None:
        arguments = {}
    _require(source, arguments, dict, f"{field}.arguments", "a JSON object")
    return ToolCall(name, arguments)


def _openai_call(source: Source, call, field: str) -> tuple[str | None, ToolCall]:
    """``(id, call)`` of a ``tool_calls`` entry (the flat ``{"name", "arguments"}`` form too)."""
    call = _require(source, call, dict, field, "a tool call object")
    if call.get("type") not in (None, "function"):
        raise source.error(f"{field}.type", f"expected 'function', got {call['type']!r}")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise source.error(f"{field}.id", f"expected text, got {_describe(call_id)}")
    if _present(call, "function"):
        return call_id, _call(source, call["function"], f"{field}.function")
    return call_id, _call(source, call, field)


_OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


def _openai_messages(source: Source, messages, field: str) -> tuple[Message, ...]:
    """OpenAI chat messages (tool calls and the legacy function-call form)."""
    messages = _require(source, messages, list, field, "a list of messages")
    out, call_ids = [], set()
    for i, message in enumerate(messages):
        at = f"{field}[{i}]"
        message = _require(source, message, dict, at, "a message object")
        role = _OPENAI_ROLES.get(message.get("role"))
        if role is None:
            raise source.error(
                f"{at}.role",
                f"expected one of {sorted(_OPENAI_ROLES)}, got {message.get('role')!r}",
            )
        content = _text(source, message.get("content"), f"{at}.content")
        calls = []
        if _present(message, "tool_calls") or _present(message, "function_call"):
            if role != "assistant":
                raise source.error(f"{at}.role", f"only assistant turns call tools, not {role!r}")
            entries = _require(
                source, message.get("tool_calls") or [], list, f"{at}.tool_calls", "a list"
            )
            for j, entry in enumerate(entries):
                call_id, call = _openai_call(source, entry, f"{at}.tool_calls[{j}]")
                call_ids.add(call_id)
                calls.append(call)
            if _present(message, "function_call"):
                calls.append(_call(source, message["function_call"], f"{at}.function_call"))
        call_id = message.get("tool_call_id")
        if role == "tool" and call_id is not None and call_id not in call_ids:
            raise source.error(f"{at}.tool_call_id", f"{call_id!r} answers no earlier tool call")
        out.append(Message(role, content, tuple(calls)))
    return tuple(out)


_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
}


def _sharegpt_messages(source: Source, turns, field: str) -> tuple[Message, ...]:
    turns = _require(source, turns, list, field, "a list of turns")
    out = []
    for i, turn in enumerate(turns):
        at = f"{field}[{i}]"
        turn = _require(source, turn, dict, at, "a turn object")
        speaker = turn.get("from")
        if speaker not in _SHAREGPT_ROLES:
            raise source.error(
                f"{at}.from", f"expected one of {sorted(_SHAREGPT_ROLES)}, got {speaker!r}"
            )
        value = _require(source, turn.get("value"), str, f"{at}.value", "text")
        if speaker != "function_call":
            out.append(Message(_SHAREGPT_ROLES[speaker], value))
            continue
        try:
            payload = json.loads(value)
        except json.JSONDecodeError as e:
            raise source.error(f"{at}.value", f"not JSON ({e})") from None
        entries = payload if isinstance(payload, list) else [payload]
        calls = tuple(_call(source, c, f"{at}.value") for c in entries)
        out.append(Message("assistant", "", calls))
    return tuple(out)


def _tools(source: Source, record: Mapping[str, Any]) -> tuple[ToolSpec, ...]:
    """The record's ``tools`` (OpenAI tool objects, or their JSON text) or legacy ``functions``."""
    key = "tools" if _present(record, "tools") else "functions"
    value = record.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise source.error(key, f"not JSON ({e})") from None
    specs = []
    for i, spec in enumerate(_require(source, value, list, key, "a list of tools")):
        function = spec.get("function", spec) if isinstance(spec, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise source.error(f"{key}[{i}]", "expected a tool with a function name")
        if not isinstance(function.get("parameters") or {}, dict):
            raise source.error(f"{key}[{i}].parameters", "expected a JSON schema object")
        specs.append(ToolSpec.from_openai(spec))
    return tuple(specs)


def _messages(source: Source, value, field: str, role: str) -> tuple[Message, ...]:
    """Text (one ``role`` turn) or a message list; never empty."""
    if isinstance(value, str):
        messages = (Message(role, value),) if value else ()
    else:
        messages = _openai_messages(source, value, field)
    if not messages:
        raise source.error(field, "is empty")
    return messages


def _conversation(source: Source, record: Mapping[str, Any], fmt: str) -> Conversation:
    if fmt == "openai":
        messages = _openai_messages(source, record.get("messages"), "messages")
    else:
        messages = _sharegpt_messages(source, record.get("conversations"), "conversations")
    if not any(m.role == "assistant" for m in messages):
        raise source.error(
            "messages" if fmt == "openai" else "conversations", "has no assistant turn"
        )
    return Conversation(messages, _tools(source, record), source)


def _shared_prefix(chosen, rejected):
    """``(prompt, chosen, rejected)``: the longest shared prefix of whole messages (TRL's
    ``extract_prompt``) or, in text, of whole words, with the whitespace between prompt and
    completion dropped (the chat template puts them in turns of their own)."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if isinstance(chosen, str):
        n = max(chosen.rfind(" ", 0, n + 1), chosen.rfind("\n", 0, n + 1), 0)
        return chosen[:n].rstrip(), chosen[n:].lstrip(), rejected[n:].lstrip()
    return chosen[:n], chosen[n:], rejected[n:]


def _preference(source: Source, record: Mapping[str, Any]) -> Preference:
    chosen, rejected = record.get("chosen"), record.get("rejected")
    for field, value in (("chosen", chosen), ("rejected", rejected)):
        _require(source, value, (str, list), field, "text or a list of messages")
    if _present(record, "prompt"):
        prompt = _messages(source, record["prompt"], "prompt", "user")
    else:
        if type(chosen) is not type(rejected):
            raise source.error("rejected", "must be text like 'chosen', or messages like it")
        prompt, chosen, rejected = _shared_prefix(chosen, rejected)
        if not prompt:
            raise source.error("prompt", "absent, and 'chosen' and 'rejected' share no prefix")
        prompt = _messages(source, prompt, "chosen", "user")
    return Preference(
        prompt,
        _messages(source, chosen, "chosen", "assistant"),
        _messages(source, rejected, "rejected", "assistant"),
        _tools(source, record),
        source,
    )


def _unpaired(source: Source, record: Mapping[str, Any]) -> Unpaired:
    label = _require(source, record.get("label"), bool, "label", "true or false")
    return Unpaired(
        _messages(source, record.get("prompt"), "prompt", "user"),
        _messages(source, record.get("completion"), "completion", "assistant"),
        label,
        _tools(source, record),
        source,
    )


def _prompt_task(source: Source, record: Mapping[str, Any]) -> PromptTask:
    answer = record.get("answer")
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        answer = str(answer)
    verifier = record.get("verifier")
    if verifier is not None:
        _require(source, verifier, str, "verifier", "a verifier name")
    return PromptTask(
        _messages(source, record.get("prompt"), "prompt", "user"),
        _require(source, answer, str, "answer", "the reference answer"),
        verifier,
        _tools(source, record),
        source,
    )


_READERS: dict[str, Callable[[Source, Mapping[str, Any]], Any]] = {
    "openai": lambda source, record: _conversation(source, record, "openai"),
    "sharegpt": lambda source, record: _conversation(source, record, "sharegpt"),
    "preference": _preference,
    "kto": _unpaired,
    "prompt": _prompt_task,
}
FORMATS = tuple(_READERS)


def read_dataset(
    path: str | os.PathLike, format: str = "auto", *, accept: tuple[str, ...] = FORMATS
) -> list:
    """Every record of the file, in the named ``format`` or each in the one its keys say
    (``auto``), which must be one of ``accept``; errors name the file, line and field."""
    if format != "auto" and format not in accept:
        raise ValueError(f"format={format!r}; expected 'auto' or one of {accept}")
    records = []
    for source, record in read_records(path):
        fmt = detect_format(record) if format == "auto" else format
        if fmt not in accept:
            raise source.error(
                None,
                f"expected a record of {accept}, found the keys "
                f"{sorted(k for k in record if _present(record, k))}"
                + (f" ({fmt})" if fmt else ""),
            )
        records.append(_READERS[fmt](source, record))
    if not records:
        raise DatasetError(os.fspath(path), "the whole file", None, "holds no records")
    return records


def read_conversations(path: str | os.PathLike, format: str = "auto") -> list[Conversation]:
    """The file's chats (``openai`` or ``sharegpt``)."""
    return read_dataset(path, format, accept=("openai", "sharegpt"))


def read_preferences(path: str | os.PathLike) -> list[Preference]:
    """The file's TRL preference pairs (explicit or implicit prompt, text or messages)."""
    return read_dataset(path, "preference", accept=("preference",))


def read_unpaired(path: str | os.PathLike) -> list[Unpaired]:
    """The file's KTO examples."""
    return read_dataset(path, "kto", accept=("kto",))


def read_prompts(path: str | os.PathLike) -> list[PromptTask]:
    """The file's RL problems."""
    return read_dataset(path, "prompt", accept=("prompt",))
