"""Speculation and logit masks inside the continuous batch: the engine's device steps and host tables.

**Per-request logit masks.**  A request may carry a ``TokenConstraint`` (``decoding/constrained.py``,
a regex or JSON schema's token automaton).  The engine walks each row's automaton on the host
(:class:`HostConstraint`) and passes the batch an ``allowed[rows, V]`` mask (``[rows, nodes, V]``
when verifying drafts), all ones on unconstrained rows, so constrained and free requests share
every step and its one compilation.

**Speculation per request** (``Request.speculation``): ``prompt_lookup`` proposes the tokens that
followed the latest match of the row's last n-gram (``decoding/prompt_lookup.py``), ``draft``
samples them from a draft model that shares the target's paged cache layout (its own pages,
the same block tables: every target forward also runs the draft over the same tokens, so its
K/V are there for any sequence, prefix-cache hits included).  Proposals are masked too:
deterministic ones are cut before the first token the row's automaton refuses, and the draft's
distribution is masked before it samples.  A proposer gives each row up to ``k`` tokens and,
when they were sampled, their draft probabilities ``q`` (one-hot otherwise).

``medusa`` and ``eagle`` draft a chain (a tree of branching 1) with heads on the target's own
final-norm hidden states (``decoding/draft_heads.py``).  Every target forward keeps, per slot,
the hidden state that predicted the row's last token (:class:`HeadState`): Medusa's heads read it
and propose each head's most likely token, cut before the first token the row's automaton
refuses.  EAGLE's layer keeps paged K/V of its own (same block tables, like the draft model's):
every target forward also runs the layer over the same tokens, each paired with the target's
feature before it, so the pages hold what the layer saw of the true features (a prefill's first
uncached token gets a zero feature: its predecessor's hidden state is not kept, which costs only
acceptance).  Its drafts are autoregressive over features, one batched step per depth from the
root and its kept feature, each the layer's most likely token under the row's mask.  Head drafts
are deterministic: ``q`` is a point mass.

:func:`verify_step` scores every decoding row's root and proposals in one target forward over
the paged cache, rows left-padded to ``k + 1`` tokens (a row without proposals is a plain decode
row).  Acceptance is ``decoding.speculative.verify`` (Leviathan et al. 2023, Chen et al. 2023):
draft ``d_i`` is kept with probability ``min(1, p_i(d_i) / q_i(d_i))``, the first rejection
emits a token of ``norm(max(0, p_i - q_i))``; ``p`` is the target's sampling distribution
(penalties, the row's mask, temperature, truncation), so every emitted token is distributed as
the target's and greedy rows emit exactly greedy decoding's tokens.  When a row's ``n``
proposals are all accepted its bonus token is drawn from ``p_{n+1}`` with the key plain decoding
uses at that step, so a row with no proposals samples exactly as :func:`engine._decode_step`.
The rejected positions are rolled back by the host: the sequence's computed length stops after
its accepted tokens, and blocks reserved past it return to the pool (``BlockManager.truncate``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.inference.decoding.constrained import TokenConstraint
from agentic_jax.inference.decoding.draft_heads import (
    EagleHead,
    MedusaHeads,
    eagle_config,
    eagle_features,
    medusa_logits,
)
from agentic_jax.inference.decoding.prompt_lookup import ngram_drafts
from agentic_jax.inference.decoding.sampling import (
    NEG_INF,
    SamplingArrays,
    add_tokens,
    filtered_logits,
    row_keys,
)
from agentic_jax.inference.decoding.speculative import node_distributions, verify
from agentic_jax.inference.serving.paged_cache import (
    PagedKVCache,
    PagedLatentCache,
    paged_attend,
    paged_forward,
    paged_hidden,
)
from agentic_jax.models.transformer import logits_from_hidden

SPECULATION = ("none", "prompt_lookup", "draft", "medusa", "eagle")
_DRAFT_KEY, _VERIFY_KEY = 1, 2  # folded into a round's row key for the draft's and verify's draws


class HostConstraint:
    """A ``TokenConstraint``'s tables as numpy arrays, where the engine walks a row's automaton."""

    def __init__(self, constraint: TokenConstraint):
        self.allowed = np.asarray(constraint.allowed)
        self.next_state = np.asarray(constraint.next_state)
        self.initial = int(constraint.initial)

    def allowed_prefix(self, state: int, tokens) -> int:
        """How many of ``tokens`` the automaton accepts in a row from ``state``."""
        for n, token in enumerate(tokens):
            if not self.allowed[state, token]:
                return n
            state = int(self.next_state[state, token])
        return len(tokens)

    def masks(self, state: int, tokens, width: int) -> np.ndarray:
        """``[width, V]``: the mask after ``state`` and after each of ``tokens``; all ones past
        them."""
        out = np.ones((width, self.allowed.shape[1]), bool)
        for j in range(len(tokens) + 1):
            out[j] = self.allowed[state]
            if j < len(tokens):
                state = int(self.next_state[state, tokens[j]])
        return out


@dataclasses.dataclass
class SpeculationStats:
    """Per method: decoding rows run (target forwards), tokens proposed and drafts accepted."""

    forwards: int = 0
    proposed: int = 0
    accepted: int = 0

    def report(self) -> dict:
        per = max(1, self.forwards)
        return {
            "forwards": self.forwards,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "accepted_per_forward": self.accepted / per,
            "tokens_per_forward": (self.accepted + self.forwards) / per,
        }


class RowSampling(NamedTuple):
    """A decoding step's per-slot sampling inputs (a pytree: it goes through ``jit``)."""

    arrays: SamplingArrays
    keys: jax.Array  # [S, ...] key data
    steps: jax.Array  # [S] tokens generated so far


