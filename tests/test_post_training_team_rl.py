"""Team RL: a solver and a verifier sharing one tiny policy, with per-role GRPO advantages."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import changed_weights, task_model_dir
from tiny_tasks import SHORT

from agentic_jax.envs.text import ExactAnswer
from agentic_jax.post_training.monitors import MonitorConfig, RLStopped
from agentic_jax.post_training.rl import RLConfig, StepRandom, init_learner, sample, score
from agentic_jax.post_training.team_rl import (
    ROLES,
    VERDICT_LENGTH,
    TeamRLConfig,
    check_algorithm,
    final_answers,
    make_team_setup,
    score_roles,
    team_batch,
    team_step,
    train_team_rl,
    usage,
    verification_task,
    verify,
)
from agentic_jax.training.metrics import read_metrics

GROUP, PROMPTS = 4, 2
# SHORT's problems with room for the verifier's prompt (its role prompt, the problem, the answer)
TEAM = dataclasses.replace(SHORT, max_length=128)


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """A joint-schedule team over a random d=32 model, its first learner and one step's episodes."""
    path = tmp_path_factory.mktemp("team")
    config, params, tokenizer = task_model_dir(path, max_seq_len=TEAM.max_length + VERDICT_LENGTH)
    setup = make_team_setup(
        config,
        params,
        TEAM.env(tokenizer, "train"),
        TEAM.tasks("train"),
        RLConfig(group_size=GROUP, prompts_per_step=PROMPTS),
        TeamRLConfig(cost_per_token=0.01, cost_per_message=0.1),
        steps=4,
        peak_lr=1e-2,
        seed=5,
    )
    learner = init_learner(setup.rl)
    solver = sample(setup.rl, learner, StepRandom(5, 3))
    roles = {"solver": solver, "verifier": verify(setup, learner, solver, StepRandom(5, 3))}
    return setup, learner, roles, path


def _grpo(rewards: np.ndarray) -> np.ndarray:
    """GRPO's advantages in numpy: (r − group mean) / (Bessel std + 1e-6), groups of GROUP rows."""
    groups = rewards.reshape(-1, GROUP).astype(np.float64)
    centered = groups - groups.mean(axis=1, keepdims=True)
    return (centered / (groups.std(axis=1, ddof=1, keepdims=True) + 1e-6)).ravel()


def test_verifier_sees_the_problem_and_the_final_answer_only(team):
    setup, _, roles, _ = team
    solver, verifier = roles["solver"].rollouts, roles["verifier"].rollouts
    answers = final_answers(solver, setup.tokenizer)
    for row, answer in enumerate(answers):
        shown = setup.tokenizer.decode(verifier.tokens[row][verifier.loss_mask[row] == 0])
        question = setup.tasks[solver.task[row]].prompt[-1].content
        assert f"Problem: {question}\nProposed answer: {answer}" in shown
        assert "<think>" not in shown and setup.team.verifier_prompt in shown


def test_verifier_reward_is_one_exactly_when_its_verdict_matches_the_ground_truth(team):
    setup, _, roles, _ = team
    solver, verifier = roles["solver"].rollouts, roles["verifier"].rollouts
    verdicts = np.asarray(final_answers(verifier, setup.tokenizer))
    assert set(verdicts) <= {"yes", "no"}  # the constraint makes every verdict parse
    truth = np.where(solver.success, "yes", "no")
    np.testing.assert_array_equal(verifier.reward, (verdicts == truth).astype(np.float32))
    assert set(verifier.reward) == {0.0, 1.0} and set(verdicts) == {"yes", "no"}
    task = setup.tasks[0]
    for correct in (True, False):
        problem = verification_task(setup, task, "15", correct, room=200)
        for verdict in ("yes", "no"):
            expected = float(verdict == ("yes" if correct else "no"))
            assert ExactAnswer().host(f"<answer>{verdict}</answer>", problem) == expected


def test_a_long_proposal_is_cut_until_the_verifier_prompt_fits(team):
    setup, _, _, _ = team
    task = setup.tasks[0]
    problem = verification_task(setup, task, "7 " * 200, True, room=100)
    assert 95 <= len(setup.markers.prompt_ids(problem.prompt, setup.tokenizer)) <= 100
    assert "Proposed answer: 7 7" in problem.prompt[-1].content and problem.answer == "yes"


