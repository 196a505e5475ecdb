"""Reward models: a transformer trunk with a scalar head, trained on preferences or step labels.

The model is ``{"trunk": transformer params, "head": {"w": [D], "b": []}}``; its score at
position t is ``r_t = w · h_t + b`` over the trunk's final-norm hidden state (``token_scores``).

* **Outcome RM** (Bradley-Terry; Ouyang et al. 2022, "Training language models to follow
  instructions", arXiv:2203.02155): the score of a completion is ``r(x, y) = r_T`` at its last
  token, trained on preference pairs with ``−log σ(r(x, y_w) − r(x, y_l))`` (+ ``c·(r_w + r_l)²``,
  which pins the free offset; Eisenstein et al. 2023).  Held out: pair accuracy
  ``P[r(x, y_w) > r(x, y_l)]`` and the mean margin ``r_w − r_l``.
* **Process RM** (Lightman et al. 2023, "Let's Verify Step by Step", arXiv:2305.20050): one
  logit per step, ``P(step s is correct | x, steps ≤ s) = σ(r_{e_s})`` read at the step's last
  token ``e_s`` (a step is an assistant turn, which ends with ``<|im_end|>``), trained with
  per-step binary cross-entropy (``rl.process_reward_loss``).

Step labels come from the task generators (:func:`process_examples`), with the prefix convention
(a step is good iff it and every step before it are correct; Math-Shepherd's hard estimate,
Wang et al. 2024, arXiv:2312.08935): per task, the demonstration (every step 1), its wrong-final-
answer twin (the last step 0), and the demonstration with one tool call's argument corrupted --
a changed number in a calculator expression, another key in a lookup -- executed for real, so
its tool message shows the wrong result, followed by the remaining steps and the wrong answer
(0 from the corrupted step on).

`train_reward_model` is the gin job; `load_reward_model` reads its result, whose
``scores(tokens, mask)`` ranks an online preference trainer's samples or serves RL as a reward.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping

import gin
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from agentic_jax import rl
from agentic_jax.data.chat import Message, ToolCall, render_ids
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.text import Task, Tool
from agentic_jax.models import TransformerConfig
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.common import (
    init_scalar_head,
    last_index,
    next_prompts,
    token_scores,
)
from agentic_jax.post_training.pairs import Progress, evaluate_loss, pair_splits, take
from agentic_jax.post_training.runner import TrainerRun
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.rl import bradley_terry_loss, process_reward_loss
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.update import FullFinetune, make_update, router_metrics

REWARD_KINDS = ("outcome", "process")
HEAD_FILE = "reward_head.npz"
INFO_FILE = "reward_model.json"


def init_reward_model(trunk, config: TransformerConfig) -> dict:
    """A reward model over ``trunk`` (e.g. the policy's parameters) with a zero head: scores start at 0."""
    return {"trunk": trunk, "head": init_scalar_head(config)}


def score(rm_params, config: TransformerConfig, tokens, mask) -> jax.Array:
    """``r(x, y)`` per row ``[B]``: the score at the last token of ``mask`` (the completion's)."""
    scores = token_scores(rm_params, config, tokens)
    return jnp.take_along_axis(scores, last_index(mask)[:, None], axis=1)[:, 0]


def step_ends(mask, max_steps: int) -> tuple[jax.Array, jax.Array]:
    """``(positions [B, S], valid [B, S])``: the last token of each maximal run of ``mask`` (a step).

    Steps beyond ``max_steps`` are dropped; ``valid`` marks the steps a row has (positions of
    missing steps are 0).
    """
    mask = jnp.asarray(mask) > 0
    if max_steps > mask.shape[1]:
        raise ValueError(f"max_steps={max_steps} exceeds the row length {mask.shape[1]}")
    ends = mask & ~jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    positions = jnp.argsort(~ends, axis=1, stable=True)[:, :max_steps]  # step ends first, in order
    valid = jnp.arange(max_steps) < jnp.sum(ends, axis=1, keepdims=True)
    return jnp.where(valid, positions, 0), valid


def step_scores(
    rm_params, config: TransformerConfig, tokens, mask, max_steps: int
) -> tuple[jax.Array, jax.Array]:
    """``(logits [B, S], valid [B, S])``: a process reward model's score at each step's last token."""
    positions, valid = step_ends(mask, max_steps)
    return jnp.take_along_axis(token_scores(rm_params, config, tokens), positions, axis=1), valid


def count_steps(mask) -> np.ndarray:
    """Steps (maximal runs of ``mask``) per row, on the host."""
    mask = np.asarray(mask) > 0
    return np.sum(mask & ~np.pad(mask[:, 1:], ((0, 0), (0, 1))), axis=1)


@dataclasses.dataclass(frozen=True)
class WithHead:
    """A `Finetune` of a reward model: ``finetune`` trains the trunk, the head is always trained
    in full (so LoRA adapts the trunk while the new head learns from scratch)."""

    finetune: object = FullFinetune()

    def init(self, params, key=None):
        return {"trunk": self.finetune.init(params["trunk"], key), "head": params["head"]}

    def model_params(self, trainable, base=None, key=None):
        return {
            "trunk": self.finetune.model_params(trainable["trunk"], base, key),
            "head": trainable["head"],
        }

    def merged(self, trainable, base=None):
        return {"trunk": self.finetune.merged(trainable["trunk"], base), "head": trainable["head"]}

    def scale_updates(self, updates):
        return {"trunk": self.finetune.scale_updates(updates["trunk"]), "head": updates["head"]}


def outcome_loss(config: TransformerConfig, center_coef: float = 0.0):
    """``loss(params, batch, key) -> (Σ w·BT, Σ w, sums)`` over a pair batch (see ``pairs``).

    Sums: ``correct`` (pairs ranked right) and ``margin`` (``r_w − r_l``), weighted.
    """

    def loss(params, batch, key):
        del key
        tokens = jnp.concatenate([batch["chosen"], batch["rejected"]])
        mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]])
        chosen, rejected = jnp.split(score(params, config, tokens, mask), 2)
        weight = batch["weight"]
        losses = bradley_terry_loss(chosen, rejected, center_coef=center_coef)
        return (
            jnp.sum(weight * losses),
            jnp.sum(weight),
            {
                "correct": jnp.sum(weight * (chosen > rejected)),
                "margin": jnp.sum(weight * (chosen - rejected)),
            },
        )

    return loss


