"""The confidence-gated board: which writes pass the gate (against a closed-form reference on
random write sequences), key subscriptions, and writers on several threads."""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.agents.multi_agent import ConfidenceBoard, Posting

writes = st.lists(
    st.tuples(st.sampled_from("xyz"), st.integers(0, 10).map(lambda k: k / 10)), max_size=25
)


@settings(max_examples=80, deadline=None)
@given(writes, st.integers(0, 10).map(lambda k: k / 10))
def test_without_an_overwrite_threshold_each_key_keeps_its_first_most_confident_write(
    sequence, floor
):
    board = ConfidenceBoard(min_confidence=floor)
    for i, (key, confidence) in enumerate(sequence):
        board.write(key, f"v{i}", "agent", confidence)
    for key in "xyz":
        admitted = [(c, i) for i, (k, c) in enumerate(sequence) if k == key and c >= floor]
        if not admitted:
            assert board.get(key) is None
            continue
        best = max(c for c, _ in admitted)
        first = min(i for c, i in admitted if c == best)
        running_max = [c for c, _ in admitted]
        records = sum(c > max(running_max[:j], default=-1) for j, c in enumerate(running_max))
        assert board.get(key) == Posting(f"v{first}", "agent", best, records)


def test_a_write_at_the_overwrite_threshold_displaces_a_more_confident_entry():
    board = ConfidenceBoard(min_confidence=0.2, overwrite_at=0.8)
    assert board.write("capital", "Lyon", "guesser", 0.95)
    assert not board.write("capital", "Marseille", "other", 0.7)  # lower, under the threshold
    assert not board.accepts("capital", 0.1) and board.accepts("capital", 0.8)
    assert board.write("capital", "Paris", "expert", 0.8)  # lower, but at the threshold
    assert board.get("capital") == Posting("Paris", "expert", 0.8, 2)
    assert not board.write("new", "x", "a", 0.1)  # under min_confidence even on an empty key


def test_subscribers_see_each_accepted_change_of_their_key_only():
    board = ConfidenceBoard()
    seen, other = [], []
    cancel = board.subscribe("k", lambda key, old, new: seen.append((key, old, new)))
    board.subscribe("j", lambda *change: other.append(change))
    board.write("k", "a", "p", 0.5)
    board.write("k", "b", "q", 0.4)  # rejected: no call
    board.write("k", "c", "q", 0.9)
    a, c = Posting("a", "p", 0.5, 1), Posting("c", "q", 0.9, 2)
    assert seen == [("k", None, a), ("k", a, c)] and not other
    cancel()
    board.write("k", "d", "r", 1.0)
    assert len(seen) == 2 and board.get("k").value == "d"


def test_a_failing_subscriber_does_not_stop_the_others_or_the_write():
    board = ConfidenceBoard()
    calls = []

    def broken(key, old, new):
        raise RuntimeError("subscriber down")

    board.subscribe("k", broken)
    board.subscribe("k", lambda *change: calls.append(change))
    with pytest.raises(ExceptionGroup, match="1 subscribers of 'k' failed"):
        board.write("k", "v", "a", 0.5)
    assert len(calls) == 1 and board.get("k").value == "v"


def test_writers_on_several_threads_leave_the_most_confident_entry():
    board = ConfidenceBoard()
    changes = []
    board.subscribe("k", lambda key, old, new: changes.append(new.confidence))
    start = threading.Barrier(4, timeout=30)

    def writer(offset):
        start.wait()
        for step in range(50):
            board.write("k", f"{offset}/{step}", f"w{offset}", (4 * step + offset) / 200)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert board.get("k").confidence == 199 / 200 and board.get("k").value == "3/49"
    assert sorted(changes) == sorted(set(changes))  # only strictly higher confidences got in
    assert board.get("k").version == len(changes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"min_confidence": -0.1}, "min_confidence"), ({"overwrite_at": 1.5}, "overwrite_at")],
)
def test_thresholds_outside_the_unit_interval_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=f"{message} must be in"):
        ConfidenceBoard(**kwargs)
    with pytest.raises(ValueError, match="confidence must be in"):
        ConfidenceBoard().write("k", "v", "a", 2.0)
