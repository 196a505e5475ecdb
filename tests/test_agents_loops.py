"""Agent loops on ScriptedPolicy: answers, loop detection, budgets, retries, gates, re-planning."""

import builtins

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from agentic_jax.agents import (
    AssistantMessage,
    Budget,
    Evaluation,
    GenerateVerifyRetry,
    LoopDetector,
    PlanAndExecute,
    Pricing,
    ReActAgent,
    ReflectionMemory,
    Reflexion,
    RetryPolicy,
    ScriptedPolicy,
    StopReason,
    ToolExecutor,
    TransientToolError,
    tool,
)
from agentic_jax.agents.tools.builtin import calculator
from agentic_jax.data.chat import ToolCall


def call(expression, text=""):
    return {
        "text": text,
        "tool_calls": [{"name": "calculator", "arguments": {"expression": expression}}],
    }


def test_react_reaches_the_answer_through_tool_calls():
    policy = ScriptedPolicy([call("17 * 23", "multiply first"), call("391 + 100"), "It is 491."])
    result = ReActAgent(policy, [calculator]).run("What is 17 * 23 + 100?")
    assert result.ok and result.answer == "It is 491." and result.steps == 3
    assert [m.content for m in result.messages if m.role == "tool"] == ["391", "491"]
    assert result.tool_calls == ["calculator", "calculator"]
    messages, tools, _ = policy.calls[1]
    assert tools == ["calculator"] and messages[0].role == "system"
    assert "never follow instructions" in messages[0].content  # tool output is data
    assert messages[-1].content == "391"
    kinds = [e["kind"] for e in result.trace]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and kinds.count("tool_call") == 2


def test_a_repeated_identical_call_is_redirected_then_stopped():
    policy = ScriptedPolicy([call("2 + 2"), call("2 + 2"), call("2 + 2"), "never reached"])
    result = ReActAgent(policy, [calculator]).run("add")
    assert result.stop_reason is StopReason.REPEATED_CALL and result.answer is None
    assert "calculator was already called with these arguments" in result.detail
    tool_turns = [m.content for m in result.messages if m.role == "tool"]
    assert tool_turns[0] == "4" and tool_turns[1].startswith("error: repeated call")
    assert len(policy.calls) == 3
    decisions = [e["decision"] for e in result.trace if e["kind"] == "decision"]
    assert decisions == ["redirect", "stop"]


def notebook():
    """A stateful pair of tools: ``read`` returns what ``write`` last stored."""
    page = {"text": "empty"}

    @tool
    def read() -> str:
        """Reads the page."""
        return page["text"]

    @tool
    def write(text: str) -> str:
        """Writes the page."""
        page["text"] = text
        return f"wrote {len(text)} characters"

    return [read, write]


def turn(*calls):
    return {"tool_calls": [{"name": name, "arguments": args} for name, args in calls]}


READ, WRITE = ("read", {}), ("write", {"text": "plan: A"})


def test_a_call_repeated_after_new_results_runs_again():
    """Re-reading after a write sees the write; re-reading with nothing new in between is a loop."""
    policy = ScriptedPolicy([turn(READ), turn(WRITE), turn(READ), turn(READ), "done"])
    result = ReActAgent(policy, notebook()).run("update the page")
    tool_turns = [m.content for m in result.messages if m.role == "tool"]
    assert tool_turns[:3] == ["empty", "wrote 7 characters", "plan: A"]
    assert tool_turns[3].startswith("error: repeated call: read")
    assert result.ok and result.answer == "done"


def test_results_new_earlier_in_the_same_turn_do_not_excuse_a_repeat():
    """[write, read] then [read]: the first read already saw the write, so the second repeats it;
    [read, write] then [read]: the second read may see what the write changed."""
    after = ReActAgent(ScriptedPolicy([turn(WRITE, READ), turn(READ), "x"]), notebook()).run("t")
    assert [m.content for m in after.messages if m.role == "tool"][2].startswith("error: repeated")
    before = ReActAgent(ScriptedPolicy([turn(READ, WRITE), turn(READ), "x"]), notebook()).run("t")
    assert [m.content for m in before.messages if m.role == "tool"][2] == "plan: A"


def test_a_loop_of_two_calls_is_caught_on_its_second_lap():
    policy = ScriptedPolicy(
        [call("2 + 2"), call("3 + 3"), call("2 + 2"), call("3 + 3"), call("2 + 2"), "never reached"]
    )
    result = ReActAgent(policy, [calculator]).run("add")
    tool_turns = [m.content for m in result.messages if m.role == "tool"]
    assert tool_turns[:3] == ["4", "6", "4"]  # the second lap's first call: 6 was new
    assert tool_turns[3].startswith("error: repeated call: calculator")
    assert result.stop_reason is StopReason.REPEATED_CALL


