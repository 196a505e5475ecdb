"""League self-play on a two-player pgx board game (tic-tac-toe, connect four), one ``jit``.

The game comes through ``envs.PgxEnv``, which shows the board from the side of the player to
move, so one policy network plays both seats.  The policy is a small MLP on the flattened board
whose illegal moves are masked out (pgx's ``legal_action_mask``).

As in ``classic_rl.self_play`` the learner trains against a *league* of its past selves
(fictitious self-play: Heinrich et al., 2015; AlphaStar's league, Vinyals et al., 2019):
row 0 is the initial network (nearly uniform over legal moves), and after each generation the
learner's parameters join the league.  Unlike the matrix-game league the learner is not
restarted each generation: a board policy is too costly to relearn, so it keeps improving
against a growing pool, as AlphaStar's main agents do.  Each step it plays ``batch`` games
against members drawn uniformly from the last ``league_size`` rows, in a random seat, and takes
one REINFORCE step (``rl.reinforce_loss``; Williams, 1992) on the game's outcome for it (+1 win,
0 draw, −1 loss) with the batch's mean outcome as baseline, plus an entropy bonus.

After each generation the learner plays ``eval_games`` games against a uniformly random player
and against the league's first member (the first checkpoint): the metrics are its win, draw and
loss rates.
"""

from __future__ import annotations

import dataclasses

import gin
import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.classic_rl.common import adam
from agentic_jax.classic_rl.networks import mlp_apply, mlp_init
from agentic_jax.classic_rl.self_play import draw_members
from agentic_jax.envs import PgxEnv

# The logit of an illegal move: its probability underflows to exactly 0, and unlike −∞ it keeps
# p · log p (0) and its gradients finite.
ILLEGAL = -1e9


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BoardSelfPlayConfig:
    generations: int = 4
    iterations: int = 50  # REINFORCE steps per generation
    batch: int = 64  # games per step
    max_moves: int = 9  # the longest game: 9 in tic-tac-toe, 42 in connect four
    learning_rate: float = 3e-3
    ent_coef: float = 0.01
    max_grad_norm: float = 1.0
    hidden: tuple[int, ...] = (64,)
    league_size: int | None = None  # None: every past generation
    eval_games: int = 256

    def __post_init__(self):
        for name in ("generations", "iterations", "batch", "max_moves", "eval_games"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"BoardSelfPlayConfig.{name} must be at least 1, got {getattr(self, name)}"
                )
        if self.league_size is not None and self.league_size < 1:
            raise ValueError(f"league_size must be at least 1 or None, got {self.league_size}")


def board_logits(params, obs, legal) -> jax.Array:
    """``[..., A]`` logits of the MLP on the flattened board, ``ILLEGAL`` on illegal moves."""
    flat = obs.reshape(*legal.shape[:-1], -1)
    return jnp.where(legal, mlp_apply(params, flat), ILLEGAL)


def uniform_player(params):
    """Parameters of the player that picks uniformly among legal moves: every weight zero, so
    every logit is."""
    return jax.tree.map(jnp.zeros_like, params)


def play(env: PgxEnv, learner, opponents, seats, key, max_moves: int) -> dict:
    """``len(seats)`` games of ``learner`` against ``opponents`` (parameters stacked per game),
    the learner in seat ``seats[b]`` of game b.  Returns each game's ``outcome`` for the learner
    ``[B]`` and the learner's moves: ``obs``, ``legal``, ``action`` and ``mine`` (it moved, the
    game not yet over) ``[max_moves, B, ...]``; ``finished`` ``[B]``: the game ended in time."""
    num_games = seats.shape[0]
    key_reset, key_play = jax.random.split(key)
    _, state = jax.vmap(env.reset)(jax.random.split(key_reset, num_games))

    def move(carry, key):
        state, alive, outcome = carry
        key_action, key_step = jax.random.split(key)
        obs, legal, mover = state.observation, state.legal_action_mask, state.current_player
        mine = mover == seats
        theirs = jax.vmap(board_logits)(opponents, obs, legal)
        logits = jnp.where(mine[:, None], board_logits(learner, obs, legal), theirs)
        action = jax.random.categorical(key_action, logits)
        _, state, _, terminated, truncated, info = jax.vmap(env.step)(
            jax.random.split(key_step, num_games), state, action
        )
        reward = jnp.take_along_axis(info["rewards"], seats[:, None], axis=1)[:, 0]
        outcome = outcome + jnp.where(alive, reward, 0.0)
        record = {"obs": obs, "legal": legal, "action": action, "mine": mine & alive}
        return (state, alive & ~(terminated | truncated), outcome), record

    carry = (state, jnp.ones(num_games, bool), jnp.zeros(num_games))
    (_, alive, outcome), moves = jax.lax.scan(move, carry, jax.random.split(key_play, max_moves))
    return moves | {"outcome": outcome, "finished": ~alive}


