"""Agent loops: the :class:`~agentic_jax.agents.loops.agent.Agent` base and its result, ReAct,
plan-and-execute, Reflexion, generate-verify-retry, workflows and the checkpointed state graph."""
