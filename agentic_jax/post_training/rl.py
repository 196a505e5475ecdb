"""Online RL for tool-using agents: one trainer for GRPO, DAPO, Dr. GRPO, GSPO, RLOO, REINFORCE++, PPO.

Each step (:func:`rl_step`) runs five named phases, each a function of its own:

1. :func:`sample`: ``prompts_per_step`` train tasks, in a fresh seeded permutation every epoch,
   or drawn from a pass-rate curriculum (``envs.curriculum.PassRateFilter``: tasks solved
   sometimes but not always), then ``group_size`` episodes of each with the sampler's policy
   (`RLSetup.sampler`: the current one, or one ``staleness`` updates old, in ``sampler_dtype``)
   through ``rollout.collect``: padded ``generate`` calls or the serving engine, in the jitted
   ``TextEnv`` or its host twin (``host_tools``: Python tools, the sandbox).  The rollouts keep
   the sampled ids, the sampler's log-probs, and each turn's reward and token span.  DAPO's
   **dynamic sampling** drops groups whose rewards are all equal (zero advantage, no gradient)
   and samples more prompts, up to ``max_sampling_rounds``.
2. :func:`score`: the env's rewards summed over turns, optionally combined with a reward
   model's (weighted sum or GDPO), minus DAPO's overlong penalty, the efficiency term and the
   KL when it goes into the reward; the sampled tokens' log-probs under the current policy
   (``old_logp``) and the frozen reference.
3. :func:`advantages`: per episode, group-relative (``rl.group_advantages``) or, for PPO,
   token-level GAE (``rl.token_gae``) from a critic (a trunk with a scalar head, initialised
   from the policy, trained with the clipped value loss); per turn (``credit="turn"``),
   group-relative turn returns or GAE over turns; optionally one row per turn
   (``slice_turns``), importance weights against the sampler (``correction``) and the
   teacher's transcripts of self-distillation.
4. :func:`learn`: ``epochs`` (μ) passes over ``minibatches`` minibatches with
   ``rl.policy_loss`` (its ``loss_type`` decides the surrogate and the aggregation), plus the
   self-distillation KL, through ``training.make_update``, with the reference's log-probs for
   the KL term in the loss (``kl_coef`` with ``kl_in_reward=False``), AdamW (β2 = 0.95,
   clipping at 1.0).
5. :func:`summarize`: the step's metrics record, the stability monitors' signals included.

All of a step's randomness comes from :class:`StepRandom` (the run seed and the step), so a
step is reproducible from ``(seed, step)`` and the learner it starts from.  Every algorithm is a
named gin config (``configs/rl_*.gin``) over `RLConfig`; docs/post_training.md gives each
option's formula and paper.  The checkpoint holds the trainable parameters, optimizer states,
RNG, step, prompt position, curriculum state, the stale sampler's history, the monitors' state
and the reference model's fingerprint, so a killed run resumes exactly.
"""

from __future__ import annotations

import dataclasses
import itertools
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
from agentic_jax.envs.host import HostTextEnv
from agentic_jax.envs.text import Task, TextEnv
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig, moe, quantization, segment_positions
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.common import (
    init_scalar_head,
    logprobs_of,
    next_prompts,
    token_logits,
    token_logprobs,
    token_values,
    tree_fingerprint,
)
from agentic_jax.post_training.evaluate import evaluate_policy
from agentic_jax.post_training.monitors import (
    MonitorConfig,
    RLStopped,
    StabilityMonitor,
    step_diagnostics,
)
from agentic_jax.post_training.privileged import CONTEXTS, teacher_rows
from agentic_jax.post_training.reward import RewardModel, load_reward_model
from agentic_jax.post_training.rollout import ROLLOUT_BACKENDS, Rollouts, collect
from agentic_jax.post_training.runner import TrainerRun
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.state import TrainState
from agentic_jax.training.update import FullFinetune, make_update, router_metrics