def process_loss(config: TransformerConfig, max_steps: int):
    """``loss(params, batch, key) -> (Σ BCE, steps, sums)`` over ``tokens``, ``mask``, step
    ``labels [B, S]`` and row ``weight``s.

    Sums: ``correct`` (steps whose sign matches the label), and the scores and counts of the
    good and the bad steps (their mean gap is the margin).
    """

    def loss(params, batch, key):
        del key
        logits, valid = step_scores(params, config, batch["tokens"], batch["mask"], max_steps)
        steps = valid * batch["weight"][:, None]
        labels = batch["labels"].astype(jnp.float32)
        out = process_reward_loss(logits, labels, steps)  # token-mean: (Σ BCE, Σ steps)
        return (
            out.total,
            jnp.sum(steps),
            {
                "correct": out.metrics["accuracy"],
                "good_score": jnp.sum(steps * labels * logits),
                "good_steps": jnp.sum(steps * labels),
                "bad_score": jnp.sum(steps * (1 - labels) * logits),
                "bad_steps": jnp.sum(steps * (1 - labels)),
            },
        )

    return loss


def summarize(loss, count, sums) -> dict[str, float]:
    """``loss`` (the mean), ``accuracy`` and ``margin`` (chosen − rejected, or good − bad steps)
    from the count and sums of a loss function above."""
    count = max(float(count), 1e-9)
    if "margin" in sums:
        margin = float(sums["margin"]) / count
    else:
        margin = float(sums["good_score"]) / max(float(sums["good_steps"]), 1e-9) - float(
            sums["bad_score"]
        ) / max(float(sums["bad_steps"]), 1e-9)
    return {"loss": float(loss), "accuracy": float(sums["correct"]) / count, "margin": margin}


def process_steps(spec: TaskSpec) -> int:
    """The most steps (assistant turns) a transcript of ``spec``'s tasks can have."""
    return max(g.max_turns for g in spec.generators)


