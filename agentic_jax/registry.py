"""Imports every module that defines gin configurables, so any config can bind any of them."""
import agentic_jax.agents.session  # noqa: F401  (and through it every agents.* configurable)
import agentic_jax.data.pipeline  # noqa: F401
import agentic_jax.data.tokenizer  # noqa: F401
import agentic_jax.inference.engine  # noqa: F401
import agentic_jax.models.config  # noqa: F401
import agentic_jax.training.loop  # noqa: F401
import agentic_jax.training.optim  # noqa: F401
import sharding  # noqa: F401
