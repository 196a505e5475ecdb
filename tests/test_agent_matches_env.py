"""The agent harness and the text environments render one conversation, so a model post-trained
in the environments solves the same problems through `agentic-jax agent` as its report says."""

import contextlib
import json

import gin
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import task_model_dir, task_tokenizer

from agentic_jax import config as gin_config
from agentic_jax.agents.policies.base import ScriptedPolicy
from agentic_jax.agents.session import AgentConfig, make_agent, run_session
from agentic_jax.agents.tools.base import tool_specs
from agentic_jax.agents.tools.builtin import builtin_tool
from agentic_jax.data.chat import render_ids, with_tools
from agentic_jax.envs.host import PythonSandbox
from agentic_jax.envs.text import Arithmetic
from agentic_jax.envs.text.generators import FORMAT
from agentic_jax.envs.text.rewards import answer_text
from agentic_jax.envs.text.tools import Calculator
from agentic_jax.inference.serving.chat_model import ChatModel
from agentic_jax.inference.serving.engine import EngineConfig
from agentic_jax.inference.serving.openai_server import OpenAIServer
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.evaluate import evaluate_policy
from agentic_jax.post_training.sft import train_sft
from agentic_jax.post_training.tasks import TaskSpec

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def agent_calculator_config():
    """``configs/agent_calculator.gin`` as `agentic-jax agent` parses it."""
    import agentic_jax.registry  # noqa: F401

    gin.clear_config()
    gin_config.parse(["agent_calculator"], [])
    config = AgentConfig()
    gin.clear_config()
    return config


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return task_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def test_the_harness_builtins_are_the_environments_tools():
    assert builtin_tool("calculator").spec == Calculator().spec
    assert builtin_tool("python").spec == PythonSandbox().spec
    assert builtin_tool("calculator")(expression="7 - 2 * 4") == Calculator().run_host(
        "7 - 2 * 4", None
    )


@given(seed=st.integers(0, 10**6), difficulty=st.integers(1, 4))
def test_the_harness_shows_the_model_the_environments_conversation(
    agent_calculator_config, tokenizer, seed, difficulty
):
    """Replaying a task's demonstration through the configured ReAct agent, every prompt the model
    gets (messages plus the tools' section, as the serving layer renders them) is the task's
    conversation up to that turn, token for token, and the run ends with the task's answer."""
    task = Arithmetic(difficulty).sample(seed)
    turns = [m for m in task.demonstration if m.role == "assistant"]
    policy = ScriptedPolicy([{"text": m.content, "tool_calls": m.tool_calls} for m in turns])
    result = make_agent(agent_calculator_config, policy).run(task.prompt[-1].content)
    conversation = task.conversation()
    assert len(policy.calls) == len(turns)
    for messages, names, _ in policy.calls:
        shown = with_tools(messages, tool_specs(builtin_tool(n) for n in names))
        assert shown == list(conversation[: len(shown)])
        assert conversation[len(shown)].role == "assistant"
        np.testing.assert_array_equal(
            render_ids(shown, tokenizer).ids, render_ids(conversation[: len(shown)], tokenizer).ids
        )
    assert answer_text(result.answer) == task.answer


def test_the_agent_verb_solves_the_problems_the_environment_says_its_model_solves(
    tmp_path, agent_calculator_config
):
    """A tiny model fine-tuned until it solves some of a few calculator problems: greedy success per
    problem in the jitted environment (what the main job's report measures) equals success through
    the configured agent session on the same checkpoint; served over HTTP, its first turn on a
    problem it solves is the demonstration's tool call, as the official ``openai`` client reads
    it."""
    (tmp_path / "base").mkdir()
    task_model_dir(tmp_path / "base", max_seq_len=256, n_layers=2)
    spec = TaskSpec(
        generators=(Arithmetic(1, partial_credit=False),),
        num_train=6,
        num_heldout=2,
        max_length=192,
        action_length=40,
    )
    sft = str(tmp_path / "sft")
    train_sft(
        sft,
        init_from=str(tmp_path / "base"),
        tasks=spec,
        steps=300,
        batch_size=6,
        peak_lr=6e-3,
        warmup_steps=5,
        eval_every=0,
        checkpoint_every=1000,
        progress=False,
    )
    config, params, tokenizer = load_checkpoint(sft)
    env_success = evaluate_policy(params, config, spec.env(tokenizer, "train")).success
    tasks = spec.tasks("train")
    results = run_session(
        agent_calculator_config,
        [t.prompt[-1].content for t in tasks],
        checkpoint=sft,
        approver=None,
        write=lambda line: None,
    )
    agent_success = [
        r.answer is not None and answer_text(r.answer) == t.answer for r, t in zip(results, tasks)
    ]
    assert env_success.any(), "the fine-tuned model should solve some of its problems"
    np.testing.assert_array_equal(agent_success, env_success)

    solved = tasks[int(np.argmax(env_success))]
    [expected] = solved.demonstration[0].tool_calls
    with (
        contextlib.closing(ChatModel.from_checkpoint(sft, EngineConfig(num_slots=1))) as model,
        OpenAIServer(model, host="127.0.0.1", port=0, model_name="rl") as server,
    ):
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="rl",
            messages=[
                {"role": "system", "content": FORMAT},  # the server adds the tools' section
                {"role": "user", "content": solved.prompt[-1].content},
            ],
            tools=[builtin_tool("calculator").spec.openai()],
            temperature=0,
            max_tokens=40,
        )
    [call] = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == expected.name
    assert json.loads(call.function.arguments) == expected.arguments