lookup_drafts = jax.jit(ngram_drafts, static_argnames=("max_ngram", "gamma", "branches"))


def mirror(draft_params, draft_config, draft_cache, tokens, batch, decode_attention):
    """The draft model's K/V for the tokens a target forward runs (``None`` without a draft)."""
    if draft_config is None:
        return draft_cache
    _, draft_cache = paged_forward(
        draft_params, draft_config, draft_cache, tokens, batch, decode_attention=decode_attention
    )
    return draft_cache


@functools.partial(
    jax.jit, static_argnames=("config", "decode_attention", "eos_id"), donate_argnames=("cache",)
)
def draft_step(
    params,
    cache,
    counts,
    prompt_counts,
    tokens,
    batch,
    rows: RowSampling,
    depth,
    allowed,
    *,
    config,
    decode_attention,
    eos_id,
):
    """One draft token per row from the draft model (``tokens[S, 1]``, idle rows length 0), drawn
    from its masked sampling distribution ``q``; returns ``(token, q, cache, counts)``."""
    logits, cache = paged_forward(
        params, config, cache, tokens, batch, decode_attention=decode_attention
    )
    arrays, steps = rows.arrays, rows.steps
    f = filtered_logits(
        logits, arrays, counts, prompt_counts=prompt_counts, allowed=allowed, eos_id=eos_id
    )
    round_keys = jax.vmap(jax.random.fold_in)(
        row_keys(rows.keys, arrays, steps), jnp.full_like(steps, _DRAFT_KEY)
    )
    draw = jax.vmap(jax.random.fold_in)(round_keys, jnp.broadcast_to(depth, steps.shape))
    token = jax.vmap(jax.random.categorical)(draw, f).astype(jnp.int32)
    return token, jax.nn.softmax(f, axis=-1), cache, add_tokens(counts, token, batch.lengths > 0)


class Heads(NamedTuple):
    """The draft heads an engine serves (``None``: that method is not served)."""

    medusa: MedusaHeads | None = None
    eagle: EagleHead | None = None


