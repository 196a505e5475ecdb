"""Self-improvement loops: the harness loop behind its held-out gate, and agentic self-instruct.

The scripted agent plays each task's demonstration (right) or its corrupted twin (a wrong final
answer), by what its system message says, so the held-out success of every harness is known in
advance: the gate's decisions, the stops and the kept data are checked against it.  McNemar's
p-value is checked against the exact binomial sum written out, and the SFT file against the
project's reader and the SFT trainer's tokenisation.
"""

import json
import math

import gin
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import task_tokenizer

from agentic_jax.agents.policies.base import AssistantMessage, PolicyError, ScriptedPolicy, Usage
from agentic_jax.data.datasets import read_conversations
from agentic_jax.envs.text import Arithmetic
from agentic_jax.eval.agent_metrics import Episode
from agentic_jax.eval.suites.self_improvement import (
    RETRY_SEED,
    ChangeLog,
    Gate,
    Harness,
    HarnessEdit,
    PolicyProposer,
    ProposalError,
    RuleProposer,
    attempt,
    improve_harness,
    parse_edit,
)
from agentic_jax.eval.suites.self_instruct import (
    Generated,
    SeededTasks,
    WrittenArithmetic,
    self_instruct,
)
from agentic_jax.eval.suites.suite import Suite
from agentic_jax.post_training.sft import chat_examples

FAMILY = Arithmetic(1)
TRAIN = Suite(name="train", generators=(FAMILY,), num_tasks=4, first_seed=0)
HELDOUT = Suite(name="heldout", generators=(FAMILY,), num_tasks=4, first_seed=100)
CAREFUL, SLOPPY = "Be careful.", "Be sloppy."
FAILED = "verifier rejected"  # in every failure_text of a wrong answer


def even_seed(task, sampling):
    return task.seed % 2 == 0


class Obedient:
    """Right when the system message says ``CAREFUL``, wrong when it says ``SLOPPY``, otherwise
    as ``knows(task, sampling)`` says; after ``forget_after`` calls it knows nothing (a policy
    that changes between rounds, as an endpoint being retrained does)."""

    def __init__(self, tasks, knows=even_seed, forget_after=None):
        self.by_question = {t.prompt[-1].content: t for t in tasks}
        self.knows, self.forget_after = knows, forget_after
        self.calls = []

    def respond(self, messages, tools=(), **sampling):
        self.calls.append((list(messages), list(tools), dict(sampling)))
        task = self.by_question[messages[1].content]
        system = messages[0].content
        forgot = self.forget_after is not None and len(self.calls) > self.forget_after
        right = CAREFUL in system or (
            SLOPPY not in system and not forgot and self.knows(task, sampling)
        )
        turns = [
            m for m in (task.demonstration if right else task.corrupted) if m.role == "assistant"
        ]
        turn = turns[sum(m.role == "tool" for m in messages)]
        finish = "tool_calls" if turn.tool_calls else "stop"
        return AssistantMessage(turn.content, turn.tool_calls, Usage(10, 5), finish)


def tasks_of(*suites):
    return [t for s in suites for t, _, _ in s.problems()]


def improve(out_dir, proposer, policy=None, **settings):
    """`improve_harness` on the tiny splits, by default with the obedient agent."""
    policy = policy or Obedient(tasks_of(TRAIN, HELDOUT))
    return improve_harness(policy, proposer, out_dir, train=TRAIN, heldout=HELDOUT, **settings)


def events(out_dir, kind=None):
    records = ChangeLog(out_dir / "changes.jsonl").records()
    return [r for r in records if kind is None or r["event"] == kind]


def test_the_self_improvement_loop_rejects_a_harness_change_that_lowers_heldout_success(tmp_path):
    proposer = RuleProposer([(FAILED, "system_prompt", SLOPPY)])
    result = improve(tmp_path, proposer, rounds=3, patience=2)
    assert result.harness == Harness() and result.accepted == 0
    assert result.start_success == result.success == 0.5  # seeds 100 and 102 of 100..103
    [decision] = events(tmp_path, "decision")
    assert decision["accepted"] is False and "drops" in decision["reason"]
    assert (decision["incumbent"], decision["candidate"]) == (0.5, 0.0)
    proposals = events(tmp_path, "proposal")
    assert proposals[0]["edit"]["value"] == SLOPPY
    assert [p["edit"] for p in proposals[1:]] == [None]  # the rule is proposed once
    assert result.stop_reason == "patience" and result.rounds == 2


