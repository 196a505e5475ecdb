"""Pairwise model comparison: Bradley-Terry ratings from battles, as Chatbot Arena does it.

A benchmark with a fixed answer key cannot rank open-ended answers; a judge (human or model)
that says which of two answers is better can.  Chatbot Arena (Chiang et al. 2024,
arXiv:2403.04132) turns such votes into a leaderboard with the Bradley-Terry model

    P(a beats b) = σ(θ_a − θ_b) = 1 / (1 + base^((R_b − R_a) / scale)),

with ``R = init + scale · θ / ln(base)`` on the Elo scale (``scale=400, base=10, init=1000``).
Its maximum-likelihood fit uses every battle at once, so unlike online Elo it does not depend
on the order the battles came in; bootstrapping battles gives its confidence intervals, and
adding per-battle style differences (length, markdown) as covariates gives the "style
control" ratings (Li et al. 2024, lmsys.org/blog/2024-08-28-style-control), which separate
what a judge likes about how an answer looks from what the model got right.

Battles are grouped into unique rows (model a, model b, outcome, style) with counts, so a fit
costs the number of distinct rows, not of battles, and a bootstrap resample is a multinomial
draw of row counts; every resample is refitted at once under ``jax.vmap``.  The fit is Newton's
method on the logistic log-likelihood with a tiny L2 penalty (which keeps the optimum finite
when a model won or lost all its battles, or the comparison graph is disconnected).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

# L2 penalty on every coefficient (log-odds units): small beside any real count of battles.
_L2 = 1e-6
_MAX_NEWTON = 100
_MAX_HALVINGS = 30

_HEADER = re.compile(r"^#{1,6}\s", re.MULTILINE)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s", re.MULTILINE)
_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")
_CODE_BLOCK = re.compile(r"```.*?```", re.DOTALL)

STYLE_FEATURES = ("length", "headers", "list_items", "bold")


@dataclasses.dataclass(frozen=True)
class Battles:
    """``B`` battles: ``model_a[B]`` and ``model_b[B]`` index a list of model names;
    ``outcome[B]`` is 1 when a won, 0 when b won, 0.5 for a tie; ``covariates[B, K]``
    (optional) are per-battle feature differences a − b, e.g. from :func:`style_features`.
    """

    model_a: np.ndarray
    model_b: np.ndarray
    outcome: np.ndarray
    covariates: np.ndarray | None = None

    def __post_init__(self):
        a, b = np.asarray(self.model_a), np.asarray(self.model_b)
        outcome = np.asarray(self.outcome, np.float64)
        for name, index in (("model_a", a), ("model_b", b)):
            if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer):
                raise ValueError(
                    f"{name} must be a 1-D array of integer model indices, got "
                    f"{index.dtype} of shape {index.shape}"
                )
        if not a.shape == b.shape == outcome.shape:
            raise ValueError(
                "model_a, model_b and outcome must have one length, got shapes "
                f"{a.shape}, {b.shape} and {outcome.shape}"
            )
        if not np.all((outcome >= 0) & (outcome <= 1)):
            raise ValueError("outcome must lie in [0, 1] (1: a wins, 0: b wins, 0.5: tie)")
        if np.any(a == b):
            raise ValueError("a battle needs two different models; model_a == model_b somewhere")
        covariates = self.covariates
        if covariates is not None:
            covariates = np.asarray(covariates, np.float64)
            if covariates.ndim != 2 or covariates.shape[0] != a.shape[0]:
                raise ValueError(
                    f"covariates must be [battles, features] = [{a.shape[0]}, K], "
                    f"got {covariates.shape}"
                )
            if not np.all(np.isfinite(covariates)):
                raise ValueError("covariates must be finite")
        object.__setattr__(self, "model_a", a.astype(np.int64))
        object.__setattr__(self, "model_b", b.astype(np.int64))
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "covariates", covariates)

    def __len__(self) -> int:
        return self.outcome.shape[0]


class BTFit(NamedTuple):
    """Elo-scale ``ratings[M]`` and ``style[K]`` coefficients (log-odds per standard deviation
    of each style feature; empty without style control)."""

    ratings: np.ndarray
    style: np.ndarray


class BootstrapRatings(NamedTuple):
    """Per model: the mean of the bootstrap ratings and the percentile interval ends."""

    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def _checked(battles: Battles, n_models: int) -> Battles:
    if not isinstance(battles, Battles):
        raise ValueError(f"battles must be a Battles record, got {type(battles).__name__}")
    if n_models < 2:
        raise ValueError(f"n_models must be >= 2, got {n_models}")
    if len(battles) == 0:
        raise ValueError("need at least one battle")
    for name, index in (("model_a", battles.model_a), ("model_b", battles.model_b)):
        if index.min() < 0 or index.max() >= n_models:
            raise ValueError(
                f"{name} indices must be in [0, {n_models}), got {index.min()}..{index.max()}"
            )
    return battles


def _float() -> jnp.dtype:
    """JAX's default float (float32 unless ``jax_enable_x64``)."""
    return jnp.result_type(float)