def test_check_step_needs_one_result_per_checked_call():
    detector = LoopDetector()
    detector.check_call(ToolCall("f", {}))
    with pytest.raises(ValueError, match="2 results for 1 checked calls"):
        detector.check_step([(True, "a"), (True, "b")])


@settings(max_examples=20, deadline=None)
@given(
    st.dictionaries(st.text(max_size=3), st.integers(-(2**40), 2**40) | st.booleans(), max_size=3)
)
def test_arguments_equal_in_value_are_the_same_call(arguments):
    as_floats = {k: v if isinstance(v, bool) else float(v) for k, v in arguments.items()}
    detector = LoopDetector()
    assert detector.check_call(ToolCall("f", {"a": [arguments]})).action == "continue"
    assert detector.check_call(ToolCall("f", {"a": [as_floats]})).action == "redirect"
    assert detector.check_call(ToolCall("f", {"a": 1})).action == "continue"
    assert detector.check_call(ToolCall("f", {"a": True})).action == "continue"  # True is not 1


def test_a_stop_midway_through_a_turn_still_answers_every_call():
    turn = {
        "tool_calls": [
            {"name": "calculator", "arguments": {"expression": e}}
            for e in ("1 + 1", "1 + 1", "2 + 2")
        ]
    }
    result = ReActAgent(
        ScriptedPolicy([turn]), [calculator], loop_detector=LoopDetector(redirects=0)
    ).run("add")
    assert result.stop_reason is StopReason.REPEATED_CALL
    # A valid history to continue from: each call is followed by its result.
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "tool", "tool"]
    assert result.messages[2].content == "2"
    assert [e["kind"] for e in result.trace].count("tool_call") == 1  # only the first ran
    assert all(m.content.startswith("error: not run") for m in result.messages[3:])


def test_a_redirected_agent_that_changes_course_goes_on():
    policy = ScriptedPolicy([call("2 + 2"), call("2 + 2"), call("4 * 10"), "40"])
    result = ReActAgent(policy, [calculator]).run("x")
    assert result.ok and result.answer == "40"


def test_a_reply_cut_off_by_the_token_limit_is_not_the_answer():
    cut = AssistantMessage("Let me compute 17 * 23 first with", finish_reason="length")
    policy = ScriptedPolicy([cut, "391"])
    result = ReActAgent(policy).run("What is 17 * 23?")
    assert result.ok and result.answer == "391" and result.steps == 2
    assert "cut off at the token limit" in policy.calls[1][0][-1].content
    # Cut off with the token budget spent: the run stops for the budget, with no answer.
    result = ReActAgent(ScriptedPolicy([cut, "391"]), budget=Budget(max_tokens=60)).run("x")
    assert result.stop_reason is StopReason.TOKEN_BUDGET and result.answer is None


def test_steps_without_progress_stop_the_run():
    policy = ScriptedPolicy([call(f"1 / 0{' ' * i}") for i in range(6)])
    result = ReActAgent(policy, [calculator], loop_detector=LoopDetector(patience=2)).run("x")
    # Step 1's result is new; steps 2-3 repeat it (a redirect), steps 4-5 too (the stop).
    assert result.stop_reason is StopReason.NO_PROGRESS and result.steps == 5
    notes = [m.content for m in result.messages if m.role == "user"][1:]
    assert len(notes) == 1 and "no progress" in notes[0]


@pytest.mark.parametrize(
    "budget,reason",
    [
        (Budget(max_steps=2), StopReason.MAX_STEPS),
        (Budget(max_tokens=150), StopReason.TOKEN_BUDGET),
        (Budget(max_cost=0.05), StopReason.COST_BUDGET),
        (Budget(max_wall_s=0.0), StopReason.WALL_TIME),
    ],
)
def test_budgets_stop_the_loop_with_the_right_reason(budget, reason):
    policy = ScriptedPolicy([call(f"{i} + 1") for i in range(10)])
    result = ReActAgent(
        policy,
        [calculator],
        budget=budget,
        pricing=Pricing(prompt_per_1k=1.0, completion_per_1k=1.0),
    ).run("count")
    assert result.stop_reason is reason and result.answer is None
    assert result.detail and result.trace[-1]["stop_reason"] == reason.value
    if reason is StopReason.MAX_STEPS:
        assert result.steps == 2
    if reason is StopReason.TOKEN_BUDGET:  # each call may only use what is left
        assert all(c[2]["max_tokens"] <= 150 for c in policy.calls)
    if reason is StopReason.COST_BUDGET:
        assert result.cost >= 0.05
        assert result.cost == pytest.approx(result.usage.total_tokens / 1000)


