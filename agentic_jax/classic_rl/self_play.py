"""Self-play against a league of past selves in a symmetric two-player matrix game, one ``jit``.

Training only against one's latest self chases its own tail in a game like rock-paper-scissors:
each best response is beaten by the next, and the sequence cycles.  Training against a *league*
of every past generation is fictitious self-play: each generation a fresh learner is trained to a
best response against the league's mixture and then joins the league, and in a two-player
zero-sum game the league's mixture approaches a Nash equilibrium (Brown, 1951; Robinson, 1951;
Heinrich et al., 2015, "Fictitious Self-Play in Extensive-Form Games"; Lanctot et al., 2017,
PSRO, arXiv:1711.00832; AlphaStar's league, Vinyals et al., 2019, generalises it).

Each generation's learner is a softmax policy trained for ``iterations`` steps by REINFORCE with a
mean baseline (``rl.reinforce_loss``) on ``batch`` sampled games against opponents drawn uniformly
from the last ``league_size`` members (all of them by default).  ``league_size=1`` is iterated
best response to the latest self, the baseline at the same budget.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.envs.markov_game import MatrixGame


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
    generations: int = 30
    iterations: int = 100
    batch: int = 64
    learning_rate: float = 0.2
    league_size: int | None = None  # None: every past generation

    def __post_init__(self):
        for name in ("generations", "iterations", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.league_size is not None and self.league_size < 1:
            raise ValueError(f"league_size must be at least 1 or None, got {self.league_size}")


def draw_members(key, g, window: int, batch: int) -> jax.Array:
    """``[batch]`` league rows drawn uniformly from the last ``window`` of rows ``0..g``."""
    low = jnp.maximum(0, g + 1 - window)
    return low + jax.random.randint(key, (batch,), 0, g + 1 - low)


def make_league_self_play(game: MatrixGame, config: SelfPlayConfig = SelfPlayConfig()):
    """``train(key) -> league [generations + 1, A]``: row 0 is the random first member, row g the
    policy generation g learned.  The league's mixture after generation g is the mean of the rows
    it trains against; :meth:`MatrixGame.nash_conv` of ``[mix, mix]`` measures its distance to a
    Nash equilibrium."""
    payoffs = jnp.asarray(game.payoffs)
    if not jnp.allclose(payoffs[1], payoffs[0].T):
        raise ValueError("league self-play needs a symmetric game: payoffs[1] == payoffs[0].T")
    num_actions = game.num_actions
    window = config.league_size or config.generations + 1
    optimizer = optax.sgd(config.learning_rate)

    def loss(logits, mine, reward):
        logp = jax.nn.log_softmax(logits)[mine]
        return jnp.mean(rl.reinforce_loss(logp, reward, jnp.full_like(reward, reward.mean())))

    def generation(league, inputs):
        g, key = inputs  # the league holds rows 0..g
        key_init, key_train = jax.random.split(key)

        def step(carry, key):
            logits, opt_state = carry
            key_member, key_theirs, key_mine = jax.random.split(key, 3)
            members = draw_members(key_member, g, window, config.batch)
            theirs = jax.random.categorical(key_theirs, jnp.log(league[members]))
            mine = jax.random.categorical(key_mine, logits, shape=(config.batch,))
            grads = jax.grad(loss)(logits, mine, payoffs[0, mine, theirs])
            updates, opt_state = optimizer.update(grads, opt_state)
            return (optax.apply_updates(logits, updates), opt_state), None

        logits = 0.01 * jax.random.normal(key_init, (num_actions,))
        keys = jax.random.split(key_train, config.iterations)
        (logits, _), _ = jax.lax.scan(step, (logits, optimizer.init(logits)), keys)
        return league.at[g + 1].set(jax.nn.softmax(logits)), None

    def train(key):
        key_first, key_run = jax.random.split(key)
        first = jax.nn.softmax(jax.random.normal(key_first, (num_actions,)))
        league = jnp.zeros((config.generations + 1, num_actions)).at[0].set(first)
        steps = jnp.arange(config.generations)
        keys = jax.random.split(key_run, config.generations)
        return jax.lax.scan(generation, league, (steps, keys))[0]

    return train


def league_mixtures(league, league_size: int | None = None) -> jax.Array:
    """``[generations + 1, A]``: row g is the mixture the league offers after generation g (the
    mean of its last ``league_size`` members, all of them by default)."""
    league = jnp.asarray(league)
    rows = jnp.arange(league.shape[0])
    window = league_size or league.shape[0]
    use = (rows[None, :] <= rows[:, None]) & (rows[None, :] > rows[:, None] - window)
    return (use[..., None] * league[None]).sum(1) / use.sum(1, keepdims=True)
