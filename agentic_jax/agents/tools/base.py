"""Tools: a ``@tool`` decorator that turns a typed Python function into something a model can call.

The JSON schema the model sees comes from the function's signature (types, defaults) and its
docstring (the first paragraph describes the tool, an ``Args:`` section describes parameters),
through a pydantic model.  The same model validates the arguments a model sends, so a schema and
its validation can never drift apart, and extra arguments are rejected rather than ignored (a
hallucinated parameter is a mistake the model should hear about).

    @tool(timeout_s=5)
    def weather(city: str, unit: Literal["C", "F"] = "C") -> str:
        '''Current temperature in a city.

        Args:
            city: the city's English name.
        '''

Executing calls (timeouts, retries, approval gates) is ``executor.py``'s job; this module only
describes and validates.  Tool output is *data*: :func:`as_data` makes sure no output can forge a
chat-template token and so pose as an instruction turn.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from agentic_jax.data.chat import ToolSpec


class ToolError(Exception):
    """An expected refusal or failure; the executor shows the model its message as is."""


class ToolArgumentError(ValueError):
    """The arguments do not fit the tool's schema; the message is written for the model."""


class TransientToolError(RuntimeError):
    """A failure worth retrying (a flaky network call, a busy service)."""


_ARGS_HEADER = re.compile(r"^(?:Args|Arguments|Parameters):[ \t]*$", re.MULTILINE)
_ARG_ENTRY = re.compile(r"^(\s+)(\w+)\s*(?:\([^)]*\))?:\s*(.*)$")


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    header = _ARGS_HEADER.search(doc)
    head, args = (doc[: header.start()], doc[header.end() :]) if header else (doc, "")
    description = " ".join(head.strip().split("\n\n")[0].split())
    params, current, indent = {}, None, None
    for line in args.splitlines():
        if line and not line[0].isspace():
            break  # the next section (Returns:, Raises:)
        entry = _ARG_ENTRY.match(line)
        if entry and (indent is None or len(entry.group(1)) == indent):
            indent, current = len(entry.group(1)), entry.group(2)
            params[current] = entry.group(3).strip()
        elif current and line.strip():
            params[current] = f"{params[current]} {line.strip()}".strip()
    return description, params


def _arguments_model(
    fn: Callable, name: str, param_docs: Mapping[str, str]
) -> type[pydantic.BaseModel]:
    hints = typing.get_type_hints(fn, include_extras=True)
    fields = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args/**kwargs have no JSON schema")
        if p.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {p.name!r} needs a type annotation")
        default = ... if p.default is p.empty else p.default
        field = pydantic.Field(default, description=param_docs.get(p.name))
        fields[p.name] = (hints[p.name], field)
    config = pydantic.ConfigDict(extra="forbid")
    return pydantic.create_model(name, __config__=config, **fields)


def _error_text(error: pydantic.ValidationError) -> str:
    parts = []
    for e in error.errors(include_url=False):
        where = ".".join(map(str, e["loc"])) or "arguments"
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_VALUES = ("default", "const", "enum", "examples")


def without_titles(schema: Any) -> Any:
    """A JSON schema without pydantic's ``title`` annotations: they repeat the names and cost the
    model's context tokens.  Properties named ``title`` and literal values are kept."""
    if isinstance(schema, list):
        return [without_titles(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: without_titles(s) for name, s in value.items()}
        else:
            out[key] = value if key in _VALUES else without_titles(value)
    return out


def to_text(value: Any) -> str:
    """A tool's return value as message text: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable with a schema.  ``dangerous`` tools run only after an approval gate says yes;
    ``timeout_s`` bounds one attempt (``None``: no bound)."""

    name: str
    description: str
    fn: Callable[..., Any]
    arguments: type[pydantic.BaseModel]
    timeout_s: float | None = 30.0
    dangerous: bool = False

    @property
    def parameters(self) -> dict:
        return without_titles(self.arguments.model_json_schema())

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments for ``fn``; :class:`ToolArgumentError` with a readable reason."""
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(f"arguments must be a JSON object, got {arguments!r}")
        try:
            model = self.arguments.model_validate(dict(arguments))
        except pydantic.ValidationError as e:
            raise ToolArgumentError(
                f"invalid arguments for {self.name}: {_error_text(e)}"
            ) from None
        return {field: getattr(model, field) for field in type(model).model_fields}

    def __call__(self, /, **arguments) -> Any:  # a tool may have a parameter called self
        return self.fn(**self.validate(arguments))


def tool(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = 30.0,
    dangerous: bool = False,
):
    """Makes a :class:`Tool` of a typed function; use as ``@tool`` or ``@tool(...)``."""

    def wrap(f: Callable) -> Tool:
        tool_name = name or f.__name__
        doc_description, param_docs = _docstring_parts(f.__doc__)
        return Tool(
            tool_name,
            description or doc_description,
            f,
            _arguments_model(f, tool_name, param_docs),
            timeout_s,
            dangerous,
        )

    return wrap if fn is None else wrap(fn)


def tool_specs(tools) -> list[ToolSpec]:
    """Specs of :class:`Tool` objects, ``ToolSpec``s or OpenAI tool dicts, in order."""
    out = []
    for t in tools:
        if isinstance(t, Tool):
            out.append(t.spec)
        elif isinstance(t, ToolSpec):
            out.append(t)
        else:
            out.append(ToolSpec.from_openai(t))
    return out
