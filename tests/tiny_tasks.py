"""Test helper: a task the tiny random models learn in a few RL steps."""

import jax.numpy as jnp

from agentic_jax.envs.text import Arithmetic, Reward
from agentic_jax.post_training.tasks import TaskSpec


class HasDigit(Reward):
    """A trivially learnable reward: 1 when the answer holds a digit, which a random policy does about
    half the time (the tokenizer is fit on arithmetic), so every group carries signal."""

    def __call__(self, content, task):
        size = content.data.shape[0]
        data = content.data[:size]
        inside = jnp.arange(size) < content.length
        return jnp.any(inside & (data >= ord("0")) & (data <= ord("9"))).astype(jnp.float32)


class DigitArithmetic(Arithmetic):
    def __init__(self):
        super().__init__(1, use_tools=False)
        self.reward = HasDigit()


# Single-turn, short: the RL trainers' learning and resume tests run on it.
SHORT = TaskSpec(
    generators=(DigitArithmetic(),), num_train=16, num_heldout=4, max_length=96, action_length=16
)
