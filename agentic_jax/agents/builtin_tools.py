"""Tools that ship with the harness, by name (what ``AgentConfig.tools`` in a gin file lists).

``calculator`` is the integer calculator of the text environments (``envs/text/tools.py``), with
the same name, argument and output, so a model post-trained there calls it here unchanged.
"""
from __future__ import annotations

from typing import Annotated

import pydantic

from agentic_jax.agents.sandbox import python_tool
from agentic_jax.agents.tools import Tool, tool
from agentic_jax.envs.text.tools import Calculator

_CALCULATOR = Calculator()


@tool(timeout_s=5)
def calculator(expression: Annotated[str, pydantic.Field(max_length=_CALCULATOR.argument_bytes)]
               ) -> str:
    """Evaluate integer arithmetic with + - * / and parentheses (/ is floor division).

    Args:
        expression: for example "12 * (3 + 4)".
    """
    return _CALCULATOR.run_host(expression, None)


BUILTIN_TOOLS = {"calculator": lambda: calculator, "python": python_tool}


def builtin_tool(name: str) -> Tool:
    if name not in BUILTIN_TOOLS:
        raise KeyError(f"unknown tool {name!r}; built-in tools: {sorted(BUILTIN_TOOLS)}")
    return BUILTIN_TOOLS[name]()
