"""The tokenizer as arrays, so that jitted environments can read and write text.

Text environments see token ids but their tools work on characters: a
calculator needs the digits of ``"12*3"`` however the policy happened to
tokenize them, and a table lookup compares key *bytes*, not ids (the same
string has many tokenizations).  `Vocab` therefore carries

* a token -> bytes table, so `detokenize` recovers the UTF-8 bytes of any
  id sequence with one scatter (special tokens read as their text, PAD as
  nothing);
* the byte-level BPE merges between all-digit tokens, so `encode_int` spells
  a computed integer in the *canonical* tokens the tokenizer itself would
  produce.  Tool results then tokenize exactly as `chat.render_ids` renders
  them, and a transcript produced in the environment is token-for-token the
  supervised demonstration of the same conversation.

Only byte-level BPE tokenizers (ours, GPT-2 style) are supported; the digit
spelling is canonical for pre-tokenizers that keep a run of digits in one
piece (the GPT-2 regex does), and always decodes to the right text.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.text.chat_markers import ChatMarkers

NO_MERGE = np.iinfo(np.int32).max
INT_DIGITS = 10  # an int32 has at most 10 decimal digits


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """Inverse of the GPT-2 byte -> printable-character map that byte-level BPE vocabularies use."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = dict(zip(printable, printable)), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {chr(c): b for b, c in chars.items()}


def _token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    backend = tokenizer.backend
    added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
    table = _byte_of_char()
    out = []
    for i in range(tokenizer.vocab_size):
        if i in added:
            out.append(b"" if i == tokenizer.pad_id else added[i].encode())
            continue
        piece = backend.id_to_token(i)
        if piece is None or any(ch not in table for ch in piece):
            raise ValueError(
                f"token {i} ({piece!r}) is not byte-level BPE; only byte-level tokenizers are supported"
            )
        out.append(bytes(table[ch] for ch in piece))
    return out


def _digit_merges(tokenizer: Tokenizer, pieces: list[bytes]):
    """Digit-token ids and the [D, D] merge rank / merged-index tables among them."""
    digit_ids = [
        i
        for i, p in enumerate(pieces)
        if p and p.isdigit() and i not in tokenizer.special_ids.values()
    ]
    index = {pieces[i]: k for k, i in enumerate(digit_ids)}
    if any(bytes([c]) not in index for c in b"0123456789"):
        raise ValueError("the vocabulary lacks a single-digit token")
    rank = np.full((len(digit_ids),) * 2, NO_MERGE, np.int32)
    merged = np.zeros_like(rank)
    merges = json.loads(tokenizer.backend.to_str())["model"].get("merges", [])
    table = _byte_of_char()
    for r, merge in enumerate(merges):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        left, right = (bytes(table[ch] for ch in s) for s in (left, right))
        if left in index and right in index and left + right in index:
            rank[index[left], index[right]] = r
            merged[index[left], index[right]] = index[left + right]
    single = np.array([index[bytes([c])] for c in b"0123456789"], np.int32)
    return np.array(digit_ids, np.int32), single, rank, merged


@struct.dataclass
class Vocab:
    """Arrays describing a tokenizer (a pytree: keep it in the env params, not as constants)."""

    token_bytes: jax.Array  # uint8 [V, W]
    token_len: jax.Array  # int32 [V]
    digit_ids: jax.Array  # int32 [D]: token id of each all-digit token
    single_digit: jax.Array  # int32 [10]: index into digit_ids of "0".."9"
    merge_rank: jax.Array  # int32 [D, D]: BPE rank of merging two digit tokens (NO_MERGE if none)
    merge_result: jax.Array  # int32 [D, D]: index of the merged token
    minus_id: int = struct.field(pytree_node=False)
    pad_id: int = struct.field(pytree_node=False)
    stop_ids: tuple[int, ...] = struct.field(pytree_node=False)  # <|im_end|> and EOS: end of a turn
    tool_call_id: int = struct.field(pytree_node=False)  # a call's opening marker token (-1: none)
    tool_call_end_id: int = struct.field(pytree_node=False)

    @classmethod
    def build(cls, tokenizer: Tokenizer, markers: ChatMarkers | None = None) -> Vocab:
        """The tables of a byte-level BPE tokenizer with a PAD token, and the turn and call
        markers of its chat template (`ChatMarkers`, by default ``chat_template(tokenizer)``'s);
        ValueError otherwise."""
        if tokenizer.pad_id is None:
            raise ValueError("a text environment needs a tokenizer with a PAD token")
        markers = ChatMarkers.build(tokenizer) if markers is None else markers
        pieces = _token_bytes(tokenizer)
        width = max(1, max(map(len, pieces)))
        token_bytes = np.zeros((len(pieces), width), np.uint8)
        for i, p in enumerate(pieces):
            token_bytes[i, : len(p)] = np.frombuffer(p, np.uint8)
        digit_ids, single, rank, merged = _digit_merges(tokenizer, pieces)
        minus = tokenizer.encode("-")
        if len(minus) != 1:
            raise ValueError("'-' must be a single token")
        return cls(
            jnp.asarray(token_bytes),
            jnp.asarray([len(p) for p in pieces], jnp.int32),
            jnp.asarray(digit_ids),
            jnp.asarray(single),
            jnp.asarray(rank),
            jnp.asarray(merged),
            minus_id=minus[0],
            pad_id=tokenizer.pad_id,
            stop_ids=markers.stop_ids,
            tool_call_id=markers.open_id,
            tool_call_end_id=markers.close_id,
        )


