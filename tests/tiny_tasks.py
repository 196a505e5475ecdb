"""Test helpers: a task the tiny random models learn in a few RL steps; the main pipeline at toy sizes."""

import dataclasses

import gin
import jax.numpy as jnp
import numpy as np
from tiny_models import CORPUS

from agentic_jax.config import parse
from agentic_jax.envs.text import Arithmetic, Reward, demonstration_actions
from agentic_jax.post_training.rl import train_rl
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.reasoning import StepModel
from agentic_jax.training.metrics import read_metrics


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


# The quickstart pipeline (`agentic-jax train` without --gin_file) at toy sizes: every stage
# runs, in seconds.  Pass each as --gin_param.
TINY_PIPELINE = [
    f"post_training.tokenizer_corpus = ['{CORPUS}']",
    f"train_data.files = ['{CORPUS}']",
    f"heldout_data.files = ['{CORPUS}']",
    "post_training.vocab_size = 500",
    "post_training.eval_samples = 2",
    "TransformerConfig.d_model = 32",
    "TransformerConfig.n_layers = 1",
    "TransformerConfig.n_heads = 2",
    "TransformerConfig.n_kv_heads = 1",
    "TransformerConfig.head_dim = 16",
    "TransformerConfig.d_ff = 64",
    "train.steps = 4",
    "train.batch_size = 8",
    "train.seq_len = 32",
    "train.eval_every = 4",
    "train.checkpoint_every = 4",
    "make_schedule.warmup_steps = 1",
    "train_sft.steps = 3",
    "train_sft.batch_size = 4",
    "train_sft.eval_every = 3",
    "train_rl.steps = 2",
    "RLConfig.group_size = 2",
    "RLConfig.prompts_per_step = 2",
    "sft/TaskSpec.num_train = 8",
    "sft/TaskSpec.num_heldout = 3",
    "rl/TaskSpec.num_train = 8",
    "rl/TaskSpec.num_heldout = 2",
]


def replay_demonstrations(monkeypatch, env, correct: bool = True) -> None:
    """Makes every ``StepModel`` propose, for each episode state, its task's next demonstration
    turn (the correct or the corrupted one) as all ``k`` candidates, charged to the budget:
    searches over agent turns then replay the demonstrations through ``env``."""

    def expand(self, states, k, *, key, temperature=1.0, budget=None, context=()):
        out = []
        for s in states:
            if s.done:
                out.append([])
                continue
            task = env.tasks[int(s.episode.task[0])]
            turns = demonstration_actions(task.render(self.tokenizer, correct), env.action_length)
            turn = turns[len(s.steps)]
            step = tuple(int(t) for t in turn[turn != env.pad_id])
            child = dataclasses.replace(s, tokens=s.tokens + step, steps=s.steps + (step,))
            out.append([child] * k)
            if budget is not None:  # charged as the sampler charges
                budget.charge(k, k * len(step), len(s.tokens))
        return out

    monkeypatch.setattr(StepModel, "expand", expand)


def train_rl_config(name: str, bindings, workdir) -> dict:
    """``train_rl`` under the shipped config ``name`` with test-sized ``bindings``: the last
    step's metrics, after checking that every step was logged and the loss is finite."""
    import agentic_jax.registry  # noqa: F401  (registers every configurable; slow, so only here)

    parse([name], list(bindings))
    try:
        last = train_rl(str(workdir))
    finally:
        gin.clear_config()
    records = read_metrics(workdir / "metrics.jsonl")
    assert records and [r["step"] for r in records] == list(range(1, len(records) + 1))
    assert np.isfinite(last["loss"])
    return last