CURRICULA = (None, "pass_rate")
CREDITS = ("episode", "turn")


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
    # The run's sample budget in episodes, every sampling round counted (whole groups): no more
    # prompts are drawn once it is spent, and the run ends there (at the latest at ``steps``),
    # so methods that sample more per step (dynamic sampling) take fewer steps, not more
    # episodes.  None: no budget beyond ``steps``.
    episode_budget: int | None = None
    overlong_buffer: int = 0  # L_buffer tokens before the length limit; 0: no shaping
    max_response_length: int | None = (
        None  # L_max (policy tokens); default: the env's action_length
    )
    gamma: float = 1.0  # PPO: discount and GAE λ over response tokens (over turns: credit)
    lam: float = 0.95
    value_coef: float = 0.5
    value_clip: float = 0.2
    critic_lr: float = 1e-4
    # AdamW for the policy and the critic: β2 = 0.95 and global-norm clipping at 1.0 (the
    # optimiser's defaults) and no weight decay, which would pull the policy towards 0 rather
    # than towards the reference (the KL term's job).
    weight_decay: float = 0.0
    # Credit over turns: "episode" (one advantage per episode, or per token for PPO) or "turn"
    # (each turn's return Σ_{j≥k} γ^{j−k} r_j: group-relative per turn for grpo / dr_grpo /
    # rloo, GAE over turns from the critic for "gae"); slice_turns trains one row per turn.
    credit: str = "episode"
    turn_gamma: float = 1.0
    slice_turns: bool = False
    shaping_coef: float = 0.0  # potential Φ = coef × milestones reached, on turn rewards
    efficiency_per_call: float = 0.0  # R_eff on successful episodes: −c·calls − t·tokens
    efficiency_per_token: float = 0.0
    # Learned rewards (train_rl's reward_model): weights of (verifier, reward model), combined by
    # "sum" or "gdpo" (each normalised within its group first); a PRM's steps by step_aggregation.
    reward_weights: tuple[float, float] = (1.0, 1.0)
    reward_combination: str = "sum"
    step_aggregation: str = "min"
    # Off-policy correction of the sampler's log-probs: None, "tis" or "mis", per "token" or
    # "sequence", capped at correction_cap; a sampler in sampler_dtype, or staleness updates old.
    correction: str | None = None
    correction_level: str = "token"
    correction_cap: float = 2.0
    sampler_dtype: str | None = None
    # The sampler's weights quantised (models.quantization.quantize_params: "int8", "int4",
    # "nf4"; its other options by gin): rollouts and their behaviour log-probs come from it.
    sampler_quantization: str | None = None
    staleness: int = 0
    # On-policy self-distillation: distill_coef · KL(π ‖ teacher) on the policy's tokens, the
    # teacher being the reference model or the current one (stop-gradient) with privileged
    # context (distill_context); policy_coef 0 trains on the distillation alone.
    distill_coef: float = 0.0
    distill_context: str = "solution"
    distill_teacher: str = "reference"
    policy_coef: float = 1.0

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
        if self.episode_budget is not None and self.episode_budget < self.group_size:
            raise ValueError(
                f"RLConfig.episode_budget={self.episode_budget} is less than one group of "
                f"group_size={self.group_size} episodes"
            )
        if self.advantage != "gae" and self.group_size < 2:
            raise ValueError(
                f"group-relative advantages need group_size >= 2, got {self.group_size}"
            )
        for name, value, allowed in (
            ("credit", self.credit, CREDITS),
            ("reward_combination", self.reward_combination, rl.REWARD_COMBINATIONS),
            ("step_aggregation", self.step_aggregation, rl.STEP_AGGREGATIONS),
            ("correction", self.correction, (None, *rl.IMPORTANCE_METHODS)),
            ("correction_level", self.correction_level, rl.IMPORTANCE_LEVELS),
            ("sampler_dtype", self.sampler_dtype, (None, "bfloat16", "float16", "float32")),
            ("sampler_quantization", self.sampler_quantization, (None, *quantization.FORMATS)),
            ("distill_context", self.distill_context, CONTEXTS),
            ("distill_teacher", self.distill_teacher, ("reference", "current")),
        ):
            if value not in allowed:
                raise ValueError(f"RLConfig.{name}={value!r}; expected one of {allowed}")
        if self.credit == "turn" and self.advantage not in ("gae", *rl.TURN_GROUP_ESTIMATORS):
            raise ValueError(
                f"RLConfig.credit='turn' takes advantage='gae' or one of "
                f"{rl.TURN_GROUP_ESTIMATORS}, got {self.advantage!r}"
            )
        if self.staleness < 0 or self.policy_coef < 0 or self.distill_coef < 0:
            raise ValueError("RLConfig.staleness, policy_coef and distill_coef must be >= 0")
        if self.slice_turns and self.advantage == "gae":
            raise ValueError(
                "RLConfig.slice_turns trains one row per turn with group-relative advantages; "
                "with a critic (advantage='gae') use credit='turn' instead"
            )
        if self.policy_coef == 0 and self.distill_coef == 0:
            raise ValueError("RLConfig.policy_coef and distill_coef are both 0: nothing to train")
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
    history: tuple = ()  # the policy's trainable parameters of the last `staleness` steps


