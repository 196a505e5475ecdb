"""Simulated users for conversational tasks (tau-bench: Yao et al. 2024, arXiv:2406.12045).

In tau-bench the agent serves a user who holds the task's details (which order, what change)
and gives them only when asked; the episode ends when the user says it is done (`STOP`) or at
a turn limit.  A user here is a configuration whose ``start(task, seed)`` gives a fresh user
for one episode; that user says ``opening()`` and then ``reply(message)`` to each message the
agent addresses to it.  Its ``id`` is recorded with every episode, as its turns are:

* `RuleUser`: rule-based and deterministic given the task's `Instruction` and the seed (the
  seed picks phrasings only, never what is revealed), so scores do not move with a user model;
* `PolicyUser`: any policy (a local model, an endpoint) plays the user under a fixed, versioned
  prompt whose sha256 is in its ``id``, with its sampling seed pinned to the episode's;
* `ReplayUser`: says the turns of a recorded episode again, so the same agent reproduces the
  same conversation and result (and a different agent fails where it diverges).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence

from agentic_jax.data.chat import Message

STOP = "###STOP###"  # tau-bench's end-of-conversation marker
RULES_VERSION = 1  # bump when RuleUser's behaviour changes: its scores are then not comparable


@dataclasses.dataclass(frozen=True)
class Detail:
    """Something the user knows: revealed when the agent asks a question with one of ``cues``."""

    name: str
    value: str
    cues: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Request:
    """One thing the user wants (``intent``, said without details) and the details it needs."""

    intent: str
    details: tuple[Detail, ...] = ()


@dataclasses.dataclass(frozen=True)
class Instruction:
    """The user's hidden goal: requests in the order the user raises them."""

    requests: tuple[Request, ...]

    def text(self) -> str:
        """The instruction in words, for a model playing the user."""
        lines = []
        for i, r in enumerate(self.requests, 1):
            known = "; ".join(f"{d.name}: {d.value}" for d in r.details)
            lines.append(
                f"{i}. You want to {r.intent}." + (f" You know: {known}." if known else "")
            )
        return "\n".join(lines)


def is_done(message: str) -> bool:
    return STOP in message


_OPENINGS = ("Hi! I'd like to {}.", "Hello, I need to {}.", "Hi there, I want to {}.")
_DETAILS = ("The {} is {}.", "My {} is {}.", "Sure, the {} is {}.")
_NEXT = ("Thanks! I also want to {}.", "Great. Next, I'd like to {}.")
_DONE = (f"Thank you, that's all. {STOP}", f"Perfect, thanks! {STOP}")
_CONFIRM = ("confirm", "proceed", "go ahead", "shall i", "should i")
_MORE = ("anything else",)


@dataclasses.dataclass
class RuleUser:
    """Answers from its instruction by rules: a question (a message with ``?``) that names a
    detail of the current request gets that detail and no other; one asking to confirm gets a
    yes; any other question gets the intent again.  A message without a question (the agent
    reporting an outcome), or one asking whether there is anything else, moves to the next
    request, and after the last one the user says `STOP`."""

    instruction: Instruction | None = None
    seed: int = 0

    def __post_init__(self):
        self._rng, self._current = random.Random(self.seed), 0

    @property
    def id(self) -> str:
        return f"RuleUser:v{RULES_VERSION}"

    def start(self, task, seed: int) -> RuleUser:
        return dataclasses.replace(self, instruction=task.instruction, seed=seed)

    def _say(self, templates: Sequence[str], *values: str) -> str:
        return self._rng.choice(templates).format(*values)

    def opening(self) -> str:
        return self._say(_OPENINGS, self.instruction.requests[0].intent)

    def reply(self, message: str) -> str:
        request = self.instruction.requests[self._current]
        text = message.lower()
        if "?" in text and not any(cue in text for cue in _MORE):
            asked = [d for d in request.details if any(cue in text for cue in d.cues)]
            if asked:
                return " ".join(self._say(_DETAILS, d.name, d.value) for d in asked)
            if any(cue in text for cue in _CONFIRM):
                return "Yes, please go ahead."
            return f"Sorry, I don't know. I'd like to {request.intent}."
        self._current += 1
        if self._current == len(self.instruction.requests):
            return self._say(_DONE)
        return self._say(_NEXT, self.instruction.requests[self._current].intent)


