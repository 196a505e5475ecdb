"""Text environments: token tables, the in-jit calculator, tool-call parsing, masks and budgets."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import task_tokenizer

from agentic_jax.data.chat import Message, ToolCall, render, render_ids
from agentic_jax.data.tokenizer import IM_END, TOOL_CALL, TOOL_CALL_END
from agentic_jax.envs.text import (
    Arithmetic,
    Calculator,
    Lookup,
    NumericCloseness,
    Search,
    Task,
    Text,
    TurnRewards,
    Vocab,
    calculator,
    demonstration_actions,
    detokenize,
    encode_int,
    parse_call,
    parse_call_host,
    task_env,
)
from agentic_jax.envs.text.strings import count, find, starts_with

EXPR_BYTES = 48
INT32_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return task_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return Vocab.build(tokenizer)


# --- token tables -------------------------------------------------------------------------------

_detokenize = jax.jit(detokenize, static_argnums=3)


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=30))
def test_detokenize_recovers_the_utf8_bytes(tokenizer, vocab, text):
    ids = tokenizer.encode(text)
    ids = np.asarray(
        ids + [vocab.pad_id] * (128 - len(ids)), np.int32
    )  # one shape: one compilation
    data, length = _detokenize(vocab, ids, ids != vocab.pad_id, 256)
    assert bytes(np.asarray(data[: int(length)])) == text.encode()


def test_detokenize_reports_overflow_and_special_tokens_as_text(tokenizer, vocab):
    ids = np.asarray(tokenizer.encode("12 + 30") + [tokenizer.token_id(IM_END)], np.int32)
    data, length = detokenize(vocab, ids, np.ones_like(ids, bool), 4)
    assert int(length) == len("12 + 30<|im_end|>") and bytes(np.asarray(data)) == b"12 +"


_STRING_SIZE = 24
_search = jax.jit(
    lambda data, length, at: (
        find(Text(data, length), b"ab"),
        count(Text(data, length), b"ab"),
        starts_with(Text(data, length), b"aba", at),
    )
)


@given(
    st.text(alphabet="abx", max_size=_STRING_SIZE).map(str.encode),
    st.integers(-2, _STRING_SIZE + 2),
    st.integers(0, 4),
)
def test_byte_search_is_pythons_within_the_text_length(data, at, slack):
    """`find`, `count` and `starts_with` see only the first ``length`` bytes, as Python slicing."""
    length = max(len(data) - slack, 0)
    buffer = np.zeros(_STRING_SIZE, np.uint8)
    buffer[: len(data)] = np.frombuffer(data, np.uint8)
    first, hits, starts = _search(buffer, np.int32(length), np.int32(at))
    visible = data[:length]
    overlapping = sum(visible.startswith(b"ab", i) for i in range(len(visible)))
    assert int(first) == visible.find(b"ab") and int(hits) == overlapping
    assert bool(starts) == (at >= 0 and visible.startswith(b"aba", at))


_encode_ints = jax.jit(jax.vmap(encode_int, in_axes=(None, 0)))


@given(st.lists(st.integers(-INT32_MAX, INT32_MAX), min_size=32, max_size=32))
def test_encode_int_is_the_tokenizers_own_spelling(tokenizer, vocab, values):
    ids, lengths = _encode_ints(vocab, np.asarray(values, np.int32))
    for value, row, n in zip(values, np.asarray(ids), np.asarray(lengths)):
        assert row[:n].tolist() == tokenizer.encode(str(value))
    assert np.asarray(
        vocab.merge_rank < np.iinfo(np.int32).max
    ).any()  # the fixture's vocabulary merges digits


# --- calculator ---------------------------------------------------------------------------------

_evaluate = jax.jit(jax.vmap(calculator.evaluate))


def _run(expressions, batch=32):
    """Evaluates in jit, in batches of one shape (one compilation)."""
    data, length = np.zeros((batch, EXPR_BYTES), np.uint8), np.zeros((batch,), np.int32)
    out = []
    for start in range(0, len(expressions), batch):
        chunk = expressions[start : start + batch]
        data[:] = 0
        for row, e in zip(data, chunk):
            encoded = e.encode()[:EXPR_BYTES]
            row[: len(encoded)] = np.frombuffer(encoded, np.uint8)
        length[: len(chunk)] = [len(e.encode()) for e in chunk]
        out += [
            calculator.Evaluation(int(v), int(err), bool(ix), tuple(int(x) for x in lit if x >= 0))
            for v, err, ix, lit in list(zip(*map(np.asarray, _evaluate(data, length))))[
                : len(chunk)
            ]
        ]
    return out


def _tree(literals):
    """Expression trees: ("lit", n) | ("neg", t) | (op, left, right)."""
    return st.recursive(
        literals.map(lambda n: ("lit", n)),
        lambda inner: st.one_of(
            inner.map(lambda t: ("neg", t)), st.tuples(st.sampled_from("+-*/"), inner, inner)
        ),
        max_leaves=8,
    )


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def _show(tree, spaces):
    """Infix text with only the parentheses Python's precedence needs (plus a random spacing)."""
    kind = tree[0]
    if kind == "lit":
        return str(tree[1]), 4
    if kind == "neg":
        text, prec = _show(tree[1], spaces)
        return "-" + (text if prec >= 3 else f"({text})"), 3
    (left, lp), (right, rp) = _show(tree[1], spaces), _show(tree[2], spaces)
    left = left if lp >= _PREC[kind] else f"({left})"
    right = right if rp > _PREC[kind] else f"({right})"
    return f"{left}{' ' * spaces}{kind}{' ' * spaces}{right}", _PREC[kind]


