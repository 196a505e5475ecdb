"""Tool-call formats: how an assistant turn's text carries its tool calls, one family per class.

Every format renders ``(content, calls)`` to the text a model of its family writes, parses such
text back to ``(content, calls, errors)`` (never raising: a malformed call is an error naming
the problem and quoting the text, the model's mistake to be told about), and gives the regex of
its calls for constrained decoding (``inference.decoding.constrained`` turns it into a token
automaton): fixed text + JSON objects valid under the tools' schemas + fixed text.

=============== ===================================================================================
``agentic_jax`` this project's ChatML: ``<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>``
                blocks right after the content, ``<`` in the JSON written ``\\u003c``
``hermes``      Hermes / Qwen2.5 / Qwen3: the same blocks, each on a line of its own
``llama3_json`` Llama 3.1 / 3.2: ``{"name": .., "parameters": {..}}`` as the whole message
                (several separated by ``;``, as vLLM reads them; a leading ``<|python_tag|>`` is
                accepted)
``pythonic``    Llama 3.2 / 4 pythonic: ``[f(a=1, b="x"), g()]`` as the whole message
``mistral``     ``[TOOL_CALLS][{"name": .., "arguments": {..}, "id": "abc123456"}, ..]`` after
                the content, 9-character alphanumeric ids
=============== ===================================================================================

:func:`tool_call_format` picks one by name (gin), :func:`format_for_model` from a Hugging Face
``model_type`` or chat template.
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import hashlib
import json
import keyword
import string
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

import gin
import outlines_core

from agentic_jax.data.tokenizer import SPECIAL_TOKENS, TOOL_CALL, TOOL_CALL_END


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A call the assistant makes: tool ``name`` and its JSON-object ``arguments``.

    ``arguments`` may also be given as JSON text (as the OpenAI API sends them), which is parsed.
    Text that is not a JSON object (a model's malformed JSON, or a call cut off at the token limit)
    is kept as it is: it is the model's mistake to be told about (the executor answers it as
    invalid arguments), not a reason to end a run.
    """

    name: str
    arguments: Mapping[str, Any] | str = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.arguments, str):
            try:
                parsed = json.loads(self.arguments)
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's stack
                return
            if isinstance(parsed, dict):
                object.__setattr__(self, "arguments", parsed)

    def arguments_text(self) -> str:
        """The arguments as JSON text, the form the OpenAI API carries; text that never parsed
        as a JSON object, as the model wrote it."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments), ensure_ascii=False)


class ToolSchema(Protocol):
    """What constraining a call needs of a tool (``chat.ToolSpec`` is one)."""

    name: str
    parameters: Mapping[str, Any]


class ParsedTurn(NamedTuple):
    """An assistant turn read by a format: its text, its well-formed calls, and one message per
    malformed call (the problem and the offending text)."""

    content: str
    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _literal(text: str) -> str:
    """``text`` as a regex matching exactly it."""
    return "".join("\\" + c if c in "\\.^$|?*+()[]{} " else c for c in text)


def _loads(text: str) -> tuple[Any, str | None]:
    """(value, None) or (None, the error) for JSON ``text``."""
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as e:
        return None, f"not valid JSON ({e}): {text!r}"


def _call(obj: Any, arguments_keys: tuple[str, ...], extra_keys: tuple[str, ...] = ()):
    """A ``ToolCall`` from a decoded JSON object, or the error that it is none: a string
    ``name``, arguments under one of ``arguments_keys`` (an object or text; absent: none), and
    no keys besides those and ``extra_keys``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return f"a tool call must be a JSON object with a string 'name', got {obj!r}"
    present = [k for k in arguments_keys if k in obj]
    unknown = set(obj) - {"name", *arguments_keys, *extra_keys}
    if unknown or len(present) > 1:
        return f"a tool call has keys name, {'/'.join(arguments_keys)}: got {sorted(obj)}"
    arguments = obj[present[0]] if present else {}
    if not isinstance(arguments, dict | str):
        return f"the arguments of {obj['name']!r} must be an object or text, got {arguments!r}"
    return ToolCall(obj["name"], arguments)


