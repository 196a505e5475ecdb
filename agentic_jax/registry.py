"""Imports every module that defines gin configurables, so any config can bind any of them."""

import agentic_jax.agents.multi_agent.router_proxy
import agentic_jax.agents.multi_agent.session
import agentic_jax.agents.policies.search
import agentic_jax.agents.policies.voting
import agentic_jax.agents.protocols.a2a_server
import agentic_jax.agents.rag
import agentic_jax.agents.session
import agentic_jax.classic_rl.jobs
import agentic_jax.data.pipeline
import agentic_jax.data.tokenizer
import agentic_jax.data.tool_formats
import agentic_jax.eval.suites.arena_suite
import agentic_jax.eval.suites.judge_suite
import agentic_jax.eval.suites.judging
import agentic_jax.eval.suites.market
import agentic_jax.eval.suites.run
import agentic_jax.eval.suites.self_improvement
import agentic_jax.eval.suites.self_instruct
import agentic_jax.eval.suites.suite
import agentic_jax.eval.suites.training_data
import agentic_jax.inference.serving.engine
import agentic_jax.inference.serving.openai_server
import agentic_jax.jobs
import agentic_jax.memory
import agentic_jax.models.config
import agentic_jax.models.lora
import agentic_jax.models.quantization
import agentic_jax.post_training.compress
import agentic_jax.post_training.demonstration_utility
import agentic_jax.post_training.draft_heads
import agentic_jax.post_training.pipeline
import agentic_jax.post_training.preference
import agentic_jax.post_training.rft
import agentic_jax.post_training.team_rl
import agentic_jax.reasoning
import agentic_jax.retrieval
import agentic_jax.retrieval.distillation
import agentic_jax.retrieval.encoders
import agentic_jax.retrieval.rerank
import agentic_jax.training.diloco
import agentic_jax.training.loop
import agentic_jax.training.loss_scale
import agentic_jax.training.optim
import agentic_jax.training.pbt  # noqa: F401
import sharding  # noqa: F401
