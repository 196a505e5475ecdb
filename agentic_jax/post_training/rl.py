"""Online RL from verifiable rewards: one trainer for GRPO, DAPO, Dr. GRPO, GSPO, RLOO, REINFORCE++, PPO.

Each step (:func:`rl_step`) runs five named phases, each a function of its own:

1. :func:`sample`: ``prompts_per_step`` train tasks, in a fresh seeded permutation every epoch,
   or drawn from a pass-rate curriculum (``envs.curriculum.PassRateFilter``: tasks solved
   sometimes but not always), then ``group_size`` episodes of each with the current policy
   (``rollout.collect``: the KV-cache decoder inside the jitted ``TextEnv``; single-turn answers
   or multi-turn tool use).  DAPO's **dynamic sampling** drops groups whose rewards are all
   equal (zero advantage, no gradient) and samples more prompts, up to ``max_sampling_rounds``.
2. :func:`score`: the verifier's reward, optionally minus ``kl_coef · Σ_t (log π_old − log
   π_ref)`` when the KL goes into the reward, and minus DAPO's soft overlong penalty
   ``clip(((L_max − L_buffer) − L) / L_buffer, −1, 0)`` for responses longer than
   ``L_max − L_buffer`` tokens; the log-probs of the sampled tokens under the sampling policy
   (``old_logp``; no dropout, LoRA's included, so the ratio of the first minibatch is 1) and the
   frozen reference.
3. :func:`advantages`: group-relative (``rl.group_advantages``: grpo, dr_grpo, rloo,
   reinforce_pp, ...) or, for PPO, token-level GAE (``rl.token_gae``) from a critic: a
   transformer trunk with a scalar head, initialised from the policy, trained with the clipped
   value loss.
4. :func:`learn`: ``epochs`` (μ) passes over ``minibatches`` minibatches with
   ``rl.policy_loss`` (its ``loss_type`` decides the surrogate and the aggregation) through
   ``training.make_update``, with the reference's log-probs for the KL term in the loss
   (``kl_coef`` with ``kl_in_reward=False``), AdamW (β2 = 0.95, clipping at 1.0).
5. :func:`summarize`: the step's metrics record.

All of a step's randomness comes from :class:`StepRandom` (the run seed and the step), so a
step is reproducible from ``(seed, step)`` and the learner it starts from.  Every algorithm is a
named gin config (``configs/rl_*.gin``) over `RLConfig`.  The checkpoint holds the trainable
parameters, optimizer states, RNG, step, prompt position and curriculum state, and the reference
model's fingerprint, so a killed run resumes exactly.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import NamedTuple

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from tqdm.auto import tqdm

from agentic_jax import rl
from agentic_jax.envs.curriculum import PassRateFilter, PassRateState
from agentic_jax.envs.text import TextEnv
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.common import (
    init_scalar_head,
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
from agentic_jax.training.update import FullFinetune, make_update

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


# ----------------------------------------------------------------------------- one step's parts
@dataclasses.dataclass(frozen=True)
class StepRandom:
    """All of one step's randomness, derived from the run's ``seed`` and the ``step`` alone, so a
    step is reproducible from ``(seed, step)`` and the learner it starts from.  (The policy
    update's own key, for dropout and sampling inside a loss, is ``TrainState.step_key()``: the
    run seed folded with the number of updates so far.)"""

    seed: int
    step: int

    def rollout_key(self, round_: int) -> jax.Array:
        """The sampler's key for sampling round ``round_`` (dynamic sampling draws several)."""
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), self.step), round_)

    def curriculum_rng(self, round_: int) -> np.random.Generator:
        """The generator that draws round ``round_``'s prompts from the curriculum's weights."""
        return np.random.default_rng([self.seed, self.step, round_, CURRICULUM_STREAM])

    def minibatch_order(self, epoch: int, rows: int) -> np.ndarray:
        """The order of the batch's rows in epoch ``epoch``, before it is cut into minibatches."""
        return np.random.default_rng([self.seed, self.step, epoch]).permutation(rows)


CURRICULUM_STREAM = 1  # keeps the curriculum's draws apart from the minibatch orders


