"""Stateful, conversational evaluation (tau-bench): the shop's orders in SQLite, goal states from
golden actions, simulated users, replay, and the ``orders`` suite end to end.

`Clerk` is the independent reference agent: written against the rule-based user's protocol, it
asks for every detail at once, reads them from the user's answer, looks the order up and acts,
so it succeeds only if the user reveals what it asks for and the tools and verifier agree.
"""

import dataclasses
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax import config
from agentic_jax.agents.loops.react import ReActAgent
from agentic_jax.agents.policies.base import AssistantMessage, ScriptedPolicy
from agentic_jax.agents.tools.budget import Budget, StopReason
from agentic_jax.data.chat import Message, ToolCall
from agentic_jax.envs.orders import Orders
from agentic_jax.envs.stateful import Database, GoalState, apply_calls, canonical_hash
from agentic_jax.envs.users import (
    GREETING,
    PROMPT_SHA256,
    STOP,
    Detail,
    Instruction,
    PolicyUser,
    ReplayUser,
    Request,
    RuleUser,
)
from agentic_jax.eval.suites.episodes import play, state_hash
from agentic_jax.eval.suites.report import load_result
from agentic_jax.eval.suites.run import evaluate
from agentic_jax.eval.suites.suite import Suite

SEED = 1_000_000  # held-out seeds, as the suites draw them


def _call(name, **arguments):
    return AssistantMessage("", (ToolCall(name, arguments),), finish_reason="tool_calls")


class Clerk:
    """A support agent for the rule-based user; see the module docstring."""

    ASK = "What is the order id, which item is it, what quantity would you like, and the address?"

    def __init__(self):
        self.calls = []  # every conversation it was shown

    def respond(self, messages, tools=(), **sampling):
        self.calls.append(list(messages))
        last = messages[-1]
        if last.role == "user":
            order_id = re.search(r"\bW\d+", last.content)
            return (
                _call("get_order", order_id=order_id[0]) if order_id else AssistantMessage(self.ASK)
            )
        users = [m.content for m in messages if m.role == "user"]
        intent, details = users[-2].lower(), users[-1]
        acted = [m for m in messages if m.role == "assistant" and m.tool_calls][-1].tool_calls[0]
        if acted.name != "get_order":
            return AssistantMessage(f"Done: {last.content}.")
        order = json.loads(last.content)
        order_id = order["order_id"]
        if "cancel" in intent:
            return _call("cancel_order", order_id=order_id)
        if "how many" in intent:
            name = re.search(r"item is (.+?)\.", details)[1]
            sku = next(i["sku"] for i in order["items"] if i["name"] == name)
            quantity = int(re.search(r"quantity is (\d+)", details)[1])
            return _call("change_quantity", order_id=order_id, sku=sku, quantity=quantity)
        if "address" in intent:
            address = re.search(r"address is (.+?)\.(?:\s|$)", details)[1]
            return _call("change_address", order_id=order_id, address=address)
        return AssistantMessage(f"The total of order {order_id} is {order['total']}.")


def demonstration_script(task):
    """The golden agent's turns: the task's demonstration, replayed in order."""
    return [
        AssistantMessage(
            m.content, m.tool_calls, finish_reason="tool_calls" if m.tool_calls else "stop"
        )
        for m in task.demonstration
        if m.role == "assistant"
    ]


def _play(policy, task, generator, **kwargs):
    return play(policy, task, generator.tools, generator.reward, max_steps=24, **kwargs)


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_the_golden_actions_reach_the_goal_state_and_succeed(difficulty):
    generator = Orders(difficulty)
    for task in generator.tasks(range(SEED, SEED + 4)):
        for policy in (ScriptedPolicy(demonstration_script(task)), Clerk()):
            episode = _play(policy, task, generator, seed=3)
            assert episode.success and episode.reached_goal and episode.error is None, episode
            assert episode.tool_calls == episode.golden_calls
            assert episode.stop_reason == "answer" and episode.user_turns[-1].endswith(STOP)
            assert episode.state_hash == state_hash(task) and episode.user_id == RuleUser().id


