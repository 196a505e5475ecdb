"""Tools that ship with the harness, by name (what ``AgentConfig.tools`` in a gin file lists).

``calculator`` is the integer calculator of the text environments (``envs/text/tools.py``), with
the same name, argument and output, so a model post-trained there calls it here unchanged.
"""

from __future__ import annotations

from typing import Annotated

import pydantic

from agentic_jax.agents.tools.base import Tool, tool
from agentic_jax.envs.text.tools import Calculator
from agentic_jax.sandbox import run_python

_CALCULATOR = Calculator()


@tool(timeout_s=5)
def calculator(
    expression: Annotated[str, pydantic.Field(max_length=_CALCULATOR.argument_bytes)],
) -> str:
    """Evaluate integer arithmetic with + - * / and parentheses (/ is floor division).

    Args:
        expression: for example "12 * (3 + 4)".
    """
    return _CALCULATOR.run_host(expression, None)


def python_tool(timeout_s: float = 5.0, memory_mb: int = 512) -> Tool:
    """A ``python`` tool running code in the sandbox (its own kill timer replaces the executor's
    thread timeout, with a margin)."""

    def python(code: str) -> str:
        """Run a Python 3 program and return what it prints (stdout, then stderr). The program runs
        in an empty scratch directory with no network access and limited time and memory; print
        results explicitly.

        Args:
            code: the complete program.
        """
        return run_python(code, timeout_s=timeout_s, memory_mb=memory_mb).text()

    return tool(python, timeout_s=timeout_s + 5.0)


BUILTIN_TOOLS = {"calculator": lambda: calculator, "python": python_tool}


def builtin_tool(name: str) -> Tool:
    if name not in BUILTIN_TOOLS:
        raise KeyError(f"unknown tool {name!r}; built-in tools: {sorted(BUILTIN_TOOLS)}")
    return BUILTIN_TOOLS[name]()