def _python_order(tree):
    """Python's evaluation order over int32: the value, or the first error (ZeroDivisionError / overflow)."""
    kind = tree[0]
    if kind == "lit":
        value = tree[1]
    elif kind == "neg":
        value = -_python_order(tree[1])
    else:
        a, b = _python_order(tree[1]), _python_order(tree[2])
        if kind == "/" and b == 0:
            raise ZeroDivisionError
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[kind]
    if abs(value) > INT32_MAX:
        raise OverflowError
    return value


@given(st.lists(st.tuples(_tree(st.integers(0, 60)), st.integers(0, 1)), min_size=1, max_size=24))
def test_calculator_evaluates_like_python_floor_division(cases):
    texts = [_show(tree, spaces)[0] for tree, spaces in cases]
    for (tree, _), text, got in zip(cases, texts, _run(texts)):
        if len(text) > EXPR_BYTES:
            assert got.error == calculator.TOO_LONG
            continue
        try:
            _python_order(tree)
        except OverflowError:  # int32 only; Python would go on with a big integer
            assert got.error == calculator.OVERFLOW, text
            continue
        except ZeroDivisionError:
            pass
        try:
            expected = eval(text.replace("/", "//"))  # the stated convention: "/" is Python's "//"
        except ZeroDivisionError:
            assert got.error == calculator.DIV_ZERO, text
            continue
        assert (got.error, got.value) == (calculator.OK, expected), text
        assert got == calculator.evaluate_text(text, EXPR_BYTES)


@given(
    st.lists(
        _tree(st.sampled_from([0, 3, 46341, 65536, 2**31 - 1, 2**31])), min_size=1, max_size=24
    )
)
def test_calculator_reports_the_first_error_in_python_order(trees):
    texts = [_show(tree, 1)[0] for tree in trees]
    for tree, text, got in zip(trees, texts, _run(texts)):
        if len(text) > EXPR_BYTES:
            continue
        try:
            expected = (calculator.OK, _python_order(tree))
        except ZeroDivisionError:
            expected = (calculator.DIV_ZERO, 0)
        except OverflowError:
            expected = (calculator.OVERFLOW, 0)
        assert (got.error, got.value) == expected, text
        assert got == calculator.evaluate_text(text, EXPR_BYTES)


