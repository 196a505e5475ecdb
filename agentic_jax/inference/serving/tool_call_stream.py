"""A constrained tool call told piece by piece as its tokens are decoded, in the OpenAI stream's
shape: the call's name first, then its arguments' JSON text in pieces.

The pieces are the arguments in their canonical spelling, ``json.dumps(arguments,
ensure_ascii=False)`` of the parsed object (what a whole reply carries as ``arguments``), not the
model's own: the tools' automaton lets it choose its whitespace, spell numbers as ``1E2`` and
write ``<`` as ``\\u003c``.  :class:`CanonicalJson` rewrites a JSON value as it arrives: structure
and literals at once, a string's characters as soon as no escape is cut in two, a number once it
ends.  The pieces join to the canonical text of the whole value, except where an object repeats a
key (the parsed object keeps the last value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import NamedTuple

from agentic_jax.data.tokenizer import Tokenizer

# A call object's text up to its arguments: its name first (the tools' automaton orders the keys
# so), under "arguments" or, in Llama 3's format, "parameters".  Mistral's list of calls has none.
_CALL_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)
# The escapes of a JSON string, whole; a UTF-16 high surrogate waits for its low half.
_COMPLETE_ESCAPES = re.compile(r'(?:[^\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
_HIGH_SURROGATE_LAST = re.compile(r"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}$")
_NUMBER = frozenset("+-0123456789.eE")
_LITERALS = ("true", "false", "null")


class ToolCallDelta(NamedTuple):
    """A piece of a turn's ``index``-th tool call: its first piece carries the tool's ``name``
    and no arguments, every later one ``name=None`` and the next text of its arguments."""

    index: int
    name: str | None
    arguments: str


def _canonical_string_part(raw: str) -> str:
    """A JSON string's raw inside (whole escapes) in ``json.dumps``'s spelling."""
    return json.dumps(json.loads(f'"{raw}"'), ensure_ascii=False)[1:-1]


class CanonicalJson:
    """One JSON value's text rewritten as ``json.dumps(json.loads(text), ensure_ascii=False)``
    while it arrives.  :meth:`push` returns the canonical text the new input settles; ``done``
    once the value is complete (what follows it is ignored).  The input must be valid JSON, as
    a constrained call's is."""

    def __init__(self):
        self.done = False
        self._depth = 0
        self._string: str | None = None  # the open string's unwritten inside, as written
        self._escaped = False
        self._number = ""
        self._literal = ""

    def push(self, text: str) -> str:
        out = []
        for c in text:
            if self.done:
                break
            out.append(self._char(c))
        if self._string is not None:
            out.append(self._settled_string())
        return "".join(out)

    def _value_ended(self) -> None:
        self.done = self._depth == 0

    def _char(self, c: str) -> str:
        if self._string is not None:
            if c == '"' and not self._escaped:
                text, self._string = _canonical_string_part(self._string), None
                self._value_ended()
                return text + '"'
            self._string += c
            self._escaped = c == "\\" and not self._escaped
            return ""
        if self._number:
            if c in _NUMBER:
                self._number += c
                return ""
            number, self._number = json.dumps(json.loads(self._number)), ""
            self._value_ended()
            return number + ("" if self.done else self._char(c))
        if c.isalpha():
            self._literal += c
            if self._literal in _LITERALS:
                self._literal = ""
                self._value_ended()
            return c
        if c in " \t\r\n":
            return ""
        if c in "{[":
            self._depth += 1
            return c
        if c in "}]":
            self._depth -= 1
            self._value_ended()
            return c
        if c == '"':
            self._string, self._escaped = "", False
            return c
        if c in _NUMBER:
            self._number = c
            return ""
        return {",": ", ", ":": ": "}[c]

    def _settled_string(self) -> str:
        """The open string's inside up to where an escape (or a surrogate pair) may be cut."""
        end = _COMPLETE_ESCAPES.match(self._string).end()
        if _HIGH_SURROGATE_LAST.search(self._string[:end]):
            end -= 6
        settled, self._string = self._string[:end], self._string[end:]
        return _canonical_string_part(settled) if settled else ""


class ToolCallStream:
    """The ``index``-th call of a turn as its tokens arrive (those after its opening marker):
    ``on_delta`` gets its name once the text holds it, then each settled piece of its arguments.
    A format without a call object to read this way (Mistral's list) tells nothing here; its
    calls are told whole once parsed."""

    def __init__(self, tokenizer: Tokenizer, index: int, on_delta: Callable[[ToolCallDelta], None]):
        self.tokenizer, self.index, self.on_delta = tokenizer, index, on_delta
        self.tokens: list[int] = []
        self.text = ""
        self.opened = False
        self._arguments = CanonicalJson()

    def push(self, token: int) -> None:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True).rstrip("\ufffd")
        if not text.startswith(self.text):  # decoding respelt the tail: wait for more
            return
        new, self.text = text[len(self.text) :], text
        if not self.opened:
            head = _CALL_HEAD.match(self.text)
            if head is None:
                return
            self.opened = True
            self.on_delta(ToolCallDelta(self.index, json.loads(head[1]), ""))
            new = self.text[head.end() :]
        piece = self._arguments.push(new)
        if piece:
            self.on_delta(ToolCallDelta(self.index, None, piece))
