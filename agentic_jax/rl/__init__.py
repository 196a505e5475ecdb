"""RL and preference-optimisation losses: pure, jit/vmap-clean, float32 inside.

The catalogue, with formulas, papers and defaults, is in docs/rl_losses.md.
"""

from agentic_jax.rl.advantages import GROUP_ESTIMATORS, group_advantages, masked_whiten, token_gae
from agentic_jax.rl.aggregation import AGGREGATIONS, aggregate, segment_mean
from agentic_jax.rl.controllers import KLController, adaptive_kl_controller, fixed_kl_controller
from agentic_jax.rl.distillation import (
    DIVERGENCES,
    distillation_loss,
    self_distillation_loss,
    topk_distillation_loss,
)
from agentic_jax.rl.kl import KL_ESTIMATORS, kl_penalized_rewards, kl_penalty
from agentic_jax.rl.kto import KTO_LOSSES, kto_loss, kto_reference_point
from agentic_jax.rl.policy_gradients import DEFAULT_AGGREGATION, POLICY_LOSSES, policy_loss
from agentic_jax.rl.preference import (
    F_DIVERGENCES,
    PREFERENCE_LOSSES,
    REFERENCE_FREE_LOSSES,
    preference_loss,
    preference_metrics,
)
from agentic_jax.rl.reward_model import bradley_terry_loss, plackett_luce_loss, process_reward_loss
from agentic_jax.rl.types import LossOutput, combine_outputs, psum_output
from agentic_jax.rl.value_learning import (
    clipped_surrogate_loss,
    double_q_learning_loss,
    entropy_loss,
    gae,
    lambda_returns,
    potential_shaping,
    ppo_value_loss,
    q_learning_loss,
    reinforce_loss,
    td_error,
    td_lambda,
)

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_AGGREGATION",
    "DIVERGENCES",
    "F_DIVERGENCES",
    "GROUP_ESTIMATORS",
    "KL_ESTIMATORS",
    "KTO_LOSSES",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "REFERENCE_FREE_LOSSES",
    "KLController",
    "LossOutput",
    "adaptive_kl_controller",
    "aggregate",
    "bradley_terry_loss",
    "clipped_surrogate_loss",
    "combine_outputs",
    "distillation_loss",
    "double_q_learning_loss",
    "entropy_loss",
    "fixed_kl_controller",
    "gae",
    "group_advantages",
    "kl_penalized_rewards",
    "kl_penalty",
    "kto_loss",
    "kto_reference_point",
    "lambda_returns",
    "masked_whiten",
    "plackett_luce_loss",
    "policy_loss",
    "potential_shaping",
    "ppo_value_loss",
    "preference_loss",
    "preference_metrics",
    "process_reward_loss",
    "psum_output",
    "q_learning_loss",
    "reinforce_loss",
    "segment_mean",
    "self_distillation_loss",
    "td_error",
    "td_lambda",
    "token_gae",
    "topk_distillation_loss",
]
