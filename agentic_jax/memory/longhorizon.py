"""Long chat histories with questions about them: the data of the long-horizon memory benchmark
(``python -m bench.memory``) and of its tests.

The design follows LongMemEval (Wu, Wang, Yu, Zhang, Chang & Yu 2024, *LongMemEval:
Benchmarking Chat Assistants on Long-Term Interactive Memory*, arXiv:2410.10813): a user's
history is many sessions of chat, most of it filler, with the evidence for each question placed
in a few turns, and the questions ask, after the last session, for

- ``single-session-user``: a fact the user stated once ("my sister's name is Maya");
- ``single-session-assistant``: something the assistant said ("I recommend 'Dune' ...");
- ``single-session-preference``: a preference the user stated;
- ``multi-session``: a total over two sessions ("I bought 3 plants", later "2 more plants");
- ``temporal-reasoning``: which of two events came first, or on what date one happened (the
  turns carry their session's date);
- ``knowledge-update``: a fact that changed later (moved city): the latest value is right;
- ``abstention``: something never stated (a brother when only a sister was named): the right
  answer is ``unknown``.

Every turn that holds (part of) a question's answer is listed in the question's ``evidence``
(LongMemEval's per-turn ``has_answer`` labels; for a knowledge update the turn with the latest
value, for a total both turns, for "which first" both events), so whether a memory *retrieved*
the evidence is measured apart from whether the answer came out right.  Filler turns are drawn
from templates that reuse the evidence's nouns without its statement ("my colleague's sister's
name is ...", "my neighbour bought 4 plants"), so a retriever that matches words alone finds
distractors too.  Everything is a function of the seed.

**The reader.**  :func:`extractive_answer` answers from a context of turns by the question's
template: a regular expression whose group ``a`` is the answer span, and a rule combining the
matches (the latest; the sum; the earliest of two events; the date of the latest).  No match
gives ``unknown``.  The reader is the same for every memory system compared, so differences in
accuracy are differences in what each memory put in the context.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import re
from collections.abc import Sequence

TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "temporal-reasoning",
    "knowledge-update",
    "abstention",
)
UNKNOWN = "unknown"
START = 1_704_067_200.0  # 2024-01-01 00:00 UTC: the first session
DAY = 86_400.0
STATEMENTS = 10  # evidence statements a question of each type takes, one per session

NAMES = ("Maya", "Ines", "Tomas", "Lena", "Omar", "Priya", "Jonas", "Chloe", "Ravi", "Yuki")
CITIES = ("Lisbon", "Oslo", "Lyon", "Porto", "Krakow", "Seville", "Ghent", "Bergen", "Turin")
# (attribute, statement, question, answer pattern, values): facts the user states once.
USER_FACTS = (
    ("sister", "By the way, my sister's name is {v}.", "What is my sister's name?",
     r"my sister's name is (?P<a>\w+)", NAMES),
    ("brother", "Oh, and my brother's name is {v}.", "What is my brother's name?",
     r"my brother's name is (?P<a>\w+)", NAMES),
    ("hometown", "I grew up in {v}, actually.", "Where did I grow up?",
     r"I grew up in (?P<a>\w+)", CITIES),
    ("car", "My first car was a {v}, I loved it.", "What was my first car?",
     r"My first car was a (?P<a>\w+)", ("Fiat", "Volvo", "Skoda", "Mazda", "Saab", "Renault")),
    ("degree", "I studied {v} at university.", "What did I study at university?",
     r"I studied (?P<a>\w+) at university", ("chemistry", "history", "physics", "law", "music")),
    ("dog", "My dog is called {v}.", "What is my dog called?",
     r"My dog is called (?P<a>\w+)", ("Rex", "Biscuit", "Luna", "Pepper", "Otis")),
    ("commute", "My commute takes {v} minutes each way.", "How many minutes is my commute?",
     r"My commute takes (?P<a>\d+) minutes", ("15", "25", "35", "40", "55")),
    ("instrument", "I play the {v} in a band.", "Which instrument do I play?",
     r"I play the (?P<a>\w+) in a band", ("cello", "drums", "trumpet", "bass", "piano")),
)  # fmt: skip
PREFERENCES = (
    ("seat", "I prefer {v} seats when I fly.", "What kind of seats do I prefer when flying?",
     r"I prefer (?P<a>\w+) seats", ("window", "aisle")),
    ("music", "I really like {v} music.", "What music do I like?",
     r"I really like (?P<a>\w+) music", ("jazz", "folk", "techno", "baroque")),
    ("cuisine", "My favourite cuisine is {v}.", "What is my favourite cuisine?",
     r"My favourite cuisine is (?P<a>\w+)", ("Thai", "Georgian", "Ethiopian", "Peruvian")),
    ("workout", "I like to work out in the {v}.", "When do I like to work out?",
     r"I like to work out in the (?P<a>\w+)", ("morning", "evening", "afternoon")),
    ("tea", "I always drink {v} tea.", "Which tea do I always drink?",
     r"I always drink (?P<a>\w+) tea", ("green", "mint", "black", "oolong")),
    ("holiday", "For holidays I prefer the {v}.", "What do I prefer for holidays?",
     r"For holidays I prefer the (?P<a>\w+)", ("mountains", "seaside", "countryside")),
)  # fmt: skip
TOPICS = ("astronomy", "gardening", "chess", "baking", "sailing", "origami", "birding", "poker")
BOOKS = ("Cosmos", "Dune", "Walden", "Hyperion", "Middlemarch", "Ubik", "Solaris", "Emma")
ITEMS = ("plants", "candles", "notebooks", "mugs", "posters", "scarves", "records", "lamps")
EVENTS = (
    "dentist", "museum", "jazz concert", "wedding", "marathon", "job interview", "book fair",
    "pottery class", "farmers market", "film festival", "zoo", "opera",
)  # fmt: skip
# (attribute, first statement, update, question, pattern, values): facts that change.
UPDATES = (
    ("home", "I live in {v} at the moment.", "I just moved to {v}.", "Where do I live now?",
     r"I (?:live in|just moved to) (?P<a>\w+)", CITIES),
    ("manager", "My manager is {v}.", "My new manager is {v}.", "Who is my manager now?",
     r"My (?:new )?manager is (?P<a>\w+)", NAMES),
    ("running", "I run {v} km a week.", "I now run {v} km a week.",
     "How many km a week do I run now?", r"I (?:now )?run (?P<a>\d+) km a week",
     ("10", "20", "30", "45")),
    ("phone", "My phone is a {v}.", "I switched my phone to a {v}.", "What phone do I have now?",
     r"(?:My phone is|I switched my phone to) a (?P<a>\w+)", ("Pixel", "iPhone", "Fairphone")),
)  # fmt: skip
# Filler: small talk that reuses the evidence's nouns without stating any of it.
FILLER_USER = (
    "Can you help me plan a weekend in {city}?",
    "My colleague's sister's name is {name}, she says hi.",
    "My neighbour bought {n} {item} yesterday.",
    "A friend of mine went to the {event} last year and loved it.",
    "Some people prefer {seat} seats, I hear.",
    "What is a good way to learn {topic}?",
    "My cousin lives in {city} and works in {topic}.",
    "Do you think {name} would like a book about {topic}?",
    "I was reading about {topic} this morning.",
    "Remind me what time zone {city} is in?",
    "Should I get {item} for my office?",
    "{name} said the {event} was crowded.",
)
FILLER_ASSISTANT = (
    "Sure! {city} has a lovely old town and good food.",
    "For {topic}, start with a short daily habit.",
    "That sounds nice; {item} make a room feel warmer.",
    "Many people enjoy the {event}; booking early helps.",
    "Happy to help with that.",
    "Here are three ideas about {topic} you could try.",
    "{name} sounds like a thoughtful friend.",
    "Got it. Anything else on your mind?",
)


@dataclasses.dataclass(frozen=True)
class Turn:
    """One chat turn: ``id`` is ``user/session/index``; ``time`` in seconds (its session's date
    plus a minute a turn)."""

    id: str
    session: int
    time: float
    role: str
    text: str

    def line(self) -> str:
        """The turn as a context shows it, dated."""
        return f"[{date(self.time)}] {self.role}: {self.text}"


@dataclasses.dataclass(frozen=True)
class Question:
    """A question asked at ``time`` (after the last session): its ``answer``, the ``evidence``
    turn ids (the has-answer labels; none for abstention), and the reader's template:
    ``pattern`` (group ``a`` the answer span) and ``combine`` (``latest``, ``sum``,
    ``earliest`` or ``date``)."""

    id: str
    user: str
    type: str
    text: str
    answer: str
    evidence: tuple[str, ...]
    pattern: str
    combine: str
    time: float


@dataclasses.dataclass(frozen=True)
class History:
    """One user's sessions, in time order, and the questions about them."""

    user: str
    sessions: tuple[tuple[Turn, ...], ...]
    questions: tuple[Question, ...]

    @property
    def turns(self) -> list[Turn]:
        return [turn for session in self.sessions for turn in session]


