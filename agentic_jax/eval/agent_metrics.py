"""Agent evaluation from episode records: success and reliability, cost, latency, tool use.

An `Episode` is what one agent run on one task leaves behind, whether it came from a live run or
a trace.  It carries the task id, a hash of the task's initial state and the verifier's id:
two sets of episodes are comparable only when those match task by task (`check_comparable`),
since a change of problem, starting state or grader changes the score without the agent
changing.  Failed and errored episodes stay in the records and count as failures.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from agentic_jax.eval.metrics import pass_at_k, pass_hat_k

OK = "ok"


@dataclasses.dataclass(frozen=True)
class Episode:
    """One agent run on one task.  ``tool_calls`` are ``name(arguments JSON)`` strings (see
    `call_key`) in call order, ``tool_statuses`` their outcomes (``ok``, or why not: an error
    result, invalid arguments, an unknown tool); ``golden_calls`` the reference trajectory's
    calls; ``latencies_s`` one per model call; ``error`` is set when the run itself failed.
    A conversational task records its simulated user (``user_id``), everything it said
    (``user_turns``, the opening first) and everything the agent told it (``agent_turns``), so
    that the episode can be replayed and checked; a stateful one the hashes of the state it
    ended in and of its goal state (``final_state``, ``goal_state``).
    """

    task_id: str
    state_hash: str
    verifier_id: str
    trial: int
    seed: int
    success: bool
    reward: float = 0.0
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    wall_s: float = 0.0
    latencies_s: tuple[float, ...] = ()
    tool_calls: tuple[str, ...] = ()
    tool_statuses: tuple[str, ...] = ()
    golden_calls: tuple[str, ...] = ()
    stop_reason: str = ""
    answer: str | None = None
    error: str | None = None
    user_id: str = ""
    user_turns: tuple[str, ...] = ()
    agent_turns: tuple[str, ...] = ()
    final_state: str = ""
    goal_state: str = ""

    def __post_init__(self):
        if len(self.tool_calls) != len(self.tool_statuses):
            raise ValueError(
                f"episode {self.task_id!r}: {len(self.tool_calls)} tool calls but "
                f"{len(self.tool_statuses)} statuses"
            )
        for name in (
            "latencies_s",
            "tool_calls",
            "tool_statuses",
            "golden_calls",
            "user_turns",
            "agent_turns",
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def reached_goal(self) -> bool | None:
        """Whether a stateful task ended in its goal state (None: the task has no state)."""
        return self.final_state == self.goal_state if self.goal_state else None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, record: dict) -> Episode:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(record) - known
        if unknown:
            raise ValueError(f"unknown episode fields {sorted(unknown)}")
        return cls(**record)


def call_key(name: str, arguments) -> str:
    """A call as one comparable string: its name and its arguments as canonical JSON."""
    return f"{name}({json.dumps(arguments, sort_keys=True, ensure_ascii=False)})"


def trajectory_efficiency(steps: int, max_steps: int) -> float:
    """``max(0, 1 - steps / N_max)``: 1 for an instant answer, 0 at or past the step limit."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    return max(0.0, 1.0 - steps / max_steps)


def tool_call_precision_recall(calls: Sequence[str], golden: Sequence[str]) -> tuple[float, float]:
    """Precision and recall of the calls made against a golden trajectory's, as multisets (a
    call repeated twice matches two golden copies at most).  No calls and no golden calls is
    perfect (1, 1)."""
    made, wanted = collections.Counter(calls), collections.Counter(golden)
    hits = sum((made & wanted).values())
    precision = hits / len(calls) if calls else float(not golden)
    recall = hits / len(golden) if golden else float(not calls)
    return precision, recall


def _by_task(episodes: Sequence[Episode]) -> dict[str, list[Episode]]:
    groups: dict[str, list[Episode]] = collections.defaultdict(list)
    for e in episodes:
        groups[e.task_id].append(e)
    return dict(groups)