@given(st.lists(st.text(alphabet="0123456789+-*/() x", max_size=14), min_size=1, max_size=24))
def test_malformed_expressions_give_an_error_code_not_a_crash(texts):
    for text, got in zip(texts, _run(texts)):
        assert got.error in range(5) and (got.error == calculator.OK or got.value == 0)
        assert got == calculator.evaluate_text(text, EXPR_BYTES)
        try:
            python = eval(text.strip(" ").replace("/", "//"), {})
        except SyntaxError:
            assert got.error == calculator.SYNTAX, text
            continue
        except Exception:
            python = None
        if got.error == calculator.OK:
            assert got.value == python, text


def test_calculator_conventions():
    got = _run(
        [
            "-7 / 2",
            "7 / -2",
            "6 / 3",
            "1 / 0",
            "2147483647 + 1",
            "007",
            "00",
            "2 ** 3",
            "(1)(2)",
            "",
            "1/0 + )",
            "2 * -3 * 4",
            "--2",
            "1" * 60,
        ]
    )
    assert [(g.value, g.error) for g in got] == [
        (-4, 0),
        (-4, 0),
        (2, 0),
        (0, calculator.DIV_ZERO),
        (0, calculator.OVERFLOW),
        (0, calculator.SYNTAX),
        (0, 0),
        (0, calculator.SYNTAX),
        (0, calculator.SYNTAX),
        (0, calculator.SYNTAX),
        (0, calculator.SYNTAX),
        (-24, 0),
        (2, 0),
        (0, calculator.TOO_LONG),
    ]
    assert [g.inexact for g in got[:3]] == [True, True, False]
    assert got[11].literals == (2, 3, 4)


_closeness = jax.jit(
    jax.vmap(
        lambda data, length, value: NumericCloseness()(
            Text(data, length), SimpleNamespace(value=value)
        )
    )
)


@given(
    st.lists(
        st.tuples(
            st.integers(-INT32_MAX, INT32_MAX),
            st.integers(-3, 3) | st.integers(-INT32_MAX, INT32_MAX),
        ),
        min_size=16,
        max_size=16,
    )
)
def test_numeric_closeness_in_jit_is_the_hosts_partial_credit(pairs):
    """Exact for large values too, where float32 cannot tell neighbouring integers apart."""
    pairs = [
        (value, int(np.clip(value + offset, -INT32_MAX, INT32_MAX))) for value, offset in pairs
    ]
    contents = [f"<answer>{answer}</answer>" for _, answer in pairs]
    texts = [Text.from_bytes(c.encode(), 32) for c in contents]
    got = _closeness(
        np.stack([t.data for t in texts]),
        np.stack([t.length for t in texts]),
        np.asarray([value for value, _ in pairs], np.int32),
    )
    want = [
        NumericCloseness().host(c, Task((), "", value)) for c, (value, _) in zip(contents, pairs)
    ]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


# --- tool calls ---------------------------------------------------------------------------------

TOOLS = (Calculator(), Lookup(), Search())


def _payload(text, size=160):
    return Text.from_bytes(text.encode(), size)


def _rendered_payload(tool, argument):
    """What ``chat.render`` writes between <tool_call> and </tool_call> for a call."""
    text = render([Message("assistant", "", (ToolCall(tool.name, {tool.argument: argument}),))])
    return text.split(TOOL_CALL)[1].split(TOOL_CALL_END)[0]


def test_parse_call_accepts_the_rendered_format_and_rejects_the_rest():
    cases = {_rendered_payload(tool, "a b"): i for i, tool in enumerate(TOOLS)}
    cases.update(
        {
            '{"name": "calculator", "arguments": {"expression": "1 + 2"}': -1,  # truncated
            '{"name": "calc", "arguments": {"expression": "1"}}': -1,
            '{"name": "lookup", "arguments": {"key": "x", "more": "y"}}': -1,
            '{"name": "lookup", "arguments": {"key": "a\\"b"}}': -1,  # escapes are not decoded in jit
            '{"name":"lookup","arguments":{"key":"x"}}': -1,  # not the rendered layout
        }
    )
    parse = jax.jit(lambda p: parse_call(p, TOOLS))
    for text, expected in cases.items():
        index, value = parse(_payload(text))
        assert int(index) == expected, text
        host_tool, host_value = parse_call_host(text, TOOLS)
        if expected >= 0:
            assert bytes(np.asarray(value.data[: int(value.length)])) == b"a b"
            assert host_tool is TOOLS[expected] and host_value == "a b"
    assert parse_call_host('{"name":"lookup","arguments":{"key":"a\\"b"}}', TOOLS) == (
        TOOLS[1],
        'a"b',
    )
    too_long = Text(
        np.full((160,), ord("k"), np.uint8), np.int32(161)
    )  # the payload did not fit its buffer
    assert int(parse(too_long)[0]) == -1