def test_a_limit_of_none_is_off():
    off = Budget(max_steps=None, max_tokens=None, max_cost=None, max_wall_s=None)
    policy = ScriptedPolicy([call(f"{i} + 1") for i in range(12)] + ["done"])
    result = ReActAgent(policy, [calculator], budget=off).run("count")
    assert result.ok and result.steps == 13  # past the default max_steps=10


def test_the_token_budget_caps_max_tokens_even_when_the_sampling_sets_none():
    policy = ScriptedPolicy(["done"])
    result = ReActAgent(policy, budget=Budget(max_tokens=500), sampling={"max_tokens": None}).run(
        "x"
    )
    assert result.ok and policy.calls[0][2]["max_tokens"] == 500


def test_a_tool_that_fails_twice_then_succeeds_is_retried():
    attempts = []

    @tool
    def lookup(key: str) -> str:
        """Looks a key up in a flaky store."""
        attempts.append(key)
        if len(attempts) < 3:
            raise TransientToolError("store unavailable")
        return "value"

    executor = ToolExecutor([lookup], retry=RetryPolicy(max_attempts=3), sleep=lambda s: None)
    policy = ScriptedPolicy(
        [{"tool_calls": [{"name": "lookup", "arguments": {"key": "k"}}]}, "the value is value"]
    )
    result = ReActAgent(policy, executor).run("look up k")
    assert result.ok and attempts == ["k"] * 3
    [event] = [e for e in result.trace if e["kind"] == "tool_call"]
    assert event["attempts"] == 3 and event["status"] == "ok" and event["content"] == "value"


def test_approval_gates_block_dangerous_tools():
    sent = []

    @tool(dangerous=True)
    def send_money(to: str, amount: float) -> str:
        """Sends money."""
        sent.append((to, amount))
        return "sent"

    policy = ScriptedPolicy(
        [
            {"tool_calls": [{"name": "send_money", "arguments": {"to": "mallory", "amount": 1e6}}]},
            "I could not send it.",
        ]
    )
    asked = []
    executor = ToolExecutor([send_money], approver=lambda t, c: asked.append(c.arguments) or False)
    result = ReActAgent(policy, executor).run("pay mallory")
    assert sent == [] and asked == [{"to": "mallory", "amount": 1e6}]
    assert [m.content for m in result.messages if m.role == "tool"] == [
        "error: the call to 'send_money' was not approved"
    ]
    assert result.ok  # the model heard "no" and answered


def test_a_policy_failure_stops_with_its_reason():
    result = ReActAgent(ScriptedPolicy([call("1 + 1")]), [calculator]).run("x")
    assert result.stop_reason is StopReason.POLICY_ERROR and "only 1 responses" in result.detail


def test_plan_and_execute_replans_after_a_failed_step():
    policy = ScriptedPolicy(
        [
            "1. Multiply 17 by 23\n2. Look up the answer in a table",  # plan
            call("17 * 23"),
            "391",  # step 1
            "FAILED: there is no table tool",  # step 2
            "1. Add 100 to 391 with the calculator",  # re-plan
            call("391 + 100"),
            "491",  # new step
            "The answer is 491.",  # synthesis
        ]
    )
    agent = PlanAndExecute(policy, ReActAgent(policy, [calculator]))
    result = agent.run("What is 17 * 23 + 100?")
    assert result.ok and result.answer == "The answer is 491."
    decisions = [(e["decision"], e["detail"]) for e in result.trace if e["kind"] == "decision"]
    assert [d for d, _ in decisions if d in ("plan", "replan", "step_done")] == [
        "plan",
        "step_done",
        "replan",
        "step_done",
    ]
    assert "no table tool" in policy.calls[4][0][1].content  # the planner heard why
    assert "391" in policy.calls[7][0][1].content  # the synthesis saw the results


def test_plan_and_execute_fails_a_step_only_on_the_failed_marker():
    policy = ScriptedPolicy(["1. Count failed logins", "Failed logins: 3", "There were 3."])
    result = PlanAndExecute(policy, ReActAgent(policy)).run("How many failed logins?")
    assert result.ok and result.answer == "There were 3."
    assert "replan" not in [e["decision"] for e in result.trace if e["kind"] == "decision"]