def corrupt_argument(argument: str, task: Task, rng: np.random.Generator) -> str | None:
    """A wrong tool argument: a number in it raised by 1 or 2, else another key of the task's
    facts; None when there is no plausible wrong argument."""
    numbers = list(re.finditer(r"\d+", argument))
    if numbers:
        m = numbers[int(rng.integers(len(numbers)))]
        return f"{argument[: m.start()]}{int(m.group()) + int(rng.integers(1, 3))}{argument[m.end() :]}"
    others = sorted({key for key, _ in task.facts} - {argument})
    return others[int(rng.integers(len(others)))] if others else None


def _corrupt_call(
    call: Message, result: Message, task: Task, tools: Mapping[str, Tool], rng: np.random.Generator
) -> tuple[Message, Message] | None:
    """The call with a wrong argument and the tool message it really gets, or None."""
    tool_call = call.tool_calls[0]
    tool = tools.get(tool_call.name)
    if tool is None or result.role != "tool":
        return None
    wrong = corrupt_argument(str(tool_call.arguments[tool.argument]), task, rng)
    if wrong is None:
        return None
    message = tool.run_host(wrong, task)
    if message == result.content:
        return None  # a different argument that happens to give the same result is no error
    arguments = {**tool_call.arguments, tool.argument: wrong}
    return Message("assistant", call.content, (ToolCall(tool_call.name, arguments),)), Message(
        "tool", message
    )


def labelled_transcripts(
    task: Task, tools: Mapping[str, Tool], rng: np.random.Generator
) -> Iterator[tuple[tuple[Message, ...], list[int]]]:
    """``(messages, step labels)`` of the task's demonstration, its wrong-answer twin and, when it
    calls tools, a transcript whose tool call ``j`` (drawn by ``rng``) has a wrong argument
    (see the module docstring).  Labels: 1 while every step so far is correct, then 0."""
    demo = task.demonstration
    steps = sum(m.role == "assistant" for m in demo)
    yield task.conversation(True), [1] * steps
    yield task.conversation(False), [1] * (steps - 1) + [0]
    calls = [i for i, m in enumerate(demo[:-1]) if m.role == "assistant" and m.tool_calls]
    if not calls:
        return
    i = calls[int(rng.integers(len(calls)))]
    corrupted = _corrupt_call(demo[i], demo[i + 1], task, tools, rng)
    if corrupted is None:
        return
    good = sum(m.role == "assistant" for m in demo[:i])
    yield (
        task.prompt + demo[:i] + corrupted + demo[i + 2 : -1] + task.corrupted[-1:],
        [1] * good + [0] * (steps - good),
    )


def process_examples(
    spec: TaskSpec, tokenizer: Tokenizer, split: str = "train", seed: int = 0
) -> dict[str, np.ndarray]:
    """Step-labelled transcripts of ``spec``'s ``split`` tasks: ``tokens`` / ``mask`` (assistant
    tokens) ``int32 [N, max_length]``, ``labels [N, S]`` (S = :func:`process_steps`), ``weight [N]``."""
    max_steps = process_steps(spec)
    rows = []
    for index, generator in enumerate(spec.generators):
        tools = {tool.name: tool for tool in generator.tools}
        for task in generator.tasks(spec.seeds(split)):
            rng = np.random.default_rng([seed, index, task.seed])
            rows += list(labelled_transcripts(task, tools, rng))
    tokens = np.zeros((len(rows), spec.max_length), np.int32)
    mask = np.zeros_like(tokens)
    labels = np.zeros((len(rows), max_steps), np.float32)
    for row, (messages, steps) in enumerate(rows):
        rendered = render_ids(messages, tokenizer)
        if len(rendered.ids) > spec.max_length:
            raise ValueError(
                f"a labelled transcript has {len(rendered.ids)} tokens > TaskSpec.max_length="
                f"{spec.max_length}"
            )
        tokens[row, : len(rendered.ids)], mask[row, : len(rendered.ids)] = (
            rendered.ids,
            rendered.assistant_mask,
        )
        labels[row, : len(steps)] = steps
    found = count_steps(mask)
    expected = np.asarray([len(steps) for _, steps in rows])
    if (found != expected).any():
        raise ValueError(
            f"transcripts render into {found[found != expected][:3]} assistant steps where "
            f"{expected[found != expected][:3]} were labelled"
        )
    return {
        "tokens": tokens,
        "mask": mask,
        "labels": labels,
        "weight": np.ones(len(rows), np.float32),
    }


