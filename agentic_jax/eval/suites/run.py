"""What ``agentic-jax eval`` runs: one suite, on a checkpoint or an endpoint, into a report.

``configs/eval_<name>.gin`` binds the suite (``evaluate.suite``; the agent `Suite` when unbound)
and, optionally, the test-time compute the evaluated policy spends (``open_policy.search``,
``open_policy.vote``), so a search method is evaluated on the same suite, tasks, seeds and
report as the plain policy it is compared with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import gin

from agentic_jax.agents.policies.base import Policy
from agentic_jax.agents.policies.http_policy import HTTPPolicy
from agentic_jax.agents.policies.jax_policy import JaxPolicy
from agentic_jax.eval.suites.arena_suite import ArenaSuite
from agentic_jax.eval.suites.episodes import describe
from agentic_jax.eval.suites.report import build_result, write_report
from agentic_jax.eval.suites.suite import Suite, run_suite
from agentic_jax.eval.suites.training_data import TrainingData
from agentic_jax.post_training.reward import load_reward_model
from agentic_jax.reasoning import token_scorer
from agentic_jax.reasoning.search import Scorer


@gin.configurable(module="eval", allowlist=["search", "vote"])
def open_policy(
    checkpoint: str | None = None,
    endpoint: str | None = None,
    *,
    model: str = "default",
    api_key: str | None = None,
    search: Callable[[str], Policy] | None = None,
    vote: Callable[[Policy], Policy] | None = None,
) -> Policy:
    """The evaluated policy: ``checkpoint`` served in-process (`JaxPolicy`) or ``endpoint`` (an
    OpenAI-compatible ``.../v1`` URL, `HTTPPolicy`), exactly one.

    ``search`` builds a policy from the checkpoint path whose every turn is a test-time search
    (``@agents.SearchPolicy``, its search and scorer bound in gin: step beam, DVTS, ToT, MCTS);
    it samples steps itself, so it needs a checkpoint.  ``vote`` wraps the policy
    (``@agents.VotingPolicy``: self-consistency over sampled turns).
    """
    if (checkpoint is None) == (endpoint is None):
        raise ValueError("open_policy needs exactly one of checkpoint and endpoint")
    if checkpoint is not None and not Path(checkpoint).exists():
        raise FileNotFoundError(f"no checkpoint at {checkpoint}")
    if search is not None:
        if checkpoint is None:
            raise ValueError(
                "open_policy.search samples the model's steps itself: give a checkpoint"
            )
        policy = search(checkpoint)
    elif checkpoint is not None:
        policy = JaxPolicy(checkpoint)
    else:
        policy = HTTPPolicy(endpoint, model, api_key=api_key)
    return vote(policy) if vote is not None else policy


@gin.configurable(module="eval")
def reward_model_scorer(run_dir: str = gin.REQUIRED, aggregation: str = "min") -> Scorer:
    """A trained reward model (``train_reward_model``'s run directory) as the scorer of a
    search's states: an outcome model's score, or a process model's step probabilities
    aggregated by ``aggregation`` (min, product, last or mean)."""
    rm = load_reward_model(run_dir)
    return token_scorer(
        lambda tokens, mask: rm.episode_rewards(tokens, mask, aggregation=aggregation),
        pad_id=rm.tokenizer.pad_id or 0,
    )


def _setting(value) -> str:
    if isinstance(value, functools.partial):
        keywords = ", ".join(f"{k}={_setting(v)}" for k, v in value.keywords.items())
        return f"{_setting(value.func)}({keywords})"
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    return repr(describe(value))


def policy_name(policy: Policy, source: str) -> str:
    """``source``, and for a policy with test-time compute its class and settings (functions
    by name; gin's bindings of them are in the operative config beside the report)."""
    if isinstance(policy, JaxPolicy | HTTPPolicy):
        return source
    inner = getattr(policy, "policy", None)
    settings = ", ".join(
        f"{k}={_setting(v)}"
        for k, v in vars(policy).items()
        if k not in ("policy", "model") and not k.startswith("_")
    )
    base = policy_name(inner, source) if inner is not None else source
    return f"{type(policy).__name__}({settings}) over {base}"


def close(policy: Policy) -> None:
    closer = getattr(policy, "close", None)
    if closer is not None:
        closer()


def _listed(value: str | Sequence[str] | None) -> list[str]:
    """A flag given once (a string) or repeatedly (argparse's list) as a list."""
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def _single(value: str | Sequence[str] | None, flag: str) -> str | None:
    listed = _listed(value)
    if len(listed) > 1:
        raise ValueError(
            f"this suite evaluates one policy: give {flag} once (the arena takes more)"
        )
    return listed[0] if listed else None


def open_contestants(
    checkpoints: Sequence[str],
    endpoints: Sequence[str],
    models: str | Sequence[str] = "default",
    api_key: str | None = None,
) -> dict[str, Policy]:
    """The arena's contestants: every checkpoint and endpoint opened by `open_policy` and named
    as `evaluate` names one policy.  ``models``: one model name for every endpoint, or one per
    endpoint.  Mismatched counts and repeated contestants fail before anything is opened."""
    models = _listed(models)
    models = models * len(endpoints) if len(models) == 1 else models
    if len(models) != len(endpoints):
        raise ValueError(
            f"give --model once for every endpoint or once per endpoint: got {len(models)} "
            f"models for {len(endpoints)} endpoints"
        )
    sources = [(c, None, "default", c) for c in checkpoints]
    sources += [(None, e, m, f"{e} ({m})") for e, m in zip(endpoints, models)]
    labels = [label for *_, label in sources]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"contestants given more than once: {repeated}")
    opened: dict[str, Policy] = {}
    try:
        for checkpoint, endpoint, model, label in sources:
            policy = open_policy(checkpoint, endpoint, model=model, api_key=api_key)
            opened[policy_name(policy, label)] = policy
    except BaseException:
        for policy in opened.values():
            close(policy)
        raise
    return opened


def _arena(suite: ArenaSuite, out_dir, checkpoint, endpoint, model, api_key, policy, progress):
    sources = _listed(checkpoint), _listed(endpoint)
    if (policy is None) == (not any(sources)):
        raise ValueError(
            "the arena needs its contestants: checkpoints and endpoints, or policy (a mapping "
            "of names to policies), not both"
        )
    if policy is not None:
        if not isinstance(policy, Mapping):
            raise ValueError("the arena takes policy as a mapping of names to policies")
        return suite.evaluate(policy, out_dir, progress=progress)
    opened = open_contestants(*sources, model, api_key)
    try:
        return suite.evaluate(opened, out_dir, progress=progress)
    finally:
        for contestant in opened.values():
            close(contestant)


@gin.configurable(module="eval", allowlist=["suite"])
def evaluate(
    out_dir: str | Path,
    *,
    checkpoint: str | Sequence[str] | None = None,
    endpoint: str | Sequence[str] | None = None,
    model: str | Sequence[str] = "default",
    api_key: str | None = None,
    policy: Policy | Mapping[str, Policy] | None = None,
    suite=None,
    progress: bool = True,
) -> dict:
    """Runs ``suite`` with the policy of ``checkpoint`` or ``endpoint`` (see `open_policy`), or
    with ``policy``; writes the report files into ``out_dir`` and returns the result.

    ``suite`` is the gin-configured agent `Suite` when unbound; any other suite object has
    ``evaluate(policy, out_dir, *, evaluated, progress) -> dict`` and writes its own report
    (``results.json`` and ``report.md`` at least).  The arena (`ArenaSuite`) plays several
    policies: ``checkpoint`` and ``endpoint`` are then lists (see `open_contestants`), or
    ``policy`` a mapping of names to policies.
    """
    suite = Suite() if suite is None else suite
    if isinstance(suite, ArenaSuite):
        return _arena(suite, out_dir, checkpoint, endpoint, model, api_key, policy, progress)
    checkpoint, endpoint = _single(checkpoint, "--checkpoint"), _single(endpoint, "--endpoint")
    model = _single(model, "--model")
    if sum(x is not None for x in (checkpoint, endpoint, policy)) != 1:
        raise ValueError("evaluate needs exactly one of checkpoint, endpoint and policy")
    if policy is None:
        opened = open_policy(checkpoint, endpoint, model=model, api_key=api_key)
        evaluated = policy_name(opened, checkpoint or f"{endpoint} ({model})")
    else:
        opened, evaluated = policy, type(policy).__name__
    try:
        if not isinstance(suite, Suite):  # a suite with its own report (judge, market)
            return suite.evaluate(opened, out_dir, evaluated=evaluated, progress=progress)
        episodes = run_suite(suite, opened, out_dir, progress=progress)
    finally:
        if policy is None:
            close(opened)
    # The training data is gin-configured (configs/training_data.gin); its index is built once.
    result = build_result(suite, episodes, evaluated, TrainingData())
    write_report(result, out_dir)
    return result