# --- episodes: masks and budgets ----------------------------------------------------------------

ACTION = 64


@pytest.fixture(scope="module")
def arithmetic(tokenizer):
    generator = Arithmetic(2)
    env = task_env(tokenizer, generator, range(4), max_length=400, action_length=ACTION)
    return (
        generator,
        env,
        jax.jit(env.reset),
        jax.jit(env.step),
    )  # always called with params: one compilation


def _action(tokenizer, text, *, close=True, tail=""):
    ids = tokenizer.encode(text) + [tokenizer.token_id(IM_END)] * close + tokenizer.encode(tail)
    assert len(ids) <= ACTION
    return jnp.asarray(ids + [0] * (ACTION - len(ids)), jnp.int32)


def _call(expression):
    return (
        f'<tool_call>\n{{"name": "calculator", '
        f'"arguments": {{"expression": "{expression}"}}}}\n</tool_call>'
    )


def test_tool_results_are_masked_out_of_the_policy_loss(tokenizer, arithmetic):
    _, env, reset, step = arithmetic
    params = env.default_params
    obs, state = reset(jax.random.key(0), params)
    prompt_length = int(obs["length"])
    actions = [
        _action(tokenizer, _call("6 * 7"), close=False),  # unclosed: the env closes the turn
        _action(tokenizer, _call("6 *"), tail="ignored after the end of the turn"),
        _action(tokenizer, "<think>x</think><answer>1</answer>"),
    ]
    policy_tokens = []
    for i, action in enumerate(actions):
        _, state, _, terminated, truncated, info = step(jax.random.key(i), state, action, params)
        turn = np.asarray(action)[: int(np.sum(np.asarray(action) != 0))]
        policy_tokens.append(turn[: len(tokenizer.encode(_call("6 *"))) + 1] if i == 1 else turn)
    final = info["final_observation"]
    n = int(final["length"])
    tokens, mask = np.asarray(final["tokens"][:n]), np.asarray(final["loss_mask"])
    assert bool(terminated) and not bool(truncated)
    assert mask[n:].sum() == 0 and mask[:prompt_length].sum() == 0
    assert tokens[mask[:n] == 1].tolist() == np.concatenate(policy_tokens).tolist()
    text = tokenizer.decode(tokens)
    assert "<tool_result>\n42\n</tool_result>" in text and "error: invalid expression" in text
    assert "ignored" not in text and text.count("<|im_end|>\n<|im_start|>tool") == 2
    masked_text = tokenizer.decode(tokens[(mask[:n] == 0) & (np.arange(n) >= prompt_length)])
    assert masked_text.startswith("<|im_end|>\n<|im_start|>tool\n<tool_result>\n42")


def test_turn_limit_truncates_with_zero_reward(tokenizer, arithmetic):
    _, env, reset, step = arithmetic
    params = env.default_params.replace(max_turns=jnp.int32(2))
    _, state = reset(jax.random.key(0), params)
    flags = []
    for i in range(3):
        _, state, reward, terminated, truncated, _ = step(
            jax.random.key(i), state, _action(tokenizer, _call("1 + 1")), params
        )
        flags.append((float(reward), bool(terminated), bool(truncated), int(state.turn)))
    assert flags == [(0.0, False, False, 1), (0.0, False, True, 0), (0.0, False, False, 1)]


