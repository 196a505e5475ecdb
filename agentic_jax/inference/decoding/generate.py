"""Sampling with a KV cache: one prefill pass over the prompts, then a jitted ``lax.while_loop``.

Per step the loop samples one token per row from the last logits (``sampling.sample``: penalties,
constraint mask, temperature, top-k/top-p/min-p), records it with its log-probabilities under the
sampling distribution and under the raw model, checks the row's stop rule (EOS, a stop token id,
``max_tokens``) and runs the new tokens through the cache (``kv_cache.extend``, one token per row).
The loop ends when every row has stopped or after ``max(max_tokens)`` tokens.

Stop strings are matched on the host after the loop (:func:`truncate_at_stop_strings`): decoding
each prefix and cutting at the first token whose text contains a stop string is exact whatever
tokenization the model chose, which in-loop token-sequence matching is not.  The price is that a
row stopped by a string runs on until its other stop rules end it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.data.chat import MessageLike, render_ids
from agentic_jax.data.tokenizer import IM_END, Tokenizer
from agentic_jax.inference.decoding.constrained import TokenConstraint
from agentic_jax.inference.decoding.kv_cache import (
    KVCache,
    LatentKVCache,
    extend_logits,
    init_cache,
    prefill,
    reorder_rows,
)
from agentic_jax.inference.decoding.prompts import PromptBatch, as_prompt_batch, is_stop
from agentic_jax.inference.decoding.sampling import (
    SamplingArrays,
    SamplingParams,
    add_tokens,
    count_tokens,
    sample,
)
from agentic_jax.inference.decoding.streaming import (
    StreamingCache,
    streaming_extend_logits,
    streaming_prefill,
)
from agentic_jax.models import TransformerConfig
from agentic_jax.models.transformer import logits_from_hidden


class GenerationResult(NamedTuple):
    """What a decoder returns; row ``b``'s tokens are ``tokens[b, :lengths[b]]`` (then ``pad_id``).

    ``sample_logprobs`` are log-probabilities under the distribution each token was drawn from
    (after penalties, temperature and truncation; 0 for greedy), ``raw_logprobs`` under the model's
    own softmax.  ``logits`` (raw, ``[B, N, V]``) only when asked for.  All three are 0 after
    ``lengths``.
    """

    tokens: jax.Array
    lengths: jax.Array
    sample_logprobs: jax.Array
    raw_logprobs: jax.Array
    logits: jax.Array | None = None


def sampling_arrays(
    sampling: SamplingParams | Sequence[SamplingParams], batch: int
) -> SamplingArrays:
    params = [sampling] * batch if isinstance(sampling, SamplingParams) else list(sampling)
    return SamplingArrays.from_params(params, batch)


def uses_counts(sampling: SamplingParams | Sequence[SamplingParams]) -> bool:
    """Whether any row has a penalty, so the decoder must track token counts."""
    params = [sampling] if isinstance(sampling, SamplingParams) else sampling
    return any(
        p.repetition_penalty != 1 or p.frequency_penalty or p.presence_penalty for p in params
    )


def max_tokens(sampling: SamplingParams | Sequence[SamplingParams]) -> int:
    params = [sampling] if isinstance(sampling, SamplingParams) else sampling
    return max(p.max_tokens for p in params)


class PrefillState(NamedTuple):
    cache: KVCache | LatentKVCache
    write: jax.Array  # [B] next free slot
    logits: jax.Array  # [B, V] next-token logits
    hidden: jax.Array  # [B, P, D] final hidden states of the prompt


def run_prefill(
    params,
    config: TransformerConfig,
    prompts: PromptBatch,
    max_len: int,
    streaming: StreamingCache | None = None,
) -> PrefillState:
    """Prefill into a fresh cache of ``max_len`` slots; logits at each row's last prompt token.

    With ``streaming`` the cache is that policy's ring (``max_len`` must be ``streaming.slots``)
    and ``write`` still counts each row's padded slots, so ``write - start`` is its length.
    """
    b = prompts.tokens.shape[0]
    cache = init_cache(config, b, max_len)
    run = prefill if streaming is None else functools.partial(streaming_prefill, policy=streaming)
    h, cache = run(params, config, cache, prompts.tokens, prompts.start, prompts.end)
    last = jnp.take_along_axis(h, (prompts.end - 1)[:, None, None], axis=1)
    return PrefillState(cache, prompts.end, logits_from_hidden(params, config, last)[:, 0], h)


@functools.partial(
    jax.jit,
    static_argnames=(
        "config",
        "max_new",
        "eos_id",
        "pad_id",
        "track_counts",
        "return_logits",
        "streaming",
    ),
)
def _generate(
    params,
    config: TransformerConfig,
    prompts: PromptBatch,
    arrays: SamplingArrays,
    key,
    constraint: TokenConstraint | None,
    fork,
    *,
    max_new: int,
    eos_id: int | None,
    pad_id: int,
    track_counts: bool,
    return_logits: bool,
    streaming: StreamingCache | None,
) -> GenerationResult:
    v = config.vocab_size
    if streaming is None:
        max_len, extend = prompts.tokens.shape[1] + max_new, extend_logits
    else:
        max_len, extend = (
            streaming.slots,
            functools.partial(streaming_extend_logits, policy=streaming),
        )
    pre = run_prefill(params, config, prompts, max_len, streaming)
    if fork is not None:  # every row continues its prompt's prefill
        pre = PrefillState(reorder_rows(pre.cache, fork), pre.write[fork], pre.logits[fork], None)
        prompts = PromptBatch(prompts.tokens[fork], prompts.start[fork], prompts.end[fork])
    b = prompts.tokens.shape[0]
    prompt_counts = count_tokens(prompts.tokens, v, prompts.real) if track_counts else None
    out = GenerationResult(
        jnp.full((b, max_new), pad_id, jnp.int32),
        jnp.zeros((b,), jnp.int32),
        jnp.zeros((b, max_new)),
        jnp.zeros((b, max_new)),
        jnp.zeros((b, max_new, v)) if return_logits else None,
    )
    state = None if constraint is None else jnp.full((b,), constraint.initial, jnp.int32)
    counts = jnp.zeros((b, v), jnp.int32) if track_counts else None
    init = (0, pre.cache, pre.write, pre.logits, jnp.zeros((b,), bool), out, counts, state)

    def cond(carry):
        t, done = carry[0], carry[4]
        return (t < max_new) & ~done.all()

    def body(carry):
        t, cache, write, logits, done, out, counts, state = carry
        allowed = None if constraint is None else constraint.allowed[state]
        s = sample(
            logits,
            key,
            arrays,
            counts,
            step=t,
            prompt_counts=prompt_counts,
            allowed=allowed,
            eos_id=eos_id,
        )
        active = ~done
        tok = jnp.where(active, s.tokens, pad_id)
        lengths = out.lengths + active
        out = GenerationResult(
            out.tokens.at[:, t].set(tok),
            lengths,
            out.sample_logprobs.at[:, t].set(jnp.where(active, s.sample_logprobs, 0.0)),
            out.raw_logprobs.at[:, t].set(jnp.where(active, s.raw_logprobs, 0.0)),
            None
            if out.logits is None
            else out.logits.at[:, t].set(jnp.where(active[:, None], logits, 0.0)),
        )
        done = done | (active & (is_stop(tok, arrays, eos_id) | (lengths >= arrays.max_tokens)))
        if counts is not None:
            counts = add_tokens(counts, tok, active)
        if state is not None:
            state = jnp.where(active, constraint.next_state[state, tok], state)

        def advance(cache):
            new_logits, _, cache = extend(params, config, cache, tok[:, None], prompts.start, write)
            return new_logits[:, 0], cache

        logits, cache = jax.lax.cond(
            (t + 1 < max_new) & ~done.all(), advance, lambda cache: (logits, cache), cache
        )
        return t + 1, cache, write + 1, logits, done, out, counts, state

    return jax.lax.while_loop(cond, body, init)[5]


def generate(
    params,
    config: TransformerConfig,
    prompts,
    *,
    sampling: SamplingParams | Sequence[SamplingParams],
    key,
    eos_id: int | None = None,
    pad_id: int = 0,
    padding: str = "left",
    constraint: TokenConstraint | None = None,
    return_logits: bool = False,
    fork=None,
    streaming: StreamingCache | None = None,
) -> GenerationResult:
    """Samples a continuation of each prompt with a KV cache.

    ``prompts``: a :class:`PromptBatch`, an unpadded ``[B, P]`` array or token lists (padded on the
    ``padding`` side).  ``sampling``: one ``SamplingParams`` for all rows or one per row; the result
    has ``max(max_tokens)`` columns.  ``eos_id`` ends a row and is never truncated away by top-k/p
    or min-p; ``constraint`` masks tokens by a grammar automaton (see ``constrained.py``).  Stop
    strings are not applied here (they need a tokenizer): see :func:`truncate_at_stop_strings`.

    ``fork`` (int ``[R]``, prompt rows) samples ``R`` continuations, row ``r`` of prompt
    ``fork[r]``, from one prefill per prompt: the prompt's KV cache is shared by the rows forked
    from it (many samples of one prompt, the children of one search node) and the result equals
    ``generate`` on the prompts repeated as ``fork`` says.

    ``streaming`` (a :class:`~agentic_jax.inference.decoding.streaming.StreamingCache`) bounds
    the cache to ``sink_tokens + window`` slots, the first tokens and a rolling window of the
    latest (StreamingLLM), so prompts and generations may be longer than the cache; by default
    the cache holds every prompt and generated token.
    """
    if streaming is not None and not isinstance(streaming, StreamingCache):
        raise TypeError(
            f"streaming must be a StreamingCache(sink_tokens=..., window=...) or None, "
            f"got {type(streaming).__name__}"
        )
    prompts = as_prompt_batch(prompts, padding=padding, pad_id=pad_id, vocab_size=config.vocab_size)
    if fork is not None:
        fork = jnp.asarray(fork, jnp.int32)
        if fork.ndim != 1 or fork.size == 0:
            raise ValueError(f"fork must be a non-empty 1-D array of prompt rows, got {fork.shape}")
        if int(fork.min()) < 0 or int(fork.max()) >= prompts.tokens.shape[0]:
            raise ValueError(f"fork names prompt rows outside [0, {prompts.tokens.shape[0]})")
    rows = prompts.tokens.shape[0] if fork is None else fork.shape[0]
    arrays = sampling_arrays(sampling, rows)
    if constraint is not None and constraint.allowed.shape[1] != config.vocab_size:
        raise ValueError(
            f"constraint tables cover {constraint.allowed.shape[1]} tokens; the model "
            f"has {config.vocab_size} (pass vocab_size to token_bytes)"
        )
    return _generate(
        params,
        config,
        prompts,
        arrays,
        key,
        constraint,
        fork,
        max_new=max_tokens(sampling),
        eos_id=eos_id,
        pad_id=pad_id,
        track_counts=uses_counts(sampling),
        return_logits=return_logits,
        streaming=streaming,
    )


def stop_string_length(
    tokenizer: Tokenizer, tokens: Sequence[int], stop_strings: Sequence[str]
) -> int | None:
    """Tokens up to the one whose text completes the first stop string, or ``None`` if none does."""
    if not stop_strings:
        return None
    for n in range(1, len(tokens) + 1):
        text = tokenizer.decode(tokens[:n])
        if any(s in text for s in stop_strings):
            return n
    return None


def truncate_at_stop_strings(
    result: GenerationResult,
    tokenizer: Tokenizer,
    sampling: SamplingParams | Sequence[SamplingParams],
    pad_id: int = 0,
) -> GenerationResult:
    """Cuts each row after the token that completes one of its ``stop_strings`` (host-side)."""
    b = result.tokens.shape[0]
    params = [sampling] * b if isinstance(sampling, SamplingParams) else list(sampling)
    tokens, lengths = np.array(result.tokens), np.array(result.lengths)
    for row, p in enumerate(params):
        cut = stop_string_length(tokenizer, tokens[row, : lengths[row]].tolist(), p.stop_strings)
        if cut is not None:
            lengths[row] = cut
    keep = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    keep_j = jnp.asarray(keep)
    return GenerationResult(
        jnp.asarray(np.where(keep, tokens, pad_id)),
        jnp.asarray(lengths),
        jnp.where(keep_j, result.sample_logprobs, 0.0),
        jnp.where(keep_j, result.raw_logprobs, 0.0),
        None if result.logits is None else jnp.where(keep_j[..., None], result.logits, 0.0),
    )


class TextGeneration(NamedTuple):
    texts: list[str]
    result: GenerationResult


def completion_text(
    tokenizer: Tokenizer, tokens: Sequence[int], stop_strings: Sequence[str]
) -> str:
    """Decoded completion without special tokens, cut before the first stop string."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cuts = [text.find(s) for s in stop_strings if s in text]
    return text[: min(cuts)] if cuts else text