def test_a_change_that_raises_heldout_success_is_accepted_after_a_rejected_one(tmp_path):
    """Through the LLM proposer: a scripted model's JSON replies (one in prose and a fence)."""
    replies = [
        json.dumps({"field": "system_prompt", "value": SLOPPY, "rationale": "shorter"}),
        f"Try this:\n```json\n{json.dumps({'field': 'system_prompt', 'value': CAREFUL})}\n```",
    ]
    model = ScriptedPolicy(replies)
    result = improve(tmp_path, PolicyProposer(model, max_failures=2), rounds=5)
    assert result.harness.system_prompt == CAREFUL
    assert (result.start_success, result.success, result.accepted) == (0.5, 1.0, 1)
    assert result.stop_reason == "no_failures" and result.rounds == 3
    assert [d["accepted"] for d in events(tmp_path, "decision")] == [False, True]
    # one record per proposal, each before its decision; the log ends with the outcome
    kinds = [r["event"] for r in events(tmp_path)]
    assert kinds.count("proposal") == len(model.calls) == 2
    assert kinds.index("proposal") < kinds.index("decision")
    assert events(tmp_path)[-1]["harness"]["system_prompt"] == CAREFUL
    # the model was shown the harness and the failures (2 of the train split's 2)
    request = model.calls[0][0][1].content
    assert '"retries": 0' in request and request.count(FAILED) == 2
    assert "2 failed tasks" in request


def test_the_loop_stops_when_heldout_success_drops(tmp_path):
    calls_per_round = 2 * (TRAIN.num_tasks + HELDOUT.num_tasks)  # two turns a task
    policy = Obedient(tasks_of(TRAIN, HELDOUT), forget_after=calls_per_round)
    result = improve(tmp_path, RuleProposer([]), policy, rounds=5, patience=5)
    assert (result.stop_reason, result.rounds) == ("heldout_dropped", 2)
    assert (result.start_success, result.success) == (0.5, 0.0)
    assert len(events(tmp_path, "proposal")) == 1  # none after the drop
    assert events(tmp_path)[-1]["reason"] == "heldout_dropped"


def test_unusable_proposals_are_logged_and_never_applied(tmp_path):
    replies = [
        "I would add more tools.",  # no JSON
        json.dumps({"field": "tool_descriptions", "value": {"search": "finds things"}}),
        json.dumps({"field": "model", "value": "bigger"}),  # not an editable field
    ]
    result = improve(tmp_path, PolicyProposer(ScriptedPolicy(replies)), rounds=3, patience=3)
    assert result.harness == Harness() and result.accepted == 0
    errors = [p["error"] for p in events(tmp_path, "proposal")]
    assert "no JSON object" in errors[0] and "unknown tools ['search']" in errors[1]
    assert "not 'model'" in errors[2]
    assert events(tmp_path, "decision") == []


def test_the_change_log_keeps_every_decision_made_before_a_crash(tmp_path):
    class CrashesSecond:
        calls = 0

        def __call__(self, harness, failures):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("proposer crashed")
            return HarnessEdit("retries", 1, "try again")

    with pytest.raises(RuntimeError, match="crashed"):
        improve(tmp_path, CrashesSecond())
    kinds = [r["event"] for r in events(tmp_path)]
    assert kinds == ["start", "measure", "measure", "proposal", "decision", "measure", "measure"]
    assert events(tmp_path, "decision")[0]["accepted"] is True  # 0.5 -> 0.5 does not drop


def test_the_splits_must_not_share_problems(tmp_path):
    policy = Obedient(tasks_of(TRAIN))
    with pytest.raises(ValueError, match="shares 4 problems"):
        improve_harness(policy, RuleProposer([]), tmp_path, train=TRAIN, heldout=TRAIN)


def _episodes(outcomes):
    return [Episode(f"t{i}", "h", "v", 0, 0, bool(s)) for i, s in enumerate(outcomes)]


def _exact_mcnemar(only_candidate, only_incumbent):
    n, k = only_candidate + only_incumbent, min(only_candidate, only_incumbent)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=30))
