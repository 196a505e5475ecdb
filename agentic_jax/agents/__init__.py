"""The agent harness: policies, tools, agent loops, context management, workflows, tracing and an
OpenAI-compatible server.  See ``docs/agents.md``.

Modules: ``policy`` (the protocol, :class:`ScriptedPolicy`), ``jax_policy``, ``http_policy``,
``chat_model`` (engine-backed chat with constrained tool calls), ``server``; ``tools``,
``executor``, ``sandbox``, ``builtin_tools``; ``react``, ``plan_execute``, ``reflexion``,
``verify``, with ``agent``, ``budget`` and ``loop_detection``; ``context``, ``tokens``; ``graph``,
``workflows``; ``tracing``, ``golden``; ``session`` (what ``agentic-jax agent`` runs);
``retrieval`` (local BM25 search); the ``multi_agent`` package (team patterns, ``agentic-jax
team``).
Also ``skills`` (the skill registry), ``a2a`` / ``a2a_client`` (Agent2Agent serving and
delegation, ``agentic-jax a2a-server``), and ``mcp_client`` / ``mcp_server`` (Model Context
Protocol tools, resources and prompts, ``agentic-jax mcp-server``).
Heavy backends (``jax_policy``, ``chat_model``, ``server``) are imported from their modules.
"""

from agentic_jax.agents.context.golden import Comparison, Trajectory, compare, compare_events
from agentic_jax.agents.context.manager import (
    ContextBudget,
    ContextManager,
    ContextOverflow,
    compaction_tool,
    extractive_summary,
    policy_summarizer,
    truncate,
)
from agentic_jax.agents.context.tracing import Tracer, console_sink, load, render
from agentic_jax.agents.loops.agent import Agent, AgentResult, Evaluation, Run
from agentic_jax.agents.loops.graph import (
    END,
    CompiledGraph,
    FileCheckpointer,
    GraphError,
    MemoryCheckpointer,
    StateGraph,
    parallel,
)
from agentic_jax.agents.loops.plan_execute import PlanAndExecute
from agentic_jax.agents.loops.react import ReActAgent
from agentic_jax.agents.loops.reflexion import ReflectionMemory, Reflexion
from agentic_jax.agents.loops.verify import GenerateVerifyRetry
from agentic_jax.agents.policies.base import (
    AssistantMessage,
    Policy,
    PolicyError,
    ScriptedPolicy,
    Usage,
)
from agentic_jax.agents.policies.http_policy import HTTPPolicy
from agentic_jax.agents.tools.base import (
    Tool,
    ToolArgumentError,
    ToolError,
    TransientToolError,
    tool,
)
from agentic_jax.agents.tools.budget import Budget, BudgetTracker, Pricing, StopReason
from agentic_jax.agents.tools.builtin import python_tool
from agentic_jax.agents.tools.executor import RetryPolicy, ToolExecutor, ToolResult
from agentic_jax.agents.tools.loop_detection import LoopDetector
from agentic_jax.data.chat import ToolSpec
from agentic_jax.sandbox import SandboxResult, run_python

__all__ = [
    "END",
    "Agent",
    "AgentResult",
    "AssistantMessage",
    "Budget",
    "BudgetTracker",
    "Comparison",
    "CompiledGraph",
    "ContextBudget",
    "ContextManager",
    "ContextOverflow",
    "Evaluation",
    "FileCheckpointer",
    "GenerateVerifyRetry",
    "GraphError",
    "HTTPPolicy",
    "LoopDetector",
    "MemoryCheckpointer",
    "PlanAndExecute",
    "Policy",
    "PolicyError",
    "Pricing",
    "ReActAgent",
    "ReflectionMemory",
    "Reflexion",
    "RetryPolicy",
    "Run",
    "SandboxResult",
    "ScriptedPolicy",
    "StateGraph",
    "StopReason",
    "Tool",
    "ToolArgumentError",
    "ToolError",
    "ToolExecutor",
    "ToolResult",
    "ToolSpec",
    "Tracer",
    "Trajectory",
    "TransientToolError",
    "Usage",
    "compaction_tool",
    "compare",
    "compare_events",
    "console_sink",
    "extractive_summary",
    "load",
    "parallel",
    "policy_summarizer",
    "python_tool",
    "render",
    "run_python",
    "tool",
    "truncate",
]