@dataclasses.dataclass(frozen=True)
class RLSetup:
    """What stays fixed during a run: the model, environment, algorithm and compiled functions."""

    config: TransformerConfig
    algo: RLConfig
    env: TextEnv
    base: dict  # the reference model (and LoRA's frozen base)
    frozen: dict | None  # the frozen base ``finetune.model_params`` needs, or None
    finetune: object
    max_response: int
    pass_rate: PassRateFilter | None
    seed: int
    optimizer: optax.GradientTransformation
    critic_optimizer: optax.GradientTransformation | None
    update: Callable
    critic_update: Callable | None
    logp_fn: Callable
    values_fn: Callable

    @property
    def num_tasks(self) -> int:
        return int(self.env.default_params.tasks.size)

    @property
    def ppo(self) -> bool:
        return self.critic_update is not None

    def policy_params(self, learner: Learner):
        """The parameters the policy runs with (LoRA's adapters merged into the frozen base)."""
        return self.finetune.model_params(learner.policy.params, self.frozen)


class Samples(NamedTuple):
    """The episodes a step trains on (``sample``'s result)."""

    rollouts: Rollouts  # prompts_per_step groups of group_size episodes
    row_kept: np.ndarray  # bool [B]: False on the groups dynamic sampling dropped (masked out)
    rounds: int  # sampling rounds drawn
    zero_variance: float  # fraction of the drawn groups whose rewards were all equal
    curriculum: PassRateState | None  # the curriculum after seeing every round
    position: int  # prompts drawn from the permutation stream so far
    seconds: float


class Scores(NamedTuple):
    """``score``'s result: shaped rewards, and the log-probs of the sampled tokens."""

    rewards: np.ndarray  # float32 [B]: the verifier's, shaped (overlong penalty, KL in reward)
    old_logp: np.ndarray  # float32 [B, L] under the policy that sampled
    ref_logp: np.ndarray  # float32 [B, L] under the reference model


def make_setup(
    config: TransformerConfig,
    base,
    env: TextEnv,
    algo: RLConfig,
    *,
    steps: int,
    peak_lr: float,
    warmup_steps: int = 0,
    finetune=FullFinetune(),
    curriculum: str | None = None,
    max_response: int | None = None,
    seed: int = 0,
) -> RLSetup:
    """The fixed part of a run, with the policy (and PPO's critic) updates compiled."""
    if curriculum not in CURRICULA:
        raise ValueError(f"train_rl.curriculum={curriculum!r}; expected one of {CURRICULA}")
    max_response = (
        max_response
        or algo.max_response_length
        or int(env.action_length * env.default_params.max_turns)
    )
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
    critic_optimizer = critic_update = None
    if algo.advantage == "gae":
        critic_optimizer = make_optimizer(
            make_schedule(
                peak_lr=algo.critic_lr, total_steps=steps, kind="constant", warmup_steps=0
            )
        )
        critic_update = jax.jit(
            make_update(_value_loss(config, algo), critic_optimizer, accum_steps=algo.accum_steps)
        )
    num_tasks = int(env.default_params.tasks.size)
    return RLSetup(
        config=config,
        algo=algo,
        env=env,
        base=base,
        frozen=None if isinstance(finetune, FullFinetune) else base,
        finetune=finetune,
        max_response=max_response,
        pass_rate=PassRateFilter(num_tasks) if curriculum == "pass_rate" else None,
        seed=seed,
        optimizer=optimizer,
        critic_optimizer=critic_optimizer,
        update=jax.jit(update),
        critic_update=critic_update,
        logp_fn=jax.jit(lambda p, t: token_logprobs(p, config, t, temperature=algo.temperature)),
        values_fn=jax.jit(lambda p, t: token_values(p, config, t)),
    )


def init_learner(setup: RLSetup) -> Learner:
    """The learner before step 1: the policy from the base model (or fresh adapters), PPO's
    critic from the base trunk with a zero head, the curriculum's prior."""
    base, seed = setup.base, setup.seed
    critic = None
    if setup.ppo:
        trunk_and_head = {"trunk": base, "head": init_scalar_head(setup.config)}
        critic = TrainState.create(trunk_and_head, setup.critic_optimizer, seed)
    return Learner(
        TrainState.create(setup.finetune.init(base, jax.random.key(seed)), setup.optimizer, seed),
        critic,
        setup.pass_rate.init() if setup.pass_rate else None,
        jnp.int32(0),
    )


