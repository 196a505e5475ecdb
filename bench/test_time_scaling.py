"""Test-time compute on a trained model: held-out success against tokens and FLOPs, per method.

    python -m bench.test_time_scaling --model runs/quickstart/sft \
        --reward_model runs/agentic_rl_study/process_reward_model --out runs/test_time_scaling

Every method solves the same held-out problems of the main job's RL slice (``rl/TaskSpec`` of
``configs/post_training_tasks.gin``: calculator chains) with the same model, each step one agent
turn with the calculator executed (``reasoning.TurnModel``), at compute levels ``N`` (``--levels``):

* ``greedy`` (N = 1 only);
* ``self-consistency``: the majority ``<answer>`` of N samples (maj@N);
* ``BoN-ORM``: the sample the reward model scores highest at its final turn (its outcome score);
* ``BoN-PRM``: the sample whose turns' step probabilities have the highest minimum;
* ``BoN-oracle``: any of N samples right, the verifier choosing (pass@N, an upper bound);
* ``beam``: step beam search over turns, width N/2 with 2 expansions each, PRM-valued;
* ``DVTS``: N/2 subtrees, each grown greedily by the PRM (2 expansions per step);
* ``ToT-DFS``: depth-first Tree-of-Thoughts, 2 thoughts per expansion, those the PRM scores below
  ``--tot_threshold`` pruned, at most N x (the turn limit) expansions;
* ``MCTS``: ``reasoning.tree_search`` (PUCT), 2 sampled turns per node, 2N simulations, the
  reward model as value and as the finished solutions' reward.

The sampling methods draw one pool of ``max(levels)`` samples per problem; at level N each selects
from every disjoint group of N samples of the pool, and the groups' success is averaged.
Success is the verifier's on the chosen episode.  Compute is counted the same way for every
method: tokens the policy generated, and FLOPs = the policy's forward ``flops_per_token`` times
every token it processed (each distinct prompt of a batched call prefilled once, and the generated
tokens) plus the reward model's forward FLOPs over every row it scored.  The report gives success (with a
bootstrap 95% interval at the largest N), tokens and FLOPs per problem for each method and level,
and where each method plateaus: the smallest N within one problem's worth of its best success.
``OUT/results.json`` holds everything; ``OUT/scaling.png`` draws success against tokens and FLOPs.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gin
import jax
import numpy as np
from tqdm.auto import tqdm

import agentic_jax.registry  # noqa: F401  (every configurable, before any parsing)
from agentic_jax import config as gin_config
from agentic_jax.eval import bootstrap_ci
from agentic_jax.models import flops_per_token
from agentic_jax.models.export import load_checkpoint
from agentic_jax.post_training.reward import load_reward_model
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.reasoning import (
    Budget,
    TurnModel,
    best_of_n,
    depth_first_search,
    majority_vote,
    step_beam_search,
    token_scorer,
    tree_search,
)

SUCCESS = 0.5  # an episode is solved when the verifier pays at least this (0.9 for the answer)
SAMPLING = ("self-consistency", "BoN-ORM", "BoN-PRM", "BoN-oracle")
SEARCHES = ("beam", "DVTS", "ToT-DFS", "MCTS")
METHODS = ("greedy", *SAMPLING, *SEARCHES)


class RewardScorer:
    """The reward model as a scorer of episode states, counting the FLOPs of what it scored."""

    def __init__(self, rm, aggregation: str, seq_len: int):
        self.rm, self.aggregation, self.flops = rm, aggregation, 0.0
        self.per_token = flops_per_token(rm.config, seq_len, training=False)
        self.score = token_scorer(self._scores, pad_id=rm.tokenizer.pad_id or 0)

    def _scores(self, tokens, mask):
        self.flops += self.per_token * tokens.size
        return self.rm.episode_rewards(tokens, mask, aggregation=self.aggregation)

    def __call__(self, states):
        return self.score(states)


def _processed(samples) -> int:
    """Tokens the policy processed for episodes sampled from one root together: the root's
    prompt once (its samples share that prefill), every later turn's whole transcript (each
    call prefills it again), and the generated turns."""
    total = samples[0].prompt_length
    for state in samples:
        ends = state.prompt_length + np.cumsum([len(s) for s in state.steps])
        total += int(ends[:-1].sum()) + _generated(state)
    return total


def _generated(state) -> int:
    return int(state.episode.loss_mask.sum())


def _solved(state) -> bool:
    return state.done and state.reward >= SUCCESS


def _row(solved, tokens, flops) -> dict:
    return {
        "success": [float(s) for s in solved],
        "tokens": float(np.mean(tokens)),
        "flops": float(np.mean(flops)),
    }


def _choose(name: str, model, samples, orm_scores, prm_scores):
    """The sample a selection method keeps."""
    if name == "self-consistency":
        answers = [model.answer(s) for s in samples]
        if all(a is None for a in answers):
            return samples[0]
        return samples[answers.index(majority_vote(answers))]
    if name == "BoN-oracle":
        return max(samples, key=_solved)
    return samples[best_of_n(orm_scores if name == "BoN-ORM" else prm_scores)]


def _pool_methods(model, roots, levels, key, orm, prm, policy_flops) -> dict:
    """Greedy and the sampling-and-selection methods, from one batched pool of samples."""
    greedy = model.complete(roots, key=key, temperature=0.0)
    results = {
        "greedy": {
            1: _row(
                map(_solved, greedy),
                [_generated(s) for s in greedy],
                [policy_flops * _processed([s]) for s in greedy],
            )
        }
    }
    n_max = max(levels)
    flat = model.complete([r for r in roots for _ in range(n_max)], key=key, temperature=1.0)
    pools = [flat[i * n_max : (i + 1) * n_max] for i in range(len(roots))]
    scored = [(orm(p), prm(p)) for p in pools]  # each sample scored once, charged once
    score_flops = (orm.flops + prm.flops) / (len(roots) * n_max)  # per sample
    for name in SAMPLING:
        rm_flops = 0.0 if name in ("self-consistency", "BoN-oracle") else score_flops
        results[name] = {}
        for n in levels:
            # The pool's n_max // n disjoint groups of n samples, each selected from, averaged:
            # the estimate at N uses every sample (as pass@k's estimator does), not the first n.
            groups = range(0, n_max - n + 1, n)
            solved, tokens, flops = [], [], []
            for pool, (o, p) in zip(pools, scored):
                picks = [
                    _choose(name, model, pool[g : g + n], o[g : g + n], p[g : g + n])
                    for g in groups
                ]
                solved.append(np.mean([_solved(c) for c in picks]))
                tokens.append(np.mean([sum(map(_generated, pool[g : g + n])) for g in groups]))
                flops.append(np.mean([policy_flops * _processed(pool[g : g + n]) for g in groups]))
            results[name][n] = _row(solved, tokens, np.asarray(flops) + rm_flops * n)
    return results


def _search(name: str, n: int, model, start, prm, orm, key, max_turns: int, threshold: float):
    half = max(n // 2, 1)
    wide = 2 if n > 1 else 1
    if name in ("beam", "DVTS"):  # beam: one group of N/2 beams; DVTS: N/2 groups of one
        width, subtrees = (half, 1) if name == "beam" else (1, half)
        return step_beam_search(
            model,
            start,
            prm,
            key=key,
            width=width,
            expansions=wide,
            subtrees=subtrees,
            max_steps=max_turns,
            aggregation="min",
            budget=Budget(),
        )
    if name == "ToT-DFS":
        return depth_first_search(
            model,
            start,
            prm,
            key=key,
            expansions=2,
            threshold=threshold,
            max_steps=max_turns,
            max_expansions=max_turns * n,
            aggregation="min",
            budget=Budget(),
        )
    return tree_search(
        model,
        start,
        prm,
        key=key,
        k=2,
        simulations=2 * n,
        max_steps=max_turns,
        reward=lambda state: float(orm([state])[0]),
        budget=Budget(),
    )


def _search_method(
    name, model, roots, levels, key, orm, prm, policy_flops, max_turns, threshold
) -> dict:
    """One search method at every level, problem by problem."""
    results = {}
    for n in levels:
        solved, tokens, flops = [], [], []
        for i, start in enumerate(tqdm(roots, desc=f"{name} N={n}", leave=False)):
            scored_before = orm.flops + prm.flops
            result = _search(
                name, n, model, start, prm, orm, jax.random.fold_in(key, i), max_turns, threshold
            )
            spent = result.budget
            solved.append(_solved(result.best))
            tokens.append(spent.tokens_spent)
            flops.append(
                policy_flops * (spent.tokens_spent + spent.prompt_tokens_spent)
                + orm.flops
                + prm.flops
                - scored_before
            )
        results[n] = _row(solved, tokens, flops)
    return results


def _plateau(levels_results: dict) -> int:
    """The smallest N whose success is within one problem of the method's best."""
    rates = {int(n): np.mean(r["success"]) for n, r in levels_results.items()}
    problems = len(next(iter(levels_results.values()))["success"])
    best = max(rates.values())
    return min(n for n, rate in rates.items() if rate >= best - 1.0 / problems)


