"""Documents and chunkers: exact offsets, coverage, overlaps, size limits, parents, topic cuts."""

import itertools
import json
import re

import gin
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.data import train_tokenizer
from agentic_jax.retrieval import (
    Document,
    FixedSizeChunker,
    ParentChildChunker,
    RecursiveChunker,
    SemanticChunker,
    chunk_documents,
    load_documents,
    sentence_spans,
)

# Words, punctuation and whitespace of several kinds, multi-byte letters included.
pieces = st.sampled_from(
    ["jax", "Grad", "é", "naïve", "🙂", ".", "!", " ", "  ", "\n", "\n\n", "\t"]
)
texts = st.lists(pieces, max_size=40).map("".join)


def words(text: str) -> int:
    return len(re.findall(r"\S+", text))


def assert_exact(document: Document, chunks) -> None:
    for chunk in chunks:
        assert chunk.text == document.text[chunk.start : chunk.end]
        assert chunk.document_id == document.id and chunk.source == document.source


def reassemble(text: str, chunks) -> str:
    """The text from its chunks by their offsets: each chunk's part after its predecessor's end,
    checking that chunks start at 0 and leave no gap."""
    assert chunks[0].start == 0
    out, end = chunks[0].text, chunks[0].end
    for chunk in chunks[1:]:
        assert chunk.start <= end < chunk.end
        out += text[end : chunk.end]
        end = chunk.end
    return out


def assert_covers(text: str, chunks) -> None:
    """Chunks tile the text: contiguous, none empty, from 0 to its end."""
    assert [c.start for c in chunks[1:]] == [c.end for c in chunks[:-1]]
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    assert all(c.start < c.end for c in chunks)


@given(texts, st.integers(1, 6), st.data())
def test_fixed_size_windows_cover_the_text_once_but_for_their_overlaps(text, size, data):
    overlap = data.draw(st.integers(0, size - 1))
    document = Document("d", text, "d.txt")
    chunks = FixedSizeChunker(size, overlap).chunk(document)
    if not words(text):
        assert chunks == []
        return
    assert_exact(document, chunks)
    assert reassemble(text, chunks) == text
    assert chunks[-1].end == len(text)
    assert [c.id for c in chunks] == [f"d#{n}" for n in range(len(chunks))]
    assert all(words(c.text) == size for c in chunks[:-1]) and words(chunks[-1].text) <= size
    for before, after in itertools.pairwise(chunks):
        assert words(text[after.start : before.end]) == overlap  # exactly the overlap is shared


class ByteTokenizer:
    """UTF-8 bytes as tokens: a prefix of them can end inside a character."""

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


@given(texts, st.integers(1, 8), st.data())
def test_token_windows_never_split_a_character(text, size, data):
    overlap = data.draw(st.integers(0, size - 1))
    document = Document("d", text)
    chunks = FixedSizeChunker(size, overlap, tokenizer=ByteTokenizer()).chunk(document)
    if not text:
        assert chunks == []
        return
    assert_exact(document, chunks)
    assert reassemble(text, chunks) == text
    if size - overlap >= 4:  # a window's start can go back to a character boundary
        for before, after in itertools.pairwise(chunks):
            assert len(text[after.start : before.end].encode()) >= overlap
    # A window grows past `size` bytes only by the rest of a character (at most 3 bytes).
    assert all(len(c.text.encode()) <= size + 3 for c in chunks)


def test_token_windows_with_the_projects_byte_level_bpe(tmp_path):
    (tmp_path / "corpus.txt").write_text("naïve café jax grad mesh shard 🙂 " * 50)
    tokenizer = train_tokenizer(
        tmp_path / "tokenizer.json", files=[tmp_path / "corpus.txt"], vocab_size=300
    )
    document = Document("d", "A naïve café 🙂 about jax.\n\nGrad of mesh shards é🙂é.")
    chunks = FixedSizeChunker(5, 2, tokenizer=tokenizer).chunk(document)
    assert_exact(document, chunks)
    assert reassemble(document.text, chunks) == document.text
    assert len(chunks) > 3 and len(tokenizer.encode(document.text)) > 5


def test_a_tokenizer_that_changes_the_text_is_refused():
    class Lower(ByteTokenizer):
        def encode(self, text):
            return super().encode(text.lower())

    with pytest.raises(ValueError, match="does not give the text back"):
        FixedSizeChunker(4, 1, tokenizer=Lower()).spans("Mixed Case")
    with pytest.raises(ValueError, match="overlap < size"):
        FixedSizeChunker(4, 4)


markdown = st.lists(
    st.one_of(
        st.sampled_from(["# Title\n", "## Part\n", "\n", "\n\n"]),
        st.lists(st.sampled_from(["jax", "grad", "mesh", "é", " ", ". ", "! "]), max_size=12).map(
            "".join
        ),
    ),
    max_size=12,
).map("".join)


@given(markdown, st.integers(1, 40))
def test_recursive_chunks_fit_the_limit_and_cover_the_text(text, max_size):
    document = Document("d", text)
    chunks = RecursiveChunker(max_size).chunk(document)
    if not text:
        assert chunks == []
        return
    assert_exact(document, chunks)
    assert_covers(text, chunks)
    assert all(len(c.text) <= max_size for c in chunks)


