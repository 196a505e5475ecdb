"""Long-horizon memory, side by side: what each memory system lets one reader answer about 100+
sessions of chat.

    python -m bench.memory --out runs/memory_bench --users 4 --sessions 120 --per_type 3

In the spirit of LongMemEval (Wu et al. 2024, arXiv:2410.10813): ``memory.longhorizon``
generates, per user, ``--sessions`` sessions of filler chat with the evidence of ``--per_type``
questions of each type placed in a few turns (single-session user, assistant and preference
facts, multi-session totals, temporal order and dates, knowledge updates, abstention).  Every
system sees the same turns in the same order, in simulated time (each store's clock is the
turn's time), and is then asked the same questions after the last session:

* ``no memory``: an empty context;
* ``full context``: the transcript's most recent turns, as many as fit the budget (what a
  context window holds without memory);
* ``vector``: every turn written by ``MemoryWriter`` (rules' importance, near-duplicates
  skipped), read by ``MemoryReader`` (the Generative Agents score, the budget);
* ``mem0``: Mem0's extract-then-decide updates (``MemoryUpdater`` with ``RuleDecider``): a turn
  stating one of the user's single-valued attributes is extracted as a triple (by the
  generator's own templates, ``longhorizon.user_attribute``: a perfect extractor, so the
  comparison isolates the decide phase; any other turn is kept as free text), so a changed
  fact UPDATEs (invalidates) the old one; read by the same ``MemoryReader``;
* ``tiered``: the vector memory plus MemGPT-style tiers (``Tiers``): after every session a
  sleep-time ``consolidate`` pass summarises cold memories (no model: the texts joined) and at
  a question the ``--hot`` most valuable memories are pinned first, the reader filling the rest.

Memories hold each turn's dated line (``[March 5, 2024] user: ...``), and every system's
context is held to the same ``--budget`` tokens (four characters a token, ``memory.read``'s
count of those lines).  The answerer is the same for all: ``longhorizon.extractive_answer``, a
deterministic reader that picks the answer span from the context by the question's template, so
differences in accuracy are differences in memory.  Reported per system and question type:
exact match and token F1 (``eval.text_metrics``), retrieval recall (the share of a question's
has-answer turns in its context; abstention has none), the 50th and 95th percentile latency of
a write (one turn; the tiered system's consolidation counts in its session's last write) and a
read (one question, retrieval only), and the store's size in bytes (the SQLite file after a
checkpoint; the transcript's bytes for full context).  ``OUT/results.json`` and
``OUT/report.md`` hold the tables (also printed); ``--plot`` (default ``docs/memory_bench.png``)
draws exact match and recall per type.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from agentic_jax.eval.text_metrics import exact_match, token_f1
from agentic_jax.memory import (
    HashingEmbedder,
    MemoryReader,
    MemoryRecord,
    MemoryStore,
    MemoryUpdater,
    MemoryWriter,
    RuleDecider,
    Tiers,
    WorkingMemory,
)
from agentic_jax.memory.consolidate import consolidate
from agentic_jax.memory.longhorizon import (
    TYPES,
    Turn,
    extractive_answer,
    generate_history,
    user_attribute,
)
from agentic_jax.memory.read import approx_tokens
from agentic_jax.memory.update import Fact
from bench.figures import save_figure

SYSTEMS = ("no memory", "full context", "vector", "mem0", "tiered")
METRICS = ("em", "f1", "recall")


class Clock:
    """Simulated time: the stores' clock, set to the turn or question at hand."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


def fit(turns, budget: int) -> list[Turn]:
    """The turns, in the order given, while their lines fit ``budget`` tokens (one that does
    not is skipped and the next tried, as ``MemoryReader`` does)."""
    kept, room = [], budget
    for turn in turns:
        cost = approx_tokens(turn.line())
        if cost <= room:
            kept.append(turn)
            room -= cost
    return kept


class NoMemory:
    def write(self, turn: Turn, user: str) -> None:
        pass

    def end_session(self, user: str) -> None:
        pass

    def read(self, question) -> list[Turn]:
        return []

    def size(self) -> int:
        return 0


class FullContext(NoMemory):
    """The transcript, cut to its most recent turns that fit."""

    def __init__(self, budget: int):
        self.budget, self.history = budget, {}

    def write(self, turn: Turn, user: str) -> None:
        self.history.setdefault(user, []).append(turn)

    def read(self, question) -> list[Turn]:
        kept, room = [], self.budget
        for turn in reversed(self.history.get(question.user, [])):
            room -= approx_tokens(turn.line())
            if room < 0:
                break
            kept.append(turn)
        return kept[::-1]

    def size(self) -> int:
        return sum(len(t.line().encode()) for turns in self.history.values() for t in turns)


