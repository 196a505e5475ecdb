"""SFT, the RL trainer (GRPO family / PPO), rejection-sampling fine-tuning and their shared update."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import changed_weights, task_tokenizer
from tiny_tasks import SHORT

from agentic_jax import rl
from agentic_jax.envs.text import Arithmetic
from agentic_jax.models import TransformerConfig, forward, init_params
from agentic_jax.models.export import load_checkpoint, save_model
from agentic_jax.models.lora import LoRA, LoraConfig
from agentic_jax.post_training import common
from agentic_jax.post_training.common import next_prompts, token_logprobs, token_values
from agentic_jax.post_training.rft import train_rft
from agentic_jax.post_training.rl import (
    RLConfig,
    Samples,
    Scores,
    StepRandom,
    _group_advantages,
    _policy_loss,
    advantages,
    init_learner,
    learn,
    make_setup,
    overlong_penalty,
    rl_step,
    sample,
    score,
    summarize,
    train_rl,
)
from agentic_jax.post_training.rollout import Rollouts
from agentic_jax.post_training.sft import chat_batches, chat_examples, sft_loss, train_sft
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.rl import GROUP_ESTIMATORS
from agentic_jax.training import FullFinetune, make_update
from agentic_jax.training.loss import cross_entropy
from agentic_jax.training.metrics import read_metrics
from agentic_jax.training.state import TrainState


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory (model/ + tokenizer.json) with a tiny random model."""
    path = tmp_path_factory.mktemp("base")
    tokenizer = task_tokenizer(path)
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        d_ff=64,
        max_seq_len=224,
    )
    save_model(path / "model", config, init_params(config, jax.random.key(0)))
    return path, config, tokenizer


TOOLS = TaskSpec(
    generators=(Arithmetic(1),), num_train=16, num_heldout=4, max_length=176, action_length=32
)


def test_sft_masks_everything_but_the_assistant_tokens(run_dir):
    _, _, tokenizer = run_dir
    task = Arithmetic(1).sample(3)
    (example,) = chat_examples([task.conversation()], tokenizer, 200)
    trained = tokenizer.decode(example["targets"][example["loss_mask"] > 0].tolist())
    tool_result = task.demonstration[1].content
    assert '"calculator"' in trained and "<answer>" in trained and trained.count("<|im_end|>") == 2
    assert "What is" not in trained and f"\n{tool_result}\n" not in trained
    with pytest.raises(ValueError, match="raise seq_len"):
        chat_examples([task.conversation()], tokenizer, 8)


@settings(deadline=None)
@given(seed=st.integers(0, 2**16), scale=st.floats(0.1, 100.0))
def test_sft_loss_ignores_logits_at_masked_positions(seed, scale):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(2, 12, 7)).astype(np.float32)
    targets = rng.integers(0, 7, size=(2, 12))
    mask = rng.integers(0, 2, size=(2, 12))
    perturbed = (
        logits + scale * rng.normal(size=logits.shape).astype(np.float32) * (mask == 0)[..., None]
    )
    a, b = cross_entropy(logits, targets, mask), cross_entropy(perturbed, targets, mask)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
    assert float(a[1]) == mask.sum()


def test_packed_rows_compute_what_unpacked_conversations_do(run_dir):
    _, config, tokenizer = run_dir
    params = init_params(config, jax.random.key(1))
    examples = chat_examples(
        [t.conversation() for t in Arithmetic(1).tasks(range(3))], tokenizer, 200
    )
    (packed,) = list(chat_batches(examples, seq_len=200 * 3, batch_size=1, seed=0, num_epochs=1))
    assert packed["segment_ids"].max() >= 2  # several conversations share the row
    loss = sft_loss(config.replace(max_seq_len=600))
    total, count, _ = loss(params, {k: jnp.asarray(v) for k, v in packed.items()}, None)
    alone = [
        loss(
            params,
            {
                k: jnp.asarray(v)[None]
                for k, v in {
                    **e,
                    "segment_ids": np.ones_like(e["tokens"]),
                    "positions": np.arange(len(e["tokens"])),
                }.items()
            },
            None,
        )
        for e in examples
    ]
    np.testing.assert_allclose(total, sum(a[0] for a in alone), rtol=1e-5)
    assert count == sum(a[1] for a in alone)


