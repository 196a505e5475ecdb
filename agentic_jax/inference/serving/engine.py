"""A serving engine: paged KV cache, prefix caching and continuous batching behind a small API.

    engine = Engine(params, config, EngineConfig(num_slots=8), tokenizer=tok)
    done = engine.generate([Request(prompt_ids, SamplingParams(temperature=0))])
    for piece in stream_text(engine, Request(prompt_ids), tok):  # engine.stream: token events
        print(piece, end="", flush=True)

Each :meth:`Engine.step` is one scheduler iteration (``scheduler.py``): each newly admitted
sequence is prefilled (its uncached tokens in one pass, which also samples its first token), then
every other running sequence decodes one token in one batched call over ``num_slots`` rows.  The
device functions have fixed shapes (slots, page pool, block tables; prefill lengths rounded up to
powers of two), so they compile a handful of times; the host does the bookkeeping between steps,
as vLLM does.  Serve many callers by driving :meth:`Engine.step` and routing its events;
:meth:`Engine.generate` and :meth:`Engine.stream` drive it for one caller.

A request may carry a token constraint (a regex or JSON schema's automaton, walked on the host
and applied as a per-row logit mask) and a way to speculate (``prompt_lookup``, ``draft``,
``medusa`` or ``eagle``); both run inside the shared batch (``speculation.py``).

A request may ask for the ``top_logprobs`` (at most :data:`MAX_TOP_LOGPROBS`) likeliest tokens at
every step, under the raw model as ``logprobs`` are (the OpenAI API's ``top_logprobs``).  The
top-k is taken on the device, and only by steps whose batch holds such a request (a separate
compilation); a batch holding one does not speculate, since verification computes no top-k.

A request may also stream (``Request.streaming``, a ``decoding.streaming.StreamingCache``):
StreamingLLM's policy (Xiao et al. 2023) of attention sinks plus a recent window, exactly as
``generate(..., streaming=...)`` applies it (keys at their absolute positions, each query masked
to the first ``sink_tokens`` keys and the last ``window``).  Its blocks that hold neither sinks
nor any key of the window are given back to the pool as it generates, so it holds at most
``ceil(S / block_size) + ceil(W / block_size) + 1`` blocks once past its prompt (a prefill, and
the recompute after a preemption, first take blocks for every token).  Its length is still
capped by ``max_model_len``; it stays outside the prefix cache, cannot speculate, and any batch
holding it attends densely over the gathered pages (``paged_cache``).

Sampling is per sequence and independent of batching: row keys are the request's own (its seed,
or the engine seed folded with the request's arrival number) with the count of generated tokens
folded in, and penalty counts are kept per slot.  A request therefore produces the same tokens
alone, in any batch, and after being preempted and recomputed (a speculating request's greedy
tokens too; its sampled tokens have the same distribution, but where its rounds start depends on
the room the block pool leaves for drafts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import re
import time
from collections.abc import Iterable, Iterator
from collections.abc import Sequence as SequenceT
from typing import NamedTuple

import gin
import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.inference.decoding.constrained import TokenConstraint
from agentic_jax.inference.decoding.draft_heads import EagleHead, MedusaHeads, eagle_config
from agentic_jax.inference.decoding.prompts import check_token_ids
from agentic_jax.inference.decoding.sampling import (
    SamplingArrays,
    SamplingParams,
    add_tokens,
    sample,
)
from agentic_jax.inference.decoding.streaming import StreamingCache
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.block_manager import EVICTED, BlockManager
from agentic_jax.inference.serving.paged_cache import (
    PagedBatch,
    PagedKVCache,
    copy_blocks,
    decode_attention_fn,
    paged_hidden,
)
from agentic_jax.inference.serving.scheduler import Scheduler, Sequence
from agentic_jax.inference.serving.speculation import (
    SPECULATION,
    Heads,
    HeadState,
    HostConstraint,
    RowSampling,
    SpeculationStats,
    draft_step,
    eagle_step,
    follow_heads,
    lookup_drafts,
    medusa_drafts,
    mirror,
    verify_step,
)
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.transformer import logits_from_hidden

BATCHING = ("continuous", "static")
MAX_TOP_LOGPROBS = 20  # the OpenAI API's limit on top_logprobs
_GENERATED_ID = re.compile(r"req-\d+")  # the ids add_request gives requests without one


@gin.configurable
@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Capacity and policy of an :class:`Engine`.

    ``num_blocks`` defaults to enough for every slot to reach ``max_model_len`` (no preemption);
    fewer blocks trade preemptions for memory.  ``max_model_len`` (prompt plus output) defaults
    to the model's ``max_seq_len``.  ``watermark`` is the fraction of blocks that admission leaves
    free for running sequences to grow into.  ``decode_attention``: auto | pallas | reference (see
    ``paged_cache.decode_attention_fn``).  ``speculation_tokens``: the most draft tokens a
    speculating request proposes per step; ``max_ngram``: the longest n-gram prompt lookup
    matches.
    """

    num_slots: int = 8
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    watermark: float = 0.01
    batching: str = "continuous"
    decode_attention: str = "auto"
    min_prefill_len: int = 16
    seed: int = 0
    speculation_tokens: int = 4
    max_ngram: int = 3

    def __post_init__(self):
        names = ("num_slots", "block_size", "num_blocks", "max_model_len", "min_prefill_len")
        for name in (*names, "speculation_tokens", "max_ngram"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"EngineConfig.{name} must be positive, got {value}")
        if self.batching not in BATCHING:
            raise ValueError(f"EngineConfig.batching={self.batching!r}; expected one of {BATCHING}")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"EngineConfig.watermark must be in [0, 1), got {self.watermark}")


