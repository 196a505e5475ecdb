"""The preference trainer: every loss type through the model, DPO learning, exact resume with
the reference computed either way, and online pairs of the best and worst sampled episodes."""

import shutil

import jax
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tiny_models import task_model_dir

from agentic_jax.envs.text import Arithmetic
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.models.export import load_checkpoint, save_model
from agentic_jax.post_training.common import on_device
from agentic_jax.post_training.pairs import sampled_pairs, task_pairs
from agentic_jax.post_training.preference import (
    PairObjective,
    completion_logps,
    sample_pairs,
    train_preference,
)
from agentic_jax.post_training.reward import (
    init_reward_model,
    load_reward_model,
    save_reward_head,
)
from agentic_jax.post_training.rollout import collect
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.rl import PREFERENCE_LOSSES
from agentic_jax.training.metrics import read_metrics

SPEC = TaskSpec(
    generators=(Arithmetic(1),), num_train=12, num_heldout=8, max_length=176, action_length=40
)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """A run directory with a random model and the task tokenizer: ``(path, config, params, tokenizer)``."""
    path = tmp_path_factory.mktemp("policy")
    return (path, *task_model_dir(path, max_seq_len=SPEC.context_length))


def _train(workdir, policy, **kwargs):
    settings = {
        "init_from": str(policy[0]),
        "tasks": SPEC,
        "steps": 4,
        "prompts_per_step": 4,
        "peak_lr": 1e-2,
        "checkpoint_every": 2,
        "eval_every": 4,
        "progress": False,
    }
    return train_preference(str(workdir), **{**settings, **kwargs})


def _options(loss_type):
    return {"label_smoothing": 0.1} if loss_type in ("cdpo", "robust") else {}


def test_every_loss_type_trains_the_model_with_finite_loss_and_gradient(policy):
    """One compiled forward/backward serves every loss: d loss / d params = VJP(d loss / d log-probs)."""
    _, config, params, tokenizer = policy
    batch = {k: v[:4] for k, v in task_pairs(SPEC, tokenizer).items()}

    @jax.jit
    def pullback(cotangent):
        logps, vjp = jax.vjp(lambda p: completion_logps(p, config, batch), params)
        return logps, vjp(cotangent)[0]

    zeros = np.zeros(4, np.float32)
    (chosen, rejected, chosen_len, rejected_len), _ = pullback((zeros,) * 4)
    ref_chosen, ref_rejected = chosen + np.float32([0.5, -0.2, 0.1, 0.3]), rejected - 0.4
    for loss_type in PREFERENCE_LOSSES:
        objective = PairObjective(loss_type, **_options(loss_type))

        def mean_loss(c, r, objective=objective):
            return objective(c, r, ref_chosen, ref_rejected, chosen_len, rejected_len)[0].mean()

        loss, (d_chosen, d_rejected) = jax.value_and_grad(mean_loss, argnums=(0, 1))(
            chosen, rejected
        )
        norm = float(optax.global_norm(pullback((d_chosen, d_rejected, zeros, zeros))[1]))
        assert np.isfinite(float(loss)) and np.isfinite(norm) and norm > 0, (loss_type, loss, norm)


def test_bad_settings_fail_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="loss_type"):
        PairObjective("dpo_typo")
    with pytest.raises(ValueError, match="label_smoothing"):
        PairObjective("cdpo")  # conservative DPO needs ε > 0
    with pytest.raises(ValueError, match="samples_per_prompt"):
        train_preference(str(tmp_path), init_from="nowhere", online=True, samples_per_prompt=1)
    with pytest.raises(ValueError, match="online"):
        train_preference(str(tmp_path), init_from="nowhere", reward_model="nowhere")


@given(hnp.arrays(np.int32, (5, 3), elements=st.integers(0, 2)))
def test_sampled_pairs_are_each_prompts_best_and_worst(scores):
    rows = 15
    tokens = np.arange(rows)[:, None] * np.ones((1, 4), np.int32)  # row r holds token r
    batch = sampled_pairs(tokens, tokens % 2, scores.reshape(-1), samples_per_prompt=3)
    decisive = scores.max(axis=1) > scores.min(axis=1)
    if not decisive.any():
        assert batch is None
        return
    chosen, rejected = batch["chosen"][:, 0], batch["rejected"][:, 0]
    prompt = chosen // 3
    assert (rejected // 3 == prompt).all() and decisive[
        prompt
    ].all()  # a pair never mixes or ties prompts
    flat = scores.reshape(-1)
    np.testing.assert_array_equal(flat[chosen], scores.max(axis=1)[prompt])
    np.testing.assert_array_equal(flat[rejected], scores.min(axis=1)[prompt])
    np.testing.assert_array_equal(batch["chosen_score"], flat[chosen])
    np.testing.assert_array_equal(batch["chosen_mask"], tokens[chosen] % 2)
    assert set(prompt) == set(
        np.flatnonzero(decisive)
    )  # every decisive prompt, each weighing 1 in all
    np.testing.assert_allclose(
        np.bincount(prompt, batch["weight"], minlength=5)[decisive], 1.0, rtol=1e-6
    )


@pytest.fixture(scope="module")
def dpo(policy, tmp_path_factory):
    """An offline DPO run of 4 steps with checkpoints at 2 and 4: ``(workdir, last metrics)``."""
    workdir = tmp_path_factory.mktemp("dpo")
    return workdir, _train(workdir, policy)


