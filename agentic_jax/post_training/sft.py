"""Supervised fine-tuning on chats: loss on the assistant's tokens only, packed rows.

Each conversation goes through the model's chat template (``chat_template(tokenizer)``: this
project's, or an imported model's Hugging Face template), whose assistant mask marks the tokens
the model must learn to produce: assistant content, tool calls and the ``<|im_end|>`` (or the
template's own end token) closing each assistant turn.  Prompt, role headers, tool results and padding are
masked out of the loss.  Conversations are packed first-fit into ``[batch, seq_len]`` rows with
``segment_ids`` (tokens attend only within their conversation) and positions restarting per
conversation, so a packed row computes exactly what the conversations would unpacked.

The loss is the token-mean next-token cross-entropy over the trained targets of a batch,

    L = Σ_{b,t} m_{b,t} · (−log π(y_{b,t} | y_{b,<t})) / Σ_{b,t} m_{b,t},

kept as (sum, count) so micro-batches add up exactly.  Held-out chats are evaluated the same
way (``eval_loss``) with the greedy next-token accuracy on trained targets.
"""

from __future__ import annotations

from collections.abc import Sequence

import gin
import grain
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from agentic_jax.data.chat import MessageLike
from agentic_jax.data.chat_template import chat_template
from agentic_jax.data.datasets import Conversation, read_conversations
from agentic_jax.data.packing import next_token_example, pack_batches
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.models import TransformerConfig, forward
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.runner import TrainerRun
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.loss import cross_entropy
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.state import TrainState
from agentic_jax.training.step import model_batch
from agentic_jax.training.update import FullFinetune, make_update, router_metrics


def chat_examples(
    conversations: Sequence[Conversation | Sequence[MessageLike]],
    tokenizer: Tokenizer,
    seq_len: int,
) -> list[dict[str, np.ndarray]]:
    """``next_token_example``s of the conversations, trained on assistant tokens only.

    Each renders through ``data.chat_template.chat_template(tokenizer)``: the built-in template,
    or an imported model's own Hugging Face template (its assistant mask), a ``Conversation``'s
    tools passed to it.  A conversation longer than ``seq_len + 1`` tokens is an error naming
    it: cutting it would train on a turn without its end, and dropping it silently would skew
    the data.
    """
    template = chat_template(tokenizer)
    examples = []
    for index, chat in enumerate(conversations):
        if isinstance(chat, Conversation):
            rendered = template.render_ids(chat.messages, tokenizer, list(chat.tools) or None)
        else:
            rendered = template.render_ids(chat, tokenizer)
        if len(rendered.ids) > seq_len + 1:
            raise ValueError(
                f"conversation {index} has {len(rendered.ids)} tokens > seq_len + 1 = {seq_len + 1}; "
                "raise seq_len"
            )
        if not rendered.assistant_mask.any():
            raise ValueError(f"conversation {index} has no assistant turn to train on")
        examples.append(next_token_example(rendered.ids, rendered.assistant_mask))
    return examples


def chat_batches(
    examples: list[dict], *, seq_len: int, batch_size: int, seed: int, num_epochs: int | None = None
) -> grain.IterDataset:
    """Shuffled (a new order each epoch), packed batches of the examples; checkpointable."""
    source = grain.MapDataset.source(examples)
    stream = source.shuffle(seed).repeat(num_epochs) if num_epochs != 1 else source
    return pack_batches(
        stream.to_iter_dataset(),
        seq_len=seq_len,
        batch_size=batch_size,
        num_packing_bins=4 * batch_size,
        seed=seed,
        shuffle_bins=num_epochs != 1,
    )


def sft_loss(config: TransformerConfig):
    """``loss(params, batch, key) -> (total, count, metrics)`` over a packed batch."""

    def loss(params, batch, key):
        del key
        logits = forward(
            params,
            config,
            batch["tokens"],
            positions=batch["positions"],
            segment_ids=batch["segment_ids"],
        )
        total, count, metrics = cross_entropy(logits, batch["targets"], batch["loss_mask"])
        correct = (jnp.argmax(logits, -1) == batch["targets"]) * batch["loss_mask"]
        return total, count, {**metrics, "correct": jnp.sum(correct, dtype=jnp.float32)}

    return loss