def detokenize(
    vocab: Vocab, ids: jax.Array, valid: jax.Array, size: int
) -> tuple[jax.Array, jax.Array]:
    """UTF-8 bytes of ``ids[valid]`` in order: ``(bytes uint8 [size], length)``.

    ``length`` is the full byte length even when it exceeds ``size`` (the
    bytes past ``size`` are dropped), so callers can tell truncation apart.
    """
    lengths = jnp.where(valid, vocab.token_len[ids], 0)
    starts = jnp.cumsum(lengths) - lengths
    width = vocab.token_bytes.shape[1]
    offsets = jnp.arange(width)
    positions = jnp.where(offsets < lengths[:, None], starts[:, None] + offsets, size)
    out = (
        jnp.zeros((size,), jnp.uint8)
        .at[positions.ravel()]
        .set(vocab.token_bytes[ids].ravel(), mode="drop")
    )
    return out, jnp.sum(lengths)


def pack(segments, size: int, pad_id: int) -> tuple[jax.Array, jax.Array]:
    """Concatenates ``(ids, length)`` segments (only the first ``length`` of each) into ``[size]``."""
    out = jnp.full((size,), pad_id, jnp.int32)
    start = jnp.int32(0)
    for ids, length in segments:
        ids = jnp.asarray(ids, jnp.int32)
        index = jnp.arange(ids.shape[0])
        out = out.at[jnp.where(index < length, start + index, size)].set(ids, mode="drop")
        start = start + length
    return out, start


def _bpe_merge_step(vocab: Vocab, carry, _):
    """Applies the lowest-ranked merge (leftmost on ties), as the tokenizer's BPE does."""
    digits, count = carry
    position = jnp.arange(digits.shape[0] - 1)
    ranks = jnp.where(position < count - 1, vocab.merge_rank[digits[:-1], digits[1:]], NO_MERGE)
    j = jnp.argmin(ranks)
    merged = jnp.where(
        jnp.arange(digits.shape[0]) < j,
        digits,
        jnp.where(
            jnp.arange(digits.shape[0]) == j,
            vocab.merge_result[digits[j], digits[j + 1]],
            jnp.append(digits[1:], digits[-1]),
        ),
    )
    can = ranks[j] < NO_MERGE
    return (jnp.where(can, merged, digits), count - can), None


def encode_int(vocab: Vocab, value: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Canonical token ids of ``str(value)``: ``(ids int32 [11], length)``; |value| < 2**31."""
    value = jnp.asarray(value, jnp.int32)
    magnitude = jnp.abs(value)
    powers = jnp.asarray([10**k for k in range(INT_DIGITS)], jnp.int32)
    count = 1 + jnp.sum(magnitude >= powers[1:])
    place = jnp.clip(count - 1 - jnp.arange(INT_DIGITS), 0, INT_DIGITS - 1)
    digits = vocab.single_digit[(magnitude // powers[place]) % 10]
    (digits, count), _ = jax.lax.scan(
        functools.partial(_bpe_merge_step, vocab), (digits, count), None, length=INT_DIGITS - 1
    )
    negative = (value < 0).astype(jnp.int32)
    return pack(
        [(jnp.asarray([vocab.minus_id]), negative), (vocab.digit_ids[digits], count)],
        INT_DIGITS + 1,
        vocab.pad_id,
    )
