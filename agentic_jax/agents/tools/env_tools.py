"""Harness tools as tools of the RL environments: a ``@tool`` function or an MCP server's tool
(`MCPTool`) plays in `envs.host.HostTextEnv` rollouts, so `train_rl` can train on the same tools
an agent serves with.

The call's arguments are validated as the harness validates them (the function's signature, or
the server's JSON schema); a validation error or a failed call becomes an ``error: ...`` tool
message, and the env's `ToolPool` deadline bounds a slow call.  The result is the tool's text
(`to_text`), tokenised once by the env and appended as ids.
"""

from __future__ import annotations

from agentic_jax.agents.tools.base import Tool, to_text
from agentic_jax.envs.host import HostFunction


def env_tool(tool: Tool, *, argument_bytes: int = 4096) -> HostFunction:
    """``tool`` as a `HostFunction` of the same name and spec (a task's prompt built with
    ``chat.with_tools`` shows it as the harness does)."""
    return HostFunction(
        tool.name,
        lambda **arguments: to_text(tool(**arguments)),
        argument_bytes=argument_bytes,
        spec=tool.spec,
    )
