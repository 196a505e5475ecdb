"""bench/text_envs.py at a tiny size: both envs do the same work on the same schedule (not speed)."""

import pathlib
import sys

import numpy as np
import pytest

from agentic_jax.envs.host import ToolPool

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import text_envs

STEPS = text_envs.TURNS + 1  # a whole episode, then the first call of the next one


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tokenizer = text_envs.make_tokenizer(tmp_path_factory.mktemp("tok"), corpus_docs=50)
    setup = text_envs.make_setup(tokenizer, num_tasks=8, pool=ToolPool(2, timeout_s=30.0))
    yield setup
    setup.host.pool.close()


def test_schedule_replays_each_episodes_demonstration(setup):
    schedule = text_envs.make_schedule(setup, 4, STEPS)
    assert schedule.episodes == 4 and schedule.env_steps == 4 * STEPS
    assert len(schedule.step_keys) == len(schedule.actions) == STEPS
    for actions in schedule.actions:
        assert actions.shape == (4, text_envs.ACTION_LENGTH) and actions.dtype == np.int32
    tool_call = setup.tokenizer.token_id("<tool_call>")
    for t in (0, 1, 3):  # every episode calls the calculator at these steps, and answers at step 2
        assert (schedule.actions[t] == tool_call).any(axis=1).all()
    assert not (schedule.actions[2] == tool_call).any()


@pytest.mark.parametrize("episodes", [1, 4])
def test_both_envs_give_identical_outputs_for_the_same_actions(setup, episodes):
    schedule = text_envs.make_schedule(setup, episodes, STEPS, seed=episodes)
    jitted = text_envs.play(
        setup.reset, setup.step, setup.jitted.default_params, schedule, record=True
    )
    host = text_envs.play(
        setup.host.reset, setup.host.step, setup.host.default_params, schedule, record=True
    )
    assert jitted.env_steps == host.env_steps == episodes * STEPS
    assert len(jitted.history) == len(host.history) == STEPS
    for (j_obs, *j_out, j_info), (h_obs, *h_out, h_info) in zip(jitted.history, host.history):
        for key in ("tokens", "loss_mask", "length"):
            np.testing.assert_array_equal(j_obs[key], h_obs[key])
            np.testing.assert_array_equal(
                j_info["final_observation"][key], h_info["final_observation"][key]
            )
        for j, h in zip(j_out, h_out):  # reward, terminated, truncated
            np.testing.assert_allclose(j, h, atol=1e-6)
        for key in ("task", "tool_call", "malformed_call"):
            np.testing.assert_array_equal(j_info[key], h_info[key])
    for t, (_, reward, terminated, truncated, info) in enumerate(host.history):
        answering = t % text_envs.TURNS == text_envs.TURNS - 1
        assert (info["tool_call"] == (not answering)).all() and not info["malformed_call"].any()
        assert (terminated == answering).all() and not truncated.any()
        np.testing.assert_allclose(reward, 1.0 if answering else 0.0)  # the demonstration's answer
    assert text_envs._same_state(jitted.state, host.state)
    transcript = setup.tokenizer.decode(host.history[0][4]["final_observation"]["tokens"][0])
    assert "<tool_result>" in transcript and "error" not in transcript  # a real calculator result


@pytest.mark.parametrize("episodes", [1, 4])
def test_measure_counts_the_same_steps_for_both_envs(setup, episodes):
    steps = text_envs.TURNS  # ends on the answering step, where the reward is checked
    result = text_envs.measure(setup, episodes, steps, repeats=2)
    assert result.episodes == episodes
    assert result.jitted_steps == result.host_steps == 2 * episodes * steps
    assert result.identical and result.reward == pytest.approx(1.0)
    assert result.jitted_s > 0 and result.host_s > 0 and result.compile_s > 0
    assert result.jitted_rate > 0 and result.host_rate > 0 and result.ratio > 0
    assert result.ratio == pytest.approx(result.host_s / result.jitted_s)
    rows = text_envs.table([result]).splitlines()
    assert rows[0].startswith("| episodes | jitted steps/s | host steps/s | ratio |")
    assert len(rows) == 3 and rows[2].startswith(f"| {episodes} |") and "| yes |" in rows[2]
