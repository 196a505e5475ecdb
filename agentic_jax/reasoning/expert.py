"""Expert iteration: a search over agent turns is the expert whose solutions the policy learns.

Anthony et al. 2017 (ExIt, arXiv:1705.08439) and the STaR/ReST family: a search that spends more
compute than one sample (MCTS, beam search over turns) finds better episodes than the policy
alone; the verified ones are fine-tuned on, and the improved policy makes the next search better.
:class:`SearchSampler` is that expert behind rejection-sampling fine-tuning's sampler hook
(``train_rft.sampler``, ``configs/expert_iteration.gin``): each problem's episode is the best
state its search found, laid out as rollout rows (transcript, the policy's loss mask, reward,
success), and what it cost is the search's own count of sampled sequences and tokens.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import NamedTuple

import gin
import jax
import numpy as np

from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.search import Scorer, policy_rows
from agentic_jax.reasoning.step_tree import tree_search
from agentic_jax.reasoning.turns import TurnModel, episode_return


class SearchEpisodes(NamedTuple):
    """Each search's chosen episode as a rollout row (the fields a fine-tuning round reads)."""

    tokens: np.ndarray  # int32 [B, L]: prompt, the policy's turns and tool messages; PAD after
    loss_mask: np.ndarray  # int32 [B, L]: 1 on the policy's tokens
    length: np.ndarray  # int32 [B]
    reward: np.ndarray  # float32 [B]: the environment's return
    success: np.ndarray  # bool [B]: the episode finished with reward >= the success threshold
    sample_counts: dict  # episodes returned, and what the searches sampled: turns and tokens
    generation_seconds: float


@gin.configurable(module="reasoning")
@dataclasses.dataclass
class SearchSampler:
    """``search`` (a function with ``step_beam_search``'s signature; default MCTS) valued by
    ``score`` (default the verifier's return: Monte Carlo search paid at finished episodes),
    run on a :class:`TurnModel` over the problems' host environment."""

    search: Callable = tree_search
    score: Scorer = episode_return
    success_threshold: float = 0.5

    def __call__(self, params, config, tokenizer, tasks, prompts, group_size: int, key):
        """``group_size`` searches (keys differ) for each of ``prompts`` (rows of ``tasks``'
        training problems; ``tasks`` is the run's ``TaskSpec``)."""
        started = time.monotonic()
        env = tasks.host_env(tokenizer, "train")
        model = TurnModel(params, config, tokenizer, env=env)
        rows = np.repeat(np.asarray(prompts, np.int32), group_size)
        budget = Budget()
        chosen = []
        for i, start in enumerate(model.roots(rows)):
            search_key = jax.random.fold_in(key, i)
            chosen.append(self.search(model, start, self.score, key=search_key, budget=budget).best)
        tokens, loss_mask = policy_rows(chosen, env.pad_id, env.max_length)
        reward = np.array([s.reward for s in chosen], np.float32)
        return SearchEpisodes(
            tokens,
            loss_mask,
            np.array([len(s.tokens) for s in chosen], np.int32),
            reward,
            np.array([s.done for s in chosen]) & (reward >= self.success_threshold),
            {
                "episodes": len(rows),
                "sampled_turns": budget.calls_spent,
                "generated_tokens": budget.tokens_spent,
            },
            time.monotonic() - started,
        )
