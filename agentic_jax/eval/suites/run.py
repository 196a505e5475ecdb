"""What ``agentic-jax eval`` runs: one suite, on a checkpoint or an endpoint, into a report."""

from __future__ import annotations

from pathlib import Path

from agentic_jax.agents.policies.http_policy import HTTPPolicy
from agentic_jax.agents.policies.jax_policy import JaxPolicy
from agentic_jax.eval.suites.report import build_result, write_report
from agentic_jax.eval.suites.suite import Suite, run_suite


def evaluate(
    out_dir: str | Path,
    *,
    checkpoint: str | None = None,
    endpoint: str | None = None,
    model: str = "default",
    api_key: str | None = None,
    policy=None,
    progress: bool = True,
) -> dict:
    """Runs the gin-configured `Suite` with a policy from ``checkpoint``, ``endpoint`` (an
    OpenAI-compatible ``.../v1`` URL) or ``policy``, exactly one; writes the report files into
    ``out_dir`` and returns the result."""
    given = [x is not None for x in (checkpoint, endpoint, policy)]
    if sum(given) != 1:
        raise ValueError("evaluate needs exactly one of checkpoint, endpoint and policy")
    if checkpoint is not None and not Path(checkpoint).exists():
        raise FileNotFoundError(f"no checkpoint at {checkpoint}")
    suite = Suite()
    if policy is None:
        policy = (
            JaxPolicy(checkpoint) if checkpoint else HTTPPolicy(endpoint, model, api_key=api_key)
        )
        evaluated = checkpoint or f"{endpoint} ({model})"
    else:
        evaluated = type(policy).__name__
    try:
        episodes = run_suite(suite, policy, out_dir, progress=progress)
    finally:
        if isinstance(policy, JaxPolicy) and checkpoint is not None:
            policy.close()
    result = build_result(suite, episodes, evaluated)
    write_report(result, out_dir)
    return result