def _arguments(call: ToolCall) -> Mapping[str, Any] | str:
    if not isinstance(call.arguments, Mapping | str):
        raise ValueError(f"arguments of tool call {call.name!r} must be a JSON object or text")
    return call.arguments if isinstance(call.arguments, str) else dict(call.arguments)


def _alternatives(
    specs: Sequence[ToolSchema],
    whitespace_pattern: str | None,
    arguments_key: str = "arguments",
    optional: Mapping[str, Any] | None = None,
) -> str:
    """The regex of one call's JSON object to any of ``specs``: ``{"name": <its name>,
    <arguments_key>: <its parameters>}`` and then the ``optional`` properties, in that key order
    (``outlines-core``'s translation of the schema)."""
    if not specs:
        raise ValueError("constraining a tool call needs at least one tool")
    alternatives = []
    for s in specs:
        properties = {"name": {"const": s.name}, arguments_key: dict(s.parameters)}
        schema = {
            "type": "object",
            "properties": properties | dict(optional or {}),
            "required": list(properties),
            "additionalProperties": False,
        }
        if "$defs" in s.parameters:  # references resolve against the root
            schema["$defs"] = s.parameters["$defs"]
        try:  # the schema is the caller's: whatever it breaks is its error
            regex = outlines_core.json_schema.build_regex_from_schema(
                json.dumps(schema), whitespace_pattern
            )
        except Exception as e:
            raise ValueError(
                f"the parameters of tool {s.name!r} are not a supported JSON schema: {e}"
            ) from None
        alternatives.append(f"(?:{regex})")
    return "(?:" + "|".join(alternatives) + ")"


class ToolCallFormat(abc.ABC):
    """How one model family writes tool calls in an assistant turn.

    A call is ``open + body + close`` (blocks joined by ``separator`` where each call has one;
    Mistral's body is the list of all of a turn's calls); ``close == ""`` means the turn ends
    there.
    """

    name: ClassVar[str]
    open: ClassVar[str]
    close: ClassVar[str] = ""
    separator: ClassVar[str] = ""

    @abc.abstractmethod
    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        """The turn's text; ``ValueError`` for what the format cannot carry."""

    @abc.abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """The turn read back; never raises (malformed calls are ``errors``)."""

    @abc.abstractmethod
    def body_regex(self, specs: Sequence[ToolSchema], whitespace_pattern: str | None) -> str:
        """The regex of what lies between ``open`` and ``close``: one call to any of
        ``specs`` (Mistral: a list of them)."""

    def call_regex(
        self,
        specs: Sequence[ToolSchema],
        whitespace_pattern: str | None = "[ ]?",
        *,
        open_token: bool = False,
        close_token: bool = False,
    ) -> str:
        """The regex of ``open + body + close``: the text ``render("", [call])`` writes for any
        valid call to ``specs`` (Mistral: ``render("", calls)`` for one call or more).
        ``open_token`` / ``close_token``: that marker is a token of its own, written outside the
        regex (the prompt ends with it, or it is the end token), so the regex leaves it out.

        Several blocks are not one regex: ``outlines-core`` 0.2's index has no transitions out
        of a state that completes a match, so ``call(; call)*`` would stop after one call."""
        return (
            ("" if open_token else _literal(self.open))
            + self.body_regex(specs, whitespace_pattern)
            + ("" if close_token else _literal(self.close))
        )