def evaluate_chats(params, config: TransformerConfig, batches) -> dict:
    """Held-out loss (nats per trained token) and next-token accuracy over every batch."""
    loss = jax.jit(sft_loss(config))
    total = count = correct = 0.0
    for batch in batches:
        t, c, m = loss(params, {k: jnp.asarray(v) for k, v in batch.items()}, None)
        total, count, correct = total + float(t), count + float(c), correct + float(m["correct"])
    return {"eval_loss": total / max(count, 1.0), "eval_accuracy": correct / max(count, 1.0)}


@gin.configurable
def train_sft(
    workdir: str,
    *,
    init_from: str,
    tasks: TaskSpec = TaskSpec(),
    chats_file: str | None = None,
    heldout_file: str | None = None,
    chats_format: str = "auto",
    steps: int = 200,
    batch_size: int = 16,
    seq_len: int | None = None,
    accum_steps: int = 1,
    peak_lr: float = 1e-3,
    warmup_steps: int = 20,
    finetune=FullFinetune(),
    eval_every: int = 50,
    checkpoint_every: int = 50,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Fine-tunes the model of the run ``init_from`` on chats and saves it under ``workdir/model``.

    The chats are ``chats_file`` (JSONL or Parquet in ``chats_format``, OpenAI chat with tool
    calls or ShareGPT, read by ``data.datasets.read_conversations``; held out:
    ``heldout_file``) or, by default, the demonstrations of ``tasks``' train and held-out
    problems, rendered by the model's chat template (``chat_examples``).
    ``seq_len`` defaults to ``tasks.context_length``.  Resumes from the latest checkpoint in
    ``workdir`` (parameters, optimizer, RNG and the data position).  Returns the final metrics.
    """
    config, base, tokenizer = load_checkpoint(init_from)
    seq_len = seq_len or tasks.context_length
    if seq_len > config.max_seq_len:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_seq_len={config.max_seq_len}")
    if chats_file is not None:
        train_chats = read_conversations(chats_file, chats_format)
        heldout_chats = read_conversations(heldout_file, chats_format) if heldout_file else []
    else:
        train_chats = [t.conversation() for t in tasks.tasks("train")]
        heldout_chats = [t.conversation() for t in tasks.tasks("heldout")]
    train_examples = chat_examples(train_chats, tokenizer, seq_len)
    heldout = (
        chat_batches(
            chat_examples(heldout_chats, tokenizer, seq_len),
            seq_len=seq_len,
            batch_size=batch_size,
            seed=seed,
            num_epochs=1,
        )
        if heldout_chats
        else None
    )
    data = iter(chat_batches(train_examples, seq_len=seq_len, batch_size=batch_size, seed=seed))

    schedule = make_schedule(
        peak_lr=peak_lr, total_steps=steps, warmup_steps=min(warmup_steps, steps)
    )
    optimizer = make_optimizer(schedule)
    trainable = finetune.init(base, jax.random.key(seed))
    frozen = finetune.frozen(base)
    update = jax.jit(
        make_update(
            sft_loss(config),
            optimizer,
            finetune,
            accum_steps=accum_steps,
            router_bias_rate=config.aux_free_bias_rate,
        )
    )

    run = TrainerRun(workdir)
    state, meta, start = run.start(
        TrainState.create(trainable, optimizer, seed), {"init_from": init_from}
    )
    if "data" in meta:
        data.set_state(meta["data"])
    last = {}
    with tqdm(total=steps, initial=start, disable=not progress, unit="step", desc="sft") as bar:
        for step in range(start + 1, steps + 1):
            state, metrics = update(state, frozen, model_batch(next(data)))
            metrics = jax.device_get(metrics)
            count = max(float(metrics["count"]), 1.0)
            last = {
                "step": step,
                "loss": float(metrics["loss"]),
                "accuracy": float(metrics["correct"]) / count,
                "tokens": count,
                "grad_norm": float(metrics["grad_norm"]),
                "lr": float(schedule(step - 1)),
                **router_metrics(metrics),
            }
            if heldout is not None and ((eval_every and step % eval_every == 0) or step == steps):
                last.update(
                    evaluate_chats(finetune.model_params(state.params, frozen), config, heldout)
                )
                bar.write(
                    f"step {step}: held-out loss {last['eval_loss']:.4f}, "
                    f"accuracy {last['eval_accuracy']:.3f}"
                )
            run.write(last)
            bar.update(1)
            bar.set_postfix(loss=f"{last['loss']:.3f}")
            if step % checkpoint_every == 0 or step == steps:
                run.save(step, state, {**meta, "data": data.get_state()})
    run.finish(config, finetune.merged(state.params, frozen), tokenizer)
    return last