def test_token_budget_truncates_before_overflowing(tokenizer, arithmetic):
    _, env, reset, step = arithmetic
    params = env.default_params.replace(max_turns=jnp.int32(100))
    _, state = reset(jax.random.key(0), params)
    action = _action(tokenizer, _call("123456 * 654321 - 1"))
    for i in range(20):
        before = int(state.length)
        _, state, reward, terminated, truncated, info = step(
            jax.random.key(i), state, action, params
        )
        final = info["final_observation"]
        assert int(final["length"]) <= env.max_length
        if bool(truncated):
            break
        assert int(state.length) + ACTION <= env.max_length
    assert bool(truncated) and not bool(terminated) and float(reward) == 0.0
    assert int(final["length"]) == before + int(
        np.sum(np.asarray(action) != 0)
    )  # the message did not fit
    assert (
        int(state.length) == int(state.tokens.astype(bool).sum()) and int(state.turn) == 0
    )  # auto-reset


def test_render_ids_prompt_is_the_env_prompt(tokenizer, arithmetic):
    generator, env, reset, _ = arithmetic
    task = generator.sample(2)
    weights = np.zeros(4, np.float32)
    weights[2] = 1.0
    obs, _ = reset(jax.random.key(1), env.default_params.replace(task_weights=jnp.asarray(weights)))
    prompt = render_ids(task.prompt, tokenizer, add_generation_prompt=True).ids
    assert np.asarray(obs["tokens"][: int(obs["length"])]).tolist() == prompt.tolist()
    assert bool(env.observation_space().contains(obs)) and int(obs["loss_mask"].sum()) == 0
    assert bool(env.action_space().contains(_action(tokenizer, "<answer>1</answer>")))


def test_a_long_answering_turn_is_scored_in_full_as_on_the_host(tokenizer, arithmetic):
    generator, env, _, step = arithmetic
    task = generator.sample(1)
    content = f"<think>{' inside' * 38}</think><answer>{task.answer}</answer>"
    assert len(content.encode()) > 280  # longer than a fixed verifier buffer of 256 bytes
    _, state = env.reset_task(1, env.default_params)
    _, _, reward, terminated, _, _ = step(
        jax.random.key(0), state, _action(tokenizer, content), env.default_params
    )
    assert (
        bool(terminated)
        and float(reward) == pytest.approx(generator.reward.host(content, task)) == 1.0
    )


def test_a_wrong_second_tool_call_lowers_that_turns_reward_only(tokenizer):
    """Replaying a demonstration earns valid-call and milestone rewards on each tool turn; the
    same episode with its second call changed to a wrong one earns less on that turn alone."""
    generator = Arithmetic(2)
    rewards = TurnRewards(valid_call=0.1, invalid_call=-0.1, milestone=0.5)
    env = task_env(
        tokenizer, generator, range(2), max_length=400, action_length=ACTION, turn_rewards=rewards
    )
    task = generator.tasks(range(1))[0]
    actions = demonstration_actions(task.render(tokenizer), ACTION, env.vocab.pad_id)
    first, second = (
        m.tool_calls[0].arguments["expression"] for m in task.demonstration if m.tool_calls
    )
    wrong = np.array(_action(tokenizer, _call(f"{second} + 1")))
    assert len(actions) == 3 and first != second

    def play(script):
        _, state = env.reset_task(0, env.default_params)
        out = []
        for action in script:
            _, state, reward, _, _, info = env.step_env(
                jax.random.key(0), state, jnp.asarray(action), env.default_params
            )
            out.append((float(reward), bool(info["milestone_hit"]), int(info["milestones"])))
        return out

    right = play(actions)
    changed = play([actions[0], wrong, actions[2]])
    assert right[0] == changed[0] == (pytest.approx(0.6), True, 1)
    assert right[1] == (pytest.approx(0.6), True, 2) and changed[1] == (
        pytest.approx(0.1),
        False,
        1,
    )  # a valid call, but its result is no milestone
    assert right[2][0] == changed[2][0] == 1.0  # the same final answer, the same verifier reward
