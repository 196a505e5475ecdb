"""Multi-agent patterns on scripted agents: answers, message counts, budgets, termination,
failures, Contract-Net awards, vote tie-breaks, and the research example through the CLI."""

import json
import time

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agentic_jax.agents import Budget, ScriptedPolicy, StopReason, ToolError, load, render, tool
from agentic_jax.agents.multi_agent import (
    RESEARCH_CORPUS,
    Blackboard,
    ContractNet,
    Debate,
    OrchestratorWorkers,
    PeerNetwork,
    TeamLimits,
    TeamMember,
    Vote,
    normalize,
    parse_bid,
    parse_choice,
    parse_vote,
    tally,
)
from agentic_jax.cli import main


class Broken:
    """A policy that crashes (not with PolicyError: any exception)."""

    def respond(self, messages, tools=(), **sampling):
        raise RuntimeError("backend crashed")


def agent(name, *responses, **kw):
    return TeamMember(name, ScriptedPolicy(list(responses)), **kw)


def calls(name, **arguments):
    return {"text": "", "tool_calls": [{"name": name, "arguments": arguments}]}


def prompt_of(member, call=-1):
    """The user turn a member's policy saw in one of its calls."""
    return member.policy.calls[call][0][-1].content


def assert_accounting(result):
    """Per-agent usage adds up to the total, and both match the traced model calls."""
    per_agent = sum(s.usage.total_tokens for s in result.agents.values())
    traced = sum(
        e["prompt_tokens"] + e["completion_tokens"]
        for e in result.trace
        if e["kind"] == "model_call"
    )
    assert per_agent == result.usage.total_tokens == traced > 0
    assert sum(s.model_calls for s in result.agents.values()) == result.model_calls
    assert sum(s.sent for s in result.agents.values()) <= len(result.messages)
    assert result.trace[0]["kind"] == "run_start" and result.trace[-1]["kind"] == "run_end"
    assert result.trace[-1]["stop_reason"] == result.stop_reason.value


# ------------------------------------------------------------------ orchestrator-workers
@pytest.mark.parametrize("n", [1, 3])
def test_orchestrator_workers_sends_exactly_2n_messages(n):
    plan = "\n".join(f"{i}. part {i}" for i in range(1, n + 1))
    lead = agent("lead", plan, "all parts done")
    workers = [agent(f"w{i}", f"result {i}") for i in range(1, n + 1)]
    result = OrchestratorWorkers(lead, workers).run("do it")
    assert result.ok and result.answer == "all parts done"
    assert result.count("task") == result.count("result") == n and result.count() == 2 * n
    assert [r["worker"] for r in result.artifacts["lead"]] == [w.name for w in workers]
    synthesis = prompt_of(lead)
    assert all(f"part {i}: result {i}" in synthesis for i in range(1, n + 1))
    assert prompt_of(workers[-1]).endswith(
        f"Your subtask: part {n}\n\nSolve the subtask; reply with its result."
    )
    assert all(result.agents[w.name].sent == result.agents[w.name].received == 1 for w in workers)
    assert_accounting(result)


def test_failing_workers_are_excluded_and_their_subtasks_retried_elsewhere():
    @tool
    def lookup(key: str) -> str:
        """Always fails."""
        raise ToolError("service down")

    crashing = TeamMember("crashing", Broken())
    # A tool error, then its budget (one model call) is spent before it can answer.
    starved = agent(
        "starved",
        calls("lookup", key="x"),
        "never said",
        tools=[lookup],
        budget=Budget(max_steps=1),
    )
    steady = agent("steady", "r1", "r2", "r3")
    lead = agent("lead", "1. a\n2. b\n3. c", "combined")
    result = OrchestratorWorkers(lead, [crashing, starved, steady]).run("task")
    assert result.ok and result.answer == "combined"
    assert {f.agent: f.reason for f in result.failures} == {
        "crashing": StopReason.POLICY_ERROR,
        "starved": StopReason.MAX_STEPS,
    }
    assert "RuntimeError: backend crashed" in result.agents["crashing"].failure.detail
    assert [r["worker"] for r in result.artifacts["lead"]] == ["steady"] * 3
    assert result.count("task") == 5 and result.count("result") == 3  # two retries
    tool_events = [e for e in result.trace if e["kind"] == "tool_call"]
    assert tool_events[0]["agent"] == "starved" and tool_events[0]["status"] == "failed"
    assert_accounting(result)