def sample(setup: RLSetup, learner: Learner, rand: StepRandom) -> Samples:
    """Phase 1: ``prompts_per_step`` groups of ``group_size`` episodes with the current policy.

    Prompts come from the seeded permutation stream (or the pass-rate curriculum).  With DAPO's
    dynamic sampling, groups whose rewards are all equal (zero advantage, no gradient) are
    dropped and more prompts are drawn, up to ``max_sampling_rounds`` rounds; the batch keeps
    its shape, padded with dropped groups that ``row_kept`` masks out.
    """
    algo, env = setup.algo, setup.env
    params = setup.policy_params(learner)
    sampling = SamplingParams(temperature=algo.temperature)
    parts, keep = [], []
    position, curriculum = int(learner.prompt_position), learner.curriculum
    start = time.perf_counter()
    for round_ in range(algo.max_sampling_rounds if algo.dynamic_sampling else 1):
        if setup.pass_rate is not None:
            weights = np.asarray(setup.pass_rate.weights(curriculum), np.float64)
            prompts = rand.curriculum_rng(round_).choice(
                setup.num_tasks, algo.prompts_per_step, p=weights / weights.sum()
            )
        else:
            prompts = next_prompts(position, algo.prompts_per_step, setup.num_tasks, setup.seed)
        position += algo.prompts_per_step
        r = collect(
            params,
            setup.config,
            env,
            env.default_params,
            prompts,
            group_size=algo.group_size,
            sampling=sampling,
            key=rand.rollout_key(round_),
        )
        if setup.pass_rate is not None:
            curriculum = setup.pass_rate.update(
                curriculum, jnp.asarray(r.task), jnp.asarray(r.success, jnp.float32)
            )
        varied = r.group(r.reward, algo.group_size).std(axis=1) > 0
        parts.append(r)
        keep.append(varied if algo.dynamic_sampling else np.ones(len(varied), bool))
        if sum(k.sum() for k in keep) >= algo.prompts_per_step:
            break
    zero_variance = float(
        np.mean([r.group(r.reward, algo.group_size).std(axis=1) == 0 for r in parts])
    )
    rollouts, row_kept = _select_groups(parts, keep, algo.group_size, algo.prompts_per_step)
    return Samples(
        rollouts,
        row_kept,
        len(parts),
        zero_variance,
        curriculum,
        position,
        time.perf_counter() - start,
    )


def score(setup: RLSetup, learner: Learner, samples: Samples) -> Scores:
    """Phase 2: the rewards the step optimises and the log-probs of the sampled tokens.

    Reward = verifier reward + DAPO's soft overlong penalty
    ``clip(((L_max − L_buffer) − L) / L_buffer, −1, 0)`` (Yu et al. 2025), minus
    ``kl_coef · Σ_t (log π_old − log π_ref)`` when the KL goes into the reward.  ``old_logp`` is
    recomputed once under the policy that sampled (no dropout, so the first ratio is 1);
    ``ref_logp`` under the frozen reference, for the KL term and the KL logged every step.
    """
    algo, rollouts = setup.algo, samples.rollouts
    tokens = jnp.asarray(rollouts.tokens)
    old_logp = np.asarray(setup.logp_fn(setup.policy_params(learner), tokens))
    ref_logp = np.asarray(setup.logp_fn(setup.base, tokens))
    rewards = rollouts.reward + overlong_penalty(
        rollouts.response_length, setup.max_response, algo.overlong_buffer
    )
    if algo.kl_coef and algo.kl_in_reward:
        rewards = rewards - algo.kl_coef * np.sum(
            (old_logp - ref_logp) * rollouts.loss_mask, axis=1
        )
    return Scores(rewards.astype(np.float32), old_logp, ref_logp)


