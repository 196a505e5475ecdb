"""The run directory and loop of the retrieval trainers (``encoders.train_encoder``,
``rerank.train_reranker``, ``distillation.train_ra_rft``), configured by :class:`TrainSettings`.

A run writes, like a post-training run::

    config.gin, operative_config.gin   the gin config as parsed and as used
    checkpoints/<step>/                orbax: the TrainState and the example stream's position
    metrics.jsonl                      one record per step; ``eval_*`` held-out metrics at step 0
                                       (the untrained model) and every ``eval_every`` steps
    model/ + tokenizer.json            the trunk (``models.export.load_checkpoint`` reads it)
    <name>_head.npz, <name>.json       the head and what it is (:func:`load_run` reads all)

Examples are drawn from a grain stream of indices shuffled anew each epoch; a checkpoint holds
the stream's position beside the state, so a resumed run draws exactly the batches an
uninterrupted one would have.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable

import gin
import grain
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from tqdm.auto import tqdm

from agentic_jax import config as gin_config
from agentic_jax.data.tokenizer import Tokenizer, load_tokenizer
from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.models.export import load_checkpoint, save_model
from agentic_jax.training.checkpoint import Checkpointer
from agentic_jax.training.metrics import MetricsLog
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.state import TrainState
from agentic_jax.training.update import make_update


def load_trunk(
    init_from: str | None,
    *,
    tokenizer: str | None = None,
    model: TransformerConfig | None = None,
    seed: int = 0,
) -> tuple[TransformerConfig, dict, Tokenizer]:
    """``(config, params, tokenizer)``: a run's or model directory's (``init_from``), else a
    random ``model`` over the ``tokenizer.json`` at ``tokenizer``."""
    if init_from is not None:
        return load_checkpoint(init_from)
    if tokenizer is None or model is None:
        raise ValueError("without init_from, give a tokenizer file and a model config")
    loaded = load_tokenizer(tokenizer)
    if model.vocab_size < loaded.vocab_size:
        raise ValueError(
            f"model.vocab_size={model.vocab_size} < the tokenizer's {loaded.vocab_size}"
        )
    return model, init_params(model, jax.random.key(seed)), loaded


@gin.configurable(module="retrieval")
@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How a retrieval trainer runs: ``steps`` AdamW updates of ``batch_size`` queries, the
    learning rate warmed up over ``warmup_steps`` to ``peak_lr`` then cosine-decayed
    (``training.optim``), held-out evaluation at step 0, every ``eval_every`` steps and at the
    end, a checkpoint every ``checkpoint_every`` steps; ``seed`` draws the random parameters
    and the order of the examples."""

    steps: int = 200
    batch_size: int = 16
    peak_lr: float = 1e-4
    warmup_steps: int = 10
    eval_every: int = 50
    checkpoint_every: int = 50
    seed: int = 0
    progress: bool = True