# --- the logistic fit -------------------------------------------------------------------------


def _fit(x, y, w, n_models: int):
    """Minimise ``Σ w·(softplus(z) − y·z) + L2/2·|β|²``, ``z = xβ``, by Newton's method.

    ``x[N, D]`` holds ``e_a − e_b`` in its first ``n_models`` columns (then covariates), ``y[N]``
    the outcome, ``w[N]`` the count of each row.  The likelihood does not change when a
    constant is added to every model's θ, so that direction (``u``) gets an extra curvature in
    the Newton system to keep it well conditioned, and θ is re-centred after every step; the
    gradient has no component along ``u`` at centred θ, so neither changes the optimum.  The
    line search accepts a step with sufficient decrease (Armijo), or, once the loss change is
    below rounding, a step that shrinks the gradient (as scikit-learn's Newton solver does).
    """
    n_coef = x.shape[1]
    eps = jnp.finfo(x.dtype).eps
    u = jnp.where(jnp.arange(n_coef) < n_models, 1 / math.sqrt(n_models), 0).astype(x.dtype)

    def centre(beta):
        return beta - u * (u @ beta)

    def loss_and_grad(beta):
        z = x @ beta
        loss = jnp.sum(w * (jax.nn.softplus(z) - y * z)) + 0.5 * _L2 * beta @ beta
        return loss, x.T @ (w * (jax.nn.sigmoid(z) - y)) + _L2 * beta

    def newton_step(state):
        beta, loss, grad, _, iteration = state
        p = jax.nn.sigmoid(x @ beta)
        hessian = (x.T * (w * p * (1 - p))) @ x + _L2 * jnp.eye(n_coef, dtype=x.dtype)
        hessian = hessian + (jnp.trace(hessian) / n_coef) * jnp.outer(u, u)
        direction = jnp.linalg.solve(hessian, grad)
        slope = grad @ direction

        def rejected(search):
            t, _, new_loss, new_grad, halvings = search
            armijo = new_loss <= loss - 1e-4 * t * slope
            flat = jnp.abs(new_loss - loss) <= 16 * eps * jnp.abs(loss)
            smaller = jnp.sum(jnp.abs(new_grad)) < jnp.sum(jnp.abs(grad))
            return ~(armijo | (flat & smaller)) & (halvings < _MAX_HALVINGS)

        def halve(search):
            t, _, _, _, halvings = search
            t = t / 2
            candidate = centre(beta - t * direction)
            return (t, candidate, *loss_and_grad(candidate), halvings + 1)

        first = centre(beta - direction)
        _, candidate, new_loss, new_grad, halvings = jax.lax.while_loop(
            rejected, halve, (jnp.ones((), x.dtype), first, *loss_and_grad(first), 0)
        )
        failed = halvings >= _MAX_HALVINGS
        step = jnp.max(jnp.abs(candidate - beta))
        done = failed | (step <= 1e3 * eps * (1 + jnp.max(jnp.abs(candidate))))
        return (
            jnp.where(failed, beta, candidate),
            jnp.where(failed, loss, new_loss),
            jnp.where(failed, grad, new_grad),
            done,
            iteration + 1,
        )

    def running(state):
        return ~state[3] & (state[4] < _MAX_NEWTON)

    beta = jnp.zeros(n_coef, x.dtype)
    state = (beta, *loss_and_grad(beta), jnp.array(False), 0)
    return jax.lax.while_loop(running, newton_step, state)[0]


_fit_many = jax.jit(jax.vmap(_fit, in_axes=(None, None, 0, None)), static_argnums=3)


def _padded(rows: int) -> int:
    """Rows padded (with zero weight) to a power of two, so few shapes are compiled."""
    return max(8, 1 << (rows - 1).bit_length())


def _fit_rows(x: np.ndarray, y: np.ndarray, weights: np.ndarray, n_models: int) -> np.ndarray:
    """Coefficients ``[R, D]`` for row weights ``[R, N]`` (all rows share ``x`` and ``y``)."""
    size = _padded(x.shape[0])
    pad = size - x.shape[0]
    dtype = _float()
    beta = _fit_many(
        jnp.asarray(np.pad(x, ((0, pad), (0, 0))), dtype),
        jnp.asarray(np.pad(y, (0, pad)), dtype),
        jnp.asarray(np.pad(weights, ((0, 0), (0, pad))), dtype),
        n_models,
    )
    return np.asarray(beta, np.float64)


