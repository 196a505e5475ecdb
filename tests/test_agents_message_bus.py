"""The message bus: topic routing, acknowledgements, retries and dead letters, FIPA-ACL fields,
and the conversation id carried into the trace and the OpenTelemetry spans."""

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_agents_tracing import otel_tracer

from agentic_jax.agents import ReActAgent, ScriptedPolicy
from agentic_jax.agents.multi_agent import ACLMessage, MessageBus, Performative


def recorder(bus, topic, name, acks=True):
    """Subscribes ``name`` with a handler that records what it gets and returns ``acks``
    (a value, or a function of the attempt number)."""
    got = []

    def handler(delivery):
        got.append(delivery)
        return acks(delivery.attempt) if callable(acks) else acks

    bus.subscribe(topic, name, handler)
    return got


def inform(content="hi", **fields):
    return ACLMessage("inform", "alice", content=content, **fields)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcde"), st.sets(st.sampled_from("xyz")), min_size=1),
    st.lists(st.sampled_from("xyzw"), min_size=1, max_size=6),
)
def test_a_message_reaches_exactly_the_subscribers_of_its_topic(subscriptions, topics):
    bus = MessageBus()
    inbox = {
        (name, topic): recorder(bus, topic, name)
        for name, subscribed in subscriptions.items()
        for topic in subscribed
    }
    for i, topic in enumerate(topics):
        bus.publish(topic, inform(f"m{i}"))
    bus.drain()
    for (name, topic), got in inbox.items():
        expected = [f"m{i}" for i, t in enumerate(topics) if t == topic]
        assert [d.message.content for d in got] == expected
        assert all(d.topic == topic and d.subscriber == name and d.attempt == 1 for d in got)
    unheard = [t for t in topics if not any(t in s for s in subscriptions.values())]
    assert [d.topic for d in bus.dead_letters] == unheard  # nobody to hear it: reported


def test_named_receivers_narrow_the_topic_and_an_unsubscribed_receiver_is_reported():
    bus = MessageBus()
    a, b = recorder(bus, "t", "a"), recorder(bus, "t", "b")
    assert bus.publish("t", inform(receivers=["b", "carol"])) == ["b"]
    bus.drain()
    assert not a and len(b) == 1
    (dead,) = bus.dead_letters
    assert (dead.subscriber, dead.attempts) == ("carol", 0) and "not subscribed" in dead.reason


@pytest.mark.parametrize("max_attempts", [1, 2, 4])
@pytest.mark.parametrize("nack", [False, None, "raise"])
def test_an_unacknowledged_message_is_retried_then_dead_lettered(max_attempts, nack):
    bus = MessageBus(max_attempts=max_attempts)

    def refuse(attempt):
        if nack == "raise":
            raise RuntimeError("busy")
        return nack

    flaky, steady = recorder(bus, "t", "flaky", refuse), recorder(bus, "t", "steady")
    message = inform()
    bus.publish("t", message)
    assert bus.drain() == max_attempts + 1
    assert [d.attempt for d in flaky] == list(range(1, max_attempts + 1))
    assert len(steady) == 1  # acknowledged once, never redelivered
    (dead,) = bus.dead_letters
    assert dead == (message, "t", "flaky", max_attempts, dead.reason)
    assert ("raised RuntimeError: busy" if nack == "raise" else "did not acknowledge") in (
        dead.reason
    )
    steps = [e["name"] for e in bus.tracer.events if e.get("subscriber") == "flaky"]
    assert steps == ["deliver", "retry"] * (max_attempts - 1) + ["deliver", "dead_letter"]


def test_a_message_acknowledged_on_a_retry_is_not_delivered_again_and_others_go_first():
    bus = MessageBus(max_attempts=5)
    got = recorder(bus, "t", "s", lambda attempt: attempt == 3)
    bus.publish("t", inform("first"))
    bus.publish("t", inform("second"))
    bus.drain()
    assert [(d.message.content, d.attempt) for d in got] == [
        ("first", 1),
        ("second", 1),
        ("first", 2),
        ("second", 2),
        ("first", 3),
        ("second", 3),
    ]
    assert not bus.dead_letters and bus.pending() == 0


def test_drain_stops_at_max_deliveries_and_unsubscribing_dead_letters_the_rest():
    bus = MessageBus()
    got = recorder(bus, "t", "s")
    for i in range(3):
        bus.publish("t", inform(str(i)))
    assert bus.drain(max_deliveries=1) == 1 and bus.pending() == 2
    bus.unsubscribe("t", "s")
    assert bus.drain() == 0 and len(got) == 1
    assert [d.message.content for d in bus.dead_letters] == ["1", "2"]


def test_fipa_fields_are_checked_and_a_reply_stays_in_the_conversation():
    with pytest.raises(ValueError, match="'tell' is not a FIPA act"):
        ACLMessage("tell", "alice")
    with pytest.raises(ValueError, match="needs a sender"):
        ACLMessage("inform", "")
    request = ACLMessage("request", "alice", "bob", "sum 2 3", reply_to="ledger")
    assert request.performative is Performative.REQUEST and request.receivers == ("bob",)
    answer = request.reply("bob", Performative.INFORM, "5")
    assert answer.receivers == ("ledger",) and answer.in_reply_to == request.message_id
    assert answer.conversation_id == request.conversation_id
    assert answer.message_id != request.message_id and answer.timestamp >= request.timestamp


def test_the_conversation_id_follows_a_request_and_its_reply_through_the_trace():
    """A worker answers a request by running an agent on the delivery's tracer and replying:
    every event and span of the exchange, the agent's own too, has the request's id."""
    tracer, exporter = otel_tracer()
    bus = MessageBus(tracer=tracer)

    def worker(delivery):
        agent = ReActAgent(ScriptedPolicy(["5"]), tracer=delivery.tracer)
        answer = agent.run(delivery.message.content).answer
        bus.publish("results", delivery.message.reply("worker", "inform", answer))
        return True

    bus.subscribe("requests", "worker", worker)
    replies = recorder(bus, "results", "alice")
    request = ACLMessage("request", "alice", content="sum 2 3")
    bus.publish("requests", request)
    bus.publish("requests", ACLMessage("request", "alice", content="other"))  # another exchange
    bus.drain()
    first = [e for e in tracer.events if e.get("conversation_id") == request.conversation_id]
    kinds = collections.Counter(e["kind"] for e in first)
    assert kinds["run_start"] == kinds["model_call"] == kinds["run_end"] == 1
    assert kinds["bus"] == 6  # publish, deliver, ack of the request and of the reply
    assert all(e["agent"] == "worker" for e in first if e["kind"] == "model_call")
    assert replies[0].message.conversation_id == request.conversation_id
    assert replies[0].message.content == "5"
    spans = [
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get("agent.conversation_id") == request.conversation_id
    ]
    assert {"invoke_agent react", "chat", "agent.bus publish", "agent.bus ack"} <= {
        s.name for s in spans
    }
    (run,) = [s for s in spans if s.name == "invoke_agent react"]
    assert run.attributes["gen_ai.conversation.id"] == request.conversation_id
    assert len(tracer.events) == len({e["seq"] for e in tracer.events}) == 2 * len(first)


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="max_attempts must be at least 1"):
        MessageBus(max_attempts=0)
    bus = MessageBus()
    bus.subscribe("t", "s", lambda d: True)
    with pytest.raises(ValueError, match="'s' is already subscribed to 't'"):
        bus.subscribe("t", "s", lambda d: True)
    with pytest.raises(ValueError, match="'x' is not subscribed"):
        bus.unsubscribe("t", "x")