@dataclasses.dataclass(frozen=True)
class Request:
    """A prompt (token ids) and how to sample its continuation.  ``request_id`` must differ from
    every request in flight; ids ``req-<n>`` are reserved for those the engine generates.
    ``constraint`` masks every token to those its automaton allows; ``speculation``: ``none``,
    ``prompt_lookup``, ``draft`` (an engine with a draft model), ``medusa`` or ``eagle`` (an
    engine with that head).  ``streaming``: keep only attention sinks and a recent window of
    the KV cache (see the module docstring).  ``top_logprobs``: how many of the likeliest tokens
    (at most :data:`MAX_TOP_LOGPROBS`, and only without speculation) to report with each generated
    token."""

    prompt: SequenceT[int]
    params: SamplingParams = SamplingParams()
    request_id: str | None = None
    constraint: TokenConstraint | None = None
    speculation: str = "none"
    streaming: StreamingCache | None = None
    top_logprobs: int = 0


@dataclasses.dataclass(frozen=True)
class Completion:
    """A finished request.  ``finish_reason``: ``stop`` (EOS, a stop token or string) or ``length``
    (``max_tokens`` or ``max_model_len``).  Times are ``time.perf_counter()`` seconds."""

    request_id: str
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]  # of each token under the raw model
    sample_logprobs: tuple[float, ...]  # under the distribution each token was drawn from
    # per token, its request's top_logprobs likeliest (token, logprob) under the raw model
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]
    finish_reason: str
    cached_tokens: int  # prompt tokens served by the prefix cache
    preemptions: int
    wait_steps: int  # engine steps from arrival to first admission
    arrival_time: float
    first_token_time: float
    finish_time: float

    @property
    def time_to_first_token(self) -> float:
        return self.first_token_time - self.arrival_time


class StepOutput(NamedTuple):
    """One token of one request; ``completion`` is set on the request's last token.  ``index``
    is the token's place in the output; ``latency`` the seconds since the request's previous
    token, or since its arrival for the first (its time to first token)."""

    request_id: str
    token: int
    logprob: float
    completion: Completion | None
    top_logprobs: tuple[tuple[int, float], ...]  # as asked by the request: (token, logprob)
    index: int
    latency: float

    @property
    def finished(self) -> bool:
        return self.completion is not None


class EngineCounters(NamedTuple):
    """Totals since the engine was built, kept across :meth:`Engine.reset` (monitoring reads
    their increments).  Prompt tokens count once per request, at its first admission; the
    prefix cache's lookups count every admission, recomputes after a preemption too."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int = 0  # of which found there


def _top_logprobs(logits, k: int):
    """``(ids[B, k], logprobs[B, k])``: each row's ``k`` likeliest tokens under ``log_softmax``
    of the raw logits (as :func:`~agentic_jax.inference.decoding.sampling.token_logprobs`);
    ``None`` when ``k`` is 0."""
    if not k:
        return None
    values, ids = jax.lax.top_k(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), k)
    return ids, values


def _device_params(params: SamplingParams) -> SamplingParams:
    """What the device needs: stops are checked on the host (and would vary the array shapes)."""
    return dataclasses.replace(params, stop_token_ids=(), stop_strings=())


_IDLE = SamplingParams(temperature=0.0)


@functools.partial(
    jax.jit,
    static_argnames=("config", "draft_config", "decode_attention", "eos_id", "top_logprobs"),
    donate_argnames=("cache", "draft_cache", "head_state", "gen_counts", "prompt_counts"),
)
def _prefill_step(
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
    arrays,
    keys,
    steps,
    slot,
    prompt_row,
    gen_row,
    allowed,
    *,
    config,
    draft_config,
    decode_attention,
    eos_id,
    top_logprobs,
):
    """One sequence's uncached tokens ``[1, T]``; sets its slot's penalty counts."""
    hidden, cache = paged_hidden(
        params, config, cache, tokens, batch, decode_attention=decode_attention
    )
    logits = logits_from_hidden(params, config, hidden[:, -1:])[:, 0]
    draft_cache = mirror(draft_params, draft_config, draft_cache, tokens, batch, decode_attention)
    head_state = follow_heads(
        heads, params, config, head_state, tokens, batch, hidden, decode_attention, slot=slot
    )
    s = sample(
        logits,
        keys,
        arrays,
        gen_row[None],
        step=steps,
        prompt_counts=prompt_row[None],
        allowed=allowed,
        eos_id=eos_id,
    )
    gen_counts = gen_counts.at[slot].set(add_tokens(gen_row[None], s.tokens)[0])
    prompt_counts = prompt_counts.at[slot].set(prompt_row)
    top = _top_logprobs(logits, top_logprobs)
    return s, top, cache, draft_cache, head_state, gen_counts, prompt_counts


@functools.partial(
    jax.jit,
    static_argnames=("config", "draft_config", "decode_attention", "eos_id", "top_logprobs"),
    donate_argnames=("cache", "draft_cache", "head_state", "gen_counts"),
)
def _decode_step(
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
    allowed,
    *,
    config,
    draft_config,
    decode_attention,
    eos_id,
    top_logprobs,
):
    """One token for every slot ``[num_slots, 1]`` (idle slots have length 0), each within its
    row's mask ``allowed[num_slots, V]``."""
    hidden, cache = paged_hidden(
        params, config, cache, tokens, batch, decode_attention=decode_attention
    )
    logits = logits_from_hidden(params, config, hidden)[:, 0]
    draft_cache = mirror(draft_params, draft_config, draft_cache, tokens, batch, decode_attention)
    head_state = follow_heads(
        heads, params, config, head_state, tokens, batch, hidden, decode_attention
    )
    s = sample(
        logits,
        rows.keys,
        rows.arrays,
        gen_counts,
        step=rows.steps,
        prompt_counts=prompt_counts,
        allowed=allowed,
        eos_id=eos_id,
    )
    gen_counts = add_tokens(gen_counts, s.tokens, batch.lengths > 0)
    top = _top_logprobs(logits, top_logprobs)
    return s, top, cache, draft_cache, head_state, gen_counts


_copy_blocks = jax.jit(copy_blocks, donate_argnums=0)