PROMPT_VERSION = 1
PROMPT = (
    "You are playing a customer who is chatting with a support agent. Your goals, in order:\n"
    "{instruction}\n\n"
    "Rules: write one short message at a time, as the customer. Start by saying what you want "
    "without any details. Give a detail only when the agent asks for it, and never invent a "
    "detail that is not above. When the agent has handled every goal, reply with only "
    f"{STOP}."
)
PROMPT_SHA256 = hashlib.sha256(PROMPT.encode()).hexdigest()
GREETING = "Hi! How can I help you today?"  # the agent's turn before the user's first message


@dataclasses.dataclass
class PolicyUser:
    """A policy plays the user: it sees `PROMPT` filled with the instruction, the agent's
    messages as its user turns and its own as its assistant turns (tau-bench's LLM user), and
    samples at ``temperature`` with the episode's seed.  ``name`` says what plays the user in
    the ``id`` (default: the policy's class)."""

    policy: object = None
    temperature: float = 0.0
    max_tokens: int = 128
    name: str = ""
    instruction: Instruction | None = None
    seed: int = 0

    def __post_init__(self):
        if self.policy is None or not hasattr(self.policy, "respond"):
            raise ValueError(f"PolicyUser.policy must be a policy, got {self.policy!r}")
        if self.temperature < 0 or self.max_tokens < 1:
            raise ValueError(
                f"PolicyUser needs temperature >= 0 and max_tokens >= 1, got "
                f"{self.temperature} and {self.max_tokens}"
            )
        self.history: list[Message] = []

    @property
    def id(self) -> str:
        who = self.name or type(self.policy).__name__
        return f"PolicyUser:v{PROMPT_VERSION}:{PROMPT_SHA256[:16]}:{who}:t={self.temperature}"

    def start(self, task, seed: int) -> PolicyUser:
        return dataclasses.replace(self, instruction=task.instruction, seed=seed)

    def _answer(self, message: str) -> str:
        self.history.append(Message("user", message))
        system = Message("system", PROMPT.format(instruction=self.instruction.text()))
        turn = self.policy.respond(
            [system, *self.history],
            [],
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            seed=self.seed,
        )
        self.history.append(Message("assistant", turn.text))
        return turn.text

    def opening(self) -> str:
        return self._answer(GREETING)

    def reply(self, message: str) -> str:
        return self._answer(message)


@dataclasses.dataclass
class ReplayUser:
    """Says a recorded episode's user ``turns`` (the opening first) in order, under the ``id``
    of the user that said them, and checks that the agent tells it what the recorded agent did
    (``told``, one message before each turn after the opening): a replay reproduces the
    conversation or fails where it diverges."""

    turns: tuple[str, ...]
    told: tuple[str, ...]
    id: str

    def __post_init__(self):
        if len(self.turns) != len(self.told) + 1:
            raise ValueError(
                f"a recorded conversation has one user turn more than the agent's messages to "
                f"the user (the opening), got {len(self.turns)} and {len(self.told)}"
            )
        self._said = 0

    def start(self, task, seed: int) -> ReplayUser:
        del task, seed
        return dataclasses.replace(self)

    def opening(self) -> str:
        self._said = 1
        return self.turns[0]

    def reply(self, message: str) -> str:
        expected = self.told[self._said - 1] if self._said < len(self.turns) else None
        if message != expected:
            raise ValueError(
                f"the agent's message {self._said} to the user was {message!r}, the recorded "
                f"one {expected!r}: it is not the agent that was recorded"
            )
        self._said += 1
        return self.turns[self._said - 1]
