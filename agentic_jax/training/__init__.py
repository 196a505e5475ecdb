"""Optimisers, schedules, losses, the one update path (``make_update``), the pretraining step,
checkpoints and the pretraining loop."""

from agentic_jax.training.checkpoint import Checkpointer
from agentic_jax.training.loss import cross_entropy
from agentic_jax.training.optim import make_optimizer, make_schedule, weight_decay_mask
from agentic_jax.training.state import TrainState
from agentic_jax.training.step import make_eval_step, make_train_step
from agentic_jax.training.update import FullFinetune, make_update, split_micro

__all__ = [
    "Checkpointer",
    "FullFinetune",
    "TrainState",
    "cross_entropy",
    "make_eval_step",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "make_update",
    "split_micro",
    "weight_decay_mask",
]
