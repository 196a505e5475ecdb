"""Preference optimisation, offline or online, for every loss of ``rl.preference_loss``.

A step trains on ``prompts_per_step`` pairs ``(x, y_w, y_l)`` of one prompt's preferred and
dispreferred completions with the chosen ``loss_type`` (DPO, Rafailov et al. 2023,
arXiv:2305.18290: ``−log σ(β·[(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))])``;
IPO, SimPO, ORPO, KTO-pair and the rest, each with its formula in ``rl/preference.py``), where
``log π(y)`` sums the policy's log-probabilities over the completion's (assistant) tokens.

* **Offline**: the pairs are each train task's demonstration (chosen) against its corrupted
  twin (rejected: a wrong final answer), or a file's (``pairs_file``), visited in a fresh
  seeded order every epoch.  The reference model (``init_from``'s, frozen) gives its log-probs
  once for the whole set (``precompute_reference``) or batch by batch; reference-free losses
  (simpo, orpo, cpo, alphapo) need none.
* **KTO** (Ethayarajh et al. 2024, arXiv:2402.01306): ``loss_type="kto"`` trains on a file of
  unpaired completions each labelled desirable or not (``unpaired_file``) with `UnpairedObjective`
  through the same loop and update: the batch's KL reference point comes from each prompt
  continued by the previous record's completion (``pairs.unpaired_rows``).
* **Online** (online DPO; Guo et al. 2024, "Direct Language Model Alignment from Online AI
  Feedback", arXiv:2402.04792; Xu et al. 2023, iterative/self-rewarding DPO): each step samples
  ``samples_per_prompt`` episodes of each prompt with the current policy in the task's
  environment (``rollout.collect``: multi-turn tool use included), ranks them by the verifier's
  reward or by a reward model (``reward_model``, a `train_reward_model` run) and trains on the
  best against the worst.  Prompts whose samples all score the same carry no preference and
  are skipped (``tied_prompts`` records the fraction); the reference log-probs of the fresh
  pairs are computed each step.

Metrics per step use TRL's names: ``rewards/chosen``, ``rewards/rejected`` (implicit rewards
``β·(log π − log π_ref)``, or ``β·log π/|y|`` without a reference), ``rewards/accuracies``,
``rewards/margins``, ``logps/chosen``, ``logps/rejected``; online also the sampled reward,
success rate and generation vs training seconds.  Rows are padded to ``TaskSpec.max_length``,
so the jitted update compiles once.  A checkpoint holds the trainable parameters, optimizer
state, RNG and the pair/prompt position, and its metadata the reference model's fingerprint:
a resumed run repeats the steps of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

import gin
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from agentic_jax.envs.text import TextEnv
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models import TransformerConfig
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.common import (
    next_prompts,
    sequence_logprobs,
    tree_fingerprint,
)
from agentic_jax.post_training.pairs import (
    Progress,
    best_worst,
    evaluate_loss,
    map_rows,
    pair_splits,
    sampled_pairs,
    take,
    task_pairs,
)
from agentic_jax.post_training.reward import RewardModel, load_reward_model
from agentic_jax.post_training.rollout import collect
from agentic_jax.post_training.runner import TrainerRun
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.rl import (
    KTO_LOSSES,
    REFERENCE_FREE_LOSSES,
    kto_loss,
    kto_reference_point,
    preference_loss,
    preference_metrics,
)
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.update import FullFinetune, make_update, router_metrics

# Per-pair statistics the loss reports (weighted sums in a batch), and their logged names.
STAT_NAMES = {
    "chosen_reward": "rewards/chosen",
    "rejected_reward": "rewards/rejected",
    "correct": "rewards/accuracies",
    "margin": "rewards/margins",
    "chosen_logp": "logps/chosen",
    "rejected_logp": "logps/rejected",
}


@dataclasses.dataclass(frozen=True)
class PairObjective:
    """``rl.preference_loss`` with fixed settings; ``options`` are its other keyword arguments
    (``simpo_gamma``, ``nll_coef``, ``f_divergence``, ...).  Settings are checked on creation."""

    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    options: tuple[tuple[str, Any], ...] = ()
    rows: ClassVar = ("chosen", "rejected")  # the batch's two row sets, as `completion_logps` reads
    labels: ClassVar = ()  # further per-row batch entries the loss reads
    stat_names: ClassVar = STAT_NAMES

    def __post_init__(self):
        object.__setattr__(self, "options", tuple(sorted(dict(self.options).items())))
        pair = jax.ShapeDtypeStruct((2,), jnp.float32)
        # raises on a bad setting, before any work (nothing runs)
        jax.eval_shape(self, *[pair] * (6 + len(self.labels)))

    @property
    def needs_reference(self) -> bool:
        return self.loss_type not in REFERENCE_FREE_LOSSES

    def __call__(
        self, chosen, rejected, ref_chosen, ref_rejected, chosen_lengths, rejected_lengths
    ):
        """``(losses [B], stats)`` from summed completion log-probs ``[B]`` (refs None when
        reference-free); ``stats`` are per pair ``[B]``, keyed as in ``STAT_NAMES``."""
        if not self.needs_reference:
            ref_chosen = ref_rejected = None
        losses = preference_loss(
            chosen,
            rejected,
            ref_chosen,
            ref_rejected,
            loss_type=self.loss_type,
            beta=self.beta,
            label_smoothing=self.label_smoothing,
            chosen_lengths=chosen_lengths,
            rejected_lengths=rejected_lengths,
            **dict(self.options),
        )
        implicit = preference_metrics(
            chosen,
            rejected,
            ref_chosen,
            ref_rejected,
            beta=self.beta,
            chosen_lengths=chosen_lengths,
            rejected_lengths=rejected_lengths,
        )
        stats = {
            "chosen_reward": implicit["chosen_rewards"],
            "rejected_reward": implicit["rejected_rewards"],
            "correct": implicit["accuracies"],
            "margin": implicit["margins"],
            "chosen_logp": jax.lax.stop_gradient(chosen),
            "rejected_logp": jax.lax.stop_gradient(rejected),
        }
        return losses, stats


@dataclasses.dataclass(frozen=True)
class UnpairedObjective(PairObjective):
    """KTO (Ethayarajh et al. 2024, arXiv:2402.01306) on an unpaired batch (`pairs.unpaired_rows`):
    ``rl.kto_loss`` of each labelled completion, ``λ_D·(1 − σ(β(ρ − z₀)))`` if desirable, else
    ``λ_U·(1 − σ(β(z₀ − ρ)))`` with ``ρ = log π(y|x) − log π_ref(y|x)``; the reference point
    ``z₀ = sg(max(0, mean(log π − log π_ref)))`` is the batch's estimate of KL(π ‖ π_ref) from its
    mismatched rows (``rl.kto_reference_point``).  ``options``: ``desirable_weight`` (λ_D),
    ``undesirable_weight`` (λ_U).  ``loss_type`` ``apo_zero_unpaired`` (APO-zero) needs no z₀."""

    loss_type: str = "kto"
    rows: ClassVar = ("completion", "mismatched")
    labels: ClassVar = ("desirable",)
    stat_names: ClassVar = {
        "margin": "rewards/margins",  # ±β(ρ − z₀), + for desirable rows
        "correct": "rewards/accuracies",  # the sign agrees with the label
        "kl": "kl",  # z₀
        "logp": "logps/completion",
    }

    @property
    def needs_reference(self) -> bool:
        return True

    def __call__(self, logps, kl_logps, ref_logps, ref_kl_logps, lengths, kl_lengths, desirable):
        """``(losses [B], stats)`` from summed completion log-probs ``[B]`` of the labelled and the
        mismatched rows and the labels ``desirable [B]``; ``stats`` keyed as ``stat_names``."""
        del lengths, kl_lengths
        if self.label_smoothing:
            raise ValueError(f"loss_type={self.loss_type!r} has no label_smoothing")
        z0 = kto_reference_point(kl_logps, ref_kl_logps)
        losses = kto_loss(
            logps,
            ref_logps,
            desirable,
            loss_type=self.loss_type,
            beta=self.beta,
            reference_point=z0,
            **dict(self.options),
        )
        sign = 2.0 * jnp.asarray(desirable, jnp.float32) - 1.0
        margin = jax.lax.stop_gradient(sign * self.beta * (logps - ref_logps - z0))
        stats = {
            "margin": margin,
            "correct": (margin > 0).astype(jnp.float32),
            "kl": jnp.broadcast_to(z0, logps.shape),
            "logp": jax.lax.stop_gradient(logps),
        }
        return losses, stats


def objective_for(
    loss_type: str, beta: float, label_smoothing: float, options: dict | None
) -> PairObjective:
    """The objective of ``loss_type``: `UnpairedObjective` for KTO's losses, else `PairObjective`."""
    kind = UnpairedObjective if loss_type in KTO_LOSSES else PairObjective
    return kind(loss_type, beta, label_smoothing, tuple((options or {}).items()))