def test_train_sft_lowers_held_out_loss_and_resumes(run_dir, tmp_path):
    path, _, _ = run_dir
    first = train_sft(
        str(tmp_path / "sft"),
        init_from=str(path),
        tasks=TOOLS,
        steps=6,
        batch_size=4,
        peak_lr=1e-2,
        warmup_steps=1,
        eval_every=3,
        checkpoint_every=3,
        progress=False,
    )
    records = read_metrics(tmp_path / "sft" / "metrics.jsonl")
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert len(evals) == 2 and evals[1] < evals[0]
    assert (tmp_path / "sft" / "model" / "config.json").exists()
    # Resuming a finished run restores step 6 and trains nothing more.
    again = train_sft(
        str(tmp_path / "sft"),
        init_from=str(path),
        tasks=TOOLS,
        steps=6,
        batch_size=4,
        peak_lr=1e-2,
        warmup_steps=1,
        eval_every=3,
        checkpoint_every=3,
        progress=False,
    )
    assert again == {} and first["step"] == 6


def test_sft_with_lora_trains_only_adapters_and_saves_the_merged_model(run_dir, tmp_path):
    path, _, _ = run_dir
    lora = LoRA(LoraConfig(rank=2, targets=("q", "v")))
    train_sft(
        str(tmp_path / "lora"),
        init_from=str(path),
        tasks=TOOLS,
        steps=2,
        batch_size=4,
        peak_lr=1e-2,
        warmup_steps=0,
        finetune=lora,
        checkpoint_every=2,
        progress=False,
    )

    def size(directory):
        return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())

    # The checkpoint holds adapters and their two Adam moments only: less than one model (a full
    # fine-tuning state holds the parameters and both moments, three models).
    assert size(tmp_path / "lora" / "checkpoints" / "2" / "state") < size(
        tmp_path / "lora" / "model"
    )
    assert changed_weights(path / "model", tmp_path / "lora" / "model") == {
        "layers/attn/q",
        "layers/attn/v",
    }


def test_gradient_accumulation_sums_micro_batch_parts_exactly(run_dir):
    _, config, _ = run_dir
    params = init_params(config, jax.random.key(2))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (8, 24)), jnp.int32)
    mask = jnp.asarray(rng.integers(0, 2, (8, 24)), jnp.int32).at[:, 0].set(0)
    old = token_logprobs(params, config, tokens) + 0.05 * jnp.asarray(
        rng.normal(size=(8, 24)), jnp.float32
    )
    batch = {
        "tokens": tokens,
        "mask": mask,
        "old_logp": old,
        "advantages": jnp.asarray(rng.normal(size=(8,)), jnp.float32),
    }
    algo = RLConfig(loss_type="grpo", group_size=2, prompts_per_step=4)
    loss = _policy_loss(config, algo, 24)
    optimizer = optax.sgd(0.1)
    results = []
    for accum in (1, 2, 4):
        update = jax.jit(make_update(loss, optimizer, FullFinetune(), accum_steps=accum))
        state, metrics = update(TrainState.create(params, optimizer, 0), None, batch)
        results.append((state.params, metrics))
    for params_k, metrics_k in results[1:]:
        np.testing.assert_allclose(metrics_k["loss"], results[0][1]["loss"], rtol=1e-5)
        np.testing.assert_allclose(metrics_k["count"], results[0][1]["count"])
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
            params_k,
            results[0][0],
        )


