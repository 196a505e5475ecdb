"""Rejection-sampling fine-tuning (STaR): sample, keep the verified-correct episodes, SFT on them.

Each round samples ``samples_per_prompt`` episodes of ``prompts_per_round`` train problems with
the current policy (``rollout.collect``), keeps those the verifier marks successful, and runs
``steps_per_round`` SFT updates on the kept transcripts, trained on the policy's own tokens
(the rollout ``loss_mask``: tool calls and answers, not the tool results).  Zelikman et al.
(2022), STaR, arXiv:2203.14465; Yuan et al. (2023), RFT, arXiv:2308.01825.  It is the baseline
the RL trainers must beat: it uses the same samples but learns only from successes.

``sampler`` replaces the policy's own samples with another source of episodes: expert
iteration's search (``reasoning.SearchSampler``, ``configs/expert_iteration.gin``), called as
``sampler(params, config, tokenizer, tasks, prompts, samples_per_prompt, key)`` and returning
rows with the fields of a ``Rollouts`` that a round reads (``tokens``, ``loss_mask``, ``length``,
``success``, ``reward``, ``sample_counts``, ``generation_seconds``).

A checkpoint is written after every round; a run killed mid-round repeats that round from its
start, with the same samples (they depend only on the round's model and seed).
"""

from __future__ import annotations

from collections.abc import Callable

import gin
import jax
import numpy as np
from tqdm.auto import tqdm

from agentic_jax.data.packing import next_token_example
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.common import next_prompts
from agentic_jax.post_training.rollout import collect
from agentic_jax.post_training.runner import TrainerRun
from agentic_jax.post_training.sft import chat_batches, sft_loss
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.state import TrainState
from agentic_jax.training.step import model_batch
from agentic_jax.training.update import FullFinetune, make_update, router_metrics


@gin.configurable
def train_rft(
    workdir: str,
    *,
    init_from: str,
    tasks: TaskSpec = TaskSpec(),
    rounds: int = 4,
    prompts_per_round: int = 64,
    samples_per_prompt: int = 8,
    temperature: float = 1.0,
    steps_per_round: int = 10,
    batch_size: int = 16,
    peak_lr: float = 1e-4,
    finetune=FullFinetune(),
    sampler: Callable | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Rounds of sample -> filter -> SFT from the model of run ``init_from``; saves ``workdir/model``."""
    config, base, tokenizer = load_checkpoint(init_from)
    env = tasks.env(tokenizer, "train")
    num_tasks = env.default_params.tasks.size
    seq_len = tasks.max_length
    frozen = finetune.frozen(base)
    schedule = make_schedule(
        peak_lr=peak_lr, total_steps=rounds * steps_per_round, kind="constant", warmup_steps=0
    )
    optimizer = make_optimizer(schedule)
    update = jax.jit(
        make_update(
            sft_loss(config), optimizer, finetune, router_bias_rate=config.aux_free_bias_rate
        )
    )
    run = TrainerRun(workdir)
    state, meta, start = run.start(
        TrainState.create(finetune.init(base, jax.random.key(seed)), optimizer, seed),
        {"init_from": init_from},
    )
    start_round = start // steps_per_round
    sampling = SamplingParams(temperature=temperature)
    last = {}
    for round_ in tqdm(range(start_round, rounds), disable=not progress, desc="rft", unit="round"):
        params = finetune.model_params(state.params, frozen)
        prompts = next_prompts(round_ * prompts_per_round, prompts_per_round, num_tasks, seed)
        key = jax.random.fold_in(jax.random.key(seed), round_)
        if sampler is None:
            r = collect(
                params,
                config,
                env,
                env.default_params,
                prompts,
                group_size=samples_per_prompt,
                sampling=sampling,
                key=key,
            )
        else:
            r = sampler(params, config, tokenizer, tasks, prompts, samples_per_prompt, key)
        kept = [
            next_token_example(r.tokens[b, : r.length[b]], r.loss_mask[b, : r.length[b]])
            for b in np.flatnonzero(r.success)
        ]
        last = {
            "step": (round_ + 1) * steps_per_round,
            "round": round_ + 1,
            "success_rate": float(r.success.mean()),
            "reward_mean": float(r.reward.mean()),
            "kept": len(kept),
            "generation_seconds": r.generation_seconds,
            **r.sample_counts,
        }
        if kept:
            data = iter(
                chat_batches(kept, seq_len=seq_len, batch_size=batch_size, seed=seed + round_)
            )
            updates = []
            for _ in range(steps_per_round):
                state, metrics = update(state, frozen, model_batch(next(data)))
                updates.append(jax.device_get(metrics))
            last["loss"] = float(np.mean([m["loss"] for m in updates]))
            last.update(router_metrics(*updates))
        else:  # nothing verified this round: no update, the step count still advances
            state = state.replace(step=state.step + steps_per_round)
        run.write(last)
        run.save(last["step"], state, meta)
    run.finish(config, finetune.merged(state.params, frozen), tokenizer)
    return last
