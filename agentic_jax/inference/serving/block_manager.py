"""Host-side ownership of the paged KV cache's physical blocks (PagedAttention, Kwon et al. 2023).

The device holds K/V in ``num_blocks`` fixed-size blocks; a sequence owns a *block table*, the list
of physical blocks holding its positions ``0, block_size, 2 block_size, ...``.  Allocating block
by block removes the fragmentation of reserving ``max_len`` slots per sequence, and lets
sequences share blocks:

* **Reference counts.**  A block lives in as many tables as its count says; it returns to the pool
  when the count reaches zero.
* **Automatic prefix caching** (as in vLLM and SGLang's RadixAttention).  A *full* block whose K/V
  has been computed is named by a hash chain, ``hash(parent's hash, its tokens)``, i.e. by the
  whole prefix up to and including it, so equal hashes mean equal K/V.  A new sequence whose
  prompt starts with cached blocks shares them instead of recomputing them.  Freed cached blocks
  stay cached (and revivable) until the pool runs dry; then the least recently freed is evicted.
* **Copy-on-write.**  Writing a position of a block that another table also holds would change
  the other sequence's cache, so the writer first gets a private copy (a ``(src, dst)`` pair the
  engine copies on the device).  With prefix caching this happens when a whole prompt is cached:
  its last token still has to run to produce logits, and its K/V lands in a shared block.
* **Eviction** (StreamingLLM's attention sinks plus a recent window).  A sequence allocated with
  ``cache=False`` neither reads nor names cached blocks (its K/V past the sinks and the window is
  not the plain prefix's), and may give back blocks in the middle of its table (:meth:`evict`),
  which then holds ``EVICTED`` there.

Everything here is plain Python on the host: it decides, the device only copies and writes.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np

ROOT_HASH = b""
EVICTED = -1  # a block-table entry whose block went back to the pool


def chain_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The name of a full block: SHA-256 of its parent's name and its token ids."""
    return hashlib.sha256(parent + np.asarray(tokens, np.int64).tobytes()).digest()


@dataclasses.dataclass
class _Blocks:
    table: list[int]
    hashes: list[bytes]  # names of the table's leading full, computed blocks
    cache: bool = True  # whether its full blocks enter (and come from) the prefix cache