def test_token_and_message_accounting_counts_each_roles_generated_turns(team):
    setup, learner, roles, _ = team
    for role in ROLES:
        r = roles[role].rollouts
        spans = (r.turn_spans[..., 1] - r.turn_spans[..., 0]) * r.turn_mask
        tokens, messages = usage(r)
        np.testing.assert_array_equal(tokens, spans.sum(axis=1))
        np.testing.assert_array_equal(messages, r.turn_mask.sum(axis=1))
    assert (usage(roles["verifier"].rollouts)[1] == 1).all()
    charged = score_roles(setup, learner, roles)
    for role in ROLES:
        plain = score(setup.rl, learner, roles[role]).rewards
        tokens, messages = usage(roles[role].rollouts)
        np.testing.assert_allclose(
            charged[role].rewards, plain - 0.01 * tokens - 0.1 * messages, rtol=1e-6
        )


@settings(deadline=None, max_examples=15)
@given(
    st.lists(st.integers(0, 4), min_size=GROUP * PROMPTS, max_size=GROUP * PROMPTS),
    st.lists(st.integers(0, 4), min_size=GROUP * PROMPTS, max_size=GROUP * PROMPTS),
)
def test_each_roles_advantages_are_relative_to_its_own_group(team, solver, verifier):
    setup, learner, roles, _ = team
    rewards = {
        "solver": np.asarray(solver, np.float32),
        "verifier": np.asarray(verifier, np.float32),
    }
    scores = score_roles(setup, learner, roles)
    scores = {r: s._replace(rewards=rewards[r]) for r, s in scores.items()}
    batch = team_batch(setup, learner, roles, scores, ROLES)
    expected = np.concatenate([_grpo(rewards["solver"]), _grpo(rewards["verifier"])])
    np.testing.assert_allclose(batch["advantages"], expected, rtol=1e-4, atol=1e-5)
    masks = [roles[r].rollouts.loss_mask for r in ROLES]
    np.testing.assert_array_equal(batch["mask"], np.concatenate(masks))


def test_per_role_baselines_differ_from_pooling_both_roles_into_one_group(team):
    setup, learner, roles, _ = team
    solver = np.asarray([1, 0, 0, 0, 1, 1, 1, 0], np.float32)
    verifier = np.asarray([1, 1, 1, 0, 0, 0, 1, 0], np.float32)
    scores = score_roles(setup, learner, roles)
    scores = {
        "solver": scores["solver"]._replace(rewards=solver),
        "verifier": scores["verifier"]._replace(rewards=verifier),
    }
    batch = team_batch(setup, learner, roles, scores, ROLES)
    both = np.concatenate([solver.reshape(-1, GROUP), verifier.reshape(-1, GROUP)], axis=1)
    centered = both - both.mean(axis=1, keepdims=True)
    pooled = centered / (both.std(axis=1, ddof=1, keepdims=True) + 1e-6)
    pooled = np.concatenate([pooled[:, :GROUP].ravel(), pooled[:, GROUP:].ravel()])
    assert not np.allclose(batch["advantages"], pooled, atol=1e-3)
    np.testing.assert_allclose(
        batch["advantages"], np.concatenate([_grpo(solver), _grpo(verifier)]), rtol=1e-4, atol=1e-5
    )


def _moved(before, after) -> float:
    return max(
        jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), before, after))
    )


def test_a_joint_step_trains_both_roles_and_is_reproducible(team):
    setup, learner, _, _ = team
    after, record = team_step(setup, learner, 1)
    again, repeat = team_step(setup, learner, 1)
    assert record["roles_trained"] == list(ROLES) and np.isfinite(record["loss"])
    assert _moved(learner.policy.params, after.policy.params) > 0
    untimed = {k: v for k, v in record.items() if not k.endswith("_seconds")}
    assert untimed == {k: v for k, v in repeat.items() if not k.endswith("_seconds")}
    jax.tree.map(np.testing.assert_array_equal, after.policy.params, again.policy.params)
    for key in ("verdict_accuracy", "team_accept_rate", "team_success", "solver_tokens"):
        assert np.isfinite(record[key])
    if "team_precision" in record:
        assert record["team_success"] <= record["team_accept_rate"]
    assert record["verifier_messages"] == 1.0


