"""A team message bus: topics, acknowledgements, retries and dead letters, carrying FIPA-ACL
messages whose conversation id follows them into the trace.

**Messages.**  :class:`ACLMessage` has the fields of FIPA ACL (FIPA SC00061G, *ACL Message
Structure Specification*, 2002) that a team needs: a ``performative`` from the FIPA
communicative act library (SC00037J: inform, request, cfp, propose, ...), ``sender``,
``receivers``, ``content``, ``reply_to`` (who should get the answer, if not the sender),
``conversation_id`` (the correlation id every message of one exchange shares),
``in_reply_to`` (the ``message_id`` it answers) and a ``timestamp``.  :meth:`ACLMessage.reply`
keeps the conversation id, so it holds along a chain of requests and replies.

**Delivery (at least once).**  :meth:`MessageBus.publish` queues one delivery per subscriber of
the topic (only those among the message's ``receivers`` when it names any);
:meth:`MessageBus.drain` hands them, first in first out, to the subscribers' handlers.  A handler
acknowledges by returning ``True``.  Anything else (``False``, ``None``, an exception) leaves
the message unacknowledged: it goes to the back of the queue and is delivered again, up to
``max_attempts`` deliveries in all, then it is dead-lettered: kept in ``dead_letters`` with the
reason.  A message nobody can receive (no subscriber of the topic, or a receiver not
subscribed) is dead-lettered at once.  Handlers must therefore be idempotent, as with any
at-least-once queue (AMQP's manual acknowledgements, SQS's visibility timeout).

**Tracing.**  The bus traces each publish, delivery, acknowledgement, retry and dead letter
(events of kind ``bus``) with the message's ``conversation_id``; the handler gets a
:class:`Delivery` whose ``tracer`` adds ``conversation_id`` and the subscriber's name as
``agent``, so an agent run inside the handler (``ReActAgent(..., tracer=delivery.tracer)``)
writes its events, and its OpenTelemetry spans (attribute ``agent.conversation_id``), under the
same correlation id.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import NamedTuple

import gin

from agentic_jax.agents.context.tracing import CONTENT_LIMIT, Tracer
from agentic_jax.text import clip


class Performative(str, enum.Enum):
    """The FIPA communicative acts (SC00037J)."""

    ACCEPT_PROPOSAL = "accept-proposal"
    AGREE = "agree"
    CANCEL = "cancel"
    CFP = "cfp"
    CONFIRM = "confirm"
    DISCONFIRM = "disconfirm"
    FAILURE = "failure"
    INFORM = "inform"
    INFORM_IF = "inform-if"
    INFORM_REF = "inform-ref"
    NOT_UNDERSTOOD = "not-understood"
    PROPAGATE = "propagate"
    PROPOSE = "propose"
    PROXY = "proxy"
    QUERY_IF = "query-if"
    QUERY_REF = "query-ref"
    REFUSE = "refuse"
    REJECT_PROPOSAL = "reject-proposal"
    REQUEST = "request"
    REQUEST_WHEN = "request-when"
    REQUEST_WHENEVER = "request-whenever"
    SUBSCRIBE = "subscribe"


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclasses.dataclass(frozen=True)
class ACLMessage:
    """One FIPA-ACL message; see the module docstring.  ``performative`` may be given as its
    FIPA name (``"inform"``)."""

    performative: Performative
    sender: str
    receivers: Sequence[str] = ()  # empty: every subscriber of the topic
    content: str = ""
    reply_to: str | None = None
    conversation_id: str = dataclasses.field(default_factory=_new_id)
    in_reply_to: str | None = None
    message_id: str = dataclasses.field(default_factory=_new_id)
    timestamp: float = dataclasses.field(default_factory=time.time)

    def __post_init__(self):
        try:
            object.__setattr__(self, "performative", Performative(self.performative))
        except ValueError:
            raise ValueError(
                f"performative {self.performative!r} is not a FIPA act; one of "
                f"{[p.value for p in Performative]}"
            ) from None
        if not self.sender:
            raise ValueError("a message needs a sender")
        receivers = (self.receivers,) if isinstance(self.receivers, str) else self.receivers
        object.__setattr__(self, "receivers", tuple(receivers))

    def reply(self, sender: str, performative: Performative | str, content: str) -> ACLMessage:
        """The answer to this message: to its ``reply_to`` (else its sender), in the same
        conversation."""
        return ACLMessage(
            performative,
            sender,
            (self.reply_to or self.sender,),
            content,
            conversation_id=self.conversation_id,
            in_reply_to=self.message_id,
        )


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What a handler gets: the message, where and to whom it came, which attempt this is (1
    first), and a tracer carrying the conversation id."""

    message: ACLMessage
    topic: str
    subscriber: str
    attempt: int
    tracer: Tracer