def test_when_every_worker_fails_the_run_stops_with_agents_failed():
    lead = agent("lead", "1. a\n2. b", "unused")
    result = OrchestratorWorkers(
        lead, [TeamMember("w1", Broken()), TeamMember("w2", Broken())]
    ).run("task")
    assert result.stop_reason is StopReason.AGENTS_FAILED and result.answer is None
    assert result.count("task") == 2 and result.count("result") == 0  # b finds nobody left
    assert len(lead.policy.calls) == 1  # no synthesis without results


def test_hierarchical_teams_delegate_through_their_leads():
    team_a = OrchestratorWorkers(
        agent("lead_a", "1. a1\n2. a2", "A"), [agent("a1", "x1"), agent("a2", "x2")]
    )
    team_b = OrchestratorWorkers(
        agent("lead_b", "1. b1\n2. b2", "B"), [agent("b1", "y1"), agent("b2", "y2")]
    )
    root = agent("root", "1. part a\n2. part b", "A and B")
    result = OrchestratorWorkers(root, [team_a, team_b]).run("everything")
    assert result.ok and result.answer == "A and B" and result.pattern == "hierarchical_teams"
    assert result.count() == 12  # 2 x 2 at the top, 2 x 2 inside each sub-team
    assert [(m.sender, m.recipients[0]) for m in result.messages[:2]] == [
        ("root", "lead_a"),
        ("lead_a", "a1"),
    ]
    assert "1. a1: x1\n2. a2: x2" in prompt_of(team_a.orchestrator)
    assert "1. part a: A\n2. part b: B" in prompt_of(root)
    assert prompt_of(team_b.orchestrator, 0).startswith("Task: part b")
    with pytest.raises(ValueError, match="two team members are called 'a1'"):
        OrchestratorWorkers(root, [team_a, agent("a1")]).run("x")


def test_a_sub_team_given_two_subtasks_synthesises_each_from_its_own_results():
    # Three subtasks over two sub-teams: round robin gives part a and part c to team_a.
    team_a = OrchestratorWorkers(
        agent("lead_a", "1. a1", "A", "1. c1", "C"), [agent("a1", "x1", "z1")]
    )
    team_b = OrchestratorWorkers(agent("lead_b", "1. b1", "B"), [agent("b1", "y1")])
    root = agent("root", "1. part a\n2. part b\n3. part c", "ABC")
    result = OrchestratorWorkers(root, [team_a, team_b]).run("everything")
    assert result.ok and "1. part a: A\n2. part b: B\n3. part c: C" in prompt_of(root)
    synthesis = prompt_of(team_a.orchestrator)
    assert synthesis.startswith("Task: part c") and "1. c1: z1\n\n" in synthesis
    assert "x1" not in synthesis
    assert [r["subtask"] for r in result.artifacts["lead_a"]] == ["a1", "c1"]


# ---------------------------------------------------------------------------- peer network
def test_peers_exchange_messages_through_mailboxes_until_a_final_answer():
    alice = agent(
        "alice",
        calls("send_message", to="bob", content="What is 6 * 7?"),
        "asked",
        calls("final_answer", answer="42"),
        "done",
    )
    bob = agent(
        "bob",
        calls("send_message", to="carol", content="?"),
        calls("send_message", to="alice", content="It is 42."),
        "told her",
    )
    result = PeerNetwork([alice, bob], limits=TeamLimits(max_rounds=5)).run("6 * 7?")
    assert result.ok and result.answer == "42" and result.rounds == 3
    assert [(m.sender, m.recipients, m.act) for m in result.messages] == [
        ("(user)", ("alice",), "task"),
        ("alice", ("bob",), "message"),
        ("bob", ("alice",), "message"),
    ]
    assert "From bob (message): It is 42." in prompt_of(alice, 2)
    bad = [e for e in result.trace if e["kind"] == "tool_call" and e["status"] != "ok"]
    assert len(bad) == 1 and bad[0]["status"] == "invalid_arguments"  # carol is no peer
    assert result.agents["bob"].received == 1 and result.agents["alice"].received == 2
    shown = render(result.trace)
    assert "[bob 1] model" in shown and "[round 2] bob -> alice (message): It is 42." in shown
    assert_accounting(result)


