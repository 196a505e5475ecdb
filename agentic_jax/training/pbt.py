"""Population-based training: a population trained in one vmapped program, its hyperparameters
changed on a schedule by exploit and explore.

Jaderberg et al. (2017), "Population Based Training of Neural Networks", arXiv:1711.09846.  P
members train side by side for an interval; then each member in the bottom ``truncation``
fraction by score **exploits** one drawn uniformly from the top fraction (copies its weights,
optimiser state and hyperparameters) and **explores** (multiplies each copied hyperparameter by a
factor drawn from ``perturb``, or with probability ``resample`` draws it afresh from its range,
clipped to the range).  The members that were not replaced keep everything.  So the population
follows a hyperparameter *schedule* found while training, at the cost of one training run per
member.

Any trainer fits whose state is a pytree and whose hyperparameters are traced values: an optax
optimiser built with ``optax.inject_hyperparams`` keeps them in its state
(:func:`set_hyperparams` writes them there), a ``jit`` step takes them as arguments.  The trainer
gives ``step(state, hypers, key) -> (state, score)`` for one member and one interval; this module
``vmap``s it over the population and runs the intervals on the host, logging each decision.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gin
import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


class Range(NamedTuple):
    """A hyperparameter's bounds; ``log``: drawn and perturbed on a log scale (learning rates)."""

    low: float
    high: float
    log: bool = False

    def sample(self, key, shape) -> jax.Array:
        if self.log:
            lo, hi = math.log(self.low), math.log(self.high)
            return jnp.exp(jax.random.uniform(key, shape, minval=lo, maxval=hi))
        return jax.random.uniform(key, shape, minval=self.low, maxval=self.high)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PBTConfig:
    """``population`` members, ``rounds`` intervals; the bottom ``truncation`` fraction exploits
    the top one; explore multiplies by one of ``perturb`` or, with probability ``resample``,
    draws a new value."""

    population: int = 8
    rounds: int = 10
    truncation: float = 0.25
    perturb: tuple[float, ...] = (0.8, 1.25)
    resample: float = 0.0

    def __post_init__(self):
        if self.population < 2:
            raise ValueError(f"population must be at least 2, got {self.population}")
        if not 0 < self.truncation <= 0.5:
            raise ValueError(f"truncation must be in (0, 0.5], got {self.truncation}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {self.rounds}")
        if not self.perturb or min(self.perturb) <= 0:
            raise ValueError(f"perturb factors must be positive, got {self.perturb}")
        if not 0 <= self.resample <= 1:
            raise ValueError(f"resample must be a probability, got {self.resample}")


def sample_hypers(key, space: Mapping[str, Range], population: int) -> dict[str, jax.Array]:
    """Each hyperparameter ``[population]``, drawn from its range."""
    keys = jax.random.split(key, len(space))
    return {name: r.sample(k, (population,)) for k, (name, r) in zip(keys, space.items())}