def test_entropy_counts_minus_inf_logits_as_zero_probability(run_dir, monkeypatch):
    _, config, _ = run_dir
    params = init_params(config, jax.random.key(4))
    tokens = jnp.asarray(
        np.random.default_rng(0).integers(1, config.vocab_size, (2, 10)), jnp.int32
    )
    logits = np.float64(forward(params, config, tokens))[:, :-1, 1:]
    head = common.logits_from_hidden
    # A head that masks token 0 out of the vocabulary (as constrained decoding does): 0·log 0 = 0.
    monkeypatch.setattr(
        common, "logits_from_hidden", lambda *args: head(*args).at[..., 0].set(-jnp.inf)
    )
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)

    def total_entropy(p):
        entropy = token_logprobs(p, config, tokens, with_entropy=True)[1]
        return entropy.sum(), entropy

    (_, entropy), grads = jax.value_and_grad(total_entropy, has_aux=True)(params)
    np.testing.assert_allclose(entropy[:, 1:], -np.sum(probs * np.log(probs), axis=-1), rtol=1e-5)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_prompt_stream_covers_every_task_once_per_epoch():
    stream = next_prompts(0, 30, 10, seed=3)
    for epoch in range(3):
        assert sorted(stream[epoch * 10 : (epoch + 1) * 10]) == list(range(10))
    np.testing.assert_array_equal(next_prompts(7, 9, 10, seed=3), stream[7:16])


def test_overlong_penalty_is_dapo_soft_punishment():
    np.testing.assert_allclose(overlong_penalty([10, 12, 14, 16, 30], 16, 4), [0, 0, -0.5, -1, -1])
    np.testing.assert_array_equal(overlong_penalty([100], 16, 0), [0])