def ping_pong(turns):
    def script(to):
        return [
            step
            for i in range(turns)
            for step in (calls("send_message", to=to, content=f"ping {i}"), "sent")
        ]

    return [agent("alice", *script("bob")), agent("bob", *script("alice"))]


@pytest.mark.parametrize(
    "limits, reason, messages",
    [
        (TeamLimits(max_rounds=4), StopReason.MAX_ROUNDS, 5),
        (TeamLimits(max_rounds=10, max_messages=3), StopReason.MAX_MESSAGES, 3),
        (TeamLimits(max_rounds=10, budget=Budget(max_steps=5)), StopReason.MAX_STEPS, 4),
    ],
)
def test_peers_that_never_answer_stop_at_the_limit(limits, reason, messages):
    result = PeerNetwork(ping_pong(6), limits=limits).run("chat")
    assert result.stop_reason is reason and result.answer is None
    assert len(result.messages) == messages
    assert result.model_calls <= limits.budget.max_steps


def test_a_final_answer_given_in_the_turn_that_hits_the_message_limit_still_wins():
    # The task is message 1 of 1: alice answers, then her message is refused by the limit; her
    # turn ends with a note, or with her policy failing.
    for ending in (["done"], []):
        alice = agent(
            "alice",
            calls("final_answer", answer="42"),
            calls("send_message", to="bob", content="fyi"),
            *ending,
        )
        result = PeerNetwork([alice, agent("bob")], limits=TeamLimits(max_messages=1)).run("?")
        assert result.stop_reason is StopReason.ANSWER and result.answer == "42"
        assert len(result.messages) == 1


def test_peers_with_nothing_left_to_say_stop_without_progress():
    result = PeerNetwork([agent("alice", "nothing to do"), agent("bob")]).run("task")
    assert result.stop_reason is StopReason.NO_PROGRESS and result.rounds == 2


# ------------------------------------------------------------------------------ blackboard
def test_blackboard_controller_picks_experts_until_finish():
    facts = agent("facts", "Paris is the capital of France.")
    writer = agent("writer", "ANSWER: Paris")
    chair = agent("chair", "facts first", "Now the WRITER.", "FINISH")
    result = Blackboard([facts, writer], chair).run("Capital of France?")
    assert result.ok and result.answer == "ANSWER: Paris"
    assert [e.author for e in result.artifacts["board"]] == ["facts", "writer"]
    assert result.count("post") == 2 and result.rounds == 3
    assert "[1] facts: Paris is the capital of France." in prompt_of(writer)
    assert "[2] writer: ANSWER: Paris" in prompt_of(chair)
    assert_accounting(result)


def test_blackboard_stops_when_posts_repeat_or_the_controller_talks_nonsense():
    repeat = Blackboard(
        [agent("facts", "same", "same", "same")],
        lambda task, board, names: "facts",
        limits=TeamLimits(patience=1),
    )
    result = repeat.run("x")
    assert result.stop_reason is StopReason.NO_PROGRESS and len(result.artifacts["board"]) == 2
    nonsense = Blackboard(
        [agent("facts")],
        lambda task, board, names: "nobody",
        limits=TeamLimits(patience=3, max_rounds=10),
    ).run("x")
    assert nonsense.stop_reason is StopReason.NO_PROGRESS and nonsense.rounds == 3
    endless = Blackboard(
        [agent("facts", *[f"fact {i}" for i in range(9)])],
        lambda task, board, names: "facts",
        limits=TeamLimits(max_rounds=4),
    )
    assert endless.run("x").stop_reason is StopReason.MAX_ROUNDS


def test_parse_choice_takes_the_first_name_or_finish():
    assert parse_choice("I think Writer should go, not facts", ["facts", "writer"]) == "writer"
    assert parse_choice("finish.", ["facts"]) == "FINISH"
    assert parse_choice("no idea", ["facts"]) is None


# ---------------------------------------------------------------------------------- voting
def reference_winner(answers, weights):
    totals, first = {}, {}
    for i, (a, w) in enumerate(zip(answers, weights)):
        key = " ".join(a.lower().split()).rstrip(".")
        totals[key] = totals.get(key, 0) + w
        first.setdefault(key, i)
    best = max(totals.values())
    return answers[min(first[k] for k, w in totals.items() if w == best)]


