"""Environments: a pure-functional `reset` / `step` API with auto-reset, spaces,
wrappers, batched rollouts, adapters (gymnax, pgx) and classic tasks.

The API and its bootstrapping rules are described in docs/envs.md. Text
environments for LLM policies (token ids in and out, tools inside jit, task
generators) are in `envs.text`; their host-side twin in `envs.host`;
curricula over task banks in `envs.curriculum`.
"""

from agentic_jax.envs import text
from agentic_jax.envs.adapters import GymnaxEnv, PgxEnv
from agentic_jax.envs.core import Env, EnvParams, EnvState, select_tree
from agentic_jax.envs.curriculum import (
    LevelReplayState,
    PassRateFilter,
    PassRateState,
    PrioritizedLevelReplay,
    hindsight_relabel,
    in_band,
    learnability,
)
from agentic_jax.envs.host import (
    HostTextEnv,
    HostTextParams,
    HostTextState,
    PythonSandbox,
    ToolPool,
)
from agentic_jax.envs.markov_game import (
    GameObservation,
    MarkovGame,
    MatrixGame,
    SignallingGame,
)
from agentic_jax.envs.rollout import ActionOutput, Transition, bootstrap_inputs, rollout, run_steps
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
    "ActionOutput",
    "Box",
    "Dict",
    "Discrete",
    "Env",
    "EnvParams",
    "EnvState",
    "EpisodeStatistics",
    "EpisodeStatisticsState",
    "GameObservation",
    "GymnaxEnv",
    "HostTextEnv",
    "HostTextParams",
    "HostTextState",
    "LevelReplayState",
    "MarkovGame",
    "MatrixGame",
    "MultiDiscrete",
    "OuterWrapper",
    "PassRateFilter",
    "PassRateState",
    "PgxEnv",
    "PrioritizedLevelReplay",
    "PythonSandbox",
    "SignallingGame",
    "Space",
    "TimeLimit",
    "TimeLimitState",
    "Tokens",
    "ToolPool",
    "TransformObservation",
    "TransformReward",
    "Transition",
    "Vectorized",
    "Wrapper",
    "bootstrap_inputs",
    "hindsight_relabel",
    "in_band",
    "learnability",
    "rollout",
    "run_steps",
    "select_tree",
    "text",
]