def _replace_call(script, name, call):
    """``script`` with its call to ``name`` replaced by ``call`` (or, for None, removed)."""
    out = []
    for turn in script:
        if turn.tool_calls and turn.tool_calls[0].name == name:
            if call is not None:
                out.append(dataclasses.replace(turn, tool_calls=(call,)))
        else:
            out.append(turn)
    return out


def test_a_wrong_or_an_extra_change_fails_whatever_the_agent_says():
    generator = Orders(1, requests=("address",))
    task = generator.sample(SEED)
    order_id = task.golden[0].arguments["order_id"]
    script = demonstration_script(task)
    wrong = _replace_call(
        script,
        "change_address",
        ToolCall("change_address", {"order_id": order_id, "address": "1 Elm Street"}),
    )
    extra = list(script)
    extra.insert(-1, _call("cancel_order", order_id=order_id))  # then the same plausible report
    for bad in (wrong, extra):
        episode = _play(ScriptedPolicy(bad), task, generator)
        assert episode.answer == script[-1].text  # the report claims the right change
        assert not episode.success and episode.reached_goal is False
        assert episode.final_state != episode.goal_state


def test_a_read_only_task_checks_the_answer_the_user_asked_for():
    generator = Orders(1, requests=("total",))
    task = generator.sample(SEED)
    assert task.goal_hash == task.initial_hash and len(task.outputs) == 1
    right = _play(ScriptedPolicy(demonstration_script(task)), task, generator)
    assert right.success and task.outputs[0] in right.answer
    script = demonstration_script(task)
    script[-1] = AssistantMessage(
        f"The total of order {task.golden[0].arguments['order_id']} is $1.00."
    )
    wrong = _play(ScriptedPolicy(script), task, generator)
    assert wrong.reached_goal and not wrong.success  # nothing changed, but the total is wrong


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.randoms(use_true_random=False))
def test_goal_states_come_from_the_golden_actions(seed, difficulty, rng):
    generator = Orders(difficulty)
    task = generator.sample(seed)
    assert generator.sample(seed) == task  # the seed is the task
    db = task.start()
    assert db.state_hash() == task.initial_hash
    apply_calls(db, generator.tools, task.golden)
    assert db.state_hash() == task.goal_hash
    mutates = any(c.name != "get_order" for c in task.golden)
    assert (task.goal_hash != task.initial_hash) == mutates
    shuffled = [(table, rng.sample(rows, len(rows))) for table, rows in task.rows]
    rng.shuffle(shuffled)
    assert Database(task.schema, shuffled).state_hash() == task.initial_hash


def test_the_state_hash_is_canonical_and_pinned():
    schema = "CREATE TABLE t (b TEXT, a INTEGER); CREATE TABLE s (x INTEGER PRIMARY KEY);"
    one = Database(schema, (("t", (("x", 1), ("y", 2))), ("s", ((3,), (1,)))))
    two = Database(schema, (("s", ((1,), (3,))), ("t", (("y", 2), ("x", 1)))))
    assert one.state_hash() == two.state_hash() == "925229b5c8878c69"  # the same on every run
    two.execute("UPDATE t SET a = 3 WHERE b = 'y'")
    assert canonical_hash(two.connection) != one.state_hash()


INSTRUCTION = Instruction(
    (
        Request(
            "change how many of an item in an order I get",
            (
                Detail("order id", "W1234", ("order id",)),
                Detail("item", "desk lamp", ("item",)),
                Detail("new quantity", "7", ("quantity",)),
            ),
        ),
        Request("cancel an order", (Detail("order id", "W5678", ("order id",)),)),
    )
)
SECRETS = ("W1234", "desk lamp", "7", "W5678")
TASK = type("T", (), {"instruction": INSTRUCTION})()


def _conversation(seed, messages):
    user = RuleUser().start(TASK, seed)
    return [user.opening()] + [user.reply(m) for m in messages]