class DeadLetter(NamedTuple):
    """A message given up on: for ``subscriber`` on ``topic``, after ``attempts`` deliveries."""

    message: ACLMessage
    topic: str
    subscriber: str
    attempts: int
    reason: str


Handler = Callable[[Delivery], bool]


@gin.configurable(module="multi_agent")
class MessageBus:
    """Topic publish/subscribe with acknowledgements, up to ``max_attempts`` deliveries of a
    message to a subscriber, and dead letters; see the module docstring."""

    def __init__(self, *, max_attempts: int = 3, tracer: Tracer | None = None):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.tracer = tracer or Tracer(otel=False)
        self.dead_letters: list[DeadLetter] = []
        self._topics: dict[str, dict[str, Handler]] = {}
        self._queue: collections.deque[tuple[str, str, ACLMessage, int]] = collections.deque()
        self._lock = threading.Lock()

    def subscribe(self, topic: str, subscriber: str, handler: Handler) -> None:
        """``handler`` receives the messages published on ``topic`` for ``subscriber``."""
        if not topic or not subscriber:
            raise ValueError(f"topic and subscriber must be named, got {topic!r}, {subscriber!r}")
        with self._lock:
            handlers = self._topics.setdefault(topic, {})
            if subscriber in handlers:
                raise ValueError(f"{subscriber!r} is already subscribed to {topic!r}")
            handlers[subscriber] = handler

    def unsubscribe(self, topic: str, subscriber: str) -> None:
        """Stops deliveries to ``subscriber`` on ``topic``; those still queued are dead letters."""
        with self._lock:
            if subscriber not in self._topics.get(topic, {}):
                raise ValueError(f"{subscriber!r} is not subscribed to {topic!r}")
            del self._topics[topic][subscriber]

    def subscribers(self, topic: str) -> list[str]:
        with self._lock:
            return list(self._topics.get(topic, {}))

    def pending(self) -> int:
        """Deliveries queued (first attempts and retries)."""
        with self._lock:
            return len(self._queue)

    def publish(self, topic: str, message: ACLMessage) -> list[str]:
        """Queues ``message`` for the topic's subscribers (those among its receivers, if it
        names any); returns who will get it.  Receivers who cannot are dead letters now."""
        with self._lock:
            subscribed = list(self._topics.get(topic, {}))
            targets = (
                [r for r in message.receivers if r in subscribed]
                if message.receivers
                else subscribed
            )
            self._queue.extend((topic, name, message, 1) for name in targets)
        self._trace(
            "publish",
            topic,
            message,
            sender=message.sender,
            receivers=targets,
            performative=message.performative.value,
            content=clip(message.content, CONTENT_LIMIT),
        )
        unreachable = [r for r in message.receivers if r not in subscribed]
        if not message.receivers and not subscribed:
            unreachable = ["(anyone)"]
        for name in unreachable:
            self._dead(topic, name, message, 0, f"{name} is not subscribed to {topic!r}")
        return targets

    def drain(self, max_deliveries: int | None = None) -> int:
        """Delivers queued messages (and what the handlers publish meanwhile) until the queue is
        empty or ``max_deliveries`` handler calls were made; returns how many were made."""
        made = 0
        while max_deliveries is None or made < max_deliveries:
            with self._lock:
                if not self._queue:
                    break
                topic, name, message, attempt = self._queue.popleft()
                handler = self._topics.get(topic, {}).get(name)
            if handler is None:
                self._dead(topic, name, message, attempt - 1, f"{name} unsubscribed from {topic!r}")
                continue
            made += 1
            self._trace("deliver", topic, message, subscriber=name, attempt=attempt)
            tracer = self.tracer.scoped(agent=name, conversation_id=message.conversation_id)
            try:
                acked = handler(Delivery(message, topic, name, attempt, tracer)) is True
                why = "the handler did not acknowledge"
            except Exception as e:
                acked, why = False, f"the handler raised {type(e).__name__}: {e}"
            if acked:
                self._trace("ack", topic, message, subscriber=name, attempt=attempt)
            elif attempt < self.max_attempts:
                self._trace("retry", topic, message, subscriber=name, attempt=attempt, why=why)
                with self._lock:
                    self._queue.append((topic, name, message, attempt + 1))
            else:
                self._dead(topic, name, message, attempt, f"{why} in {attempt} deliveries")
        return made

    def _dead(self, topic: str, name: str, message: ACLMessage, attempts: int, why: str) -> None:
        with self._lock:
            self.dead_letters.append(DeadLetter(message, topic, name, attempts, why))
        self._trace("dead_letter", topic, message, subscriber=name, attempt=attempts, why=why)

    def _trace(self, name: str, topic: str, message: ACLMessage, **fields) -> None:
        self.tracer.emit(
            "bus",
            name=name,
            topic=topic,
            message_id=message.message_id,
            conversation_id=message.conversation_id,
            **fields,
        )