def train(
    workdir: str,
    *,
    config: TransformerConfig,
    tokenizer: Tokenizer,
    params: dict,
    loss,
    batch_of: Callable[[np.ndarray], dict],
    num_examples: int,
    evaluate: Callable[[dict], dict[str, float]],
    settings: TrainSettings,
    name: str,
    info: dict,
) -> dict:
    """Trains ``params`` (``{"trunk": ..., head}``) with ``loss(params, batch, key) -> (total,
    count, sums)`` on ``batch_of(example indices)`` through ``training.make_update``, resuming
    from the latest checkpoint in ``workdir``; records the step's loss, ``sums / count``,
    gradient norm and learning rate, and ``eval_<key>`` of ``evaluate(params)``.  Saves the
    trunk and the head named ``name`` with ``info`` (:func:`load_run`).  Returns the last
    record."""
    os.makedirs(workdir, exist_ok=True)
    gin_config.save_config(workdir, operative=False)
    schedule = make_schedule(
        peak_lr=settings.peak_lr,
        total_steps=settings.steps,
        warmup_steps=min(settings.warmup_steps, settings.steps),
    )
    optimizer = make_optimizer(schedule)
    update = jax.jit(make_update(loss, optimizer, router_bias_rate=config.aux_free_bias_rate))
    # Committed to one device like the parameters loaded from disk, so jit compiles once.
    state = jax.device_put(TrainState.create(params, optimizer, settings.seed), jax.devices()[0])
    stream = iter(
        grain.MapDataset.range(num_examples)
        .shuffle(seed=settings.seed)
        .repeat()
        .batch(settings.batch_size)
        .to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    )
    checkpoints = Checkpointer(
        os.path.join(workdir, "checkpoints"), max_to_keep=2, async_save=False
    )
    start = checkpoints.latest_step() or 0
    if start:
        state = checkpoints.restore(start, state, stream)
    log = MetricsLog(os.path.join(workdir, "metrics.jsonl"), resume_step=start)
    last = {"step": start}
    if start == 0 and settings.eval_every:
        last.update({f"eval_{k}": v for k, v in evaluate(state.params).items()})
        log.write(last)
    steps = settings.steps
    with tqdm(
        total=steps, initial=start, disable=not settings.progress, unit="step", desc=name
    ) as bar:
        for step in range(start + 1, steps + 1):
            state, metrics = update(state, None, batch_of(next(stream)))
            metrics = jax.device_get(metrics)
            count = max(float(metrics.pop("count")), 1e-9)
            last = {
                "step": step,
                "loss": float(metrics.pop("loss")),
                "grad_norm": float(metrics.pop("grad_norm")),
                "lr": float(schedule(step - 1)),
                **{
                    k: float(v) / (1 if k.startswith("moe_") else count) for k, v in metrics.items()
                },
            }
            if settings.eval_every and (step % settings.eval_every == 0 or step == steps):
                last.update({f"eval_{k}": v for k, v in evaluate(state.params).items()})
                held = ", ".join(f"{k} {v:.3f}" for k, v in last.items() if k.startswith("eval_"))
                bar.write(f"step {step}: {held}")
            log.write(last)
            bar.update(1)
            bar.set_postfix(loss=f"{last['loss']:.3f}")
            if step % settings.checkpoint_every == 0 or step == steps:
                checkpoints.save(step, state, stream)
    checkpoints.close()
    _save(workdir, config, tokenizer, state.params, name, info)
    return last


def _save(workdir: str, config: TransformerConfig, tokenizer: Tokenizer, params, name, info):
    """The trunk as ``workdir/model``, the tokenizer beside it, the operative config, the head's
    arrays as ``<name>_head.npz`` and ``info`` as ``<name>.json``."""
    gin_config.save_config(workdir, operative=True)
    model_dir = os.path.join(workdir, "model")
    if os.path.exists(model_dir):
        shutil.rmtree(model_dir)
    save_model(model_dir, config, jax.device_get(params["trunk"]))
    tokenizer.save(os.path.join(workdir, "tokenizer.json"))
    head = traverse_util.flatten_dict({k: v for k, v in params.items() if k != "trunk"}, sep="/")
    np.savez(os.path.join(workdir, f"{name}_head.npz"), **jax.device_get(head))
    with open(os.path.join(workdir, f"{name}.json"), "w") as f:  # last: it marks a finished run
        json.dump(info, f, indent=1)


def load_run(run_dir, name: str) -> tuple[TransformerConfig, dict, Tokenizer, dict]:
    """``(config, params, tokenizer, info)`` of a run :func:`train` finished, its head ``name``."""
    info_file = os.path.join(run_dir, f"{name}.json")
    if not os.path.exists(info_file):
        raise FileNotFoundError(f"{info_file} not found; is {run_dir} a finished {name} run?")
    with open(info_file) as f:
        info = json.load(f)
    config, trunk, tokenizer = load_checkpoint(run_dir)
    with np.load(os.path.join(run_dir, f"{name}_head.npz")) as arrays:
        head = traverse_util.unflatten_dict(
            {k: jnp.asarray(arrays[k]) for k in arrays.files}, sep="/"
        )
    return config, {"trunk": trunk, **head}, tokenizer, info