def test_the_gate_accepts_exactly_what_does_not_drop_or_is_significant(pairs):
    candidate, incumbent = zip(*pairs)
    new, old = sum(candidate), sum(incumbent)
    plain = Gate().decide(_episodes(candidate), _episodes(incumbent))
    assert plain["accepted"] == (new >= old)
    strict = Gate(significance=0.05).decide(_episodes(candidate), _episodes(incumbent))
    if new < old:
        assert not strict["accepted"] and "p_value" not in strict
    else:
        only_c = sum(c and not i for c, i in pairs)
        only_i = sum(i and not c for c, i in pairs)
        assert strict["p_value"] == pytest.approx(_exact_mcnemar(only_c, only_i))
        assert strict["accepted"] == (new > old and strict["p_value"] <= 0.05)


def test_the_gate_refuses_episodes_of_other_tasks():
    with pytest.raises(ValueError, match="different tasks"):
        Gate().decide(_episodes([1, 0]), [Episode("other", "h", "v", 0, 0, True)] * 2)
    with pytest.raises(ValueError, match="significance"):
        Gate(significance=1.5)


def test_every_harness_field_reaches_the_agent():
    task = FAMILY.sample(7)
    harness = Harness(
        system_prompt=CAREFUL,
        tool_descriptions={"calculator": "Adds, subtracts and multiplies."},
        skills=({"name": "arith", "description": "Sums.", "instructions": "Check twice."},),
    )
    policy = Obedient([task], knows=lambda task, sampling: False)
    tried = attempt(policy, harness, (task, FAMILY.tools, FAMILY.reward), seed=3)
    messages, tools, sampling = policy.calls[0]
    system = messages[0].content
    assert system.startswith(CAREFUL + "\n\nThink inside") and "Check twice." in system
    assert [t.spec.description for t in tools] == ["Adds, subtracts and multiplies."]
    assert sampling["seed"] == 3 and tried.episode.success
    assert tried.transcript[-1].content.endswith(f"<answer>{task.answer}</answer>")
    assert tried.tools[0].description == "Adds, subtracts and multiplies."


def test_retries_rerun_a_run_that_ended_without_an_answer():
    task = FAMILY.sample(1)

    class FailsFirstTry(Obedient):
        def respond(self, messages, tools=(), **sampling):
            if sampling["seed"] < RETRY_SEED:
                raise PolicyError("server down")
            return super().respond(messages, tools, **sampling)

    problem = (task, FAMILY.tools, FAMILY.reward)
    once = attempt(FailsFirstTry([task]), Harness(system_prompt=CAREFUL), problem, seed=0)
    assert once.episode.stop_reason == "policy_error" and not once.episode.success
    policy = FailsFirstTry([task])
    retried = attempt(policy, Harness(system_prompt=CAREFUL, retries=2), problem, seed=0)
    assert retried.episode.success and retried.episode.seed == RETRY_SEED
    assert {c[2]["seed"] for c in policy.calls} == {RETRY_SEED}  # no third try


def test_harness_and_edits_check_their_fields():
    with pytest.raises(ValueError, match="retries"):
        Harness(retries=-1)
    with pytest.raises(ValueError, match="names a skill twice"):
        Harness(skills=[{"name": "a", "description": "d", "instructions": ""}] * 2)
    with pytest.raises(ValueError, match="not a skill"):
        Harness(skills=({"name": "a", "steps": 3},))
    with pytest.raises(ValueError, match="not 'tools'"):
        HarnessEdit("tools", ())
    with pytest.raises(ProposalError, match="no JSON object"):
        parse_edit('{"field": "retries"}')
    assert parse_edit('x {"field": "retries", "value": 2} y').apply(Harness()).retries == 2
    assert Harness(tool_descriptions={"b": "2", "a": "1"}).tool_descriptions == (
        ("a", "1"),
        ("b", "2"),
    )


def test_the_entry_points_are_gin_configurable():
    try:
        gin.parse_config(
            [
                "eval.Gate.significance = 0.1",
                "eval.Harness.retries = 2",
                "eval.SeededTasks.count = 3",
                "eval.RuleProposer.rules = []",
                "eval.PolicyProposer.max_failures = 1",
                "eval.WrittenArithmetic.count = 2",
                "eval.improve_harness.rounds = 2",
                "eval.self_instruct.attempts = 3",
            ]
        )
        assert Gate().significance == 0.1 and Harness().retries == 2
        assert len(SeededTasks(generators=(FAMILY,))()) == 3
    finally:
        gin.clear_config()


