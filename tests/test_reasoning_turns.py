"""Steps that are agent turns: `TurnModel` over a host text env with the calculator executed."""

import dataclasses

import jax
import numpy as np
import pytest
from tiny_models import task_model_dir
from tiny_tasks import replay_demonstrations

from agentic_jax.envs.text import Arithmetic, demonstration_actions
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.post_training.rollout import collect
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.reasoning import (
    Budget,
    State,
    StepTree,
    TurnModel,
    best_of_n,
    episode_return,
    mcts,
    step_beam_search,
    step_scores,
    token_scorer,
)

SPEC = TaskSpec(generators=(Arithmetic(2),), num_train=6, max_length=320, action_length=40)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    config, params, tokenizer = task_model_dir(tmp_path_factory.mktemp("m"), max_seq_len=360)
    env = SPEC.host_env(tokenizer)
    return TurnModel(params, config, tokenizer, env=env), env


@pytest.mark.parametrize("correct", [True, False])
def test_replayed_demonstrations_render_the_conversation_and_earn_the_verifier_reward(
    setup, monkeypatch, correct
):
    model, env = setup
    replay_demonstrations(monkeypatch, env, correct)
    rows = list(range(len(env.tasks)))
    final = model.complete(model.roots(rows), key=jax.random.key(0))
    for row, state in zip(rows, final):
        task = env.tasks[row]
        rendered = task.render(model.tokenizer, correct)
        # The transcript is the rendered conversation (tool messages included), token for token.
        assert state.tokens == tuple(int(t) for t in rendered.ids[: len(state.tokens)])
        assert len(rendered.ids) - len(state.tokens) <= 1  # at most the closing newline
        assert state.done and len(state.steps) == len(demonstration_actions(rendered, 40))
        assert state.tokens == state.tokens[: state.prompt_length] + sum(state.steps, ())
        assert state.reward == pytest.approx(
            env.reward.host(task.conversation(correct)[-1].content, task)
        )
        assert (state.reward == env.reward.max_value) == correct
    # A reward model sees the policy's tokens only, the tool messages masked out, on every prefix.
    policy_tokens = token_scorer(lambda tokens, mask: mask.sum(axis=1))
    scores, valid = step_scores(policy_tokens, final)
    for row, state in enumerate(final):
        mask = env.tasks[row].render(model.tokenizer, correct).assistant_mask
        turns = demonstration_actions(env.tasks[row].render(model.tokenizer, correct), 40)
        per_turn = np.cumsum([(t != env.pad_id).sum() for t in turns])
        assert policy_tokens([state])[0] == mask.sum() == per_turn[-1]
        np.testing.assert_array_equal(scores[row][valid[row] > 0], per_turn)


def test_greedy_turns_equal_the_rollout_collector(setup):
    """Step by step greedy turns give the transcripts and rewards of ``collect``'s episodes."""
    model, env = setup
    rows = range(len(env.tasks))
    final = model.complete(model.roots(rows), key=jax.random.key(0), temperature=0)
    episodes = collect(
        model.params,
        model.config,
        env,
        env.default_params,
        rows,
        sampling=SamplingParams(temperature=0.0),
        key=jax.random.key(0),
    )
    for row, state in enumerate(final):
        assert state.done
        assert state.tokens == tuple(episodes.tokens[row, : episodes.length[row]].tolist())
        assert len(state.steps) == episodes.turns[row]
    np.testing.assert_allclose([s.reward for s in final], episodes.reward, atol=1e-6)


def test_searches_run_on_turns_within_budget_and_oracle_selection_is_pass_at_n(setup):
    model, env = setup
    start = model.roots([0])[0]
    budget = Budget(tokens=600)
    result = step_beam_search(
        model, start, episode_return, key=jax.random.key(1), width=2, expansions=2, budget=budget
    )
    assert budget.tokens_spent <= 600 and budget.prompt_tokens_spent >= budget.calls_spent
    assert result.best.reward == max(s.reward for s in result.candidates)
    samples = model.complete([start] * 4, key=jax.random.key(2))
    chosen = samples[best_of_n(episode_return(samples))]
    assert chosen.reward == max(s.reward for s in samples)
    tree = StepTree(model, k=2, reward=lambda s: s.reward, max_steps=env.default_params.max_turns)
    out = mcts.search(
        None,
        jax.random.key(3),
        tree.root_output([start]),
        tree.recurrent_fn,
        num_simulations=6,
        max_depth=env.default_params.max_turns,
    )
    assert int(mcts.tree_size(out.search_tree)[0]) <= 7
    assert all(s.episode is not None for s in tree.states)


def test_turn_model_rejects_a_model_too_short_for_the_env(setup):
    model, env = setup
    config = dataclasses.replace(model.config, max_seq_len=env.max_length - 1)
    with pytest.raises(ValueError, match="max_seq_len"):
        TurnModel(model.params, config, model.tokenizer, env=env)
    with pytest.raises(ValueError, match="HostTextEnv"):
        TurnModel(model.params, model.config, model.tokenizer)
    with pytest.raises(ValueError, match=r"TurnModel\.roots"):
        model.expand([State((1, 2), 2)], 1, key=jax.random.key(0))
