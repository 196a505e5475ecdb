"""Classic environments with known solutions: bandits, tabular MDPs, cart-pole."""

from agentic_jax.envs.classic.bandit import BanditParams, BernoulliBandit, optimal_return
from agentic_jax.envs.classic.cartpole import CartPole, CartPoleParams, CartPoleState
from agentic_jax.envs.classic.tabular import (
    TabularMDP,
    TabularParams,
    TabularState,
    chain_mdp,
    grid_mdp,
    policy_evaluation,
    value_iteration,
)

__all__ = [
    "BanditParams",
    "BernoulliBandit",
    "CartPole",
    "CartPoleParams",
    "CartPoleState",
    "TabularMDP",
    "TabularParams",
    "TabularState",
    "chain_mdp",
    "grid_mdp",
    "optimal_return",
    "policy_evaluation",
    "value_iteration",
]