@dataclasses.dataclass(frozen=True, eq=False)
class RewardModel:
    """A trained reward model (:func:`load_reward_model`)."""

    config: TransformerConfig
    params: dict  # {"trunk": ..., "head": ...}
    tokenizer: Tokenizer
    kind: str  # "outcome" | "process"
    max_steps: int  # steps a process model scores per row

    def scores(self, tokens, mask) -> np.ndarray:
        """``float32 [B]``: the score at each row's last ``mask`` token (for a process model, the
        last step's logit: whether the whole solution is right)."""
        return np.asarray(_score(self.params, self.config, jnp.asarray(tokens), jnp.asarray(mask)))

    def step_scores(self, tokens, mask) -> tuple[np.ndarray, np.ndarray]:
        """``(logits [B, S], valid [B, S])`` at each step's last token."""
        logits, valid = _step_scores(
            self.params, self.config, jnp.asarray(tokens), jnp.asarray(mask), self.max_steps
        )
        return np.asarray(logits), np.asarray(valid)

    def episode_rewards(self, tokens, mask, *, aggregation: str = "min") -> np.ndarray:
        """``float32 [B]``: the reward of each episode (a transcript and its policy-token mask),
        as an RL trainer uses it: an outcome model's score at the last policy token; a process
        model's step probabilities σ(logit) aggregated over the episode's steps (its turns) by
        ``aggregation`` (``rl.aggregate_steps``: min, product, last or mean)."""
        if self.kind == "outcome":
            return self.scores(tokens, mask)
        logits, valid = self.step_scores(tokens, mask)
        probabilities = jax.nn.sigmoid(jnp.asarray(logits))
        return np.asarray(rl.aggregate_steps(probabilities, jnp.asarray(valid), mode=aggregation))


_score = jax.jit(score, static_argnums=1)
_step_scores = jax.jit(step_scores, static_argnums=(1, 4))


def save_reward_head(run_dir, head, *, kind: str, max_steps: int) -> None:
    """Writes the head (``reward_head.npz``) and ``reward_model.json`` (kind, max_steps; written
    last, so it marks a complete reward model) beside ``run_dir/model``."""
    if kind not in REWARD_KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {REWARD_KINDS}")
    head = jax.device_get(head)
    np.savez(os.path.join(run_dir, HEAD_FILE), w=np.asarray(head["w"]), b=np.asarray(head["b"]))
    with open(os.path.join(run_dir, INFO_FILE), "w") as f:
        json.dump({"kind": kind, "max_steps": int(max_steps)}, f)


def load_reward_model(run_dir) -> RewardModel:
    """The reward model of a `train_reward_model` run (``model/``, ``tokenizer.json``, the head)."""
    info_file = os.path.join(run_dir, INFO_FILE)
    if not os.path.exists(info_file):
        raise FileNotFoundError(
            f"{info_file} not found; is {run_dir} a finished train_reward_model run?"
        )
    with open(info_file) as f:
        info = json.load(f)
    config, trunk, tokenizer = load_checkpoint(run_dir)
    with np.load(os.path.join(run_dir, HEAD_FILE)) as head:
        params = {
            "trunk": trunk,
            "head": {"w": jnp.asarray(head["w"]), "b": jnp.asarray(head["b"])},
        }
    return RewardModel(config, params, tokenizer, info["kind"], info["max_steps"])