class HeadState(NamedTuple):
    """What the heads read between steps: ``features[S, D]``, each slot's target hidden state that
    predicted its last token, and EAGLE's layer pages (``None`` without an EAGLE head)."""

    features: jax.Array
    eagle_cache: PagedKVCache | PagedLatentCache | None


def eagle_forward(
    head: EagleHead, params, config, cache, tokens, features, batch, decode_attention
):
    """EAGLE's layer over its pages: the predicted features ``[B, T, D]`` of ``tokens[B, T]`` (each
    paired with the feature that predicted it) and the pages with their K/V written."""
    attend = paged_attend(eagle_config(config), batch, decode_attention)
    out, pages = eagle_features(
        head, params, config, tokens, features, batch.positions, attend, tuple(cache)
    )
    return out, type(cache)(*pages)


def follow_heads(
    heads, params, config, state, tokens, batch, hidden, decode_attention, *, last=None, slot=None
):
    """The head state after a target forward over ``tokens[B, T]`` with hidden states ``hidden[B,
    T, D]`` (every slot's, or a prefill's of ``slot``): EAGLE's pages get the same tokens, each
    with the target's feature before it (the slot's kept feature for a row's first token, zeros
    on a prefill), and each active row keeps ``last[B, D]`` (default: its last column's), the
    state its next token was drawn from."""
    if state is None:
        return None
    fresh = slot is not None
    rows = slot[None] if fresh else jnp.arange(tokens.shape[0])
    last = hidden[:, -1] if last is None else last
    active = (batch.lengths > 0)[:, None]
    kept = state.features[rows]
    eagle_cache = state.eagle_cache
    if heads.eagle is not None:
        real = batch.slot_mapping < eagle_cache.num_blocks * eagle_cache.block_size
        first = real & ~jnp.pad(real[:, :-1], ((0, 0), (1, 0)))
        before = jnp.zeros_like(kept) if fresh else kept
        shifted = jnp.concatenate([before[:, None], hidden[:, :-1]], axis=1)
        features = jnp.where(first[..., None], before[:, None], shifted)
        _, eagle_cache = eagle_forward(
            heads.eagle, params, config, eagle_cache, tokens, features, batch, decode_attention
        )
    features = state.features.at[rows].set(jnp.where(active, last, kept).astype(kept.dtype))
    return HeadState(features, eagle_cache)


@functools.partial(jax.jit, static_argnames=("config",))
def medusa_drafts(heads: MedusaHeads, params, features, *, config):
    """``[S, K]``: each Medusa head's most likely token after each slot's root."""
    logits = medusa_logits(heads, params, config, features[:, None])[:, 0]
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@functools.partial(
    jax.jit, static_argnames=("config", "decode_attention"), donate_argnames=("cache",)
)
def eagle_step(head, params, cache, tokens, features, batch, allowed, *, config, decode_attention):
    """One EAGLE draft per row from ``tokens[S, 1]`` and the features ``[S, D]`` that predicted
    them (idle rows length 0): ``(the most likely allowed token, its predicted feature, cache)``."""
    out, cache = eagle_forward(
        head, params, config, cache, tokens, features[:, None], batch, decode_attention
    )
    logits = logits_from_hidden(params, config, out)[:, 0]
    token = jnp.argmax(jnp.where(allowed, logits, NEG_INF), axis=-1).astype(jnp.int32)
    return token, out[:, 0], cache


class Verified(NamedTuple):
    """A verification step's outcome per row: ``tokens[S, k + 1]`` (the accepted drafts, then the
    correction or bonus token; valid up to ``accepted + 1``) with their log-probabilities."""

    tokens: jax.Array
    accepted: jax.Array  # [S] drafts accepted
    sample_logprobs: jax.Array  # [S, k + 1] under the target's sampling distribution
    raw_logprobs: jax.Array  # [S, k + 1] under the raw target


def _pick(x, idx):
    """``x[s, idx[s]]`` along axis 1."""
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 1)), axis=1)[:, 0]