def overlong_penalty(lengths, max_length: int, buffer: int) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), in [-1, 0]."""
    if buffer <= 0:
        return np.zeros(np.shape(lengths), np.float32)
    return np.clip(((max_length - buffer) - np.asarray(lengths, np.float32)) / buffer, -1.0, 0.0)


def _session_context(sessions) -> dict:
    """The forward's ``segment_ids`` and ``positions`` for rows whose episodes span sessions
    (`Rollouts.sessions`): each session attends only to itself, from position 0, as the policy
    saw it when sampling; nothing for ordinary rows (None)."""
    if sessions is None:
        return {}
    return {"segment_ids": sessions, "positions": segment_positions(sessions)}


def _sessions(rollouts: Rollouts):
    """``Rollouts.sessions`` when some episode spans sessions, else None (the plain forward)."""
    sessions = rollouts.sessions
    return None if sessions is None or not sessions.any() else jnp.asarray(sessions)


def _policy_loss(config: TransformerConfig, algo: RLConfig, max_length: int, teacher=None):
    """The policy's loss: ``policy_coef`` × `rl.policy_loss`, plus ``distill_coef`` × the
    on-policy self-distillation KL towards the teacher's distributions on the same tokens
    (``teacher`` gives the reference's parameters for a frozen teacher, None for the current
    policy, stop-gradient).  Both aggregate like the policy loss, so their totals add exactly."""
    aggregation = rl.DEFAULT_AGGREGATION[algo.loss_type]

    def loss(params, batch, key):
        sessions = batch.get("sessions")
        z = token_logits(
            params,
            config,
            batch["tokens"],
            temperature=algo.temperature,
            **_session_context(sessions),
        )
        logp, entropy = logprobs_of(z, batch["tokens"], segment_ids=sessions, with_entropy=True)
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
        total, metrics = algo.policy_coef * out.total, dict(out.metrics)
        if algo.distill_coef:
            source = jax.lax.stop_gradient(params) if teacher is None else teacher
            with moe.collect_aux(enabled=False):  # the teacher's routing trains nothing
                teacher_z = token_logits(
                    source, config, batch["teacher_tokens"], temperature=algo.temperature
                )
            aligned = jnp.take_along_axis(teacher_z, batch["teacher_positions"][..., None], 1)
            distill = rl.self_distillation_loss(
                z, jax.lax.stop_gradient(aligned), batch["mask"], aggregation=aggregation
            )
            total = total + algo.distill_coef * distill.total
            metrics["distill_kl"] = distill.total
        return total, out.count, metrics

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
    """The first ``groups`` kept groups of the sampling rounds, padded with dropped ones (masked
    out); when the budget's last round drew fewer than ``groups``, with repeats of them, masked
    out too, so that every step trains on one batch shape."""
    rows = []
    for r, k in zip(parts, keep):
        for g in np.flatnonzero(k):
            rows.append((r, g, True))
    for r, k in zip(parts, keep):
        for g in np.flatnonzero(~k):
            rows.append((r, g, False))
    rows = rows[:groups]
    rows += [
        (r, g, False) for r, g, _ in itertools.islice(itertools.cycle(rows), groups - len(rows))
    ]
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
    env: TextEnv | HostTextEnv
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
    tasks: tuple[Task, ...] = ()  # the env's tasks in bank order (self-distillation's hints)
    reward_model: RewardModel | None = None
    backend: str = "generate"  # rollout backend, see `rollout.collect`

    @property
    def num_tasks(self) -> int:
        return int(np.shape(self.env.default_params.task_weights)[0])

    @property
    def ppo(self) -> bool:
        return self.critic_update is not None

    def policy_params(self, learner: Learner):
        """The parameters the policy runs with (LoRA's adapters merged into the frozen base)."""
        return self.finetune.model_params(learner.policy.params, self.frozen)

    def sampler(self, learner: Learner):
        """``(params, config)`` the sampler runs with: the policy of ``staleness`` updates ago
        (the asynchronous recipe's stale rollouts), in ``sampler_dtype``, its weights quantised
        to ``sampler_quantization``."""
        trainable = learner.history[0] if learner.history else learner.policy.params
        params, config = self.finetune.model_params(trainable, self.frozen), self.config
        if self.algo.sampler_dtype is not None:
            dtype = jnp.dtype(self.algo.sampler_dtype)
            params = jax.tree.map(lambda x: x.astype(dtype), params)
            config = config.replace(dtype=self.algo.sampler_dtype)
        if self.algo.sampler_quantization is not None:
            params = quantization.quantize_params(params, config, self.algo.sampler_quantization)
        return params, config


class Samples(NamedTuple):
    """The episodes a step trains on (``sample``'s result)."""

    rollouts: Rollouts  # prompts_per_step groups of group_size episodes
    row_kept: np.ndarray  # bool [B]: False on the groups dynamic sampling dropped (masked out)
    rounds: int  # sampling rounds drawn
    zero_variance: float  # fraction of the drawn groups whose rewards were all equal
    curriculum: PassRateState | None  # the curriculum after seeing every round
    position: int  # prompts drawn from the permutation stream so far
    seconds: float
    episodes: int  # episodes sampled this step, every round counted
    generated_tokens: int  # policy tokens sampled this step, every round counted


class Scores(NamedTuple):
    """``score``'s result: the rewards the step optimises, and the sampled tokens' log-probs."""

    rewards: np.ndarray  # float32 [B]: the episode reward (combined, shaped)
    old_logp: np.ndarray  # float32 [B, L] under the current policy (the trainer's π_old)
    ref_logp: np.ndarray  # float32 [B, L] under the reference model
    turn_rewards: np.ndarray | None = None  # float32 [B, K] (shaped, with R_eff), credit="turn"
    verifier: np.ndarray | None = None  # float32 [B]: Σ of the env's turn rewards
    model_rewards: np.ndarray | None = None  # float32 [B]: the reward model's, when one is used


def make_setup(
    config: TransformerConfig,
    base,
    env: TextEnv | HostTextEnv,
    algo: RLConfig,
    *,
    steps: int,
    peak_lr: float,
    warmup_steps: int = 0,
    finetune=FullFinetune(),
    curriculum: str | None = None,
    max_response: int | None = None,
    seed: int = 0,
    tasks=(),
    reward_model: RewardModel | None = None,
    backend: str = "generate",
) -> RLSetup:
    """The fixed part of a run, with the policy (and PPO's critic) updates compiled."""
    if curriculum not in CURRICULA:
        raise ValueError(f"train_rl.curriculum={curriculum!r}; expected one of {CURRICULA}")
    if backend not in ROLLOUT_BACKENDS:
        raise ValueError(f"train_rl.backend={backend!r}; expected one of {ROLLOUT_BACKENDS}")
    if algo.distill_coef and not tasks:
        raise ValueError("self-distillation (RLConfig.distill_coef > 0) needs the env's tasks")
    max_turns = int(env.default_params.max_turns)
    max_response = max_response or algo.max_response_length or env.action_length * max_turns
    schedule = make_schedule(
        peak_lr=peak_lr, total_steps=steps, kind="constant", warmup_steps=min(warmup_steps, steps)
    )
    optimizer = make_optimizer(schedule, weight_decay=algo.weight_decay)
    teacher = base if algo.distill_teacher == "reference" else None
    update = make_update(
        _policy_loss(config, algo, max_response, teacher),
        optimizer,
        finetune,
        accum_steps=algo.accum_steps,
        dropout=False,
        router_bias_rate=config.aux_free_bias_rate,
    )
    critic_optimizer = critic_update = None
    if algo.advantage == "gae":
        critic_optimizer = make_optimizer(
            make_schedule(
                peak_lr=algo.critic_lr, total_steps=steps, kind="constant", warmup_steps=0
            ),
            weight_decay=algo.weight_decay,
        )
        critic_update = jax.jit(
            make_update(
                _value_loss(config, algo),
                critic_optimizer,
                accum_steps=algo.accum_steps,
                router_bias_rate=config.aux_free_bias_rate,
            )
        )
    num_tasks = int(np.shape(env.default_params.task_weights)[0])
    return RLSetup(
        config=config,
        algo=algo,
        env=env,
        base=base,
        frozen=finetune.frozen(base),
        finetune=finetune,
        max_response=max_response,
        pass_rate=PassRateFilter(num_tasks) if curriculum == "pass_rate" else None,
        seed=seed,
        optimizer=optimizer,
        critic_optimizer=critic_optimizer,
        update=jax.jit(update),
        critic_update=critic_update,
        logp_fn=jax.jit(
            lambda p, t, s=None: token_logprobs(
                p, config, t, temperature=algo.temperature, **_session_context(s)
            )
        ),
        values_fn=jax.jit(lambda p, t: token_values(p, config, t)),
        tasks=tuple(tasks),
        reward_model=reward_model,
        backend=backend,
    )


def init_learner(setup: RLSetup) -> Learner:
    """The learner before step 1: the policy from the base model (or fresh adapters), PPO's
    critic from the base trunk with a zero head, the curriculum's prior, and a stale sampler's
    history filled with the initial policy."""
    base, seed = setup.base, setup.seed
    critic = None
    if setup.ppo:
        trunk_and_head = {"trunk": base, "head": init_scalar_head(setup.config)}
        critic = TrainState.create(trunk_and_head, setup.critic_optimizer, seed)
    policy = TrainState.create(
        setup.finetune.init(base, jax.random.key(seed)), setup.optimizer, seed
    )
    return Learner(
        policy,
        critic,
        setup.pass_rate.init() if setup.pass_rate else None,
        jnp.int32(0),
        (policy.params,) * setup.algo.staleness,
    )


def sample(setup: RLSetup, learner: Learner, rand: StepRandom) -> Samples:
    """Phase 1: ``prompts_per_step`` groups of ``group_size`` episodes with the sampler's policy
    (`RLSetup.sampler`: the current one unless stale or in another precision).

    Prompts come from the seeded permutation stream (or the pass-rate curriculum).  With DAPO's
    dynamic sampling, groups whose rewards are all equal (zero advantage, no gradient) are
    dropped and more prompts are drawn, up to ``max_sampling_rounds`` rounds; the batch keeps
    its shape, padded with dropped groups that ``row_kept`` masks out.
    """
    algo, env = setup.algo, setup.env
    params, config = setup.sampler(learner)
    sampling = SamplingParams(temperature=algo.temperature)
    parts, keep, varied = [], [], []
    position, curriculum = int(learner.prompt_position), learner.curriculum
    start = time.perf_counter()
    for round_ in range(algo.max_sampling_rounds if algo.dynamic_sampling else 1):
        left = groups_left(algo, position)
        count = algo.prompts_per_step if left is None else min(algo.prompts_per_step, left)
        if count == 0:
            break
        if setup.pass_rate is not None:
            weights = np.asarray(setup.pass_rate.weights(curriculum), np.float64)
            prompts = rand.curriculum_rng(round_).choice(
                setup.num_tasks, count, p=weights / weights.sum()
            )
        else:
            prompts = next_prompts(position, count, setup.num_tasks, setup.seed)
        position += count
        r = collect(
            params,
            config,
            env,
            env.default_params,
            prompts,
            group_size=algo.group_size,
            sampling=sampling,
            key=rand.rollout_key(round_),
            backend=setup.backend,
        )
        if setup.pass_rate is not None:
            curriculum = setup.pass_rate.update(
                curriculum, jnp.asarray(r.task), jnp.asarray(r.success, jnp.float32)
            )
        parts.append(r)
        varied.append(r.group(r.reward, algo.group_size).std(axis=1) > 0)
        keep.append(varied[-1] if algo.dynamic_sampling else np.ones(len(varied[-1]), bool))
        if sum(k.sum() for k in keep) >= algo.prompts_per_step:
            break
    if not parts:
        raise ValueError("the episode budget is spent: no prompts left to sample")
    zero_variance = 1.0 - float(np.concatenate(varied).mean())
    rollouts, row_kept = _select_groups(parts, keep, algo.group_size, algo.prompts_per_step)
    return Samples(
        rollouts,
        row_kept,
        len(parts),
        zero_variance,
        curriculum,
        position,
        time.perf_counter() - start,
        sum(r.sample_counts["episodes"] for r in parts),
        sum(r.sample_counts["generated_tokens"] for r in parts),
    )


def groups_left(algo: RLConfig, position: int) -> int | None:
    """Groups of episodes ``RLConfig.episode_budget`` still allows after ``position`` prompts
    were drawn (None: no budget)."""
    if algo.episode_budget is None:
        return None
    return max(algo.episode_budget // algo.group_size - position, 0)


def _shaped_turn_rewards(rollouts: Rollouts, algo: RLConfig) -> np.ndarray:
    """The env's turn rewards with potential-based shaping: r_k + γ·Φ(s_{k+1}) − Φ(s_k) with
    Φ = ``shaping_coef`` × milestones reached (0 at the start, and after the last turn, so the
    episode's return changes by −Φ(s_0) = 0: the ranking of episodes, and the optimal policy, stay
    as they are).  Ng, Harada & Russell (1999), "Policy invariance under reward transformations"."""
    if not algo.shaping_coef:
        return rollouts.turn_rewards
    potential = algo.shaping_coef * rollouts.milestones * rollouts.turn_mask
    before = np.concatenate([np.zeros_like(potential[:, :1]), potential[:, :-1]], axis=1)
    discount = algo.turn_gamma * (1 - rollouts.last_turn)
    shaped = jax.vmap(rl.potential_shaping)(
        jnp.asarray(rollouts.turn_rewards),
        jnp.asarray(discount, jnp.float32),
        jnp.asarray(before, jnp.float32),
        jnp.asarray(potential, jnp.float32),
    )
    return np.asarray(shaped) * rollouts.turn_mask


def score(setup: RLSetup, learner: Learner, samples: Samples) -> Scores:
    """Phase 2: the rewards the step optimises and the log-probs of the sampled tokens.

    The verifier's reward of an episode is the sum of its turn rewards (the answer's verifier
    reward, plus what tool turns earned: `TurnRewards`).  With a reward model it is combined with
    the model's reward (`RewardModel.episode_rewards`) by ``rl.combine_rewards`` (a weighted sum,
    or GDPO: each normalised within its group first).  Then DAPO's soft overlong penalty
    ``clip(((L_max − L_buffer) − L) / L_buffer, −1, 0)`` (Yu et al. 2025), the efficiency term
    R_eff (``rl.efficiency_penalty``: fewer calls and tokens for the same success) and, when the
    KL goes into the reward, ``−kl_coef · Σ_t (log π_old − log π_ref)``.  ``old_logp`` is
    recomputed under the current policy (no dropout, so the first ratio is 1), ``ref_logp`` under
    the frozen reference.  For turn-level credit, the turn rewards are shaped
    (`_shaped_turn_rewards`) and carry the episode's extra terms on its last turn.
    """
    algo, rollouts = setup.algo, samples.rollouts
    tokens = jnp.asarray(rollouts.tokens)
    sessions = _sessions(rollouts)
    old_logp = np.asarray(setup.logp_fn(setup.policy_params(learner), tokens, sessions))
    ref_logp = np.asarray(setup.logp_fn(setup.base, tokens, sessions))
    verifier = (rollouts.turn_rewards * rollouts.turn_mask).sum(axis=1).astype(np.float32)
    rewards, model_rewards = verifier, None
    if setup.reward_model is not None:
        model_rewards = setup.reward_model.episode_rewards(
            rollouts.tokens, rollouts.loss_mask, aggregation=algo.step_aggregation
        )
        stacked = np.stack([verifier, model_rewards], axis=-1).reshape(-1, algo.group_size, 2)
        rewards = np.asarray(
            rl.combine_rewards(
                jnp.asarray(stacked),
                jnp.asarray(algo.reward_weights, jnp.float32),
                method=algo.reward_combination,
            )
        ).reshape(-1)
    extra = overlong_penalty(rollouts.response_length, setup.max_response, algo.overlong_buffer)
    extra = extra + np.asarray(
        rl.efficiency_penalty(
            jnp.asarray(rollouts.success),
            jnp.asarray(rollouts.tool_calls),
            jnp.asarray(rollouts.response_length),
            per_call=algo.efficiency_per_call,
            per_token=algo.efficiency_per_token,
        )
    )
    if algo.kl_coef and algo.kl_in_reward:
        extra = extra - algo.kl_coef * np.sum((old_logp - ref_logp) * rollouts.loss_mask, axis=1)
    rewards = (rewards + extra).astype(np.float32)
    turn_rewards = None
    if algo.credit == "turn":
        turn_rewards = (
            _shaped_turn_rewards(rollouts, algo) + rollouts.last_turn * extra[:, None]
        ).astype(np.float32)
    return Scores(rewards, old_logp, ref_logp, turn_rewards, verifier, model_rewards)


def advantages(
    setup: RLSetup, learner: Learner, samples: Samples, scores: Scores
) -> tuple[dict, dict | None, dict]:
    """Phase 3: the policy's training batch, PPO's critic batch (or None) and the step's
    off-policy metrics.

    Credit ``"episode"``: group-relative advantages (``rl.group_advantages``) over the kept
    groups, or, for PPO, token-level GAE (``rl.token_gae``, the reward on each episode's last
    policy token) from the critic, whitened over the batch.  Credit ``"turn"``: each turn's
    return G_k = Σ_{j≥k} γ^{j−k} r_j (``rl.turn_returns``), normalised per turn within its group
    (``rl.turn_group_advantages``), or GAE over turns from the critic's value of each turn's
    first token (``rl.token_gae`` on the turn axis); each token gets its turn's advantage
    (``rl.spread_over_turns``).  With ``slice_turns`` every turn becomes a row of its own
    (``rl.slice_turns``).  With a ``correction``, the advantages are multiplied by the
    importance weights of the current policy over the sampler (``rl.importance_weights``: TIS
    or MIS, per token or sequence), which corrects a sampler that lags or runs in another
    precision.  Self-distillation adds the teacher's transcripts (`privileged.teacher_rows`).
    """
    algo, rollouts = setup.algo, samples.rollouts
    tokens = jnp.asarray(rollouts.tokens)
    mask = jnp.asarray(rollouts.loss_mask * samples.row_kept[:, None], jnp.int32)
    length = tokens.shape[1]
    critic_batch = None
    if algo.credit == "episode" and not setup.ppo:
        adv = jnp.asarray(
            _group_advantages(scores.rewards, rollouts.response_length, samples.row_kept, algo)
        )
    elif algo.credit == "episode":
        old_values = setup.values_fn(learner.critic.params, tokens)
        last_token = jnp.max(jnp.where(mask > 0, jnp.arange(length), 0), axis=1)
        token_rewards = (
            jnp.zeros(mask.shape, jnp.float32)
            .at[jnp.arange(mask.shape[0]), last_token]
            .set(jnp.asarray(scores.rewards))
        )
        token_adv, returns = rl.token_gae(
            token_rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam
        )
        adv = rl.masked_whiten(token_adv, mask)
        critic_batch = {
            "tokens": tokens,
            "mask": mask,
            "old_values": old_values,
            "returns": returns,
        }
    else:
        turn_mask = jnp.asarray(rollouts.turn_mask * samples.row_kept[:, None], jnp.int32)
        turn_rewards = jnp.asarray(scores.turn_rewards)
        spans = jnp.asarray(rollouts.turn_spans)
        if setup.ppo:
            old_values = setup.values_fn(learner.critic.params, tokens)
            # The value of each turn: the critic's at the state the turn starts from.
            turn_values = jnp.take_along_axis(old_values, spans[..., 0], axis=1)
            turn_adv, turn_ret = rl.token_gae(
                turn_rewards, turn_values, turn_mask, gamma=algo.turn_gamma, lam=algo.lam
            )
            turn_adv = rl.masked_whiten(turn_adv, turn_mask)
            starts = jax.nn.one_hot(spans[..., 0], length) * turn_mask[..., None]  # [B, K, T]
            critic_batch = {
                "tokens": tokens,
                "mask": jnp.sum(starts, axis=1).astype(jnp.int32),
                "old_values": old_values,
                "returns": jnp.einsum("bkt,bk->bt", starts, turn_ret),
            }
        else:
            returns = rl.turn_returns(turn_rewards, turn_mask, gamma=algo.turn_gamma)
            groups = (-1, algo.group_size, returns.shape[1])
            turn_adv = rl.turn_group_advantages(
                returns.reshape(groups), turn_mask.reshape(groups), estimator=algo.advantage
            ).reshape(returns.shape)
        adv = rl.spread_over_turns(turn_adv, spans, length)
    batch = {"tokens": tokens, "mask": mask, "old_logp": jnp.asarray(scores.old_logp)}
    if (sessions := _sessions(rollouts)) is not None:
        batch["sessions"] = sessions
    if algo.kl_coef and not algo.kl_in_reward:
        batch["ref_logp"] = jnp.asarray(scores.ref_logp)
    off_policy = {}
    if algo.correction is not None:
        weights, off_policy = rl.importance_weights(
            batch["old_logp"],
            jnp.asarray(rollouts.behaviour_logp),
            mask,
            method=algo.correction,
            level=algo.correction_level,
            cap=algo.correction_cap,
        )
        adv = (adv if adv.ndim == 2 else adv[:, None]) * weights
        off_policy = {k: float(v) for k, v in off_policy.items()}
    batch["advantages"] = adv
    if algo.distill_coef:
        bank = setup.env.default_params.tasks if isinstance(setup.env, TextEnv) else None
        prompt_length = (
            np.asarray(bank.prompt_length)[rollouts.task]
            if bank is not None
            else np.array([len(setup.env.prompts[t]) for t in rollouts.task])
        )
        teacher, positions = teacher_rows(
            rollouts.tokens,
            rollouts.length,
            prompt_length,
            [setup.tasks[t] for t in rollouts.task],
            scores.verifier,
            setup.env.tokenizer,
            context=algo.distill_context,
            width=length + TEACHER_HINT_TOKENS,
        )
        batch["teacher_tokens"], batch["teacher_positions"] = (
            jnp.asarray(teacher),
            jnp.asarray(positions),
        )
    if algo.slice_turns:
        batch = _slice(batch, rollouts, samples.row_kept)
    return batch, critic_batch, off_policy


TEACHER_HINT_TOKENS = 96  # room the teacher's transcripts get for the privileged hint


def _slice(batch: dict, rollouts: Rollouts, row_kept) -> dict:
    """Trajectory slicing: row ``b·K + k`` is turn k of episode b, masked to that turn's tokens,
    with the turn's advantage (its token advantages as computed, for episode-level credit)."""
    turns = rollouts.turn_mask.shape[1]
    masks = rl.slice_turns(
        jnp.asarray(rollouts.turn_spans),
        jnp.asarray(rollouts.turn_mask * row_kept[:, None]),
        batch["tokens"].shape[1],
    )
    sliced = {k: jnp.repeat(v, turns, axis=0) for k, v in batch.items()}
    sliced["mask"] = (masks * sliced["mask"]).astype(jnp.int32)
    adv = sliced["advantages"]
    if adv.ndim == 1:
        sliced["advantages"] = jnp.broadcast_to(adv[:, None], sliced["mask"].shape)
    return sliced


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
    samples: Samples,
    scores: Scores,
    updates: list[dict],
    *,
    training_seconds: float,
    off_policy: dict | None = None,
    group_size: int = 1,
) -> dict:
    """Phase 5: the step's record in ``metrics.jsonl``: rewards and success of the sampled
    episodes (the verifier's and a reward model's apart, so reward hacking shows), per-token
    means of the updates' metrics (entropy, approximate KL, clip fractions, self-distillation
    KL), lengths, tool calls, sampling statistics, the off-policy mismatch, the stability
    signals of ``monitors.step_diagnostics``, and generation vs training time."""
    rollouts = samples.rollouts
    tokens_seen = max(sum(float(m["tokens"]) for m in updates), 1.0)

    def token_mean(name):
        return sum(float(m[name]) for m in updates) / tokens_seen

    kept = rollouts.reward[samples.row_kept]
    record = {
        "loss": float(np.mean([m["loss"] for m in updates])),
        **router_metrics(*updates),
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
        # a group of one has no spread to lack (PPO with a critic): not reported
        **({"zero_variance_groups": samples.zero_variance} if group_size > 1 else {}),
        "sampling_rounds": samples.rounds,
        "episodes": samples.episodes,
        "generated_tokens": samples.generated_tokens,
        "episodes_total": samples.position * group_size,
        "grad_norm": float(np.mean([m["grad_norm"] for m in updates])),
        "generation_seconds": samples.seconds,
        "training_seconds": training_seconds,
    }
    if scores.verifier is not None:
        record["verifier_reward_mean"] = float(scores.verifier.mean())
    if scores.model_rewards is not None:
        record["model_reward_mean"] = float(scores.model_rewards.mean())
    if scores.turn_rewards is not None:
        record["turn_reward_mean"] = float(
            scores.turn_rewards.sum() / max(rollouts.turn_mask.sum(), 1)
        )
    if "distill_kl" in updates[0]:
        record["distill_kl"] = token_mean("distill_kl")
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
    record.update(off_policy or {})
    if group_size > 1:
        record.update(_diagnostics(rollouts, scores, group_size))
    return record


def _diagnostics(rollouts: Rollouts, scores: Scores, group_size: int) -> dict:
    """``monitors.step_diagnostics`` of the step's episodes."""
    prompts, responses, answers = [], [], []
    for row in range(rollouts.tokens.shape[0]):
        n = int(rollouts.length[row])
        policy = rollouts.loss_mask[row, :n] > 0
        first = int(np.argmax(policy)) if policy.any() else n
        prompts.append(rollouts.tokens[row, :first])
        responses.append(rollouts.tokens[row, :n][policy])
        last = rollouts.turn_spans[row, max(int(rollouts.turns[row]) - 1, 0)]
        answers.append(tuple(rollouts.tokens[row, last[0] : last[1]].tolist()))
    return step_diagnostics(
        rewards=scores.rewards,
        lengths=rollouts.response_length,
        group_size=group_size,
        answers=[str(a) for a in answers],
        prompt_ids=prompts,
        response_ids=responses,
    )


def rl_step(setup: RLSetup, learner: Learner, step: int) -> tuple[Learner, dict]:
    """One step: sample → score → advantages → learn → summarize.  A function of the learner
    and ``(setup.seed, step)`` alone (:class:`StepRandom`)."""
    rand = StepRandom(setup.seed, step)
    samples = sample(setup, learner, rand)
    start = time.perf_counter()
    scores = score(setup, learner, samples)
    batch, critic_batch, off_policy = advantages(setup, learner, samples, scores)
    policy, critic, updates = learn(setup, learner, batch, critic_batch, rand)
    record = summarize(
        samples,
        scores,
        updates,
        training_seconds=time.perf_counter() - start,
        off_policy=off_policy,
        group_size=setup.algo.group_size,
    )
    return next_learner(learner, policy, critic, samples), {"step": step, **record}


def next_learner(
    learner: Learner, policy: TrainState, critic: TrainState | None, samples: Samples
) -> Learner:
    """The learner after a step that drew ``samples`` and trained ``policy`` (and ``critic``):
    the curriculum and the prompt position move on, the stale sampler's history by one update."""
    history = (*learner.history[1:], learner.policy.params) if learner.history else ()
    return Learner(policy, critic, samples.curriculum, jnp.int32(samples.position), history)


# ----------------------------------------------------------------------------- the trainer
def run_steps(
    workdir: str,
    setup: RLSetup,
    step: Callable[[Learner, int], tuple[Learner, dict]],
    heldout_env: TextEnv | HostTextEnv,
    tokenizer,
    *,
    meta: dict,
    steps: int,
    eval_every: int,
    eval_samples: int,
    checkpoint_every: int,
    monitor: MonitorConfig,
    progress: bool,
    desc: str,
    budget_left: Callable[[Learner], int | None] = lambda learner: None,
) -> dict:
    """The run of every RL trainer in ``workdir``: from its latest checkpoint (or a fresh
    learner, with ``meta`` to check a resumed run against) to step ``steps``, then the model.

    Each step's record goes through the stability ``monitor`` (its alarms are printed and
    recorded; its history is checkpointed in ``meta`` so a resumed run raises what an
    uninterrupted one would), gains held-out results on ``heldout_env`` (greedy success, pass@k
    of ``eval_samples``, written as ``eval_*``) every ``eval_every`` steps, at the end and
    before the first step, and is written before the checkpoint, so a kill between the two
    repeats the step exactly.  The loop ends early when ``budget_left`` (the groups an episode
    budget still allows) reaches 0, and raises `RLStopped` after saving when an alarm the
    monitor stops on fires.  Returns the last record."""
    run = TrainerRun(workdir)
    learner, meta, start = run.start(init_learner(setup), meta)
    saved = meta.pop("monitor", None)
    monitor_ = (
        StabilityMonitor(monitor) if saved is None else StabilityMonitor.from_state(monitor, saved)
    )

    def held_out(at: int) -> dict:
        result = evaluate_policy(
            setup.policy_params(learner),
            setup.config,
            heldout_env,
            samples=eval_samples,
            key=jax.random.key(setup.seed + 1),
        )
        return {"step": at, **{f"eval_{k}": v for k, v in result.summary().items()}}

    last = {}
    if eval_every and start == 0:
        last = held_out(0)
        run.write(last)
    with tqdm(total=steps, initial=start, disable=not progress, unit="step", desc=desc) as bar:
        for n in range(start + 1, steps + 1):
            if budget_left(learner) == 0:
                break  # a resumed run whose budget was spent
            learner, last = step(learner, n)
            final = n == steps or budget_left(learner) == 0
            alarms = monitor_.observe(last)
            if alarms:
                last["alarms"] = [a.name for a in alarms]
                for alarm in alarms:
                    bar.write(f"step {n}: alarm {alarm.name}: {alarm.message}")
            if eval_every and (n % eval_every == 0 or final):
                last.update(held_out(n))
                bar.write(f"step {n}: held-out success {last['eval_success']:.3f}")
            run.write(last)
            bar.update(1)
            bar.set_postfix(
                reward=f"{last['reward_mean']:.3f}", success=f"{last['success_rate']:.2f}"
            )
            stop = monitor_.should_stop(alarms)
            if stop is not None or n % checkpoint_every == 0 or final:
                run.save(n, learner, {**meta, "monitor": monitor_.state()})
            if stop is not None:
                raise RLStopped(stop)
            if final:
                break
    run.finish(setup.config, setup.finetune.merged(learner.policy.params, setup.frozen), tokenizer)
    return last


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
    reward_model: str | None = None,
    backend: str = "generate",
    host_tools: bool = False,
    monitor: MonitorConfig = MonitorConfig(),
) -> dict:
    """RL-trains the model of run ``init_from`` on ``tasks``' train problems; saves ``workdir/model``.

    The reference model for KL is ``init_from``'s model.  ``eval_every`` > 0 evaluates held-out
    success (greedy) and pass@k (``eval_samples`` samples) every that many steps and at the end.
    ``reward_model``: a ``train_reward_model`` run whose model scores the episodes beside the
    verifier (`RLConfig.reward_weights`).  ``backend``: how rollouts decode (`rollout.collect`).
    ``host_tools``: episodes run in the host-side twin of the env (`TaskSpec.host_env`), whose
    tools run in Python: the sandbox, any ``@tool`` function.  ``monitor``: the stability alarms
    (`monitors.MonitorConfig`); an alarm it names in ``stop_on`` ends the run with `RLStopped`
    after the step is written and checkpointed.
    """
    config, base, tokenizer = load_checkpoint(init_from)
    if config.max_seq_len < tasks.context_length:
        raise ValueError(
            f"the model's max_seq_len={config.max_seq_len} < the tasks' context length "
            f"{tasks.context_length} (TaskSpec.max_length + action_length)"
        )
    scorer = None if reward_model is None else load_reward_model(reward_model)
    if scorer is not None and scorer.tokenizer.fingerprint != tokenizer.fingerprint:
        raise ValueError(
            f"the reward model {reward_model} was trained with another tokenizer than "
            f"{init_from}; it must score the policy's own token ids"
        )
    make_env = tasks.host_env if host_tools else tasks.env
    env, heldout_env = make_env(tokenizer, "train"), make_env(tokenizer, "heldout")
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
        tasks=tasks.tasks("train") if algorithm.distill_coef else (),
        reward_model=scorer,
        backend=backend,
    )
    return run_steps(
        workdir,
        setup,
        lambda learner, step: rl_step(setup, learner, step),
        heldout_env,
        tokenizer,
        meta={"init_from": init_from, "reference": tree_fingerprint(base)},
        steps=steps,
        eval_every=eval_every,
        eval_samples=eval_samples,
        checkpoint_every=checkpoint_every,
        monitor=monitor,
        progress=progress,
        desc=f"rl {algorithm.loss_type}",
        budget_left=lambda learner: groups_left(algorithm, int(learner.prompt_position)),
    )