class StoredMemory(NoMemory):
    """A memory store in simulated time, read by ``MemoryReader`` within the budget; each
    memory's turns are found again by its ``source`` (a summary's through its links)."""

    def __init__(self, root: str, space: str, embed, budget: int, clock: Clock):
        self.clock, self.budget, self.turns = clock, budget, {}
        self.store = MemoryStore(root, space, clock=clock)
        self.reader = MemoryReader(self.store, embed, budget=budget)

    def write(self, turn: Turn, user: str) -> None:
        self.turns[turn.id] = turn
        self.remember(turn, user)

    def remember(self, turn: Turn, user: str) -> None:
        raise NotImplementedError

    def sources(self, record: MemoryRecord) -> list[Turn]:
        if record.source == "summary":
            return [t for i in record.links for t in self.sources(self.store.get(i))]
        return [self.turns[record.source]]

    def recall(self, question, budget: int) -> list[Turn]:
        self.reader.budget = budget
        recalls = self.reader.read(question.text, user=question.user, now=question.time)
        return [t for r in recalls for t in self.sources(r.record)]

    def read(self, question) -> list[Turn]:
        return self.recall(question, self.budget)

    def size(self) -> int:
        self.store.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return self.store.path.stat().st_size


class VectorMemory(StoredMemory):
    def __init__(self, *args):
        super().__init__(*args)
        self.writer = MemoryWriter(self.store, self.reader.embed)

    def remember(self, turn: Turn, user: str) -> None:
        self.writer.write(
            MemoryRecord(
                text=turn.line(),
                user=user,
                type="episodic",
                event_time=turn.time,
                source=turn.id,
                valid_from=turn.time,
            )
        )


class Mem0Memory(StoredMemory):
    def __init__(self, *args):
        super().__init__(*args)
        # The memory's text is its turn's line (no redaction rewriting a triple's text into
        # "user home Porto"), so its relevance to a question is the vector memory's.
        writer = MemoryWriter(self.store, self.reader.embed, redact=None)
        self.updater = MemoryUpdater(
            self.store, self.reader.embed, decider=RuleDecider(), writer=writer
        )

    def remember(self, turn: Turn, user: str) -> None:
        stated = user_attribute(turn.text)
        fact = Fact(turn.line()) if stated is None else Fact(turn.line(), "user", *stated)
        self.updater.add(fact, user=user, at=turn.time, source=turn.id)


class TieredMemory(VectorMemory):
    def __init__(self, *args, hot: int):
        super().__init__(*args)
        self.tiers = Tiers(hot=hot, embed=self.reader.embed)

    def end_session(self, user: str) -> None:
        consolidate(self.store, users=[user], tiers=self.tiers)

    def read(self, question) -> list[Turn]:
        context = Pinned()
        self.tiers.promote(self.store, WorkingMemory(context, user=question.user))
        held = {r.text: r for r in self.store.records(user=question.user, valid_at=question.time)}
        hot = fit([t for text in context.pinned for t in self.sources(held[text])], self.budget)
        room = self.budget - sum(approx_tokens(t.line()) for t in hot)
        seen = {t.id for t in hot}
        return hot + [t for t in self.recall(question, room) if t.id not in seen]


class Pinned:
    """The pinned block of a context window (what ``WorkingMemory`` needs of one)."""

    def __init__(self):
        self.pinned, self.summary = [], None

    def pin(self, *facts: str) -> None:
        self.pinned += [f for f in facts if f not in self.pinned]


def build(args, clock: Clock) -> dict:
    embed = HashingEmbedder(args.dim)

    def stored(kind, space: str, **options):
        return lambda: kind(args.out, space, embed, args.budget, clock, **options)

    systems = {
        "no memory": NoMemory,
        "full context": lambda: FullContext(args.budget),
        "vector": stored(VectorMemory, "vector"),
        "mem0": stored(Mem0Memory, "mem0"),
        "tiered": stored(TieredMemory, "tiered", hot=args.hot),
    }
    for space in ("vector", "mem0", "tiered"):  # a fresh run: the stores start empty
        for suffix in ("", "-wal", "-shm"):
            path = os.path.join(args.out, f"{space}.db{suffix}")
            if os.path.exists(path):
                os.remove(path)
    return {name: systems[name]() for name in args.systems}


def percentiles(seconds: list[float]) -> dict:
    return {f"p{q}": float(np.percentile(seconds, q)) * 1e3 for q in (50, 95)} if seconds else {}