@functools.partial(
    jax.jit,
    static_argnames=("config", "draft_config", "decode_attention", "eos_id"),
    donate_argnames=("cache", "draft_cache", "head_state", "gen_counts"),
)
def verify_step(
    params,
    cache,
    draft_params,
    draft_cache,
    heads,
    head_state,
    gen_counts,
    prompt_counts,
    tokens,
    batch,
    rows: RowSampling,
    proposed,
    drafts,
    draft_q,
    sampled,
    allowed,
    *,
    config,
    draft_config,
    decode_attention,
    eos_id,
):
    """Verifies every row's proposals in one target forward (see the module docstring).

    ``tokens[S, k + 1]``: each row's root and its ``proposed[S]`` drafts, left-padded;
    ``drafts[S, k]`` the drafts from column 0; ``draft_q[S, k, V]`` their draft distributions
    where ``sampled[S]`` (else point masses); ``allowed[S, k + 1, V]`` each node's mask.
    Returns ``(Verified, cache, draft_cache, head_state, gen_counts)``.
    """
    hidden, cache = paged_hidden(
        params, config, cache, tokens, batch, decode_attention=decode_attention
    )
    logits = logits_from_hidden(params, config, hidden)
    draft_cache = mirror(draft_params, draft_config, draft_cache, tokens, batch, decode_attention)
    arrays, keys, steps = rows
    t = tokens.shape[1]
    v = logits.shape[-1]
    node = jnp.arange(t)[None, :]
    # Node j (the root, then draft j) sits at column t - 1 - proposed + j; later nodes are padding.
    cols = jnp.clip(t - 1 - proposed[:, None] + node, 0, t - 1)
    logits = jnp.take_along_axis(logits, cols[:, :, None], axis=1)
    block = jnp.take_along_axis(tokens, cols, axis=1)
    on_path = jnp.tril(jnp.ones((t, t), jnp.int32)).at[:, 0].set(0)  # the root is in gen_counts
    filtered = node_distributions(
        jnp.where(allowed, logits, NEG_INF),
        block,
        on_path,
        arrays,
        gen_counts,
        prompt_counts,
        eos_id=eos_id,
    )
    q = jnp.where(sampled[:, None, None], draft_q, jax.nn.one_hot(drafts, v))
    round_keys = row_keys(keys, arrays, steps)
    verdict = verify(
        jax.nn.softmax(filtered, axis=-1),
        drafts[:, None],
        q[:, None],
        jax.vmap(jax.random.fold_in)(round_keys, jnp.full_like(steps, _VERIFY_KEY)),
    )
    accepted = jnp.minimum(verdict.accepted, proposed)
    # Every proposal accepted: the bonus token, drawn as plain decoding draws at that step.
    bonus_keys = row_keys(keys, arrays, steps + accepted)
    bonus = jax.vmap(jax.random.categorical)(bonus_keys, _pick(filtered, accepted))
    final = jnp.where(verdict.accepted >= proposed, bonus.astype(jnp.int32), verdict.final)
    emitted = jnp.where(node < accepted[:, None], jnp.pad(drafts, ((0, 0), (0, 1))), final[:, None])

    def logprob(z):
        return jnp.take_along_axis(jax.nn.log_softmax(z), emitted[:, :, None], 2)[..., 0]

    kept = (node <= accepted[:, None]) & (batch.lengths > 0)[:, None]
    gen_counts = gen_counts + jnp.einsum(
        "st,stv->sv", kept.astype(jnp.int32), jax.nn.one_hot(emitted, v, dtype=jnp.int32)
    )
    out = Verified(emitted, accepted, logprob(filtered), logprob(logits))
    last = _pick(hidden, t - 1 - proposed + accepted)  # where each row's final token was drawn
    head_state = follow_heads(
        heads, params, config, head_state, tokens, batch, hidden, decode_attention, last=last
    )
    return out, cache, draft_cache, head_state, gen_counts
