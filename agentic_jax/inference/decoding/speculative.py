"""Speculative decoding: cheap drafts, one target pass to verify them, the target's exact distribution.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).  Each round a drafter proposes
``gamma`` tokens ``d_1..d_gamma`` with probabilities ``q_i``; the target scores the root (the last
emitted token) and all drafts in one forward pass, giving ``p_1..p_{gamma+1}``.  Draft ``d_i`` is
accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection the round emits a
token from ``norm(max(0, p_i - q_i))`` instead, and if all are accepted a bonus token from
``p_{gamma+1}``.  Every emitted token is then distributed exactly as the target's sampling
distribution (``sampling.filtered_logits``: penalties, temperature, top-k/p, min-p), and a round
emits between 1 and ``gamma + 1`` tokens for one target step.  Greedy rows have one-hot ``p``, so
the output equals target greedy decoding token for token.

Drafters:

* a smaller **draft model** with its own KV cache, sampling from its own filtered distribution;
* **prompt lookup** (``prompt_lookup.py``): n-gram matches in the context, deterministic proposals
  (``q`` is a point mass, so acceptance is ``p(d)`` and the residual is ``p`` without ``d``).

**Trees** (``branches > 1``; SpecInfer, Miao et al. 2024): ``branches`` chains of ``gamma`` drafts
share the root and are verified in the same pass with a tree attention mask (each draft sees the
root and its own chain; ``kv_cache.Tree``).  Verification walks down by depth with recursive
rejection sampling over the chains still consistent with the accepted prefix: try each one's token
with ratio ``p / q``, replacing ``p`` by ``norm(max(0, p - q))`` after a rejection.  That is exact
when the candidates are i.i.d. draws from ``q`` (sampled draft chains) or fixed proposals with
point-mass ``q`` (prompt lookup; greedy rows, whose chains start from the draft's top-``branches``
tokens).

**Caches**: the target writes the root at slot ``L - 1`` and draft ``(c, i)`` at ``L + c gamma + i``;
after acceptance the chosen chain's slots move to ``L..L + gamma - 1`` and ``write`` drops to
``L + n`` (``n`` accepted drafts), which rolls back everything rejected.  The draft model keeps one
cache row per chain and copies the chosen chain's row to the others.

Constraints (``TokenConstraint``) are not supported here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.inference.decoding.generate import (
    GenerationResult,
    max_tokens,
    run_prefill,
    sampling_arrays,
    uses_counts,
)
from agentic_jax.inference.decoding.kv_cache import Tree, extend_logits, move_slots, reorder_rows
from agentic_jax.inference.decoding.prompt_lookup import ngram_drafts
from agentic_jax.inference.decoding.prompts import PromptBatch, as_prompt_batch, is_stop
from agentic_jax.inference.decoding.sampling import (
    SamplingArrays,
    SamplingParams,
    apply_penalties,
    count_tokens,
    filtered_logits,
    row_keys,
)
from agentic_jax.models import TransformerConfig


class SpeculativeResult(NamedTuple):
    """The generation and, per row, target passes, drafted depth and accepted drafts."""

    generation: GenerationResult
    target_steps: jax.Array  # [B] verification passes
    drafted: jax.Array  # [B] draft depth offered: gamma per pass
    accepted: jax.Array  # [B] accepted draft tokens

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over drafted depth, over the batch."""
        return float(np.sum(self.accepted) / max(1, int(np.sum(self.drafted))))

    @property
    def tokens_per_step(self) -> float:
        """Emitted tokens per target pass, over the batch."""
        return float(np.sum(self.generation.lengths) / max(1, int(np.sum(self.target_steps))))


def draft_tree(branches: int, gamma: int) -> Tree:
    """The root followed by ``branches`` chains of ``gamma`` nodes (branch-major)."""
    t = 1 + branches * gamma
    ancestors = np.eye(t, dtype=bool)
    ancestors[:, 0] = True
    depth = np.zeros(t, np.int32)
    for c in range(branches):
        for i in range(gamma):
            node = 1 + c * gamma + i
            ancestors[node, 1 + c * gamma : node + 1] = True
            depth[node] = i + 1
    return Tree(jnp.asarray(ancestors), jnp.asarray(depth))


