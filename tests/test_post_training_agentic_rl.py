"""Agentic RL beyond final-answer rewards: turn rewards and turn-level credit, learned rewards,
host tools (and the coding task), behaviour log-probs with off-policy correction, on-policy
self-distillation, stability alarms, engine rollouts, and exact resumption with all of it on."""

import dataclasses
import os
import shutil
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from killed_runs import kill_when_exists, run_to_end
from tiny_models import task_model_dir
from tiny_tasks import SHORT

from agentic_jax import rl
from agentic_jax.data.tokenizer import IM_END
from agentic_jax.envs.coding import Coding, HiddenTests, passed_fraction
from agentic_jax.envs.host import TIMEOUT, HostTextEnv, ToolPool
from agentic_jax.envs.text import Arithmetic, Tool, TurnRewards
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.monitors import MonitorConfig, RLStopped
from agentic_jax.post_training.reward import load_reward_model, save_reward_head
from agentic_jax.post_training.rl import (
    RLConfig,
    StepRandom,
    _policy_loss,
    advantages,
    init_learner,
    make_setup,
    sample,
    score,
    train_rl,
)
from agentic_jax.post_training.rollout import collect
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.metrics import read_metrics

TOOLS = TaskSpec(
    generators=(Arithmetic(2, partial_credit=False),),
    num_train=8,
    num_heldout=2,
    max_length=160,
    action_length=32,
    turn_rewards=TurnRewards(valid_call=0.05, invalid_call=-0.05, milestone=0.2),
)
CODING = TaskSpec(
    generators=(Coding(2, timeout_s=5.0),),
    num_train=4,
    num_heldout=2,
    max_length=288,
    action_length=32,
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("agentic")
    config, _, tokenizer = task_model_dir(path, max_seq_len=320)
    return path, config, tokenizer


def _setup(run_dir, spec=TOOLS, env=None, **algo):
    path, _, tokenizer = run_dir
    config, base, _ = load_checkpoint(path)
    algorithm = RLConfig(**{"group_size": 2, "prompts_per_step": 2, **algo})
    env = env if env is not None else spec.env(tokenizer, "train")
    return make_setup(
        config, base, env, algorithm, steps=4, peak_lr=1e-2, seed=3, tasks=spec.tasks("train")
    )


# ------------------------------------------------------------------------------- host tools
class Slow(Tool):
    name, argument, messages = "slow", "seconds", ()

    def run_host(self, argument, task):
        time.sleep(float(argument))
        return "woke up"


class Failing(Tool):
    name, argument, messages = "failing", "what", ()

    def run_host(self, argument, task):
        raise RuntimeError(f"cannot {argument}")


def _turn(tokenizer, text, width):
    ids = tokenizer.encode(text) + [tokenizer.token_id(IM_END)]
    return ids + [0] * (width - len(ids))


def _call(name, argument, key):
    return (
        f'<tool_call>\n{{"name": "{name}", "arguments": {{"{key}": "{argument}"}}}}\n</tool_call>'
    )


def test_host_tools_in_a_batch_slow_failing_and_direct_rows(run_dir):
    """Rows calling a slow tool, a failing tool, and none at all finish with the right tool
    messages and rewards; the slow call ends at the pool's deadline, nothing raises."""
    path, config, tokenizer = run_dir
    _, params, _ = load_checkpoint(path)
    tasks = Arithmetic(1).tasks(range(3))
    env = HostTextEnv(
        tokenizer,
        tasks,
        Arithmetic(1).reward,
        tools=(Slow(), Failing()),
        max_length=264,
        action_length=48,
        max_turns=2,
        pool=ToolPool(4, timeout_s=1.0),
    )
    answer = [f"<think>x</think><answer>{t.answer}</answer>" for t in tasks]
    script = [
        [_call("slow", "30", "seconds"), _call("failing", "fly", "what"), answer[2]],
        [answer[0], answer[1], answer[2]],
    ]

    def scripted(tokens, length, active, key):
        turn, scripted.turn = scripted.turn, scripted.turn + 1
        actions = np.array([_turn(tokenizer, text, 48) for text in script[turn]], np.int32)
        return actions, np.full(actions.shape, -0.5, np.float32) * (actions != 0)

    scripted.turn = 0
    rollouts = collect(
        params, config, env, env.default_params, [0, 1, 2], key=jax.random.key(0), backend=scripted
    )
    texts = [tokenizer.decode(rollouts.tokens[b, : rollouts.length[b]]) for b in range(3)]
    assert f"<tool_result>\n{TIMEOUT}\n</tool_result>" in texts[0]
    assert "<tool_result>\nerror: RuntimeError: cannot fly\n</tool_result>" in texts[1]
    assert "<tool_result>" not in texts[2]
    np.testing.assert_allclose(rollouts.reward, [1.0, 1.0, 1.0])
    assert rollouts.tool_calls.tolist() == [1, 1, 0] and rollouts.turns.tolist() == [2, 2, 1]
    # The sampler's log-probs sit exactly on the policy's tokens.
    np.testing.assert_array_equal(rollouts.behaviour_logp != 0, rollouts.loss_mask == 1)
    for b in range(3):
        for k in range(int(rollouts.turns[b])):
            start, end = rollouts.turn_spans[b, k]
            assert rollouts.loss_mask[b, start:end].all()


def test_the_coding_task_rewards_the_fraction_of_hidden_tests_passed():
    tests = HiddenTests("f", ((1, 2), (2, 4), (3, 6), (0, 0)))
    assert passed_fraction("def f(x):\n    return 2 * x", tests) == 1.0
    assert passed_fraction("def f(x):\n    return x + 1", tests) == 0.25  # only f(1) == 2
    assert passed_fraction("def f(x):\n    while True: pass", tests, timeout_s=1.0) == 0.0
    assert passed_fraction("this is not python", tests) == 0.0
    task = Coding(3).sample(0)
    reward = Coding(3).reward
    assert reward.host(task.demonstration[-1].content, task) == pytest.approx(1.0)
    assert reward.host(task.corrupted[-1].content, task) < 0.5


def test_train_rl_runs_on_host_tools_with_the_coding_task(run_dir, tmp_path):
    path, _, _ = run_dir
    last = train_rl(
        str(tmp_path / "coding"),
        init_from=str(path),
        tasks=CODING,
        steps=2,
        peak_lr=1e-3,
        algorithm=RLConfig(group_size=2, prompts_per_step=2),
        host_tools=True,
        progress=False,
    )
    records = read_metrics(tmp_path / "coding" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2] and np.isfinite(last["loss"])
    assert os.path.isdir(tmp_path / "coding" / "model")


# ------------------------------------------------------------------------------- token in, token out
def test_the_trainer_learns_on_exactly_the_sampled_ids_and_log_probs(run_dir):
    """A multi-turn host-tool episode: the trainer's ids and masks are the rollout's, the tool
    message is the tool's text tokenized once, and the trainer's log-probs of the sampled
    tokens equal the sampler's (same weights, same precision): nothing was re-tokenised."""
    _, _, tokenizer = run_dir
    env = TOOLS.host_env(tokenizer, "train")
    setup = _setup(run_dir, env=env, temperature=1.0)
    learner = init_learner(setup)
    samples = sample(setup, learner, StepRandom(3, 1))
    scores = score(setup, learner, samples)
    batch, _, _ = advantages(setup, learner, samples, scores)
    r = samples.rollouts
    np.testing.assert_array_equal(np.asarray(batch["tokens"]), r.tokens)
    np.testing.assert_array_equal(np.asarray(batch["mask"]), r.loss_mask)
    policy = r.loss_mask == 1
    np.testing.assert_allclose(scores.old_logp[policy], r.behaviour_logp[policy], atol=2e-4)
    head_length = len(env.head)
    for b in np.flatnonzero(r.tool_calls):
        end = r.turn_spans[b, 0, 1]
        tail = r.tokens[b, end:]
        tail = tail[int(tail[0] == env.im_end_id) :]  # the env closes an unclosed turn
        assert tail[:head_length].tolist() == env.head


# ------------------------------------------------------------------------------- turn rewards and credit
def test_turn_credit_gives_each_tokens_its_turns_advantage(run_dir):
    setup = _setup(run_dir, credit="turn", shaping_coef=0.1, efficiency_per_call=0.01)
    learner = init_learner(setup)
    samples = sample(setup, learner, StepRandom(3, 1))
    scores = score(setup, learner, samples)
    r = samples.rollouts
    # Potential-based shaping telescopes: an episode's shaped return is its unshaped return.
    plain = (r.turn_rewards * r.turn_mask).sum(1)
    np.testing.assert_allclose(
        (scores.turn_rewards * r.turn_mask).sum(1), scores.rewards, atol=1e-5
    )
    assert np.allclose(
        scores.rewards,
        plain
        + np.asarray(
            rl.efficiency_penalty(
                jnp.asarray(r.success),
                jnp.asarray(r.tool_calls),
                jnp.asarray(r.response_length),
                per_call=0.01,
            )
        ),
        atol=1e-5,
    )
    batch, _, _ = advantages(setup, learner, samples, scores)
    returns = rl.turn_returns(jnp.asarray(scores.turn_rewards), jnp.asarray(r.turn_mask))
    expected = rl.spread_over_turns(
        rl.turn_group_advantages(
            returns.reshape(2, 2, -1), jnp.asarray(r.turn_mask).reshape(2, 2, -1)
        ).reshape(returns.shape),
        jnp.asarray(r.turn_spans),
        r.tokens.shape[1],
    )
    np.testing.assert_allclose(batch["advantages"], expected, atol=1e-6)
    sliced = _setup(run_dir, credit="turn", slice_turns=True)
    sliced_batch, _, _ = advantages(sliced, learner, samples, score(sliced, learner, samples))
    turns = r.turn_mask.shape[1]
    assert sliced_batch["tokens"].shape[0] == 4 * turns
    np.testing.assert_array_equal(
        np.asarray(sliced_batch["mask"]).reshape(4, turns, -1).sum(1), r.loss_mask
    )


# ------------------------------------------------------------------------------- learned rewards
def test_a_reward_model_scores_episodes_as_called_directly_and_combines_by_gdpo(run_dir, tmp_path):
    path, config, _ = run_dir
    rm_dir = tmp_path / "rm"
    shutil.copytree(path, rm_dir)  # the policy's trunk and tokenizer, with a fixed head
    head = {"w": jnp.linspace(-1, 1, config.d_model), "b": jnp.float32(0.3)}
    for kind in ("outcome", "process"):
        save_reward_head(rm_dir, head, kind=kind, max_steps=3)
        model = load_reward_model(rm_dir)
        setup = _setup(
            run_dir,
            reward_combination="gdpo",
            reward_weights=(1.0, 0.5),
            step_aggregation="product",
        )
        setup = dataclasses.replace(setup, reward_model=model)
        learner = init_learner(setup)
        samples = sample(setup, learner, StepRandom(3, 1))
        scores = score(setup, learner, samples)
        r = samples.rollouts
        direct = model.episode_rewards(r.tokens, r.loss_mask, aggregation="product")
        np.testing.assert_allclose(scores.model_rewards, direct, rtol=1e-6)
        stacked = np.stack([scores.verifier, direct], -1).reshape(2, 2, 2)

        def z(x):  # the numpy reference of GDPO's per-group normalisation
            centred = x - x.mean(1, keepdims=True)
            return centred / (x.std(1, ddof=1, keepdims=True) + 1e-6)

        expected = (z(stacked[..., 0]) * 1.0 + z(stacked[..., 1]) * 0.5).reshape(-1)
        np.testing.assert_allclose(scores.rewards, expected, atol=1e-4)


# ------------------------------------------------------------------------------- off-policy correction
def test_with_the_sampler_equal_to_the_trainer_the_correction_is_exactly_one(run_dir):
    plain = _setup(run_dir)
    corrected = _setup(run_dir, correction="tis", correction_level="sequence")
    learner = init_learner(plain)
    samples = sample(plain, learner, StepRandom(3, 2))
    scores = score(plain, learner, samples)
    scores = scores._replace(old_logp=samples.rollouts.behaviour_logp)  # identical log-probs
    batch, _, _ = advantages(plain, learner, samples, scores)
    fixed, _, metrics = advantages(corrected, learner, samples, scores)
    mask = np.asarray(batch["mask"])
    np.testing.assert_array_equal(
        np.asarray(fixed["advantages"]) * mask, np.asarray(batch["advantages"])[:, None] * mask
    )
    assert metrics["mismatch_max"] == 0.0 and metrics["ess"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "lag", [{"staleness": 1}, {"sampler_dtype": "bfloat16"}], ids=["one_step_stale", "bf16_sampler"]
)
def test_off_policy_sampling_with_correction_matches_on_policy_training(run_dir, tmp_path, lag):
    """On the trivially learnable digit task, a sampler one update behind, or in bf16, with TIS
    reaches the on-policy run's reward within 0.1 (mean of the last 3 of 8 steps)."""
    path, _, _ = run_dir

    def final_reward(name, **algo):
        train_rl(
            str(tmp_path / name),
            init_from=str(path),
            tasks=SHORT,
            steps=8,
            peak_lr=1e-2,
            algorithm=RLConfig(group_size=4, prompts_per_step=4, **algo),
            progress=False,
        )
        records = read_metrics(tmp_path / name / "metrics.jsonl")
        return np.mean([r["reward_mean"] for r in records[-3:]]), records

    on_policy, on_records = final_reward("on")
    off_policy, records = final_reward("off", correction="tis", **lag)
    assert on_policy > on_records[0]["reward_mean"] + 0.1  # the task is learnt, so this compares
    assert abs(off_policy - on_policy) < 0.1, (on_policy, off_policy)
    # the sampler really differed from the trainer (a stale one from the first update on)
    assert min(r["mismatch_mean"] for r in records[1:]) > 1e-5
    assert all(0 < r["ess"] <= 1 + 1e-6 for r in records)


# ------------------------------------------------------------------------------- self-distillation
def test_self_distillation_with_the_students_own_context_is_zero_with_zero_gradient(run_dir):
    setup = _setup(
        run_dir,
        distill_coef=1.0,
        policy_coef=0.0,
        distill_context="none",
        distill_teacher="current",
    )
    learner = init_learner(setup)
    samples = sample(setup, learner, StepRandom(3, 1))
    batch, _, _ = advantages(setup, learner, samples, score(setup, learner, samples))
    np.testing.assert_array_equal(
        batch["teacher_tokens"][:, : batch["tokens"].shape[1]], batch["tokens"]
    )
    loss = _policy_loss(setup.config, setup.algo, setup.max_response)
    params = setup.policy_params(learner)
    (total, (_, metrics)), grads = jax.value_and_grad(
        lambda p: (lambda t, c, m: (t, (c, m)))(*loss(p, batch, None)), has_aux=True
    )(params)
    assert float(total) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics["distill_kl"]) == pytest.approx(0.0, abs=1e-6)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) < 1e-6
    # With the privileged hint the teacher's distributions differ, and so does the loss.
    hinted = _setup(run_dir, distill_coef=1.0, policy_coef=0.0, distill_context="solution")
    batch, _, _ = advantages(hinted, learner, samples, score(hinted, learner, samples))
    text = hinted.env.tokenizer.decode(np.asarray(batch["teacher_tokens"][0]))
    assert "For reference, a correct solution ends with" in text
    hinted_loss = _policy_loss(hinted.config, hinted.algo, hinted.max_response, hinted.base)
    total, _, metrics = hinted_loss(params, batch, None)
    assert float(metrics["distill_kl"]) > 1e-6 and float(total) > 1e-6  # (random model: small)


