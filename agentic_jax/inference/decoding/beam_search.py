"""Beam search over a KV cache, with a length penalty, early stopping and n-best lists.

The alive/finished formulation (Wu et al. 2016, GNMT; as in tensor2tensor and t5x): each step
extends the ``W`` alive beams of every prompt by every token, keeps the ``2W`` best extensions by
summed log-probability (at most ``W`` of them end in EOS, so ``W`` unfinished ones remain), moves
those ending in EOS — and at the last step all of them — to the finished set, scored

    score = sum log p / length ** length_penalty      (length: generated tokens, EOS included)

and keeps the ``W`` best finished hypotheses.  The cache rows follow their beams by a gather.

Stopping: with ``early_stopping`` a prompt is done as soon as it has ``W`` finished hypotheses
(Hugging Face's ``early_stopping=True``); without, when no alive beam can still beat the worst
finished one.  Log-probabilities only fall as a beam grows, so an alive beam's best reachable
score is its sum over ``max_len ** penalty`` (penalty > 0) or over its next length (penalty <= 0).
A done prompt takes no more hypotheses while the rest of the batch runs on, so its result does not
depend on the batch.
With ``W`` at least ``V ** (N - 1)`` nothing is ever pruned and the result is the exact n-best list.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.inference.decoding.generate import run_prefill
from agentic_jax.inference.decoding.kv_cache import extend_logits, reorder_rows
from agentic_jax.inference.decoding.prompts import PromptBatch, as_prompt_batch
from agentic_jax.models import TransformerConfig

NEG_INF = -jnp.inf


class BeamResult(NamedTuple):
    """The ``W`` best hypotheses per prompt, best first: ``tokens[B, W, N]`` (``pad_id`` after
    ``lengths[B, W]``), length-penalised ``scores[B, W]`` and summed ``logprobs[B, W]``."""

    tokens: jax.Array
    lengths: jax.Array
    scores: jax.Array
    logprobs: jax.Array


def _penalised(logprobs, lengths, length_penalty: float):
    return logprobs / jnp.power(jnp.asarray(lengths, jnp.float32), length_penalty)


def _top(scores, width, *arrays):
    """The ``width`` best entries along axis 1 and the matching entries of ``arrays``."""
    scores, idx = jax.lax.top_k(scores, width)
    return (scores,) + tuple(
        jnp.take_along_axis(a, idx.reshape(idx.shape + (1,) * (a.ndim - 2)), axis=1) for a in arrays
    )


@functools.partial(
    jax.jit,
    static_argnames=(
        "config",
        "width",
        "max_new",
        "eos_id",
        "pad_id",
        "length_penalty",
        "early_stopping",
    ),
)
def _beam_search(
    params,
    config: TransformerConfig,
    prompts: PromptBatch,
    *,
    width: int,
    max_new: int,
    eos_id: int | None,
    pad_id: int,
    length_penalty: float,
    early_stopping: bool,
) -> BeamResult:
    b, w, n, v = prompts.tokens.shape[0], width, max_new, config.vocab_size
    pre = run_prefill(params, config, prompts, prompts.tokens.shape[1] + max_new)
    fork = jnp.repeat(jnp.arange(b), w)
    cache = reorder_rows(pre.cache, fork)
    start, write = prompts.start[fork], pre.write[fork]
    logits = pre.logits[fork]
    alive_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (w - 1)), (b, 1))
    alive_seq = jnp.full((b, w, n), pad_id, jnp.int32)
    fin = (
        jnp.full((b, w), NEG_INF),
        jnp.full((b, w), NEG_INF),
        jnp.full((b, w, n), pad_id, jnp.int32),
        jnp.zeros((b, w), jnp.int32),
    )  # scores, log-probs, tokens, lengths

    def settled(t, alive_lp, fin_scores):
        """``[B]``: the prompt's finished set is final (it takes no more hypotheses)."""
        if early_stopping:
            final = fin_scores[:, -1] > NEG_INF
        else:
            # Alive beams hold t + 1 tokens, so their next length is t + 2.
            best_alive = _penalised(
                alive_lp[:, 0], n if length_penalty > 0 else t + 2, length_penalty
            )
            final = fin_scores[:, -1] >= best_alive
        return final | (alive_lp[:, 0] == NEG_INF)

    def cond(carry):
        t, done = carry[0], carry[1]
        return (t < n) & ~done.all()

    def body(carry):
        t, done, cache, write, logits, alive_lp, alive_seq, fin = carry
        logp = jax.nn.log_softmax(logits, axis=-1).reshape(b, w, v)
        flat = (alive_lp[:, :, None] + logp).reshape(b, w * v)
        cand_lp, idx = jax.lax.top_k(flat, 2 * w)
        beam, tok = idx // v, (idx % v).astype(jnp.int32)
        seq = jnp.take_along_axis(alive_seq, beam[:, :, None], axis=1).at[:, :, t].set(tok)
        ends = (tok == eos_id) if eos_id is not None else jnp.zeros_like(tok, bool)
        # A done prompt's finished set is final, whatever the rest of the batch still does.
        finishing = (ends | (t + 1 == n)) & ~done[:, None]
        fin_scores = jnp.where(finishing, _penalised(cand_lp, t + 1, length_penalty), NEG_INF)
        fin = _top(
            jnp.concatenate([fin[0], fin_scores], 1),
            w,
            jnp.concatenate([fin[1], cand_lp], 1),
            jnp.concatenate([fin[2], seq], 1),
            jnp.concatenate([fin[3], jnp.full_like(tok, t + 1)], 1),
        )
        alive_lp, alive_seq, beam, tok = _top(jnp.where(ends, NEG_INF, cand_lp), w, seq, beam, tok)
        rows = (jnp.arange(b)[:, None] * w + beam).reshape(-1)
        cache = reorder_rows(cache, rows)
        logits, _, cache = extend_logits(params, config, cache, tok.reshape(-1, 1), start, write)
        done = done | settled(t, alive_lp, fin[0])
        return t + 1, done, cache, write + 1, logits[:, 0], alive_lp, alive_seq, fin

    init = (0, jnp.zeros((b,), bool), cache, write, logits, alive_lp, alive_seq, fin)
    fin = jax.lax.while_loop(cond, body, init)[-1]
    scores, logprobs, tokens, lengths = fin
    return BeamResult(tokens, lengths, scores, logprobs)


def beam_search(
    params,
    config: TransformerConfig,
    prompts,
    *,
    width: int,
    max_new_tokens: int,
    eos_id: int | None = None,
    pad_id: int = 0,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    num_return: int | None = None,
    padding: str = "left",
) -> BeamResult:
    """The ``num_return`` (default ``width``) best continuations of each prompt, best first.

    ``prompts`` as for ``generate``; ``eos_id`` ends hypotheses (``None``: all run ``max_new_tokens``).
    """
    if width < 1 or max_new_tokens < 1:
        raise ValueError(f"need width >= 1 and max_new_tokens >= 1; got {width}, {max_new_tokens}")
    if not 1 <= (num_return or width) <= width:
        raise ValueError(f"num_return={num_return} must be in [1, width={width}]")
    prompts = as_prompt_batch(prompts, padding=padding, pad_id=pad_id, vocab_size=config.vocab_size)
    result = _beam_search(
        params,
        config,
        prompts,
        width=width,
        max_new=max_new_tokens,
        eos_id=eos_id,
        pad_id=pad_id,
        length_penalty=float(length_penalty),
        early_stopping=early_stopping,
    )
    k = num_return or width
    return BeamResult(*(a[:, :k] for a in result))
