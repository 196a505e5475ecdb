"""SearchPolicy: each turn the result of a test-time search over its steps."""

import functools

import jax
import numpy as np
import pytest
from tiny_models import make_model_dir

from agentic_jax.agents.loops.react import ReActAgent
from agentic_jax.agents.policies.base import PolicyError
from agentic_jax.agents.policies.search import SearchPolicy
from agentic_jax.agents.tools.builtin import calculator
from agentic_jax.data.chat import Message, render_ids
from agentic_jax.data.tokenizer import IM_END, TOOL_CALL, TOOL_CALL_END
from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.prompts import PromptBatch
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.reasoning import State, StepModel, step_beam_search, tree_search
from agentic_jax.reasoning.search import SearchResult


def _flat(states):
    return np.zeros(len(states))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("m")
    make_model_dir(path, max_seq_len=1024)
    return path


def test_a_greedy_width_one_search_turn_is_the_greedy_decoding(model_dir):
    greedy = functools.partial(step_beam_search, width=1, expansions=1, temperature=0.0)
    policy = SearchPolicy(str(model_dir), _flat, greedy, tokens=48, delimiters=(" ",))
    messages = [Message("user", "the model reads")]
    turn = policy.respond(messages)
    model = policy.model
    bos = model.tokenizer.bos_id is not None
    prompt = render_ids(messages, model.tokenizer, add_generation_prompt=True, add_bos=bos).ids
    prompt = prompt.tolist()
    reference = generate(
        model.params,
        model.config,
        PromptBatch.from_lists([prompt]),
        sampling=SamplingParams(temperature=0.0, max_tokens=48),
        key=jax.random.key(0),
    )
    tokens = np.asarray(reference.tokens[0, : int(reference.lengths[0])]).tolist()
    # The random model never ends its turn: the search stops at the budget, steps whole.
    assert turn.finish_reason == "length"
    assert turn.usage.completion_tokens <= 48 and turn.usage.prompt_tokens >= len(prompt)
    spent = turn.usage.completion_tokens  # width 1, one expansion: every sampled token is kept
    assert spent > 0 and turn.text == model.tokenizer.decode(tokens[:spent])


def _scripted(turn_text):
    """A search that 'finds' the given turn and charges a known cost."""

    def search(model, prompt, score, *, key, budget):
        tokenizer = model.tokenizer
        ids = []
        for piece in turn_text:
            special = piece in (TOOL_CALL, TOOL_CALL_END, IM_END)
            ids += [tokenizer.token_id(piece)] if special else tokenizer.encode(piece)
        budget.charge(3, len(ids), 5 * len(prompt))
        best = State(tuple(prompt) + tuple(ids), len(prompt), (tuple(ids),), done=True)
        return SearchResult(best, [best], np.zeros(1), budget)

    return search


def test_a_searched_tool_call_is_parsed_and_the_search_is_charged(model_dir):
    model = StepModel.from_checkpoint(model_dir)
    call = '\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n'
    answer = _scripted(["<answer>42</answer>", IM_END])
    policy = SearchPolicy(model, _flat, _scripted(["thinking", TOOL_CALL, call, TOOL_CALL_END]))
    turn = policy.respond([Message("user", "What is 6*7?")], tools=[calculator])
    assert turn.finish_reason == "tool_calls" and turn.text == "thinking"
    assert (turn.tool_calls[0].name, turn.tool_calls[0].arguments) == (
        "calculator",
        {"expression": "6*7"},
    )
    assert turn.usage.completion_tokens > 0 and turn.usage.prompt_tokens % 5 == 0
    # In an agent loop the call runs, and the next searched turn answers.
    searches = iter([policy.search, answer])
    policy.search = lambda *a, **k: next(searches)(*a, **k)
    result = ReActAgent(policy, tools=[calculator]).run("What is 6*7?")
    assert result.answer is not None, (result.stop_reason, result.detail)
    assert result.answer == "<answer>42</answer>"
    assert any(m.role == "tool" and "42" in m.content for m in result.messages)


def test_an_unparseable_turn_and_an_overlong_prompt_are_policy_errors(model_dir):
    model = StepModel.from_checkpoint(model_dir)
    broken = SearchPolicy(model, _flat, _scripted([TOOL_CALL, "not json", TOOL_CALL_END]))
    with pytest.raises(PolicyError, match="does not parse"):
        broken.respond([Message("user", "q")])
    with pytest.raises(PolicyError, match="max_seq_len"):
        SearchPolicy(model, _flat).respond([Message("user", "word " * 4000)])
    # A budget too small for one expansion samples nothing: an error, not an empty turn.
    starved = SearchPolicy(model, _flat, tokens=8)
    with pytest.raises(PolicyError, match="budget of 8 tokens per turn does not pay"):
        starved.respond([Message("user", "q")])


def test_mcts_search_under_the_policy_stays_in_its_token_budget(model_dir):
    search = functools.partial(tree_search, k=2, simulations=4, max_steps=3)
    policy = SearchPolicy(str(model_dir), _flat, search, tokens=40, delimiters=(" ",))
    turn = policy.respond([Message("user", "the model reads")], seed=3)
    again = policy.respond([Message("user", "the model reads")], seed=3)
    assert turn.usage.completion_tokens <= 40
    assert turn == again  # a seed makes the searched turn reproducible