def completion_logps(
    params, config: TransformerConfig, batch, rows: tuple[str, str] = PairObjective.rows
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(first, second, first_lengths, second_lengths)``, summed log-probs and lengths of the
    batch's two row sets ``rows`` (a pair's chosen and rejected), one forward pass."""
    tokens = jnp.concatenate([batch[rows[0]], batch[rows[1]]])
    mask = jnp.concatenate([batch[f"{rows[0]}_mask"], batch[f"{rows[1]}_mask"]])
    logps, lengths = sequence_logprobs(params, config, tokens, mask)
    return (*jnp.split(logps, 2), *jnp.split(lengths, 2))


def pair_loss(config: TransformerConfig, objective: PairObjective):
    """``loss(params, batch, key) -> (Σ w·loss, Σ w, weighted stat sums)`` over a pair batch
    (the objective's ``rows`` and ``labels``) with ``weight``s and, for reference-based losses,
    ``ref_<row>`` of both rows (``ref_chosen`` / ``ref_rejected``)."""

    def loss(params, batch, key):
        del key
        first, second, *lengths = completion_logps(params, config, batch, objective.rows)
        refs = (
            tuple(batch[f"ref_{row}"] for row in objective.rows)
            if objective.needs_reference
            else (None, None)
        )
        labels = [batch[label] for label in objective.labels]
        losses, stats = objective(first, second, *refs, *lengths, *labels)
        weight = batch["weight"]
        return (
            jnp.sum(weight * losses),
            jnp.sum(weight),
            {k: jnp.sum(weight * v) for k, v in stats.items()},
        )

    return loss


def describe(loss, count, sums, prefix: str = "", names=STAT_NAMES) -> dict[str, float]:
    """Logged means (``loss`` and the stats ``names``) from a loss's count and stat sums."""
    count = max(float(count), 1e-9)
    return {
        f"{prefix}loss": float(loss),
        **{f"{prefix}{name}": float(sums[key]) / count for key, name in names.items()},
    }


def sample_pairs(
    params,
    config: TransformerConfig,
    env: TextEnv,
    prompts,
    *,
    samples_per_prompt: int,
    sampling: SamplingParams,
    key,
    ranker: RewardModel | None = None,
) -> tuple[dict | None, dict]:
    """Online pairs: ``samples_per_prompt`` episodes of each of ``prompts`` (bank rows of ``env``)
    with the policy ``params``, ranked by the verifier's reward or ``ranker``'s scores, and the
    best against the worst of each prompt (``pairs.sampled_pairs``; None when all tie).

    Also returns the sampling metrics: the verifier's ``reward_mean`` and ``success_rate``,
    ``response_length``, ``tied_prompts`` (the fraction skipped), the trained pairs' mean
    ``chosen_score`` / ``rejected_score``, ``generation_seconds``, and the ``episodes`` and
    ``generated_tokens`` sampled.
    """
    rollouts = collect(
        params,
        config,
        env,
        env.default_params,
        prompts,
        group_size=samples_per_prompt,
        sampling=sampling,
        key=key,
    )
    scores = (
        rollouts.reward if ranker is None else ranker.scores(rollouts.tokens, rollouts.loss_mask)
    )
    batch = sampled_pairs(rollouts.tokens, rollouts.loss_mask, scores, samples_per_prompt)
    metrics = {
        "reward_mean": float(rollouts.reward.mean()),
        "success_rate": float(rollouts.success.mean()),
        "response_length": float(rollouts.response_length.mean()),
        "tied_prompts": 1.0
        - float(np.mean(best_worst(np.reshape(scores, (-1, samples_per_prompt)))[2])),
        "generation_seconds": rollouts.generation_seconds,
        **rollouts.sample_counts,
    }
    if batch is not None:
        metrics.update(
            chosen_score=float(np.mean(batch.pop("chosen_score"))),
            rejected_score=float(np.mean(batch.pop("rejected_score"))),
        )
    return batch, metrics


@gin.configurable
def train_preference(
    workdir: str,
    *,
    init_from: str,
    tasks: TaskSpec = TaskSpec(),
    pairs_file: str | None = None,
    heldout_pairs_file: str | None = None,
    unpaired_file: str | None = None,
    heldout_unpaired_file: str | None = None,
    loss_type: str = "sigmoid",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_options: dict | None = None,
    online: bool = False,
    samples_per_prompt: int = 4,
    prompts_per_step: int = 8,
    steps: int = 100,
    peak_lr: float = 1e-5,
    warmup_steps: int = 0,
    precompute_reference: bool = True,
    reward_model: str | None = None,
    temperature: float = 1.0,
    finetune=FullFinetune(),
    eval_every: int = 0,
    checkpoint_every: int = 10,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Preference-optimises the model of run ``init_from`` on ``tasks``; saves ``workdir/model``.

    See the module docstring.  ``pairs_file`` (held out: ``heldout_pairs_file``) replaces the
    tasks' offline pairs with a file's (JSONL or Parquet in TRL's preference formats, see
    ``data.datasets``).  ``loss_type`` ``kto`` (or ``apo_zero_unpaired``) trains instead on
    ``unpaired_file``'s labelled completions (TRL's KTO format; held out:
    ``heldout_unpaired_file``) with `UnpairedObjective`, the batch's reference point estimated
    from each prompt continued by the previous record's completion.  ``loss_options`` holds
    further ``rl.preference_loss`` (or ``rl.kto_loss``: ``desirable_weight``, ...) arguments;
    ``online`` samples ``samples_per_prompt`` episodes per prompt at ``temperature`` and ranks
    them by the verifier or by ``reward_model``; ``precompute_reference`` applies offline.
    ``eval_every`` > 0 evaluates the loss and implicit-reward accuracy on the held-out pairs
    every that many steps and at the end.  Resumes from the latest checkpoint in ``workdir``.
    Returns the final metrics.
    """
    objective = objective_for(loss_type, beta, label_smoothing, loss_options)
    unpaired = isinstance(objective, UnpairedObjective)
    if unpaired and (online or pairs_file or heldout_pairs_file):
        raise ValueError(
            f"loss_type={loss_type!r} trains offline on unpaired_file's labelled completions; "
            "drop online, pairs_file and heldout_pairs_file"
        )
    if not unpaired and (unpaired_file or heldout_unpaired_file):
        raise ValueError(
            f"unpaired_file holds KTO's labelled completions: set loss_type to one of {KTO_LOSSES}"
        )
    if unpaired:
        pairs_file, heldout_pairs_file = unpaired_file, heldout_unpaired_file
    if online and samples_per_prompt < 2:
        raise ValueError(
            f"online training ranks samples_per_prompt >= 2 samples, got {samples_per_prompt}"
        )
    if reward_model is not None and not online:
        raise ValueError("reward_model ranks online samples; set online=True or drop reward_model")
    if online and pairs_file is not None:
        raise ValueError("pairs_file holds offline pairs; set online=False or drop pairs_file")
    if eval_every and pairs_file is not None and heldout_pairs_file is None:
        raise ValueError(
            "eval_every > 0 evaluates held-out pairs: set "
            + ("heldout_unpaired_file" if unpaired else "heldout_pairs_file")
        )
    config, base, tokenizer = load_checkpoint(init_from)
    context = tasks.context_length if online else tasks.max_length
    if config.max_seq_len < context:
        raise ValueError(
            f"the model's max_seq_len={config.max_seq_len} < the {context} tokens "
            f"{'a rollout' if online else 'a pair row'} needs (TaskSpec)"
        )
    ranker = load_reward_model(reward_model) if reward_model is not None else None
    if ranker is not None and ranker.tokenizer.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"the reward model's tokenizer ({ranker.tokenizer.vocab_size} tokens) is not the "
            f"policy's ({tokenizer.vocab_size}); train the reward model from the same run"
        )

    reference = jax.jit(
        lambda params, batch: jnp.stack(
            completion_logps(params, config, batch, objective.rows)[:2], axis=1
        )
    )

    def with_reference(batch):
        if not objective.needs_reference:
            return batch
        logps = np.asarray(map_rows(lambda chunk: reference(base, chunk), batch, prompts_per_step))
        return {**batch, **{f"ref_{row}": logps[:, i] for i, row in enumerate(objective.rows)}}

    if online:
        env = tasks.env(tokenizer, "train")
        size = env.default_params.tasks.size
        sampling = SamplingParams(temperature=temperature)
        heldout = task_pairs(tasks, tokenizer, "heldout") if eval_every else None
    else:
        train, heldout = pair_splits(
            tasks, tokenizer, pairs_file, heldout_pairs_file, unpaired=unpaired
        )
        size = len(train["weight"])
        if precompute_reference:
            train = with_reference(train)
    heldout = with_reference(heldout) if eval_every else None

    schedule = make_schedule(
        peak_lr=peak_lr, total_steps=steps, warmup_steps=min(warmup_steps, steps)
    )
    optimizer = make_optimizer(schedule)
    frozen = finetune.frozen(base)
    loss = pair_loss(config, objective)
    update = jax.jit(
        make_update(loss, optimizer, finetune, router_bias_rate=config.aux_free_bias_rate)
    )
    evaluate = jax.jit(loss)
    run = TrainerRun(workdir)
    learner, meta, start = Progress.resume(
        run,
        finetune.init(base, jax.random.key(seed)),
        optimizer,
        seed,
        {
            "init_from": init_from,
            "reference": tree_fingerprint(base),
            "loss_type": loss_type,
            "online": online,
        },
    )
    last = {}
    with tqdm(
        total=steps,
        initial=start,
        disable=not progress,
        unit="step",
        desc=f"preference {loss_type}",
    ) as bar:
        for step in range(start + 1, steps + 1):
            position = int(learner.position)
            rows = next_prompts(position, prompts_per_step, size, seed)
            if online:
                key = jax.random.fold_in(jax.random.wrap_key_data(learner.train.rng), step)
                batch, last = sample_pairs(
                    finetune.model_params(learner.train.params, frozen),
                    config,
                    env,
                    rows,
                    samples_per_prompt=samples_per_prompt,
                    sampling=sampling,
                    key=key,
                    ranker=ranker,
                )
            else:
                batch, last = take(train, rows), {}
            last = {"step": step, **last}
            state = learner.train
            if batch is not None:  # else every prompt tied: nothing to learn this step
                train_start = time.perf_counter()
                if online or not precompute_reference:
                    batch = with_reference(batch)
                state, metrics = update(state, frozen, batch)
                metrics = jax.device_get(metrics)
                last.update(
                    {
                        **describe(
                            metrics["loss"], metrics["count"], metrics, names=objective.stat_names
                        ),
                        "grad_norm": float(metrics["grad_norm"]),
                        "lr": float(schedule(state.step - 1)),
                        "training_seconds": time.perf_counter() - train_start,
                        **router_metrics(metrics),
                    }
                )
            learner = Progress(state, jnp.int32(position + prompts_per_step))
            if eval_every and (step % eval_every == 0 or step == steps):
                held = evaluate_loss(
                    evaluate, finetune.model_params(state.params, frozen), heldout, prompts_per_step
                )
                last.update(describe(*held, prefix="eval_", names=objective.stat_names))
                bar.write(
                    f"step {step}: held-out loss {last['eval_loss']:.4f}, "
                    f"accuracy {last['eval_rewards/accuracies']:.3f}"
                )
            run.write(last)
            bar.update(1)
            if "loss" in last:
                bar.set_postfix(loss=f"{last['loss']:.3f}", margin=f"{last['rewards/margins']:.3f}")
            if step % checkpoint_every == 0 or step == steps:
                run.save(step, learner, meta)
    run.finish(config, finetune.merged(learner.train.params, frozen), tokenizer)
    return last