def generate_text(
    params,
    config: TransformerConfig,
    tokenizer: Tokenizer,
    prompts: Sequence[str] | Sequence[Sequence[MessageLike]],
    *,
    sampling: SamplingParams | Sequence[SamplingParams],
    key,
    add_bos: bool = True,
    constraint: TokenConstraint | None = None,
) -> TextGeneration:
    """Completes strings, or conversations rendered with the ChatML template and a generation prompt.

    Plain strings end at the tokenizer's EOS; conversations at ``<|im_end|>`` (or EOS).  Texts
    exclude special tokens and stop strings.
    """
    chat = not isinstance(prompts[0], str)
    if chat:
        ids = [
            render_ids(m, tokenizer, add_generation_prompt=True, add_bos=add_bos).ids.tolist()
            for m in prompts
        ]
        eos_id = tokenizer.token_id(IM_END)
    else:
        ids = tokenizer.encode_batch(prompts, add_bos=add_bos)
        eos_id = tokenizer.eos_id
    params_list = [sampling] * len(ids) if isinstance(sampling, SamplingParams) else list(sampling)
    if chat and tokenizer.eos_id is not None:
        params_list = [
            dataclasses.replace(p, stop_token_ids=p.stop_token_ids + (tokenizer.eos_id,))
            for p in params_list
        ]
    pad_id = tokenizer.pad_id or 0
    result = generate(
        params,
        config,
        ids,
        sampling=params_list,
        key=key,
        eos_id=eos_id,
        pad_id=pad_id,
        constraint=constraint,
    )
    result = truncate_at_stop_strings(result, tokenizer, params_list, pad_id)
    tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
    texts = [
        completion_text(tokenizer, tokens[b, : lengths[b]].tolist(), p.stop_strings)
        for b, p in enumerate(params_list)
    ]
    return TextGeneration(texts, result)
