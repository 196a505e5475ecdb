"""Text environments, SFT and RL of an imported instruct model in its own chat template and
tool-call format: the Qwen2.5-style (Hermes) template of ``test_data_hf_chat`` and its tiny
tokenizer, with transformers' ``apply_chat_template`` as the oracle."""

import dataclasses

import jax
import numpy as np
import pytest
from test_data_hf_chat import CHATML, CHATML_MARKED, _hf_tokenizer
from tiny_models import task_tokenizer

from agentic_jax.data.chat import split_tools, with_tools
from agentic_jax.data.tokenizer import load_tokenizer
from agentic_jax.envs.text import Arithmetic, ChatMarkers, demonstration_actions, task_env
from agentic_jax.models import init_params
from agentic_jax.models.hf import from_hf_config
from agentic_jax.post_training.rl import RLConfig, init_learner, make_setup, rl_step
from agentic_jax.post_training.sft import chat_examples

transformers = pytest.importorskip("transformers")

ENV = dict(max_length=640, action_length=64)


def _qwen_style(path, template):
    hf = _hf_tokenizer(template, eos="<|im_end|>")
    hf.pad_token = "<unk>"  # Qwen2.5 pads with a token of its own that is not the end of a turn
    hf.save_pretrained(path)
    return hf, load_tokenizer(path)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return _qwen_style(tmp_path_factory.mktemp("qwen"), CHATML)


@pytest.fixture(scope="module")
def tasks():
    return Arithmetic(1).tasks(range(3))


@pytest.fixture(scope="module")
def env(qwen):
    return task_env(qwen[1], Arithmetic(1), range(3), **ENV)


def _dicts(messages):
    """Messages as the OpenAI dicts transformers takes."""
    out = []
    for m in messages:
        d = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
                for c in m.tool_calls
            ]
        out.append(d)
    return out


def _hf_ids(hf, messages, tools, **kwargs):
    return list(hf.apply_chat_template(_dicts(messages), tools=tools, return_dict=False, **kwargs))


def test_markers_and_tool_message_are_what_the_template_renders(qwen, tasks, env):
    hf, _ = qwen
    markers = env.markers
    assert markers.tool_format.name == "hermes"
    assert (markers.open_id, markers.close_id) == tuple(
        hf.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    )
    assert markers.end_of_turn_id == hf.convert_tokens_to_ids("<|im_end|>")
    assert hf.decode(list(markers.head)) == "\n<|im_start|>user\n<tool_response>\n"
    assert hf.decode(list(markers.tail)) == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

    task = tasks[0]
    prompt, specs = split_tools(task.prompt)
    assert [s.name for s in specs] == ["calculator"]
    tools = [s.openai() for s in specs]
    call, result = task.demonstration[:2]
    obs, state = jax.jit(env.reset_task)(0, env.default_params)
    expected_prompt = _hf_ids(hf, prompt, tools, add_generation_prompt=True)
    assert obs["tokens"][: obs["length"]].tolist() == expected_prompt

    # The policy's call turn as the template writes it, fed as the action.
    with_call = _hf_ids(hf, [*prompt, call], tools)
    turn = with_call[len(expected_prompt) :]
    turn = turn[: turn.index(markers.end_of_turn_id) + 1]
    action = np.full(env.action_length, env.vocab.pad_id, np.int32)
    action[: len(turn)] = turn
    obs, state, _, terminated, _, info = jax.jit(env.step_env)(
        jax.random.key(0), state, action, env.default_params
    )
    assert bool(info["tool_call"]) and bool(info["call_ok"]) and not bool(terminated)
    expected = _hf_ids(hf, [*prompt, call, result], tools, add_generation_prompt=True)
    assert obs["tokens"][: obs["length"]].tolist() == expected
    mask = np.asarray(obs["loss_mask"][: obs["length"]])
    assert mask.sum() == len(turn) and mask[len(expected_prompt)] == 1


def test_a_scripted_episode_is_rewarded_as_with_the_projects_template(
    qwen, tasks, env, tmp_path_factory
):
    project = task_tokenizer(tmp_path_factory.mktemp("project"))
    project_env = task_env(project, Arithmetic(1), range(3), **ENV)
    rewards = []
    for tokenizer, played in ((qwen[1], env), (project, project_env)):
        step = jax.jit(played.step_env)
        per_task = []
        for row, task in enumerate(tasks):
            _, state = played.reset_task(row, played.default_params)
            total = 0.0
            for action in _actions(played, tokenizer, task.conversation()):
                _, state, reward, terminated, _, _ = step(
                    jax.random.key(0), state, action, played.default_params
                )
                total += float(reward)
            assert bool(terminated)
            per_task.append(total)
        rewards.append(per_task)
    assert rewards[0] == rewards[1] and min(rewards[0]) > 0.9


