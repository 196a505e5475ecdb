"""Turning next-token logits into tokens: penalties, temperature and truncation, batched and jit-able.

One compiled step serves a batch whose rows have different settings: :class:`SamplingParams` is the
per-request (host) description and :meth:`SamplingArrays.from_params` stacks a list of them into
``[B]`` arrays.  :func:`filtered_logits` applies, per row and in this order:

1. **Penalties** on the raw float32 logits ``z``:

   * repetition (Keskar et al. 2019, CTRL): for every token seen in the prompt or the generated
     tokens, ``z / r`` if ``z > 0`` else ``z * r``;
   * frequency and presence (the OpenAI API's): ``z - f * c - p * [c > 0]`` with ``c`` the token's
     count among the *generated* tokens.

2. **Constraint**: tokens outside ``allowed[B, V]`` (e.g. a grammar's mask, see ``constrained.py``)
   get ``-inf``.  Nothing later can bring them back.
3. **Temperature**: ``z / T``; ``T == 0`` is greedy decoding, whose sampling distribution is the
   point mass on the argmax of the penalised, constrained logits (log-probability 0).
4. **Top-k**: keep the ``k`` highest-ranked tokens (exactly ``k``; ties broken by token id).
5. **Top-p** (nucleus, Holtzman et al. 2020): renormalise what top-k kept and keep the smallest
   prefix of the sorted tokens whose probability reaches ``p`` (a token is kept when the mass
   strictly before it is below ``p``; the most likely token is always kept).
6. **Min-p** (Nguyen et al. 2024): keep tokens whose probability is at least ``min_p`` times the
   most likely token's.  That ratio is unchanged by renormalisation, so min-p commutes with 4-5.
7. **Protected ids** (``eos_id`` and ``protected_ids``): a protected token the constraint allows
   is never removed by 4-6, so a sequence can always end; one outside the top ``k`` is kept in
   addition to them.

Steps 4-5 rank tokens without sorting (a bisection over the float bits, :func:`_keep_prefix`):
sorting the vocabulary every step is the slowest part of sampling on CPUs.

The result is a distribution with ``-inf`` on removed tokens; :func:`sample` draws from it with one
key per row and returns the token, its log-probability under that distribution (what importance
ratios in RL and speculative decoding need) and under the raw model (``log_softmax(z)`` before
step 1).

Keys: ``sample`` takes one key (row ``i`` uses ``fold_in(key, i)``) or ``[B]`` keys.  A row whose
params carry a ``seed`` uses ``key(seed mod 2**32)`` (:func:`seed_key`) instead, so its tokens do
not depend on the batch it runs in; either way ``step`` (the number of tokens the sequence has
generated) is folded in last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.inference.errors import RequestError

NEG_INF = -jnp.inf
INT32_MAX = 2**31 - 1
SEED_RANGE = (-(2**63), 2**63 - 1)  # int64, as the OpenAI API has seeds


_REAL = (int, float, np.integer, np.floating)
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _integer(name: str, value, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``; an integral float such as 3.0 counts as one."""
    integral = isinstance(value, int | np.integer) or (
        isinstance(value, float | np.floating) and float(value).is_integer()
    )
    if isinstance(value, bool) or not integral:
        raise RequestError(f"SamplingParams.{name}={value!r} is not an integer")
    if not low <= value <= high:
        raise RequestError(f"SamplingParams.{name}={value!r} is out of range [{low}, {high}]")
    return int(value)