@given(
    st.lists(
        st.tuples(st.sampled_from(["4", "5", " 4.", "FIVE", "five"]), st.integers(0, 3)),
        min_size=1,
        max_size=9,
    )
)
def test_tally_breaks_ties_by_first_answer(votes):
    answers, weights = [a for a, _ in votes], [w for _, w in votes]
    result = tally(answers, weights)
    assert result.winner == reference_winner(answers, weights)
    assert result.total == sum(weights) and result.weight == max(result.weights.values())
    # Moving the winner's first vote to the front never changes the outcome.
    first = next(i for i, a in enumerate(answers) if normalize(a) == normalize(result.winner))
    order = [first] + [i for i in range(len(votes)) if i != first]
    assert normalize(
        tally([answers[i] for i in order], [weights[i] for i in order]).winner
    ) == normalize(result.winner)


def test_parse_vote_reads_answer_and_confidence():
    assert parse_vote("Thinking...\nANSWER: 12\nConfidence: 80%") == ("12", 0.8)
    assert parse_vote("just 7") == ("just 7", 1.0)
    assert parse_vote("answer = x\nconfidence: 3") == ("x", 1.0)  # clipped
    with pytest.raises(ValueError, match="non-negative"):
        tally(["a"], [-1])


@given(st.integers(0, 100), st.booleans(), st.sampled_from(["", ".", "!", ";", " ."]))
def test_parse_vote_reads_a_confidence_followed_by_punctuation(percent, as_percent, end):
    stated = f"{percent}%" if as_percent else f"{percent / 100}"
    answer, confidence = parse_vote(f"ANSWER: x\nCONFIDENCE: {stated}{end}")
    assert answer == "x" and confidence == pytest.approx(percent / 100)


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9)), min_size=1, max_size=9)
)
@example([("a", 3), ("b", 1), ("b", 2)])  # 0.1 + 0.2 != 0.3 in floats
def test_weighted_ties_follow_exact_sums_not_float_rounding(votes):
    # Confidences in tenths: the exact totals (integer tenths) decide, not float round-off.
    answers, tenths = [a for a, _ in votes], [t for _, t in votes]
    result = tally(answers, [t / 10 for t in tenths])
    assert result.winner == reference_winner(answers, tenths)
    assert result.weight == pytest.approx(sum(t for a, t in votes if a == result.winner) / 10)


def test_majority_and_confidence_weighted_votes_differ_and_failures_are_left_out():
    def voters():
        return [
            agent("a", "ANSWER: 4\nCONFIDENCE: 0.3"),
            agent("b", "ANSWER: 5\nCONFIDENCE: 0.9"),
            agent("c", "answer: 4.\nconfidence: 0.4"),
            TeamMember("d", Broken()),
        ]

    plain = Vote(voters()).run("2 + 2?")
    assert plain.ok and plain.answer == "4" and plain.count("answer") == 3
    assert [f.agent for f in plain.failures] == ["d"]
    weighted = Vote(voters(), weighted=True).run("2 + 2?")
    assert weighted.answer == "5" and weighted.artifacts["tally"] == pytest.approx(
        {"4": 0.7, "5": 0.9}
    )
    assert Vote([TeamMember("d", Broken())]).run("x").stop_reason is StopReason.AGENTS_FAILED


class Slow(ScriptedPolicy):
    def respond(self, messages, tools=(), **sampling):
        time.sleep(0.4)
        return super().respond(messages, tools, **sampling)


def test_a_members_wall_time_budget_counts_only_its_own_turns():
    slow = TeamMember("slow", Slow(["ANSWER: 4"]))
    quick = agent("quick", "ANSWER: 4", budget=Budget(max_wall_s=0.3))  # a turn takes ~1 ms
    result = Vote([slow, quick]).run("2 + 2?")
    assert result.ok and not result.failures and result.artifacts["tally"] == {"4": 2.0}


# ---------------------------------------------------------------------------------- debate
def rotating(n, rounds):
    """n debaters whose answers are a different rotation each round: never equal, always new."""
    return [agent(f"d{i}", *[f"ANSWER: {(i + r) % n}" for r in range(rounds)]) for i in range(n)]


