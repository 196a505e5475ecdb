"""The English text corpus shipped with the package (Python and NumPy documentation).

It lets the quickstart train a tokenizer and a small language model with no download; see
README.md here for its provenance and licences and ``build.py`` for how it was made.
"""

from __future__ import annotations

import json
import pathlib

_DIR = pathlib.Path(__file__).parent
SPLITS = ("train", "heldout")


def corpus_files(split: str = "train") -> list[str]:
    """Paths of the shipped corpus files of ``split`` ("train" or "heldout")."""
    if split not in SPLITS:
        raise ValueError(f"unknown corpus split {split!r}; expected one of {SPLITS}")
    return [str(_DIR / f"{split}.txt.gz")]


def corpus_manifest() -> dict:
    """Provenance and sizes recorded by ``build.py`` (versions, documents, bytes, sha256)."""
    return json.loads((_DIR / "manifest.json").read_text())
