"""Environments: a pure-functional `reset` / `step` API with auto-reset, spaces,
wrappers, batched rollouts, adapters (gymnax, pgx) and classic tasks.

The API and its bootstrapping rules are described in docs/envs.md.
"""

from agentic_jax.envs.adapters import GymnaxEnv, PgxEnv
from agentic_jax.envs.core import Env, EnvParams, EnvState, select_tree
from agentic_jax.envs.rollout import PolicyOutput, Transition, bootstrap_inputs, rollout, run_steps
from agentic_jax.envs.spaces import Box, Dict, Discrete, MultiDiscrete, Space, Tokens
from agentic_jax.envs.wrappers import (
    EpisodeStatistics,
    EpisodeStatisticsState,
    OuterWrapper,
    TimeLimit,
    TimeLimitState,
    TransformObservation,
    TransformReward,
    Vectorized,
    Wrapper,
)

__all__ = [
    "Box",
    "Dict",
    "Discrete",
    "Env",
    "EnvParams",
    "EnvState",
    "EpisodeStatistics",
    "EpisodeStatisticsState",
    "GymnaxEnv",
    "MultiDiscrete",
    "OuterWrapper",
    "PgxEnv",
    "PolicyOutput",
    "Space",
    "TimeLimit",
    "TimeLimitState",
    "Tokens",
    "TransformObservation",
    "TransformReward",
    "Transition",
    "Vectorized",
    "Wrapper",
    "bootstrap_inputs",
    "rollout",
    "run_steps",
    "select_tree",
]
