"""Constrained decoding: a regex or JSON schema compiled into dense token tables for the decode loop.

Willard & Louf 2023 (*Efficient Guided Generation for LLMs*, the ``outlines`` method): the regex
becomes a deterministic finite automaton over bytes, and walking every vocabulary token's bytes
through it from every state gives a token-level automaton.  ``outlines-core`` builds that index;
here it becomes two dense tables indexed by ``[state, token]``:

* ``allowed[S, V]``: the token keeps the text a prefix of some match (EOS: the text is a match);
* ``next_state[S, V]``: the automaton state after the token.

Inside the jitted loop a row's mask is one gather, ``allowed[state]``, and its update another,
``next_state[state, token]``, so constrained rows cost what unconstrained ones do.  A row that
ends with EOS therefore always matches the regex (validates against the schema); one cut off by
``max_tokens`` is a prefix of a match.

Byte-level BPE vocabularies (GPT-2 style, ours) spell tokens in a printable alias of the 256 bytes
(space is ``Ġ``); :func:`token_bytes` undoes that alias so the automaton sees real UTF-8 bytes,
including tokens that hold only part of a multi-byte character.  Special tokens never match.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import outlines_core
from tokenizers import decoders

from agentic_jax.data.tokenizer import Tokenizer


class TokenConstraint(NamedTuple):
    """A token automaton as dense tables (a pytree; pass it through ``jit``)."""

    allowed: jax.Array  # [S, V] bool
    next_state: jax.Array  # [S, V] int32
    final: jax.Array  # [S] bool: the text so far is a full match
    initial: jax.Array  # [] int32

    @property
    def num_states(self) -> int:
        return self.allowed.shape[0]


def _byte_aliases() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted (Radford et al. 2019, ``encoder.py``)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def token_bytes(tokenizer: Tokenizer, vocab_size: int | None = None) -> list[bytes | None]:
    """Each id's bytes for a byte-level BPE tokenizer (``None`` for special and unused ids).

    ``vocab_size`` (the model's, at least the tokenizer's) pads the list with ``None``.
    """
    if not isinstance(tokenizer.backend.decoder, decoders.ByteLevel):
        raise ValueError("token_bytes needs a byte-level BPE tokenizer (a ByteLevel decoder)")
    aliases = _byte_aliases()
    size = tokenizer.vocab_size if vocab_size is None else vocab_size
    if size < tokenizer.vocab_size:
        raise ValueError(
            f"vocab_size {size} is smaller than the tokenizer's {tokenizer.vocab_size}"
        )
    out: list[bytes | None] = [None] * size
    added = tokenizer.backend.get_added_tokens_decoder()
    for text, token_id in tokenizer.backend.get_vocab(with_added_tokens=True).items():
        if token_id in added:
            out[token_id] = None if added[token_id].special else text.encode("utf-8")
        else:
            out[token_id] = bytes(aliases[c] for c in text)
    return out


def _vocabulary(tokens: Sequence[bytes | None], eos_id: int) -> outlines_core.Vocabulary:
    by_bytes: dict[bytes, list[int]] = {}
    for token_id, data in enumerate(tokens):
        if data and token_id != eos_id:
            by_bytes.setdefault(data, []).append(token_id)
    return outlines_core.Vocabulary(eos_id, by_bytes)


def _bucket(n: int, at_least: int) -> int:
    """States are padded to a power of two so that similar grammars share one compilation."""
    return max(at_least, 1 << max(0, (n - 1).bit_length()))


def repetition_size(regex: str) -> int:
    """The largest product of nested bounded repetitions in ``regex``: ``(a{0,50}){0,20}`` is
    1,000.  An automaton has at least that many states, and building it takes time in proportion,
    so a caller can refuse a regex (a schema's ``maxLength: 10**6``) before building it."""
    stack, largest, atom, i = [1], 1, 1, 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i, atom = i + 2, 1
            continue
        if (
            c == "["
        ):  # a class: skip to its closing bracket (one right after "[" or "[^" is literal)
            j = i + 1 + (regex[i + 1 : i + 2] == "^")
            j += regex[j : j + 1] == "]"
            while j < len(regex) and regex[j] != "]":
                j += 2 if regex[j] == "\\" else 1
            i, atom = j + 1, 1
            continue
        if c == "(":
            stack.append(1)
        elif c == ")" and len(stack) > 1:
            atom = stack.pop()
        elif c == "{" and (bound := re.match(r"\{(\d+)(?:,(\d*))?\}", regex[i:])):
            low, high = bound.groups()
            atom *= int(high) if high else int(low)  # {m,}: m copies, then a loop
            stack[-1] = max(stack[-1], atom)
            largest = max(largest, atom)
            i += bound.end()
            continue
        else:
            atom = 1
        i += 1
    return largest


def regex_constraint(
    regex: str,
    tokens: Sequence[bytes | None],
    eos_id: int,
    *,
    num_states: int = 1,
    max_states: int | None = None,
) -> TokenConstraint:
    """Dense tables of the token automaton of ``regex`` over ``tokens`` (id -> bytes).

    The state count is padded to a power of two and to at least ``num_states`` (equal shapes share
    a compiled decoder); padding states are never reached and allow only EOS.  With
    ``max_states``, a regex whose bounded repetitions (:func:`repetition_size`) or automaton
    exceed it is a ``ValueError``, raised before the tables are built.
    """
    if max_states is not None and repetition_size(regex) > max_states:
        raise ValueError(
            f"the regex repeats a part {repetition_size(regex)} times; at most "
            f"{max_states} automaton states are allowed"
        )
    index = outlines_core.Index(regex, _vocabulary(tokens, eos_id))
    transitions = index.get_transitions()
    states = sorted(set(transitions) | {s for row in transitions.values() for s in row.values()})
    if max_states is not None and len(states) > max_states:
        raise ValueError(
            f"the regex needs {len(states)} automaton states; at most {max_states} are allowed"
        )
    number = {s: i for i, s in enumerate(states)}
    size, v = _bucket(len(states), num_states), len(tokens)
    allowed = np.zeros((size, v), bool)
    allowed[len(states) :, eos_id] = True
    next_state = np.tile(np.arange(size, dtype=np.int32)[:, None], (1, v))
    for state, row in transitions.items():
        ids = np.fromiter(row.keys(), np.int64, len(row))
        allowed[number[state], ids] = True
        next_state[number[state], ids] = [number[s] for s in row.values()]
    final = np.zeros(size, bool)
    final[[number[s] for s in index.get_final_states() if s in number]] = True
    return TokenConstraint(
        jnp.asarray(allowed),
        jnp.asarray(next_state),
        jnp.asarray(final),
        jnp.asarray(number[index.get_initial_state()], jnp.int32),
    )


def schema_regex(schema: Mapping[str, Any] | str, whitespace_pattern: str | None = None) -> str:
    """The regex of JSON texts valid under ``schema`` (``outlines-core``'s translation)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return outlines_core.json_schema.build_regex_from_schema(text, whitespace_pattern)


def json_schema_constraint(
    schema: Mapping[str, Any] | str,
    tokens: Sequence[bytes | None],
    eos_id: int,
    *,
    whitespace_pattern: str | None = None,
    num_states: int = 1,
) -> TokenConstraint:
    """Tables for JSON documents valid under ``schema`` (whitespace per ``whitespace_pattern``)."""
    return regex_constraint(
        schema_regex(schema, whitespace_pattern), tokens, eos_id, num_states=num_states
    )
