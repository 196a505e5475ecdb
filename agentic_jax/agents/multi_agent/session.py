"""Team runs configured from gin: what ``agentic-jax team`` runs.

A config binds ``multi_agent.TeamConfig.team`` to a gin-built pattern (any of the patterns in
this package, with its members, their policies and the limits) and optionally a default task;
see ``configs/research_scripted.gin``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import gin

from agentic_jax.agents.context.tracing import Tracer, console_sink
from agentic_jax.agents.multi_agent.team import Pattern, TeamResult


@gin.configurable(module="multi_agent")
@dataclasses.dataclass
class TeamConfig:
    team: Pattern | None = None
    task: str | None = None


def summary(result: TeamResult) -> list[str]:
    """Per-agent and message counts, as lines of text."""
    acts: dict[str, int] = {}
    for m in result.messages:
        acts[m.act] = acts.get(m.act, 0) + 1
    lines = [
        f"messages: {len(result.messages)} ("
        + ", ".join(f"{n} {act}" for act, n in acts.items())
        + f"), {result.rounds} rounds"
    ]
    for name, s in result.agents.items():
        lines.append(
            f"  {name}: turns {s.turns}, model calls {s.model_calls}, "
            f"tokens {s.usage.total_tokens}, sent {s.sent}, received {s.received}"
            + (f", failed: {s.failure.reason.value}" if s.failure else "")
        )
    return lines


def run_team(
    config: TeamConfig,
    task: str | None = None,
    *,
    trace_path: str | None = None,
    write: Callable[[str], Any] = print,
) -> TeamResult:
    """Runs the configured team on ``task`` (default: the config's), streaming its events to
    ``write`` and appending them to ``trace_path``."""
    if config.team is None:
        raise ValueError("no team: bind multi_agent.TeamConfig.team in the gin config")
    task = task if task is not None else config.task
    if task is None:
        raise ValueError("no task: pass --task or bind multi_agent.TeamConfig.task")
    tracer = Tracer(trace_path, sinks=[console_sink(write)], pricing=config.team.pricing)
    result = config.team.run(task, tracer=tracer)
    for line in summary(result):
        write(line)
    return result
