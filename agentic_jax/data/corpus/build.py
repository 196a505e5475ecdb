"""Builds the shipped text corpus from documentation installed on this machine (no downloads).

Sources, in order (see README.md in this directory for licences):

1. ``pydoc_data.topics``: the language-reference topics of the Python documentation;
2. docstrings of the Python standard library, read with ``ast`` (nothing is imported);
3. docstrings of NumPy, read the same way.

A module's docstring and its top-level functions' docstrings form one document; each top-level
class with its methods' docstrings forms another.  Repeated docstrings are kept once, documents
are split into train / held-out by a hash of their text (about 1 in 20 held out), and the output
is byte-reproducible for the same Python and NumPy versions::

    python -m agentic_jax.data.corpus.build [--out DIR]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.metadata
import json
import pathlib
import re
import sys
import sysconfig
from collections.abc import Iterator

import numpy as np

from agentic_jax.data.documents import write_documents

HELDOUT_MODULUS = 20  # 1 in 20 documents, i.e. ~5 %, goes to the held-out split.
MIN_DOC_CHARS = 200
MIN_DOCSTRING_CHARS = 40
_SKIPPED_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "__pycache__",
    "_bundled",
    "_pyinstaller",
}
_BLANK_RUNS = re.compile(r"\n{3,}")


def _clean(text: str) -> str:
    """Normalises whitespace: no trailing spaces, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANK_RUNS.sub("\n\n", text).strip("\n")


class _Docstrings:
    """Collects cleaned docstrings, each distinct one only the first time it is seen."""

    def __init__(self):
        self._seen: set[str] = set()

    def take(self, node: ast.AST) -> str | None:
        doc = ast.get_docstring(node, clean=True)
        if doc is None:
            return None
        doc = _clean(doc)
        if len(doc) < MIN_DOCSTRING_CHARS or doc in self._seen:
            return None
        self._seen.add(doc)
        return doc


def _sections_to_doc(sections: list[tuple[str, str]]) -> str:
    return "\n\n".join(f"{title}\n\n{body}" for title, body in sections)


def _module_documents(tree: ast.Module, module: str, docstrings: _Docstrings) -> Iterator[str]:
    """Yields the module document (module + functions) and one document per class."""
    module_sections = []
    if (doc := docstrings.take(tree)) is not None:
        module_sections.append((module, doc))
    class_docs = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if (doc := docstrings.take(node)) is not None:
                module_sections.append((f"{module}.{node.name}", doc))
        elif isinstance(node, ast.ClassDef):
            sections = []
            if (doc := docstrings.take(node)) is not None:
                sections.append((f"{module}.{node.name}", doc))
            for child in node.body:
                if (
                    isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and (doc := docstrings.take(child)) is not None
                ):
                    sections.append((f"{module}.{node.name}.{child.name}", doc))
            class_docs.append(_sections_to_doc(sections))
    yield _sections_to_doc(module_sections)
    yield from class_docs


def _source_tree_documents(
    root: pathlib.Path, package: str | None, docstrings: _Docstrings
) -> Iterator[str]:
    """Documents of every ``*.py`` file under ``root`` (sorted, test directories skipped)."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIPPED_DIRS.intersection(rel.parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are test fixtures in other encodings or grammars.
        parts = [package] if package else []
        parts += rel.with_suffix("").parts
        if parts[-1] == "__init__":
            parts.pop()
        yield from _module_documents(tree, ".".join(parts), docstrings)


def _pydoc_topic_documents() -> Iterator[str]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield _clean(topics[name])


def corpus_documents() -> Iterator[str]:
    """All corpus documents of at least ``MIN_DOC_CHARS`` characters, in a fixed order."""
    docstrings = _Docstrings()
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    numpy_root = pathlib.Path(np.__file__).parent
    sources = (
        _pydoc_topic_documents(),
        _source_tree_documents(stdlib, None, docstrings),
        _source_tree_documents(numpy_root, "numpy", docstrings),
    )
    seen = set()
    for source in sources:
        for doc in source:
            if len(doc) >= MIN_DOC_CHARS and doc not in seen:
                seen.add(doc)
                yield doc


def is_heldout(doc: str) -> bool:
    """Stable split: depends only on the document's text, not on its position."""
    digest = hashlib.sha256(doc.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % HELDOUT_MODULUS == 0


def _write_licences(out_dir: pathlib.Path) -> None:
    """Copies the licences the sources require to travel with their text."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    (out_dir / "LICENSE-python.txt").write_text((stdlib / "LICENSE.txt").read_text())
    numpy_dist = importlib.metadata.distribution("numpy")

    def numpy_licence(suffix: str) -> str:
        path = next(f for f in numpy_dist.files if str(f).endswith(suffix))
        return numpy_dist.locate_file(path).read_text().strip()

    # LICENSE.txt's first section is NumPy's BSD licence; the rest covers bundled binaries.
    texts = [
        numpy_licence("licenses/LICENSE.txt").split("\n----\n")[0].strip(),
        numpy_licence("licenses/numpy/ma/LICENSE"),
    ]
    (out_dir / "LICENSE-numpy.txt").write_text("\n\n".join(texts) + "\n")


def build(out_dir: pathlib.Path) -> dict:
    """Writes the two splits, ``manifest.json`` and the sources' licences; returns the manifest."""
    _write_licences(out_dir)
    splits: dict[str, list[str]] = {"train": [], "heldout": []}
    for doc in corpus_documents():
        splits["heldout" if is_heldout(doc) else "train"].append(doc)
    manifest = {"python": sys.version.split()[0], "numpy": np.__version__, "splits": {}}
    for split, docs in splits.items():
        path = out_dir / f"{split}.txt.gz"
        write_documents(path, docs)
        manifest["splits"][split] = {
            "file": path.name,
            "documents": len(docs),
            "characters": sum(len(d) for d in docs),
            "utf8_bytes": sum(len(d.encode("utf-8")) for d in docs),
            "gzip_bytes": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
    args = parser.parse_args(argv)
    print(json.dumps(build(args.out), indent=2))


if __name__ == "__main__":
    main()