def date(time: float) -> str:
    """``time`` as "March 5, 2024" (UTC)."""
    day = datetime.datetime.fromtimestamp(time, datetime.UTC)
    return f"{day:%B} {day.day}, {day.year}"


def _filler(rng: random.Random, role: str) -> str:
    bank = FILLER_USER if role == "user" else FILLER_ASSISTANT
    return rng.choice(bank).format(
        city=rng.choice(CITIES),
        name=rng.choice(NAMES),
        n=rng.randint(2, 9),
        item=rng.choice(ITEMS),
        event=rng.choice(EVENTS),
        seat=rng.choice(("window", "aisle")),
        topic=rng.choice(TOPICS),
    )


def generate_history(
    user: str,
    *,
    sessions: int = 100,
    turns: tuple[int, int] = (6, 10),
    per_type: int = 2,
    seed: int = 0,
) -> History:
    """The history of ``user``: ``sessions`` sessions of ``turns`` (a range) turns each, user and
    assistant alternating, and ``per_type`` questions of every type in :data:`TYPES`, their
    evidence placed in user turns of randomly chosen sessions (see the module docstring)."""
    if not 1 <= per_type <= 4:
        raise ValueError(f"per_type must be in [1, 4] (the template pools' size), got {per_type}")
    if sessions < STATEMENTS * per_type:
        raise ValueError(f"{per_type} questions a type need {STATEMENTS * per_type} sessions")
    rng = random.Random(f"{seed}/{user}")
    times, now = [], START
    for _ in range(sessions):
        times.append(now)
        now += DAY * rng.randint(1, 3)
    layout = [
        [["user" if i % 2 == 0 else "assistant", None] for i in range(rng.randint(*turns))]
        for _ in range(sessions)
    ]
    free = rng.sample(range(sessions), STATEMENTS * per_type)  # one statement a session

    def place(text: str, reply: str | None = None) -> tuple[int, int]:
        """Puts ``text`` in a user turn of the next free session (the assistant's answer to it
        says ``reply``); ``(session, turn)`` of what holds the answer."""
        session = free.pop()
        index = 2 * rng.randrange(len(layout[session]) // 2)
        layout[session][index][1] = text
        if reply is None:
            return session, index
        layout[session][index + 1][1] = reply
        return session, index + 1

    def chronological() -> None:
        """The next two statements go to sessions in time order."""
        free[-2:] = sorted(free[-2:], reverse=True)

    questions = []  # (type, text, answer, evidence [(session, turn)], pattern, combine)
    for kind, pool in (
        ("single-session-user", USER_FACTS),
        ("single-session-preference", PREFERENCES),
    ):
        for _, statement, question, pattern, values in rng.sample(pool, per_type):
            value = rng.choice(values)
            questions.append((kind, question, value, [place(statement.format(v=value))], pattern))
    stated = {q[1] for q in questions}
    never = [fact for fact in USER_FACTS + PREFERENCES if fact[2] not in stated]
    for _, _, question, pattern, _ in rng.sample(never, per_type):
        questions.append(("abstention", question, UNKNOWN, [], pattern))

    for topic, book in zip(rng.sample(TOPICS, per_type), rng.sample(BOOKS, per_type)):
        evidence = place(
            f"Can you recommend a book about {topic}?",
            reply=f"I recommend '{book}', a good start on {topic}.",
        )
        questions.append(
            (
                "single-session-assistant",
                f"Which book did you recommend to me about {topic}?",
                book,
                [evidence],
                rf"I recommend '(?P<a>[^']+)', a good start on {topic}",
            )
        )

    for item in rng.sample(ITEMS, per_type):
        first, second = rng.randint(2, 9), rng.randint(2, 9)
        chronological()
        evidence = [
            place(f"I bought {first} {item} at the market today."),
            place(f"I picked up {second} more {item} this weekend."),
        ]
        questions.append(
            (
                "multi-session",
                f"How many {item} did I buy in total?",
                str(first + second),
                evidence,
                rf"\bI (?:bought|picked up) (?P<a>\d+) (?:more )?{item}\b",
                "sum",
            )
        )

    events = rng.sample(EVENTS, 3 * per_type)
    for i in range(per_type):
        *pair, single = events[3 * i : 3 * i + 3]
        evidence = [place(f"I went to the {event} today.") for event in pair]
        options = "|".join(map(re.escape, pair))
        questions.append(
            (
                "temporal-reasoning",
                f"Which did I do first, the {pair[0]} or the {pair[1]}?",
                pair[0] if evidence[0] < evidence[1] else pair[1],
                evidence,
                rf"I went to the (?P<a>{options}) today",
                "earliest",
            )
        )
        evidence = place(f"I went to the {single} today.")
        questions.append(
            (
                "temporal-reasoning",
                f"On what date did I go to the {single}?",
                date(times[evidence[0]]),
                [evidence],
                rf"I went to the (?P<a>{re.escape(single)}) today",
                "date",
            )
        )

    for _, statement, update, question, pattern, values in rng.sample(UPDATES, per_type):
        old, new = rng.sample(values, 2)
        chronological()
        place(statement.format(v=old))
        questions.append(
            ("knowledge-update", question, new, [place(update.format(v=new))], pattern)
        )

    sessions_out = []
    for s, session in enumerate(layout):
        sessions_out.append(
            tuple(
                Turn(
                    f"{user}/{s}/{i}",
                    s,
                    times[s] + 60.0 * i,
                    role,
                    text if text is not None else _filler(rng, role),
                )
                for i, (role, text) in enumerate(session)
            )
        )
    asked = now + DAY
    return History(
        user,
        tuple(sessions_out),
        tuple(
            Question(
                f"{user}/q{i}",
                user,
                kind,
                text,
                answer,
                tuple(f"{user}/{s}/{t}" for s, t in evidence),
                pattern,
                combine[0] if combine else "latest",
                asked,
            )
            for i, (kind, text, answer, evidence, pattern, *combine) in enumerate(questions)
        ),
    )


def extractive_answer(question: Question, context: Sequence[Turn]) -> str:
    """The answer the template of ``question`` reads from ``context`` (module docstring):
    ``latest``: the span of the latest matching turn; ``sum``: the total of the matched numbers;
    ``earliest``: of the two events the question names, the one matched first (both must be
    found); ``date``: the date of the latest match.  ``unknown`` when nothing matches."""
    pattern = re.compile(question.pattern)
    found = [
        (turn.time, match.group("a"))
        for turn in sorted(context, key=lambda t: t.time)
        for match in pattern.finditer(turn.text)
    ]
    if not found:
        return UNKNOWN
    if question.combine == "latest":
        return found[-1][1]
    if question.combine == "sum":
        return str(sum(int(value) for _, value in found))
    if question.combine == "date":
        return date(found[-1][0])
    if question.combine == "earliest":
        return found[0][1] if len({value for _, value in found}) == 2 else UNKNOWN
    raise ValueError(f"unknown combine rule {question.combine!r}")


def user_attribute(text: str) -> tuple[str, str] | None:
    """``(attribute, value)`` when ``text`` states one of the user's single-valued attributes
    (a fact, a preference, or one that changes: "I just moved to Porto" is ``("home",
    "Porto")``), else ``None``: what a perfect fact extractor would read from the turn."""
    for attribute, *_, pattern, _ in USER_FACTS + PREFERENCES + UPDATES:
        match = re.search(pattern, text)
        if match:
            return attribute, match.group("a")
    return None
