"""Byte-level BPE tokenizer: training, loading any ``tokenizer.json``, and a small wrapper.

Byte-level BPE maps text to UTF-8 bytes before merging, so every string encodes with no unknown
token and decodes back exactly.  The special tokens cover sequence boundaries, ChatML turns
(roles are plain text after ``<|im_start|>``) and tool calls/results; see ``chat.py``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
from collections.abc import Mapping, Sequence

import gin
import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.documents import read_documents

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|eos|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESULT = "<tool_result>"
TOOL_RESULT_END = "</tool_result>"
# Ids 0..8 in this order; PAD is 0 so zero-filled buffers read as padding.
SPECIAL_TOKENS = (
    PAD,
    BOS,
    EOS,
    IM_START,
    IM_END,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESULT,
    TOOL_RESULT_END,
)

# Names third-party tokenizers use for the same roles, tried in order when the tokenizer comes
# without a ``tokenizer_config.json`` saying which tokens they are.
_FALLBACK_NAMES = {
    "bos_token": (BOS, "<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>"),
    "eos_token": (EOS, "</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>"),
    "pad_token": (PAD, "<pad>", "<|finetune_right_pad_id|>"),
    "unk_token": (),
}


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with explicit BOS/EOS handling and special-token ids.

    ``encode`` never applies the backend's own post-processor (some third-party tokenizers add a
    BOS there); callers ask for BOS/EOS explicitly, so every tokenizer behaves the same way.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = BOS,
        eos_token: str | None = EOS,
        pad_token: str | None = PAD,
        unk_token: str | None = None,
        add_bos_token: bool | None = None,
        add_eos_token: bool = False,
        chat_template: str | Mapping[str, str] | None = None,
    ):
        # Padding/truncation saved in a third-party tokenizer.json would silently alter encode().
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        added = backend.get_added_tokens_decoder()
        self.added_ids = {tok.content: i for i, tok in added.items()}
        self.special_ids = {tok.content: i for i, tok in added.items() if tok.special}
        self.bos_id = self._optional_id(bos_token)
        self.eos_id = self._optional_id(eos_token)
        self.pad_id = self._optional_id(pad_token)
        self.unk_id = self._optional_id(unk_token)
        # The named tokens a Hugging Face chat template reads (``bos_token`` ...), as transformers
        # passes them; only those in the vocabulary.
        self.named_tokens = {
            name: token
            for name, token in (
                ("bos_token", bos_token),
                ("eos_token", eos_token),
                ("pad_token", pad_token),
                ("unk_token", unk_token),
            )
            if token is not None and self.backend.token_to_id(token) is not None
        }
        # What transformers' ``encode(text)`` (add_special_tokens=True) adds; this project's own
        # convention is a BOS on every prompt.
        self.add_bos_token = self.bos_id is not None if add_bos_token is None else add_bos_token
        self.add_eos_token = add_eos_token
        if isinstance(chat_template, Mapping):
            chat_template = dict(chat_template)
        self.chat_template = chat_template

    def _optional_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the embedding table needs at least this many)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the serialised tokenizer: equal fingerprints encode identically."""
        return hashlib.sha256(self.backend.to_str().encode("utf-8")).hexdigest()

    def token_id(self, token: str) -> int:
        """The id of ``token``; raises KeyError if the vocabulary lacks it."""
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return token_id

    @functools.cached_property
    def byte_token_ids(self) -> np.ndarray:
        """``int32 [256]``: the token of each byte alone in a byte-level BPE (GPT-2's byte
        alphabet, which ``train_tokenizer`` keeps whole).  Spelling text byte by byte needs no
        merges, so it runs inside jit: a query encoded on the device, a stored text written back
        into a transcript.  Raises KeyError for a tokenizer without that alphabet."""
        printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
        shifted = [b for b in range(256) if b not in printable]
        char = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(shifted)}
        return np.asarray([self.token_id(char[b]) for b in range(256)], np.int32)

    def _wrap(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        for flag, token_id, name in ((add_bos, self.bos_id, "BOS"), (add_eos, self.eos_id, "EOS")):
            if flag and token_id is None:
                raise ValueError(f"this tokenizer has no {name} token")
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def encode(
        self, text: str, *, add_bos: bool = False, add_eos: bool = False, special: bool = True
    ) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their special ids.

        ``special=False`` spells them as plain text instead: for text from outside the template
        (a tool's output), where a ``<|im_end|>`` must not forge a turn boundary.
        """
        backend = self.backend if special else self._plain_backend
        ids = backend.encode(text, add_special_tokens=False).ids
        return self._wrap(ids, add_bos, add_eos)

    @functools.cached_property
    def _plain_backend(self) -> tokenizers.Tokenizer:
        """A copy of the backend that encodes special-token strings as text (a copy: flipping the
        shared backend's setting would race with ``encode`` calls on other threads)."""
        plain = tokenizers.Tokenizer.from_str(self.backend.to_str())
        plain.encode_special_tokens = True
        return plain

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` (as ``encode``) and each token's ``(start, end)`` characters."""
        encoding = self.backend.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        """``encode`` over many texts, in parallel threads inside the Rust library."""
        encodings = self.backend.encode_batch_fast(list(texts), add_special_tokens=False)
        return [self._wrap(e.ids, add_bos, add_eos) for e in encodings]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def save(self, path: str | os.PathLike) -> None:
        """Writes a standard ``tokenizer.json`` (``tokenizers`` and ``transformers`` load it)."""
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.backend.save(os.fspath(path))


def _token_name(value) -> str | None:
    """A token as ``tokenizer_config.json`` writes it: a string or an ``AddedToken`` dict."""
    return value.get("content") if isinstance(value, dict) else value


def _read_json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _chat_templates(directory: pathlib.Path, config: dict) -> str | dict[str, str] | None:
    """The chat template(s) of a ``save_pretrained`` directory: ``chat_template.jinja`` and
    ``additional_chat_templates/<name>.jinja`` (transformers 5), else the config's ``chat_template``, a
    string or a list of ``{"name", "template"}``."""
    named = {
        f.stem: f.read_text(encoding="utf-8")
        for f in directory.glob("additional_chat_templates/*.jinja")
    }
    default = directory / "chat_template.jinja"
    if default.is_file():
        named["default"] = default.read_text(encoding="utf-8")
    if named:
        return named["default"] if list(named) == ["default"] else named
    template = config.get("chat_template")
    if isinstance(template, list):
        return {entry["name"]: entry["template"] for entry in template}
    return template


def _add_configured_tokens(backend: tokenizers.Tokenizer, config: dict) -> None:
    """Adds the config's ``added_tokens_decoder`` entries missing from ``tokenizer.json`` (with
    their ``special`` flag); an entry whose id disagrees with the vocabulary is an error."""
    for index, entry in sorted(
        config.get("added_tokens_decoder", {}).items(), key=lambda e: int(e[0])
    ):
        token_id = backend.token_to_id(entry["content"])
        if token_id is None:
            fields = {
                k: entry[k] for k in ("single_word", "lstrip", "rstrip", "normalized") if k in entry
            }
            token = tokenizers.AddedToken(
                entry["content"], special=entry.get("special", False), **fields
            )
            backend.add_tokens([token])
            token_id = backend.token_to_id(entry["content"])
        if token_id != int(index):
            raise ValueError(
                f"tokenizer_config.json gives {entry['content']!r} id {index}, "
                f"but the vocabulary has it at {token_id}"
            )


def _post_processor_adds(backend: tokenizers.Tokenizer, bos: str | None, eos: str | None) -> dict:
    """Whether the ``tokenizer.json``'s own post-processor adds BOS / EOS (Llama's adds BOS)."""
    if backend.post_processor is None:
        return {}
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    added = len(full) > len(plain)
    return {
        "add_bos_token": added and bos is not None and full[0] == backend.token_to_id(bos),
        "add_eos_token": added and eos is not None and full[-1] == backend.token_to_id(eos),
    }


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Loads a ``tokenizer.json`` (or a directory holding one, e.g. from ``save_pretrained``).

    Beside it, ``tokenizer_config.json`` (then ``special_tokens_map.json``) names BOS/EOS/PAD/UNK,
    says whether transformers' ``encode`` adds BOS/EOS (``add_bos_token``, ``add_eos_token``;
    without them, what the ``tokenizer.json``'s post-processor adds), adds the added tokens it
    lists, and carries the chat template (also read from ``chat_template.jinja``).  A token that
    no file names is the first of the usual names in the vocabulary, or ``None``.
    """
    path = pathlib.Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    backend = tokenizers.Tokenizer.from_file(os.fspath(file))
    config = _read_json(file.parent / "tokenizer_config.json")
    special_map = _read_json(file.parent / "special_tokens_map.json")
    _add_configured_tokens(backend, config)
    vocab = backend.get_vocab(with_added_tokens=True)
    names = {}
    for key, candidates in _FALLBACK_NAMES.items():
        if key in config:
            names[key] = _token_name(config[key])
        elif key in special_map:
            names[key] = _token_name(special_map[key])
        else:
            names[key] = next((name for name in candidates if name in vocab), None)
    flags = ("add_bos_token", "add_eos_token")
    if any(k in config for k in flags):  # transformers then rebuilds the post-processor
        adds = {k: bool(config.get(k, False)) for k in flags}
    else:
        adds = _post_processor_adds(backend, names["bos_token"], names["eos_token"])
        if config:  # a transformers tokenizer: no BOS unless its files say so
            adds.setdefault("add_bos_token", False)
    return Tokenizer(backend, **names, **adds, chat_template=_chat_templates(file.parent, config))


@gin.configurable("train_tokenizer")
def train_tokenizer(
    output_path: str | os.PathLike,
    *,
    files: Sequence[str | os.PathLike] | None = None,
    vocab_size: int = 8192,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> Tokenizer:
    """Trains a byte-level BPE on the documents of ``files`` and saves it to ``output_path``.

    ``files`` are text or ``.txt.gz`` files read with ``documents.read_documents``; ``None``
    means the shipped training corpus.  ``vocab_size`` counts the 256 byte symbols and the
    special tokens; pairs seen fewer than ``min_frequency`` times are never merged.
    """
    files = corpus_files("train") if files is None else list(files)
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)}")
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=show_progress,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(read_documents(files), trainer)
    tokenizer = Tokenizer(backend)
    tokenizer.save(output_path)
    return tokenizer
