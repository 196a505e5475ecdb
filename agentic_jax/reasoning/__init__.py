"""Test-time compute: sampling many solutions and selecting one, and search over steps.

A transcript is a :class:`State`; :class:`StepModel` samples the next steps of many states in
one decoder call; a :class:`Budget` counts sampled sequences and tokens for every method alike::

    model = StepModel(params, config, tokenizer, delimiters=("\\n",))
    samples = model.complete([root(prompt)] * 8, key=key, budget=Budget(tokens=2048))
    answer = majority_vote([model.answer(s) for s in samples])          # self-consistency
    chosen = samples[best_of_n(orm_scores)]                              # best-of-N by a scorer
    prm = token_scorer(reward_model.scores)                              # a PRM, step by step
    chosen = samples[best_of_n(rl.aggregate_steps(*step_scores(prm, samples), mode="min"))]
    result = step_beam_search(model, prompt, prm, key=key, width=4, expansions=4)
    result = step_beam_search(model, prompt, prm, key=key, subtrees=4, width=1)  # DVTS
    result = depth_first_search(model, prompt, prm, key=key, threshold=0.5)  # ToT, DFS
    votes = vote_scorer(model, render_choices, key=key, votes=5)        # ToT's vote evaluator
    tree = StepTree(model, k=4, reward=verifier, value=prm, max_steps=8)  # LM as dynamics
    out = mcts.search(None, key, tree.root_output([prompt]), tree.recurrent_fn,
                      num_simulations=64, max_depth=8)                   # mctx PUCT or Gumbel
    kept = mcts.reuse_subtree(out.search_tree, out.action)               # after the move
    out = mcts.continue_search(None, key, kept, tree.recurrent_fn, num_simulations=64)
    result = tree_search(model, prompt, prm, key=key, k=4, simulations=64)  # MCTS, one call
    result = tree_search(model, prompt, prm, key=key, reward=verifier,
                         reflect=reflector(model, render_failure))                # LATS
    traces = budget_forcing(model, prompts, key=key, min_tokens=64, max_tokens=256)  # s1
    turns = TurnModel(params, config, tokenizer, env=host_env)     # a step = an agent turn
    result = step_beam_search(turns, turns.roots([task])[0], episode_return, key=key)
"""

from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.expert import SearchEpisodes, SearchSampler
from agentic_jax.reasoning.forcing import budget_forcing
from agentic_jax.reasoning.reflection import reflector
from agentic_jax.reasoning.search import (
    SearchResult,
    rollout_scorer,
    step_beam_search,
    step_scores,
    token_scorer,
)
from agentic_jax.reasoning.selection import best_of_n, maj_at_k, majority_vote
from agentic_jax.reasoning.step_tree import StepTree, tree_search
from agentic_jax.reasoning.steps import State, StepModel, root
from agentic_jax.reasoning.thoughts import (
    depth_first_search,
    self_evaluation_scorer,
    vote_scorer,
)
from agentic_jax.reasoning.turns import TurnModel, episode_return

__all__ = [
    "Budget",
    "SearchEpisodes",
    "SearchResult",
    "SearchSampler",
    "State",
    "StepModel",
    "StepTree",
    "TurnModel",
    "best_of_n",
    "budget_forcing",
    "depth_first_search",
    "episode_return",
    "maj_at_k",
    "majority_vote",
    "reflector",
    "rollout_scorer",
    "root",
    "self_evaluation_scorer",
    "step_beam_search",
    "step_scores",
    "token_scorer",
    "tree_search",
    "vote_scorer",
]