def _finite(value) -> bool:
    """A real number (not a bool) that float32 holds as a finite value; NaN fails ``<=``."""
    return isinstance(value, _REAL) and not isinstance(value, bool) and abs(value) <= FLOAT32_MAX


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one sequence is sampled and when it stops (the host-side, per-request description).

    ``temperature`` 0 is greedy; ``top_k`` 0, ``top_p`` 1 and ``min_p`` 0 switch those filters off;
    ``repetition_penalty`` 1 and the additive penalties 0 are no-ops.  Generation stops after
    ``max_tokens`` tokens, on EOS or any of ``stop_token_ids`` (the stop token is kept), or when the
    text ends with one of ``stop_strings`` (matched on the host; see ``generate.py``).  ``seed``
    makes the sequence's tokens a function of the seed alone.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        # Counts become int32 arrays (2.5 would truncate to 2, 2**31 would overflow); seeds are
        # int64 as the OpenAI API has them; floats must be finite float32 values.
        for name, low, high in (("top_k", 0, INT32_MAX), ("max_tokens", 1, INT32_MAX)):
            object.__setattr__(self, name, _integer(name, getattr(self, name), low, high))
        if self.seed is not None:
            object.__setattr__(self, "seed", _integer("seed", self.seed, *SEED_RANGE))
        for name, ok, rule in (
            ("temperature", lambda x: x >= 0, ">= 0"),
            ("top_p", lambda x: 0 < x <= 1, "in (0, 1]"),
            ("min_p", lambda x: 0 <= x <= 1, "in [0, 1]"),
            ("repetition_penalty", lambda x: x > 0, "> 0"),
            ("frequency_penalty", lambda x: True, ""),
            ("presence_penalty", lambda x: True, ""),
        ):
            value = getattr(self, name)
            if not (_finite(value) and ok(value)):
                raise RequestError(
                    f"SamplingParams.{name}={value!r} is out of range: it must "
                    f"be a finite number {rule}".rstrip()
                )
        object.__setattr__(
            self,
            "stop_token_ids",
            tuple(_integer("stop_token_ids", t, 0, INT32_MAX) for t in self.stop_token_ids),
        )
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise RequestError("SamplingParams.stop_strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class SamplingArrays(NamedTuple):
    """Per-row sampling settings as ``[B]`` arrays (a pytree: pass it through ``jit``).

    ``stop_token_ids`` is ``[B, S]``, padded with -1; ``seed``/``has_seed`` carry optional seeds.
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    repetition_penalty: jax.Array
    frequency_penalty: jax.Array
    presence_penalty: jax.Array
    max_tokens: jax.Array
    stop_token_ids: jax.Array
    seed: jax.Array
    has_seed: jax.Array

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams] | SamplingParams, batch: int | None = None
    ) -> SamplingArrays:
        """Stacks one ``SamplingParams`` per row (or repeats a single one ``batch`` times)."""
        if isinstance(params, SamplingParams):
            params = [params] * (1 if batch is None else batch)
        params = list(params)
        if not params or (batch is not None and len(params) != batch):
            raise ValueError(
                f"need one SamplingParams per row; got {len(params)} for batch {batch}"
            )

        def column(name, dtype):
            return jnp.asarray(np.array([getattr(p, name) for p in params], dtype))

        width = max(1, max(len(p.stop_token_ids) for p in params))
        stops = np.full((len(params), width), -1, np.int32)
        for i, p in enumerate(params):
            stops[i, : len(p.stop_token_ids)] = p.stop_token_ids
        seeds = np.array([(p.seed or 0) % 2**32 for p in params], np.uint32)
        return cls(
            temperature=column("temperature", np.float32),
            top_k=column("top_k", np.int32),
            top_p=column("top_p", np.float32),
            min_p=column("min_p", np.float32),
            repetition_penalty=column("repetition_penalty", np.float32),
            frequency_penalty=column("frequency_penalty", np.float32),
            presence_penalty=column("presence_penalty", np.float32),
            max_tokens=column("max_tokens", np.int32),
            stop_token_ids=jnp.asarray(stops),
            seed=jnp.asarray(seeds),
            has_seed=jnp.asarray(np.array([p.seed is not None for p in params])),
        )

    @property
    def batch(self) -> int:
        return self.temperature.shape[0]


def count_tokens(tokens, vocab_size: int, mask=None):
    """``[B, V]`` int32 counts of each id in ``tokens[B, T]`` (where ``mask`` is true)."""
    ones = jnp.ones(tokens.shape, jnp.int32) if mask is None else mask.astype(jnp.int32)
    rows = jnp.arange(tokens.shape[0])[:, None]
    return jnp.zeros((tokens.shape[0], vocab_size), jnp.int32).at[rows, tokens].add(ones)


def add_tokens(counts, tokens, active=None):
    """``counts[B, V]`` after one more token per row (rows where ``active`` is false unchanged)."""
    inc = jnp.ones(tokens.shape, counts.dtype) if active is None else active.astype(counts.dtype)
    return counts.at[jnp.arange(tokens.shape[0]), tokens].add(inc)


def apply_penalties(logits, arrays: SamplingArrays, token_counts=None, prompt_counts=None):
    """Step 1: repetition penalty over prompt+generated tokens, frequency/presence over generated."""
    z = logits.astype(jnp.float32)
    if token_counts is None and prompt_counts is None:
        return z
    generated = jnp.zeros(z.shape, jnp.int32) if token_counts is None else token_counts
    seen = generated > 0 if prompt_counts is None else (generated > 0) | (prompt_counts > 0)
    r = arrays.repetition_penalty[:, None]
    z = jnp.where(seen, jnp.where(z > 0, z / r, z * r), z)
    return (
        z
        - arrays.frequency_penalty[:, None] * generated
        - arrays.presence_penalty[:, None] * (generated > 0)
    )


def _protected_mask(vocab_size: int, eos_id, protected_ids):
    ids = tuple(protected_ids) + (() if eos_id is None else (eos_id,))
    mask = np.zeros(vocab_size, bool)
    mask[list(ids)] = True
    return jnp.asarray(mask)


def _order_keys(x):
    """``uint32`` keys ordered like the float32 values ``x`` (-0 sorts just below +0)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    bits = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
    return jax.lax.bitcast_convert_type(bits, jnp.uint32) ^ jnp.uint32(0x80000000)


def _keep_prefix(keys, weights, budget):
    """Keeps token t when the weight of the tokens ranked before it is below ``budget[B, 1]``.

    Ranking is by descending key, ties by ascending id.  No sort: a 32-step bisection over the
    key space finds the smallest key ``tau`` with ``weight(keys > tau) < budget``; every token
    above the lowest key at or over ``tau`` is kept, and ties at that key are kept in id order
    while their running weight stays under budget.  Exact, and O(32 V) per row.
    """

    def weight_above(tau):
        return jnp.sum(jnp.where(keys > tau, weights, 0), axis=-1, keepdims=True)

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        ok = weight_above(mid) < budget
        return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

    b = keys.shape[0]
    bounds = (jnp.zeros((b, 1), jnp.uint32), jnp.full((b, 1), 0xFFFFFFFF, jnp.uint32))
    tau = jax.lax.fori_loop(0, 32, halve, bounds)[1]
    boundary = jnp.min(jnp.where(keys >= tau, keys, jnp.uint32(0xFFFFFFFF)), axis=-1, keepdims=True)
    tied = keys == boundary
    tied_weight = jnp.where(tied, weights, 0)
    tied_before = jnp.cumsum(tied_weight, axis=-1) - tied_weight
    return (keys > boundary) | (tied & (weight_above(boundary) + tied_before < budget))


def _truncation_mask(scaled, arrays: SamplingArrays):
    """Steps 4-6: which tokens top-k, top-p and min-p keep (sort-free, see :func:`_keep_prefix`)."""
    v = scaled.shape[-1]
    keys = _order_keys(scaled)
    k = jnp.where(arrays.top_k > 0, arrays.top_k, v).astype(jnp.float32)[:, None]
    in_top_k = _keep_prefix(keys, jnp.ones_like(scaled), k)
    probs = jax.nn.softmax(jnp.where(in_top_k, scaled, NEG_INF), axis=-1)
    top_p = arrays.top_p[:, None]
    in_top_p = _keep_prefix(keys, probs, top_p) | (top_p >= 1.0)
    above_min_p = probs >= arrays.min_p[:, None] * probs.max(axis=-1, keepdims=True)
    return in_top_k & in_top_p & above_min_p


def filtered_logits(
    logits,
    arrays: SamplingArrays,
    token_counts=None,
    *,
    prompt_counts=None,
    allowed=None,
    eos_id: int | None = None,
    protected_ids: Sequence[int] = (),
):
    """The sampling distribution's logits ``[B, V]`` (float32, ``-inf`` on removed tokens).

    Steps 1-7 of the module docstring.  ``token_counts[B, V]`` counts generated tokens and
    ``prompt_counts[B, V]`` the prompt's (for the repetition penalty); ``allowed[B, V]`` is a
    constraint mask, which must allow at least one token per row.  Greedy rows (temperature 0)
    come back as ``0`` on their argmax and ``-inf`` elsewhere.
    """
    z = apply_penalties(logits, arrays, token_counts, prompt_counts)
    if allowed is not None:
        z = jnp.where(allowed, z, NEG_INF)
    greedy = arrays.temperature[:, None] == 0
    scaled = z / jnp.where(greedy, 1.0, arrays.temperature[:, None])
    keep = _truncation_mask(scaled, arrays)
    protected = _protected_mask(z.shape[-1], eos_id, protected_ids)[None, :]
    sampled = jnp.where(keep | protected, scaled, NEG_INF)
    one_hot = jax.nn.one_hot(jnp.argmax(z, axis=-1), z.shape[-1], dtype=bool)
    return jnp.where(greedy, jnp.where(one_hot, 0.0, NEG_INF), sampled)


def seed_key(seed: int) -> jax.Array:
    """The key of a row whose params carry ``seed``, as :func:`row_keys` derives it."""
    return jax.random.key(np.uint32(seed % 2**32))


def row_keys(key_or_keys, arrays: SamplingArrays, step=0):
    """One PRNG key per row: the row's own (or ``key(seed)``) with ``step`` folded in."""
    keys = key_or_keys
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        keys = jax.random.wrap_key_data(keys)
    b = arrays.batch
    if keys.ndim == 0:
        keys = jax.vmap(lambda i: jax.random.fold_in(keys, i))(jnp.arange(b))
    impl = jax.random.key_impl(keys)
    data = jax.random.key_data(keys)
    seeded = jax.random.key_data(jax.vmap(lambda s: jax.random.key(s, impl=impl))(arrays.seed))
    has_seed = arrays.has_seed.reshape((b,) + (1,) * (data.ndim - 1))
    keys = jax.random.wrap_key_data(jnp.where(has_seed, seeded, data), impl=impl)
    steps = jnp.broadcast_to(jnp.asarray(step, jnp.uint32), (b,))
    return jax.vmap(jax.random.fold_in)(keys, steps)


def token_logprobs(logits, tokens):
    """``log_softmax(logits)[b, tokens[b]]`` for ``logits[B, V]`` and ``tokens[B]``."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


class Sample(NamedTuple):
    tokens: jax.Array  # [B] int32
    sample_logprobs: jax.Array  # [B] log-probability under the filtered distribution
    raw_logprobs: jax.Array  # [B] log-probability under the raw model


def sample(
    logits,
    key_or_keys,
    arrays: SamplingArrays,
    token_counts=None,
    *,
    step=0,
    prompt_counts=None,
    allowed=None,
    eos_id: int | None = None,
    protected_ids: Sequence[int] = (),
) -> Sample:
    """Draws one token per row of ``logits[B, V]``; returns ``(tokens, sample_logprobs, raw_logprobs)``.

    ``step`` (a scalar or ``[B]``) is each sequence's count of generated tokens, folded into its key
    (see :func:`row_keys`); the keyword arguments are those of :func:`filtered_logits`.
    """
    filtered = filtered_logits(
        logits,
        arrays,
        token_counts,
        prompt_counts=prompt_counts,
        allowed=allowed,
        eos_id=eos_id,
        protected_ids=protected_ids,
    )
    keys = row_keys(key_or_keys, arrays, step)
    tokens = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
    return Sample(tokens, token_logprobs(filtered, tokens), token_logprobs(logits, tokens))