class BlockManager:
    """Free list, reference counts, prefix cache and copy-on-write over ``num_blocks`` blocks."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"num_blocks and block_size must be positive; got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free = collections.deque(range(num_blocks))  # unreferenced, holding nothing useful
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
        self._refcount = [0] * num_blocks
        self._cached: dict[bytes, int] = {}  # hash -> block
        self._hash_of: dict[int, bytes] = {}  # block -> hash
        self._seqs: dict[object, _Blocks] = {}
        self.queried_tokens = 0  # prompt tokens looked up in the prefix cache
        self.hit_tokens = 0  # of which found there (their prefill is skipped)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: never used, or cached but referenced by no one."""
        return len(self._free) + len(self._evictable)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def block_table(self, seq_id) -> list[int]:
        return list(self._seqs[seq_id].table)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._seqs

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _match(self, tokens: Sequence[int], cache: bool) -> tuple[list[bytes], list[int]]:
        """Hashes and blocks of the longest chain of cached full blocks starting ``tokens``."""
        hashes, blocks, parent = [], [], ROOT_HASH
        if not (self.enable_prefix_caching and cache):
            return hashes, blocks
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = chain_hash(parent, tokens[start : start + self.block_size])
            block = self._cached.get(parent)
            if block is None:
                break
            hashes.append(parent)
            blocks.append(block)
        return hashes, blocks

    def _cached_tokens(self, tokens: Sequence[int], hits: list[int]) -> int:
        # The last token always runs, however much is cached: its logits give the next token.
        return min(len(hits) * self.block_size, len(tokens) - 1)

    def admission_cost(self, tokens: Sequence[int], *, cache: bool = True) -> int:
        """Free blocks that ``allocate(tokens, cache=cache)``, then ``prepare_write`` of the rest,
        consume."""
        if not tokens:
            raise ValueError("a sequence needs at least one token")
        _, hits = self._match(tokens, cache)
        revived = sum(self._refcount[b] == 0 for b in hits)
        fresh = self.blocks_for(len(tokens)) - len(hits)
        cow = int(
            self._cached_tokens(tokens, hits) < len(hits) * self.block_size
            and self._refcount[hits[-1]] > 0
        )
        return revived + fresh + cow

    def allocate(self, seq_id, tokens: Sequence[int], *, cache: bool = True) -> int:
        """Starts ``seq_id`` on the cached prefix of ``tokens``; returns how many tokens it covers.
        ``cache=False``: outside the prefix cache, starting from nothing.

        The caller then ``prepare_write``\\ s the remaining positions and computes them.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        if self.admission_cost(tokens, cache=cache) > self.num_free_blocks:
            raise MemoryError(f"not enough free blocks for {len(tokens)} tokens")
        hashes, hits = self._match(tokens, cache)
        for block in hits:
            if self._refcount[block] == 0:
                del self._evictable[block]
            self._refcount[block] += 1
        self._seqs[seq_id] = _Blocks(list(hits), hashes, cache)
        cached = self._cached_tokens(tokens, hits)
        self.queried_tokens += len(tokens)
        self.hit_tokens += cached
        return cached

    def blocks_to_write(self, seq_id, start: int, end: int) -> int:
        """Free blocks ``prepare_write(seq_id, start, end)`` would consume."""
        blocks = self._seqs[seq_id]
        first, last = start // self.block_size, (end - 1) // self.block_size
        new = max(0, last + 1 - max(first, len(blocks.table)))
        shared = sum(self._refcount[b] > 1 for b in blocks.table[first : last + 1])
        return new + shared

    def prepare_write(self, seq_id, start: int, end: int) -> list[tuple[int, int]]:
        """Makes positions ``[start, end)`` of ``seq_id`` writable: appends blocks past the end of
        its table and replaces shared blocks by private copies.  Returns the ``(src, dst)`` block
        copies the device must make before writing."""
        if self.blocks_to_write(seq_id, start, end) > self.num_free_blocks:
            raise MemoryError(f"not enough free blocks to write positions [{start}, {end})")
        table = self._seqs[seq_id].table
        if start > len(table) * self.block_size:
            raise ValueError(f"write at {start} would leave a hole after {len(table)} blocks")
        copies = []
        for j in range(start // self.block_size, (end - 1) // self.block_size + 1):
            if j == len(table):
                table.append(self._take())
            elif self._refcount[table[j]] > 1:
                src, dst = table[j], self._take()
                self._refcount[src] -= 1
                table[j] = dst
                copies.append((src, dst))
        return copies

    def commit(self, seq_id, tokens: Sequence[int], num_computed: int) -> None:
        """Records that the K/V of ``tokens[:num_computed]`` are in ``seq_id``'s blocks, naming (and
        caching) every block that is now full."""
        blocks = self._seqs[seq_id]
        if not blocks.cache:
            return
        parent = blocks.hashes[-1] if blocks.hashes else ROOT_HASH
        for j in range(len(blocks.hashes), num_computed // self.block_size):
            parent = chain_hash(parent, tokens[j * self.block_size : (j + 1) * self.block_size])
            blocks.hashes.append(parent)
            block = blocks.table[j]
            # A hash already cached elsewhere (two equal prompts computed side by side) keeps the
            # first block; this one stays private and returns to the free list when freed.
            fresh = parent not in self._cached and block not in self._hash_of
            if self.enable_prefix_caching and fresh:
                self._cached[parent] = block
                self._hash_of[block] = parent

    def truncate(self, seq_id, num_tokens: int) -> None:
        """Drops ``seq_id``'s blocks past those holding its first ``num_tokens`` positions: the
        rollback of speculative positions reserved for drafts that were rejected."""
        blocks = self._seqs[seq_id]
        keep = self.blocks_for(num_tokens)
        if keep < len(blocks.hashes):
            raise ValueError(f"truncating to {num_tokens} tokens would drop computed blocks")
        for block in reversed(blocks.table[keep:]):
            self._release(block)
        del blocks.table[keep:]

    def evict(self, seq_id, first: int, last: int) -> None:
        """Gives back ``seq_id``'s blocks ``[first, last)`` of its table (those still held), which
        no query of it reads again: StreamingLLM's eviction between the sinks and the window."""
        blocks = self._seqs[seq_id]
        if blocks.cache:
            raise ValueError(f"sequence {seq_id!r} is in the prefix cache: its blocks stay")
        for j in range(first, min(last, len(blocks.table))):
            if blocks.table[j] != EVICTED:
                self._release(blocks.table[j])
                blocks.table[j] = EVICTED

    def _release(self, block: int) -> None:
        if block == EVICTED:
            return
        self._refcount[block] -= 1
        if self._refcount[block] == 0:
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def free(self, seq_id) -> None:
        """Drops ``seq_id``'s references; its cached blocks stay revivable until evicted."""
        # Tail first, so the least shareable blocks are the first evicted.
        for block in reversed(self._seqs.pop(seq_id).table):
            self._release(block)

    def _take(self) -> int:
        """An unreferenced block, evicting the least recently freed cached one if need be."""
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self._hash_of.pop(block)]
        self._refcount[block] = 1
        return block
