"""Expert iteration: search episodes as rollout rows, and rejection-sampling fine-tuning on them."""

import functools

import jax
import numpy as np
import pytest
from tiny_models import changed_weights, task_model_dir
from tiny_tasks import replay_demonstrations

from agentic_jax.envs.text import Arithmetic
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.rft import train_rft
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.reasoning import SearchSampler, step_beam_search, tree_search
from agentic_jax.training.metrics import read_metrics

SPEC = TaskSpec(generators=(Arithmetic(2),), num_train=4, max_length=320, action_length=40)


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    path = tmp_path_factory.mktemp("sft")
    task_model_dir(path, max_seq_len=360)
    return path


@pytest.mark.parametrize("correct", [True, False])
@pytest.mark.parametrize("search", ["mcts", "beam"])
def test_search_episodes_are_rollout_rows_of_the_episode_found(sft, monkeypatch, correct, search):
    config, params, tokenizer = load_checkpoint(sft)
    env = SPEC.host_env(tokenizer)
    replay_demonstrations(monkeypatch, env, correct)
    searches = {
        "mcts": functools.partial(tree_search, k=2, simulations=4, max_steps=4),
        "beam": functools.partial(step_beam_search, width=2, expansions=2, max_steps=4),
    }
    episodes = SearchSampler(searches[search])(
        params, config, tokenizer, SPEC, [0, 2], 2, jax.random.key(0)
    )
    assert episodes.tokens.shape == (4, SPEC.max_length)
    for row, task in enumerate(np.repeat([0, 2], 2)):
        rendered = env.tasks[task].render(tokenizer, correct)
        n = episodes.length[row]
        assert n in (len(rendered.ids), len(rendered.ids) - 1)  # the closing newline
        np.testing.assert_array_equal(episodes.tokens[row, :n], rendered.ids[:n])
        np.testing.assert_array_equal(episodes.loss_mask[row, :n], rendered.assistant_mask[:n])
        assert not episodes.loss_mask[row, n:].any()
    assert (episodes.success == correct).all()
    counts = episodes.sample_counts
    assert counts["episodes"] == 4 and counts["sampled_turns"] >= 4 * 3
    assert counts["generated_tokens"] >= episodes.loss_mask.sum()


def test_rejection_sampling_fine_tunes_on_the_searches_verified_episodes(
    sft, tmp_path, monkeypatch
):
    _, _, tokenizer = load_checkpoint(sft)
    replay_demonstrations(monkeypatch, SPEC.host_env(tokenizer))
    sampler = SearchSampler(functools.partial(tree_search, k=2, simulations=4, max_steps=4))
    train_rft(
        str(tmp_path / "exit"),
        init_from=str(sft),
        tasks=SPEC,
        rounds=1,
        prompts_per_round=3,
        samples_per_prompt=1,
        steps_per_round=2,
        batch_size=2,
        peak_lr=1e-2,
        sampler=sampler,
        progress=False,
    )
    (record,) = [r for r in read_metrics(tmp_path / "exit" / "metrics.jsonl") if "kept" in r]
    assert record["kept"] == 3 and record["success_rate"] == 1.0 and record["episodes"] == 3
    assert np.isfinite(record["loss"])
    assert changed_weights(sft / "model", tmp_path / "exit" / "model")
