"""The agent harness: loops, the tool runtime, policy backends, context and tracing, protocols and
multi-agent teams.  See ``docs/agents.md`` and the house map, ``docs/architecture.md``.

Sub-packages: ``loops`` (ReAct, plan-and-execute, Reflexion, generate-verify-retry, workflows,
the state graph), ``tools`` (``@tool``, the executor, built-in tools, BM25 search, budgets, loop
detection), ``policies`` (the ``Policy`` protocol and ``ScriptedPolicy``, ``JaxPolicy``,
``HTTPPolicy``), ``context`` (token counting, context budgeting, tracing, golden runs),
``protocols`` (MCP client and server, A2A server and client, skills), ``multi_agent`` (team
patterns, ``agentic-jax team``); ``session`` is what ``agentic-jax agent`` runs.  The names
below are the ones an agent is built from; heavy backends (``policies.jax_policy``) are imported
from their modules.  The model-backed chat and the OpenAI-compatible server are serving:
``agentic_jax.inference.serving``.
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
from agentic_jax.agents.tools.env_tools import env_tool
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
    "env_tool",
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
