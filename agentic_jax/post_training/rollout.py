"""Episodes of a policy in a text environment: the samples every online trainer learns from.

One call plays ``G`` episodes of each given task (rows ``i*G .. i*G+G-1`` share task ``i``, the
grouping group-relative baselines need).  Each turn the policy generates one assistant turn per
unfinished row with the KV-cache decoder (``inference.generate``: a jitted prefill and
``while_loop``; the transcripts are right-padded prompts of the env's fixed ``max_length``, so
every turn of every call reuses one compiled program) and the jitted ``TextEnv.step_env``
executes tool calls or scores the answer.  Finished rows are frozen (no auto-reset): the final
transcript of row ``b`` is ``tokens[b, :length[b]]`` with the policy's own tokens marked by
``loss_mask`` -- a training row for ``rl.policy_loss`` as it stands.
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.envs.core import select_tree
from agentic_jax.envs.text import TextEnv, TextEnvParams
from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.prompts import PromptBatch
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig


class Rollouts(NamedTuple):
    """``B = tasks × G`` finished episodes (numpy, host side)."""

    tokens: np.ndarray  # int32 [B, L]: prompt, policy turns and tool messages; PAD after length
    loss_mask: np.ndarray  # int32 [B, L]: 1 on the policy's tokens
    length: np.ndarray  # int32 [B]
    reward: np.ndarray  # float32 [B]: the verifier's reward (0 when truncated)
    success: np.ndarray  # bool [B]: reward >= success_threshold
    task: np.ndarray  # int32 [B]: bank row
    turns: np.ndarray  # int32 [B]: assistant turns taken
    tool_calls: np.ndarray  # int32 [B]
    truncated: np.ndarray  # bool [B]: out of turns or tokens before answering
    generation_seconds: float

    @property
    def response_length(self) -> np.ndarray:
        """Policy tokens per episode (all its turns)."""
        return self.loss_mask.sum(axis=1)

    def rows(self, start: int, stop: int) -> Rollouts:
        """Episodes ``start .. stop - 1`` (the generation time stays whole)."""
        return Rollouts(*[f[start:stop] if isinstance(f, np.ndarray) else f for f in self])

    @staticmethod
    def concat(parts) -> Rollouts:
        """The episodes of ``parts`` one after the other, with their generation times summed."""
        return Rollouts(
            *[np.concatenate(f) if isinstance(f[0], np.ndarray) else sum(f) for f in zip(*parts)]
        )

    def group(self, values: np.ndarray, group_size: int) -> np.ndarray:
        """``[tasks, G]`` view of a per-row array."""
        return np.asarray(values).reshape(-1, group_size)


def collect(
    params,
    config: TransformerConfig,
    env: TextEnv,
    env_params: TextEnvParams,
    tasks,
    *,
    group_size: int = 1,
    sampling: SamplingParams = SamplingParams(temperature=1.0),
    key,
    success_threshold: float = 0.5,
) -> Rollouts:
    """Plays ``group_size`` episodes of each bank row in ``tasks`` with the policy ``params``.

    ``sampling.max_tokens`` is replaced by the env's ``action_length``; a turn ends at
    ``<|im_end|>`` (or EOS).  ``key`` makes the whole call reproducible.
    """
    tasks = np.repeat(np.asarray(tasks, np.int32), group_size)
    if tasks.size == 0:
        raise ValueError("collect needs at least one task")
    if config.max_seq_len < env.max_length + env.action_length:
        raise ValueError(
            f"the model's max_seq_len={config.max_seq_len} is shorter than the env's "
            f"max_length + action_length = {env.max_length + env.action_length}"
        )
    reset, step = env.batched
    vocab = env_params.vocab
    stop_ids = tuple(i for i in vocab.stop_ids if i != env.im_end_id)
    base = dataclasses.replace(
        sampling,
        max_tokens=env.action_length,
        stop_token_ids=tuple(sampling.stop_token_ids) + stop_ids,
    )
    finished_turn = dataclasses.replace(base, max_tokens=1)
    b = tasks.size
    _, state = reset(jnp.asarray(tasks), env_params)
    done = np.zeros(b, bool)
    reward, truncated = np.zeros(b, np.float32), np.zeros(b, bool)
    turns, tool_calls = np.zeros(b, np.int32), np.zeros(b, np.int32)
    gen_seconds = 0.0
    for turn in range(int(env_params.max_turns)):
        if done.all():
            break
        turn_key, step_key = jax.random.split(jax.random.fold_in(key, turn))
        prompts = PromptBatch(state.tokens, jnp.zeros((b,), jnp.int32), state.length)
        start = time.perf_counter()
        result = generate(
            params,
            config,
            prompts,
            key=turn_key,
            eos_id=env.im_end_id,
            pad_id=vocab.pad_id,
            padding="right",
            sampling=[finished_turn if d else base for d in done],
        )
        jax.block_until_ready(result.tokens)
        gen_seconds += time.perf_counter() - start
        _, new_state, r, term, trunc, info = step(
            jax.random.split(step_key, b), state, result.tokens, env_params
        )
        active = jnp.asarray(~done)
        state = jax.vmap(select_tree)(active, new_state, state)
        r, term, trunc, tool = (np.asarray(x) for x in (r, term, trunc, info["tool_call"]))
        reward = np.where(done, reward, r)
        truncated |= ~done & trunc
        turns += ~done
        tool_calls += ~done & tool
        done |= term | trunc
    tokens, loss_mask, length = (
        np.asarray(x) for x in (state.tokens, state.loss_mask, state.length)
    )
    return Rollouts(
        tokens,
        loss_mask,
        length,
        reward,
        reward >= success_threshold,
        tasks,
        turns,
        tool_calls,
        truncated | ~done,
        gen_seconds,
    )