def run(args) -> dict:
    os.makedirs(args.out, exist_ok=True)
    clock = Clock()
    systems = build(args, clock)
    writes = {name: [] for name in systems}
    reads = {name: [] for name in systems}
    scores = {name: {t: [] for t in TYPES} for name in systems}
    tokens = {name: [] for name in systems}
    questions = 0
    for u in range(args.users):
        history = generate_history(
            f"user{u}",
            sessions=args.sessions,
            turns=tuple(args.turns),
            per_type=args.per_type,
            seed=args.seed,
        )
        for session in history.sessions:
            for turn in session:
                clock.now = turn.time
                for name, system in systems.items():  # interleaved: shared load falls on all
                    start = time.perf_counter()
                    system.write(turn, history.user)
                    if turn is session[-1]:
                        system.end_session(history.user)
                    writes[name].append(time.perf_counter() - start)
        for question in history.questions:
            questions += 1
            clock.now = question.time
            for name, system in systems.items():
                start = time.perf_counter()
                context = system.read(question)
                reads[name].append(time.perf_counter() - start)
                tokens[name].append(sum(approx_tokens(t.line()) for t in context))
                answer = extractive_answer(question, context)
                ids = {t.id for t in context}
                found = [e in ids for e in question.evidence]
                scores[name][question.type].append(
                    (
                        exact_match(answer, question.answer),
                        token_f1(answer, question.answer),
                        float(np.mean(found)) if found else None,
                    )
                )
    table = {}
    for name, system in systems.items():
        row = {}
        for kind in (*TYPES, "all"):
            got = (
                [g for k in TYPES for g in scores[name][k]] if kind == "all" else scores[name][kind]
            )
            recalls = [r for *_, r in got if r is not None]
            row[kind] = {
                "em": float(np.mean([g[0] for g in got])),
                "f1": float(np.mean([g[1] for g in got])),
                "recall": float(np.mean(recalls)) if recalls else None,
            }
        row["write ms"], row["read ms"] = percentiles(writes[name]), percentiles(reads[name])
        row["store bytes"] = system.size()
        row["context tokens"] = {"mean": float(np.mean(tokens[name])), "max": max(tokens[name])}
        table[name] = row
    setup = {
        "users": args.users,
        "sessions per user": args.sessions,
        "turns": sum(len(w) for w in writes.values()) // max(len(systems), 1),
        "questions": questions,
        "per type per user": args.per_type,
        "budget tokens": args.budget,
        "embedding": f"HashingEmbedder({args.dim})",
        "seed": args.seed,
    }
    return {"setup": setup, "table": table}


def report(results: dict) -> str:
    setup, table = results["setup"], results["table"]
    short = {t: t.replace("single-session-", "ss-").replace("-reasoning", "") for t in TYPES}
    lines = [
        f"{setup['users']} users × {setup['sessions per user']} sessions ({setup['turns']} "
        f"turns), {setup['questions']} questions ({setup['per type per user']} per type per "
        f"user); every context within {setup['budget tokens']} tokens; {setup['embedding']}; "
        "the same extractive reader for every system.",
        "",
        "Exact match / token F1:",
        "",
        "| system | " + " | ".join(short[t] for t in TYPES) + " | all |",
        "|---|" + "---:|" * (len(TYPES) + 1),
    ]
    for name, row in table.items():
        cells = [f"{row[t]['em']:.2f} / {row[t]['f1']:.2f}" for t in (*TYPES, "all")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    typed = [t for t in TYPES if t != "abstention"]
    lines += [
        "",
        "Retrieval recall (has-answer turns in the context), latency, size:",
        "",
        "| system | " + " | ".join(short[t] for t in typed) + " | all | write p50 / p95 ms "
        "| read p50 / p95 ms | store bytes | context tokens (mean / max) |",
        "|---|" + "---:|" * (len(typed) + 5),
    ]
    for name, row in table.items():
        cells = [f"{row[t]['recall']:.2f}" for t in (*typed, "all")]
        w, r = row["write ms"], row["read ms"]
        cells += [
            f"{w['p50']:.2f} / {w['p95']:.2f}",
            f"{r['p50']:.2f} / {r['p95']:.2f}",
            f"{row['store bytes']:,}",
            f"{row['context tokens']['mean']:.0f} / {row['context tokens']['max']}",
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(table: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    width = 0.8 / len(table)
    for ax, metric, kinds in (
        (axes[0], "em", (*TYPES, "all")),
        (axes[1], "recall", (*(t for t in TYPES if t != "abstention"), "all")),
    ):
        for i, row in enumerate(table.values()):
            ax.bar(np.arange(len(kinds)) + i * width, [row[k][metric] for k in kinds], width)
        ax.set_xticks(np.arange(len(kinds)) + 0.4 - width / 2)
        ax.set_xticklabels([k.replace("single-session-", "ss-") for k in kinds], rotation=30)
        ax.set_ylabel("exact match" if metric == "em" else "retrieval recall")
        ax.set_ylim(0, 1.05)
    axes[0].legend(list(table), fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the stores and the results")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=120, help="per user")
    parser.add_argument("--turns", type=int, nargs=2, default=(6, 10), help="a session's range")
    parser.add_argument("--per_type", type=int, default=3, help="questions per type per user")
    parser.add_argument("--budget", type=int, default=512, help="every context's tokens")
    parser.add_argument("--dim", type=int, default=512, help="the hashing embedding's width")
    parser.add_argument("--hot", type=int, default=4, help="the tiered system's pinned memories")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="docs/memory_bench.png")
    args = parser.parse_args(argv)
    results = run(args)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    text = report(results)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text + "\n")
    plot(results["table"], args.plot)
    print(text)
    return results


if __name__ == "__main__":
    main()