@settings(max_examples=20, deadline=None)
@given(
    estimator=st.sampled_from([e for e in GROUP_ESTIMATORS if e != "remax"]),
    seed=st.integers(0, 2**16),
    kept=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_advantages_of_trained_groups_ignore_the_groups_dynamic_sampling_dropped(
    estimator, seed, kept
):
    rng = np.random.default_rng(seed)
    algo = RLConfig(advantage=estimator, group_size=3, prompts_per_step=4)
    row_kept = np.repeat(kept, 3)
    lengths = rng.integers(1, 20, 12)
    rewards = np.where(row_kept, rng.normal(size=12), 0.0).astype(np.float32)
    advantages = _group_advantages(rewards, lengths, row_kept, algo)
    # The trained rows get the advantages they would have had if the dropped groups were never sampled.
    alone = _group_advantages(rewards[row_kept], lengths[row_kept], row_kept[row_kept], algo)
    np.testing.assert_allclose(advantages[row_kept], alone, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(advantages[~row_kept], 0.0)


def test_rl_config_rejects_what_train_rl_cannot_train():
    with pytest.raises(
        ValueError, match="greedy"
    ):  # ReMax's baseline is a greedy rollout, never sampled
        RLConfig(advantage="remax")
    with pytest.raises(ValueError, match="dynamic_sampling would drop every group"):
        RLConfig(advantage="gae", group_size=1, dynamic_sampling=True)


def _short_rl(workdir, run_dir, steps, curriculum=None, **algo):
    path, _, _ = run_dir
    config = RLConfig(**{"group_size": 4, "prompts_per_step": 4, **algo})
    return train_rl(
        str(workdir),
        init_from=str(path),
        tasks=SHORT,
        algorithm=config,
        steps=steps,
        peak_lr=1e-2,
        curriculum=curriculum,
        checkpoint_every=2,
        progress=False,
    )


def test_grpo_raises_the_reward_of_a_trivially_learnable_task(run_dir, tmp_path):
    """The random policy already answers with a digit most of the time, so the reward's room to
    grow is its failure rate 1 − r: GRPO at least halves it within 12 steps."""
    _short_rl(tmp_path / "grpo", run_dir, 12, group_size=8)
    records = read_metrics(tmp_path / "grpo" / "metrics.jsonl")
    failures = [1.0 - r["reward_mean"] for r in records]
    assert np.mean(failures[-3:]) <= 0.5 * np.mean(failures[:3]), failures
    # The KL to the reference is logged without a KL term: 0 while the policy is the reference.
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6) and records[-1]["kl"] > 1e-4


def test_killed_rl_run_resumes_with_identical_metrics(run_dir, tmp_path):
    """A run stopped after its step-2 checkpoint and started again equals an uninterrupted one."""
    settings_ = dict(
        loss_type="dapo",
        advantage="rloo",
        dynamic_sampling=True,
        kl_coef=0.05,
        epochs=2,
        minibatches=2,
    )
    _short_rl(tmp_path / "whole", run_dir, 4, curriculum="pass_rate", **settings_)
    _short_rl(tmp_path / "split", run_dir, 2, curriculum="pass_rate", **settings_)
    _short_rl(tmp_path / "split", run_dir, 4, curriculum="pass_rate", **settings_)
    timing = ("generation_seconds", "training_seconds")

    def records(name):
        return [
            {k: v for k, v in r.items() if k not in timing}
            for r in read_metrics(tmp_path / name / "metrics.jsonl")
        ]

    assert records("split") == records("whole")
    assert {
        "kl",
        "entropy",
        "clip_frac_high",
        "zero_variance_groups",
        "response_length",
    } <= records("whole")[0].keys()


def test_resume_refuses_a_different_reference_model(run_dir, tmp_path):
    path, config, _ = run_dir
    _short_rl(tmp_path / "run", run_dir, 2)
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text((path / "tokenizer.json").read_text())
    save_model(other / "model", config, init_params(config, jax.random.key(9)))
    with pytest.raises(ValueError, match="different settings"):
        train_rl(
            str(tmp_path / "run"),
            init_from=str(other),
            tasks=SHORT,
            algorithm=RLConfig(group_size=4, prompts_per_step=4),
            steps=3,
            progress=False,
        )


def test_rl_with_lora_trains_only_adapters_against_the_base_reference(run_dir, tmp_path):
    path, _, _ = run_dir
    lora = LoRA(LoraConfig(rank=2, targets=("q", "v"), dropout=0.5))
    train_rl(
        str(tmp_path / "lora"),
        init_from=str(path),
        tasks=SHORT,
        finetune=lora,
        steps=3,
        peak_lr=1e-2,
        algorithm=RLConfig(group_size=4, prompts_per_step=4),
        progress=False,
    )
    records = read_metrics(tmp_path / "lora" / "metrics.jsonl")
    # Step 1 samples from the base model itself (B = 0); once adapters move, the KL to it grows.
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6) and records[-1]["kl"] > 0
    # One update per step, at the rollout policy: ratio 1 (KL(π_old‖π) = 0), dropout or not.
    assert all(r["approx_kl"] < 1e-10 for r in records), [r["approx_kl"] for r in records]
    assert changed_weights(path / "model", tmp_path / "lora" / "model") == {
        "layers/attn/q",
        "layers/attn/v",
    }


def test_ppo_with_critic_trains_policy_and_value(run_dir, tmp_path):
    path, _, _ = run_dir
    last = train_rl(
        str(tmp_path / "ppo"),
        init_from=str(path),
        tasks=SHORT,
        progress=False,
        steps=3,
        algorithm=RLConfig(
            loss_type="ppo",
            advantage="gae",
            group_size=1,
            prompts_per_step=8,
            minibatches=2,
            critic_lr=1e-2,
        ),
        peak_lr=1e-3,
    )
    records = read_metrics(tmp_path / "ppo" / "metrics.jsonl")
    errors = [r["value_error"] for r in records]
    assert errors[-1] < errors[0] and np.isfinite(last["loss"])
    # Groups of one have no reward spread to lack, so the monitor has nothing to raise.
    assert not any("zero_variance_groups" in r for r in records)


