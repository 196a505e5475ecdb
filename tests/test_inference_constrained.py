"""Regex / JSON-schema constrained decoding with a byte-level BPE tokenizer and the text helper."""

import json
import re

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings

from agentic_jax.data.tokenizer import EOS, IM_END, train_tokenizer
from agentic_jax.inference import (
    SamplingParams,
    generate_text,
    json_schema_constraint,
    regex_constraint,
    token_bytes,
)
from agentic_jax.models import TransformerConfig, param_shapes

TEXT = (
    "Ünïcödé and plain words: the quick brown fox jumps over the lazy dog. "
    '{"name": "fox", "ok": true, "n": [1, 2, 3]} héllo wörld 日本語 '
) * 20
CHATS = [[{"role": "user", "content": c}] for c in ("a JSON value:", "another one", "x", "{")]
# Every generation below completes CHATS with a constraint of STATES states: one compilation.
STATES = 256
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    corpus = directory / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    return train_tokenizer(
        directory / "tokenizer.json", files=[corpus], vocab_size=300, min_frequency=1
    )


@pytest.fixture(scope="module")
def model(tokenizer):
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        d_ff=32,
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, 0.5, s.shape), s.dtype), param_shapes(config)
    )
    return params, config


def _constraint(tokenizer, vocab_size, *, regex=None, schema=None):
    """Chat turns end with <|im_end|>, so that is the constraint's EOS."""
    tokens, end = token_bytes(tokenizer, vocab_size), tokenizer.token_id(IM_END)
    if regex is not None:
        return regex_constraint(regex, tokens, end, num_states=STATES)
    return json_schema_constraint(schema, tokens, end, num_states=STATES)


def _complete(model, tokenizer, sampling=None, **pattern):
    params, config = model
    sampling = sampling or SamplingParams(max_tokens=MAX_TOKENS)
    return generate_text(
        params,
        config,
        tokenizer,
        CHATS,
        sampling=sampling,
        key=jax.random.key(0),
        constraint=_constraint(tokenizer, config.vocab_size, **pattern),
    )


def test_token_bytes_undo_the_byte_level_alias(tokenizer):
    tokens = token_bytes(tokenizer)
    special = {tokenizer.token_id(EOS), tokenizer.pad_id, tokenizer.bos_id}
    assert all(tokens[i] is None for i in special)
    assert tokens[tokenizer.encode(" ")[0]] == b" "
    text = 'héllo wörld 日本語 {"ok": true}'
    assert b"".join(tokens[i] for i in tokenizer.encode(text)) == text.encode("utf-8")
    assert any(t is not None and not _is_utf8(t) for t in tokens)  # partial characters exist
    assert token_bytes(tokenizer, tokenizer.vocab_size + 3)[-3:] == [None] * 3


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_regex_constrained_text_matches(model, tokenizer):
    regex = r"[a-c]{2,4}-(é|[0-9]){1,3}"
    out = _complete(model, tokenizer, regex=regex)
    end = tokenizer.token_id(IM_END)
    for text, tokens, n in zip(
        out.texts, np.asarray(out.result.tokens), np.asarray(out.result.lengths)
    ):
        assert tokens[n - 1] == end  # finished well within the budget
        assert re.fullmatch(regex, text), text


LEAVES = st.sampled_from(
    [
        {"type": "boolean"},
        {"type": "null"},
        {"enum": ["fox", "dog", 3]},
        {"type": "string", "maxLength": 3},
        {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    ]
)


@st.composite
def schemas(draw):
    names = draw(
        st.lists(st.sampled_from(["a", "ok", "name"]), min_size=1, max_size=2, unique=True)
    )
    properties = {name: draw(LEAVES) for name in names}
    return {
        "type": "object",
        "properties": properties,
        "required": names,
        "additionalProperties": False,
    }


@settings(max_examples=5)
@given(schema=schemas())
def test_json_schema_constrained_text_validates(model, tokenizer, schema):
    out = _complete(model, tokenizer, schema=schema)
    for text, n in zip(out.texts, np.asarray(out.result.lengths)):
        assert n < MAX_TOKENS, text  # ended with <|im_end|>
        jsonschema.validate(json.loads(text), schema)


def test_chat_completions_stop_at_im_end_and_at_stop_strings(model, tokenizer):
    sampling = [SamplingParams(max_tokens=MAX_TOKENS, stop_strings=(" wor",))] * 3 + [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    ]
    out = _complete(model, tokenizer, sampling, regex="hello world( again)?")
    lengths, tokens = np.asarray(out.result.lengths), np.asarray(out.result.tokens)
    assert out.texts[:3] == ["hello"] * 3  # cut before the stop string, after its last token
    assert all(" wor" in tokenizer.decode(tokens[b, : lengths[b]]) for b in range(3))
    assert out.texts[3] in ("hello world", "hello world again")
    assert tokens[3, lengths[3] - 1] == tokenizer.token_id(IM_END)