def exploit_explore(
    key, scores, hypers: Mapping[str, jax.Array], space: Mapping[str, Range], config: PBTConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(source [P], new hypers)``: member i continues from member ``source[i]`` (itself unless
    it was in the bottom fraction) with the new hyperparameters.  Pure and jit-able."""
    scores = jnp.asarray(scores, jnp.float32)
    p = scores.shape[0]
    cut = max(1, int(p * config.truncation))
    # ascending, bottom first; a NaN score (a diverged member) counts as the worst
    order = jnp.argsort(jnp.where(jnp.isnan(scores), -jnp.inf, scores))
    bottom = jnp.zeros(p, bool).at[order[:cut]].set(True)
    key_pick, key_factor, key_resample, key_draw = jax.random.split(key, 4)
    donors = order[p - cut :][jax.random.randint(key_pick, (p,), 0, cut)]
    source = jnp.where(bottom, donors, jnp.arange(p))
    keys = zip(
        jax.random.split(key_factor, len(space)),
        jax.random.split(key_resample, len(space)),
        jax.random.split(key_draw, len(space)),
    )
    new = {}
    for (k_factor, k_resample, k_draw), (name, r) in zip(keys, space.items()):
        copied = hypers[name][source]
        factor = jax.random.choice(k_factor, jnp.asarray(config.perturb, jnp.float32), (p,))
        explored = jnp.where(
            jax.random.uniform(k_resample, (p,)) < config.resample,
            r.sample(k_draw, (p,)),
            jnp.clip(copied * factor, r.low, r.high),
        )
        new[name] = jnp.where(bottom, explored, copied)
    return source, new


class PBTResult(NamedTuple):
    """The final states and hyperparameters (stacked ``[P, ...]``), the scores ``[rounds, P]``,
    the hyperparameters ``{name: [rounds, P]}`` each round trained with, and the exploit
    sources ``[rounds, P]`` (member i continued from ``sources[r, i]`` after round r)."""

    states: PyTree
    hypers: dict[str, jax.Array]
    scores: np.ndarray
    history: dict[str, np.ndarray]
    sources: np.ndarray


@gin.configurable(denylist=["init", "step", "space"])
def population_based_training(
    init: Callable[[jax.Array, Mapping[str, jax.Array]], PyTree],
    step: Callable[[PyTree, Mapping[str, jax.Array], jax.Array], tuple[PyTree, jax.Array]],
    space: Mapping[str, Range],
    key: jax.Array,
    config: PBTConfig = PBTConfig(),
    *,
    explore: bool = True,
    log: Callable[[str], None] | None = print,
) -> PBTResult:
    """Runs PBT (module docstring).  ``init(key, hypers) -> state`` and ``step(state, hypers,
    key) -> (state, score)`` see one member (higher scores are better); both are vmapped over the
    population and ``step`` is jitted.  ``explore=False`` trains the same population with its
    first hyperparameters throughout (the baseline at the same budget)."""
    if not space:
        raise ValueError("space names no hyperparameter to tune")
    key_hypers, key_init, key_run = jax.random.split(key, 3)
    hypers = sample_hypers(key_hypers, space, config.population)
    states = jax.vmap(init)(jax.random.split(key_init, config.population), hypers)
    interval = jax.jit(jax.vmap(step))
    decide = jax.jit(lambda k, s, h: exploit_explore(k, s, h, space, config))
    scores, history, sources = [], {name: [] for name in space}, []
    for round_, round_key in enumerate(jax.random.split(key_run, config.rounds), 1):
        key_step, key_decide = jax.random.split(round_key)
        for name in space:
            history[name].append(np.asarray(hypers[name]))
        states, score = interval(states, hypers, jax.random.split(key_step, config.population))
        scores.append(np.asarray(score))
        source = jnp.arange(config.population)
        if explore and round_ < config.rounds:
            source, hypers = decide(key_decide, score, hypers)
            states = jax.tree.map(lambda x, s=source: x[s], states)
        sources.append(np.asarray(source))
        if log is not None:
            best = int(np.nanargmax(scores[-1]))
            settings = ", ".join(f"{n}={float(history[n][-1][best]):.3g}" for n in space)
            log(
                f"PBT round {round_}/{config.rounds}: best score {scores[-1][best]:.4g} ({settings})"
            )
    return PBTResult(
        states,
        hypers,
        np.stack(scores),
        {n: np.stack(v) for n, v in history.items()},
        np.stack(sources),
    )


def set_hyperparams(opt_state: PyTree, hypers: Mapping[str, jax.Array]) -> PyTree:
    """Writes ``hypers`` into the state of an ``optax.inject_hyperparams`` optimiser (found
    anywhere in ``opt_state``), so that its next update uses them."""
    found = False

    def replace(node):
        nonlocal found
        if hasattr(node, "hyperparams") and isinstance(node.hyperparams, dict):
            found = True
            unknown = set(hypers) - set(node.hyperparams)
            if unknown:
                raise ValueError(
                    f"the optimiser has no hyperparameter {sorted(unknown)}; it has "
                    f"{sorted(node.hyperparams)}"
                )
            values = {
                name: jnp.asarray(hypers[name], jnp.asarray(old).dtype) if name in hypers else old
                for name, old in node.hyperparams.items()
            }
            return node._replace(hyperparams=values)
        return node

    out = jax.tree.map(replace, opt_state, is_leaf=lambda n: hasattr(n, "hyperparams"))
    if not found:
        raise ValueError(
            "the optimiser state has no hyperparams: build it with optax.inject_hyperparams"
        )
    return out
