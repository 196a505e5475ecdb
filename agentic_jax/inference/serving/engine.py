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

Sampling is per sequence and independent of batching: row keys are the request's own (its seed,
or the engine seed folded with the request's arrival number) with the count of generated tokens
folded in, and penalty counts are kept per slot.  A request therefore produces the same tokens
alone, in any batch, and after being preempted and recomputed.
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
from agentic_jax.inference.decoding.prompts import check_token_ids
from agentic_jax.inference.decoding.sampling import (
    SamplingArrays,
    SamplingParams,
    add_tokens,
    sample,
)
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.block_manager import BlockManager
from agentic_jax.inference.serving.paged_cache import (
    PagedBatch,
    PagedKVCache,
    copy_blocks,
    decode_attention_fn,
    paged_forward,
)
from agentic_jax.inference.serving.scheduler import Scheduler, Sequence
from agentic_jax.models.config import TransformerConfig

BATCHING = ("continuous", "static")
_GENERATED_ID = re.compile(r"req-\d+")  # the ids add_request gives requests without one


@gin.configurable
@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Capacity and policy of an :class:`Engine`.

    ``num_blocks`` defaults to enough for every slot to reach ``max_model_len`` (no preemption);
    fewer blocks trade preemptions for memory.  ``max_model_len`` (prompt plus output) defaults
    to the model's ``max_seq_len``.  ``watermark`` is the fraction of blocks that admission leaves
    free for running sequences to grow into.  ``decode_attention``: auto | pallas | reference (see
    ``paged_cache.decode_attention_fn``).
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

    def __post_init__(self):
        for name in ("num_slots", "block_size", "num_blocks", "max_model_len", "min_prefill_len"):
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
    every request in flight; ids ``req-<n>`` are reserved for those the engine generates."""

    prompt: SequenceT[int]
    params: SamplingParams = SamplingParams()
    request_id: str | None = None


@dataclasses.dataclass(frozen=True)
class Completion:
    """A finished request.  ``finish_reason``: ``stop`` (EOS, a stop token or string) or ``length``
    (``max_tokens`` or ``max_model_len``).  Times are ``time.perf_counter()`` seconds."""

    request_id: str
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]  # of each token under the raw model
    sample_logprobs: tuple[float, ...]  # under the distribution each token was drawn from
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
    """One token of one request; ``completion`` is set on the request's last token."""

    request_id: str
    token: int
    logprob: float
    completion: Completion | None

    @property
    def finished(self) -> bool:
        return self.completion is not None


def _device_params(params: SamplingParams) -> SamplingParams:
    """What the device needs: stops are checked on the host (and would vary the array shapes)."""
    return dataclasses.replace(params, stop_token_ids=(), stop_strings=())


_IDLE = SamplingParams(temperature=0.0)


@functools.partial(
    jax.jit,
    static_argnames=("config", "decode_attention", "eos_id"),
    donate_argnames=("cache", "gen_counts", "prompt_counts"),
)
def _prefill_step(
    params,
    cache,
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
    *,
    config,
    decode_attention,
    eos_id,
):
    """One sequence's uncached tokens ``[1, T]``; sets its slot's penalty counts."""
    logits, cache = paged_forward(
        params, config, cache, tokens, batch, decode_attention=decode_attention
    )
    s = sample(
        logits,
        keys,
        arrays,
        gen_row[None],
        step=steps,
        prompt_counts=prompt_row[None],
        eos_id=eos_id,
    )
    gen_counts = gen_counts.at[slot].set(add_tokens(gen_row[None], s.tokens)[0])
    return s, cache, gen_counts, prompt_counts.at[slot].set(prompt_row)


