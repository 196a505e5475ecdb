"""Documents to retrieve from: text, Markdown and JSON Lines files read as they are.

Text is read without newline translation (``\\r\\n`` stays two characters), so a chunk's character
offsets point into exactly what the file holds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gin

SUFFIXES = (".txt", ".md", ".jsonl")


@dataclasses.dataclass(frozen=True)
class Document:
    """One text to retrieve from: ``source`` is the file it came from, ``metadata`` whatever the
    file said about it besides its text (a JSON Lines record's other fields)."""

    id: str
    text: str
    source: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _records(path: Path, name: str, text_field: str, id_field: str) -> list[Document]:
    """One document per non-blank line of a JSON Lines file; its id ``id_field`` or
    ``<name>#<line>``."""
    documents = []
    for number, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            raise ValueError(f"{path}:{number}: a record needs a string {text_field!r} field")
        metadata = {k: v for k, v in record.items() if k not in (text_field, id_field)}
        doc_id = str(record.get(id_field, f"{name}#{number}"))
        documents.append(Document(doc_id, record[text_field], name, metadata))
    return documents


@gin.configurable(module="retrieval")
def load_documents(
    path: str | Path,
    suffixes: Sequence[str] = SUFFIXES,
    *,
    text_field: str = "text",
    id_field: str = "id",
) -> list[Document]:
    """The documents of a file, or of every file below a directory whose suffix is in
    ``suffixes`` (recursively, in sorted order).  A ``.txt`` or ``.md`` file is one document, its
    id and source the path relative to the directory (a lone file: its name); a ``.jsonl`` file
    is one document per record.  Ids must be unique."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
        if not files:
            raise ValueError(f"no {'/'.join(suffixes)} files under {path}")
        named = [(p, p.relative_to(path).as_posix()) for p in files]
    elif path.is_file():
        named = [(path, path.name)]
    else:
        raise FileNotFoundError(f"no file or directory at {path}")
    documents = []
    for file, name in named:
        if file.suffix == ".jsonl":
            documents += _records(file, name, text_field, id_field)
        else:
            documents.append(Document(name, _read(file), name))
    seen = set()
    for document in documents:
        if document.id in seen:
            raise ValueError(f"document id {document.id!r} appears twice under {path}")
        seen.add(document.id)
    return documents
