"""Training speculative-decoding draft heads (Medusa, EAGLE) on a frozen target.

The target's final-norm hidden states ``f_t`` on text are the heads' inputs (the target never
changes, so they are computed under ``stop_gradient``).  On packed batches (``tokens``,
``targets = tokens`` shifted by one, ``segment_ids``, ``loss_mask``):

* **Medusa-1** (Cai et al. 2024): head ``k`` at position ``t`` predicts token ``t + k + 1``,
  ``targets[t + k]``; the loss is the sum over heads of the token-mean cross-entropy terms,

      L = Σ_k Σ_t m_{t,k} · (−log softmax(head_k(f_t))[targets[t + k]]) / Σ_{t,k} m_{t,k},

  ``m_{t,k}`` marking positions whose shifted target is trained and in the same document.
* **EAGLE** (Li et al. 2024): the layer reads ``(targets[t] = x_{t+1}, f_t)`` and predicts
  ``f̂_{t+1}``; the loss per position is the feature regression plus the token term,

      L_t = SmoothL1(f̂_{t+1}, f_{t+1}) + w · CE(softmax(LM(f_{t+1})), softmax(LM(f̂_{t+1}))),

  SmoothL1 averaged over features (optax's Huber loss with δ = 1), CE the cross-entropy from the
  target's next-token distribution to the draft's (EAGLE's ``w = 0.1``).

``train_draft_heads`` is the job (``configs/medusa.gin``, ``configs/eagle.gin``): it trains a
head on the shipped corpus through ``training.make_update`` (the target as the frozen base),
checkpoints and resumes like every trainer (``TrainerRun``), and saves the head under
``workdir/head`` (``inference.decoding.draft_heads.load_head``).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence

import gin
import jax
import jax.numpy as jnp
import optax
from tqdm.auto import tqdm

from agentic_jax import config as gin_config
from agentic_jax.data.pipeline import train_data
from agentic_jax.inference.decoding.draft_heads import (
    MedusaHeads,
    eagle_config,
    eagle_features,
    init_eagle,
    init_medusa,
    medusa_logits,
    save_head,
)
from agentic_jax.models import TransformerConfig, hidden_states, logits_from_hidden, self_attention
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.runner import TrainerRun
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.state import TrainState
from agentic_jax.training.step import model_batch
from agentic_jax.training.update import FullFinetune, make_update


@dataclasses.dataclass(frozen=True)
class HeadOnFrozenTarget(FullFinetune):
    """Trains the head (the trainable tree, a dict of its fields); the target is the frozen base:
    the loss gets ``{"head": ..., "target": ...}``."""

    kind: type = MedusaHeads

    def model_params(self, trainable, base=None, key=None):
        del key
        return {"head": self.kind(**trainable), "target": jax.lax.stop_gradient(base)}


def _features(target, config: TransformerConfig, batch):
    h = hidden_states(
        target,
        config,
        batch["tokens"],
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
    )
    return jax.lax.stop_gradient(h)


def medusa_loss(config: TransformerConfig):
    """``loss(params, batch, key) -> (total, count, metrics)``: Medusa-1's summed head
    cross-entropy (module docstring); metrics count each head's correct top-1 guesses."""

    def loss(params, batch, key):
        del key
        heads, target = params["head"], params["target"]
        logits = medusa_logits(heads, target, config, _features(target, config, batch))
        seg, mask, targets = batch["segment_ids"], batch["loss_mask"], batch["targets"]
        total = count = 0.0
        metrics = {}
        for k in range(1, logits.shape[2] + 1):
            z, want = logits[:, :-k, k - 1], targets[:, k:]
            valid = mask[:, k:] * (seg[:, k:] == seg[:, :-k])
            ce = optax.softmax_cross_entropy_with_integer_labels(z, want)
            total += jnp.sum(ce * valid)
            count += jnp.sum(valid)
            metrics[f"head{k}_correct"] = jnp.sum((jnp.argmax(z, -1) == want) * valid)
            metrics[f"head{k}_count"] = jnp.sum(valid, dtype=jnp.float32)
        return total, count, metrics

    return loss


