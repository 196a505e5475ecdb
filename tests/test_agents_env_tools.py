"""Harness tools in the RL environments: a ``@tool`` function and an MCP server's tool, called from
a batched `HostTextEnv` step beside a malformed call, give the tool messages the harness would."""

import numpy as np
import pytest
from tiny_models import task_tokenizer

from agentic_jax.agents import env_tool, tool
from agentic_jax.agents.protocols.mcp_client import MCPSession
from agentic_jax.agents.protocols.mcp_server import AgentMCPServer
from agentic_jax.data.chat import Message, ToolCall, render
from agentic_jax.data.tokenizer import IM_END, TOOL_CALL, TOOL_CALL_END
from agentic_jax.envs.host import HostTextEnv
from agentic_jax.envs.text import Arithmetic, TurnRewards

ACTION = 96


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool
def shout(text: str, times: int = 1) -> str:
    """The text in capitals, repeated."""
    return " ".join([text.upper()] * times)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return task_tokenizer(tmp_path_factory.mktemp("tok"))


def _action(tokenizer, name, arguments):
    rendered = render([Message("assistant", "", (ToolCall(name, arguments),))])
    text = TOOL_CALL + rendered.split(TOOL_CALL)[1].split(TOOL_CALL_END)[0] + TOOL_CALL_END
    ids = tokenizer.encode(text) + [tokenizer.token_id(IM_END)]
    assert len(ids) <= ACTION
    return ids + [0] * (ACTION - len(ids))


def _tool_message(tokenizer, state, row):
    text = tokenizer.decode(state.tokens[row, : state.length[row]])
    return text.rsplit("<tool_result>\n", 1)[1].split("\n</tool_result>")[0]


def test_tool_and_mcp_tools_run_in_a_host_env_batch(tokenizer):
    with MCPSession(AgentMCPServer(agent_tools=[shout]), name="remote") as session:
        (remote,) = session.tools(prefix="remote_")
        tasks = Arithmetic(1).tasks(range(4))
        env = HostTextEnv(
            tokenizer,
            tasks,
            Arithmetic(1).reward,
            tools=(env_tool(add), env_tool(remote)),
            max_length=320,
            action_length=ACTION,
            max_turns=2,
            turn_rewards=TurnRewards(valid_call=0.1, invalid_call=-0.2),
        )
        _, state = env.reset_tasks(np.arange(4))
        actions = np.array(
            [
                _action(tokenizer, "add", {"a": 2, "b": 40}),
                _action(tokenizer, "add", {"a": "two", "b": 1}),  # fails the signature
                _action(tokenizer, "remote_shout", {"text": "hi", "times": 2}),
                _action(tokenizer, "remote_shout", {"times": 2}),  # fails the server's schema
            ],
            np.int32,
        )
        _, state, reward, terminated, truncated, info = env.step_env(state, actions)
    messages = [_tool_message(tokenizer, state, row) for row in range(4)]
    assert messages[0] == "42" and messages[2] == "HI HI"
    assert messages[1].startswith("error: ToolArgumentError: invalid arguments for add")
    assert messages[3].startswith("error: ToolArgumentError: invalid arguments for remote_shout")
    assert "text" in messages[3]
    assert info["tool_call"].all() and not (terminated | truncated).any()
    np.testing.assert_array_equal(info["call_ok"], [True, False, True, False])
    np.testing.assert_allclose(reward, [0.1, -0.2, 0.1, -0.2])


def test_a_host_function_refuses_to_run_in_jit():
    with pytest.raises(TypeError, match="runs only in a HostTextEnv"):
        env_tool(add).run(None, None, None, None)
