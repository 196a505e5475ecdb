"""What each demonstration is worth to the policy: the utilities that reasoning-aware retrieval
fine-tuning (``retrieval.distillation``, RA-RFT) distils into the retriever.

For each query problem and each of its candidate demonstrations (solved problems of a pool, with
their worked conversations: tool calls, tool results, the answer), the policy plays the problem
with the demonstration shown as earlier turns of the conversation (few-shot in chat form), and
the demonstration's utility is the policy's success rate: greedy (0 or 1) or over ``samples``
episodes at ``temperature`` (``evaluate.evaluate_policy``).  A demonstration of the query's own
problem would hand over the answer, so it is never a candidate.  The records (the query's and
each demonstration's text, as the retriever reads them, with the utilities) are written as JSON
Lines by ``retrieval.distillation.write_utilities`` and read by ``train_ra_rft``.

This is the one place ``post_training`` imports ``retrieval``: the policy lives here and the
retriever may not import it, so the measurement sits above the retriever and shares its record
format instead of agreeing on one by hand (``retrieval`` imports nothing of ``post_training``; the
layering stays acyclic).  ``measure_demonstration_utilities`` is the gin job
(``configs/retrieval_ra_rft_utilities.gin``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import gin
import jax
import numpy as np

from agentic_jax import config as gin_config
from agentic_jax.envs.text import TextEnv
from agentic_jax.envs.text.tasks import Task
from agentic_jax.models import TransformerConfig
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.evaluate import evaluate_policy
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.retrieval.distillation import UtilityRecord, write_utilities

UTILITIES = "utilities.jsonl"


def question(task: Task) -> str:
    """The problem as the retriever's query: the prompt's last user message."""
    return next(m.content for m in reversed(task.prompt) if m.role == "user")


def task_id(task: Task) -> str:
    return f"{task.family}/{task.seed}"


def demonstration_text(task: Task) -> str:
    """The demonstration as the retriever reads it: the problem, then each turn of its worked
    solution (a tool call as ``name(arguments)``, a tool result, the final answer), a line each."""
    lines = [question(task)]
    for message in task.demonstration:
        lines += [
            f"{c.name}({', '.join(map(str, c.arguments.values()))})" for c in message.tool_calls
        ]
        if message.content:
            lines.append(message.content)
    return "\n".join(lines)


def with_demonstration(task: Task, demonstration: Task) -> Task:
    """``task`` with ``demonstration``'s problem and solution as earlier turns of its prompt,
    after the system message (which keeps the tools' section)."""
    system = tuple(m for m in task.prompt if m.role == "system")
    shown = tuple(m for m in demonstration.conversation() if m.role != "system")
    rest = tuple(m for m in task.prompt if m.role != "system")
    return dataclasses.replace(task, prompt=system + shown + rest)


def demonstration_utilities(
    params,
    config: TransformerConfig,
    env: TextEnv,
    queries: Sequence[Task],
    pool: Sequence[Task],
    *,
    candidates: int | None = None,
    samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    batch_rows: int = 64,
    backend="generate",
) -> list[UtilityRecord]:
    """One record per query: ``candidates`` demonstrations of ``pool`` drawn without replacement
    (all of them when None), never one of the query's own problem, each with the policy's success
    rate on the query with it in context (module docstring).

    ``env`` supplies the tools, verifier and sizes (``TaskSpec.env``); the problems it plays are
    the queries with their demonstrations, in a bank of its own, so ``env.max_length`` must hold
    the longer prompts.  ``backend`` is ``rollout.collect``'s decoder (a callable in tests)."""
    rng = np.random.default_rng(seed)
    chosen = []
    for query in queries:
        allowed = [j for j, d in enumerate(pool) if question(d) != question(query)]
        if candidates is not None and candidates < len(allowed):
            allowed = sorted(rng.choice(allowed, candidates, replace=False).tolist())
        chosen.append(allowed)
    tasks = [with_demonstration(q, pool[j]) for q, js in zip(queries, chosen) for j in js]
    result = evaluate_policy(
        params,
        config,
        env,
        env.make_params(env.build_bank(tasks)),
        samples=samples,
        temperature=temperature,
        key=jax.random.key(seed),
        batch_rows=batch_rows,
        backend=backend,
    )
    rate = result.success if samples == 0 else result.sampled_correct / samples
    records, start = [], 0
    for query, js in zip(queries, chosen):
        records.append(
            UtilityRecord(
                question(query),
                tuple(demonstration_text(pool[j]) for j in js),
                tuple(float(u) for u in rate[start : start + len(js)]),
                task_id(query),
                tuple(task_id(pool[j]) for j in js),
            )
        )
        start += len(js)
    return records


@gin.configurable
def measure_demonstration_utilities(
    workdir: str,
    *,
    init_from: str,
    tasks: TaskSpec = TaskSpec(),
    pool: TaskSpec = TaskSpec(first_seed=500_000),
    candidates: int | None = 8,
    samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    batch_rows: int = 64,
) -> dict:
    """The job: the policy of run ``init_from`` plays the training problems of ``tasks`` with
    ``candidates`` demonstrations each from the training problems of ``pool`` (give the two
    different seeds), and ``workdir/utilities.jsonl`` receives the records
    (:func:`demonstration_utilities`).  Returns ``queries``, ``episodes``, the ``mean_utility``
    and how many queries are ``informative`` (their candidates differ in utility: the ones RA-RFT
    learns from)."""
    config, params, tokenizer = load_checkpoint(init_from)
    records = demonstration_utilities(
        params,
        config,
        tasks.env(tokenizer),
        tasks.tasks("train"),
        pool.tasks("train"),
        candidates=candidates,
        samples=samples,
        temperature=temperature,
        seed=seed,
        batch_rows=batch_rows,
    )
    os.makedirs(workdir, exist_ok=True)
    write_utilities(os.path.join(workdir, UTILITIES), records)
    gin_config.save_config(workdir, operative=True)
    utilities = [u for r in records for u in r.utility]
    return {
        "queries": len(records),
        "episodes": len(utilities) * max(samples, 1),
        "mean_utility": float(np.mean(utilities)),
        "informative": sum(r.informative for r in records),
    }