def test_the_rule_user_reveals_a_detail_only_when_asked():
    messages = [
        "How can I help?",  # a question without a cue: nothing revealed
        "What is the order id?",
        "Which item is it?",
        "Shall I proceed?",
        "Done.",  # a report: the next request
        "Could you confirm the order id?",
        "Order W5678 is cancelled.",
    ]
    opening, vague, order, item, yes, following, second, done = _conversation(0, messages)
    for said in (opening, vague, following):
        assert not any(s in said for s in SECRETS)
    assert "W1234" in order and "desk lamp" not in order and "7" not in order
    assert "desk lamp" in item and "W1234" not in item
    assert yes == "Yes, please go ahead."
    assert "cancel an order" in following and "W5678" in second and "W1234" not in second
    assert done.endswith(STOP)


def test_the_rule_user_is_deterministic_for_a_seed():
    messages = [
        "What is the order id, the item and the quantity?",
        "Done.",
        "Which order id?",
        "Ok.",
    ]
    runs = {seed: _conversation(seed, messages) for seed in range(6)}
    assert runs[0] == _conversation(0, messages)
    assert len({tuple(r) for r in runs.values()}) > 1  # the seed changes phrasings ...
    for turns in runs.values():  # ... never what is revealed
        assert all(s in turns[1] for s in SECRETS[:3]) and "W5678" in turns[3]


def _without_timing(episode):
    return dataclasses.replace(episode, wall_s=0.0, latencies_s=())


def test_a_recorded_episode_replays_identically():
    generator = Orders(2)
    task = generator.sample(SEED + 1)
    clerk = Clerk()
    recorded = _play(clerk, task, generator, seed=11)
    shown = list(clerk.calls)
    clerk.calls.clear()
    user = ReplayUser(recorded.user_turns, recorded.agent_turns, recorded.user_id)
    replayed = _play(clerk, task, generator, seed=11, user=user)
    assert clerk.calls == shown  # the same conversation, message by message
    assert _without_timing(replayed) == _without_timing(recorded) and recorded.success
    # Another agent (the golden one, which words its questions otherwise) fails where it diverges.
    script = demonstration_script(task)
    diverged = _play(ScriptedPolicy(script), task, generator, user=user)
    assert not diverged.success and "not the agent that was recorded" in diverged.error
    assert (
        diverged.agent_turns == (script[0].text,) and diverged.user_turns == recorded.user_turns[:1]
    )


def test_a_policy_can_play_the_user_under_a_pinned_prompt():
    generator = Orders(1, requests=("cancel",))
    task = generator.sample(SEED)
    order_id = task.golden[0].arguments["order_id"]
    model = ScriptedPolicy(["Hi, I want to cancel an order.", f"It is {order_id}.", STOP])
    user = PolicyUser(model, temperature=0.5, name="scripted")
    assert PROMPT_SHA256[:16] in user.id and "scripted" in user.id
    episode = _play(ScriptedPolicy(demonstration_script(task)), task, generator, seed=42, user=user)
    assert episode.success and episode.user_id == user.id
    assert episode.user_turns == tuple(model.responses[i].text for i in range(3))
    first, *_, last = model.calls
    assert first[0][0].role == "system" and task.instruction.text() in first[0][0].content
    assert first[0][1] == Message("user", GREETING)
    assert [m.role for m in last[0][1:]] == ["user", "assistant"] * 2 + ["user"]  # roles flipped
    assert all(
        call[2] == {"temperature": 0.5, "max_tokens": 128, "seed": 42} for call in model.calls
    )


def test_converse_continues_one_history_and_ends_with_its_reason():
    user_says = iter(["second", "third", "fourth"])
    policy = ScriptedPolicy(["one?", "two?", "three?"])
    agent = ReActAgent(policy)
    done = agent.converse("first", lambda reply: None if reply == "two?" else next(user_says))
    assert done.stop_reason is StopReason.ANSWER and done.answer == "two?" and done.steps == 2
    assert [m.content for m in policy.calls[1][0][1:]] == ["first", "one?", "second"]
    limited = ReActAgent(ScriptedPolicy(["a", "b"])).converse("hi", lambda r: "more", max_turns=2)
    assert limited.stop_reason is StopReason.MAX_TURNS and limited.messages[-1].content == "more"
    budget = ReActAgent(ScriptedPolicy(["a", "b"]), budget=Budget(max_steps=1))
    assert budget.converse("hi", lambda r: "more").stop_reason is StopReason.MAX_STEPS