def test_critic_values_each_token_by_the_context_it_was_drawn_in(run_dir):
    _, config, _ = run_dir
    params = {
        "trunk": init_params(config, jax.random.key(3)),
        "head": {"w": jnp.ones((config.d_model,)), "b": jnp.zeros(())},
    }
    tokens = jnp.asarray(
        np.random.default_rng(0).integers(0, config.vocab_size, (2, 12)), jnp.int32
    )
    changed = tokens.at[:, 6].set((tokens[:, 6] + 1) % config.vocab_size)
    values, changed_values = (
        token_values(params, config, tokens),
        token_values(params, config, changed),
    )
    # GAE needs V(s_t) for the state token t is drawn from: it must not see token t itself.
    np.testing.assert_array_equal(values[:, :7], changed_values[:, :7])
    assert np.all(values[:, 7:] != changed_values[:, 7:])
    np.testing.assert_array_equal(values[:, 0], 0.0)


def test_rft_trains_only_on_verified_episodes(run_dir, tmp_path):
    path, _, _ = run_dir
    last = train_rft(
        str(tmp_path / "rft"),
        init_from=str(path),
        tasks=SHORT,
        rounds=2,
        prompts_per_round=4,
        samples_per_prompt=2,
        steps_per_round=2,
        batch_size=2,
        peak_lr=1e-2,
        progress=False,
    )
    records = read_metrics(tmp_path / "rft" / "metrics.jsonl")
    assert [r["round"] for r in records] == [1, 2]
    for r in records:  # kept = the verified (successful) episodes among the 8 sampled
        assert r["kept"] == round(r["success_rate"] * 8)
        assert ("loss" in r) == (r["kept"] > 0)
    assert last["step"] == 4 and (tmp_path / "rft" / "model" / "config.json").exists()


def test_task_spec_train_seeds_start_at_first_seed_below_the_held_out_ones():
    spec = dataclasses.replace(SHORT, first_seed=500, num_train=10)
    assert spec.seeds("train") == range(500, 510) and min(spec.seeds("heldout")) >= 1_000_000
    assert [t.seed for t in spec.tasks("train")] == list(range(500, 510))
    with pytest.raises(ValueError, match="below the held-out seeds"):
        dataclasses.replace(SHORT, first_seed=999_995, num_train=10)


# ------------------------------------------------------------------------- the phases of one step
def _setup(run_dir, **algo):
    path, _, tokenizer = run_dir
    config, base, _ = load_checkpoint(path)
    algorithm = RLConfig(**{"group_size": 2, "prompts_per_step": 2, **algo})
    return make_setup(
        config, base, SHORT.env(tokenizer, "train"), algorithm, steps=4, peak_lr=1e-2, seed=5
    )


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.endswith("_seconds")}


def test_one_rl_step_is_reproducible_from_seed_and_step(run_dir):
    """Two setups built apart (as two processes would) take the same step 3 from the same
    learner: same metrics, same parameters; step 4 samples other episodes."""
    first, second = _setup(run_dir), _setup(run_dir)
    learner = init_learner(first)
    a, record_a = rl_step(first, learner, 3)
    b, record_b = rl_step(second, init_learner(second), 3)
    assert _untimed(record_a) == _untimed(record_b)
    jax.tree.map(np.testing.assert_array_equal, a.policy.params, b.policy.params)
    assert int(a.prompt_position) == int(b.prompt_position) == 2
    other = sample(first, learner, StepRandom(5, 4))
    assert not np.array_equal(
        other.rollouts.tokens, sample(first, learner, StepRandom(5, 3)).rollouts.tokens
    )


def test_sample_draws_whole_groups_from_the_prompt_stream(run_dir):
    setup = _setup(run_dir, group_size=3, prompts_per_step=2)
    samples = sample(setup, init_learner(setup), StepRandom(5, 1))
    assert samples.rollouts.tokens.shape[0] == 6 and samples.row_kept.all()
    tasks = samples.rollouts.group(samples.rollouts.task, 3)
    np.testing.assert_array_equal(tasks[:, 0], next_prompts(0, 2, setup.num_tasks, 5))
    assert (tasks == tasks[:, :1]).all() and samples.position == 2 and samples.rounds == 1