def _report(results: dict, problems: int, seconds: dict) -> str:
    levels = sorted({int(n) for r in results.values() for n in r})
    header = " | ".join(f"N={n}" for n in levels)
    lines = [
        f"{problems} held-out problems; success (tokens / FLOPs per problem) at each N; the "
        "interval is the bootstrap 95% CI at the method's largest N.",
        "",
        f"| method | {header} | 95% CI | plateau N | wall-clock s |",
        "|---|" + "---|" * len(levels) + "---|---|---|",
    ]
    for name, by_level in results.items():
        cells = []
        for n in levels:
            r = by_level.get(str(n)) or by_level.get(n)
            cells.append(
                ""
                if r is None
                else f"{np.mean(r['success']):.3f} ({r['tokens']:.0f} / {r['flops']:.2g})"
            )
        last = by_level[max(by_level, key=int)]
        _, low, high = bootstrap_ci(np.asarray(last["success"], float))
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | [{low:.3f}, {high:.3f}] | {_plateau(by_level)} | {seconds[name]:.0f} |"
        )
    return "\n".join(lines)


def _plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, by_level in results.items():
        points = sorted(by_level.values(), key=lambda r: r["tokens"])
        for ax, x in zip(axes, ("tokens", "flops")):
            ax.plot(
                [r[x] for r in points],
                [np.mean(r["success"]) for r in points],
                marker="o",
                label=name,
            )
    for ax, label in zip(axes, ("generated tokens per problem", "FLOPs per problem")):
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out success")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the policy: a training run or model dir")
    parser.add_argument("--reward_model", required=True, help="a train_reward_model run (process)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--problems", type=int, default=40, help="held-out problems (the first)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tot_threshold", type=float, default=0.3, help="ToT prunes thoughts the PRM scores below"
    )
    parser.add_argument(
        "--searches",
        nargs="+",
        choices=SEARCHES,
        help="rerun only these searches, keeping OUT/results.json's other rows (same problems)",
    )
    parser.add_argument("--gin_param", action="append", default=[], help="a binding; repeatable")
    args = parser.parse_args(argv)
    if min(args.levels) < 1:
        raise SystemExit(f"--levels must be >= 1, got {args.levels}")
    gin_config.parse(["post_training_tasks"], args.gin_param)
    with gin.config_scope("rl"):
        spec = TaskSpec()
    config, params, tokenizer = load_checkpoint(args.model)
    rm = load_reward_model(args.reward_model)
    if rm.kind != "process":
        raise SystemExit(f"--reward_model must be a process reward model, got {rm.kind!r}")
    if rm.tokenizer.vocab_size != tokenizer.vocab_size:
        raise SystemExit("the reward model and the policy do not share a tokenizer")
    env = spec.host_env(tokenizer, "heldout")
    model = TurnModel(params, config, tokenizer, env=env)
    problems = min(args.problems, len(env.tasks))
    roots = model.roots(range(problems))
    levels = sorted(set(args.levels))
    policy_flops = flops_per_token(config, env.max_length, training=False)
    max_turns = env.default_params.max_turns
    key = jax.random.key(args.seed)
    orm, prm = RewardScorer(rm, "last", env.max_length), RewardScorer(rm, "min", env.max_length)
    results_path = os.path.join(args.out, "results.json")
    if args.searches:
        with open(results_path) as f:
            kept = json.load(f)
        if kept["problems"] != problems:
            raise SystemExit(f"{results_path} has {kept['problems']} problems, not {problems}")
        seconds = kept["seconds"]
        results = {
            name: {int(n): row for n, row in rows.items()} for name, rows in kept["results"].items()
        }
    else:
        started = time.monotonic()
        results = _pool_methods(model, roots, levels, key, orm, prm, policy_flops)
        seconds = dict.fromkeys(results, time.monotonic() - started)  # one shared pool of samples
    for name in args.searches or SEARCHES:
        started = time.monotonic()
        results[name] = _search_method(
            name, model, roots, levels, key, orm, prm, policy_flops, max_turns, args.tot_threshold
        )
        seconds[name] = time.monotonic() - started
    os.makedirs(args.out, exist_ok=True)
    with open(results_path, "w") as f:
        json.dump({"problems": problems, "seconds": seconds, "results": results}, f)
    _plot(results, os.path.join(args.out, "scaling.png"))
    report = _report(results, problems, seconds)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report + "\n")
    print(report)
    return results


if __name__ == "__main__":
    main()