def _pick(x, idx):
    """``x[b, idx[b]]`` along axis 1."""
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 1)), axis=1)[:, 0]


class Verdict(NamedTuple):
    accepted: jax.Array  # [B] drafts accepted (along one chain)
    branch: jax.Array  # [B] the chain they lie on
    final: jax.Array  # [B] the correction or bonus token


def verify(p, drafts, q, key):
    """Recursive rejection sampling of a tree of drafts.

    ``p[B, 1 + K gamma, V]``: the target's sampling distribution at the root and every node
    (branch-major); ``drafts[B, K, gamma]`` and ``q[B, K, gamma, V]``: the proposals and the
    distributions they were drawn from (one-hot for fixed proposals); ``key``: ``[B]`` keys.
    """
    b, k, gamma = drafts.shape
    keys = jax.vmap(lambda kk: jax.random.split(kk, 2))(key)
    u = jax.vmap(lambda kk: jax.random.uniform(kk, (gamma, k)))(keys[:, 0])
    alive = jnp.ones((b, k), bool)
    running = jnp.ones((b,), bool)
    branch = jnp.zeros((b,), jnp.int32)
    accepted = jnp.zeros((b,), jnp.int32)
    p_cur = p[:, 0]
    for i in range(gamma):
        taken = jnp.zeros((b,), bool)
        for c in range(k):
            x = drafts[:, c, i]
            qc = q[:, c, i]
            ratio = _pick(p_cur, x) / jnp.maximum(_pick(qc, x), 1e-30)
            trying = running & alive[:, c] & ~taken
            accept = trying & (u[:, i, c] < ratio)
            residual = jnp.maximum(p_cur - qc, 0.0)
            mass = residual.sum(-1, keepdims=True)
            reject = (trying & ~accept)[:, None] & (mass > 0)
            p_cur = jnp.where(reject, residual / jnp.where(mass > 0, mass, 1.0), p_cur)
            taken |= accept
            branch = jnp.where(accept, c, branch)
        chosen = _pick(drafts[:, :, i], branch)
        alive &= drafts[:, :, i] == chosen[:, None]
        accepted += taken
        p_cur = jnp.where(taken[:, None], _pick(p, 1 + branch * gamma + i), p_cur)
        running &= taken
    final = jax.vmap(jax.random.categorical)(keys[:, 1], jnp.log(p_cur)).astype(jnp.int32)
    return Verdict(accepted, branch, final)


def _repeat(tree, k: int):
    return jax.tree.map(lambda a: jnp.repeat(a, k, axis=0), tree)


class _Draft(NamedTuple):
    tokens: jax.Array  # [B, K, gamma]
    q: jax.Array  # [B, K, gamma, V]
    cache: object


def _model_drafts(
    draft_params,
    draft_config,
    cache,
    root,
    start,
    write,
    arrays,
    counts,
    prompt_counts,
    keys,
    *,
    branches: int,
    gamma: int,
    eos_id,
):
    """``gamma`` draft tokens per chain from the draft model, plus one step to cache the last one.

    Rows are ``B * branches`` (chain-major within each prompt).  Sampled rows draw i.i.d. chains;
    greedy rows start chain ``c`` from the draft's ``c``-th most likely token.
    """
    b = root.shape[0]
    arrays_k, start_k = _repeat(arrays, branches), _repeat(start, branches)
    prompt_k = None if prompt_counts is None else _repeat(prompt_counts, branches)
    greedy = arrays_k.temperature == 0
    rank = jnp.tile(jnp.arange(branches), b)
    keys_k = jax.vmap(jax.random.fold_in)(_repeat(keys, branches), rank)

    def step(carry, i):
        cache, tok, counts = carry
        logits, _, cache = extend_logits(
            draft_params, draft_config, cache, tok[:, None], start_k, _repeat(write, branches) + i
        )
        f = filtered_logits(logits[:, 0], arrays_k, counts, prompt_counts=prompt_k, eos_id=eos_id)
        step_keys = jax.vmap(jax.random.fold_in)(keys_k, jnp.full_like(rank, i))
        sampled = jax.vmap(jax.random.categorical)(step_keys, f).astype(jnp.int32)
        ranked = jax.lax.top_k(apply_penalties(logits[:, 0], arrays_k, counts, prompt_k), branches)[
            1
        ]
        first = jnp.take_along_axis(ranked, rank[:, None], axis=1)[:, 0].astype(jnp.int32)
        new = jnp.where(greedy & (i == 0), first, sampled)
        q = jnp.where(greedy[:, None], jax.nn.one_hot(new, f.shape[-1]), jax.nn.softmax(f, axis=-1))
        counts = None if counts is None else counts.at[jnp.arange(new.shape[0]), new].add(1)
        return (cache, new, counts), (new, q)

    counts_k = None if counts is None else _repeat(counts, branches)
    (cache, _, _), (tokens, q) = jax.lax.scan(
        step, (cache, _repeat(root, branches), counts_k), jnp.arange(gamma + 1)
    )
    v = q.shape[-1]
    tokens = jnp.moveaxis(tokens[:gamma], 0, 1).reshape(b, branches, gamma)
    q = jnp.moveaxis(q[:gamma], 0, 1).reshape(b, branches, gamma, v)
    return _Draft(tokens, q, cache)


