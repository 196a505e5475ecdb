"""Memory in RL (issue 25, item 9): episodes over sessions whose context is cleared between them,
a memory written and read through tools, rewards for useful writes and reads, and GRPO on it."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import task_model_dir
from tiny_tasks import train_rl_config

from agentic_jax.data.chat import Message, ToolCall, render
from agentic_jax.data.tokenizer import IM_END, TOOL_CALL, TOOL_CALL_END
from agentic_jax.envs.text import MemoryEnv, MultiSessionRecall, Text, TurnRewards, task_env
from agentic_jax.envs.text.strings import contains
from agentic_jax.models.export import load_model
from agentic_jax.post_training.common import token_logprobs
from agentic_jax.post_training.rl import _session_context
from agentic_jax.post_training.rollout import collect

ACTION = 48
MAX_LENGTH = 1344  # three sessions (difficulty 1) of ~350 prompt tokens and six turns
REWARDS = TurnRewards(useful_write=0.1, useful_read=0.1)
USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
RESULT = re.compile(r"<tool_result>\n(.*?)\n</tool_result>", re.S)
FACT = re.compile(r"[Mm]y ([a-z ]+?) is (\d+)")
QUESTION = re.compile(r"What is my ([a-z ]+)\?")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("memory")
    config, _, tokenizer = task_model_dir(path, max_seq_len=MAX_LENGTH + ACTION)
    return path, config, tokenizer


@pytest.fixture(scope="module")
def env(model):
    _, _, tokenizer = model
    return task_env(
        tokenizer,
        MultiSessionRecall(1),
        range(6),
        max_length=MAX_LENGTH,
        action_length=ACTION,
        turn_rewards=REWARDS,
    )


def _pad(ids):
    assert len(ids) <= ACTION
    return ids + [0] * (ACTION - len(ids))


def _call(tokenizer, name, arguments):
    rendered = render([Message("assistant", "", (ToolCall(name, arguments),))])
    text = TOOL_CALL + rendered.split(TOOL_CALL)[1].split(TOOL_CALL_END)[0] + TOOL_CALL_END
    return _pad(tokenizer.encode(text) + [tokenizer.token_id(IM_END)])


def _answer(tokenizer, answer):
    text = f"<think>from memory</think><answer>{answer}</answer>"
    return _pad(tokenizer.encode(text) + [tokenizer.token_id(IM_END)])


def scripted(tokenizer, *, store: bool, recall: bool, seen: list | None = None):
    """A policy that reads only what it is shown (the current session): it stores the fact it is
    told (``store``), recalls before answering a question (``recall``), and answers with the
    number in its context (a recall's result, or the question's session itself)."""

    def turn(view):
        text = tokenizer.decode(view.tolist())
        user, results = USER.findall(text)[-1], RESULT.findall(text)
        fact, question = FACT.search(user), QUESTION.search(user)
        if store and fact and not results:
            return _call(tokenizer, "remember", {"text": fact.group(0)})
        if recall and question and not results:
            return _call(tokenizer, "recall", {"query": f"my {question.group(1)}"})
        number = re.findall(r"\d+", " ".join(results) if question else "")
        return _answer(tokenizer, number[0] if number else "unknown")

    def backend(tokens, length, active, key):
        del key
        actions = np.zeros((len(tokens), ACTION), np.int32)
        for row in np.flatnonzero(active):
            view = tokens[row, : length[row]]
            if seen is not None:
                seen.append((row, tokenizer.decode(view.tolist())))
            actions[row] = turn(view)
        return actions, np.zeros(actions.shape, np.float32)

    return backend


def _play(model, env, backend):
    _, config, _ = model
    params = env.default_params
    return collect(
        None,
        config,
        env,
        params,
        np.arange(params.tasks.size),
        key=jax.random.key(0),
        backend=backend,
    )


def test_storing_and_recalling_the_fact_earns_the_most(model, env):
    _, _, tokenizer = model
    runs = {
        (store, recall): _play(model, env, scripted(tokenizer, store=store, recall=recall))
        for store, recall in [(True, True), (True, False), (False, False), (False, True)]
    }
    # The memory policy answers every task, with the two memory bonuses; remembering alone earns
    # the write bonus but not the answer; without a stored fact only the format reward is left.
    assert np.all(runs[True, True].reward == pytest.approx(1.0))
    assert np.all(runs[False, False].reward == pytest.approx(0.1))
    total = {k: (r.turn_rewards * r.turn_mask).sum(1) for k, r in runs.items()}
    assert np.all(total[True, True] == pytest.approx(1.2))
    assert np.all(total[True, False] == pytest.approx(0.2))
    assert np.all(total[False, False] == pytest.approx(0.1))
    assert np.all(total[False, True] == pytest.approx(0.1))  # recalls an empty memory
    means = {k: float(v.mean()) for k, v in total.items()}
    assert means[True, True] > means[True, False] > means[False, False]
    assert means[True, True] > means[False, True]
    rollouts = runs[True, True]
    # Three sessions: remember + answer, remember + answer, recall + answer, all jitted steps.
    assert np.all(rollouts.turns == 6) and not rollouts.truncated.any()
    assert np.all(rollouts.sessions.max(1) == 2)


def test_the_context_is_cleared_between_sessions(model, env):
    _, _, tokenizer = model
    seen = []
    rollouts = _play(model, env, scripted(tokenizer, store=False, recall=False, seen=seen))
    tasks = [MultiSessionRecall(1).sample(s) for s in range(6)]
    for row, view in seen:
        if "What is my" in view:  # the last session's context: neither the fact nor session 1
            assert tasks[row].answer not in view and "keep this in mind" not in view
    transcript = tokenizer.decode(rollouts.tokens[0, : rollouts.length[0]].tolist())
    assert tasks[0].answer in transcript  # the training row still holds every session
    # Each session is a segment of its own, starting where its prompt starts.
    starts = np.flatnonzero(np.diff(rollouts.sessions[0]))
    assert [tokenizer.decode(rollouts.tokens[0, s + 1 : s + 3].tolist()) for s in starts] == [
        "<|bos|><|im_start|>"
    ] * 2


def test_each_session_is_scored_in_the_context_it_was_sampled_in(model, env):
    path, config, tokenizer = model
    _, params = load_model(path / "model")
    rollouts = _play(model, env, scripted(tokenizer, store=True, recall=True))
    tokens, sessions = rollouts.tokens[:1], rollouts.sessions[:1]
    whole = token_logprobs(params, config, tokens, **_session_context(jnp.asarray(sessions)))
    last = int(np.flatnonzero(np.diff(sessions[0]))[-1]) + 1  # where the last session opens
    alone = token_logprobs(params, config, tokens[:, last:])
    policy = rollouts.loss_mask[0, last:] > 0
    np.testing.assert_allclose(
        np.asarray(whole)[0, last:][policy], np.asarray(alone)[0][policy], atol=1e-5
    )


def test_a_recall_returns_the_stored_text_under_jit(model, env):
    _, _, tokenizer = model
    reset, step = env.batched
    params = env.default_params
    _, state = reset(jnp.arange(2), params)
    text = "my gym pin is 1234, key: blue"
    for action in (
        _call(tokenizer, "remember", {"text": text}),
        _call(tokenizer, "remember", {"text": text}),
        _call(tokenizer, "recall", {"query": "gym pin"}),
    ):
        before = np.asarray(state.length)
        _, state, *_, info = step(
            jax.random.split(jax.random.key(0), 2), state, jnp.asarray([action] * 2), params
        )
        message = tokenizer.decode(np.asarray(state.tokens[0, before[0] :]).tolist())
    assert text in message  # spelled in single-byte tokens, decoding to exactly the stored text
    assert int(state.memory.writes[0]) == 1  # the duplicate was not stored again
    assert not np.asarray(info["useful_read"]).any()  # a recall before the last session


def test_contains_finds_a_traced_pattern():
    def text(value, size=16):
        return Text(*map(jnp.asarray, Text.from_bytes(value, size)))

    found = jax.jit(contains)
    assert found(text(b"my code is 4821"), text(b"4821", 8))
    assert not found(text(b"my code is 482"), text(b"4821", 8))
    assert not found(text(b"anything"), text(b"", 8))


def test_rl_memory_config_trains_a_tiny_model(model, tmp_path):
    path, _, _ = model
    bindings = [
        f"train_rl.init_from = '{path}'",
        "train_rl.steps = 2",
        "train_rl.eval_every = 0",
        "train_rl.progress = False",
        "RLConfig.group_size = 2",
        "RLConfig.prompts_per_step = 1",
        "agentic_jax.envs.text.MultiSessionRecall.difficulty = 1",
        "rl/TaskSpec.num_train = 2",
        "rl/TaskSpec.num_heldout = 1",
        f"rl/TaskSpec.max_length = {MAX_LENGTH}",
        f"rl/TaskSpec.action_length = {ACTION}",
    ]
    last = train_rl_config("rl_memory", bindings, tmp_path / "run")
    assert last["step"] == 2


def test_memory_env_needs_both_memory_tools(model):
    _, _, tokenizer = model
    generator = MultiSessionRecall(1)
    task = generator.sample(0)
    with pytest.raises(ValueError, match="one Remember and one Recall"):
        MemoryEnv(tokenizer, [task], generator.reward, tools=generator.tools[:1])
