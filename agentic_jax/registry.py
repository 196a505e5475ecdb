"""Imports every module that defines gin configurables, so any config can bind any of them."""
import agentic_jax.agents.protocols.a2a_server  # noqa: F401
import agentic_jax.agents.session  # noqa: F401  (and through it every agents.* configurable)
import agentic_jax.agents.multi_agent.session  # noqa: F401  (every multi_agent.* configurable)
import agentic_jax.data.pipeline  # noqa: F401
import agentic_jax.data.tokenizer  # noqa: F401
import agentic_jax.inference.serving.engine  # noqa: F401
import agentic_jax.jobs  # noqa: F401
import agentic_jax.models.config  # noqa: F401
import agentic_jax.models.lora  # noqa: F401
import agentic_jax.post_training.pipeline  # noqa: F401  (sft, rl and tasks too)
import agentic_jax.post_training.rft  # noqa: F401
import agentic_jax.post_training.preference  # noqa: F401  (and reward)
import agentic_jax.training.loop  # noqa: F401
import agentic_jax.training.optim  # noqa: F401
import sharding  # noqa: F401
