"""Byte-level BPE tokenizer: training, exact round trips, special tokens, third-party files."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.tokenizer import (
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    Tokenizer,
    load_tokenizer,
    train_tokenizer,
)

VOCAB = 400


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer(path, files=corpus_files("heldout"), vocab_size=VOCAB)


def test_trained_vocab_learns_merges_and_reloads(tokenizer, tmp_path):
    assert tokenizer.vocab_size == VOCAB
    text = "Return the number of items in the container."
    ids = tokenizer.encode(text)
    assert len(ids) < len(text.encode()) // 2  # merges learnt from English prose.
    tokenizer.save(tmp_path / "sub" / "tokenizer.json")
    reloaded = load_tokenizer(tmp_path / "sub")
    assert reloaded.encode(text) == ids
    assert reloaded.fingerprint == tokenizer.fingerprint


def test_vocab_size_too_small_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(tmp_path / "t.json", files=corpus_files("heldout"), vocab_size=100)


@given(st.text())
def test_round_trips_arbitrary_unicode(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@given(st.text(st.characters(codec="utf-8"), max_size=50), st.sampled_from(SPECIAL_TOKENS))
def test_special_tokens_are_single_ids(tokenizer, text, special):
    special_id = tokenizer.token_id(special)
    assert tokenizer.encode(special) == [special_id]
    ids = tokenizer.encode(text + special + text)
    assert ids.count(special_id) == 1 + 2 * text.count(special)
    assert tokenizer.decode(ids) == text + special + text


@given(
    st.lists(
        st.text(st.characters(codec="utf-8"), max_size=10) | st.sampled_from(SPECIAL_TOKENS),
        max_size=6,
    )
)
def test_plain_encoding_spells_special_token_strings_as_text(tokenizer, pieces):
    """Text from outside the template (tool output) cannot forge a turn boundary or a tool call."""
    text = "".join(pieces)
    ids = tokenizer.encode(text, special=False)
    assert not set(ids) & set(tokenizer.special_ids.values())
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(text) == tokenizer.backend.encode(text, add_special_tokens=False).ids


def test_special_ids_bos_eos_pad(tokenizer):
    assert tokenizer.special_ids == {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2)
    ids = tokenizer.encode("hi", add_bos=True, add_eos=True)
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hi"
    assert tokenizer.encode_batch(["hi", ""], add_eos=True) == [tokenizer.encode("hi") + [2], [2]]
    with pytest.raises(KeyError):
        tokenizer.token_id("<|no such token|>")


def test_loads_tokenizer_saved_by_transformers(tmp_path):
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers

    PreTrainedTokenizerFast = pytest.importorskip("transformers").PreTrainedTokenizerFast
    backend = Backend(
        models.WordLevel(
            {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "hello": 4, "world": 5}, unk_token="<unk>"
        )
    )
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    hf.save_pretrained(tmp_path)
    for path in (tmp_path, tmp_path / "tokenizer.json"):
        tok = load_tokenizer(path)
        assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 3, 6)
        assert tok.encode("hello world", add_bos=True, add_eos=True) == [1, 4, 5, 2]
        assert hf.encode("hello world", add_special_tokens=False) == [4, 5]
    # A config naming other tokens wins over the usual names; an explicit null means "none".
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.update(bos_token={"content": "hello"}, pad_token=None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(tmp_path)
    assert (tok.bos_id, tok.pad_id) == (4, None)
    with pytest.raises(ValueError, match="no BOS"):
        Tokenizer(tok.backend, bos_token=None).encode("x", add_bos=True)


def test_bare_tokenizer_json_uses_usual_names(tokenizer, tmp_path):
    tokenizer.save(tmp_path / "tokenizer.json")
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert tok.token_id(BOS) == tok.bos_id and tok.token_id(EOS) == tok.eos_id
    assert tok.token_id(PAD) == tok.pad_id