def node_distributions(logits, block, on_path, arrays, counts, prompt_counts, *, eos_id):
    """The target's sampling distribution (as filtered logits ``[B, T, V]``) at every node of a
    verified block ``block[B, T]``: penalties count each node's path, ``on_path[T, T]`` (or
    ``[B, T, T]``: node t's ancestors, the root excluded, which is already in ``counts``)."""
    b, t, v = logits.shape
    node_counts = None
    if counts is not None:
        node_counts = counts[:, None] + jnp.einsum(
            "btu,buv->btv",
            jnp.broadcast_to(on_path, (b, t, t)),
            jax.nn.one_hot(block, v, dtype=jnp.int32),
        )
    flat = filtered_logits(
        logits.reshape(b * t, v),
        _repeat(arrays, t),
        None if counts is None else node_counts.reshape(b * t, v),
        prompt_counts=None if prompt_counts is None else _repeat(prompt_counts, t),
        eos_id=eos_id,
    )
    return flat.reshape(b, t, v)


def start_emission(
    prompts: PromptBatch, vocab: int, max_len: int, width: int, *, track_counts, pad_id
):
    """``(Emission, prompt_counts)`` before the first round: ``seq`` holds the prompts in
    ``max_len`` slots, the output ``width`` columns (``max_new`` plus a round's overshoot)."""
    b, p = prompts.tokens.shape
    seq = jnp.zeros((b, max_len), jnp.int32).at[:, :p].set(prompts.tokens)
    prompt_counts = count_tokens(prompts.tokens, vocab, prompts.real) if track_counts else None
    counts = jnp.zeros((b, vocab), jnp.int32) if track_counts else None
    out = GenerationResult(
        jnp.full((b, width), pad_id, jnp.int32),
        jnp.zeros((b,), jnp.int32),
        jnp.zeros((b, width)),
        jnp.zeros((b, width)),
    )
    zeros = jnp.zeros((b,), jnp.int32)
    return Emission(seq, counts, jnp.zeros((b,), bool), out, zeros, zeros), prompt_counts


def speculative_result(final: Emission, max_new: int, depth: int) -> SpeculativeResult:
    """The loop's outcome, cut to ``max_new`` columns; ``depth`` drafts offered per pass."""
    out = GenerationResult(*(a[:, :max_new] if a.ndim == 2 else a for a in final.out[:4]))
    return SpeculativeResult(out, final.steps, final.steps * depth, final.accepted)


class Emission(NamedTuple):
    """What a speculative decoding loop carries besides its caches."""

    seq: jax.Array  # [B, S] every row's tokens at their slots
    counts: jax.Array | None  # [B, V] generated-token counts (penalties)
    done: jax.Array  # [B]
    out: GenerationResult
    steps: jax.Array  # [B] verification passes
    accepted: jax.Array  # [B] accepted draft tokens