def test_score_shapes_the_verifier_reward_and_scores_the_sampled_tokens(run_dir):
    setup = _setup(run_dir, overlong_buffer=4, kl_coef=0.5, kl_in_reward=True)
    learner = init_learner(setup)
    samples = sample(setup, learner, StepRandom(5, 1))
    scores = score(setup, learner, samples)
    r = samples.rollouts
    np.testing.assert_allclose(scores.old_logp, scores.ref_logp)  # step 1: the policy is the base
    kl = np.sum((scores.old_logp - scores.ref_logp) * r.loss_mask, axis=1)
    expected = r.reward + overlong_penalty(r.response_length, setup.max_response, 4) - 0.5 * kl
    np.testing.assert_allclose(scores.rewards, expected, rtol=1e-6)
    tokens = jnp.asarray(r.tokens)
    np.testing.assert_allclose(
        scores.ref_logp, token_logprobs(setup.base, setup.config, tokens), rtol=1e-5, atol=1e-5
    )


def test_advantages_are_group_relative_over_the_kept_rows(run_dir):
    setup = _setup(run_dir, group_size=3, prompts_per_step=2)
    learner = init_learner(setup)
    samples = sample(setup, learner, StepRandom(5, 2))
    rewards = np.asarray([0.0, 1.0, 1.0, 0.5, 0.5, 2.0], np.float32)
    scores = score(setup, learner, samples)._replace(rewards=rewards)
    batch, critic_batch, off_policy = advantages(setup, learner, samples, scores)
    expected = rl.group_advantages(jnp.asarray(rewards.reshape(2, 3)), estimator="grpo")
    np.testing.assert_allclose(batch["advantages"], np.asarray(expected).ravel(), rtol=1e-5)
    np.testing.assert_array_equal(batch["mask"], samples.rollouts.loss_mask)
    assert critic_batch is None and "ref_logp" not in batch and off_policy == {}


def test_learn_applies_epochs_times_minibatches_updates(run_dir):
    setup = _setup(run_dir, group_size=2, prompts_per_step=2, epochs=2, minibatches=2)
    learner = init_learner(setup)
    samples = sample(setup, learner, StepRandom(5, 1))
    scores = score(setup, learner, samples)
    batch, _, _ = advantages(
        setup,
        learner,
        samples,
        scores._replace(rewards=np.asarray([0.0, 1.0, 1.0, 0.0], np.float32)),
    )
    policy, critic, updates = learn(setup, learner, batch, None, StepRandom(5, 1))
    assert len(updates) == 4 and int(policy.step) == 4 and critic is None
    moved = jax.tree.leaves(
        jax.tree.map(lambda x, y: np.abs(x - y).max(), policy.params, learner.policy.params)
    )
    assert max(moved) > 0
    rows = sorted(np.concatenate(np.array_split(StepRandom(5, 1).minibatch_order(0, 4), 2)))
    assert rows == [0, 1, 2, 3]  # each epoch's minibatches cover every row once