@gin.configurable
def train_reward_model(
    workdir: str,
    *,
    init_from: str,
    tasks: TaskSpec = TaskSpec(),
    kind: str = "outcome",
    pairs_file: str | None = None,
    heldout_pairs_file: str | None = None,
    steps: int = 200,
    batch_size: int = 16,
    peak_lr: float = 1e-4,
    warmup_steps: int = 10,
    center_coef: float = 0.0,
    finetune=FullFinetune(),
    eval_every: int = 50,
    checkpoint_every: int = 50,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Trains a reward model on ``tasks``' problems, its trunk initialised from run ``init_from``.

    ``kind="outcome"``: Bradley-Terry on (demonstration, wrong answer) pairs, or on the pairs of
    ``pairs_file`` (held out: ``heldout_pairs_file``; JSONL or Parquet in TRL's preference
    formats, see ``data.datasets``), ``batch_size`` pairs a step; ``"process"``: per-step BCE
    on :func:`process_examples`, ``batch_size`` transcripts a step.  Records loss, accuracy and
    margin per step and on the held-out problems every ``eval_every`` steps (and at the end);
    resumes from the latest checkpoint in ``workdir`` (parameters, optimizer, RNG, data
    position).  Saves the trunk as ``workdir/model`` and the
    head beside it (:func:`load_reward_model`).  Returns the final metrics.
    """
    if kind not in REWARD_KINDS:
        raise ValueError(f"train_reward_model.kind={kind!r}; expected one of {REWARD_KINDS}")
    if pairs_file is not None and kind != "outcome":
        raise ValueError("pairs_file holds preference pairs, which train kind='outcome' only")
    if eval_every and pairs_file is not None and heldout_pairs_file is None:
        raise ValueError("eval_every > 0 evaluates held-out pairs: set heldout_pairs_file")
    config, base, tokenizer = load_checkpoint(init_from)
    if config.max_seq_len < tasks.max_length:
        raise ValueError(
            f"the model's max_seq_len={config.max_seq_len} < TaskSpec.max_length={tasks.max_length}"
        )
    max_steps = process_steps(tasks)
    if kind == "outcome":
        train, heldout = pair_splits(tasks, tokenizer, pairs_file, heldout_pairs_file)
        loss = outcome_loss(config, center_coef)
    else:
        train, heldout = (
            process_examples(tasks, tokenizer, split, seed) for split in ("train", "heldout")
        )
        loss = process_loss(config, max_steps)
    size = len(train["weight"])

    schedule = make_schedule(
        peak_lr=peak_lr, total_steps=steps, warmup_steps=min(warmup_steps, steps)
    )
    optimizer = make_optimizer(schedule)
    model = WithHead(finetune)
    frozen = finetune.frozen(base)
    update = jax.jit(
        make_update(loss, optimizer, model, router_bias_rate=config.aux_free_bias_rate)
    )
    evaluate = jax.jit(loss)
    trainable = model.init(init_reward_model(base, config), jax.random.key(seed))
    run = TrainerRun(workdir)
    learner, meta, start = Progress.resume(
        run, trainable, optimizer, seed, {"init_from": init_from, "kind": kind}
    )
    last = {}
    with tqdm(
        total=steps, initial=start, disable=not progress, unit="step", desc=f"reward {kind}"
    ) as bar:
        for step in range(start + 1, steps + 1):
            position = int(learner.position)
            rows = next_prompts(position, batch_size, size, seed)
            state, metrics = update(learner.train, frozen, take(train, rows))
            learner = Progress(state, jnp.int32(position + batch_size))
            metrics = jax.device_get(metrics)
            last = {
                "step": step,
                **summarize(metrics["loss"], metrics["count"], metrics),
                "grad_norm": float(metrics["grad_norm"]),
                "lr": float(schedule(step - 1)),
                **router_metrics(metrics),
            }
            if eval_every and (step % eval_every == 0 or step == steps):
                held = evaluate_loss(
                    evaluate, model.model_params(state.params, frozen), heldout, batch_size
                )
                last.update({f"eval_{k}": v for k, v in summarize(*held).items()})
                bar.write(
                    f"step {step}: held-out accuracy {last['eval_accuracy']:.3f}, "
                    f"margin {last['eval_margin']:.3f}"
                )
            run.write(last)
            bar.update(1)
            bar.set_postfix(loss=f"{last['loss']:.3f}", accuracy=f"{last['accuracy']:.2f}")
            if step % checkpoint_every == 0 or step == steps:
                run.save(step, learner, meta)
    merged = model.merged(learner.train.params, frozen)
    run.finish(config, merged["trunk"], tokenizer)
    save_reward_head(workdir, merged["head"], kind=kind, max_steps=max_steps)
    return last
