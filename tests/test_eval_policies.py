"""The policy `agentic-jax eval` plays: a checkpoint, an endpoint, or either with test-time
compute (search, voting) bound in gin, evaluated on the same suite and report."""

import gin
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import task_model_dir

import agentic_jax.registry  # noqa: F401  (every configurable, as the CLI has them)
from agentic_jax import config as gin_config
from agentic_jax.agents.policies.base import PolicyError
from agentic_jax.agents.policies.search import SearchPolicy
from agentic_jax.cli import main
from agentic_jax.envs.text import Arithmetic
from agentic_jax.eval.suites.episodes import play
from agentic_jax.eval.suites.report import load_result
from agentic_jax.eval.suites.run import open_policy, policy_name
from agentic_jax.post_training.reward import load_reward_model, save_reward_head
from agentic_jax.reasoning import State
from agentic_jax.reasoning.search import policy_rows


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    """A tiny policy checkpoint and a process reward model beside it."""
    policy, rm = tmp_path_factory.mktemp("policy"), tmp_path_factory.mktemp("rm")
    config, _, _ = task_model_dir(policy, max_seq_len=384)
    task_model_dir(rm, max_seq_len=384, seed=1)
    head = {"w": jnp.linspace(-1, 1, config.d_model), "b": jnp.zeros(())}
    save_reward_head(rm, head, kind="process", max_steps=4)
    return policy, rm


class Base:
    def __init__(self, name):
        self.name, self.closed = name, False

    def respond(self, messages, tools=(), **sampling):
        raise AssertionError("not called")

    def close(self):
        self.closed = True


class Wrapper:
    def __init__(self, policy, n=3):
        self.policy, self.n = policy, n


def test_open_policy_builds_what_gin_binds_and_names_it(tmp_path):
    built = open_policy(str(tmp_path), search=Base, vote=Wrapper)
    assert isinstance(built, Wrapper) and built.policy.name == str(tmp_path)
    assert policy_name(built, "ckpt") == (
        f"Wrapper(n=3) over Base(name='{tmp_path}', closed=False) over ckpt"
    )
    with pytest.raises(ValueError, match="exactly one of checkpoint and endpoint"):
        open_policy()
    with pytest.raises(ValueError, match="exactly one of checkpoint and endpoint"):
        open_policy(str(tmp_path), "http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="give a checkpoint"):
        open_policy(endpoint="http://127.0.0.1:1/v1", search=Base)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        open_policy(str(tmp_path / "missing"))


@pytest.mark.parametrize("config", ["policy_beam", "policy_mcts"])
def test_the_search_configs_build_a_search_policy_scored_by_the_reward_model(config, run_dirs):
    policy_dir, rm_dir = run_dirs
    gin_config.parse(
        ["eval_arithmetic", config], [f"eval.reward_model_scorer.run_dir = '{rm_dir}'"]
    )
    try:
        policy = open_policy(str(policy_dir))
    finally:
        gin.clear_config()
    assert isinstance(policy, SearchPolicy)
    searches = {"policy_beam": "step_beam_search", "policy_mcts": "tree_search"}
    assert policy.search.__name__ == searches[config]
    # The scorer is the reward model's aggregated step probabilities on the policy's tokens.
    rm = load_reward_model(rm_dir)
    rng = np.random.default_rng(0)
    states = [
        State(tuple(int(t) for t in tokens), 3, (tuple(int(t) for t in tokens[3:]),))
        for tokens in (rng.integers(5, 400, n) for n in (6, 9, 14))
    ]
    tokens, mask = policy_rows(states, rm.tokenizer.pad_id or 0)
    expected = rm.episode_rewards(tokens, mask, aggregation="min")
    np.testing.assert_allclose(policy.score(states), expected, rtol=1e-6)
    assert len(set(np.round(expected, 6))) == 3


def test_the_eval_verb_evaluates_a_voting_policy_and_saves_its_config(run_dirs, tmp_path, capsys):
    policy_dir, _ = run_dirs
    out = tmp_path / "vote"
    flags = ["num_tasks=1", "seeds=[0]", "ks=[1]", "max_steps=1", "max_tokens=8"]
    argv = ["eval", "--suite", "arithmetic", "--checkpoint", str(policy_dir), "--out", str(out)]
    argv += ["--gin_file", "policy_vote", "--gin_param", "agents.VotingPolicy.n = 2"]
    argv += [a for f in flags for a in ("--gin_param", f"eval.Suite.{f}")]
    assert main(argv) == 0
    result = load_result(out)
    assert result["evaluated"].startswith("VotingPolicy(n=2, temperature=0.7, weight=None) over")
    assert result["evaluated"].endswith(f"over {policy_dir}")
    episodes = result["episodes"]["original"]
    # Each turn sampled twice: a turn is never charged less than two samples' prompts.
    assert all(e["prompt_tokens"] >= 2 * 50 for e in episodes if e["steps"])
    operative = (out / "operative_config.gin").read_text()
    assert "VotingPolicy.n = 2" in operative
    assert "operative_config.gin" in capsys.readouterr().out


def test_the_eval_verb_evaluates_a_beam_search_policy_within_its_token_budget(run_dirs, tmp_path):
    policy_dir, rm_dir = run_dirs
    out = tmp_path / "beam"
    flags = ["num_tasks=1", "seeds=[0]", "ks=[1]", "max_steps=2"]
    argv = ["eval", "--suite", "arithmetic", "--checkpoint", str(policy_dir), "--out", str(out)]
    argv += ["--gin_file", "policy_beam"]
    for binding in (
        f"eval.reward_model_scorer.run_dir = '{rm_dir}'",
        "agents.SearchPolicy.tokens = 64",
        "reasoning.step_beam_search.width = 2",
        "reasoning.step_beam_search.max_steps = 3",
        "eval.Suite.generators = [@d1/Arithmetic()]",
        *(f"eval.Suite.{f}" for f in flags),
    ):
        argv += ["--gin_param", binding]
    assert main(argv) == 0
    result = load_result(out)
    assert result["evaluated"].startswith("SearchPolicy(score=score, search=step_beam_search, ")
    assert "tokens=64" in result["evaluated"]
    (episode,) = result["episodes"]["original"]
    # Every turn's search stops within 64 sampled tokens, and is charged what it sampled.
    assert 0 < episode["completion_tokens"] <= 64 * episode["steps"]


def test_a_policy_error_is_kept_in_words_in_the_episode():
    class Failing:
        def respond(self, messages, tools=(), **sampling):
            raise PolicyError("the prompt has 999 tokens")

    generator = Arithmetic(1)
    (task,) = generator.tasks([7])
    episode = play(Failing(), task, generator.tools, generator.reward)
    assert not episode.success and episode.stop_reason == "policy_error"
    assert episode.error == "the prompt has 999 tokens"