def test_summarize_reports_token_means_of_the_updates():
    r = Rollouts(
        tokens=np.zeros((2, 4), np.int32),
        loss_mask=np.array([[0, 1, 1, 0], [0, 1, 0, 0]]),
        length=np.array([3, 2]),
        reward=np.array([1.0, 0.0], np.float32),
        success=np.array([True, False]),
        task=np.array([0, 0]),
        turns=np.array([1, 1]),
        tool_calls=np.array([2, 0]),
        truncated=np.array([False, True]),
        behaviour_logp=np.zeros((2, 4), np.float32),
        turn_rewards=np.array([[1.0], [0.0]], np.float32),
        turn_spans=np.array([[[1, 3]], [[1, 2]]], np.int32),
        turn_mask=np.ones((2, 1), np.int32),
        milestones=np.zeros((2, 1), np.int32),
        generation_seconds=0.5,
    )
    samples = Samples(r, np.array([True, True]), 1, 0.0, None, 2, 0.5, 2, 3)
    logp = np.zeros((2, 4), np.float32)
    scores = Scores(np.array([1.0, -0.5], np.float32), logp, logp)
    updates = [
        {
            "tokens": 2.0,
            "entropy": 3.0,
            "approx_kl": 0.2,
            "clip_frac_low": 0.0,
            "clip_frac_high": 1.0,
            "loss": 0.5,
            "grad_norm": 1.0,
        },
        {
            "tokens": 1.0,
            "entropy": 0.0,
            "approx_kl": 0.1,
            "clip_frac_low": 1.0,
            "clip_frac_high": 0.0,
            "loss": 1.5,
            "grad_norm": 3.0,
        },
    ]
    record = summarize(samples, scores, updates, training_seconds=2.0)
    assert record["entropy"] == pytest.approx(1.0) and record["approx_kl"] == pytest.approx(0.1)
    assert record["loss"] == 1.0 and record["grad_norm"] == 2.0 and record["kl"] == 0.0
    assert record["reward_mean"] == 0.5 and record["shaped_reward_mean"] == 0.25
    assert record["tool_calls"] == 1.0 and record["truncated"] == 0.5
    assert record["response_length"] == 1.5 and record["generation_seconds"] == 0.5
    assert (record["episodes"], record["generated_tokens"], record["episodes_total"]) == (2, 3, 2)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_rl_optimiser_decays_weights_only_when_asked(run_dir, weight_decay):
    """RL's AdamW has no weight decay by default (it would pull the policy towards 0): a zero
    gradient leaves the parameters exactly as they are, and a bound decay shrinks them."""
    setup = _setup(run_dir, weight_decay=weight_decay)
    params = init_learner(setup).policy.params
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = setup.optimizer.update(zeros, setup.optimizer.init(params), params)
    moved = max(float(jnp.max(jnp.abs(u))) for u in jax.tree.leaves(updates))
    assert (moved == 0.0) == (weight_decay == 0.0)


def test_an_episode_budget_gives_dynamic_sampling_fewer_steps_not_more_episodes(run_dir, tmp_path):
    """DAPO's dynamic sampling draws extra rounds; under one episode budget it spends exactly
    the episodes GRPO does (every round counted), in fewer steps."""
    budget, totals = 24, {}
    small = {"group_size": 2, "prompts_per_step": 2, "episode_budget": budget}
    for name, algo in {
        "grpo": small,
        "dapo": {**small, "loss_type": "dapo", "dynamic_sampling": True, "max_sampling_rounds": 3},
    }.items():
        _short_rl(tmp_path / name, run_dir, 20, **algo)
        records = read_metrics(tmp_path / name / "metrics.jsonl")
        totals[name] = (sum(r["episodes"] for r in records), len(records), records)
        assert records[-1]["episodes_total"] == totals[name][0]
        assert all(r["generated_tokens"] > 0 for r in records)
    (grpo, grpo_steps, _), (dapo, dapo_steps, dapo_records) = totals["grpo"], totals["dapo"]
    assert grpo == dapo == budget and grpo_steps == budget // 4
    assert any(r["sampling_rounds"] > 1 for r in dapo_records) and dapo_steps < grpo_steps


def test_an_episode_budget_smaller_than_a_group_is_refused():
    with pytest.raises(ValueError, match="episode_budget=3 is less than one group"):
        RLConfig(group_size=4, episode_budget=3)


def test_a_budget_that_ends_inside_a_step_trains_its_last_groups_alone(run_dir, tmp_path):
    """5 groups of budget with 2 prompts a step: the last round draws the 1 group left (a batch
    padded with masked repeats), dynamic sampling's rounds included, and the run stops there."""
    _short_rl(
        tmp_path / "odd",
        run_dir,
        20,
        loss_type="dapo",
        group_size=2,
        prompts_per_step=2,
        dynamic_sampling=True,
        episode_budget=10,
    )
    records = read_metrics(tmp_path / "odd" / "metrics.jsonl")
    assert sum(r["episodes"] for r in records) == records[-1]["episodes_total"] == 10
    assert records[-1]["episodes"] % 4 == 2  # the last round drew one group