def advantages(
    setup: RLSetup, learner: Learner, samples: Samples, scores: Scores
) -> tuple[dict, dict | None]:
    """Phase 3: the policy's training batch (tokens, mask, old log-probs, advantages, and the
    reference log-probs when the KL is in the loss) and, for PPO, the critic's.

    Group-relative advantages (``rl.group_advantages``) over the kept groups only, or, for PPO,
    token-level GAE (``rl.token_gae``, the reward on each episode's last policy token) from the
    critic's values, whitened over the batch (``rl.masked_whiten``).
    """
    algo, rollouts = setup.algo, samples.rollouts
    tokens = jnp.asarray(rollouts.tokens)
    mask = jnp.asarray(rollouts.loss_mask * samples.row_kept[:, None], jnp.int32)
    batch = {"tokens": tokens, "mask": mask, "old_logp": jnp.asarray(scores.old_logp)}
    if algo.kl_coef and not algo.kl_in_reward:
        batch["ref_logp"] = jnp.asarray(scores.ref_logp)
    if not setup.ppo:
        batch["advantages"] = jnp.asarray(
            _group_advantages(scores.rewards, rollouts.response_length, samples.row_kept, algo)
        )
        return batch, None
    old_values = setup.values_fn(learner.critic.params, tokens)
    last_token = jnp.max(jnp.where(mask > 0, jnp.arange(mask.shape[1]), 0), axis=1)
    token_rewards = (
        jnp.zeros(mask.shape, jnp.float32)
        .at[jnp.arange(mask.shape[0]), last_token]
        .set(jnp.asarray(scores.rewards))
    )
    adv, returns = rl.token_gae(token_rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam)
    batch["advantages"] = rl.masked_whiten(adv, mask)
    critic_batch = {"tokens": tokens, "mask": mask, "old_values": old_values, "returns": returns}
    return batch, critic_batch


def learn(
    setup: RLSetup,
    learner: Learner,
    batch: dict,
    critic_batch: dict | None,
    rand: StepRandom,
) -> tuple[TrainState, TrainState | None, list[dict]]:
    """Phase 4: ``epochs`` (μ) passes over the batch in ``minibatches`` seeded minibatches, one
    policy update (and one critic update for PPO) each; returns the new policy and critic
    states and each update's metrics."""
    algo = setup.algo
    policy, critic, metrics = learner.policy, learner.critic, []
    rows = batch["tokens"].shape[0]
    for epoch in range(algo.epochs):
        for chunk in np.array_split(rand.minibatch_order(epoch, rows), algo.minibatches):
            policy, m = setup.update(policy, setup.frozen, _rows(batch, chunk))
            if setup.ppo:
                critic, value = setup.critic_update(critic, None, _rows(critic_batch, chunk))
                m = {**m, "value_error": value["value_error"], "value_tokens": value["count"]}
            metrics.append(m)
    return policy, critic, jax.device_get(metrics)


def _rows(batch: dict, rows: np.ndarray) -> dict:
    return {k: v[rows] for k, v in batch.items()}


def summarize(
    samples: Samples, scores: Scores, updates: list[dict], *, training_seconds: float
) -> dict:
    """Phase 5: the step's record in ``metrics.jsonl``: rewards and success of the sampled
    episodes, per-token means of the updates' metrics (entropy, approximate KL, clip
    fractions), lengths, tool calls, sampling statistics, and generation vs training time."""
    rollouts = samples.rollouts
    tokens_seen = max(sum(float(m["tokens"]) for m in updates), 1.0)

    def token_mean(name):
        return sum(float(m[name]) for m in updates) / tokens_seen

    kept = rollouts.reward[samples.row_kept]
    record = {
        "loss": float(np.mean([m["loss"] for m in updates])),
        "reward_mean": float(rollouts.reward.mean()),
        "reward_std": float(rollouts.reward.std()),
        "shaped_reward_mean": float(scores.rewards.mean()),
        "success_rate": float(rollouts.success.mean()),
        "trained_reward_mean": float(kept.mean()) if kept.size else 0.0,
        "entropy": token_mean("entropy"),
        "approx_kl": token_mean("approx_kl"),
        "clip_frac_low": token_mean("clip_frac_low"),
        "clip_frac_high": token_mean("clip_frac_high"),
        "response_length": float(rollouts.response_length.mean()),
        "tool_calls": float(rollouts.tool_calls.mean()),
        "truncated": float(rollouts.truncated.mean()),
        "zero_variance_groups": samples.zero_variance,
        "sampling_rounds": samples.rounds,
        "grad_norm": float(np.mean([m["grad_norm"] for m in updates])),
        "generation_seconds": samples.seconds,
        "training_seconds": training_seconds,
    }
    if "kl" in updates[0]:
        record["kl"] = token_mean("kl")
    else:  # the k3 estimate of KL(π_old ‖ π_ref) over the sampled tokens
        k3 = np.asarray(
            rl.kl_penalty(jnp.asarray(scores.old_logp), jnp.asarray(scores.ref_logp), "k3")
        )
        record["kl"] = float(np.sum(k3 * rollouts.loss_mask) / max(rollouts.loss_mask.sum(), 1))
    if "value_error" in updates[0]:
        record["value_error"] = sum(float(m["value_error"]) for m in updates) / max(
            sum(float(m["value_tokens"]) for m in updates), 1.0
        )
    return record