class _Blocks(ToolCallFormat):
    """Calls as ``open\\n{"name": .., "arguments": ..}\\nclose`` blocks after the content."""

    open, close = TOOL_CALL, TOOL_CALL_END
    reserved: ClassVar[tuple[str, ...]] = (TOOL_CALL, TOOL_CALL_END)

    def _json(self, call: ToolCall) -> str:
        return _dumps({"name": call.name, "arguments": _arguments(call)})

    def call_body(self, call: ToolCall) -> str:
        """What lies between ``open`` and ``close`` for ``call``."""
        return f"\n{self._json(call)}\n"

    def _check_content(self, content: str) -> str | None:
        found = [t for t in self.reserved if t in content]
        return f"assistant content contains the reserved token {found[0]!r}" if found else None

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        if error := self._check_content(content):
            raise ValueError(error)
        blocks = [self.open + self.call_body(c) + self.close for c in calls]
        return self.separator.join(([content] if content or not calls else []) + blocks)

    def parse(self, text: str) -> ParsedTurn:
        content, *blocks = text.split(self.open)
        if blocks and self.separator:
            content = content.removesuffix(self.separator)
        calls, errors = [], []
        if error := self._check_content(content):
            errors.append(error)
        for block in blocks:
            payload, end, rest = block.partition(self.close)
            if rest.strip(self.separator) if self.separator else rest:
                errors.append(f"text after a tool call: {rest!r}")
            if not end:
                errors.append(f"a tool call without {self.close}: {block!r}")
                continue
            obj, error = _loads(payload)
            call = _call(obj, ("arguments",)) if error is None else error
            (calls if isinstance(call, ToolCall) else errors).append(call)
        return ParsedTurn(content, tuple(calls), tuple(errors))

    def body_regex(self, specs, whitespace_pattern):
        return f"\n{_alternatives(specs, whitespace_pattern)}\n"


class AgenticJax(_Blocks):
    """This project's format (``data.chat``): blocks right after the content, between special
    tokens, with ``<`` in the JSON written ``\\u003c`` so that no argument forges a token."""

    name = "agentic_jax"
    reserved = SPECIAL_TOKENS

    def _json(self, call: ToolCall) -> str:
        return super()._json(call).replace("<", "\\u003c")  # "<" only occurs in JSON strings.


class Hermes(_Blocks):
    """Hermes 2 Pro / Qwen2.5 / Qwen3 (their chat templates): each block on a line of its own
    after the content.  A string in the JSON holding ``<tool_call>`` or ``</tool_call>`` has
    their ``<`` written ``\\u003c``."""

    name = "hermes"
    separator = "\n"

    def _json(self, call: ToolCall) -> str:
        text = super()._json(call)
        for marker in self.reserved:
            text = text.replace(marker, "\\u003c" + marker[1:])
        return text


def _check_whole_message(name: str, content: str, calls: Sequence[ToolCall], starts: str) -> None:
    if calls and content:
        raise ValueError(f"the {name} format carries no content beside tool calls")
    if content.lstrip().startswith(tuple(starts)):
        raise ValueError(f"{name} content starting with {content.lstrip()[0]!r} reads as a call")


class Llama3Json(ToolCallFormat):
    """Llama 3.1 / 3.2 JSON tool calls (their chat templates): the whole assistant message is
    ``{"name": .., "parameters": {..}}``; several calls are separated by ``; `` (vLLM's
    ``llama3_json`` reading; the templates render one).  A turn with calls has no content;
    ``"arguments"`` is read as ``"parameters"``, and a leading ``<|python_tag|>`` is skipped."""

    name, open = "llama3_json", ""
    python_tag: ClassVar[str] = "<|python_tag|>"

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        _check_whole_message(self.name, content, calls, ("{", self.python_tag))
        return content + "; ".join(
            _dumps({"name": c.name, "parameters": _arguments(c)}) for c in calls
        )

    def parse(self, text: str) -> ParsedTurn:
        body = text.strip().removeprefix(self.python_tag).lstrip()
        if not body.startswith("{"):
            return ParsedTurn(text, (), ())
        calls, decoder, pos = [], json.JSONDecoder(), 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except (ValueError, RecursionError) as e:
                return ParsedTurn("", tuple(calls), (f"not valid JSON ({e}): {body[pos:]!r}",))
            call = _call(obj, ("parameters", "arguments"))
            if not isinstance(call, ToolCall):
                return ParsedTurn("", tuple(calls), (call,))
            calls.append(call)
            rest = body[end:].lstrip()
            if rest and not rest.startswith(";"):
                return ParsedTurn("", tuple(calls), (f"text after a tool call: {rest!r}",))
            pos = len(body) - len(rest.removeprefix(";").lstrip())
        return ParsedTurn("", tuple(calls), ())

    def body_regex(self, specs, whitespace_pattern):
        return _alternatives(specs, whitespace_pattern, "parameters")


