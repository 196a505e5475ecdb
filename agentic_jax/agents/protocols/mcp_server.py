"""A Model Context Protocol server: agentic-jax's tools, runs and skills for any MCP host.

``agentic-jax mcp-server`` (stdio by default, or ``--transport streamable-http``) serves

* tools: ``calculator`` and ``python`` (the sandbox) always; ``search`` over a local corpus with
  ``--corpus`` (BM25, ``retrieval.py``); ``generate`` with a trained checkpoint
  (``--checkpoint``), through the serving engine, streaming its text as progress notifications;
* resources: the checkpoint's run files (``config.gin``, ``operative_config.gin``, the model
  config, a summary of ``metrics.jsonl``) under ``agentic-jax://run/...``;
* prompts: skills (``skills.py``; the shipped ones unless ``--skills DIR``), one prompt each.

:class:`AgentMCPServer` is the SDK's ``MCPServer`` that also serves agentic-jax :class:`Tool`\\ s
as they are: the JSON schema the harness shows a model is the tool's ``inputSchema``, arguments
are validated by the tool (a failure is an ``isError`` result naming the problem, which a model
can correct), each call runs on a worker thread bounded by the tool's ``timeout_s``, and an
unknown tool name is a JSON-RPC invalid-params error, as the MCP specification asks.  A tool
reports progress with :func:`report_progress`.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp.types as mcp_types
import pydantic
from mcp.server import MCPServer
from mcp.server.mcpserver.prompts.base import Prompt
from mcp.server.mcpserver.resources import FileResource, FunctionResource
from mcp.shared.exceptions import MCPError

from agentic_jax.agents.protocols.mcp_client import package_version
from agentic_jax.agents.tools.base import Tool, ToolArgumentError, ToolError, to_text, tool
from agentic_jax.data.chat import Message
from agentic_jax.text import clip
from agentic_jax.training.metrics import read_metrics

RUN_URI = "agentic-jax://run/"
MAX_RESULT_CHARS = 100_000
MAX_GENERATE_TOKENS = 1024
TRANSPORTS = ("stdio", "streamable-http")

_PROGRESS: contextvars.ContextVar[Callable | None] = contextvars.ContextVar(
    "mcp_progress", default=None
)


def report_progress(
    progress: float, total: float | None = None, message: str | None = None
) -> None:
    """Reports the progress of the MCP tool call that runs this code; a no-op anywhere else.
    Raises :class:`CallEnded` once that call has timed out or been cancelled."""
    report = _PROGRESS.get()
    if report is not None:
        report(progress, total, message)


class CallEnded(Exception):
    """Raised in a tool's worker thread by its next ``report_progress`` once its call has ended,
    so that a tool that reports progress (``generate``) stops, and frees what it holds, instead
    of running on unobserved."""


def _error(text: str) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)], is_error=True
    )


async def _call(
    tool: Tool, arguments: dict[str, Any], context, max_chars: int
) -> mcp_types.CallToolResult:
    try:
        kwargs = tool.validate(arguments)
    except ToolArgumentError as e:
        return _error(str(e))
    # A thread abandoned at a timeout or cancellation runs on, but progress must stop when its
    # call ends (MCP 2025-06-18, progress); checked on the event loop, where the call ends.  A
    # tool that reports progress is stopped at its next report instead (CallEnded).
    ended = False

    async def send(progress, total, message):
        if not ended:
            await context.report_progress(progress, total, message)

    def report(progress, total=None, message=None):
        if ended:
            raise CallEnded(f"{tool.name}: the call has ended (timed out or cancelled)")
        if context is not None:
            anyio.from_thread.run(send, progress, total, message)

    def work():  # runs in a copy of the caller's context, so the setting stays in this call
        _PROGRESS.set(report)
        return tool.fn(**kwargs)

    try:
        with anyio.move_on_after(tool.timeout_s) as scope:
            value = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        if scope.cancelled_caught:
            return _error(f"{tool.name} timed out after {tool.timeout_s}s")
        text = clip(to_text(value), max_chars)
    except ToolError as e:
        return _error(clip(str(e), max_chars))
    # The model reads what went wrong; SystemExit (argparse's on bad input) must not end the
    # server either, nor a result that cannot become text.
    except (Exception, SystemExit) as e:
        return _error(clip(f"{tool.name} failed: {type(e).__name__}: {e}", max_chars))
    finally:
        ended = True
    return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)])


class AgentMCPServer(MCPServer):
    """An ``MCPServer`` that also serves agentic-jax tools (see the module docstring).
    A tool's result or error is cut to ``max_result_chars`` characters (a tool that returns
    megabytes would flood the model's context and the transport).  ``close()`` releases what
    was handed to :meth:`on_close` (a model's engine thread)."""

    def __init__(
        self,
        name: str = "agentic-jax",
        *,
        agent_tools: Iterable[Tool] = (),
        max_result_chars: int = MAX_RESULT_CHARS,
        **kwargs,
    ):
        kwargs.setdefault("log_level", "WARNING")  # hosts keep a server's stderr as its log
        super().__init__(name, version=package_version(), **kwargs)
        self.max_result_chars = max_result_chars
        self.agent_tools: dict[str, Tool] = {}
        self._closers: list[Callable[[], Any]] = []
        for t in agent_tools:
            self.add_agent_tool(t)

    def add_agent_tool(self, agent_tool: Tool) -> None:
        if agent_tool.name in self.agent_tools:
            raise ValueError(f"a tool named {agent_tool.name!r} is already served")
        self.agent_tools[agent_tool.name] = agent_tool

    async def list_tools(self) -> list[mcp_types.Tool]:
        served = [
            mcp_types.Tool(
                name=t.name,
                description=t.description,
                input_schema=t.parameters,
                annotations=mcp_types.ToolAnnotations(destructive_hint=True)
                if t.dangerous
                else None,
            )
            for t in self.agent_tools.values()
        ]
        return [*await super().list_tools(), *served]

    async def call_tool(self, name: str, arguments: dict[str, Any], context=None):
        if name in self.agent_tools:
            return await _call(self.agent_tools[name], arguments, context, self.max_result_chars)
        names = [t.name for t in await self.list_tools()]
        if name not in names:
            raise MCPError(
                mcp_types.INVALID_PARAMS,
                f"unknown tool {name!r}; available: {', '.join(names) or 'none'}",
            )
        return await super().call_tool(name, arguments, context)

    def on_close(self, fn: Callable[[], Any]) -> None:
        self._closers.append(fn)

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()


def generation_tool(model) -> Tool:
    """A ``generate`` tool over a :class:`~agentic_jax.inference.serving.chat_model.ChatModel`; the text
    streams as progress notifications (progress: characters so far; message: the new text)."""
    from agentic_jax.inference.decoding.sampling import SamplingParams

    def generate(
        prompt: str,
        max_tokens: Annotated[int, pydantic.Field(ge=1, le=MAX_GENERATE_TOKENS)] = 64,
        temperature: Annotated[float, pydantic.Field(ge=0.0, le=2.0)] = 0.0,
        chat: bool = False,
    ) -> str:
        """Generate text with the agentic-jax model this server runs.

        Args:
            prompt: the text to continue; with chat, the user's message.
            max_tokens: the most tokens to generate.
            temperature: sampling temperature; 0 is greedy.
            chat: render the prompt as a user turn of the chat template (for chat-tuned models).
        """
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        shown = []

        def on_text(piece: str) -> None:
            shown.append(piece)
            report_progress(sum(map(len, shown)), None, piece)

        if chat:
            return model.chat([Message("user", prompt)], params=params, on_text=on_text).text
        return model.complete(prompt, params, on_text).text

    return tool(generate, timeout_s=600.0)


def metrics_summary(path: str | Path) -> dict:
    """``metrics.jsonl`` in brief: how many records, the last step, the last value of every
    metric, and the lowest of every loss."""
    records = read_metrics(str(path))
    last, best = {}, {}
    for record in records:
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            last[key] = value
            if "loss" in key:
                best[key] = min(best.get(key, value), value)
    return {
        "records": len(records),
        "last_step": max((r.get("step", 0) for r in records), default=None),
        "last": last,
        "lowest": best,
    }


def add_run_resources(server: MCPServer, run_dir: str | Path) -> list[str]:
    """Registers a training run's files as resources; returns their URIs.  ``run_dir`` is a
    workdir of ``agentic-jax train`` or a model directory (``config.json`` inside)."""
    run = Path(run_dir).resolve()
    model_dir = run / "model" if (run / "model" / "config.json").exists() else run
    files = [
        ("config.gin", run / "config.gin", "the run's gin config", "text/plain"),
        (
            "operative_config.gin",
            run / "operative_config.gin",
            "the gin bindings the run actually used",
            "text/plain",
        ),
        (
            "model_config.json",
            model_dir / "config.json",
            "the model's TransformerConfig",
            "application/json",
        ),
    ]
    uris = []
    for name, path, description, mime in files:
        if path.is_file():
            server.add_resource(
                FileResource(
                    uri=RUN_URI + name,
                    name=name,
                    path=path,
                    description=description,
                    mime_type=mime,
                )
            )
            uris.append(RUN_URI + name)
    if (run / "metrics.jsonl").is_file():
        server.add_resource(
            FunctionResource.from_function(
                lambda: json.dumps(metrics_summary(run / "metrics.jsonl"), indent=2),
                uri=RUN_URI + "metrics_summary.json",
                name="metrics_summary.json",
                description="records, last step, last value of each metric and lowest losses of "
                "the run's metrics.jsonl",
                mime_type="application/json",
            )
        )
        uris.append(RUN_URI + "metrics_summary.json")
    if not uris:
        raise FileNotFoundError(
            f"{run} has none of config.gin, operative_config.gin, "
            f"model/config.json or metrics.jsonl"
        )
    return uris


def export_skills(server: MCPServer, registry) -> list[str]:
    """Registers each skill of ``registry`` (a ``SkillRegistry`` or any iterable of ``Skill``)
    as an MCP prompt of its name: one user message with the skill's description, instructions,
    tools and example tasks, followed by the optional ``task`` argument.  Returns the names."""
    names = []
    for skill in registry:
        server.add_prompt(
            Prompt.from_function(
                _skill_prompt(skill), name=skill.name, description=skill.description
            )
        )
        names.append(skill.name)
    return names


def _skill_prompt(skill) -> Callable[[str], str]:
    def render(
        task: Annotated[
            str, pydantic.Field(description="the task to apply the skill to (optional)")
        ] = "",
    ) -> str:
        return f"{skill.prompt()}\n\n# Task\n\n{task}" if task.strip() else skill.prompt()

    return render


def build_server(
    *, checkpoint: str | Path | None = None, corpus: str | Path | None = None, skills=None
) -> AgentMCPServer:
    """The server ``agentic-jax mcp-server`` runs (see the module docstring); ``skills`` is a
    ``SkillRegistry`` (``None``: no prompts).  Close the server to stop a checkpoint's engine."""
    from agentic_jax.agents.tools.builtin import builtin_tool

    server = AgentMCPServer(
        instructions=(
            "agentic-jax tools: exact integer arithmetic (calculator), sandboxed Python (python)"
            + (", search over a local document collection (search)" if corpus else "")
            + (", text generation with a JAX model (generate)" if checkpoint else "")
            + "."
        )
    )
    for name in ("calculator", "python"):
        server.add_agent_tool(builtin_tool(name))
    if corpus is not None:
        from agentic_jax.agents.tools.retrieval import Retriever, retrieval_tool

        server.add_agent_tool(retrieval_tool(Retriever.from_path(corpus)))
    if skills is not None:
        export_skills(server, skills)
    if checkpoint is not None:
        from agentic_jax.inference.serving.chat_model import ChatModel

        add_run_resources(server, checkpoint)
        model = ChatModel.from_checkpoint(checkpoint)
        server.on_close(model.close)
        server.add_agent_tool(generation_tool(model))
    return server


def serve(
    server: MCPServer, transport: str = "stdio", *, host: str = "127.0.0.1", port: int = 8000
) -> None:
    """Runs ``server`` until its input ends (stdio) or it is interrupted (HTTP, at
    ``http://host:port/mcp``)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}; expected one of {TRANSPORTS}")
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=port)
