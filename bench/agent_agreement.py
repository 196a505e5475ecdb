"""The main job's RL model through `agentic-jax agent`, on the held-out problems its report scored.

    python -m bench.agent_agreement --run runs/quickstart [--problems 50]

Runs the configured agent session (``configs/agent_calculator.gin``, greedy, the serving engine)
on the first ``--problems`` held-out problems of the run's ``report.json`` and prints, problem by
problem where they differ, whether the agent's answer is right and whether the report's greedy
evaluation in the jitted environment solved it, then both success rates and their agreement.
"""

from __future__ import annotations

import argparse
import json
import os

import gin

import agentic_jax.registry  # noqa: F401  (every configurable, before any parsing)
from agentic_jax import config as gin_config
from agentic_jax.agents.session import AgentConfig, run_session
from agentic_jax.envs.text.rewards import answer_text
from agentic_jax.post_training.tasks import TaskSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="runs/quickstart", help="the main job's work directory")
    parser.add_argument("--problems", type=int, default=50)
    args = parser.parse_args()
    with open(os.path.join(args.run, "report.json")) as f:
        reported = json.load(f)["after_rl"]["per_task_success"][: args.problems]
    gin_config.parse([os.path.join(args.run, "rl", "config.gin")], [])
    with gin.config_scope("rl"):
        tasks = TaskSpec().tasks("heldout")[: args.problems]
    gin_config.parse(["agent_calculator"], [])
    results = run_session(
        AgentConfig(),
        [t.prompt[-1].content for t in tasks],
        checkpoint=os.path.join(args.run, "rl"),
        approver=None,
        write=lambda line: None,
    )
    agent = [
        int(r.answer is not None and answer_text(r.answer) == t.answer)
        for r, t in zip(results, tasks)
    ]
    for task, a, e in zip(tasks, agent, reported):
        if a != e:
            print(f"differs: {task.prompt[-1].content} agent {a}, environment {e}")
    same = sum(a == e for a, e in zip(agent, reported))
    print(
        f"{len(tasks)} held-out problems: agent solves {sum(agent)}, the report's greedy "
        f"evaluation {sum(reported)}; the two agree on {same}"
    )


if __name__ == "__main__":
    main()