def eagle_loss(config: TransformerConfig, token_weight: float = 0.1):
    """``loss(params, batch, key) -> (total, count, metrics)``: EAGLE's feature regression plus
    ``token_weight`` times the token cross-entropy (module docstring)."""

    def loss(params, batch, key):
        del key
        head, target = params["head"], params["target"]
        f = _features(target, config, batch)
        seg, mask = batch["segment_ids"], batch["loss_mask"]
        attend = self_attention(eagle_config(config), seg)
        predicted, _ = eagle_features(
            head, target, config, batch["targets"], f, batch["positions"], attend, None
        )
        predicted, want = predicted[:, :-1], f[:, 1:]
        valid = mask[:, :-1] * mask[:, 1:] * (seg[:, 1:] == seg[:, :-1])
        regression = jnp.mean(
            optax.huber_loss(predicted.astype(jnp.float32), want.astype(jnp.float32)), -1
        )
        z = logits_from_hidden(target, config, predicted)
        p = jax.nn.softmax(logits_from_hidden(target, config, want))
        token = optax.softmax_cross_entropy(z, p)
        total = jnp.sum((regression + token_weight * token) * valid)
        correct = (jnp.argmax(z, -1) == jnp.argmax(p, -1)) * valid
        return (
            total,
            jnp.sum(valid),
            {
                "regression": jnp.sum(regression * valid),
                "token_ce": jnp.sum(token * valid),
                "correct": jnp.sum(correct, dtype=jnp.float32),
            },
        )

    return loss


@gin.configurable
def train_draft_heads(
    workdir: str,
    *,
    init_from: str,
    kind: str = "medusa",
    num_heads: int = 4,
    token_weight: float = 0.1,
    files: Sequence[str] | None = None,
    steps: int = 200,
    batch_size: int = 8,
    seq_len: int = 128,
    peak_lr: float = 1e-3,
    warmup_steps: int = 20,
    checkpoint_every: int = 50,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Trains a ``kind`` (``medusa``: ``num_heads`` heads; ``eagle``) draft head for the target
    of the run ``init_from`` on ``files`` (default: the shipped corpus) and saves it under
    ``workdir/head``.  Resumes from the latest checkpoint in ``workdir``.  Returns the final
    metrics: ``loss`` and, per Medusa head, ``head{k}_accuracy``, or EAGLE's ``accuracy`` (the
    draft's top-1 token agreeing with the target's).
    """
    if kind not in ("medusa", "eagle"):
        raise ValueError(f"train_draft_heads kind must be 'medusa' or 'eagle', got {kind!r}")
    config, target, tokenizer = load_checkpoint(init_from)
    key = jax.random.key(seed)
    if kind == "medusa":
        head, loss = init_medusa(target, config, num_heads, key), medusa_loss(config)
    else:
        head, loss = init_eagle(config, key), eagle_loss(config, token_weight)
    finetune = HeadOnFrozenTarget(type(head))
    trainable = {k: v for k, v in head._asdict().items() if v is not None}
    data = iter(
        train_data(tokenizer, files, seq_len=seq_len, batch_size=batch_size, seed=seed, prefetch=0)
    )
    schedule = make_schedule(
        peak_lr=peak_lr, total_steps=steps, warmup_steps=min(warmup_steps, steps)
    )
    optimizer = make_optimizer(schedule)
    update = jax.jit(make_update(loss, optimizer, finetune))
    run = TrainerRun(workdir)
    state, meta, start = run.start(
        TrainState.create(trainable, optimizer, seed),
        {"init_from": init_from, "kind": kind, "num_heads": num_heads if kind == "medusa" else 0},
    )
    if "data" in meta:
        data.set_state(meta["data"])
    last = {}
    with tqdm(total=steps, initial=start, disable=not progress, unit="step", desc=kind) as bar:
        for step in range(start + 1, steps + 1):
            state, metrics = update(state, target, model_batch(next(data)))
            metrics = jax.device_get(metrics)
            last = {"step": step, "loss": float(metrics["loss"]), "lr": float(schedule(step - 1))}
            for name, value in metrics.items():
                if name.endswith("_correct"):
                    count = (
                        metrics[name.replace("_correct", "_count")]
                        if "head" in name
                        else metrics["count"]
                    )
                    last[name.replace("_correct", "_accuracy")] = float(value) / max(
                        float(count), 1.0
                    )
            run.write(last)
            bar.update(1)
            bar.set_postfix(loss=f"{last['loss']:.3f}")
            if step % checkpoint_every == 0 or step == steps:
                run.save(step, state, {**meta, "data": data.get_state()})
    shutil.rmtree(run.path("head"), ignore_errors=True)  # a finished run trained on: replace it
    save_head(run.path("head"), finetune.kind(**state.params))
    gin_config.save_config(run.workdir, operative=True)
    run.manager.close()
    return last
