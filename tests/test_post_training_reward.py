"""Reward models: step ends, learning to rank and to label steps, step labels from task data,
and the `train_reward_model` job (metrics, exact resume, save and load)."""

import json
import shutil

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tiny_models import task_model_dir

from agentic_jax.data.chat import render
from agentic_jax.envs.text import Arithmetic, MultiHop
from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.models.export import load_checkpoint
from agentic_jax.models.lora import LoRA, LoraConfig
from agentic_jax.post_training.common import on_device
from agentic_jax.post_training.pairs import task_pairs
from agentic_jax.post_training.reward import (
    WithHead,
    count_steps,
    init_reward_model,
    labelled_transcripts,
    load_reward_model,
    outcome_loss,
    process_examples,
    process_loss,
    score,
    step_ends,
    step_scores,
    train_reward_model,
)
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training import make_update
from agentic_jax.training.metrics import read_metrics
from agentic_jax.training.optim import make_optimizer, make_schedule
from agentic_jax.training.state import TrainState

GOOD, BAD = 61, 62  # marker tokens of the synthetic sets
SYNTHETIC = TransformerConfig(
    vocab_size=64,
    d_model=32,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    head_dim=16,
    d_ff=64,
    max_seq_len=32,
)
SPEC = TaskSpec(
    generators=(Arithmetic(1),), num_train=12, num_heldout=8, max_length=176, action_length=40
)


@given(hnp.arrays(np.int32, (3, 12), elements=st.integers(0, 1)), st.integers(1, 6))
def test_step_ends_are_the_last_token_of_each_run_of_the_mask(mask, max_steps):
    positions, valid = (np.asarray(x) for x in step_ends(mask, max_steps))
    for row, p, v in zip(mask, positions, valid):
        ends = [t for t in range(len(row)) if row[t] and (t + 1 == len(row) or not row[t + 1])]
        assert list(p[v]) == ends[:max_steps]
        assert v.sum() == min(len(ends), max_steps) and not p[~v].any()
    np.testing.assert_array_equal(
        count_steps(mask),
        [sum(1 for t in range(12) if r[t] and (t == 11 or not r[t + 1])) for r in mask],
    )


def _outcome_set(n, rng):
    """Pairs that differ in one completion token: GOOD (chosen) or BAD (rejected) at a random place."""
    tokens = rng.integers(3, 60, (n, 16)).astype(np.int32)
    tokens[:, 14:] = 0
    mask = np.zeros((n, 16), np.int32)
    mask[:, 8:14] = 1
    where = rng.integers(8, 14, n)
    chosen, rejected = tokens.copy(), tokens.copy()
    chosen[np.arange(n), where], rejected[np.arange(n), where] = GOOD, BAD
    return {
        "chosen": chosen,
        "chosen_mask": mask,
        "rejected": rejected,
        "rejected_mask": mask,
        "weight": np.ones(n, np.float32),
    }


def _process_set(n, rng, steps=3):
    """Rows of ``steps`` 4-token steps, each holding GOOD (label 1) or BAD (label 0) somewhere."""
    tokens = rng.integers(3, 60, (n, 6 * steps + 4)).astype(np.int32)
    mask = np.zeros_like(tokens)
    labels = rng.integers(0, 2, (n, steps)).astype(np.float32)
    for s in range(steps):
        mask[:, 6 * s + 4 : 6 * s + 8] = 1
        tokens[np.arange(n), 6 * s + 4 + rng.integers(0, 4, n)] = np.where(
            labels[:, s] > 0, GOOD, BAD
        )
    return {"tokens": tokens, "mask": mask, "labels": labels, "weight": np.ones(n, np.float32)}


def _fit(loss, make_batch, steps, lr):
    optimizer = make_optimizer(make_schedule(lr, steps, kind="constant", warmup_steps=0))
    update = jax.jit(make_update(loss, optimizer, WithHead()))
    rm = init_reward_model(init_params(SYNTHETIC, jax.random.key(0)), SYNTHETIC)
    state = on_device(TrainState.create(rm, optimizer, 0))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        state, _ = update(state, None, make_batch(32, rng))
    return state.params


def test_outcome_reward_model_ranks_held_out_pairs():
    params = _fit(outcome_loss(SYNTHETIC), _outcome_set, steps=12, lr=1e-2)
    heldout = _outcome_set(256, np.random.default_rng(1))
    scores = jax.jit(score, static_argnums=1)
    gap = np.asarray(
        scores(params, SYNTHETIC, heldout["chosen"], heldout["chosen_mask"])
        - scores(params, SYNTHETIC, heldout["rejected"], heldout["rejected_mask"])
    )
    assert np.mean(gap > 0) >= 0.9 and gap.mean() > 1.0, (
        np.mean(gap > 0),
        gap.mean(),
    )  # measured: 1.0, ~3.5


def test_process_reward_model_learns_each_step_label():
    params = _fit(process_loss(SYNTHETIC, 3), _process_set, steps=40, lr=2e-2)
    heldout = _process_set(256, np.random.default_rng(1))
    logits, valid = (
        np.asarray(x)
        for x in jax.jit(step_scores, static_argnums=(1, 4))(
            params, SYNTHETIC, heldout["tokens"], heldout["mask"], 3
        )
    )
    assert logits.shape == (256, 3) and valid.all()
    good = heldout["labels"] > 0.5
    right = (logits > 0) == good
    assert right.mean(axis=0).min() >= 0.9, right.mean(axis=0)  # every step; measured 0.98-1.0
    mixed = good.any(axis=1) & ~good.all(axis=1)  # rows with good and bad steps
    assert right[mixed].mean() >= 0.9
    assert logits[good].mean() - logits[~good].mean() > 2.0  # measured ~11


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    task_model_dir(path, max_seq_len=SPEC.max_length)
    return path


