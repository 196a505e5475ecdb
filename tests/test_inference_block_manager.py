"""The block manager as a state machine against a model of what every physical block holds."""

import collections

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from agentic_jax.inference.serving.block_manager import BlockManager

BLOCK_SIZE, NUM_BLOCKS = 2, 12
# A two-letter alphabet and short prompts make prefix-cache hits (and full hits) common.
prompts = st.lists(st.integers(0, 1), min_size=1, max_size=7)


class BlockManagerMachine(RuleBasedStateMachine):
    """``content[block][offset]`` is the token prefix whose K/V the slot holds (K/V of position p
    depends on tokens[:p + 1]); every computed position of every live sequence must read back its
    own prefix through its block table."""

    seqs = Bundle("seqs")

    @initialize()
    def setup(self):
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
        self.content = [[None] * BLOCK_SIZE for _ in range(NUM_BLOCKS)]
        self.tokens, self.next_id = {}, 0

    def _write(self, seq, start, end):
        """prepare_write, then the device's part: copies, then the K/V of positions [start, end)."""
        table = self.bm.block_table(seq)
        shared = {
            j
            for j in range(start // BLOCK_SIZE, (end - 1) // BLOCK_SIZE + 1)
            if j < len(table) and self.bm.refcount(table[j]) > 1
        }
        expected_cost = self.bm.blocks_to_write(seq, start, end)
        free_before = self.bm.num_free_blocks
        copies = self.bm.prepare_write(seq, start, end)
        assert free_before - self.bm.num_free_blocks == expected_cost
        # Copy-on-write exactly for the written blocks that another table also held.
        assert sorted(src for src, _ in copies) == sorted(table[j] for j in shared)
        for src, dst in copies:
            assert self.bm.refcount(dst) == 1 and self.bm.refcount(src) >= 1
            self.content[dst] = list(self.content[src])
        table = self.bm.block_table(seq)
        for p in range(start, end):
            self.content[table[p // BLOCK_SIZE]][p % BLOCK_SIZE] = tuple(self.tokens[seq][: p + 1])
        self.bm.commit(seq, self.tokens[seq], end)

    @rule(target=seqs, prompt=prompts)
    def admit(self, prompt):
        cost = self.bm.admission_cost(prompt)
        if cost > self.bm.num_free_blocks:
            with pytest.raises(MemoryError):
                self.bm.allocate("never", prompt)
            return "never"
        seq, self.next_id = self.next_id, self.next_id + 1
        free_before = self.bm.num_free_blocks
        self.tokens[seq] = list(prompt)
        cached = self.bm.allocate(seq, prompt)
        assert cached % BLOCK_SIZE == 0 or cached == len(prompt) - 1
        assert 0 <= cached < len(prompt)
        table = self.bm.block_table(seq)
        # Hits are blocks already holding exactly this prefix.
        for p in range(cached):
            assert self.content[table[p // BLOCK_SIZE]][p % BLOCK_SIZE] == tuple(prompt[: p + 1])
        self._write(seq, cached, len(prompt))
        assert free_before - self.bm.num_free_blocks == cost
        return seq

    @rule(seq=seqs, token=st.integers(0, 1))
    def decode(self, seq, token):
        if seq not in self.tokens:
            return
        pos = len(self.tokens[seq])
        if self.bm.blocks_to_write(seq, pos, pos + 1) > self.bm.num_free_blocks:
            return
        self.tokens[seq].append(token)
        self._write(seq, pos, pos + 1)

    @rule(seq=consumes(seqs))
    def finish(self, seq):
        if seq in self.tokens:
            self.bm.free(seq)
            del self.tokens[seq]

    @rule(prompt=prompts)
    def same_prompt_while_live_shares_its_blocks(self, prompt):
        """A prompt equal to a live sequence's computed full blocks hits all of them."""
        live = [s for s, t in self.tokens.items() if t[: len(prompt)] == prompt]
        full = (len(prompt) // BLOCK_SIZE) * BLOCK_SIZE
        if not live or full == 0 or self.bm.admission_cost(prompt) > self.bm.num_free_blocks:
            return
        owners = [self.bm.block_table(s)[: full // BLOCK_SIZE] for s in live]
        seq, self.next_id = self.next_id, self.next_id + 1
        self.tokens[seq] = list(prompt)
        cached = self.bm.allocate(seq, prompt)
        assert cached == min(full, len(prompt) - 1)
        # Equal hash chains name one block: some live owner's blocks are the ones reused.
        assert self.bm.block_table(seq)[: full // BLOCK_SIZE] in owners
        self._write(seq, cached, len(prompt))
        self.bm.free(seq)
        del self.tokens[seq]

    @invariant()
    def refcounts_match_tables(self):
        if not hasattr(self, "bm"):
            return
        held = collections.Counter(b for s in self.tokens for b in self.bm.block_table(s))
        for block in range(NUM_BLOCKS):
            assert self.bm.refcount(block) == held[block] >= 0
        for s in self.tokens:
            table = self.bm.block_table(s)
            assert len(set(table)) == len(table)
            assert len(table) == self.bm.blocks_for(len(self.tokens[s]))
        # Free and referenced blocks partition the pool: nothing double-allocated or lost.
        free = set(self.bm._free) | set(self.bm._evictable)
        assert len(free) == self.bm.num_free_blocks
        assert free.isdisjoint(held) and len(free) + len(held) == NUM_BLOCKS

    @invariant()
    def every_live_position_reads_back_its_prefix(self):
        if not hasattr(self, "bm"):
            return
        for s, tokens in self.tokens.items():
            table = self.bm.block_table(s)
            for p in range(len(tokens)):
                assert self.content[table[p // BLOCK_SIZE]][p % BLOCK_SIZE] == tuple(
                    tokens[: p + 1]
                )

    def teardown(self):
        if hasattr(self, "bm"):
            for s in list(self.tokens):
                self.bm.free(s)
            assert self.bm.num_free_blocks == NUM_BLOCKS
            assert all(self.bm.refcount(b) == 0 for b in range(NUM_BLOCKS))


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=40, stateful_step_count=30)


def test_full_prompt_hit_copies_the_shared_last_block_on_write():
    bm = BlockManager(8, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    assert bm.allocate("a", prompt) == 0
    assert bm.prepare_write("a", 0, 8) == []
    bm.commit("a", prompt, 8)
    assert bm.admission_cost(prompt) == 1  # only the copy of the last block
    assert bm.allocate("b", prompt) == 7
    a, b = bm.block_table("a"), bm.block_table("b")
    assert a == b and bm.refcount(a[1]) == 2
    [(src, dst)] = bm.prepare_write("b", 7, 8)
    assert src == a[1] and bm.block_table("b") == [a[0], dst] and bm.refcount(a[1]) == 1
    assert bm.hit_tokens == 7 and bm.queried_tokens == 16


def test_freed_cached_blocks_are_revived_then_evicted_least_recent_first():
    bm = BlockManager(3, 2)
    bm.allocate("a", [1, 2, 3])
    bm.prepare_write("a", 0, 3)
    bm.commit("a", [1, 2, 3], 3)
    bm.free("a")
    assert bm.num_free_blocks == 3
    assert bm.allocate("b", [1, 2, 9]) == 2  # revived from the evictable set
    bm.free("b")
    bm.allocate("c", [5, 6, 7, 8, 9])  # needs all three blocks: evicts [1, 2]'s block
    bm.prepare_write("c", 0, 5)
    bm.free("c")
    assert bm.allocate("d", [1, 2, 3]) == 0
