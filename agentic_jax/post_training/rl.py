"""Online RL from verifiable rewards: one trainer for GRPO, DAPO, Dr. GRPO, GSPO, RLOO, REINFORCE++, PPO.

Each step:

1. **Prompts**: ``prompts_per_step`` train tasks, in a fresh seeded permutation every epoch, or
   drawn from a pass-rate curriculum (``envs.curriculum.PassRateFilter``: tasks solved
   sometimes but not always).
2. **Rollouts**: ``group_size`` episodes of each task with the current policy (``rollout.collect``:
   the KV-cache decoder inside the jitted ``TextEnv``; single-turn answers or multi-turn tool use).
3. **Rewards**: the verifier's, optionally minus ``kl_coef · Σ_t (log π_old − log π_ref)`` when the
   KL goes into the reward, and minus DAPO's soft overlong penalty
   ``clip(((L_max − L_buffer) − L) / L_buffer, −1, 0)`` for responses longer than
   ``L_max − L_buffer`` tokens.  DAPO's **dynamic sampling** drops groups whose rewards are all
   equal (zero advantage, no gradient) and samples more prompts, up to ``max_sampling_rounds``.
4. **Advantages**: group-relative (``rl.group_advantages``: grpo, dr_grpo, rloo, reinforce_pp, ...)
   or, for PPO, token-level GAE (``rl.token_gae``) from a critic: a transformer trunk with a
   scalar head, initialised from the policy, trained with the clipped value loss.
5. **Updates**: ``epochs`` (μ) passes over ``minibatches`` minibatches with ``rl.policy_loss``
   (its ``loss_type`` decides the surrogate and the aggregation), log-probabilities of the
   rollout policy recomputed once (``old_logp``; the policy runs without dropout, LoRA's
   included, so the ratio of the first minibatch is 1), a frozen reference model for the KL term
   in the loss (``kl_coef`` with ``kl_in_reward=False``), AdamW (β2 = 0.95, clipping at 1.0).

Every algorithm is a named gin config (``configs/rl_*.gin``) over `RLConfig`.  The checkpoint
holds the trainable parameters, optimizer states, RNG, step, prompt position and curriculum
state, and the reference model's fingerprint, so a killed run resumes exactly.
"""

from __future__ import annotations

import dataclasses
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from tqdm.auto import tqdm

from agentic_jax import rl
from agentic_jax.envs.curriculum import PassRateFilter, PassRateState
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.common import (
    FullFinetune,
    init_scalar_head,
    make_update,
    next_prompts,
    token_logprobs,
    token_values,
    tree_fingerprint,
)
from agentic_jax.post_training.evaluate import evaluate_policy
from agentic_jax.post_training.rollout import Rollouts, collect
from agentic_jax.post_training.runner import TrainerRun
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.state import TrainState

CURRICULA = (None, "pass_rate")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RLConfig:
    """The algorithm: loss, advantages, sampling and the KL/length shaping (see the module docstring)."""

    loss_type: str = "grpo"  # rl.policy_loss loss_type
    advantage: str = "grpo"  # an rl.group_advantages estimator, or "gae" (PPO with a critic)
    group_size: int = 8  # G episodes per prompt
    prompts_per_step: int = 8
    epochs: int = 1  # μ passes over each batch
    minibatches: int = 1
    accum_steps: int = 1
    epsilon: float = 0.2
    epsilon_high: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    temperature: float = 1.0
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 3
    overlong_buffer: int = 0  # L_buffer tokens before the length limit; 0: no shaping
    max_response_length: int | None = (
        None  # L_max (policy tokens); default: the env's action_length
    )
    gamma: float = 1.0  # PPO: discount and GAE λ over response tokens
    lam: float = 0.95
    value_coef: float = 0.5
    value_clip: float = 0.2
    critic_lr: float = 1e-4

    def __post_init__(self):
        if self.loss_type not in rl.POLICY_LOSSES:
            raise ValueError(
                f"RLConfig.loss_type={self.loss_type!r}; expected one of {rl.POLICY_LOSSES}"
            )
        if self.advantage != "gae" and self.advantage not in rl.GROUP_ESTIMATORS:
            raise ValueError(
                f"RLConfig.advantage={self.advantage!r}; expected 'gae' or one of "
                f"{rl.GROUP_ESTIMATORS}"
            )
        if self.advantage == "remax":
            raise ValueError(
                "RLConfig.advantage='remax' needs the reward of a greedy response per prompt, "
                "which train_rl does not sample"
            )
        if self.dynamic_sampling and self.group_size < 2:  # a group of one has no reward variance
            raise ValueError(
                f"dynamic_sampling would drop every group of group_size={self.group_size}; "
                "it needs group_size >= 2"
            )
        if self.advantage != "gae" and self.group_size < 2:
            raise ValueError(
                f"group-relative advantages need group_size >= 2, got {self.group_size}"
            )
        rows = self.group_size * self.prompts_per_step
        if rows % (self.minibatches * self.accum_steps):
            raise ValueError(
                f"{rows} rollouts per step do not split into minibatches={self.minibatches} "
                f"x accum_steps={self.accum_steps}"
            )