def bradley_terry(wins) -> np.ndarray:
    """Maximum-likelihood log-strengths ``θ[M]`` (mean 0) of the Bradley-Terry model
    ``P(i beats j) = σ(θ_i − θ_j)`` from ``wins[i, j]``, the times i beat j (a tie may count as
    half a win each way).

    Maximises ``Σ_ij wins[i, j] · log σ(θ_i − θ_j)`` (the diagonal is ignored).  A model that
    never lost (or never won) has no finite optimum; the tiny L2 penalty keeps its θ large but
    finite, as it does for a group of models never compared with the rest.
    """
    wins = np.asarray(wins, np.float64)
    if wins.ndim != 2 or wins.shape[0] != wins.shape[1] or wins.shape[0] < 2:
        raise ValueError(f"wins must be a square [M, M] matrix with M >= 2, got {wins.shape}")
    if not np.all(np.isfinite(wins)) or np.any(wins < 0):
        raise ValueError("wins must be finite and non-negative counts")
    n_models = wins.shape[0]
    i, j = np.triu_indices(n_models, 1)
    games = wins[i, j] + wins[j, i]
    met = games > 0
    i, j, games = i[met], j[met], games[met]
    if games.size == 0:
        return np.zeros(n_models)
    x = np.zeros((games.size, n_models))
    x[np.arange(games.size), i] = 1
    x[np.arange(games.size), j] = -1
    theta = _fit_rows(x, wins[i, j] / games, games[None], n_models)[0]
    return theta - theta.mean()


# --- battles to ratings -----------------------------------------------------------------------


def style_features(text_a, text_b) -> np.ndarray:
    """Normalised style differences of two answers: ``(s_a − s_b) / (s_a + s_b)`` (0 when both
    are 0) for each of :data:`STYLE_FEATURES`: length in whitespace-split words (a tokenizer-free
    stand-in for the arena's token count), markdown headers, list items and bold spans
    (counted outside fenced code, as the arena's style control does).

    Strings give ``[4]``; equal-length sequences of strings give ``[B, 4]``.
    """
    if isinstance(text_a, str) and isinstance(text_b, str):
        return _style_pair(text_a, text_b)
    if isinstance(text_a, str) or isinstance(text_b, str):
        raise ValueError("text_a and text_b must both be strings or both sequences of strings")
    if len(text_a) != len(text_b):
        raise ValueError(
            f"text_a and text_b must have one length, got {len(text_a)} and {len(text_b)}"
        )
    return np.array([_style_pair(a, b) for a, b in zip(text_a, text_b)]).reshape(-1, 4)


def _style_counts(text: str) -> np.ndarray:
    prose = _CODE_BLOCK.sub("", text)
    return np.array(
        [
            len(text.split()),
            len(_HEADER.findall(prose)),
            len(_LIST_ITEM.findall(prose)),
            len(_BOLD.findall(prose)),
        ],
        np.float64,
    )


def _style_pair(text_a: str, text_b: str) -> np.ndarray:
    a, b = _style_counts(text_a), _style_counts(text_b)
    total = a + b
    return np.where(total > 0, (a - b) / np.where(total > 0, total, 1), 0.0)


def _style_matrix(battles: Battles, style) -> np.ndarray:
    """The ``[B, K]`` style covariates, z-scored over battles (constant columns left at 0)."""
    if style is None or style is False:
        return np.zeros((len(battles), 0))
    if style is True:
        if battles.covariates is None:
            raise ValueError("style=True needs battles.covariates; the record has none")
        style = battles.covariates
    style = np.asarray(style, np.float64)
    if style.ndim != 2 or style.shape[0] != len(battles):
        raise ValueError(
            f"style must be [battles, features] = [{len(battles)}, K], got {style.shape}"
        )
    if not np.all(np.isfinite(style)):
        raise ValueError("style covariates must be finite")
    spread = style.std(axis=0)
    return np.where(spread > 0, (style - style.mean(axis=0)) / np.where(spread > 0, spread, 1), 0)