def _fixed_drafts(seqs: list[Sequence], found: np.ndarray, drafts, proposed) -> None:
    """Deterministic proposals ``found[S, >= lookahead]`` into ``drafts``/``proposed``, each row's
    cut before the first token its automaton refuses."""
    for seq in seqs:
        tokens = found[seq.slot, : seq.lookahead]
        n = (
            len(tokens)
            if seq.constraint is None
            else seq.constraint.allowed_prefix(seq.state, tokens)
        )
        drafts[seq.slot, :n], proposed[seq.slot] = tokens[:n], n


def _top_row(top, row: int, seq: Sequence) -> tuple[tuple[int, float], ...]:
    """Row ``row`` of a step's ``(ids, logprobs)`` top-k (host arrays, or ``None`` when the step
    computed none), cut to what ``seq`` asked for."""
    if top is None or not seq.num_top_logprobs:
        return ()
    ids, values = (x[row, : seq.num_top_logprobs].tolist() for x in top)
    return tuple(zip(ids, values))


def _hit_stop_string(tokenizer, output: list[int], stop_strings: tuple[str, ...]) -> bool:
    """Whether the text now contains a stop string.  It must end in the newest token (else it
    would have stopped earlier), and a byte-level token holds at least one of its <= 4 bytes per
    character, so decoding the last ``4 len + 1`` tokens is enough."""
    return any(s in tokenizer.decode(output[-(4 * len(s) + 1) :]) for s in stop_strings)


