"""Classic RL agents on `agentic_jax.envs`, each a jittable, seed-vmappable `train(key)`.

Built on the `agentic_jax.rl` losses: tabular Q-learning and TD(λ), DQN with
uniform / prioritised replay and a target network, REINFORCE with a baseline,
and PPO with GAE (PureJaxRL style). See docs/envs.md.
"""

from agentic_jax.classic_rl.common import (
    categorical_policy,
    epsilon_greedy,
    evaluate,
    greedy_policy,
)
from agentic_jax.classic_rl.dqn import DQNConfig, make_dqn
from agentic_jax.classic_rl.networks import (
    actor_critic_apply,
    actor_critic_init,
    mlp_apply,
    mlp_init,
)
from agentic_jax.classic_rl.ppo import PPOConfig, make_ppo
from agentic_jax.classic_rl.reinforce import ReinforceConfig, make_reinforce
from agentic_jax.classic_rl.replay import (
    ReplayBuffer,
    buffer_add,
    buffer_init,
    sample_prioritized,
    sample_uniform,
    update_priorities,
)
from agentic_jax.classic_rl.tabular import (
    QLearningConfig,
    TDLambdaConfig,
    make_q_learning,
    make_td_lambda,
)

__all__ = [
    "DQNConfig",
    "PPOConfig",
    "QLearningConfig",
    "ReinforceConfig",
    "ReplayBuffer",
    "TDLambdaConfig",
    "actor_critic_apply",
    "actor_critic_init",
    "buffer_add",
    "buffer_init",
    "categorical_policy",
    "epsilon_greedy",
    "evaluate",
    "greedy_policy",
    "make_dqn",
    "make_ppo",
    "make_q_learning",
    "make_reinforce",
    "make_td_lambda",
    "mlp_apply",
    "mlp_init",
    "sample_prioritized",
    "sample_uniform",
    "update_priorities",
]