def test_bad_calls_are_errors_the_agent_sees():
    generator = Orders(1, requests=("quantity",))
    task, shipped = next(
        (t, o)
        for t in generator.tasks(range(SEED, SEED + 20))
        for o, status, _ in t.rows[1][1]
        if status != "pending"
    )
    order_id, sku = task.golden[1].arguments["order_id"], task.golden[1].arguments["sku"]
    bad = [
        _call("get_order", order_id="W0000"),
        _call("change_quantity", order_id=order_id, sku=sku, qty=2),
        _call("change_quantity", order_id=order_id, sku=sku, quantity="2"),
        _call("cancel_order", order_id=shipped),
        _call("change_quantity", order_id=order_id, sku=sku, quantity=10_000),
    ]
    policy = ScriptedPolicy(bad + ["I could not do it."])
    episode = _play(policy, task, generator)
    statuses = [
        "error_result",
        "invalid_arguments",
        "invalid_arguments",
        "error_result",
        "error_result",
    ]
    assert list(episode.tool_statuses) == statuses and episode.error is None
    results = [m.content for m in policy.calls[-1][0] if m.role == "tool"]
    assert results[0] == "error: no order W0000"
    assert results[1].startswith("error: invalid arguments for change_quantity")
    assert "only pending orders can change" in results[3] and "in stock" in results[4]
    assert episode.reached_goal is False and episode.final_state == task.initial_hash
    with pytest.raises(TypeError, match="host only"):
        GoalState()(None, None)


def test_bad_settings_are_refused_with_their_names():
    with pytest.raises(ValueError, match="difficulty"):
        Orders(0)
    with pytest.raises(ValueError, match="refund"):
        Orders(1, requests=("cancel", "refund"))
    with pytest.raises(ValueError, match="extra_orders"):
        Orders(1, extra_orders=-1)
    with pytest.raises(ValueError, match="max_user_turns"):
        Suite(generators=(Orders(1),), max_user_turns=0)
    with pytest.raises(ValueError, match="one argument"):
        Suite(generators=(Orders(1),), variants=("original", "renamed"))
    with pytest.raises(ValueError, match="policy"):
        PolicyUser(None)
    with pytest.raises(ValueError, match="temperature"):
        PolicyUser(Clerk(), temperature=-1.0)
    with pytest.raises(ValueError, match="one user turn more"):
        ReplayUser(("hi",), ("hello",), "x")
    with pytest.raises(ValueError, match="max_turns"):
        ReActAgent(Clerk()).converse("hi", lambda r: None, max_turns=0)


def test_the_orders_suite_runs_end_to_end_and_resumes(tmp_path):
    config.parse(
        ["eval_orders"],
        [
            "eval.Suite.num_tasks = 3",
            "eval.Suite.seeds = [0, 1]",
            "eval.Suite.ks = [1, 2]",
            "eval.TrainingData.enabled = False",
        ],
    )
    try:
        clerk = Clerk()
        result = evaluate(tmp_path, policy=clerk, progress=False)
        summary = result["variants"]["original"]["summary"]
        assert summary["episodes"] == 12 and summary["success"] == summary["goal_state"] == 1.0
        assert summary["pass^2"] == 1.0
        report = (tmp_path / "report.md").read_text()
        assert "# Evaluation: suite `orders`" in report and "| goal state |" in report
        loaded = load_result(tmp_path)
        assert loaded["settings"]["user"] == RuleUser().id
        assert all(e["user_turns"] and e["goal_state"] for e in loaded["episodes"]["original"])
        calls = len(clerk.calls)
        evaluate(tmp_path, policy=clerk, progress=False)  # resumed from episodes.jsonl
        assert len(clerk.calls) == calls
        config.parse(
            ["eval_orders"],
            [
                "eval.Suite.user = @PolicyUser()",
                "PolicyUser.policy = @user/agents.ScriptedPolicy()",
                f"user/agents.ScriptedPolicy.responses = ['{STOP}']",
            ],
        )
        assert Suite().user.id.startswith("PolicyUser:")
    finally:
        config.parse([], [])