class Engine:
    """Serves many requests at once over one model; see the module docstring."""

    def __init__(
        self,
        params,
        config: TransformerConfig,
        engine_config: EngineConfig | None = None,
        *,
        eos_id: int | None = None,
        tokenizer=None,
        draft_params=None,
        draft_config: TransformerConfig | None = None,
        medusa: MedusaHeads | None = None,
        eagle: EagleHead | None = None,
    ):
        """``draft_params``/``draft_config``: the draft model of ``speculation="draft"``
        requests (it must share the target's vocabulary); ``medusa``/``eagle``: the draft heads
        of ``speculation="medusa"``/``"eagle"`` requests, trained on this target
        (``decoding.draft_heads``)."""
        for name, head, kind in (("medusa", medusa, MedusaHeads), ("eagle", eagle, EagleHead)):
            if head is not None and not isinstance(head, kind):
                raise ValueError(f"{name} must be a {kind.__name__}, got {type(head).__name__}")
        if medusa is not None and medusa.w.shape[-1] != config.d_model:
            raise ValueError(
                f"Medusa heads of width {medusa.w.shape[-1]} != d_model {config.d_model}"
            )
        self.heads = Heads(medusa, eagle)
        if (draft_params is None) != (draft_config is None):
            raise ValueError("pass both draft_params and draft_config, or neither")
        if draft_config is not None and draft_config.vocab_size != config.vocab_size:
            raise ValueError(
                f"draft vocab {draft_config.vocab_size} != target vocab {config.vocab_size}"
            )
        self.draft_params, self.draft_config = draft_params, draft_config
        ec = engine_config or EngineConfig()
        self.params, self.config, self.engine_config = params, config, ec
        self.tokenizer = tokenizer
        self.eos_id = eos_id if eos_id is not None or tokenizer is None else tokenizer.eos_id
        self.max_model_len = ec.max_model_len or config.max_seq_len
        self.max_blocks = -(-self.max_model_len // ec.block_size)
        num_blocks = ec.num_blocks or ec.num_slots * self.max_blocks
        if num_blocks < self.max_blocks:
            raise ValueError(
                f"{num_blocks} blocks cannot hold one sequence of max_model_len="
                f"{self.max_model_len} ({self.max_blocks} blocks of {ec.block_size})"
            )
        self.num_blocks = num_blocks
        self._padding_slot = num_blocks * ec.block_size  # out of range: the write is dropped
        self._static = {
            "config": config,
            "eos_id": self.eos_id,
            "decode_attention": decode_attention_fn(ec.decode_attention),
        }
        self._host_constraints: dict[int, tuple[TokenConstraint, HostConstraint]] = {}
        self._zero_q = None  # the draft distributions of a step without draft-model rows
        self._base_key = jax.random.key(ec.seed)
        self._arrivals = itertools.count()
        self.step_count = 0
        self._prompt_tokens = self._generated_tokens = 0
        self._before_reset = EngineCounters()  # the counters of the states reset() dropped
        self._new_state()

    def _new_state(self) -> None:
        """Empty scheduler, block pool, KV cache and penalty counts."""
        ec = self.engine_config
        self.blocks = BlockManager(
            self.num_blocks, ec.block_size, enable_prefix_caching=ec.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.blocks,
            ec.num_slots,
            watermark_blocks=int(ec.watermark * self.num_blocks),
            static=ec.batching == "static",
        )
        self.cache = PagedKVCache.create(self.config, self.num_blocks, ec.block_size)
        self.draft_cache = None
        if self.draft_config is not None:
            self.draft_cache = PagedKVCache.create(
                self.draft_config, self.num_blocks, ec.block_size
            )
        self._head_state = None
        if self.heads != Heads():
            eagle_cache = None
            if self.heads.eagle is not None:
                eagle_cache = PagedKVCache.create(
                    eagle_config(self.config), self.num_blocks, ec.block_size
                )
            features = jnp.zeros((ec.num_slots, self.config.d_model), self.config.compute_dtype)
            self._head_state = HeadState(features, eagle_cache)
        self._speculation_stats = {m: SpeculationStats() for m in SPECULATION}
        counts = (ec.num_slots, self.config.vocab_size)
        self._gen_counts = jnp.zeros(counts, jnp.int32)  # generated tokens, per slot
        self._prompt_counts = jnp.zeros(counts, jnp.int32)
        self._sequences: dict[str, Sequence] = {}
        self._decode_arrays: tuple[tuple, SamplingArrays] | None = None
        self._failures: list[tuple[str, Exception]] = []

    def reset(self) -> None:
        """Drops every request in flight and starts from an empty cache, after a failure that
        left the engine's state unknown.  Arrival numbers go on, so later requests keep the keys
        they would have had, and so do :attr:`counters`."""
        self._before_reset = self.counters._replace(prompt_tokens=0, generated_tokens=0)
        self._new_state()

    # ----------------------------------------------------------------------------- requests
    def add_request(self, request: Request) -> str:
        """Queues ``request``; returns its id (generated if it has none)."""
        return self._queue(request, self._check(request))

    def _check(self, request: Request) -> tuple[int, ...]:
        """``request``'s prompt, or :class:`RequestError`.  Nothing is recorded, so a rejected
        request does not shift later requests' arrival numbers (their default ids and keys)."""
        request_id = request.request_id
        if request_id is not None and _GENERATED_ID.fullmatch(request_id):
            raise RequestError(
                f"request id {request_id!r}: ids of the form 'req-<n>' are "
                "reserved for generated ones"
            )
        if request_id in self._sequences:
            raise RequestError(f"request id {request_id!r} is already in flight")
        prompt = tuple(int(t) for t in request.prompt)
        if not 0 < len(prompt) < self.max_model_len:
            raise RequestError(
                f"prompt length {len(prompt)} must be in [1, max_model_len={self.max_model_len})"
            )
        check_token_ids([prompt], self.config.vocab_size)
        if request.params.top_k > self.config.vocab_size:
            raise RequestError(
                f"top_k={request.params.top_k} exceeds the vocabulary size {self.config.vocab_size}"
            )
        if request.params.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need an Engine with a tokenizer")
        if request.speculation not in SPECULATION:
            raise RequestError(
                f"speculation={request.speculation!r}; expected one of {SPECULATION}"
            )
        if request.speculation == "draft" and self.draft_config is None:
            raise RequestError("speculation='draft' needs an Engine with a draft model")
        if (
            request.speculation in Heads._fields
            and getattr(self.heads, request.speculation) is None
        ):
            raise RequestError(f"speculation={request.speculation!r} needs an Engine with its head")
        top = request.top_logprobs
        if isinstance(top, bool) or not isinstance(top, int | np.integer):
            raise RequestError(f"top_logprobs={top!r} is not an integer")
        if not 0 <= top <= min(MAX_TOP_LOGPROBS, self.config.vocab_size):
            raise RequestError(
                f"top_logprobs={top} is out of range [0, "
                f"{min(MAX_TOP_LOGPROBS, self.config.vocab_size)}]"
            )
        if top and request.speculation != "none":
            raise RequestError(
                f"top_logprobs cannot be combined with speculation={request.speculation!r}: "
                "verifying drafts computes no top-k"
            )
        if request.streaming is not None:
            if not isinstance(request.streaming, StreamingCache):
                raise RequestError(
                    "streaming must be a StreamingCache(sink_tokens=..., window=...) or None, "
                    f"got {type(request.streaming).__name__}"
                )
            if request.speculation != "none":
                raise RequestError(
                    f"a streaming request cannot speculate (speculation={request.speculation!r}): "
                    "drafts and their rollback keep no sinks-and-window policy"
                )
        c = request.constraint
        if c is not None and c.allowed.shape[-1] != self.config.vocab_size:
            raise RequestError(
                f"the constraint's tables cover {c.allowed.shape[-1]} tokens; the model has "
                f"{self.config.vocab_size}"
            )
        return prompt

    def _host_constraint(self, constraint: TokenConstraint | None) -> HostConstraint | None:
        """The constraint's host tables, kept for the few constraints a server reuses."""
        if constraint is None:
            return None
        kept = self._host_constraints.get(id(constraint))
        if kept is None or kept[0] is not constraint:
            if len(self._host_constraints) >= 32:
                del self._host_constraints[next(iter(self._host_constraints))]  # the oldest
            kept = self._host_constraints[id(constraint)] = (
                constraint,
                HostConstraint(constraint),
            )
        return kept[1]

    def _queue(self, request: Request, prompt: tuple[int, ...]) -> str:
        arrival = next(self._arrivals)
        request_id = request.request_id if request.request_id is not None else f"req-{arrival}"
        key = np.asarray(jax.random.key_data(jax.random.fold_in(self._base_key, arrival)))
        self._sequences[request_id] = seq = Sequence(
            request_id,
            prompt,
            request.params,
            key,
            arrival_step=self.step_count,
            arrival_time=time.perf_counter(),
            speculation=request.speculation,
            constraint=self._host_constraint(request.constraint),
            streaming=request.streaming,
            num_top_logprobs=int(request.top_logprobs),
        )
        if seq.constraint is not None:
            seq.state = seq.constraint.initial
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str) -> bool:
        """Stops ``request_id`` now, freeing its slot and blocks (a client that went away, a
        call that timed out); its blocks stay in the prefix cache like a finished request's.
        False if it is not in flight (finished, aborted or never added)."""
        seq = self._sequences.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def stats(self) -> dict:
        """Counters; ``speculation`` holds, per method, the decoding rows run (target
        forwards), drafts proposed and accepted, and accepted drafts per target forward."""
        return {
            "steps": self.step_count,
            "preemptions": self.scheduler.num_preemptions,
            "prefix_hit_rate": self.blocks.hit_rate,
            "free_blocks": self.blocks.num_free_blocks,
            "speculation": {m: s.report() for m, s in self._speculation_stats.items()},
        }

    @property
    def counters(self) -> EngineCounters:
        """Totals since the engine was built (see :class:`EngineCounters`)."""
        live = EngineCounters(
            self._prompt_tokens,
            self._generated_tokens,
            self.scheduler.num_preemptions,
            self.blocks.queried_tokens,
            self.blocks.hit_tokens,
        )
        return EngineCounters(*(a + b for a, b in zip(self._before_reset, live)))

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of the paged KV cache's blocks that sequences hold (cached blocks that no
        sequence holds count as free: an allocation may evict them)."""
        return 1.0 - self.blocks.num_free_blocks / self.num_blocks

    # ----------------------------------------------------------------------------- stepping
    def step(self) -> list[StepOutput]:
        """One iteration: admit and prefill, decode every running sequence, retire finished ones.

        A request whose own work fails (its prefill, its bookkeeping) is dropped alone and listed
        by :meth:`take_failures`; the others go on.  An exception out of ``step`` means the
        batched decode failed, or the device cache was lost: the state is unknown, and the caller
        should fail everything in flight and :meth:`reset`.
        """
        # Verification computes no top-k: no row drafts beside one that asks for it.
        asks_top = any(seq.num_top_logprobs for seq in self.scheduler.running)
        for seq in self.scheduler.running:
            seq.lookahead = 0 if asks_top else self._lookahead(seq)
        plan = self.scheduler.schedule(self.step_count)
        self._copy([c for seq in plan.decodes for c in plan.copies[seq.request_id]])
        sampled = []
        for seq in plan.prefills:  # in admission order: later ones may read earlier ones' blocks
            if seq.admitted_step == self.step_count and not seq.preemptions:  # first admission
                self._prompt_tokens += len(seq.prompt)
            with self._isolated(seq):
                self._copy(plan.copies[seq.request_id])
                sampled.append((seq, *self._prefill(seq)))
        if plan.decodes:
            sampled += self._decode(plan.decodes)
        self.step_count += 1
        events = []
        for seq, token, logprob, sample_logprob, top in sampled:
            if self._sequences.get(seq.request_id) is not seq:
                continue  # finished by an earlier token of this step, or failed
            with self._isolated(seq):
                events.append(self._append(seq, token, logprob, sample_logprob, top))
        for seq in plan.decodes:
            if seq.lookahead and self._sequences.get(seq.request_id) is seq:
                self.blocks.truncate(seq.request_id, seq.num_computed)  # drop rejected drafts
        return events

    def take_failures(self) -> list[tuple[str, Exception]]:
        """``(request_id, exception)`` of the requests dropped since the last call because their
        own work failed (see :meth:`step`)."""
        failures, self._failures = self._failures, []
        return failures

    @contextlib.contextmanager
    def _isolated(self, seq: Sequence):
        """Fails ``seq`` alone if the block raises, unless the device cache went with it."""
        try:
            yield
        except Exception as e:
            donated = (self.cache, self.draft_cache, self._head_state, self._gen_counts)
            donated += (self._prompt_counts,)
            if any(x.is_deleted() for x in jax.tree.leaves(donated)):
                raise  # given to a call that failed: every sequence's state is gone
            if self._sequences.pop(seq.request_id, None) is not None:
                self.scheduler.abort(seq)
            self._failures.append((seq.request_id, e))

    def generate(self, requests: Iterable[Request]) -> list[Completion]:
        """Runs ``requests`` to completion; results in order.  Requests queued by others advance
        too, but their events are not kept."""
        requests = list(requests)
        prompts = [self._check(r) for r in requests]  # all or nothing: a bad request queues none
        given = [r.request_id for r in requests if r.request_id is not None]
        if len(set(given)) < len(given):
            raise ValueError(f"request ids repeat within one call: {given}")
        ids = [self._queue(r, p) for r, p in zip(requests, prompts)]
        pending, done = set(ids), {}
        while pending:
            for event in self.step():
                if event.finished and event.request_id in pending:
                    pending.remove(event.request_id)
                    done[event.request_id] = event.completion
            self._raise_failure(pending)
        return [done[i] for i in ids]

    def _raise_failure(self, pending: set[str]) -> None:
        """Raises the failure of a request in ``pending``, after aborting the others."""
        failed = [e for request_id, e in self.take_failures() if request_id in pending]
        if failed:
            for request_id in pending:
                self.abort_request(request_id)
            raise failed[0]

    def stream(self, request: Request) -> Iterator[StepOutput]:
        """Yields ``request``'s token events as they are sampled, driving the engine meanwhile
        (as :meth:`generate`, other requests advance but their events are dropped)."""
        request_id = self.add_request(request)
        try:
            while True:
                for event in self.step():
                    if event.request_id == request_id:
                        yield event
                        if event.finished:
                            return
                self._raise_failure({request_id})
        finally:  # the consumer stopped early: stop generating for it
            self.abort_request(request_id)

    # ----------------------------------------------------------------------------- internals
    def _copy(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write on the device, padded to ``num_slots`` pairs (at most one per decoding
        sequence) so that it compiles once."""
        if not copies:
            return
        src = np.zeros(self.engine_config.num_slots, np.int32)
        dst = np.full(self.engine_config.num_slots, self.blocks.num_blocks, np.int32)
        src[: len(copies)], dst[: len(copies)] = zip(*copies)
        self.cache = _copy_blocks(self.cache, src, dst)
        if self.draft_cache is not None:
            self.draft_cache = _copy_blocks(self.draft_cache, src, dst)
        if self._head_state is not None and self._head_state.eagle_cache is not None:
            eagle_cache = _copy_blocks(self._head_state.eagle_cache, src, dst)
            self._head_state = self._head_state._replace(eagle_cache=eagle_cache)

    def _table(self, seq: Sequence) -> np.ndarray:
        table = np.zeros(self.max_blocks, np.int32)
        blocks = self.blocks.block_table(seq.request_id)
        table[: len(blocks)] = blocks
        return np.where(table == EVICTED, 0, table)  # evicted keys are masked: any block will do

    def _streaming(self, rows: list[tuple[int, Sequence]], size: int) -> dict:
        """:class:`PagedBatch`'s StreamingLLM fields for ``size`` rows holding ``seq`` at row
        ``i`` for each ``(i, seq)`` of ``rows``: none unless one of them streams."""
        if all(seq.streaming is None for _, seq in rows):
            return {}
        sinks, window = np.zeros(size, np.int32), np.full(size, 2**30, np.int32)
        for i, seq in rows:
            if seq.streaming is not None:
                sinks[i], window[i] = seq.streaming.sink_tokens, seq.streaming.window
        return {"sink_tokens": sinks, "stream_window": window}

    def _evict(self, seq: Sequence) -> None:
        """Gives back ``seq``'s blocks that no later query reads: past its sink blocks and wholly
        before the window of its next position ``num_computed`` (``(j + 1) bs <= n - W + 1``)."""
        bs, policy = self.engine_config.block_size, seq.streaming
        last = (seq.num_computed - policy.window + 1) // bs
        self.blocks.evict(seq.request_id, -(-policy.sink_tokens // bs), last)

    def _slots(self, table: np.ndarray, positions: np.ndarray) -> np.ndarray:
        bs = self.engine_config.block_size
        return table[positions // bs] * bs + positions % bs

    def _prefill_len(self, n: int) -> int:
        bucket = max(self.engine_config.min_prefill_len, 1 << (n - 1).bit_length())
        return min(bucket, self.max_blocks * self.engine_config.block_size)

    def _prefill(self, seq: Sequence) -> tuple[int, float, float, tuple]:
        tokens = np.asarray(seq.tokens, np.int32)
        start, end = seq.num_computed, len(tokens)
        n = end - start
        t = self._prefill_len(n)
        table = self._table(seq)
        positions = np.arange(start, end, dtype=np.int32)

        def row(fill, values):  # left-padded to t
            return np.concatenate([np.full(t - n, fill, np.int32), values])[None]

        slots = row(self._padding_slot, self._slots(table, positions))
        batch = PagedBatch(
            row(0, positions),
            slots,
            table[None],
            np.asarray([end], np.int32),
            **self._streaming([(0, seq)], 1),
        )
        v = self.config.vocab_size
        s, top, *state = _prefill_step(
            *self._device_state(),
            row(0, tokens[start:]),
            batch,
            SamplingArrays.from_params([_device_params(seq.params)]),
            seq.key[None],
            np.asarray([len(seq.output)], np.int32),
            seq.slot,
            np.bincount(seq.prompt, minlength=v).astype(np.int32),
            np.bincount(np.asarray(seq.output, np.int64), minlength=v).astype(np.int32),
            self._allowed(seq)[None],
            draft_config=self.draft_config,
            top_logprobs=self._top_width([seq]),
            **self._static,
        )
        self.cache, self.draft_cache, self._head_state, self._gen_counts, self._prompt_counts = (
            state
        )
        sampled = int(s.tokens[0]), float(s.raw_logprobs[0]), float(s.sample_logprobs[0])
        return *sampled, _top_row(jax.device_get(top), 0, seq)

    def _sampling_arrays(self, by_slot: list[Sequence | None]) -> SamplingArrays:
        """The decode batch's per-slot settings, rebuilt only when the slots change hands."""
        ids = tuple(None if s is None else s.request_id for s in by_slot)
        if self._decode_arrays is None or self._decode_arrays[0] != ids:
            arrays = SamplingArrays.from_params(
                [_IDLE if s is None else _device_params(s.params) for s in by_slot]
            )
            self._decode_arrays = ids, arrays
        return self._decode_arrays[1]

    def _device_state(self) -> tuple:
        """What every forward step takes first: both models, their pages, the draft heads and
        their state, the penalty counts."""
        return (
            self.params,
            self.cache,
            self.draft_params,
            self.draft_cache,
            self.heads,
            self._head_state,
            self._gen_counts,
            self._prompt_counts,
        )

    def _allowed(self, seq: Sequence) -> np.ndarray:
        """``[V]``: the tokens ``seq`` may emit next (all of them without a constraint)."""
        if seq.constraint is None:
            return np.ones(self.config.vocab_size, bool)
        return seq.constraint.allowed[seq.state]

    def _lookahead(self, seq: Sequence) -> int:
        """Draft positions ``seq`` asks to reserve this step: none unless it speculates, and
        never more than it may still emit after the next token."""
        if seq.speculation == "none":
            return 0
        room = min(seq.params.max_tokens - len(seq.output), self.max_model_len - len(seq.tokens))
        most = self.engine_config.speculation_tokens
        if seq.speculation == "medusa":  # one draft per head
            most = min(most, self.heads.medusa.w.shape[0])
        return max(0, min(most, room - 1))

    def _rows(self, seqs: list[Sequence]) -> tuple[np.ndarray, RowSampling]:
        """The decode batch's block tables ``[S, max_blocks]`` and sampling inputs."""
        s_count = self.engine_config.num_slots
        by_slot: list[Sequence | None] = [None] * s_count
        tables = np.zeros((s_count, self.max_blocks), np.int32)
        steps = np.zeros(s_count, np.int32)
        keys = np.zeros((s_count, *seqs[0].key.shape), seqs[0].key.dtype)
        for seq in seqs:
            by_slot[seq.slot] = seq
            tables[seq.slot] = self._table(seq)
            steps[seq.slot], keys[seq.slot] = len(seq.output), seq.key
        return tables, RowSampling(self._sampling_arrays(by_slot), keys, steps)

    def _top_width(self, seqs: list[Sequence]) -> int:
        """The top-k a step over ``seqs`` computes: the most any request may ask, if one asks."""
        if not any(seq.num_top_logprobs for seq in seqs):
            return 0
        return min(MAX_TOP_LOGPROBS, self.config.vocab_size)

    def _decode(self, seqs: list[Sequence]) -> list[tuple[Sequence, int, float, float, tuple]]:
        if any(seq.lookahead for seq in seqs):
            return self._speculate(seqs)
        tables, rows = self._rows(seqs)
        s_count, v = self.engine_config.num_slots, self.config.vocab_size
        tokens, positions, lengths = (np.zeros(s_count, np.int32) for _ in range(3))
        slots = np.full(s_count, self._padding_slot, np.int32)
        allowed = np.ones((s_count, v), bool)
        for seq in seqs:
            i, pos = seq.slot, seq.num_computed
            tokens[i], positions[i], lengths[i] = seq.output[-1], pos, pos + 1
            slots[i] = self._slots(tables[i], np.asarray(pos))
            allowed[i] = self._allowed(seq)
        s, top, self.cache, self.draft_cache, self._head_state, self._gen_counts = _decode_step(
            *self._device_state(),
            tokens[:, None],
            PagedBatch(
                positions[:, None],
                slots[:, None],
                tables,
                lengths,
                **self._streaming([(seq.slot, seq) for seq in seqs], s_count),
            ),
            rows,
            allowed,
            draft_config=self.draft_config,
            top_logprobs=self._top_width(seqs),
            **self._static,
        )
        for seq in seqs:
            self._speculation_stats[seq.speculation].forwards += 1
        out = [np.asarray(x) for x in (s.tokens, s.raw_logprobs, s.sample_logprobs)]
        top = jax.device_get(top)
        return [
            (seq, *(x[seq.slot].item() for x in out), _top_row(top, seq.slot, seq)) for seq in seqs
        ]

    def _propose(self, seqs: list[Sequence], tables, rows: RowSampling):
        """Every speculating row's drafts: ``(drafts[S, k], proposed[S], draft_q, sampled[S])``
        (``draft_q[S, k, V]``: the draft model's distributions on rows where ``sampled``)."""
        s_count, k = self.engine_config.num_slots, self.engine_config.speculation_tokens
        drafts, proposed = np.zeros((s_count, k), np.int32), np.zeros(s_count, np.int32)
        lookup = [s for s in seqs if s.lookahead and s.speculation == "prompt_lookup"]
        if lookup:
            history = np.zeros((s_count, self.max_model_len), np.int32)
            length = np.ones(s_count, np.int32)
            for seq in lookup:
                history[seq.slot, : len(seq.tokens)], length[seq.slot] = seq.tokens, len(seq.tokens)
            found = np.asarray(
                lookup_drafts(
                    history,
                    np.zeros(s_count, np.int32),
                    length,
                    max_ngram=self.engine_config.max_ngram,
                    gamma=k,
                    branches=1,
                )
            )[:, 0]
            _fixed_drafts(lookup, found, drafts, proposed)
        medusa = [s for s in seqs if s.lookahead and s.speculation == "medusa"]
        if medusa:
            features = self._head_state.features
            found = medusa_drafts(self.heads.medusa, self.params, features, config=self.config)
            _fixed_drafts(medusa, np.asarray(found), drafts, proposed)
        eagle = [s for s in seqs if s.lookahead and s.speculation == "eagle"]
        if eagle:
            self._eagle_drafts(eagle, tables, drafts, proposed)
        sampled = np.zeros(s_count, bool)
        by_model = [s for s in seqs if s.lookahead and s.speculation == "draft"]
        if not by_model:
            return drafts, proposed, self._no_draft_q(), sampled
        for seq in by_model:
            sampled[seq.slot] = True
        q = self._model_drafts(by_model, tables, rows, drafts, proposed)
        return drafts, proposed, q, sampled

    def _no_draft_q(self):
        k, v = self.engine_config.speculation_tokens, self.config.vocab_size
        if self._zero_q is None:
            self._zero_q = jnp.zeros((self.engine_config.num_slots, k, v), jnp.float32)
        return self._zero_q

    def _model_drafts(self, seqs, tables, rows: RowSampling, drafts, proposed):
        """The draft model's tokens for ``seqs`` (into ``drafts``/``proposed``), one batched step
        per depth over the draft's pages; returns their distributions ``[S, k, V]``."""
        counts, qs = self._gen_counts, []

        def step(depth, tokens, batch, allowed):
            nonlocal counts
            token, q, self.draft_cache, counts = draft_step(
                self.draft_params,
                self.draft_cache,
                counts,
                self._prompt_counts,
                tokens,
                batch,
                rows,
                depth,
                allowed,
                config=self.draft_config,
                decode_attention=self._static["decode_attention"],
                eos_id=self.eos_id,
            )
            qs.append(q)
            return token

        self._chain_drafts(seqs, tables, drafts, proposed, step)
        q = jnp.stack(qs, axis=1)
        return jnp.pad(q, ((0, 0), (0, self.engine_config.speculation_tokens - len(qs)), (0, 0)))

    def _eagle_drafts(self, seqs, tables, drafts, proposed) -> None:
        """EAGLE's tokens for ``seqs``: one batched step per depth over the layer's pages, from
        each root and its kept feature, then each draft and the feature predicted before it."""
        features = self._head_state.features

        def step(depth, tokens, batch, allowed):
            nonlocal features
            token, features, eagle_cache = eagle_step(
                self.heads.eagle,
                self.params,
                self._head_state.eagle_cache,
                tokens,
                features,
                batch,
                allowed,
                config=self.config,
                decode_attention=self._static["decode_attention"],
            )
            self._head_state = self._head_state._replace(eagle_cache=eagle_cache)
            return token

        self._chain_drafts(seqs, tables, drafts, proposed, step)

    def _chain_drafts(self, seqs, tables, drafts, proposed, step) -> None:
        """Autoregressive drafts for ``seqs`` into ``drafts``/``proposed``: ``step(depth,
        tokens[S, 1], batch, allowed[S, V])`` gives each row's next token from its last (the root
        at depth 0), within its automaton's mask."""
        s_count, v = self.engine_config.num_slots, self.config.vocab_size
        states = {s.slot: s.state for s in seqs}
        for depth in range(self.engine_config.speculation_tokens):
            tokens, positions, lengths = (np.zeros(s_count, np.int32) for _ in range(3))
            slots = np.full(s_count, self._padding_slot, np.int32)
            allowed = np.ones((s_count, v), bool)
            for seq in seqs:
                if depth >= seq.lookahead:
                    continue
                i, pos = seq.slot, seq.num_computed + depth
                tokens[i] = seq.output[-1] if depth == 0 else drafts[i, depth - 1]
                positions[i], lengths[i] = pos, pos + 1
                slots[i] = self._slots(tables[i], np.asarray(pos))
                if seq.constraint is not None:
                    allowed[i] = seq.constraint.allowed[states[i]]
            if not lengths.any():
                break
            batch = PagedBatch(positions[:, None], slots[:, None], tables, lengths)
            token = np.asarray(step(depth, tokens[:, None], batch, allowed))
            for seq in seqs:
                i = seq.slot
                if depth < seq.lookahead:
                    drafts[i, depth], proposed[i] = token[i], depth + 1
                    if seq.constraint is not None:
                        states[i] = int(seq.constraint.next_state[states[i], token[i]])

    def _speculate(self, seqs: list[Sequence]) -> list[tuple[Sequence, int, float, float, tuple]]:
        """One verification step over every decoding row (``speculation.verify_step``)."""
        tables, rows = self._rows(seqs)
        drafts, proposed, draft_q, sampled = self._propose(seqs, tables, rows)
        s_count, v = self.engine_config.num_slots, self.config.vocab_size
        t = self.engine_config.speculation_tokens + 1
        tokens, positions = np.zeros((s_count, t), np.int32), np.zeros((s_count, t), np.int32)
        slots = np.full((s_count, t), self._padding_slot, np.int32)
        lengths = np.zeros(s_count, np.int32)
        allowed = np.ones((s_count, t, v), bool)
        for seq in seqs:  # left-padded: the root, then the row's drafts, end each row
            i, n, pos = seq.slot, proposed[seq.slot], seq.num_computed
            block = np.concatenate([[seq.output[-1]], drafts[i, :n]])
            where = np.arange(pos, pos + n + 1)
            tokens[i, t - n - 1 :], positions[i, t - n - 1 :] = block, where
            slots[i, t - n - 1 :] = self._slots(tables[i], where)
            lengths[i] = pos + n + 1
            if seq.constraint is not None:
                allowed[i] = seq.constraint.masks(seq.state, drafts[i, :n], t)
        out, self.cache, self.draft_cache, self._head_state, self._gen_counts = verify_step(
            *self._device_state(),
            tokens,
            PagedBatch(
                positions,
                slots,
                tables,
                lengths,
                **self._streaming([(seq.slot, seq) for seq in seqs], s_count),
            ),
            rows,
            proposed,
            drafts,
            draft_q,
            sampled,
            allowed,
            draft_config=self.draft_config,
            **self._static,
        )
        emitted, accepted, sample_lp, raw_lp = (np.asarray(x) for x in out)
        events = []
        for seq in seqs:
            i = seq.slot
            stats = self._speculation_stats[seq.speculation]
            stats.forwards += 1
            stats.proposed += int(proposed[i])
            stats.accepted += int(accepted[i])
            events += [
                (seq, int(emitted[i, j]), float(raw_lp[i, j]), float(sample_lp[i, j]), ())
                for j in range(accepted[i] + 1)
            ]
        return events

    def _finish_reason(self, seq: Sequence) -> str | None:
        token, p = seq.output[-1], seq.params
        if token == self.eos_id or token in p.stop_token_ids:
            return "stop"
        if p.stop_strings and _hit_stop_string(self.tokenizer, seq.output, p.stop_strings):
            return "stop"
        if len(seq.output) >= p.max_tokens or len(seq.tokens) >= self.max_model_len:
            return "length"
        return None

    def _append(
        self, seq: Sequence, token: int, logprob: float, sample_logprob: float, top: tuple
    ) -> StepOutput:
        seq.num_computed = len(seq.prompt) + len(seq.output)
        self.blocks.commit(seq.request_id, seq.tokens, seq.num_computed)
        if seq.streaming is not None:
            self._evict(seq)
        seq.output.append(token)
        if seq.constraint is not None:
            seq.state = int(seq.constraint.next_state[seq.state, token])
        seq.logprobs.append(logprob)
        seq.sample_logprobs.append(sample_logprob)
        seq.top_logprobs.append(top)
        self._generated_tokens += 1
        now = time.perf_counter()
        if seq.first_token_time is None:
            seq.first_token_time = now
        latency = now - (seq.arrival_time if seq.last_token_time is None else seq.last_token_time)
        seq.last_token_time = now
        seq.finish_reason = self._finish_reason(seq)
        completion = None
        if seq.finish_reason is not None:
            self.scheduler.finish(seq)
            del self._sequences[seq.request_id]
            completion = Completion(
                seq.request_id,
                seq.prompt,
                tuple(seq.output),
                tuple(seq.logprobs),
                tuple(seq.sample_logprobs),
                tuple(seq.top_logprobs),
                seq.finish_reason,
                seq.cached_tokens,
                seq.preemptions,
                seq.admitted_step - seq.arrival_step,
                seq.arrival_time,
                seq.first_token_time,
                now,
            )
        index = len(seq.output) - 1
        return StepOutput(seq.request_id, token, logprob, completion, top, index, latency)


# --------------------------------------------------------------------------------- text front end
@gin.configurable
def default_sampling_params(
    temperature: float = 0.8,
    top_p: float = 0.95,
    top_k: int = 0,
    max_tokens: int = 64,
    seed: int | None = None,
) -> SamplingParams:
    """The sampling settings ``agentic-jax generate`` starts from (its flags override them)."""
    return SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed
    )


def stream_text(engine: Engine, request: Request, tokenizer: Tokenizer) -> Iterator[str]:
    """The completion's text as it grows, without special tokens.  A byte-level token can end
    inside a UTF-8 character; such text (ending in U+FFFD) waits for the next token."""
    tokens, shown = [], ""
    for event in engine.stream(request):
        tokens.append(event.token)
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") and not event.finished:
            continue
        yield text[len(shown) :]
        shown = text