@pytest.mark.parametrize("n, rounds", [(2, 2), (3, 3)])
def test_debaters_that_never_agree_stop_at_max_rounds_with_n_times_r_answers(n, rounds):
    debaters = rotating(n, rounds)
    result = Debate(debaters, limits=TeamLimits(max_rounds=rounds)).run("pick")
    assert result.stop_reason is StopReason.MAX_ROUNDS and result.rounds == rounds
    assert result.count("answer") == n * rounds and result.deliveries == n * (n - 1) * rounds
    assert result.answer == str((rounds - 1) % n)  # a tie: the first debater's last answer
    assert f"- d1: {1 % n}" in prompt_of(debaters[0], 1)  # round 2 shows the others' answers
    assert "Your previous answer: 0" in prompt_of(debaters[0], 1)
    assert_accounting(result)


def test_debate_ends_on_agreement_and_a_judge_settles_a_deadlock():
    agree = Debate(
        [agent("a", "ANSWER: 3", "ANSWER: 4"), agent("b", "ANSWER: 4", "ANSWER: 4")],
        limits=TeamLimits(max_rounds=5),
    ).run("x")
    assert agree.ok and agree.answer == "4" and agree.rounds == 2 and agree.count("answer") == 4
    stuck = [agent("a", "ANSWER: 1", "ANSWER: 1"), agent("b", "ANSWER: 2", "ANSWER: 2")]
    judge = agent("judge", "ANSWER: 2")
    judged = Debate(stuck, judge=judge, limits=TeamLimits(max_rounds=5, patience=1)).run("x")
    assert judged.ok and judged.answer == "2" and "no answer changed" in judged.detail
    assert judged.count("verdict") == 1 and "- a: ANSWER: 1" in prompt_of(judge)
    stuck = [agent("a", "ANSWER: 1", "ANSWER: 1"), agent("b", "ANSWER: 2", "ANSWER: 2")]
    unjudged = Debate(stuck, limits=TeamLimits(patience=1)).run("x")
    assert unjudged.stop_reason is StopReason.NO_PROGRESS and unjudged.answer == "1"


def test_a_failed_debater_is_left_out_of_the_broadcasts():
    result = Debate(
        [TeamMember("c", Broken()), agent("a", "ANSWER: 4"), agent("b", "ANSWER: 4")]
    ).run("2 + 2?")
    assert result.ok and result.answer == "4" and [f.agent for f in result.failures] == ["c"]
    assert [m.recipients for m in result.messages] == [("b",), ("a",)]
    assert result.agents["c"].received == 0


def test_a_debater_dropping_out_is_not_a_changed_answer():
    # c answers once and then fails; a and b repeat themselves, so round 2 changed nothing.
    stuck = [
        agent("a", *["ANSWER: 1"] * 3),
        agent("b", *["ANSWER: 2"] * 3),
        agent("c", "ANSWER: 3"),
    ]
    result = Debate(stuck, limits=TeamLimits(max_rounds=5, patience=1)).run("x")
    assert result.stop_reason is StopReason.NO_PROGRESS and result.rounds == 2
    assert [f.agent for f in result.failures] == ["c"] and result.answer == "1"


def test_team_token_budget_stops_a_debate_that_never_ends():
    debaters = rotating(3, 50)
    result = Debate(
        debaters, limits=TeamLimits(max_rounds=50, budget=Budget(max_steps=1000, max_tokens=600))
    ).run("pick")
    assert result.stop_reason is StopReason.TOKEN_BUDGET and result.answer is None
    # The last call may overrun by its own size, never by more.
    assert result.usage.total_tokens < 600 + 200
    assert not result.failures  # the team's limit, not a member's


# ----------------------------------------------------------------------------- Contract-Net
def bid_text(cost):
    return "NO BID" if cost is None else f"I can. BID: {cost}"


@given(st.integers(1, 3), st.integers(1, 3), st.data())
def test_contract_net_awards_every_task_to_the_best_bid(m, n, data):
    # Few distinct costs, so equal best bids (ties) are common.
    costs = data.draw(
        st.lists(
            st.lists(st.sampled_from([None, 1, 2]), min_size=n, max_size=n), min_size=m, max_size=m
        )
    )
    contractors = [
        agent(
            f"c{j}",
            *[bid_text(costs[i][j]) for i in range(m)],
            *[f"c{j} did job {k}" for k in range(m)],
        )
        for j in range(n)
    ]
    tasks = [f"job {i}" for i in range(m)]
    result = ContractNet(contractors, subtasks=tasks).run("all jobs")
    expected = {}
    for i, row in enumerate(costs):
        valid = [(c, j) for j, c in enumerate(row) if c is not None]
        if valid:
            expected[i] = f"c{min(valid)[1]}"
    assert result.artifacts["awards"] == expected
    announces = [msg for msg in result.messages if msg.act == "announce"]
    assert len(announces) == m and all(len(msg.recipients) == n for msg in announces)
    assert result.count("bid") == n * m
    assert result.count("award") == result.count("report") == len(expected)
    assert result.stop_reason is (StopReason.ANSWER if expected else StopReason.AGENTS_FAILED)
    for i, winner in expected.items():
        assert f"{i + 1}. job {i}: {winner} did job" in result.answer