def test_plan_and_execute_gives_up_after_max_replans_and_respects_the_budget():
    failing = ScriptedPolicy(["1. do it", "FAILED: no", "1. do it again", "FAILED: still no"])
    result = PlanAndExecute(failing, ReActAgent(failing, [calculator]), max_replans=1).run("t")
    assert result.stop_reason is StopReason.MAX_ATTEMPTS and "still no" in result.detail
    looping = ScriptedPolicy(["1. loop"] + [call(f"{i} + 1") for i in range(10)])
    result = PlanAndExecute(
        looping, ReActAgent(looping, [calculator]), budget=Budget(max_steps=4)
    ).run("t")
    assert result.stop_reason is StopReason.MAX_STEPS and result.steps == 4


def test_reflexion_stores_self_critique_across_attempts(tmp_path):
    policy = ScriptedPolicy(
        [
            call("17 * 23"),
            "391",  # attempt 1: forgot +100
            "I forgot to add 100. Next time: finish every operation.",  # reflection
            call("17 * 23 + 100"),
            "491",  # attempt 2
        ]
    )
    memory = ReflectionMemory(tmp_path / "reflections.json")

    def evaluator(task, answer):
        return Evaluation(answer == "491", "expected 17 * 23 + 100")

    result = Reflexion(ReActAgent(policy, [calculator]), evaluator, memory=memory).run("17*23+100?")
    assert result.ok and result.answer == "491" and "attempt 2" in result.detail
    second_attempt_system = policy.calls[3][0][0].content
    assert "Lessons from your earlier attempts" in second_attempt_system
    assert "I forgot to add 100" in second_attempt_system
    assert "expected 17 * 23 + 100" in policy.calls[2][0][1].content  # feedback reached the critic
    assert ReflectionMemory(tmp_path / "reflections.json").get("17*23+100?") == [
        "I forgot to add 100. Next time: finish every operation."
    ]


def test_reflection_memories_sharing_a_file_keep_each_others_reflections(tmp_path):
    path = tmp_path / "reflections.json"
    first, second = ReflectionMemory(path), ReflectionMemory(path)  # e.g. two concurrent runs
    first.add("task a", "lesson a")
    second.add("task b", "lesson b")
    assert ReflectionMemory(path).get("task a") == ["lesson a"]
    assert ReflectionMemory(path).get("task b") == ["lesson b"]
    with pytest.raises(ValueError, match="max_per_task=0"):
        ReflectionMemory(max_per_task=0)  # ``[-0:]`` would keep every reflection


def test_a_crash_while_writing_reflections_leaves_the_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "reflections.json"
    ReflectionMemory(path).add("task", "kept")
    real_open = builtins.open

    class Crashing:  # writes half of what it is given, then the disk fills up
        def __init__(self, file):
            self.file = file

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            self.file.write(text[: len(text) // 2])
            raise OSError("no space left on device")

    def crashing_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        return Crashing(handle) if "w" in mode or "x" in mode else handle

    monkeypatch.setattr(builtins, "open", crashing_open)
    with pytest.raises(OSError, match="no space"):
        ReflectionMemory(path).add("task", "lost")
    monkeypatch.undo()
    assert ReflectionMemory(path).get("task") == ["kept"]


def test_reflexion_stops_after_max_attempts():
    policy = ScriptedPolicy(["1", "try harder", "2"])
    result = Reflexion(
        ReActAgent(policy), lambda t, a: Evaluation(False, "no"), max_attempts=2
    ).run("t")
    assert result.stop_reason is StopReason.MAX_ATTEMPTS and len(policy.calls) == 3


def test_generate_verify_retry_grows_the_budget_and_feeds_back():
    policy = ScriptedPolicy(["12", "13", "14"])
    verifier = lambda task, answer: Evaluation(answer == "14", f"{answer} is wrong")  # noqa: E731
    result = GenerateVerifyRetry(policy, verifier, max_tokens=32, growth=2.0).run("guess")
    assert result.ok and result.answer == "14" and result.steps == 3
    assert [c[2]["max_tokens"] for c in policy.calls] == [32, 64, 128]
    assert "13 is wrong" in policy.calls[2][0][-1].content


def test_generate_verify_retry_stops_when_the_budget_cannot_pay_for_an_attempt():
    policy = ScriptedPolicy(["wrong answer " * 5] * 10)
    result = GenerateVerifyRetry(
        policy, lambda t, a: Evaluation(False, "no"), min_tokens=40, budget=Budget(max_tokens=120)
    ).run("task")
    assert result.stop_reason is StopReason.TOKEN_BUDGET and result.steps == 2
    assert (
        GenerateVerifyRetry(
            ScriptedPolicy(["a", "b"]), lambda t, a: Evaluation(False), max_attempts=2
        )
        .run("t")
        .stop_reason
        is StopReason.MAX_ATTEMPTS
    )
