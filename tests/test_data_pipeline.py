"""grain pipeline: packed rows are consistent, epochs lose/duplicate nothing, state resumes."""

import json

import gin
import grain
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.documents import read_documents, write_documents
from agentic_jax.data.packing import next_token_example, pack_batches
from agentic_jax.data.pipeline import heldout_data, train_data
from agentic_jax.data.tokenized_corpus import TokenizedCorpus, tokenize_files
from agentic_jax.data.tokenizer import train_tokenizer

SEQ_LEN, BATCH = 64, 4
FEATURES = ("tokens", "targets", "segment_ids", "positions", "loss_mask")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer(path, files=corpus_files("heldout"), vocab_size=400)


@pytest.fixture(scope="module")
def docs():
    """A few real documents, some longer than one row, so pieces are split and packed."""
    short = [d for d in read_documents(corpus_files("heldout")) if len(d) < 1500]
    return short[:12] + [d for d in read_documents(corpus_files("heldout")) if len(d) > 3000][:1]


@pytest.fixture(scope="module")
def text_file(docs, tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    write_documents(path, docs)
    return str(path)


@pytest.fixture(scope="module")
def reference(tokenizer, docs):
    """The unpacked stream cut by hand: consecutive pieces of seq_len + 1 overlapping by one."""
    pieces = []
    for doc in docs:
        ids = tokenizer.encode(doc, add_bos=True, add_eos=True)
        pieces += [tuple(ids[s : s + SEQ_LEN + 1]) for s in range(0, len(ids) - 1, SEQ_LEN)]
    assert max(map(len, pieces)) == SEQ_LEN + 1 and len(pieces) > 2 * BATCH
    return sorted(pieces)


def check_rows(batch):
    """Asserts the packing invariants of every row; returns the (tokens + last target) pieces."""
    assert set(batch) == set(FEATURES)
    for name in FEATURES:
        assert batch[name].shape == (BATCH, SEQ_LEN) and batch[name].dtype == np.int32
    pieces = []
    for row in range(BATCH):
        tokens, targets, seg, pos, mask = (batch[name][row] for name in FEATURES)
        n = np.count_nonzero(seg)
        assert (seg[n:] == 0).all() and (seg[:n] > 0).all()  # padding only at the end.
        assert (tokens[n:] == 0).all() and (targets[n:] == 0).all() and (pos[n:] == 0).all()
        np.testing.assert_array_equal(mask, seg > 0)
        if n:
            assert seg[0] == 1 and set(np.diff(seg[:n])) <= {0, 1}
        for s in range(1, (seg.max() if n else 0) + 1):
            idx = np.flatnonzero(seg == s)
            np.testing.assert_array_equal(pos[idx], np.arange(len(idx)))
            np.testing.assert_array_equal(tokens[idx[1:]], targets[idx[:-1]])
            pieces.append(tuple(tokens[idx]) + (targets[idx[-1]],))
    return pieces


def test_one_epoch_packs_every_piece_exactly_once(tokenizer, text_file, reference):
    batches = list(
        train_data(
            tokenizer, [text_file], seq_len=SEQ_LEN, batch_size=BATCH, num_epochs=1, prefetch=0
        )
    )
    packed = [p for b in batches for p in check_rows(b)]
    assert sorted(packed) == reference
    assert sum(int(b["loss_mask"].sum()) for b in batches) == sum(len(p) - 1 for p in reference)
    assert np.mean([(b["segment_ids"] > 0).mean() for b in batches[:-1]]) > 0.8  # little padding.


def test_epochs_are_reshuffled(tokenizer, text_file, reference):
    # One packing bin keeps the pieces in their shuffled order, so the epochs can be compared.
    batches = list(
        train_data(
            tokenizer,
            [text_file],
            seq_len=SEQ_LEN,
            batch_size=BATCH,
            num_epochs=2,
            seed=5,
            num_packing_bins=1,
            prefetch=0,
        )
    )
    packed = [p for b in batches for p in check_rows(b)]
    first, second = packed[: len(reference)], packed[len(reference) :]
    assert sorted(first) == sorted(second) == reference
    assert first != second


def first_batches(tokenizer, text_file, seed, n=3):
    it = iter(train_data(tokenizer, [text_file], seq_len=SEQ_LEN, batch_size=BATCH, seed=seed))
    return [next(it)["tokens"] for _ in range(n)]


def test_seeded_shuffle_is_deterministic_and_seed_dependent(tokenizer, text_file):
    a, b, c = (first_batches(tokenizer, text_file, seed) for seed in (0, 0, 1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_iterator_resumes_after_get_state_set_state(tokenizer, text_file):
    def make():
        return train_data(tokenizer, [text_file], seq_len=SEQ_LEN, batch_size=BATCH, seed=2)

    it = iter(make())
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # survives JSON, as in a checkpoint.
    expected = [next(it) for _ in range(5)]
    for resumed in (iter(make()), it):  # a fresh pipeline object, and rewinding the same one.
        resumed.set_state(state)
        for want in expected:
            got = next(resumed)
            for name in FEATURES:
                np.testing.assert_array_equal(got[name], want[name])


def test_iterator_state_in_an_orbax_checkpoint(tokenizer, text_file, tmp_path):
    import orbax.checkpoint as ocp

    def make():
        return iter(train_data(tokenizer, [text_file], seq_len=SEQ_LEN, batch_size=BATCH))

    it = make()
    next(it)
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.save(1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
    want = next(it)["tokens"]
    with ocp.CheckpointManager(tmp_path) as manager:
        restored = manager.restore(
            1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(make()))
        )
    np.testing.assert_array_equal(next(restored["data"])["tokens"], want)


def test_heldout_is_finite_ordered_and_complete(tokenizer, text_file, reference):
    ds = heldout_data(tokenizer, [text_file], seq_len=SEQ_LEN, batch_size=BATCH)
    batches = list(ds)
    assert sorted(p for b in batches for p in check_rows(b)) == reference
    again = list(ds)
    assert len(again) == len(batches)
    for a, b in zip(again, batches):
        np.testing.assert_array_equal(a["tokens"], b["tokens"])


@pytest.mark.parametrize("shard_count", [2, 5])
def test_shards_partition_the_pieces_into_equally_many_batches(
    tokenizer, text_file, reference, shard_count
):
    """Every host runs the same number of eval steps (a collective step would hang otherwise);
    with 5 hosts the shares pack into 8 or 9 batches, so the short ones end in padding."""
    packed, lengths = [], set()
    for shard in range(shard_count):
        batches = list(
            heldout_data(
                tokenizer,
                [text_file],
                seq_len=SEQ_LEN,
                batch_size=BATCH,
                shard_index=shard,
                shard_count=shard_count,
            )
        )
        shard_pieces = [p for b in batches for p in check_rows(b)]
        assert 0 < len(shard_pieces) < len(reference)
        packed += shard_pieces
        lengths.add(len(batches))
    assert sorted(packed) == reference and len(lengths) == 1


def test_tokenized_corpus_cache(tokenizer, text_file, tmp_path):
    fresh = tokenize_files(tokenizer, [text_file])
    first = tokenize_files(tokenizer, [text_file], cache_dir=tmp_path)
    (cache_file,) = tmp_path.iterdir()
    cache_file.write_bytes(cache_file.read_bytes())  # touch: the second call must read it.
    second = tokenize_files(tokenizer, [text_file], cache_dir=tmp_path)
    for corpus in (first, second):
        np.testing.assert_array_equal(corpus.tokens, fresh.tokens)
        np.testing.assert_array_equal(corpus.offsets, fresh.offsets)
    assert fresh.tokens.dtype == np.int32 and fresh.tokens[0] == tokenizer.bos_id
    other = tmp_path / "other.txt"
    write_documents(other, ["a different text"])
    tokenize_files(tokenizer, [other], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("tokens-*.npz"))) == 2


@given(st.lists(st.integers(2, 40), min_size=1, max_size=8), st.integers(2, 12))
def test_chunk_bounds_cover_every_next_token_pair_once(lengths, max_len):
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    corpus = TokenizedCorpus(np.arange(offsets[-1], dtype=np.int32), offsets)
    bounds = corpus.chunk_bounds(max_len)
    sizes = bounds[:, 1] - bounds[:, 0]
    assert (sizes >= 2).all() and (sizes <= max_len).all()
    pairs = sorted(i for start, end in bounds for i in range(start, end - 1))
    doc_ends = set(offsets[1:] - 1)
    assert pairs == [i for i in range(offsets[-1]) if i not in doc_ends]


def test_loss_mask_follows_the_trained_targets():
    ids = np.arange(1, 9)
    trained = np.array([0, 0, 0, 1, 1, 0, 1, 1])
    example = next_token_example(ids, trained)
    np.testing.assert_array_equal(example["loss_mask"], trained[1:])
    ds = grain.MapDataset.source([example, next_token_example(ids[:3])]).to_iter_dataset()
    (batch,) = list(
        pack_batches(ds, seq_len=16, batch_size=2, num_packing_bins=2, shuffle_bins=False)
    )
    row = batch["loss_mask"][0]
    np.testing.assert_array_equal(row, np.r_[trained[1:], 1, 1, np.zeros(7, int)])
    assert (batch["segment_ids"][1] == 0).all()  # the padding row of the last batch.


@given(st.lists(st.integers(1, 6), min_size=1, max_size=12))
def test_segment_ids_count_up_with_no_gaps(lengths):
    """Examples of one id (no target) take no segment id; every other target is packed once."""
    examples = [next_token_example(np.arange(1, n + 1) * 10 + i) for i, n in enumerate(lengths)]
    batches = list(
        pack_batches(
            grain.MapDataset.source(examples).to_iter_dataset(),
            seq_len=8,
            batch_size=2,
            num_packing_bins=2,
            shuffle_bins=False,
        )
    )
    segments = 0
    for segment_ids in (row for b in batches for row in b["segment_ids"]):
        ids = segment_ids[segment_ids > 0]
        assert set(ids) == set(range(1, len(set(ids)) + 1)) and (np.diff(ids) >= 0).all()
        segments += len(set(ids))
    assert segments == sum(n > 1 for n in lengths)
    assert sum(int(b["loss_mask"].sum()) for b in batches) == sum(n - 1 for n in lengths)


@pytest.mark.parametrize("trained", [[1] * 9, [1] * 7])
def test_a_mask_of_another_length_than_the_ids_is_rejected(trained):
    # Packed as is, it would slide onto the next document's tokens and the padding.
    with pytest.raises(ValueError, match="trained has shape"):
        next_token_example(np.arange(1, 9), trained)


def test_gin_names_configure_the_pipeline(tokenizer, text_file):
    gin.parse_config(
        [
            "train_data.batch_size = 2",
            "heldout_data.batch_size = 3",
            "train_tokenizer.vocab_size = 300",
        ]
    )
    try:
        train = next(iter(train_data(tokenizer, [text_file], seq_len=SEQ_LEN, prefetch=0)))
        heldout = next(iter(heldout_data(tokenizer, [text_file], seq_len=SEQ_LEN)))
        assert train["tokens"].shape == (2, SEQ_LEN) and heldout["tokens"].shape == (3, SEQ_LEN)
        assert gin.query_parameter("train_tokenizer.vocab_size") == 300
    finally:
        gin.clear_config()