def test_contract_net_reawards_a_failed_task_to_the_next_best_bid():
    cheap = agent("cheap", "BID: 1")  # wins, then cannot work (no scripted turn left)
    dear = agent("dear", "BID: 9", "done by dear")
    manager = agent("boss", "1. the job", "the job was done by dear")
    result = ContractNet([cheap, dear], manager=manager).run("get it done")
    assert result.ok and result.answer == "the job was done by dear"
    assert [(m.act, m.recipients) for m in result.messages if m.act == "award"] == [
        ("award", ("cheap",)),
        ("award", ("dear",)),
    ]
    assert result.artifacts["awards"] == {0: "dear"}
    assert result.agents["cheap"].failure.reason is StopReason.POLICY_ERROR
    assert parse_bid("bid: 2.5e1") == 25.0 and parse_bid("no bid, sorry") is None
    assert parse_bid("BID: nan") is None and parse_bid("I'd rather not") is None


def test_a_contractor_called_manager_is_not_confused_with_the_stand_in_manager():
    result = ContractNet([agent("manager", "BID: 1", "done")], subtasks=["job"]).run("job")
    assert result.ok and result.artifacts["awards"] == {0: "manager"}
    stats = result.agents["manager"]  # its bid and report; the announcement and the award
    assert (stats.sent, stats.received) == (2, 2)


# ----------------------------------------------------------------------- research example
def test_research_example_runs_from_the_cli_and_its_trace_shows_the_work(tmp_path, capsys):
    trace = tmp_path / "research.jsonl"
    assert main(["team", "--gin_file", "research_scripted", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "researcher -> writer (notes)" in out and "critic -> writer (feedback)" in out
    events = load(trace)
    searches = [e for e in events if e["kind"] == "tool_call" and e["name"] == "search"]
    assert [e["agent"] for e in searches] == ["researcher", "researcher"]
    corpus = {p.name: " ".join(p.read_text().split()) for p in RESEARCH_CORPUS.glob("*.md")}
    for event in searches:  # the hits are passages of the shipped corpus, as they are there
        doc = event["content"].split("]")[0].lstrip("[")
        assert doc in corpus
        passage = event["content"].split(") ", 1)[1].split("\n\n[")[0]
        assert " ".join(passage.split()) == corpus[doc]
    assert {e["content"].split("]")[0] for e in searches} == {"[contract_net.md", "[debate.md"}
    messages = [(e["sender"], e["act"]) for e in events if e["kind"] == "message"]
    assert messages.count(("writer", "draft")) == 2
    assert ("critic", "feedback") in messages and messages[-1] == ("critic", "accept")
    end = events[-1]
    assert end["kind"] == "run_end" and end["stop_reason"] == "answer"
    for fact in ("Reid G. Smith, 1980", "Du et al., 2023", "best bid", "majority vote"):
        assert fact in end["answer"]
    assert main(["trace", "show", str(trace)]) == 0
    shown = capsys.readouterr().out
    assert "[round 2] critic -> writer (accept): ACCEPT" in shown
    assert json.loads(trace.read_text().splitlines()[0])["agent"] == "research"
    # A critic that never accepts ("ACCEPTABLE? No" is no ACCEPT): the draft limit ends it, with
    # the last draft as the answer.
    assert (
        main(
            [
                "team",
                "--gin_file",
                "research_scripted",
                "--gin_param",
                "critic/agents.ScriptedPolicy.responses=['fix it', 'ACCEPTABLE? No']",
                "--gin_param",
                "multi_agent.TeamLimits.max_rounds=2",
            ]
        )
        == 1
    )
    assert "stop: max_rounds (the critic accepted none of 2 drafts)" in capsys.readouterr().out
