"""Reading and writing multi-document text files (plain or gzip-compressed).

Documents (docstrings, manual pages) contain blank lines, so a file separates its documents with
a line holding a single form feed (``\\f``), the traditional page break of plain text.  A file
without form feeds is one document.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Iterator, Sequence

DOCUMENT_SEPARATOR = "\n\f\n"


def _read_text(path: str | os.PathLike) -> str:
    """Reads ``path`` as UTF-8 text, decompressing ``*.gz`` files."""
    if os.fspath(path).endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
            return f.read()
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def read_documents(files: Sequence[str | os.PathLike]) -> Iterator[str]:
    """Yields the non-empty documents of ``files`` in order."""
    for path in files:
        for doc in _read_text(path).split(DOCUMENT_SEPARATOR):
            doc = doc.strip("\n")
            if doc.strip():
                yield doc


def write_documents(path: str | os.PathLike, docs: Iterable[str]) -> int:
    """Writes ``docs`` to ``path`` (gzip if named ``*.gz``, byte-reproducibly); returns the count.

    Form feeds inside a document are replaced by newlines so they cannot split it on reading, and
    blank documents are dropped, so ``read_documents`` returns exactly what was written.
    """
    cleaned = [doc.replace("\f", "\n").strip("\n") for doc in docs]
    cleaned = [doc for doc in cleaned if doc.strip()]
    text = DOCUMENT_SEPARATOR.join(cleaned) + "\n"
    if os.fspath(path).endswith(".gz"):
        # mtime=0 and no embedded file name: identical inputs give identical bytes.
        with (
            open(path, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", filename="", mtime=0, compresslevel=9) as gz,
        ):
            gz.write(text.encode("utf-8"))
    else:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    return len(cleaned)