def _unique_rows(battles: Battles, n_models: int, style: np.ndarray):
    """Distinct ``(x, y)`` rows of the regression and each one's count of battles."""
    keys = np.column_stack([battles.model_a, battles.model_b, battles.outcome, style])
    keys, inverse = np.unique(keys, axis=0, return_inverse=True)
    counts = np.bincount(inverse.ravel(), minlength=keys.shape[0]).astype(np.float64)
    a, b = keys[:, 0].astype(np.int64), keys[:, 1].astype(np.int64)
    x = np.zeros((keys.shape[0], n_models + style.shape[1]))
    x[np.arange(a.size), a] = 1
    x[np.arange(b.size), b] = -1
    x[:, n_models:] = keys[:, 3:]
    return x, keys[:, 2], counts


def _to_elo(theta: np.ndarray, scale: float, base: float, init: float) -> np.ndarray:
    theta = theta - theta.mean(axis=-1, keepdims=True)
    return init + scale * theta / math.log(base)


def bt_ratings(
    battles: Battles,
    n_models: int,
    *,
    style=None,
    scale: float = 400,
    base: float = 10,
    init: float = 1000,
) -> BTFit:
    """Bradley-Terry ratings by logistic regression over battles, with optional style control.

    ``P(a beats b) = σ(θ_a − θ_b + γ·s)`` where ``s`` is the battle's style difference (a − b),
    z-scored over battles; the ratings ``init + scale·θ/ln(base)`` average ``init``.  ``style``
    is a ``[B, K]`` array, ``True`` for ``battles.covariates``, or ``None`` for plain
    Bradley-Terry.  A tie is a half win for each side (soft label 0.5); a model with no
    battles is rated ``init``.
    """
    battles = _checked(battles, n_models)
    covariates = _style_matrix(battles, style)
    x, y, counts = _unique_rows(battles, n_models, covariates)
    beta = _fit_rows(x, y, counts[None], n_models)[0]
    return BTFit(_to_elo(beta[:n_models], scale, base, init), beta[n_models:])