def reliability(episodes: Sequence[Episode], ks: Sequence[int]) -> dict[str, float]:
    """``pass@k`` (some of k trials succeed) and ``pass^k`` (all k do; Yao et al. 2024,
    tau-bench) averaged over tasks, from the trials each task has (each needs at least k)."""
    groups = _by_task(episodes)
    n = np.array([len(g) for g in groups.values()])
    c = np.array([sum(e.success for e in g) for g in groups.values()])
    out = {}
    for k in ks:
        if k > n.min():
            continue
        out[f"pass@{k}"] = float(np.mean(pass_at_k(n, c, k)))
        out[f"pass^{k}"] = float(np.mean(pass_hat_k(n, c, k)))
    return out


def seed_variance(episodes: Sequence[Episode]) -> dict[str, float]:
    """Run-to-run spread of the success rate: one run per sampling seed (the seed each trial's
    sampling used), their mean and standard deviation (ddof=1; 0 with one run)."""
    by_seed: dict[int, list[bool]] = collections.defaultdict(list)
    for e in episodes:
        by_seed[e.seed].append(e.success)
    rates = np.array([np.mean(v) for v in by_seed.values()])
    return {
        "runs": len(rates),
        "run_success_mean": float(rates.mean()),
        "run_success_std": float(rates.std(ddof=1)) if len(rates) > 1 else 0.0,
    }


def summarize(episodes: Sequence[Episode], *, max_steps: int, ks: Sequence[int] = (1,)) -> dict:
    """Every aggregate of a set of episodes: success, reliability, cost, latency percentiles,
    trajectory efficiency, tool-call precision and recall against the golden calls, the
    invalid-call rate, the recovery rate (of episodes that met a failed tool call, the
    fraction that still succeeded), and, where tasks have state, the fraction that ended in
    the goal state (``goal_state``)."""
    if not episodes:
        raise ValueError("no episodes to summarize")
    calls = [s for e in episodes for s in e.tool_statuses]
    met_error = [e for e in episodes if any(s != OK for s in e.tool_statuses)]
    pr = np.array([tool_call_precision_recall(e.tool_calls, e.golden_calls) for e in episodes])
    latencies = np.array([t for e in episodes for t in e.latencies_s])
    out = {
        "episodes": len(episodes),
        "tasks": len(_by_task(episodes)),
        "success": float(np.mean([e.success for e in episodes])),
        "errored": sum(e.error is not None for e in episodes),
        "steps": float(np.mean([e.steps for e in episodes])),
        "tokens": float(np.mean([e.tokens for e in episodes])),
        "cost": float(np.sum([e.cost for e in episodes])),
        "efficiency": float(np.mean([trajectory_efficiency(e.steps, max_steps) for e in episodes])),
        "tool_precision": float(pr[:, 0].mean()),
        "tool_recall": float(pr[:, 1].mean()),
        "invalid_call_rate": float(np.mean([s != OK for s in calls])) if calls else 0.0,
        "recovery_rate": float(np.mean([e.success for e in met_error])) if met_error else None,
        **reliability(episodes, ks),
        **seed_variance(episodes),
    }
    reached = [e.reached_goal for e in episodes if e.reached_goal is not None]
    if reached:
        out["goal_state"] = float(np.mean(reached))
    for q in (50, 90, 99):
        out[f"latency_p{q}_s"] = float(np.percentile(latencies, q)) if latencies.size else None
    return out


def check_comparable(a: Sequence[Episode], b: Sequence[Episode]) -> None:
    """Raises ``ValueError`` unless ``a`` and ``b`` cover the same tasks with the same initial
    states, verifiers and simulated users (the only condition under which their scores
    compare)."""

    def keys(episodes):
        return {e.task_id: (e.state_hash, e.verifier_id, e.user_id) for e in episodes}

    ka, kb = keys(a), keys(b)
    if set(ka) != set(kb):
        only = sorted(set(ka) ^ set(kb))[:5]
        raise ValueError(f"the runs cover different tasks (e.g. {only})")
    differ = [t for t in ka if ka[t] != kb[t]]
    if differ:
        raise ValueError(
            f"{len(differ)} tasks differ in initial state or verifier, or in their user "
            f"(e.g. {differ[:5]}): "
            "the runs are not comparable"
        )