class Pythonic(ToolCallFormat):
    """Llama 3.2 / 4 pythonic tool calls: the whole message is a Python list of calls with
    keyword arguments that are literals, ``[get_weather(city="Oslo"), now()]``.  Constrained
    decoding of it is not built (``body_regex`` raises)."""

    name, open = "pythonic", ""

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        _check_whole_message(self.name, content, calls, "[")
        if not calls:
            return content
        return "[" + ", ".join(map(self._call_text, calls)) + "]"

    @staticmethod
    def _call_text(call: ToolCall) -> str:
        arguments = _arguments(call)
        names = [call.name, *arguments] if isinstance(arguments, Mapping) else None
        if names is None or not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
            raise ValueError(
                f"a pythonic call needs identifiers for its name and argument names and an "
                f"object of arguments: {call!r}"
            )
        return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"

    def parse(self, text: str) -> ParsedTurn:
        body = text.strip()
        if not body.startswith("["):
            return ParsedTurn(text, (), ())
        try:
            tree = ast.parse(body, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            return ParsedTurn("", (), (f"not a Python list of calls ({e}): {body!r}",))
        if not isinstance(tree, ast.List):
            return ParsedTurn("", (), (f"not a Python list of calls: {body!r}",))
        calls, errors = [], []
        for node in tree.elts:
            call = self._read_call(node)
            (calls if isinstance(call, ToolCall) else errors).append(call)
        return ParsedTurn("", tuple(calls), tuple(errors))

    @staticmethod
    def _read_call(node: ast.expr) -> ToolCall | str:
        source = ast.unparse(node)
        if (
            not isinstance(node, ast.Call)
            or not isinstance(node.func, ast.Name)
            or node.args
            or any(k.arg is None for k in node.keywords)
        ):
            return f"a pythonic call is name(keyword=literal, ...): {source!r}"
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            _dumps(arguments)  # JSON values only (no tuples, sets, bytes, nan)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as e:
            return f"the arguments of a pythonic call are not JSON literals ({e}): {source!r}"
        return ToolCall(node.func.id, arguments)

    def body_regex(self, specs, whitespace_pattern):
        raise ValueError("constrained decoding of pythonic tool calls is not built")


_ID_ALPHABET = string.ascii_letters + string.digits


def mistral_call_id(index: int, call: ToolCall) -> str:
    """A 9-character alphanumeric id for the ``index``-th call of a turn, a function of it (the
    Mistral templates require ids; ``ToolCall`` has none to keep)."""
    digest = hashlib.sha256(f"{index}:{call.name}:{call.arguments_text()}".encode())
    number = int.from_bytes(digest.digest()[:8], "big")
    return "".join(_ID_ALPHABET[(number // 62**i) % 62] for i in range(9))


def _is_call_id(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 9 and value.isascii() and value.isalnum()


class Mistral(ToolCallFormat):
    """Mistral (v3 tokenizers and later): ``[TOOL_CALLS]`` after the content, then a JSON list of
    ``{"name": .., "arguments": {..}, "id": "<9 alphanumerics>"}``; the turn ends there.  Ids are
    optional when read (models write none; the templates require them in a conversation's
    history), checked and dropped; :func:`mistral_call_id` makes them when written."""

    name, open = "mistral", "[TOOL_CALLS]"

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        if self.open in content:
            raise ValueError(f"assistant content contains {self.open!r}")
        if not calls:
            return content
        objects = [
            {"name": c.name, "arguments": _arguments(c), "id": mistral_call_id(i, c)}
            for i, c in enumerate(calls)
        ]
        return content + self.open + _dumps(objects)

    def parse(self, text: str) -> ParsedTurn:
        content, found, body = text.partition(self.open)
        if not found:
            return ParsedTurn(content, (), ())
        body = body.strip()
        try:
            objects, end = json.JSONDecoder().raw_decode(body)
        except (ValueError, RecursionError) as e:
            return ParsedTurn(content, (), (f"not valid JSON ({e}): {body!r}",))
        if not isinstance(objects, list) or not objects:
            return ParsedTurn(content, (), (f"{self.open} must be followed by a list: {body!r}",))
        calls, errors = [], []
        if body[end:].strip():
            errors.append(f"text after the tool calls: {body[end:]!r}")
        for obj in objects:
            call = _call(obj, ("arguments",), ("id",))
            call_id = obj.get("id") if isinstance(obj, dict) else None
            if isinstance(call, ToolCall) and call_id is not None and not _is_call_id(call_id):
                call = f"a Mistral tool call id is 9 letters or digits, got {call_id!r}"
            (calls if isinstance(call, ToolCall) else errors).append(call)
        return ParsedTurn(content, tuple(calls), tuple(errors))

    def body_regex(self, specs, whitespace_pattern):
        call_id = {"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}
        call = _alternatives(specs, whitespace_pattern, optional=call_id)
        return rf"\[{call}(?:, {call})*\]"


FORMATS: dict[str, ToolCallFormat] = {
    f.name: f for f in (AgenticJax(), Hermes(), Llama3Json(), Pythonic(), Mistral())
}


@gin.configurable
def tool_call_format(name: str = "agentic_jax") -> ToolCallFormat:
    """The format called ``name`` (one of :data:`FORMATS`)."""
    if name not in FORMATS:
        raise ValueError(f"unknown tool-call format {name!r}; expected one of {tuple(FORMATS)}")
    return FORMATS[name]


# What a chat template mentions, in the order tried: this project's tool results, Hermes blocks,
# Mistral's marker, Llama 3.1's tag and role for tool output.
_TEMPLATE_MARKERS = (
    ("<tool_result>", "agentic_jax"),
    (TOOL_CALL, "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),
    ("ipython", "llama3_json"),
)
_MODEL_TYPES = {
    "qwen2": "hermes",
    "qwen2_moe": "hermes",
    "qwen3": "hermes",
    "qwen3_moe": "hermes",
    "mistral": "mistral",
    "mixtral": "mistral",
    "llama": "llama3_json",
}


def format_for_model(
    model_type: str | None = None, chat_template: str | None = None
) -> ToolCallFormat:
    """The format of a Hugging Face model: from what its chat template mentions, else from its
    ``config.json``'s ``model_type``; ``ValueError`` if neither says."""
    for marker, name in _TEMPLATE_MARKERS:
        if chat_template and marker in chat_template:
            return FORMATS[name]
    if model_type in _MODEL_TYPES:
        return FORMATS[_MODEL_TYPES[model_type]]
    raise ValueError(
        f"no known tool-call format for model_type {model_type!r} and its chat template; "
        f"choose one of {tuple(FORMATS)} with tool_call_format(name)"
    )


@gin.configurable
def chat_tool_format(chat_template: str | None, name: str = "auto") -> ToolCallFormat:
    """The format of the tool calls in chats through ``chat_template`` (a Hugging Face
    template's source; ``None``: this project's template): the one called ``name``, or with
    ``"auto"`` this project's for its own template and :func:`format_for_model` of the source
    for a Hugging Face one (``ValueError`` if that finds none)."""
    if name != "auto":
        return tool_call_format(name)
    if chat_template is None:
        return FORMATS["agentic_jax"]
    return format_for_model(chat_template=chat_template)
