"""What ``agentic-jax train`` runs: the job a config binds with ``run_job.job``.

Pretraining (``training.loop.train``) unless the config names another job: the main
pipeline ``@post_training``, or one stage of it (``@train_sft``, ``@train_rl``,
``@train_preference``, ``@train_reward_model``, ``@train_rft``), or a solver and a verifier
trained together (``@train_team_rl``), or a retrieval model
(``@train_encoder``, ``@train_reranker``, ``@train_ra_rft`` after
``@measure_demonstration_utilities``), or memory's sleep-time consolidation
(``@consolidation_job``), or speculative decoding's draft heads (``@train_draft_heads``), or
post-training compression of a trained model (``@compress_model``: quantised or 2:4-pruned), or
multi-agent RL on a Markov game (``@train_marl``: IPPO, MAPPO, COMA) or league self-play on a
pgx board game (``@train_board_self_play``).
"""

from __future__ import annotations

from collections.abc import Callable

import gin

from agentic_jax.training.loop import train


@gin.configurable
def run_job(workdir: str, job: Callable[[str], dict] = train) -> dict:
    """Runs ``job(workdir)`` and returns its final metrics."""
    return job(workdir)