def test_dpo_raises_the_margin_of_chosen_over_rejected(dpo, policy):
    workdir, last = dpo
    records = read_metrics(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    first = records[0]  # measured before the first update: the policy is the reference
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert first["loss"] == pytest.approx(np.log(2.0), abs=1e-6)
    assert np.mean([r["rewards/margins"] for r in records[2:]]) > 0.0
    assert {"eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"} <= set(last)

    # The saved model prefers the chosen completions of the pairs it trained on, relative to the reference.
    _, config, reference, tokenizer = policy
    _, trained, _ = load_checkpoint(workdir)
    pairs = task_pairs(SPEC, tokenizer)
    logps = jax.jit(lambda p: completion_logps(p, config, pairs)[:2])
    (chosen, rejected), (ref_chosen, ref_rejected) = logps(trained), logps(reference)
    gain = np.asarray((chosen - ref_chosen) - (rejected - ref_rejected))
    assert gain.mean() > 0.5 and np.mean(gain > 0) >= 0.75, (
        gain
    )  # log π(y_w)/π(y_l) rose on most pairs


def _numbers(record):
    return {k: v for k, v in record.items() if not k.endswith("_seconds")}


def test_resume_with_the_reference_computed_on_the_fly_repeats_the_run(dpo, policy, tmp_path):
    """Restarted from its step-2 checkpoint with per-batch reference log-probs instead of the
    precomputed ones, the run takes the same steps 3 and 4 (same losses, metrics, evaluation)."""
    workdir, last = dpo
    shutil.copytree(workdir, tmp_path, dirs_exist_ok=True)
    for later in ("checkpoints/4", "model"):
        shutil.rmtree(tmp_path / later)
    resumed = _train(tmp_path, policy, precompute_reference=False)
    full, again = (read_metrics(str(d / "metrics.jsonl")) for d in (workdir, tmp_path))
    assert [r["step"] for r in again] == [1, 2, 3, 4]
    for a, b in zip(full + [last], again + [resumed]):
        a, b = _numbers(a), _numbers(b)
        assert a.keys() == b.keys()
        np.testing.assert_allclose([b[k] for k in a], [a[k] for k in a], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="settings"):
        _train(tmp_path, policy, loss_type="ipo")  # a different objective cannot resume this run


@pytest.fixture(scope="module")
def ranker(policy, tmp_path_factory):
    """A reward model with a random head over the policy's trunk (so samples never tie)."""
    path, config, params, _ = policy
    rm_dir = tmp_path_factory.mktemp("rm")
    save_model(rm_dir / "model", config, params)
    shutil.copy(path / "tokenizer.json", rm_dir / "tokenizer.json")
    head = init_reward_model(params, config)["head"]
    head = {**head, "w": jax.random.normal(jax.random.key(1), head["w"].shape)}
    save_reward_head(rm_dir, head, kind="outcome", max_steps=2)
    return rm_dir


def test_online_pairs_are_the_best_and_worst_sample_of_each_prompt(policy, ranker):
    _, config, params, tokenizer = policy
    env, rm = SPEC.env(tokenizer), load_reward_model(ranker)
    # Committed arrays, as in the trainer, so the online job below reuses the compiled decoder.
    params, key = on_device((params, jax.random.key(0)))
    prompts, sampling = np.array([3, 7]), SamplingParams(temperature=1.0)
    batch, metrics = sample_pairs(
        params, config, env, prompts, samples_per_prompt=3, sampling=sampling, key=key, ranker=rm
    )
    rollouts = collect(
        params, config, env, env.default_params, prompts, group_size=3, sampling=sampling, key=key
    )
    scores = rm.scores(rollouts.tokens, rollouts.loss_mask).reshape(2, 3)
    best, worst = scores.argmax(axis=1) + [0, 3], scores.argmin(axis=1) + [0, 3]
    np.testing.assert_array_equal(batch["chosen"], rollouts.tokens[best])
    np.testing.assert_array_equal(batch["rejected_mask"], rollouts.loss_mask[worst])
    assert metrics["tied_prompts"] == 0.0
    assert metrics["chosen_score"] == pytest.approx(scores.max(axis=1).mean(), rel=1e-5)
    assert metrics["rejected_score"] == pytest.approx(scores.min(axis=1).mean(), rel=1e-5)

    # By the verifier's reward instead: a random policy never earns it, every prompt ties, no pairs.
    batch, metrics = sample_pairs(
        params, config, env, prompts, samples_per_prompt=3, sampling=sampling, key=key
    )
    assert batch is None and metrics["tied_prompts"] == 1.0 and metrics["reward_mean"] == 0.0


def test_online_dpo_trains_on_ranked_samples(policy, ranker, tmp_path):
    last = _train(
        tmp_path,
        policy,
        online=True,
        reward_model=str(ranker),
        samples_per_prompt=3,
        prompts_per_step=2,
        steps=2,
        eval_every=0,
    )
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [1, 2] and records[-1] == last
    for r in records:
        assert (
            r["tied_prompts"] == 0.0
            and r["chosen_score"] > r["rejected_score"]
            and np.isfinite(r["loss"])
        )
        assert r["generation_seconds"] > 0 and r["training_seconds"] > 0
    assert records[0]["rewards/margins"] == pytest.approx(
        0.0, abs=1e-6
    )  # the policy starts as the reference
    _, trained, _ = load_checkpoint(tmp_path)
    assert any(jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(a != b)), trained, policy[2])))