def test_alternate_steps_train_the_solver_then_the_verifier(team):
    setup, learner, roles, _ = team
    alternate = dataclasses.replace(setup, team=TeamRLConfig(schedule="alternate"))
    first, one = team_step(alternate, learner, 1)
    second, two = team_step(alternate, first, 2)
    assert one["roles_trained"] == ["solver"] and two["roles_trained"] == ["verifier"]
    assert np.isfinite(one["loss"]) and np.isfinite(two["loss"])
    assert _moved(learner.policy.params, first.policy.params) > 0
    assert _moved(first.policy.params, second.policy.params) > 0
    scores = score_roles(alternate, learner, roles)
    batch = team_batch(alternate, learner, roles, scores, ("verifier",))
    np.testing.assert_array_equal(batch["mask"], roles["verifier"].rollouts.loss_mask)


def test_bad_options_are_refused_by_name(team):
    setup, _, _, _ = team
    with pytest.raises(ValueError, match="schedule"):
        TeamRLConfig(schedule="round_robin")
    with pytest.raises(ValueError, match="cost_per_token"):
        TeamRLConfig(cost_per_token=-0.1)
    with pytest.raises(ValueError, match="cost_per_message"):
        TeamRLConfig(cost_per_message=-1.0)
    for name, algo in (
        ("advantage='gae'", RLConfig(advantage="gae", loss_type="ppo", group_size=1)),
        ("credit='turn'", RLConfig(credit="turn")),
        ("dynamic_sampling", RLConfig(dynamic_sampling=True)),
        ("correction", RLConfig(correction="tis")),
        ("episode_budget", RLConfig(episode_budget=64)),
        ("distill_coef", RLConfig(distill_coef=0.1)),
        ("slice_turns", RLConfig(slice_turns=True)),
    ):
        with pytest.raises(ValueError, match=f"RLConfig.{name}"):
            check_algorithm(algo)
    with pytest.raises(ValueError, match="tasks for an env"):
        make_team_setup(
            setup.rl.config,
            setup.rl.base,
            setup.rl.env,
            setup.tasks[:3],
            setup.rl.algo,
            setup.team,
            steps=1,
            peak_lr=1e-3,
        )


def test_train_team_rl_writes_each_steps_record_and_the_trained_model(team, tmp_path):
    _, _, _, path = team
    last = train_team_rl(
        str(tmp_path / "run"),
        init_from=str(path),
        tasks=TEAM,
        algorithm=RLConfig(group_size=GROUP, prompts_per_step=PROMPTS),
        team=TeamRLConfig(schedule="alternate"),
        steps=2,
        peak_lr=1e-2,
        seed=5,
    )
    records = read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
    assert [r["roles_trained"] for r in records] == [["solver"], ["verifier"]]
    assert records[-1] == last and np.isfinite(last["team_accept_rate"])
    assert changed_weights(path / "model", tmp_path / "run" / "model")


def test_train_team_rl_runs_the_stability_monitors_and_stops_on_a_named_alarm(team, tmp_path):
    """The team trainer shares train_rl's step loop: an alarm named in ``stop_on`` ends the run
    after its step is written and checkpointed, and the record names the alarm."""
    _, _, _, path = team
    with pytest.raises(RLStopped, match="kl_bound"):
        train_team_rl(
            str(tmp_path / "run"),
            init_from=str(path),
            tasks=TEAM,
            algorithm=RLConfig(group_size=GROUP, prompts_per_step=PROMPTS),
            steps=3,
            peak_lr=1e-2,
            progress=False,
            monitor=MonitorConfig(kl_bound=-1.0, stop_on=("kl_bound",)),  # any KL is above -1
        )
    records = read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
    assert [r["step"] for r in records] == [1] and "kl_bound" in records[0]["alarms"]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["1"]
