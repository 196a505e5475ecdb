"""Iteration-level (continuous) batching: which sequences run in the next model step.

Orca (Yu et al. 2022) schedules per *iteration* rather than per batch: a finished sequence
leaves, and a waiting one takes its slot, at the very next step, so short requests never wait for
the longest one in their batch.  The policy here is vLLM's:

* Every running sequence decodes one token per step (a speculating one reserves its
  ``lookahead`` draft positions too, or none if the pool cannot hold them).  If the block pool
  cannot hold its next token, the most recently admitted running sequence is **preempted by
  recompute**: its blocks are freed and it goes back to the front of the queue, to be prefilled
  again (prompt plus what it has generated) when memory frees up.  Recompute beats swapping to
  host memory for short contexts and needs no second memory tier; with prefix caching the
  recompute is often a cache hit.
* Waiting sequences are admitted strictly first-come first-served while a slot is free and the
  pool can hold the sequence's prompt (keeping ``watermark_blocks`` spare for the running ones to
  grow).  A sequence that does not fit blocks those behind it, so a large request cannot be
  starved by a stream of small ones; nothing is admitted in a step that had to preempt.
* ``static=True`` admits only into an empty batch: the static-batching baseline.

An admitted prompt's blocks enter the prefix cache at once, so a burst of requests sharing a system
prompt computes it once.  That relies on the engine's order within a step: prefills run one by
one in admission order (each after its own copy-on-write copies), then the batched decode.

The scheduler and the block manager are host-side Python; the engine runs what they decide.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import numpy as np

from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.block_manager import BlockManager


@dataclasses.dataclass(eq=False)
class Sequence:
    """One request's state.  ``num_computed`` positions have K/V in the cache: after every step all
    tokens but the last sampled one (which the next decode step feeds in)."""

    request_id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    key: np.ndarray  # PRNG key data; the sampler folds in the number of generated tokens
    arrival_step: int
    arrival_time: float
    output: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)  # under the raw model
    sample_logprobs: list[float] = dataclasses.field(default_factory=list)  # as sampled
    num_top_logprobs: int = 0  # how many of the likeliest tokens to report per output token
    top_logprobs: list[tuple[tuple[int, float], ...]] = dataclasses.field(default_factory=list)
    slot: int | None = None
    num_computed: int = 0
    admitted_step: int | None = None  # first admission
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    first_token_time: float | None = None
    last_token_time: float | None = None
    preemptions: int = 0
    finish_reason: str | None = None
    speculation: str = "none"  # how its tokens are proposed (the engine's SPECULATION)
    constraint: object | None = None  # the engine's host tables of its token automaton
    state: int = 0  # the automaton's state after every output token
    lookahead: int = 0  # draft positions to reserve beyond the next token (0: no room)
    streaming: object | None = None  # a decoding.streaming.StreamingCache: outside the prefix cache

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt, *self.output]


class SchedulerOutput(NamedTuple):
    prefills: list[Sequence]  # admitted now: compute tokens[num_computed:], sample one
    decodes: list[Sequence]  # running: feed the last token, sample one
    preempted: list[Sequence]
    copies: dict[str, list[tuple[int, int]]]  # per request: copy-on-write (src, dst) blocks


class Scheduler:
    """FIFO admission into ``num_slots`` slots, LIFO preemption by recompute."""

    def __init__(
        self,
        blocks: BlockManager,
        num_slots: int,
        *,
        watermark_blocks: int = 0,
        static: bool = False,
    ):
        self.blocks = blocks
        self.num_slots = num_slots
        self.watermark_blocks = watermark_blocks
        self.static = static
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []  # in admission order
        self._free_slots = list(range(num_slots))
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Releases a running sequence's slot and blocks."""
        self.running.remove(seq)
        self._release(seq)

    def abort(self, seq: Sequence) -> None:
        """Drops ``seq`` wherever it is: a waiting one holds no slot or blocks (a preempted one
        gave them back), a running one releases both."""
        if seq in self.running:
            self.finish(seq)
        else:
            self.waiting.remove(seq)

    def _release(self, seq: Sequence) -> None:
        self.blocks.free(seq.request_id)
        self._free_slots.append(seq.slot)
        self._free_slots.sort()
        seq.slot = None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self, step: int) -> SchedulerOutput:
        """Reserves blocks for this step's writes and returns what to run."""
        decodes, preempted, copies = [], [], {}
        for seq in list(self.running):
            if seq.slot is None:  # preempted for an earlier sequence of this loop
                continue
            pos = seq.num_computed
            end = pos + 1 + seq.lookahead
            if self.blocks.blocks_to_write(seq.request_id, pos, end) > self.blocks.num_free_blocks:
                seq.lookahead, end = 0, pos + 1  # no room to speculate: one token, as any other
            while (
                self.blocks.blocks_to_write(seq.request_id, pos, end) > self.blocks.num_free_blocks
            ):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                copies[seq.request_id] = self.blocks.prepare_write(seq.request_id, pos, end)
                decodes.append(seq)
        prefills = []
        if not preempted and not (self.static and self.running):
            prefills = self._admit(step, copies)
        return SchedulerOutput(prefills, decodes, preempted, copies)

    def _admit(self, step: int, copies: dict[str, list[tuple[int, int]]]) -> list[Sequence]:
        admitted = []
        while self.waiting and self._free_slots:
            seq = self.waiting[0]
            tokens = seq.tokens
            # The watermark keeps room for running sequences to grow, but never blocks a
            # sequence from an idle engine (it would wait forever).
            spare = self.watermark_blocks if self.running else 0
            cache = seq.streaming is None
            if (
                self.blocks.admission_cost(tokens, cache=cache)
                > self.blocks.num_free_blocks - spare
            ):
                break
            self.waiting.popleft()
            seq.num_computed = self.blocks.allocate(seq.request_id, tokens, cache=cache)
            copies[seq.request_id] = self.blocks.prepare_write(
                seq.request_id, seq.num_computed, len(tokens)
            )
            self.blocks.commit(seq.request_id, tokens, len(tokens))  # computed before it is read
            if seq.admitted_step is None:
                seq.admitted_step, seq.cached_tokens = step, seq.num_computed
            seq.slot = self._free_slots.pop(0)
            self.running.append(seq)
            admitted.append(seq)
        return admitted
