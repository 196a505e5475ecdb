"""Robustness variants of a tool task: the same problems behind a changed tool interface.

A model that learned one tool surface may fail on the same function behind another (the
"unfamiliar environment" question).  Each `Variant` changes one thing and keeps the task
solvable: it maps the task's tools to new ones (`tools`) and a reference call to the call that
does the same under the variant (`adapt`), so the golden trajectory and a scripted policy that
adapts still reach the answer, which the tests check.  Variants hold per-episode state (the
injected error), so `tools` is called once per episode.

A variant's tool has the members the harness adapter (``episodes.TaskTool``) reads from an
environment tool: ``name``, ``spec``, ``host_argument(arguments)`` and ``run_host(argument,
task)``.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from agentic_jax.data.chat import ToolCall, ToolSpec

# Synonyms a renamed surface uses; an unlisted name gets a suffix.
RENAMES = {
    "calculator": ("compute", {"expression": "formula"}),
    "lookup": ("fetch_fact", {"key": "entry"}),
    "search": ("find_documents", {"query": "terms"}),
    "python": ("run_code", {"code": "source"}),
}
PARAPHRASES = {
    "calculator": "Evaluates an integer expression with + - * / (floor division) and brackets.",
    "lookup": "Returns the fact this task stores under the given key.",
    "search": "Lists the task documents most relevant to a query, best first, one per line.",
    "python": "Executes a Python 3 script in an isolated sandbox and returns its output.",
}
TRANSIENT = "error: the tool is temporarily unavailable (transient failure); retry the call"
NOISE = " [result served from cache; latency 12 ms; quota 97% remaining]"


def _one_argument(spec: ToolSpec) -> str:
    props = spec.parameters.get("properties", {})
    if len(props) != 1:
        raise ValueError(f"variants need tools with one argument; {spec.name!r} has {len(props)}")
    return next(iter(props))


@dataclasses.dataclass
class ToolView:
    """``base`` behind another name, argument name, schema shape, description or result."""

    base: object
    name: str
    argument: str
    description: str
    nested: str | None = None  # the argument lives under this object key
    decorate: object = None  # result -> result

    @property
    def spec(self) -> ToolSpec:
        inner = self.base.spec.parameters["properties"][_one_argument(self.base.spec)]
        schema = {
            "additionalProperties": False,
            "properties": {self.argument: inner},
            "required": [self.argument],
            "type": "object",
        }
        if self.nested is not None:
            schema = {
                "additionalProperties": False,
                "properties": {self.nested: schema},
                "required": [self.nested],
                "type": "object",
            }
        return ToolSpec(self.name, self.description, schema)

    def host_argument(self, arguments):
        if self.nested is not None:
            if set(arguments) != {self.nested} or not isinstance(arguments[self.nested], dict):
                return None
            arguments = arguments[self.nested]
        if set(arguments) != {self.argument}:
            return None
        return self.base.host_argument({_one_argument(self.base.spec): arguments[self.argument]})

    def run_host(self, argument, task):
        result = self.base.run_host(argument, task)
        return result if self.decorate is None else self.decorate(result)


class Variant:
    """The identity: the original interface."""

    name = "original"
    changes = "nothing"

    def tools(self, tools: Sequence) -> list:
        return list(tools)

    def adapt(self, call: ToolCall, tools: Sequence) -> ToolCall:
        del tools
        return call


class RenameTools(Variant):
    name, changes = "renamed", "tool and argument names"

    def tools(self, tools):
        out = []
        for t in tools:
            argument = _one_argument(t.spec)
            new_name, args = RENAMES.get(t.name, (f"{t.name}_tool", {}))
            out.append(
                ToolView(t, new_name, args.get(argument, f"{argument}_value"), t.spec.description)
            )
        return out

    def adapt(self, call, tools):
        view = _view_of(self.tools(tools), call.name)
        return ToolCall(view.name, {view.argument: next(iter(call.arguments.values()))})


class NestArguments(Variant):
    name, changes = "nested_schema", "argument schema (the argument moves into an object)"

    def tools(self, tools):
        return [
            ToolView(t, t.name, _one_argument(t.spec), t.spec.description, nested="request")
            for t in tools
        ]

    def adapt(self, call, tools):
        return ToolCall(call.name, {"request": dict(call.arguments)})


class ParaphraseDescriptions(Variant):
    name, changes = "paraphrased", "tool descriptions (reworded) and their order (reversed)"

    def tools(self, tools):
        views = [
            ToolView(
                t,
                t.name,
                _one_argument(t.spec),
                PARAPHRASES.get(t.name, f"Tool {t.name}: {t.spec.description}"),
            )
            for t in tools
        ]
        return views[::-1]


class NoisyOutputs(Variant):
    name, changes = "noisy_outputs", "tool results (irrelevant text appended)"

    def tools(self, tools):
        return [
            ToolView(
                t, t.name, _one_argument(t.spec), t.spec.description, decorate=lambda r: r + NOISE
            )
            for t in tools
        ]


class InjectedErrors(Variant):
    """The episode's first tool call fails with a transient error; later calls work."""

    name, changes = "injected_errors", "the first tool call of each episode fails"

    def tools(self, tools):
        state = {"failed": False}

        def fail_once(result):
            if state["failed"]:
                return result
            state["failed"] = True
            return TRANSIENT

        return [
            ToolView(t, t.name, _one_argument(t.spec), t.spec.description, decorate=fail_once)
            for t in tools
        ]


class CommandLine:
    """Every tool behind one text tool, ``shell``, taking a command line such as
    ``calculator --expression '2 * (3 + 4)'`` (POSIX shell quoting)."""

    name = "shell"

    def __init__(self, tools: Sequence):
        self.tools = {t.name: t for t in tools}
        usage = "; ".join(
            f"{n} --{_one_argument(t.spec)} VALUE ({t.spec.description})"
            for n, t in self.tools.items()
        )
        self.description = f"Run one command line. Commands: {usage}"

    @property
    def spec(self) -> ToolSpec:
        schema = {
            "additionalProperties": False,
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
            "type": "object",
        }
        return ToolSpec(self.name, self.description, schema)

    def host_argument(self, arguments):
        if set(arguments) != {"command"} or not isinstance(arguments["command"], str):
            return None
        try:
            words = shlex.split(arguments["command"])
        except ValueError:
            return None
        if len(words) != 3 or words[0] not in self.tools:
            return None
        tool = self.tools[words[0]]
        if words[1] != f"--{_one_argument(tool.spec)}":
            return None
        argument = tool.host_argument({_one_argument(tool.spec): words[2]})
        return None if argument is None else (tool, argument)

    def run_host(self, argument, task):
        tool, value = argument
        return tool.run_host(value, task)


class CommandLineInterface(Variant):
    name, changes = "command_line", "interface: one command-line text tool instead of JSON tools"

    def tools(self, tools):
        return [CommandLine(tools)]

    def adapt(self, call, tools):
        [(argument, value)] = call.arguments.items()
        return ToolCall("shell", {"command": f"{call.name} --{argument} {shlex.quote(value)}"})


def _view_of(views, name):
    return next(v for v in views if v.base.name == name)


VARIANTS = {
    v.name: v
    for v in (
        Variant,
        RenameTools,
        NestArguments,
        ParaphraseDescriptions,
        NoisyOutputs,
        InjectedErrors,
        CommandLineInterface,
    )
}


def variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown robustness variant {name!r}; expected one of {sorted(VARIANTS)}")
    return VARIANTS[name]()