def record_round(
    state: Emission, path, final, node, n, logits, filtered, arrays, length, *, eos_id, pad_id
) -> Emission:
    """Appends a round's ``n + 1`` tokens (the first ``n`` drafts of the accepted ``path[B,
    G - 1]``, then the correction or bonus token ``final[B]``; drawn at block nodes ``node[B,
    G]``) to each row that is not done: up to its first stop token and within ``max_tokens``,
    with their log-probabilities under the filtered (sampling) and the raw distribution."""
    seq, counts, done, out, steps, accepted = state
    b, width = node.shape
    rows, k = jnp.arange(b), jnp.arange(width)[None, :]
    emitted = jnp.where(k < n[:, None], jnp.pad(path, ((0, 0), (0, 1))), final[:, None])

    def logprob(z):
        at_node = jnp.take_along_axis(jax.nn.log_softmax(z), node[:, :, None], 1)
        return jnp.take_along_axis(at_node, emitted[:, :, None], 2)[..., 0]

    sample_lp, raw_lp = logprob(filtered), logprob(logits)
    # How many of the n + 1 tokens count: up to the first stop token and within max_tokens.
    stops = is_stop(emitted.reshape(-1), _repeat(arrays, width), eos_id).reshape(b, width)
    stops &= k <= n[:, None]
    first_stop = jnp.where(stops.any(-1), jnp.argmax(stops, -1) + 1, width + 1)
    room = arrays.max_tokens - out.lengths
    keep = jnp.where(done, 0, jnp.minimum(jnp.minimum(n + 1, first_stop), room))
    slot = out.lengths[:, None] + k
    kept = k < keep[:, None]
    out = GenerationResult(
        out.tokens.at[rows[:, None], slot].set(jnp.where(kept, emitted, pad_id), mode="drop"),
        out.lengths + keep,
        out.sample_logprobs.at[rows[:, None], slot].set(
            jnp.where(kept, sample_lp, 0.0), mode="drop"
        ),
        out.raw_logprobs.at[rows[:, None], slot].set(jnp.where(kept, raw_lp, 0.0), mode="drop"),
    )
    seq = seq.at[rows[:, None], length[:, None] + k].set(emitted, mode="drop")
    if counts is not None:
        counts = counts + jnp.einsum(
            "bk,bkv->bv",
            kept.astype(jnp.int32),
            jax.nn.one_hot(emitted, counts.shape[-1], dtype=jnp.int32),
        )
    steps += ~done
    accepted += jnp.where(done, 0, n)
    done = done | (first_stop <= keep) | (out.lengths >= arrays.max_tokens)
    return Emission(seq, counts, done, out, steps, accepted)


