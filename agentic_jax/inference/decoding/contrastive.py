"""Contrastive search (Su et al. 2022, *A Contrastive Framework for Neural Text Generation*).

A deterministic decoder that avoids greedy decoding's loops: among the ``k`` most likely next
tokens it picks

    x_t = argmax_{v in top-k}  (1 - alpha) p(v | x_<t)  -  alpha max_{j < t} cos(h_v, h_j)

where ``h`` are the model's final hidden states (``h_v`` of the candidate appended to the context,
``h_j`` of every earlier token, prompt included) and ``alpha`` is the degeneration penalty
(``alpha = 0`` is greedy decoding).

The ``k`` candidates run in one pass as siblings of a one-level tree (each sees the cache and
itself, see ``kv_cache.Tree``) written to slots ``write + [0, k)``; the chosen candidate's keys and
values move to slot ``write`` and its logits serve the next step, so each token costs one forward
of ``k`` tokens per row.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from agentic_jax.inference.decoding.generate import GenerationResult, run_prefill
from agentic_jax.inference.decoding.kv_cache import Tree, extend_logits, move_slots
from agentic_jax.inference.decoding.prompts import PromptBatch, as_prompt_batch
from agentic_jax.inference.decoding.sampling import token_logprobs
from agentic_jax.models import TransformerConfig


def _cosine_max(h, history, valid):
    """``max_j cos(h[b, c], history[b, j])`` over valid ``j``: ``[B, C]``."""

    def unit(x):
        x = x.astype(jnp.float32)
        return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, -1, keepdims=True), 1e-12))

    sims = jnp.einsum("bcd,bsd->bcs", unit(h), unit(history))
    return jnp.where(valid[:, None, :], sims, -jnp.inf).max(-1)


@functools.partial(jax.jit, static_argnames=("config", "top_k", "max_new", "eos_id", "pad_id"))
def _contrastive(
    params,
    config: TransformerConfig,
    prompts: PromptBatch,
    alpha,
    *,
    top_k: int,
    max_new: int,
    eos_id: int | None,
    pad_id: int,
) -> GenerationResult:
    b, p = prompts.tokens.shape
    max_len = p + max_new + top_k
    pre = run_prefill(params, config, prompts, max_len)
    history = (
        jnp.zeros((b, max_len, pre.hidden.shape[-1]), pre.hidden.dtype).at[:, :p].set(pre.hidden)
    )
    siblings = Tree(jnp.eye(top_k, dtype=bool), jnp.zeros((top_k,), jnp.int32))
    rows = jnp.arange(b)
    slot = jnp.arange(max_len)[None, :]
    out = GenerationResult(
        jnp.full((b, max_new), pad_id, jnp.int32),
        jnp.zeros((b,), jnp.int32),
        jnp.zeros((b, max_new)),
        jnp.zeros((b, max_new)),
    )

    def cond(carry):
        t, done = carry[0], carry[4]
        return (t < max_new) & ~done.all()

    def body(carry):
        t, cache, write, logits, done, history, out = carry
        probs = jax.nn.softmax(logits, axis=-1)
        cand_p, cand = jax.lax.top_k(probs, top_k)
        cand_logits, h, cache = extend_logits(
            params, config, cache, cand.astype(jnp.int32), prompts.start, write, siblings
        )
        valid = (slot >= prompts.start[:, None]) & (slot < write[:, None])
        score = (1 - alpha) * cand_p - alpha * _cosine_max(h, history, valid)
        best = jnp.argmax(score, axis=-1)
        tok = cand[rows, best].astype(jnp.int32)
        active = ~done
        tok = jnp.where(active, tok, pad_id)
        lengths = out.lengths + active
        out = GenerationResult(
            out.tokens.at[:, t].set(tok),
            lengths,
            out.sample_logprobs,
            out.raw_logprobs.at[:, t].set(jnp.where(active, token_logprobs(logits, tok), 0.0)),
        )
        if eos_id is not None:
            done = done | (active & (tok == eos_id))
        cache = move_slots(cache, (write + best)[:, None], write[:, None])
        history = history.at[rows, write].set(h[rows, best])
        return t + 1, cache, write + 1, cand_logits[rows, best], done, history, out

    init = (0, pre.cache, pre.write, pre.logits, jnp.zeros((b,), bool), history, out)
    return jax.lax.while_loop(cond, body, init)[-1]


def contrastive_search(
    params,
    config: TransformerConfig,
    prompts,
    *,
    alpha: float = 0.6,
    top_k: int = 4,
    max_new_tokens: int = 64,
    eos_id: int | None = None,
    pad_id: int = 0,
    padding: str = "left",
) -> GenerationResult:
    """Contrastive search continuations (``sample_logprobs`` are 0: the decoder is deterministic)."""
    if not 0 <= alpha <= 1 or not 1 <= top_k <= config.vocab_size:
        raise ValueError(
            f"need 0 <= alpha <= 1 and 1 <= top_k <= vocab_size={config.vocab_size}; "
            f"got {alpha}, {top_k}"
        )
    prompts = as_prompt_batch(prompts, padding=padding, pad_id=pad_id, vocab_size=config.vocab_size)
    return _contrastive(
        params,
        config,
        prompts,
        jnp.float32(alpha),
        top_k=top_k,
        max_new=max_new_tokens,
        eos_id=eos_id,
        pad_id=pad_id,
    )
