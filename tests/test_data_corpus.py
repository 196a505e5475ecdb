"""Shipped corpus, multi-document text files and the unigram-entropy baseline."""

import hashlib
import math
import os
import pathlib
import stat

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.data.corpus import corpus_files, corpus_manifest
from agentic_jax.data.corpus.build import is_heldout
from agentic_jax.data.documents import read_documents, write_documents
from agentic_jax.data.stats import entropy_of_counts, unigram_entropy
from agentic_jax.data.tokenized_corpus import tokenize_files
from agentic_jax.data.tokenizer import IM_END, Tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def splits():
    return {split: list(read_documents(corpus_files(split))) for split in ("train", "heldout")}


def test_shipped_corpus_matches_its_manifest(splits):
    manifest = corpus_manifest()["splits"]
    for split, docs in splits.items():
        (path,) = corpus_files(split)
        entry = manifest[split]
        assert len(docs) == entry["documents"]
        assert sum(len(d) for d in docs) == entry["characters"]
        assert hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest() == entry["sha256"]
    raw = sum(entry["utf8_bytes"] for entry in manifest.values())
    compressed = sum(entry["gzip_bytes"] for entry in manifest.values())
    assert 3e6 <= raw <= 6e6 and compressed < 2e6


def test_heldout_split_is_disjoint_and_about_five_percent(splits):
    train, heldout = splits["train"], splits["heldout"]
    assert not set(train) & set(heldout)
    assert all(map(is_heldout, heldout)) and not any(map(is_heldout, train))
    assert 0.03 < len(heldout) / (len(train) + len(heldout)) < 0.08
    assert any("Return" in d for d in heldout)  # English prose, not binary noise.


def test_unknown_split_is_rejected():
    with pytest.raises(ValueError, match="split"):
        corpus_files("validation")


documents = st.lists(st.text(st.characters(codec="utf-8"), max_size=30), max_size=5)


@given(documents, st.sampled_from(["docs.txt", "docs.txt.gz"]))
def test_documents_round_trip(tmp_path_factory, docs, name):
    path = tmp_path_factory.mktemp("docs") / name
    count = write_documents(path, docs)
    expected = [d.replace("\f", "\n").strip("\n") for d in docs]
    expected = [d for d in expected if d.strip()]
    assert count == len(expected)
    assert list(read_documents([path, path])) == expected * 2


def test_gzip_output_is_byte_reproducible(tmp_path):
    write_documents(tmp_path / "a.txt.gz", ["one", "two"])
    write_documents(tmp_path / "b.txt.gz", ["one", "two"])
    assert (tmp_path / "a.txt.gz").read_bytes() == (tmp_path / "b.txt.gz").read_bytes()


def test_file_without_separators_is_one_document(tmp_path):
    (tmp_path / "plain.txt").write_text("para one\n\npara two\n")
    assert list(read_documents([tmp_path / "plain.txt"])) == ["para one\n\npara two"]


@given(st.lists(st.integers(0, 50), min_size=1, max_size=200))
def test_unigram_entropy_matches_numpy(ids):
    _, counts = np.unique(ids, return_counts=True)
    p = counts / counts.sum()
    assert unigram_entropy(np.array(ids)) == pytest.approx(-np.sum(p * np.log(p)), abs=1e-12)


def test_unigram_entropy_known_values():
    assert math.copysign(1.0, unigram_entropy([7, 7, 7])) == 1.0  # 0.0, not -0.0
    assert unigram_entropy(np.arange(8).reshape(2, 4)) == pytest.approx(math.log(8))
    with pytest.raises(ValueError):
        unigram_entropy([])


@pytest.mark.parametrize("counts", [[0, 0, 0], [], [-1, 2]])
def test_entropy_of_counts_rejects_counts_without_a_distribution(counts):
    with pytest.raises(ValueError, match="positive total"):
        entropy_of_counts(counts)


def test_tokenized_cache_follows_the_special_tokens_not_only_the_vocabulary(tmp_path):
    """Same vocabulary (same fingerprint), another EOS (as a tokenizer_config.json can name):
    the cache must not hand back tokens ending in the old EOS."""
    write_documents(tmp_path / "docs.txt", ["one document", "and another one"])
    plain = train_tokenizer(
        tmp_path / "tokenizer.json", files=[tmp_path / "docs.txt"], vocab_size=300
    )
    chat = Tokenizer(plain.backend, eos_token=IM_END)
    assert chat.fingerprint == plain.fingerprint and chat.eos_id != plain.eos_id
    for tok in (plain, chat):
        corpus = tokenize_files(tok, [tmp_path / "docs.txt"], cache_dir=tmp_path / "cache")
        assert set(corpus.tokens[corpus.offsets[1:] - 1]) == {tok.eos_id}


def test_tokenized_cache_write_cleans_up_and_respects_umask(tmp_path, monkeypatch):
    """A failed write (disk full) leaves no temporary file; a written cache is readable by
    whoever the umask allows (mkstemp's 0600 would hide a shared cache)."""
    write_documents(tmp_path / "docs.txt", ["one document"])
    tokenizer = train_tokenizer(
        tmp_path / "tokenizer.json", files=[tmp_path / "docs.txt"], vocab_size=300
    )
    cache = tmp_path / "cache"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(np, "savez", disk_full)
        with pytest.raises(OSError, match="No space"):
            tokenize_files(tokenizer, [tmp_path / "docs.txt"], cache_dir=cache)
    assert list(cache.iterdir()) == []
    old_umask = os.umask(0o022)
    try:
        tokenize_files(tokenizer, [tmp_path / "docs.txt"], cache_dir=cache)
    finally:
        os.umask(old_umask)
    (cached,) = cache.iterdir()
    assert cached.suffix == ".npz" and stat.S_IMODE(cached.stat().st_mode) == 0o644