# ------------------------------------------------------------------------------- alarms
def test_an_alarm_named_in_stop_on_ends_the_run_saying_why(run_dir, tmp_path):
    path, _, _ = run_dir
    monitor = MonitorConfig(kl_bound=-1.0, stop_on=("kl_bound",))  # any KL is above -1
    with pytest.raises(RLStopped, match="kl_bound"):
        train_rl(
            str(tmp_path / "stopped"),
            init_from=str(path),
            tasks=TOOLS,
            steps=3,
            algorithm=RLConfig(group_size=2, prompts_per_step=2),
            monitor=monitor,
            progress=False,
        )
    [record] = read_metrics(tmp_path / "stopped" / "metrics.jsonl")
    assert "kl_bound" in record["alarms"] and "prompt_response_mi" in record
    assert os.path.isdir(tmp_path / "stopped" / "checkpoints" / "1")


# ------------------------------------------------------------------------------- engine rollouts
def test_engine_rollouts_equal_generate_rollouts_when_greedy(run_dir):
    path, config, tokenizer = run_dir
    _, params, _ = load_checkpoint(path)
    env = TOOLS.env(tokenizer, "train")
    from agentic_jax.inference.decoding.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    a, b = (
        collect(
            params,
            config,
            env,
            env.default_params,
            [0, 1, 2],
            group_size=2,
            sampling=greedy,
            key=jax.random.key(0),
            backend=backend,
        )
        for backend in ("generate", "engine")
    )
    for field in ("tokens", "loss_mask", "length", "reward", "turns", "turn_spans"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


# ------------------------------------------------------------------------------- exact resumption
RUN = """
import sys
from agentic_jax.envs.text import Arithmetic, TurnRewards
from agentic_jax.post_training.monitors import MonitorConfig
from agentic_jax.post_training.rl import RLConfig, train_rl
from agentic_jax.post_training.tasks import TaskSpec

spec = TaskSpec(generators=(Arithmetic(2, partial_credit=False),), num_train=8, num_heldout=2,
                max_length=160, action_length=32,
                turn_rewards=TurnRewards(valid_call=0.05, invalid_call=-0.05, milestone=0.2))
algorithm = RLConfig(group_size=2, prompts_per_step=2, credit="turn", shaping_coef=0.1,
                     efficiency_per_call=0.01, correction="tis", staleness=1, distill_coef=0.1,
                     reward_combination="gdpo", reward_weights=(1.0, 0.5), epochs=2,
                     minibatches=2)
train_rl(sys.argv[1], init_from=sys.argv[2], tasks=spec, algorithm=algorithm, steps=4,
         peak_lr=1e-2, checkpoint_every=2, progress=False, monitor=MonitorConfig(),
         reward_model=sys.argv[3], backend="engine", host_tools=True)
"""


def test_a_run_killed_mid_step_with_every_option_resumes_with_identical_metrics(run_dir, tmp_path):
    path, config, _ = run_dir
    rm_dir = tmp_path / "rm"
    shutil.copytree(path, rm_dir)
    head = {"w": jnp.linspace(-1, 1, config.d_model), "b": jnp.float32(0.0)}
    save_reward_head(rm_dir, head, kind="process", max_steps=3)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(RUN))

    def cmd(name):
        return [sys.executable, str(script), str(tmp_path / name), str(path), str(rm_dir)]

    run_to_end(cmd("whole"))
    kill_when_exists(cmd("killed"), tmp_path / "killed" / "checkpoints" / "2")  # during step 3
    run_to_end(cmd("killed"))
    timing = ("generation_seconds", "training_seconds")

    def records(name):
        return [
            {k: v for k, v in r.items() if k not in timing}
            for r in read_metrics(tmp_path / name / "metrics.jsonl")
        ]

    assert records("killed") == records("whole") and len(records("whole")) == 4
    assert {
        "turn_reward_mean",
        "mismatch_mean",
        "distill_kl",
        "reward_std_within_group",
        "model_reward_mean",
    } <= set(records("whole")[0])


def test_every_new_option_is_refused_when_misspelt():
    for bad in (
        {"credit": "step"},
        {"correction": "vtrace"},
        {"distill_context": "answer"},
        {"reward_combination": "mean"},
        {"credit": "turn", "advantage": "opo"},
        {"slice_turns": True, "advantage": "gae"},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RLConfig(**bad)