def test_step_labels_come_from_the_task_data(run_dir):
    from agentic_jax.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    spec = TaskSpec(
        generators=(Arithmetic(2), MultiHop(2)), num_train=6, num_heldout=2, max_length=400
    )
    examples = process_examples(spec, tokenizer)
    labels, steps = examples["labels"], count_steps(examples["mask"])
    assert (
        labels.shape[1] == 3 and (labels[:, 1:] <= labels[:, :-1]).all()
    )  # 0 from the first wrong step on
    assert (labels.sum(axis=1) <= steps).all()
    first_wrong = np.argmin(np.where(np.arange(3) < steps[:, None], labels, 0), axis=1)
    wrong = labels.sum(axis=1) < steps
    assert (
        first_wrong[wrong] < steps[wrong] - 1
    ).any()  # some transcripts go wrong before the answer
    for generator in spec.generators:
        task = generator.sample(3)
        tools = {t.name: t for t in generator.tools}
        (good, ones), (answer, last), (corrupted, labels) = labelled_transcripts(
            task, tools, np.random.default_rng(0)
        )
        assert ones == [1, 1, 1] and last == [1, 1, 0] and good == task.conversation()
        j = labels.index(0)  # the corrupted call: earlier turns are the demonstration's, it is not
        turns = [m for m in corrupted if m.role == "assistant"]
        demo = [m for m in good if m.role == "assistant"]
        assert turns[:j] == demo[:j] and turns[j] != demo[j] and turns[j].tool_calls
        assert corrupted[-1] == answer[-1]
        assert render(corrupted) != render(good)


def _train(workdir, run_dir, **kwargs):
    settings = {
        "init_from": str(run_dir),
        "tasks": SPEC,
        "steps": 4,
        "batch_size": 4,
        "peak_lr": 1e-2,
        "warmup_steps": 0,
        "eval_every": 4,
        "checkpoint_every": 2,
        "progress": False,
    }
    return train_reward_model(str(workdir), **{**settings, **kwargs})


def test_outcome_job_records_resumes_exactly_and_saves_a_scorer(tmp_path, run_dir):
    full = tmp_path / "full"
    last = _train(full, run_dir)
    records = read_metrics(str(full / "metrics.jsonl"))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert {"loss", "accuracy", "margin", "eval_accuracy", "eval_margin"} <= set(last)
    assert records[0]["loss"] == pytest.approx(
        np.log(2.0), abs=1e-6
    )  # the zero head scores every row 0

    resumed = tmp_path / "resumed"  # the run as it stood after its step-2 checkpoint
    shutil.copytree(full, resumed)
    for later in ("checkpoints/4", "model"):
        shutil.rmtree(resumed / later)
    assert _train(resumed, run_dir) == last
    assert read_metrics(str(resumed / "metrics.jsonl")) == records

    rm = load_reward_model(full)
    assert rm.kind == "outcome" and rm.max_steps == 2
    pairs = task_pairs(SPEC, rm.tokenizer, "heldout")
    chosen, rejected = (
        rm.scores(pairs["chosen"], pairs["chosen_mask"]),
        rm.scores(pairs["rejected"], pairs["rejected_mask"]),
    )
    np.testing.assert_allclose(np.mean(chosen > rejected), last["eval_accuracy"])
    np.testing.assert_allclose(
        np.mean(chosen - rejected), last["eval_margin"], rtol=1e-4, atol=1e-6
    )
    with pytest.raises(ValueError, match="settings"):  # the workdir holds an outcome model
        _train(full, run_dir, kind="process")


def test_process_job_with_lora_scores_every_step(tmp_path, run_dir):
    """A process reward model whose trunk is LoRA-adapted (the head is trained in full)."""
    last = _train(
        tmp_path, run_dir, kind="process", steps=2, eval_every=2, finetune=LoRA(LoraConfig(rank=2))
    )
    assert 0.0 <= last["eval_accuracy"] <= 1.0 and np.isfinite(last["loss"])
    rm = load_reward_model(tmp_path)
    _, base, _ = load_checkpoint(run_dir)
    changed = jax.tree.map(
        lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), rm.params["trunk"], base
    )
    assert (
        changed["layers"]["attn"]["q"] and not changed["embed"]
    )  # adapters merged into the targets only
    assert np.any(np.asarray(rm.params["head"]["w"]) != 0)

    examples = process_examples(SPEC, rm.tokenizer, "heldout")
    logits, valid = rm.step_scores(examples["tokens"], examples["mask"])
    assert (
        logits.shape == examples["labels"].shape
        and (valid.sum(axis=1) == count_steps(examples["mask"])).all()
    )
    np.testing.assert_allclose(
        rm.scores(examples["tokens"], examples["mask"]),
        logits[np.arange(len(logits)), valid.sum(axis=1) - 1],
        rtol=1e-5,
        atol=1e-6,
    )
    assert json.loads((tmp_path / "reward_model.json").read_text()) == {
        "kind": "process",
        "max_steps": 2,
    }


def test_bad_kind_is_rejected(tmp_path, run_dir):
    with pytest.raises(ValueError, match="kind"):
        _train(tmp_path, run_dir, kind="pairwise")