def _actions(env, tokenizer, conversation):
    """The assistant turns of a conversation, rendered by the env's template, as actions."""
    messages, specs = split_tools(conversation)
    rendered = env.markers.template.render_ids(messages, tokenizer, specs)
    return demonstration_actions(rendered, env.action_length, env.vocab.pad_id)


def test_call_markers_must_be_single_tokens_and_prompts_keep_their_tools(qwen, tasks):
    _, ours = qwen
    with pytest.raises(ValueError, match="'llama3_json' tool-call format"):
        ChatMarkers.build(ours, tool_format="llama3_json")
    assert ChatMarkers.build(ours, tool_format="llama3_json", calls=False).open_id == -1
    for task in tasks:  # the tool section `with_tools` wrote comes back as the template's tools
        messages, specs = split_tools(task.prompt)
        assert with_tools(messages, specs) == list(task.prompt) and len(specs) == 1
    assert split_tools(tasks[0].prompt[1:]) == (list(tasks[0].prompt[1:]), [])


def test_sft_trains_on_the_templates_assistant_tokens(qwen, tmp_path):
    """With ``{% generation %}`` the mask is transformers' own; without, the prefix spans give
    the same tokens (both cover each assistant turn through its ``<|im_end|>``)."""
    from test_data_hf_chat import _conversation

    hf_marked, marked = _qwen_style(tmp_path, CHATML_MARKED)
    conversation = _conversation("Weather?", "Cold.", 'Oslo "old"', with_tool=True)
    expected = hf_marked.apply_chat_template(
        conversation, return_dict=True, return_assistant_tokens_mask=True
    )
    for tokenizer in (marked, qwen[1]):
        [example] = chat_examples([conversation], tokenizer, seq_len=256)
        assert example["tokens"].tolist() == expected["input_ids"][:-1]
        assert example["loss_mask"].tolist() == expected["assistant_masks"][1:]
        assert sum(expected["assistant_masks"]) > 0


def test_one_grpo_step_in_the_calculator_env_with_a_qwen2_model(qwen, tasks, env):
    """A GRPO step of a tiny random Qwen2-architecture model: of each group one episode calls
    the calculator in the Hermes format and answers right, the other answers wrong at once
    (a scripted sampler: a random model rarely calls); the env runs the call, the rewards
    differ, and the model's update moves its weights."""
    _, ours = qwen
    qwen2 = transformers.Qwen2Config(
        vocab_size=ours.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
    )  # fmt: skip
    config = from_hf_config(qwen2.to_dict())
    assert config.qkv_bias  # Qwen2's architecture
    params = init_params(config, jax.random.key(0))
    bank = env.default_params.tasks
    scripts = []  # per task: (the demonstration's turns, a wrong answer at once)
    for task in tasks:
        wrong = _actions(env, ours, task.conversation(correct=False))[-1:]
        scripts.append((_actions(env, ours, task.conversation()), wrong))

    def scripted(tokens, length, active, key):
        actions = np.full((len(length), env.action_length), env.vocab.pad_id, np.int32)
        for row, (ids, n) in enumerate(zip(np.asarray(tokens), np.asarray(length))):
            task = next(
                i for i, p in enumerate(np.asarray(bank.prompt))
                if np.array_equal(ids[: bank.prompt_length[i]], p[: bank.prompt_length[i]])
            )  # fmt: skip
            turn = int(np.sum(ids[bank.prompt_length[task] : n] == env.markers.open_id))
            turns = scripts[task][row % 2]
            if active[row] and turn < len(turns):
                actions[row] = turns[turn]
        return actions, np.zeros(actions.shape, np.float32)

    setup = make_setup(
        config, params, env, RLConfig(group_size=2, prompts_per_step=1), steps=1, peak_lr=1e-3
    )
    setup = dataclasses.replace(setup, backend=scripted)
    learner, record = rl_step(setup, init_learner(setup), 1)
    assert record["tool_calls"] == 0.5 and record["reward_std"] > 0
    numbers = [v for v in record.values() if isinstance(v, float)]
    assert all(np.isfinite(numbers))
    moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), learner.policy.params, params)
    assert all(jax.tree.leaves(moved))
