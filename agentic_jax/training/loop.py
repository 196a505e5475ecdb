"""Language-model pretraining: tokenizer -> packed batches -> sharded jit train step -> records.

Everything a restart needs is in the checkpoint (params, optimiser state, step, RNG, data-iterator
position), so a run killed at any point and started again with the same command continues with
exactly the losses it would have had.  The work directory holds::

    config.gin, operative_config.gin   the parsed and the operative gin config
    tokenizer.json                     the tokenizer (trained on first start unless given)
    checkpoints/<step>/                orbax checkpoints (the latest few)
    metrics.jsonl                      one record per step, eval records every ``eval_every``
    tensorboard/                       the same numbers as TensorBoard scalars, with gin
                                       ``MetricsLog.tensorboard = True``
    profile/                           ``jax.profiler`` traces of the ``profile_steps``
    loss_curve.png                     train and held-out loss by step (written at the end)
    model/                             the final parameters and model config (``load_model``)
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import time
from collections.abc import Sequence

import gin
import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

import sharding
from agentic_jax import config as gin_config
from agentic_jax.data.pipeline import heldout_data, train_data
from agentic_jax.data.stats import entropy_of_counts
from agentic_jax.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from agentic_jax.models import TransformerConfig, flops_per_token, init_params
from agentic_jax.models.export import save_model
from agentic_jax.training import distributed
from agentic_jax.training.checkpoint import Checkpointer
from agentic_jax.training.diloco import DiLoCo
from agentic_jax.training.loss_scale import DynamicLossScale
from agentic_jax.training.metrics import MetricsLog, plot_curves, read_metrics
from agentic_jax.training.mfu import peak_flops_per_device
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.pipeline import Pipeline
from agentic_jax.training.state import TrainState
from agentic_jax.training.step import make_eval_step, make_train_step


def prepare_tokenizer(workdir: str, tokenizer_path: str | None) -> Tokenizer:
    """The given tokenizer, else the run's own (trained on the training corpus on first start).

    With several processes only process 0 trains it; the others wait for the file (the work
    directory is shared by all hosts, as the checkpoints must be).
    """
    if tokenizer_path is not None:
        return load_tokenizer(tokenizer_path)
    path = os.path.join(workdir, "tokenizer.json")
    if not os.path.exists(path) and jax.process_index() == 0:
        print(f"training a byte-level BPE tokenizer -> {path}", flush=True)
        train_tokenizer(path)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("tokenizer")
    return load_tokenizer(path)


class StopRequest:
    """Turns SIGTERM and Ctrl-C into a clean stop at a step boundary, with a checkpoint.

    With several processes a stop asked of any one is agreed by all (``agreed``), so no host
    leaves the others waiting in a collective.
    """

    def __init__(self):
        self.requested = False
        self._previous = {
            sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)
        }

    def _handle(self, signum, frame):
        self.requested = True

    def agreed(self) -> bool:
        if jax.process_count() > 1:
            votes = multihost_utils.process_allgather(np.asarray(self.requested))
            self.requested = bool(np.any(votes))
        return self.requested

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _to_global(batch, batch_sharding):
    return {
        k: jax.make_array_from_process_local_data(batch_sharding, np.asarray(v))
        for k, v in batch.items()
    }


def evaluate(
    eval_step, params, batches, batch_sharding, vocab_size: int, max_batches: int = 0
) -> dict:
    """Mean held-out next-token loss (nats/token) and perplexity over the held-out stream, with
    the unigram entropy of the same targets: the loss of the best context-free model, which a
    language model must beat to be using context."""
    nll, count, targets = 0.0, 0.0, []
    for i, batch in enumerate(batches):
        if max_batches and i >= max_batches:
            break
        total, n = eval_step(params, _to_global(batch, batch_sharding))
        nll, count = nll + float(total), count + float(n)
        targets.append(np.asarray(batch["targets"])[np.asarray(batch["loss_mask"]) > 0])
    counts = np.bincount(np.concatenate(targets), minlength=vocab_size)
    if jax.process_count() > 1:  # each process saw its own share of the held-out targets
        counts = multihost_utils.process_allgather(counts).sum(axis=0)
    loss = nll / max(count, 1.0)
    return {
        "eval_loss": loss,
        "eval_perplexity": math.exp(min(loss, 50.0)),
        "eval_tokens": count,
        # No held-out target (all masked) has no unigram baseline.
        "heldout_unigram_entropy": entropy_of_counts(counts) if counts.any() else math.nan,
    }


def _save_final_model(workdir: str, model: TransformerConfig, params) -> None:
    """``workdir/model``.  A run extended past its earlier end (the same command with more
    ``steps``) replaces the model that end saved: the new one is written beside it and swapped
    in, so a crash never leaves a half-written ``model`` (in the instant of the swap the whole
    old and new models are ``model.old`` and ``model.new``), and the next run saves again."""
    final = os.path.join(workdir, "model")
    fresh, old = final + ".new", final + ".old"
    primary = jax.process_index() == 0
    if primary:
        shutil.rmtree(fresh, ignore_errors=True)  # a crashed save's leftovers
    multihost_utils.sync_global_devices("final model: clean")
    save_model(fresh, model, params)
    multihost_utils.sync_global_devices("final model: written")  # every process done with it
    if primary:
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(final):
            os.rename(final, old)
        os.rename(fresh, final)
        shutil.rmtree(old, ignore_errors=True)


@gin.configurable
def train(
    workdir: str,
    *,
    model: TransformerConfig = TransformerConfig(),
    tokenizer_path: str | None = None,
    steps: int = 1000,
    batch_size: int = 16,
    seq_len: int = 256,
    accum_steps: int = 1,
    seed: int = 0,
    z_loss: float = 0.0,
    fused_cross_entropy: bool = False,
    qk_clip_threshold: float | None = None,
    diloco: DiLoCo | None = None,
    pipeline: Pipeline | None = None,
    loss_scale: DynamicLossScale | None = None,
    eval_every: int = 100,
    eval_batches: int = 0,
    checkpoint_every: int = 100,
    keep_checkpoints: int = 3,
    log_every: int = 10,
    profile_steps: Sequence[int] = (),
    progress: bool = True,
) -> dict:
    """Trains ``model`` on the shipped corpus (or ``train_data.files``) for ``steps`` updates.

    ``batch_size`` rows of ``seq_len`` tokens per update, split into ``accum_steps`` micro-batches;
    held-out loss every ``eval_every`` steps over ``eval_batches`` batches (0 = all of them);
    a checkpoint every ``checkpoint_every`` steps.  ``z_loss`` adds the PaLM z-loss;
    ``fused_cross_entropy`` never materialises the logits (large vocabularies).
    ``qk_clip_threshold`` caps every head's attention logits by QK-Clip after each step
    (``training.qk_clip``).  ``diloco`` trains by DiLoCo (``training.diloco``): its replicas
    share every batch's rows, and evaluation and saving read the global parameters.
    ``pipeline`` runs the layers as pipeline stages over the mesh's ``stage`` axis
    (``training.pipeline``; ``metrics.jsonl`` records its ``pipeline_bubble``).
    ``loss_scale`` scales the loss dynamically for float16 compute (``model.dtype="float16"``;
    ``training.loss_scale``: overflowing steps are skipped).  ``profile_steps`` (numbered from 1,
    as in ``metrics.jsonl``) run inside a ``jax.profiler`` trace written under ``profile/`` (for
    TensorBoard's profile plugin or Perfetto); consecutive steps share one trace.  Resumes
    from the latest checkpoint in ``workdir``.  Returns the final train and held-out metrics.
    """
    if diloco is not None and loss_scale is not None:
        raise ValueError("train: loss_scale is not supported with diloco")
    outside = [s for s in profile_steps if not 1 <= s <= steps]
    if outside:
        raise ValueError(f"train.profile_steps {outside} are not steps of 1..{steps}")
    if batch_size % jax.process_count():
        raise ValueError(
            f"train.batch_size={batch_size} must divide by the {jax.process_count()} "
            "processes, which each load an equal share of every batch"
        )
    os.makedirs(workdir, exist_ok=True)
    primary = jax.process_index() == 0  # the one process that writes logs, configs and plots
    if primary:
        gin_config.save_config(workdir, operative=False)
    tokenizer = prepare_tokenizer(workdir, tokenizer_path)
    if model.vocab_size != tokenizer.vocab_size:
        model = model.replace(vocab_size=tokenizer.vocab_size)
    mesh, rules = sharding.make_mesh(), sharding.axis_rules()
    schedule = make_schedule(total_steps=steps)
    optimizer = make_optimizer(schedule)
    cache_dir = os.path.join(workdir, "cache")
    shard = dict(shard_index=jax.process_index(), shard_count=jax.process_count())
    local_batch = batch_size // jax.process_count()
    data = iter(
        train_data(
            tokenizer,
            seq_len=seq_len,
            batch_size=local_batch,
            seed=seed,
            cache_dir=cache_dir,
            **shard,
        )
    )
    heldout = heldout_data(
        tokenizer, seq_len=seq_len, batch_size=local_batch, cache_dir=cache_dir, **shard
    )

    with sharding.activate(mesh, rules):

        def create(key):
            if diloco is not None:
                return diloco.create(init_params(model, key), optimizer, seed)
            return TrainState.create(init_params(model, key), optimizer, seed, loss_scale)

        abstract = jax.eval_shape(create, jax.random.key(seed))
        step_fn = make_train_step(
            model,
            optimizer,
            schedule,
            z_loss=z_loss,
            accum_steps=accum_steps,
            fused_cross_entropy=fused_cross_entropy,
            qk_clip_threshold=qk_clip_threshold,
            pipeline=pipeline,
            loss_scale=loss_scale,
        )
        if diloco is None:
            shardings = distributed.state_shardings(abstract, model, optimizer, mesh, rules)
        else:
            shardings = diloco.state_shardings(abstract, model, optimizer, mesh, rules)
            step_fn = diloco.wrap_step(step_fn, abstract.params)
        batch_sharding = distributed.batch_sharding(mesh, rules)
        train_step = distributed.jit_train_step(step_fn, shardings, batch_sharding)
        eval_step = jax.jit(
            make_eval_step(model, fused_cross_entropy=fused_cross_entropy),
            in_shardings=(shardings.params, batch_sharding),
        )

        ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=keep_checkpoints)
        start = ckpt.latest_step()
        if start is None:
            state = jax.jit(create, out_shardings=shardings)(jax.random.key(seed))
            start = 0
        else:
            target = distributed.abstract_with_shardings(abstract, shardings)
            state = ckpt.restore(start, target, data)
            print(f"resumed from step {start} in {workdir}", flush=True)

        log = MetricsLog(
            os.path.join(workdir, "metrics.jsonl") if primary else os.devnull, resume_step=start
        )
        tokens_per_step = batch_size * seq_len
        flops_per_step = flops_per_token(model, seq_len) * tokens_per_step
        peak = peak_flops_per_device() * jax.device_count()
        stop = StopRequest()
        bar = tqdm(
            total=steps,
            initial=start,
            disable=not progress or jax.process_index() != 0,
            unit="step",
            dynamic_ncols=True,
        )
        pending, last = [], {}
        step = start
        interval_start = time.perf_counter()

        def flush():
            """Writes the buffered per-step metrics (one device fetch for the whole interval)."""
            nonlocal pending, last, interval_start
            if not pending:
                return
            fetched = jax.device_get(pending)  # waits for the interval's steps to finish
            tokens_per_sec = len(pending) * tokens_per_step / (time.perf_counter() - interval_start)
            for s, m in fetched:
                last = {"step": s, **{k: float(v) for k, v in m.items()}}
                log.write(
                    {
                        **last,
                        "tokens_per_sec": tokens_per_sec,
                        "mfu": tokens_per_sec * flops_per_step / tokens_per_step / peak,
                    }
                )
            pending = []
            bar.set_postfix(loss=f"{last['loss']:.3f}", tok_s=f"{tokens_per_sec:,.0f}")
            interval_start = time.perf_counter()

        multi_process = jax.process_count() > 1
        profiling = False
        try:
            while step < steps:
                # Several processes vote at logging boundaries only: a vote is a collective.
                if (not multi_process or step % log_every == 0) and stop.agreed():
                    break
                if step + 1 in profile_steps and not profiling:
                    jax.profiler.start_trace(os.path.join(workdir, "profile"))
                    profiling = True
                with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
                    state, metrics = train_step(state, _to_global(next(data), batch_sharding))
                step += 1
                if profiling and step + 1 not in profile_steps:
                    jax.block_until_ready(metrics)  # the trace holds the steps' device work
                    jax.profiler.stop_trace()
                    profiling = False
                pending.append((step, metrics))
                bar.update(1)
                if step % log_every == 0 or step == steps:
                    flush()
                    if primary and step in (log_every, steps):
                        gin_config.save_config(workdir, operative=True)
                if step % eval_every == 0 or step == steps:
                    flush()
                    result = evaluate(
                        eval_step,
                        state.params,
                        heldout,
                        batch_sharding,
                        model.vocab_size,
                        eval_batches,
                    )
                    log.write({"step": step, **result})
                    last.update(result)
                    bar.write(
                        f"step {step}: held-out loss {result['eval_loss']:.4f} nats/token "
                        f"(unigram entropy {result['heldout_unigram_entropy']:.4f})"
                    )
                    interval_start = time.perf_counter()
                if step % checkpoint_every == 0 or step == steps:
                    flush()  # the log must hold every step up to the checkpoint it resumes from
                    ckpt.save(step, state, data)
        finally:
            if profiling:  # stopped or failed inside the profiled steps
                jax.profiler.stop_trace()
            flush()
            bar.close()
            stop.restore()
            interrupted = stop.requested and step < steps
            if interrupted and ckpt.latest_step() != step:
                ckpt.save(step, state, data)
                print(
                    f"interrupted: saved a checkpoint at step {step}; run the same command to "
                    "resume",
                    flush=True,
                )
            ckpt.wait()
            ckpt.close()
        if interrupted:
            raise KeyboardInterrupt

    if step >= steps:
        # Every process joins the save (orbax synchronises them); ``process_allgather`` assembles
        # parameters that span other hosts' devices, which ``device_get`` cannot read.
        _save_final_model(
            workdir, model, multihost_utils.process_allgather(state.params, tiled=True)
        )
        if primary:
            plot_curves(
                read_metrics(log.path),
                os.path.join(workdir, "loss_curve.png"),
                title=f"{model.n_layers}-layer, d={model.d_model}, {steps} steps",
            )
    return last