@functools.partial(
    jax.jit,
    static_argnames=(
        "config",
        "draft_config",
        "gamma",
        "branches",
        "max_ngram",
        "max_new",
        "eos_id",
        "pad_id",
        "track_counts",
    ),
)
def _speculative(
    params,
    config: TransformerConfig,
    draft_params,
    draft_config,
    prompts: PromptBatch,
    arrays: SamplingArrays,
    key,
    *,
    gamma: int,
    branches: int,
    max_ngram: int,
    max_new: int,
    eos_id,
    pad_id: int,
    track_counts: bool,
) -> SpeculativeResult:
    b, p = prompts.tokens.shape
    v = config.vocab_size
    nodes = 1 + branches * gamma
    max_len = p + max_new + nodes
    # The last prompt token is each round's root, so the caches hold everything before it.
    before_root = PromptBatch(prompts.tokens, prompts.start, prompts.end - 1)
    cache = run_prefill(params, config, before_root, max_len).cache
    draft_cache = None
    if draft_config is not None:
        draft_cache = reorder_rows(
            run_prefill(draft_params, draft_config, before_root, max_len).cache,
            jnp.repeat(jnp.arange(b), branches),
        )
    init, prompt_counts = start_emission(
        prompts, v, max_len, max_new + gamma + 1, track_counts=track_counts, pad_id=pad_id
    )
    tree = draft_tree(branches, gamma)
    on_path = tree.ancestors.astype(jnp.int32)  # node n's path from the root, root excluded below
    on_path = on_path.at[:, 0].set(0)
    rows = jnp.arange(b)
    zeros = jnp.zeros((b,), jnp.int32)

    def cond(carry):
        return ~carry[-4].all()

    def body(carry):
        cache, draft_cache, seq, counts, done, out, steps, accepted = carry
        length = prompts.end + out.lengths  # the root sits at slot length - 1
        write = length - 1
        root = seq[rows, write]
        keys = row_keys(key, arrays, out.lengths)
        if draft_config is None:
            drafts = ngram_drafts(
                seq, prompts.start, length, max_ngram=max_ngram, gamma=gamma, branches=branches
            )
            q = jax.nn.one_hot(drafts, v)
        else:
            drafted = _model_drafts(
                draft_params,
                draft_config,
                draft_cache,
                root,
                prompts.start,
                write,
                arrays,
                counts,
                prompt_counts,
                jax.vmap(jax.random.fold_in)(keys, jnp.ones_like(zeros)),
                branches=branches,
                gamma=gamma,
                eos_id=eos_id,
            )
            drafts, q, draft_cache = drafted
        block = jnp.concatenate([root[:, None], drafts.reshape(b, -1)], axis=1)
        logits, _, cache = extend_logits(params, config, cache, block, prompts.start, write, tree)
        filtered = node_distributions(
            logits, block, on_path, arrays, counts, prompt_counts, eos_id=eos_id
        )
        verdict = verify(
            jax.nn.softmax(filtered, axis=-1),
            drafts,
            q,
            jax.vmap(jax.random.fold_in)(keys, jnp.full_like(zeros, 2)),
        )
        n = verdict.accepted
        # Emitted: n drafts along the chosen chain, then the correction/bonus token.
        k = jnp.arange(gamma + 1)[None, :]
        node = jnp.where(k == 0, 0, 1 + verdict.branch[:, None] * gamma + k - 1)
        emit = record_round(
            Emission(seq, counts, done, out, steps, accepted),
            _pick(drafts, verdict.branch),
            verdict.final,
            node,
            n,
            logits,
            filtered,
            arrays,
            length,
            eos_id=eos_id,
            pad_id=pad_id,
        )
        if branches > 1:
            src = length[:, None] + verdict.branch[:, None] * gamma + jnp.arange(gamma)[None, :]
            cache = move_slots(cache, src, length[:, None] + jnp.arange(gamma)[None, :])
            if draft_cache is not None:
                draft_cache = reorder_rows(
                    draft_cache, jnp.repeat(rows * branches + verdict.branch, branches)
                )
        return (cache, draft_cache, *emit)

    final = Emission(*jax.lax.while_loop(cond, body, (cache, draft_cache, *init))[2:])
    return speculative_result(final, max_new, gamma)


def speculative_generate(
    params,
    config: TransformerConfig,
    prompts,
    *,
    sampling: SamplingParams | Sequence[SamplingParams],
    key,
    gamma: int = 4,
    branches: int = 1,
    draft_params=None,
    draft_config: TransformerConfig | None = None,
    max_ngram: int = 3,
    eos_id: int | None = None,
    pad_id: int = 0,
    padding: str = "left",
) -> SpeculativeResult:
    """Samples like ``generate`` but ``gamma`` (times ``branches``) drafts at a time.

    With ``draft_params``/``draft_config`` a draft model proposes; without, prompt lookup with
    n-grams up to ``max_ngram``.  The draft model must share the target's vocabulary.
    """
    if (draft_params is None) != (draft_config is None):
        raise ValueError("pass both draft_params and draft_config, or neither (prompt lookup)")
    if draft_config is not None and draft_config.vocab_size != config.vocab_size:
        raise ValueError(
            f"draft vocab {draft_config.vocab_size} != target vocab {config.vocab_size}"
        )
    if gamma < 1 or branches < 1:
        raise ValueError(f"need gamma >= 1 and branches >= 1; got {gamma}, {branches}")
    if draft_config is not None and branches > config.vocab_size:
        raise ValueError(
            f"branches={branches} exceeds vocab_size={config.vocab_size}: greedy rows "
            "start each draft chain from a different token"
        )
    prompts = as_prompt_batch(prompts, padding=padding, pad_id=pad_id, vocab_size=config.vocab_size)
    arrays = sampling_arrays(sampling, prompts.tokens.shape[0])
    return _speculative(
        params,
        config,
        draft_params,
        draft_config,
        prompts,
        arrays,
        key,
        gamma=gamma,
        branches=branches,
        max_ngram=max_ngram,
        max_new=max_tokens(sampling),
        eos_id=eos_id,
        pad_id=pad_id,
        track_counts=uses_counts(sampling),
    )