@functools.partial(
    jax.jit,
    static_argnames=("config", "decode_attention", "eos_id"),
    donate_argnames=("cache", "gen_counts"),
)
def _decode_step(
    params,
    cache,
    gen_counts,
    prompt_counts,
    tokens,
    batch,
    arrays,
    keys,
    steps,
    *,
    config,
    decode_attention,
    eos_id,
):
    """One token for every slot ``[num_slots, 1]`` (idle slots have length 0)."""
    logits, cache = paged_forward(
        params, config, cache, tokens, batch, decode_attention=decode_attention
    )
    s = sample(
        logits, keys, arrays, gen_counts, step=steps, prompt_counts=prompt_counts, eos_id=eos_id
    )
    return s, cache, add_tokens(gen_counts, s.tokens, batch.lengths > 0)


_copy_blocks = jax.jit(copy_blocks, donate_argnums=0)


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
    ):
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
        self._base_key = jax.random.key(ec.seed)
        self._arrivals = itertools.count()
        self.step_count = 0
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
        counts = (ec.num_slots, self.config.vocab_size)
        self._gen_counts = jnp.zeros(counts, jnp.int32)  # generated tokens, per slot
        self._prompt_counts = jnp.zeros(counts, jnp.int32)
        self._sequences: dict[str, Sequence] = {}
        self._decode_arrays: tuple[tuple, SamplingArrays] | None = None
        self._failures: list[tuple[str, Exception]] = []

    def reset(self) -> None:
        """Drops every request in flight and starts from an empty cache, after a failure that
        left the engine's state unknown.  Arrival numbers go on, so later requests keep the keys
        they would have had."""
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
        return prompt

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
        )
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
        return {
            "steps": self.step_count,
            "preemptions": self.scheduler.num_preemptions,
            "prefix_hit_rate": self.blocks.hit_rate,
            "free_blocks": self.blocks.num_free_blocks,
        }

    # ----------------------------------------------------------------------------- stepping
    def step(self) -> list[StepOutput]:
        """One iteration: admit and prefill, decode every running sequence, retire finished ones.

        A request whose own work fails (its prefill, its bookkeeping) is dropped alone and listed
        by :meth:`take_failures`; the others go on.  An exception out of ``step`` means the
        batched decode failed, or the device cache was lost: the state is unknown, and the caller
        should fail everything in flight and :meth:`reset`.
        """
        plan = self.scheduler.schedule(self.step_count)
        self._copy([c for seq in plan.decodes for c in plan.copies[seq.request_id]])
        sampled = []
        for seq in plan.prefills:  # in admission order: later ones may read earlier ones' blocks
            with self._isolated(seq):
                self._copy(plan.copies[seq.request_id])
                sampled.append((seq, *self._prefill(seq)))
        if plan.decodes:
            sampled += self._decode(plan.decodes)
        self.step_count += 1
        events = []
        for seq, token, logprob, sample_logprob in sampled:
            with self._isolated(seq):
                events.append(self._append(seq, token, logprob, sample_logprob))
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
            donated = (self.cache, self._gen_counts, self._prompt_counts)
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

    def _table(self, seq: Sequence) -> np.ndarray:
        table = np.zeros(self.max_blocks, np.int32)
        blocks = self.blocks.block_table(seq.request_id)
        table[: len(blocks)] = blocks
        return table

    def _slots(self, table: np.ndarray, positions: np.ndarray) -> np.ndarray:
        bs = self.engine_config.block_size
        return table[positions // bs] * bs + positions % bs

    def _prefill_len(self, n: int) -> int:
        bucket = max(self.engine_config.min_prefill_len, 1 << (n - 1).bit_length())
        return min(bucket, self.max_blocks * self.engine_config.block_size)

    def _prefill(self, seq: Sequence) -> tuple[int, float]:
        tokens = np.asarray(seq.tokens, np.int32)
        start, end = seq.num_computed, len(tokens)
        n = end - start
        t = self._prefill_len(n)
        table = self._table(seq)
        positions = np.arange(start, end, dtype=np.int32)

        def row(fill, values):  # left-padded to t
            return np.concatenate([np.full(t - n, fill, np.int32), values])[None]

        slots = row(self._padding_slot, self._slots(table, positions))
        batch = PagedBatch(row(0, positions), slots, table[None], np.asarray([end], np.int32))
        v = self.config.vocab_size
        s, self.cache, self._gen_counts, self._prompt_counts = _prefill_step(
            self.params,
            self.cache,
            self._gen_counts,
            self._prompt_counts,
            row(0, tokens[start:]),
            batch,
            SamplingArrays.from_params([_device_params(seq.params)]),
            seq.key[None],
            np.asarray([len(seq.output)], np.int32),
            seq.slot,
            np.bincount(seq.prompt, minlength=v).astype(np.int32),
            np.bincount(np.asarray(seq.output, np.int64), minlength=v).astype(np.int32),
            **self._static,
        )
        return int(s.tokens[0]), float(s.raw_logprobs[0]), float(s.sample_logprobs[0])

    def _sampling_arrays(self, by_slot: list[Sequence | None]) -> SamplingArrays:
        """The decode batch's per-slot settings, rebuilt only when the slots change hands."""
        ids = tuple(None if s is None else s.request_id for s in by_slot)
        if self._decode_arrays is None or self._decode_arrays[0] != ids:
            arrays = SamplingArrays.from_params(
                [_IDLE if s is None else _device_params(s.params) for s in by_slot]
            )
            self._decode_arrays = ids, arrays
        return self._decode_arrays[1]

    def _decode(self, seqs: list[Sequence]) -> list[tuple[Sequence, int, float]]:
        s_count = self.engine_config.num_slots
        by_slot: list[Sequence | None] = [None] * s_count
        tokens, positions, lengths, steps = (np.zeros(s_count, np.int32) for _ in range(4))
        slots = np.full(s_count, self._padding_slot, np.int32)
        tables = np.zeros((s_count, self.max_blocks), np.int32)
        keys = np.zeros((s_count, *seqs[0].key.shape), seqs[0].key.dtype)
        for seq in seqs:
            i, pos = seq.slot, seq.num_computed
            by_slot[i] = seq
            tables[i] = self._table(seq)
            tokens[i], positions[i], lengths[i] = seq.output[-1], pos, pos + 1
            slots[i] = self._slots(tables[i], np.asarray(pos))
            steps[i], keys[i] = len(seq.output), seq.key
        s, self.cache, self._gen_counts = _decode_step(
            self.params,
            self.cache,
            self._gen_counts,
            self._prompt_counts,
            tokens[:, None],
            PagedBatch(positions[:, None], slots[:, None], tables, lengths),
            self._sampling_arrays(by_slot),
            keys,
            steps,
            **self._static,
        )
        out = [np.asarray(x) for x in (s.tokens, s.raw_logprobs, s.sample_logprobs)]
        return [(seq, *(x[seq.slot].item() for x in out)) for seq in seqs]

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
        self, seq: Sequence, token: int, logprob: float, sample_logprob: float
    ) -> StepOutput:
        seq.num_computed = len(seq.prompt) + len(seq.output)
        self.blocks.commit(seq.request_id, seq.tokens, seq.num_computed)
        seq.output.append(token)
        seq.logprobs.append(logprob)
        seq.sample_logprobs.append(sample_logprob)
        now = time.perf_counter()
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.finish_reason = self._finish_reason(seq)
        if seq.finish_reason is None:
            return StepOutput(seq.request_id, token, logprob, None)
        self.scheduler.finish(seq)
        del self._sequences[seq.request_id]
        return StepOutput(
            seq.request_id,
            token,
            logprob,
            Completion(
                seq.request_id,
                seq.prompt,
                tuple(seq.output),
                tuple(seq.logprobs),
                tuple(seq.sample_logprobs),
                seq.finish_reason,
                seq.cached_tokens,
                seq.preemptions,
                seq.admitted_step - seq.arrival_step,
                seq.arrival_time,
                seq.first_token_time,
                now,
            ),
        )


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