def rl_step(setup: RLSetup, learner: Learner, step: int) -> tuple[Learner, dict]:
    """One step: sample → score → advantages → learn → summarize.  A function of the learner
    and ``(setup.seed, step)`` alone (:class:`StepRandom`)."""
    rand = StepRandom(setup.seed, step)
    samples = sample(setup, learner, rand)
    start = time.perf_counter()
    scores = score(setup, learner, samples)
    batch, critic_batch = advantages(setup, learner, samples, scores)
    policy, critic, updates = learn(setup, learner, batch, critic_batch, rand)
    record = summarize(samples, scores, updates, training_seconds=time.perf_counter() - start)
    learner = Learner(policy, critic, samples.curriculum, jnp.int32(samples.position))
    return learner, {"step": step, **record}


# ----------------------------------------------------------------------------- the trainer
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
    config, base, tokenizer = load_checkpoint(init_from)
    if config.max_seq_len < tasks.context_length:
        raise ValueError(
            f"the model's max_seq_len={config.max_seq_len} < the tasks' context length "
            f"{tasks.context_length} (TaskSpec.max_length + action_length)"
        )
    env, heldout_env = tasks.env(tokenizer, "train"), tasks.env(tokenizer, "heldout")
    setup = make_setup(
        config,
        base,
        env,
        algorithm,
        steps=steps,
        peak_lr=peak_lr,
        warmup_steps=warmup_steps,
        finetune=finetune,
        curriculum=curriculum,
        max_response=algorithm.max_response_length
        or tasks.action_length * int(env.default_params.max_turns),
        seed=seed,
    )
    run = TrainerRun(workdir)
    meta = {"init_from": init_from, "reference": tree_fingerprint(base)}
    learner, meta, start = run.start(init_learner(setup), meta)
    last = {}

    def evaluate(step):
        result = evaluate_policy(
            setup.policy_params(learner),
            config,
            heldout_env,
            samples=eval_samples,
            key=jax.random.key(seed + 1),
        )
        return {"step": step, **{f"eval_{k}": v for k, v in result.summary().items()}}

    if eval_every and start == 0:
        last = evaluate(0)
        run.write(last)
    with tqdm(
        total=steps,
        initial=start,
        disable=not progress,
        unit="step",
        desc=f"rl {algorithm.loss_type}",
    ) as bar:
        for step in range(start + 1, steps + 1):
            learner, last = rl_step(setup, learner, step)
            if eval_every and (step % eval_every == 0 or step == steps):
                last.update(evaluate(step))
                bar.write(f"step {step}: held-out success {last['eval_success']:.3f}")
            run.write(last)
            bar.update(1)
            bar.set_postfix(
                reward=f"{last['reward_mean']:.3f}", success=f"{last['success_rate']:.2f}"
            )
            if step % checkpoint_every == 0 or step == steps:
                run.save(step, learner, meta)
    run.finish(config, setup.finetune.merged(learner.policy.params, setup.frozen), tokenizer)
    return last