@struct.dataclass
class Learner:
    """Everything a step changes: the policy's train state, the critic's, the curriculum's."""

    policy: TrainState
    critic: TrainState | None
    curriculum: PassRateState | None
    prompt_position: jax.Array  # int32: prompts drawn so far (the permutation iterator)


def overlong_penalty(lengths, max_length: int, buffer: int) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), in [-1, 0]."""
    if buffer <= 0:
        return np.zeros(np.shape(lengths), np.float32)
    return np.clip(((max_length - buffer) - np.asarray(lengths, np.float32)) / buffer, -1.0, 0.0)


def _policy_loss(config: TransformerConfig, algo: RLConfig, max_length: int):
    def loss(params, batch, key):
        logp, entropy = token_logprobs(
            params, config, batch["tokens"], temperature=algo.temperature, with_entropy=True
        )
        kl_in_loss = algo.kl_coef if (algo.kl_coef and not algo.kl_in_reward) else 0.0
        out = rl.policy_loss(
            logp,
            batch["old_logp"],
            batch["advantages"],
            batch["mask"],
            loss_type=algo.loss_type,
            epsilon=algo.epsilon,
            epsilon_high=algo.epsilon_high,
            ref_logp=batch.get("ref_logp"),
            kl_coef=kl_in_loss,
            kl_estimator=algo.kl_estimator,
            entropy=entropy,
            entropy_coef=algo.entropy_coef,
            max_length=max_length,
            key=key,
        )
        return out.total, out.count, out.metrics

    return loss


def _value_loss(config: TransformerConfig, algo: RLConfig):
    """Clipped value loss ½·max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²), token mean."""

    def loss(params, batch, key):
        del key
        values = token_values(params, config, batch["tokens"])
        per_token = jax.vmap(rl.ppo_value_loss, in_axes=(0, 0, 0, None))(
            values, batch["old_values"], batch["returns"], algo.value_clip
        )
        mask = batch["mask"].astype(jnp.float32)
        total = algo.value_coef * jnp.sum(per_token * mask)
        return (
            total,
            jnp.sum(mask),
            {"value_error": jnp.sum(jnp.square(values - batch["returns"]) * mask)},
        )

    return loss


def _rewards(
    rollouts: Rollouts, algo: RLConfig, max_response: int, old_logp, ref_logp
) -> np.ndarray:
    rewards = rollouts.reward + overlong_penalty(
        rollouts.response_length, max_response, algo.overlong_buffer
    )
    if algo.kl_coef and algo.kl_in_reward:
        rewards = rewards - algo.kl_coef * np.sum(
            (old_logp - ref_logp) * rollouts.loss_mask, axis=1
        )
    return rewards.astype(np.float32)


def _group_advantages(
    rewards: np.ndarray, lengths: np.ndarray, row_kept: np.ndarray, algo: RLConfig
) -> np.ndarray:
    """Per-row group-relative advantages of the kept groups; 0 on the groups dynamic sampling dropped.

    The dropped groups pad the batch but are masked out of the loss, so a batch-level estimator
    (REINFORCE++ whitens over the batch) must not see their rewards: they would shift the mean
    and scale of the rows that are trained.  ``lengths`` (policy tokens) weight OPO's baseline.
    """
    kept = row_kept[:: algo.group_size]
    advantages = np.zeros((kept.size, algo.group_size), np.float32)
    if kept.any():
        advantages[kept] = rl.group_advantages(
            jnp.asarray(rewards.reshape(advantages.shape)[kept]),
            lengths=jnp.asarray(lengths.reshape(advantages.shape)[kept]),
            estimator=algo.advantage,
        )
    return advantages.reshape(-1)


def _select_groups(
    parts: list[Rollouts], keep: list[np.ndarray], group_size: int, groups: int
) -> tuple:
    """The first ``groups`` kept groups of the sampling rounds, padded with dropped ones (masked out)."""
    rows = []
    for r, k in zip(parts, keep):
        for g in np.flatnonzero(k):
            rows.append((r, g, True))
    for r, k in zip(parts, keep):
        for g in np.flatnonzero(~k):
            rows.append((r, g, False))
    rows = rows[:groups]
    merged = Rollouts.concat([r.rows(g * group_size, (g + 1) * group_size) for r, g, _ in rows])
    return merged, np.repeat([k for _, _, k in rows], group_size)


@gin.configurable
def train_rl(
    workdir: str,
    *,
    init_from: str,
    tasks: TaskSpec = TaskSpec(),
    algorithm: RLConfig = RLConfig(),
    steps: int = 50,
    peak_lr: float = 1e-5,
    warmup_steps: int = 0,
    finetune=FullFinetune(),
    curriculum: str | None = None,
    eval_every: int = 0,
    eval_samples: int = 4,
    checkpoint_every: int = 10,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """RL-trains the model of run ``init_from`` on ``tasks``' train problems; saves ``workdir/model``.

    The reference model for KL is ``init_from``'s model.  ``eval_every`` > 0 evaluates held-out
    success (greedy) and pass@k (``eval_samples`` samples) every that many steps and at the end.
    """
    if curriculum not in CURRICULA:
        raise ValueError(f"train_rl.curriculum={curriculum!r}; expected one of {CURRICULA}")
    algo = algorithm
    config, base, tokenizer = load_checkpoint(init_from)
    if config.max_seq_len < tasks.context_length:
        raise ValueError(
            f"the model's max_seq_len={config.max_seq_len} < the tasks' context length "
            f"{tasks.context_length} (TaskSpec.max_length + action_length)"
        )
    env, heldout_env = tasks.env(tokenizer, "train"), tasks.env(tokenizer, "heldout")
    num_tasks = env.default_params.tasks.size
    max_response = algo.max_response_length or tasks.action_length * int(
        env.default_params.max_turns
    )
    frozen = None if isinstance(finetune, FullFinetune) else base
    schedule = make_schedule(
        peak_lr=peak_lr, total_steps=steps, kind="constant", warmup_steps=min(warmup_steps, steps)
    )
    optimizer = make_optimizer(schedule)
    update = make_update(
        _policy_loss(config, algo, max_response),
        optimizer,
        finetune,
        accum_steps=algo.accum_steps,
        dropout=False,
    )
    ppo = algo.advantage == "gae"
    critic_optimizer = (
        make_optimizer(
            make_schedule(
                peak_lr=algo.critic_lr, total_steps=steps, kind="constant", warmup_steps=0
            )
        )
        if ppo
        else None
    )
    critic_update = (
        make_update(_value_loss(config, algo), critic_optimizer, accum_steps=algo.accum_steps)
        if ppo
        else None
    )
    pass_rate = PassRateFilter(num_tasks) if curriculum == "pass_rate" else None
    learner = Learner(
        TrainState.create(finetune.init(base, jax.random.key(seed)), optimizer, seed),
        TrainState.create({"trunk": base, "head": init_scalar_head(config)}, critic_optimizer, seed)
        if ppo
        else None,
        pass_rate.init() if pass_rate else None,
        jnp.int32(0),
    )

    run = TrainerRun(workdir)
    reference_id = tree_fingerprint(base)
    learner, meta, start = run.start(learner, {"init_from": init_from, "reference": reference_id})
    logp_fn = jax.jit(lambda p, t: token_logprobs(p, config, t, temperature=algo.temperature))
    values_fn = jax.jit(lambda p, t: token_values(p, config, t))
    sampling = SamplingParams(temperature=algo.temperature)
    root = jax.random.key(seed)
    last = {}

    def evaluate(params, step):
        result = evaluate_policy(
            params, config, heldout_env, samples=eval_samples, key=jax.random.key(seed + 1)
        )
        return {"step": step, **{f"eval_{k}": v for k, v in result.summary().items()}}

    if eval_every and start == 0:
        last = evaluate(finetune.model_params(learner.policy.params, frozen), 0)
        run.write(last)
    with tqdm(
        total=steps, initial=start, disable=not progress, unit="step", desc=f"rl {algo.loss_type}"
    ) as bar:
        for step in range(start + 1, steps + 1):
            step_key = jax.random.fold_in(root, step)
            params = finetune.model_params(learner.policy.params, frozen)
            parts, keep, position, curriculum_state = (
                [],
                [],
                int(learner.prompt_position),
                learner.curriculum,
            )
            gen_start = time.perf_counter()
            for round_ in range(algo.max_sampling_rounds if algo.dynamic_sampling else 1):
                if pass_rate is not None:
                    weights = np.asarray(pass_rate.weights(curriculum_state), np.float64)
                    prompts = np.random.default_rng([seed, step, round_]).choice(
                        num_tasks, algo.prompts_per_step, p=weights / weights.sum()
                    )
                else:
                    prompts = next_prompts(position, algo.prompts_per_step, num_tasks, seed)
                position += algo.prompts_per_step
                r = collect(
                    params,
                    config,
                    env,
                    env.default_params,
                    prompts,
                    group_size=algo.group_size,
                    sampling=sampling,
                    key=jax.random.fold_in(step_key, round_),
                )
                if pass_rate is not None:
                    curriculum_state = pass_rate.update(
                        curriculum_state, jnp.asarray(r.task), jnp.asarray(r.success, jnp.float32)
                    )
                grouped = r.group(r.reward, algo.group_size)
                parts.append(r)
                keep.append(
                    grouped.std(axis=1) > 0
                    if algo.dynamic_sampling
                    else np.ones(len(grouped), bool)
                )
                if sum(k.sum() for k in keep) >= algo.prompts_per_step:
                    break
            zero_variance = float(
                np.mean([r.group(r.reward, algo.group_size).std(axis=1) == 0 for r in parts])
            )
            rollouts, row_kept = _select_groups(parts, keep, algo.group_size, algo.prompts_per_step)
            gen_seconds = time.perf_counter() - gen_start

            train_start = time.perf_counter()
            tokens = jnp.asarray(rollouts.tokens)
            mask = jnp.asarray(rollouts.loss_mask * row_kept[:, None], jnp.int32)
            old_logp = np.asarray(logp_fn(params, tokens))
            ref_logp = np.asarray(
                logp_fn(base, tokens)
            )  # for the KL term, and the KL logged every step
            rewards = _rewards(rollouts, algo, max_response, old_logp, ref_logp)
            batch = {"tokens": tokens, "mask": mask, "old_logp": jnp.asarray(old_logp)}
            if algo.kl_coef and not algo.kl_in_reward:
                batch["ref_logp"] = jnp.asarray(ref_logp)
            if ppo:
                old_values = values_fn(learner.critic.params, tokens)
                last_token = jnp.max(jnp.where(mask > 0, jnp.arange(mask.shape[1]), 0), axis=1)
                token_rewards = (
                    jnp.zeros(mask.shape, jnp.float32)
                    .at[jnp.arange(mask.shape[0]), last_token]
                    .set(jnp.asarray(rewards))
                )
                advantages, returns = rl.token_gae(
                    token_rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam
                )
                batch["advantages"] = rl.masked_whiten(advantages, mask)
                critic_batch = {
                    "tokens": tokens,
                    "mask": mask,
                    "old_values": old_values,
                    "returns": returns,
                }
            else:
                batch["advantages"] = jnp.asarray(
                    _group_advantages(rewards, rollouts.response_length, row_kept, algo)
                )

            policy, critic, sums = learner.policy, learner.critic, []
            rows = tokens.shape[0]
            for epoch in range(algo.epochs):
                order = np.random.default_rng([seed, step, epoch]).permutation(rows)
                for chunk in np.array_split(order, algo.minibatches):
                    policy, metrics = update(
                        policy, frozen, jax.tree.map(lambda x: x[chunk], batch)
                    )
                    if ppo:
                        critic, value_metrics = critic_update(
                            critic, None, jax.tree.map(lambda x: x[chunk], critic_batch)
                        )
                        metrics = {
                            **metrics,
                            "value_error": value_metrics["value_error"],
                            "value_tokens": value_metrics["count"],
                        }
                    sums.append(metrics)
            sums = jax.device_get(sums)
            learner = Learner(policy, critic, curriculum_state, jnp.int32(position))
            train_seconds = time.perf_counter() - train_start

            tokens_seen = max(sum(float(m["tokens"]) for m in sums), 1.0)

            def token_mean(name):
                return sum(float(m[name]) for m in sums) / tokens_seen

            kept = rollouts.reward[row_kept]
            last = {
                "step": step,
                "loss": float(np.mean([m["loss"] for m in sums])),
                "reward_mean": float(rollouts.reward.mean()),
                "reward_std": float(rollouts.reward.std()),
                "shaped_reward_mean": float(rewards.mean()),
                "success_rate": float(rollouts.success.mean()),
                "trained_reward_mean": float(kept.mean()) if kept.size else 0.0,
                "entropy": token_mean("entropy"),
                "approx_kl": token_mean("approx_kl"),
                "clip_frac_low": token_mean("clip_frac_low"),
                "clip_frac_high": token_mean("clip_frac_high"),
                "response_length": float(rollouts.response_length.mean()),
                "tool_calls": float(rollouts.tool_calls.mean()),
                "truncated": float(rollouts.truncated.mean()),
                "zero_variance_groups": zero_variance,
                "sampling_rounds": len(parts),
                "grad_norm": float(np.mean([m["grad_norm"] for m in sums])),
                "generation_seconds": gen_seconds,
                "training_seconds": train_seconds,
            }
            if "kl" in sums[0]:
                last["kl"] = token_mean("kl")
            else:  # the k3 estimate of KL(π_old ‖ π_ref) over the sampled tokens
                k3 = np.asarray(rl.kl_penalty(jnp.asarray(old_logp), jnp.asarray(ref_logp), "k3"))
                last["kl"] = float(
                    np.sum(k3 * rollouts.loss_mask) / max(rollouts.loss_mask.sum(), 1)
                )
            if ppo:
                last["value_error"] = sum(float(m["value_error"]) for m in sums) / max(
                    sum(float(m["value_tokens"]) for m in sums), 1.0
                )
            if eval_every and (step % eval_every == 0 or step == steps):
                last.update(evaluate(finetune.model_params(learner.policy.params, frozen), step))
                bar.write(f"step {step}: held-out success {last['eval_success']:.3f}")
            run.write(last)
            bar.update(1)
            bar.set_postfix(
                reward=f"{last['reward_mean']:.3f}", success=f"{last['success_rate']:.2f}"
            )
            if step % checkpoint_every == 0 or step == steps:
                run.save(step, learner, meta)
    run.finish(config, finetune.merged(learner.policy.params, frozen), tokenizer)
    return last
