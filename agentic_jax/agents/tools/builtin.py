"""Tools that ship with the harness, by name (what ``AgentConfig.tools`` in a gin file lists).

``calculator`` and ``python`` are the text environments' ``Calculator`` and ``PythonSandbox``
with the same name, spec (description and argument schema) and output, so a model post-trained
there is shown the same tool section and calls them here unchanged.
"""

from __future__ import annotations

import pydantic

from agentic_jax.agents.tools.base import Tool
from agentic_jax.envs.host import PythonSandbox
from agentic_jax.envs.text import tools as env_tools


def from_env(env_tool: env_tools.Tool, timeout_s: float) -> Tool:
    """The harness tool of a text environment's tool: its name, spec and host run."""
    argument = pydantic.Field(max_length=env_tool.argument_bytes)
    arguments = pydantic.create_model(
        env_tool.name,
        __config__=pydantic.ConfigDict(extra="forbid"),
        **{env_tool.argument: (str, argument)},
    )
    return Tool(
        env_tool.name,
        env_tool.description,
        lambda **kw: env_tool.run_host(kw[env_tool.argument], None),
        arguments,
        timeout_s,
    )


calculator = from_env(env_tools.Calculator(), timeout_s=5.0)


def python_tool(timeout_s: float = 5.0, memory_mb: int = 512) -> Tool:
    """A ``python`` tool running code in the sandbox (its own kill timer replaces the executor's
    thread timeout, with a margin)."""
    return from_env(PythonSandbox(timeout_s=timeout_s, memory_mb=memory_mb), timeout_s + 5.0)


BUILTIN_TOOLS = {"calculator": lambda: calculator, "python": python_tool}


def builtin_tool(name: str) -> Tool:
    if name not in BUILTIN_TOOLS:
        raise KeyError(f"unknown tool {name!r}; built-in tools: {sorted(BUILTIN_TOOLS)}")
    return BUILTIN_TOOLS[name]()