def test_recursive_cuts_at_the_coarsest_structure_that_fits():
    text = "# One\n\nAlpha beta. Gamma delta.\n\n# Two\n\nEpsilon zeta."
    sections = RecursiveChunker(33).spans(text)
    assert [text[s:e] for s, e in sections] == [
        "# One\n\nAlpha beta. Gamma delta.\n\n",
        "# Two\n\nEpsilon zeta.",
    ]
    # Paragraphs, then sentences (merged while they fit); the limit counted in words.
    by_words = RecursiveChunker(3, length=words).spans(text)
    assert [text[s:e] for s, e in by_words] == [
        "# One\n\n",
        "Alpha beta. ",
        "Gamma delta.\n\n",
        "# Two\n\n",
        "Epsilon zeta.",
    ]
    merged = RecursiveChunker(5, length=words).spans("One. Two. Three. Four five six.")
    assert merged == [(0, 17), (17, 31)]
    assert RecursiveChunker(3).spans("abcdefg") == [(0, 3), (3, 6), (6, 7)]


@given(markdown, st.integers(20, 60), st.integers(3, 19))
def test_parents_contain_their_children(text, parent_size, child_size):
    document = Document("doc", text, "doc.md")
    parents, children = ParentChildChunker(
        RecursiveChunker(parent_size), RecursiveChunker(child_size)
    ).chunk(document)
    assert_exact(document, parents + children)
    if not text:
        assert parents == children == []
        return
    assert_covers(text, parents)
    assert_covers(text, children)
    by_id = {p.id: p for p in parents}
    for child in children:
        parent = by_id[child.parent_id]
        assert parent.start <= child.start < child.end <= parent.end
        assert child.id.startswith(f"{parent.id}.") and len(child.text) <= child_size
    assert all(p.parent_id is None for p in parents)


TOPIC_SENTENCES = ["Alpha one. ", "Alpha two! ", "Beta one. ", "Beta two? ", "Gamma one. "]


def topic_embedding(sentences: list[str]) -> np.ndarray:
    """A one-hot vector of each sentence's topic (its first word)."""
    topics = ["Alpha", "Beta", "Gamma"]
    return np.eye(3)[[topics.index(s.split()[0]) for s in sentences]]


@given(st.lists(st.sampled_from(TOPIC_SENTENCES), min_size=1, max_size=10))
def test_semantic_chunks_end_exactly_where_the_topic_changes(sentences):
    text = "".join(sentences)
    chunks = SemanticChunker(topic_embedding, threshold=0.5).chunk(Document("d", text))
    assert_covers(text, chunks)
    expected, current = [], sentences[0]
    for before, sentence in itertools.pairwise(sentences):
        if before.split()[0] == sentence.split()[0]:
            current += sentence
        else:
            expected.append(current)
            current = sentence
    assert [c.text for c in chunks] == [*expected, current]


def test_semantic_percentile_cuts_at_the_least_similar_gaps():
    sentences = ["Alpha one. ", "Alpha two. ", "Alpha one. ", "Beta one. ", "Beta two. "]
    text = "".join(sentences)
    assert [text[s:e] for s, e in sentence_spans(text)] == sentences
    spans = SemanticChunker(topic_embedding, percentile=50).spans(text)
    assert [text[s:e] for s, e in spans] == [
        "Alpha one. Alpha two. Alpha one. ",
        "Beta one. Beta two. ",
    ]
    with pytest.raises(ValueError, match="exactly one"):
        SemanticChunker(topic_embedding)


def test_loading_text_markdown_and_json_lines(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_bytes(b"# A\r\n\r\ntext")
    (tmp_path / "sub" / "b.txt").write_text("plain")
    records = [{"id": "r1", "text": "first", "lang": "en"}, {"text": "second"}]
    (tmp_path / "sub" / "c.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n\n")
    (tmp_path / "skip.py").write_text("not a document")
    documents = load_documents(tmp_path)
    assert documents == [
        Document("a.md", "# A\r\n\r\ntext", "a.md"),  # newlines as the file has them
        Document("sub/b.txt", "plain", "sub/b.txt"),
        Document("r1", "first", "sub/c.jsonl", {"lang": "en"}),
        Document("sub/c.jsonl#2", "second", "sub/c.jsonl"),
    ]
    chunks = chunk_documents(documents, RecursiveChunker(4))
    assert [c.id for c in chunks[:3]] == ["a.md#0", "a.md#1", "a.md#2"]
    assert chunks[-1].metadata == {} and chunks[-3].metadata == {"lang": "en"}
    assert load_documents(tmp_path / "sub" / "b.txt") == [Document("b.txt", "plain", "b.txt")]

    (tmp_path / "dup.jsonl").write_text('{"id": "r1", "text": "again"}\n')
    with pytest.raises(ValueError, match="'r1' appears twice"):
        load_documents(tmp_path)
    (tmp_path / "dup.jsonl").write_text('{"id": "x"}\nnot json\n')
    with pytest.raises(ValueError, match=r"dup\.jsonl:1: a record needs a string 'text'"):
        load_documents(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_documents(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"no \.rst files"):
        load_documents(tmp_path / "sub", suffixes=(".rst",))


def test_chunkers_are_gin_configurable():
    gin.clear_config()
    try:
        gin.parse_config(
            [
                "parent/retrieval.RecursiveChunker.max_size = 100",
                "child/retrieval.RecursiveChunker.max_size = 10",
                "retrieval.ParentChildChunker.parent = @parent/retrieval.RecursiveChunker()",
                "retrieval.ParentChildChunker.child = @child/retrieval.RecursiveChunker()",
                "retrieval.FixedSizeChunker.size = 3",
                "retrieval.FixedSizeChunker.overlap = 1",
            ]
        )
        chunker = ParentChildChunker()
        assert (chunker.parent.max_size, chunker.child.max_size) == (100, 10)
        assert FixedSizeChunker().spans("a b c d e") == [(0, 6), (4, 9)]
    finally:
        gin.clear_config()
