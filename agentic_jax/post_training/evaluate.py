"""Held-out evaluation of a policy in a text environment: success, pass@k, tool use.

Every held-out task is played greedily once (``success``: the deterministic policy's success
rate) and, with ``samples`` > 1, ``samples`` times at ``temperature`` for ``pass@k``
(the unbiased estimator, ``eval.pass_at_k``).  Per-task outcomes are returned as well, so two
policies can be compared on the same problems with a paired bootstrap (``eval.bootstrap_ci``).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from agentic_jax.envs.host import HostTextEnv
from agentic_jax.envs.text import TextEnv, TextEnvParams
from agentic_jax.eval import pass_at_k
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig
from agentic_jax.post_training.rollout import Rollouts, collect


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Aggregates (``summary``) and per-task arrays of one evaluation."""

    success: np.ndarray  # bool [tasks]: the greedy episode succeeded
    reward: np.ndarray  # float32 [tasks]: the greedy episode's reward
    tool_calls: np.ndarray  # int32 [tasks]
    response_length: np.ndarray  # int32 [tasks]
    sampled_correct: np.ndarray | None  # int32 [tasks]: successes among the samples
    samples: int

    def summary(self) -> dict:
        out = {
            "success": float(self.success.mean()),
            "reward": float(self.reward.mean()),
            "tool_calls": float(self.tool_calls.mean()),
            "response_length": float(self.response_length.mean()),
        }
        if self.sampled_correct is not None:
            for k in sorted({1, self.samples}):
                out[f"pass@{k}"] = float(np.mean(pass_at_k(self.samples, self.sampled_correct, k)))
        return out


def _play(
    params, config, env, env_params, tasks, group_size, sampling, key, batch_rows, backend
) -> Rollouts:
    """Episodes of ``tasks`` in fixed-size chunks of ``batch_rows`` rows (one compiled shape)."""
    per_chunk = min(max(batch_rows // group_size, 1), len(tasks))
    parts = []
    for start in range(0, len(tasks), per_chunk):
        chunk = tasks[start : start + per_chunk]
        padded = np.resize(chunk, per_chunk)  # repeat tasks to fill the last chunk; cut below
        r = collect(
            params,
            config,
            env,
            env_params,
            padded,
            group_size=group_size,
            sampling=sampling,
            key=jax.random.fold_in(key, start),
            backend=backend,
        )
        parts.append(r.rows(0, len(chunk) * group_size))
    return Rollouts.concat(parts)


def evaluate_policy(
    params,
    config: TransformerConfig,
    env: TextEnv | HostTextEnv,
    env_params: TextEnvParams | None = None,
    *,
    samples: int = 0,
    temperature: float = 1.0,
    key=None,
    batch_rows: int = 64,
    tasks=None,
    backend="generate",
) -> Evaluation:
    """Greedy success on every task of the env's bank (or ``tasks``), plus pass@k from ``samples``.

    Episodes play in chunks of ``batch_rows`` rows (the last chunk padded with repeated tasks,
    whose episodes are dropped); ``backend`` is `collect`'s decoder."""
    env_params = env.default_params if env_params is None else env_params
    count = np.shape(env_params.task_weights)[0]
    tasks = np.arange(count) if tasks is None else np.asarray(tasks)
    key = jax.random.key(0) if key is None else key
    greedy = _play(
        params,
        config,
        env,
        env_params,
        tasks,
        1,
        SamplingParams(temperature=0.0),
        key,
        batch_rows,
        backend,
    )
    correct = None
    if samples > 0:
        sampled = _play(
            params,
            config,
            env,
            env_params,
            tasks,
            samples,
            SamplingParams(temperature=temperature),
            jax.random.fold_in(key, 1),
            batch_rows,
            backend,
        )
        correct = sampled.success.reshape(-1, samples).sum(axis=1)
    return Evaluation(
        greedy.success, greedy.reward, greedy.tool_calls, greedy.response_length, correct, samples
    )
