"""Agent sessions configured from gin: what ``agentic-jax agent`` runs.

A config names a policy (a gin-built one such as ``@agents.ScriptedPolicy()``, or a checkpoint
served in-process by :class:`JaxPolicy`), built-in tools by name, the loop, its budget and its
sampling settings, and optionally a memory (a store, its write and read policies and MemGPT's
memory tools, ``agents.tools.memory``); see ``configs/agent_calculator.gin``,
``configs/agent_calculator_scripted.gin`` and ``configs/agent_memory_scripted.gin``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import gin

from agentic_jax.agents.context.manager import ContextBudget, ContextManager
from agentic_jax.agents.context.tokens import approx_tokens, tokenizer_counter
from agentic_jax.agents.context.tracing import Tracer, console_sink
from agentic_jax.agents.loops.agent import Agent, AgentResult
from agentic_jax.agents.loops.plan_execute import PlanAndExecute
from agentic_jax.agents.loops.react import SYSTEM_PROMPT, ReActAgent
from agentic_jax.agents.policies.base import OnDelta, Policy, StreamedPolicy
from agentic_jax.agents.policies.jax_policy import JaxPolicy
from agentic_jax.agents.tools.base import Tool
from agentic_jax.agents.tools.budget import Budget, Pricing
from agentic_jax.agents.tools.builtin import builtin_tool
from agentic_jax.agents.tools.executor import Approver, ToolExecutor
from agentic_jax.agents.tools.memory import AgentMemory, MemoryConfig
from agentic_jax.envs.text.generators import FORMAT

LOOPS = ("react", "plan_execute")

# The text environments' system message, for configs that run a model post-trained on them
# (``agents.AgentConfig.system_prompt = %agents.TASK_SYSTEM_PROMPT``): with the tools' section
# that ``chat.with_tools`` adds, the harness then renders exactly the prompt the model learned on.
gin.constant("agents.TASK_SYSTEM_PROMPT", FORMAT)


@gin.configurable(module="agents")
@dataclasses.dataclass
class AgentConfig:
    """``policy`` (gin-built) or ``checkpoint``; ``tools`` are built-in tool names;
    ``mcp_servers`` maps names to MCP servers (a command line or an http(s) URL, see
    ``mcp_client.py``) whose tools join them as ``<server>__<tool>``; ``allow`` restricts them
    further; ``approval`` maps tool names to approval tiers (``auto``, ``ask``, ``deny``: see
    ``tools/executor.py``); ``context`` enables context management with that budget; ``memory``
    gives the agent a memory and its tools (core memory lives in the context manager's pinned facts, so memory
    enables context management, with the default budget if ``context`` is ``None``); ``task`` is
    run when no task is given on the command line."""

    policy: Any = None
    checkpoint: str | None = None
    tools: Sequence[str] = ("calculator",)
    mcp_servers: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    allow: Sequence[str] | None = None
    approval: Mapping[str, str] = dataclasses.field(default_factory=dict)
    loop: str = "react"
    system_prompt: str = SYSTEM_PROMPT
    budget: Budget = Budget()
    pricing: Pricing = Pricing()
    sampling: dict = dataclasses.field(default_factory=dict)
    context: ContextBudget | None = None
    memory: MemoryConfig | None = None
    task: str | None = None

    def __post_init__(self):
        if self.loop not in LOOPS:
            raise ValueError(f"AgentConfig.loop={self.loop!r}; expected one of {LOOPS}")


def _checkpoint(config: AgentConfig, checkpoint: str | None) -> str | None:
    """``checkpoint`` (the command line's) wins over the config's checkpoint and policy."""
    return checkpoint or (None if config.policy is not None else config.checkpoint)


def make_policy(config: AgentConfig, checkpoint: str | None = None) -> Policy:
    """The policy :func:`_checkpoint` names, or the config's."""
    path = _checkpoint(config, checkpoint)
    if path is not None:
        return JaxPolicy(path)
    if config.policy is None:
        raise ValueError(
            "no policy: pass --checkpoint, or bind agents.AgentConfig.policy or "
            "agents.AgentConfig.checkpoint in the gin config"
        )
    return config.policy


def model_name(config: AgentConfig, policy: Policy, checkpoint: str | None = None) -> str | None:
    """What the traces' ``chat`` spans call the model (``gen_ai.request.model``): an endpoint's
    model name, or the checkpoint the policy was loaded from."""
    model = getattr(policy, "model", None)
    return model if isinstance(model, str) else _checkpoint(config, checkpoint)


def make_agent(
    config: AgentConfig,
    policy: Policy,
    *,
    tracer: Tracer | None = None,
    approver: Approver | None = None,
    extra_tools: Sequence[Tool] = (),
    mcp_tools: Sequence[Tool] = (),
    memory: AgentMemory | None = None,
    on_delta: OnDelta | None = None,
) -> Agent:
    """The configured loop; ``extra_tools`` (a host's own, such as the A2A server's) join the
    built-in tools and pass the allow-list; ``mcp_tools`` (the ``mcp_servers``') are subject
    to it like the built-in ones.  ``memory`` is ``config.memory`` opened (a session opens it
    once for all its tasks; opened here when not given); its tools pass the allow-list, since
    ``MemoryConfig.tools`` chose them.  ``on_delta`` receives the model's turns as they are
    generated, where the policy can stream them (``policies.base.StreamedPolicy``)."""
    context = None
    if config.context is not None or config.memory is not None:
        count = (
            tokenizer_counter(policy.model.tokenizer)
            if isinstance(policy, JaxPolicy)
            else approx_tokens
        )
        context = ContextManager(config.context or ContextBudget(), count)
    if config.memory is not None:
        if memory is None:
            memory = config.memory.open()
        extra_tools = [*extra_tools, *memory.tools(context)]
    allow = None if config.allow is None else [*config.allow, *(t.name for t in extra_tools)]
    tools = [*(builtin_tool(name) for name in config.tools), *mcp_tools, *extra_tools]
    executor = ToolExecutor(tools, allow=allow, approver=approver, approval=config.approval)
    if on_delta is not None:
        policy = StreamedPolicy(policy, on_delta)
    react = ReActAgent(
        policy,
        executor,
        system_prompt=config.system_prompt,
        budget=config.budget,
        pricing=config.pricing,
        context=context,
        tracer=tracer,
        sampling=config.sampling,
    )
    if config.loop == "plan_execute":
        return PlanAndExecute(
            policy, react, budget=config.budget, pricing=config.pricing, tracer=tracer
        )
    return react


def read_tasks(path: str | Path) -> list[str]:
    """Tasks from a file: JSONL objects with a ``task`` field, or one task per non-empty line.
    A line opening with ``{`` that is not such an object is a ``ValueError`` naming the file and
    line, not a bare ``JSONDecodeError`` or ``KeyError: 'task'``."""
    tasks = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line.startswith("{"):
            if line:
                tasks.append(line)
            continue
        try:
            task = json.loads(line).get("task")
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON object: {e}") from None
        if not isinstance(task, str):
            raise ValueError(f"{path}:{n}: a JSON task line needs a string 'task' field")
        tasks.append(task)
    return tasks


def interactive_tasks(prompt: str = "task> ") -> Iterator[str]:
    """Tasks typed at the terminal until an empty line or end of input."""
    while True:
        try:
            line = input(prompt).strip()
        except EOFError:
            return
        if not line:
            return
        yield line


def terminal_approver(tool, call) -> bool:
    """Asks on the terminal before a dangerous tool runs; no terminal means no."""
    if not sys.stdin.isatty():
        return False
    answer = input(f"approve {call.name}({call.arguments_text()})? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def open_mcp_client(servers: Mapping[str, Any]):
    """An ``MCPClient`` for the configured servers (``None`` if there are none); the MCP SDK
    is imported only then.  The caller closes it."""
    if not servers:
        return None
    from agentic_jax.agents.protocols.mcp_client import MCPClient

    return MCPClient(servers)


def run_session(
    config: AgentConfig,
    tasks: Sequence[str] | Iterator[str],
    *,
    checkpoint: str | None = None,
    trace_path: str | None = None,
    approver: Approver | None = terminal_approver,
    write: Callable[[str], Any] = print,
) -> list[AgentResult]:
    """Runs each task with a fresh agent (one trace run each), streaming its steps to ``write``;
    the tasks share the configured memory's store (core memory starts over with each agent)."""
    policy = make_policy(config, checkpoint)
    results = []
    mcp = memory = None
    try:
        mcp = open_mcp_client(config.mcp_servers)
        mcp_tools = mcp.tools() if mcp is not None else []
        memory = None if config.memory is None else config.memory.open()
        for task in tasks:
            tracer = Tracer(
                trace_path,
                sinks=[console_sink(write)],
                pricing=config.pricing,
                model=model_name(config, policy, checkpoint),
            )
            agent = make_agent(
                config, policy, tracer=tracer, approver=approver, mcp_tools=mcp_tools, memory=memory
            )
            results.append(agent.run(task))
    finally:
        if mcp is not None:
            mcp.close()
        if memory is not None:
            memory.close()
        if isinstance(policy, JaxPolicy):
            policy.close()
    return results
