"""Golden-trajectory regression: does a new run still solve the task the way a recorded one did?

Final answers hide regressions: a model that now takes a detour (an extra search, tools in another
order) often still answers correctly, at more cost and risk.  Comparing the *trajectory*, the
sequence of tool calls, against a recorded golden run catches that.  Similarity is
``difflib.SequenceMatcher``'s ratio over the tool sequence (``2 M / T``: 1 for identical order,
lower for insertions, deletions and reorderings); token overhead is the new run's tokens
relative to the golden run's.  Both traces are ordinary JSONL traces (``tracing.py``); of a
file holding several runs, the last one is compared unless another is named.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Iterable, Sequence

from agentic_jax.agents.context.tracing import Event, run_events


@dataclasses.dataclass(frozen=True)
class Trajectory:
    tools: tuple[str, ...]  # tool names (with canonical arguments if compared with arguments)
    tokens: int
    answer: str | None
    stop_reason: str | None

    @classmethod
    def from_events(
        cls, events: Iterable[Event], *, run: str | None = None, with_arguments: bool = False
    ) -> Trajectory:
        """The trajectory of the run with id ``run``, by default of the last run in ``events``
        (runs merged would compare as one long run)."""
        tools, tokens, answer, stop = [], 0, None, None
        for e in run_events(events, run):
            if e["kind"] == "tool_call":
                key = e["name"]
                if with_arguments:
                    key += json.dumps(e["arguments"], sort_keys=True)
                tools.append(key)
            elif e["kind"] == "model_call":
                tokens += e["prompt_tokens"] + e["completion_tokens"]
            elif e["kind"] == "run_end":
                answer, stop = e.get("answer"), e.get("stop_reason")
        return cls(tuple(tools), tokens, answer, stop)


@dataclasses.dataclass(frozen=True)
class Comparison:
    similarity: float
    token_overhead: float  # new tokens / golden tokens - 1
    passed: bool
    problems: tuple[str, ...]

    def report(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        lines = [
            f"{verdict}: tool-sequence similarity {self.similarity:.3f}, token overhead "
            f"{self.token_overhead:+.1%}"
        ]
        return "\n".join(lines + [f"  - {p}" for p in self.problems])


def compare(
    golden: Trajectory,
    new: Trajectory,
    *,
    min_similarity: float = 0.9,
    max_token_overhead: float = 0.25,
) -> Comparison:
    """Compares ``new`` with ``golden``; fails below ``min_similarity`` or above
    ``max_token_overhead``, or if the run stopped for another reason."""
    similarity = difflib.SequenceMatcher(None, golden.tools, new.tools, autojunk=False).ratio()
    # A golden run of no (counted) tokens: any token at all is unbounded overhead.
    overhead = (
        new.tokens / golden.tokens - 1 if golden.tokens else (math.inf if new.tokens else 0.0)
    )
    problems = []
    if golden.tools != new.tools:
        if sorted(golden.tools) == sorted(new.tools):
            problems.append(f"tool order changed: {list(golden.tools)} -> {list(new.tools)}")
        else:
            problems.append(f"tool sequence changed: {list(golden.tools)} -> {list(new.tools)}")
    if overhead > max_token_overhead:
        problems.append(f"token overhead {overhead:+.1%} exceeds {max_token_overhead:+.1%}")
    if golden.stop_reason != new.stop_reason:
        problems.append(f"stop reason changed: {golden.stop_reason} -> {new.stop_reason}")
    passed = (
        similarity >= min_similarity
        and overhead <= max_token_overhead
        and golden.stop_reason == new.stop_reason
    )
    return Comparison(similarity, overhead, passed, tuple(problems))


def compare_events(
    golden: Sequence[Event],
    new: Sequence[Event],
    *,
    with_arguments: bool = False,
    golden_run: str | None = None,
    new_run: str | None = None,
    **thresholds,
) -> Comparison:
    """:func:`compare` on two traces' runs (each trace's last run unless one is named)."""
    return compare(
        Trajectory.from_events(golden, run=golden_run, with_arguments=with_arguments),
        Trajectory.from_events(new, run=new_run, with_arguments=with_arguments),
        **thresholds,
    )