def reinforce_objective(params, games: dict, ent_coef: float):
    """−mean over games of Σ_{learner's moves} log π(a) · (outcome − mean outcome) − entropy
    bonus; (loss, metrics)."""
    log_probs = jax.nn.log_softmax(board_logits(params, games["obs"], games["legal"]))
    logp = jnp.take_along_axis(log_probs, games["action"][..., None], axis=-1)[..., 0]
    logp = jnp.sum(jnp.where(games["mine"], logp, 0.0), axis=0)  # [B]
    outcome = games["outcome"]
    loss = jnp.mean(rl.reinforce_loss(logp, outcome, jnp.full_like(outcome, outcome.mean())))
    per_move = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    entropy = jnp.sum(per_move * games["mine"]) / jnp.maximum(jnp.sum(games["mine"]), 1)
    return loss - ent_coef * entropy, {"entropy": entropy}


def match_rates(env: PgxEnv, learner, opponent, key, games: int, max_moves: int) -> dict:
    """``{"win", "draw", "loss"}``: the learner's rates over ``games`` games against one
    ``opponent``, half of them in each seat (pgx draws who moves first)."""
    seats = jnp.arange(games) % 2
    opponents = jax.tree.map(lambda x: jnp.broadcast_to(x, (games, *x.shape)), opponent)
    outcome = play(env, learner, opponents, seats, key, max_moves)["outcome"]
    return {
        "win": jnp.mean(outcome > 0),
        "draw": jnp.mean(outcome == 0),
        "loss": jnp.mean(outcome < 0),
    }


def make_board_self_play(env: PgxEnv, config: BoardSelfPlayConfig = BoardSelfPlayConfig()):
    """``train(key) -> (league, metrics)``: ``league`` the parameters stacked
    ``[generations + 1, ...]`` (row 0 the initial network, row g after generation g), metrics per
    generation: ``{vs_random, vs_first}_{win, draw, loss}``, the last step's ``entropy`` and
    ``unfinished``: the fraction of training games still going after ``max_moves`` moves (0 when
    ``max_moves`` covers the game)."""
    obs_shape = env.observation_space().shape
    num_actions = env.action_space().n
    obs_dim = int(jnp.prod(jnp.asarray(obs_shape)))
    window = config.league_size or config.generations + 1
    optimizer = adam(config.learning_rate, config.max_grad_norm)
    grad_fn = jax.grad(reinforce_objective, has_aux=True)

    def generation(carry, inputs):
        league, params, opt_state = carry
        g, key = inputs  # the league holds rows 0..g
        key_train, key_random, key_first = jax.random.split(key, 3)

        def step(carry, key):
            params, opt_state = carry
            key_member, key_seat, key_play = jax.random.split(key, 3)
            members = draw_members(key_member, g, window, config.batch)
            opponents = jax.tree.map(lambda x: x[members], league)
            seats = jax.random.randint(key_seat, (config.batch,), 0, 2)
            games = play(env, params, opponents, seats, key_play, config.max_moves)
            grads, metrics = grad_fn(params, games, config.ent_coef)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            metrics["unfinished"] = 1.0 - jnp.mean(games["finished"])
            return (optax.apply_updates(params, updates), opt_state), metrics

        keys = jax.random.split(key_train, config.iterations)
        (params, opt_state), metrics = jax.lax.scan(step, (params, opt_state), keys)
        league = jax.tree.map(lambda rows, x: rows.at[g + 1].set(x), league, params)
        first = jax.tree.map(lambda x: x[0], league)
        evaluation = {
            "vs_random": match_rates(
                env, params, uniform_player(params), key_random, config.eval_games, config.max_moves
            ),
            "vs_first": match_rates(
                env, params, first, key_first, config.eval_games, config.max_moves
            ),
        }
        metrics = jax.tree.map(lambda x: x[-1], metrics) | {
            f"{who}_{result}": rate
            for who, rates in evaluation.items()
            for result, rate in rates.items()
        }
        return (league, params, opt_state), metrics

    def train(key):
        key_init, key_run = jax.random.split(key)
        params = mlp_init(key_init, (obs_dim, *config.hidden, num_actions), head_gain=0.01)
        league = jax.tree.map(
            lambda x: jnp.zeros((config.generations + 1, *x.shape), x.dtype).at[0].set(x), params
        )
        inputs = (jnp.arange(config.generations), jax.random.split(key_run, config.generations))
        carry = (league, params, optimizer.init(params))
        (league, _, _), metrics = jax.lax.scan(generation, carry, inputs)
        return league, metrics

    return train