def bootstrap_ratings(
    battles: Battles,
    n_models: int,
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    style=None,
    scale: float = 400,
    base: float = 10,
    init: float = 1000,
) -> BootstrapRatings:
    """Bootstrap of :func:`bt_ratings`: ``resamples`` sets of ``B`` battles drawn with
    replacement (a multinomial draw of the distinct rows' counts), all refitted at once under
    ``jax.vmap``; returns each model's mean rating and percentile interval at ``confidence``.
    """
    battles = _checked(battles, n_models)
    if resamples < 2:
        raise ValueError(f"resamples must be >= 2, got {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    covariates = _style_matrix(battles, style)
    x, y, counts = _unique_rows(battles, n_models, covariates)
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(len(battles), counts / counts.sum(), size=resamples)
    beta = _fit_rows(x, y, weights.astype(np.float64), n_models)
    ratings = _to_elo(beta[:, :n_models], scale, base, init)
    low, high = np.quantile(ratings, [(1 - confidence) / 2, (1 + confidence) / 2], axis=0)
    return BootstrapRatings(ratings.mean(axis=0), low, high)


def elo(
    battles: Battles,
    n_models: int,
    *,
    k: float = 4,
    init=1000,
    scale: float = 400,
    base: float = 10,
) -> np.ndarray:
    """Online Elo in battle order: with ``E_a = 1 / (1 + base^((R_b − R_a)/scale))`` each battle
    moves ``R_a += k·(S_a − E_a)`` and ``R_b −= k·(S_a − E_a)`` (``S_a`` its outcome).

    ``init`` is a scalar or a ``[M]`` array.  The scan runs on ratings minus their initial mean
    (added back in float64), so adding a constant to every initial rating shifts the result by
    that constant.  Unlike :func:`bt_ratings` the result depends on battle order; the arena
    moved from it to Bradley-Terry for that reason.
    """
    battles = _checked(battles, n_models)
    start = np.broadcast_to(np.asarray(init, np.float64), (n_models,))
    if not np.all(np.isfinite(start)):
        raise ValueError("init ratings must be finite")
    offset = start.mean()
    dtype = _float()
    log_base = math.log(base)

    def battle(ratings, game):
        a, b, outcome = game
        expected = jax.nn.sigmoid((ratings[a] - ratings[b]) * log_base / scale)
        change = k * (outcome - expected)
        return ratings.at[a].add(change).at[b].add(-change), None

    final, _ = jax.lax.scan(
        battle,
        jnp.asarray(start - offset, dtype),
        (
            jnp.asarray(battles.model_a, jnp.int32),
            jnp.asarray(battles.model_b, jnp.int32),
            jnp.asarray(battles.outcome, dtype),
        ),
    )
    return offset + np.asarray(final, np.float64)


def battle_counts(battles: Battles, n_models: int) -> np.ndarray:
    """Battles each model took part in, ``[M]``."""
    battles = _checked(battles, n_models)
    both = np.concatenate([battles.model_a, battles.model_b])
    return np.bincount(both, minlength=n_models)


def win_rate_matrix(battles: Battles, n_models: int) -> np.ndarray:
    """``[M, M]``: the fraction of their battles that i won against j, in either seat, a tie
    counting half; NaN where i and j never met (and on the diagonal)."""
    battles = _checked(battles, n_models)
    a, b, s = battles.model_a, battles.model_b, battles.outcome
    score = np.zeros((n_models, n_models))
    games = np.zeros((n_models, n_models))
    np.add.at(score, (a, b), s)
    np.add.at(score, (b, a), 1 - s)
    np.add.at(games, (a, b), 1)
    np.add.at(games, (b, a), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(games > 0, score / games, np.nan)


def predicted_win_rate(ratings, *, scale: float = 400, base: float = 10) -> np.ndarray:
    """``[M, M]`` Bradley-Terry win probabilities ``1 / (1 + base^((R_j − R_i)/scale))``."""
    ratings = np.asarray(ratings, np.float64)
    if ratings.ndim != 1:
        raise ValueError(f"ratings must be 1-D, got shape {ratings.shape}")
    gap = (ratings[:, None] - ratings[None, :]) * math.log(base) / scale
    return 1 / (1 + np.exp(-gap))


# --- reports ----------------------------------------------------------------------------------


def _check_names(names: Sequence[str], *arrays) -> list[np.ndarray]:
    out = []
    for array in arrays:
        array = None if array is None else np.asarray(array, np.float64)
        if array is not None and array.shape != (len(names),):
            raise ValueError(f"expected one value per model ({len(names)}), got {array.shape}")
        out.append(array)
    return out


def leaderboard(names: Sequence[str], ratings, low, high, battles_per_model) -> str:
    """A Markdown table sorted by rating.  ``Rank`` is 1 + the number of models whose interval
    lies wholly above this one's (``low_j > high_i``, the arena's rank), so models that the
    intervals cannot separate share a rank; with ``low``/``high`` None it is the plain order.
    """
    ratings, low, high, counts = _check_names(names, ratings, low, high, battles_per_model)
    if (low is None) != (high is None):
        raise ValueError("give both low and high, or neither")
    order = np.argsort(-ratings, kind="stable")
    lines = ["| Rank | Model | Rating | CI | Battles |", "|---:|:---|---:|:---:|---:|"]
    for place, i in enumerate(order):
        if low is None:
            rank, interval = place + 1, "–"
        else:
            rank = 1 + int(np.sum(low > high[i]))
            interval = f"+{high[i] - ratings[i]:.0f} / -{ratings[i] - low[i]:.0f}"
        lines.append(f"| {rank} | {names[i]} | {ratings[i]:.0f} | {interval} | {counts[i]:.0f} |")
    return "\n".join(lines) + "\n"


def plot_ratings(names: Sequence[str], ratings, low, high, path: str | os.PathLike) -> None:
    """A PNG of the ratings, best first, with their intervals as error bars."""
    ratings, low, high = _check_names(names, ratings, low, high)
    order = np.argsort(-ratings, kind="stable")
    fig = Figure(figsize=(max(4.0, 0.6 * len(names) + 1.5), 4.0))
    ax = fig.add_subplot()
    errors = np.stack([ratings - low, high - ratings])[:, order]
    ax.errorbar(np.arange(len(names)), ratings[order], yerr=errors, fmt="o", capsize=4)
    ax.set_xticks(np.arange(len(names)), [names[i] for i in order], rotation=45, ha="right")
    ax.set_ylabel("rating")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)


def plot_win_rates(names: Sequence[str], matrix, path: str | os.PathLike) -> None:
    """A PNG heatmap of ``matrix[i, j]`` (row i's win rate against column j), NaN left blank."""
    matrix = np.asarray(matrix, np.float64)
    if matrix.shape != (len(names), len(names)):
        raise ValueError(f"matrix must be [{len(names)}, {len(names)}], got {matrix.shape}")
    size = max(4.0, 0.6 * len(names) + 2)
    fig = Figure(figsize=(size + 1, size))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap="RdBu", vmin=0, vmax=1)
    for (i, j), value in np.ndenumerate(matrix):
        if np.isfinite(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    ticks = np.arange(len(names))
    ax.set_xticks(ticks, names, rotation=45, ha="right")
    ax.set_yticks(ticks, names)
    ax.set_xlabel("opponent")
    ax.set_ylabel("model")
    fig.colorbar(image, ax=ax, label="win rate")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