def solve_rate_by_seed(task, sampling):
    """Seeds 0 mod 3: always solved; 1 mod 3: never; 2 mod 3: on even sampling seeds (half)."""
    return {0: True, 1: False, 2: sampling["seed"] % 2 == 0}[task.seed % 3]


def test_self_instruct_keeps_verified_trajectories_of_tasks_in_the_band(tmp_path):
    seeded = SeededTasks(generators=(FAMILY,), count=9, first_seed=0)()
    excluded = Suite(name="eval", generators=(FAMILY,), num_tasks=1, first_seed=5)  # seed 5
    duplicate = seeded[2]
    generated = [*seeded, duplicate, Generated("Tell me a joke", None, "not a question")]
    policy = Obedient([g.problem[0] for g in seeded], knows=solve_rate_by_seed)
    counts = self_instruct(
        policy, lambda: generated, tmp_path, attempts=4, per_task=3, exclude=excluded
    )
    kept_seeds = [2, 8]  # 2 mod 3, and 5 is the evaluation suite's
    assert counts == {"generated": 11, "kept": 2, "rejected": 9, "trajectories": 2}
    log = [r for r in ChangeLog(tmp_path / "self_instruct.jsonl").records() if r["event"] == "task"]
    assert len(log) == len(generated)
    reasons = {r["question"]: r["reason"] for r in log if not r["kept"]}
    assert reasons[seeded[5].text] == "a problem of the excluded evaluation suite"
    assert reasons["Tell me a joke"] == "not a question"
    assert sum("duplicate" in r["reason"] for r in log) == 1
    assert {r["solve_rate"] for r in log if "band" in r["reason"] and not r["kept"]} == {0.0, 1.0}
    assert [r["task_id"] for r in log if r["kept"]] == [f"Arithmetic/d1/s{s}" for s in kept_seeds]

    chats = read_conversations(tmp_path / "sft.jsonl")  # what train_sft(chats_file=...) reads
    assert len(chats) == 2  # the four attempts' two successes are one trajectory
    for chat, seed in zip(chats, kept_seeds):
        task = FAMILY.sample(seed)
        assert chat.messages[1].content == task.prompt[-1].content
        assert FAMILY.reward.host(chat.messages[-1].content, task) == 1.0  # verified
        assert [t.name for t in chat.tools] == ["calculator"]
    tokenizer = task_tokenizer(tmp_path)
    examples = chat_examples(chats, tokenizer, seq_len=256)
    trained = tokenizer.decode(examples[0]["targets"][examples[0]["loss_mask"] == 1].tolist())
    assert f"<answer>{FAMILY.sample(2).answer}</answer>" in trained


def test_self_instruct_checks_its_band():
    with pytest.raises(ValueError, match="band"):
        self_instruct(None, list, "unused", band=(1.0, 2.0))


def test_written_tasks_take_their_answers_from_the_calculator():
    reply = "\n".join(
        [
            "1. What is 3 + 4 * 2?",
            "What is (12 - 5) * 3?",
            "What is 7 / 2?",
            "What is 5 / 0?",
            "Here are some more.",
        ]
    )
    written = WrittenArithmetic(ScriptedPolicy([reply]), count=5)()
    assert [g.text for g in written[:2]] == ["What is 3 + 4 * 2?", "What is (12 - 5) * 3?"]
    for g in written[:2]:
        task, tools, reward = g.problem
        expression = g.text.removeprefix("What is ").removesuffix("?")
        assert task.answer == str(eval(expression))  # the independent reference: Python
        assert reward.host(f"<think>.</think><answer>{task.answer}</answer>", task) == 1.0
        assert task.prompt[-1].content == g.text and [t.name for t in tools] == ["calculator"]
    assert [g.problem for g in written[2:]] == [None] * 3
    assert [g.reason for g in written[2:]] == [
        "an inexact division (the calculator floors it)",
        "the calculator rejects it: division by zero",
        "not a 'What is <expression>?' question",
    ]
