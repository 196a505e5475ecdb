"""Reading and decoding a JSON request body, the same way in every server here (OpenAI-compatible
API, A2A).

:func:`read_body` takes an ASGI request's body as it arrives and refuses one that is too large as
soon as that is known (by its ``Content-Length`` before any byte is read, else when the bytes
received pass the limit), so that a large body is never held; a client that stalls while sending
it is a 408.  :func:`parse_json_body` then reports every way the body can be malformed as the
client's error, with a message that says which: bytes that are not UTF-8, UTF-16 or UTF-32 (RFC
8259 allows the three), invalid JSON, the non-standard constants ``NaN`` and ``Infinity``,
integers of more digits than Python parses, nesting deeper than a bound (checked without
recursion, so that depth cannot exhaust the stack of the code that reads the document later), and
strings that are not Unicode text.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.requests import ClientDisconnect
from starlette.types import Receive


class BodyError(ValueError):
    """A body the server will not read; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_document(value: Any, max_depth: int) -> None:
    """Raises a :class:`BodyError` if ``value`` (parsed JSON) nests arrays and objects deeper
    than ``max_depth`` or holds a string that is not Unicode text: JSON's ``\\ud800`` escapes
    can spell lone surrogates, which no tokenizer or encoder takes."""
    depth, level = 0, [value]
    while level:
        for x in level:
            if isinstance(x, str) and not _is_text(x):
                raise BodyError(
                    400,
                    "the request body holds a lone surrogate (a \\ud800-\\udfff "
                    "escape without its pair)",
                )
        containers = [x for x in level if isinstance(x, dict | list)]
        if containers and depth == max_depth:
            raise BodyError(400, f"the request body nests deeper than {max_depth} levels")
        depth += 1
        level = [c for x in containers for c in ([*x, *x.values()] if isinstance(x, dict) else x)]


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _constant(name: str):
    raise ValueError(f"{name} is not JSON")


def check_size(length: int, max_bytes: int) -> None:
    if length > max_bytes:
        raise BodyError(
            413, f"the request body has {length} bytes; at most {max_bytes} are accepted"
        )


async def read_body(
    receive: Receive, content_length: str | None, *, max_bytes: int, timeout_s: float
) -> bytes:
    """The body of an ASGI request whose ``Content-Length`` header is ``content_length`` (absent
    for a chunked body), read as it arrives.  A :class:`BodyError` 413 as soon as the body is
    known to exceed ``max_bytes``, without reading the rest; a 408 when nothing arrives for
    ``timeout_s`` seconds; Starlette's ``ClientDisconnect`` if the client leaves meanwhile."""
    if content_length is not None and content_length.isdigit():  # else the HTTP layer refuses it
        check_size(int(content_length), max_bytes)
    chunks, size, more = [], 0, True
    while more:
        try:
            with anyio.fail_after(timeout_s):
                message = await receive()
        except TimeoutError:
            raise BodyError(
                408, f"the request body stalled: nothing arrived for {timeout_s:g} s"
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise BodyError(
                413, f"the request body passed {max_bytes} bytes, the most that is accepted"
            )
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def parse_json_body(raw: bytes, *, max_bytes: int, max_depth: int) -> Any:
    """The JSON document ``raw``, or a :class:`BodyError` that says what is wrong with it."""
    check_size(len(raw), max_bytes)
    try:
        body = json.loads(raw, parse_constant=_constant)
    except UnicodeDecodeError:
        raise BodyError(400, "the request body is not UTF-8, UTF-16 or UTF-32 text") from None
    except RecursionError:
        raise BodyError(400, f"the request body nests deeper than {max_depth} levels") from None
    except ValueError as e:  # invalid JSON, NaN/Infinity, an integer of over 4,300 digits
        raise BodyError(400, f"the request body is not valid JSON: {e}") from None
    check_document(body, max_depth)
    return body
