"""The files beside a Hugging Face checkpoint's weights that other tools need to use the model:
``tokenizer.json``, ``tokenizer_config.json`` (the special tokens, the added tokens and the chat
template) and ``generation_config.json`` (the special-token ids and the sampling defaults).

``transformers``' ``AutoTokenizer`` and vLLM read the first two, ``generate`` and vLLM's default
sampling read the third.  The chat template is the tokenizer's own (one loaded with a Hugging Face
``tokenizer_config.json`` carries it); a tokenizer without one that has this project's special
tokens (the project's own) gets the built-in template as Jinja (``chat_template.BUILTIN_JINJA``,
which transformers renders to the text ``data.chat`` renders), any other none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentic_jax.data.chat_template import BUILTIN_JINJA
from agentic_jax.data.tokenizer import IM_END, SPECIAL_TOKENS, Tokenizer

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# The sampling fields of a ``generation_config.json`` an export may set (transformers' names).
SAMPLING_FIELDS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
    "eos_token_id",
)


def tokenizer_config(tokenizer: Tokenizer, max_length: int) -> dict:
    """``tokenizer_config.json``: the named special tokens, every added token (the
    ``added_tokens_decoder``, with its flags) and the chat template (a string, or
    transformers' list of named templates; the built-in one for this project's tokenizer).
    ``add_bos_token`` is left to the ``tokenizer.json``'s post-processor, which both
    transformers and ``load_tokenizer`` read it from."""
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tokenizer.backend.get_added_tokens_decoder().items())
    }
    template = tokenizer.chat_template
    if template is None and set(SPECIAL_TOKENS) <= set(tokenizer.special_ids):
        template = BUILTIN_JINJA  # the template this project renders the tokenizer's chats with
    if isinstance(template, Mapping):
        template = [{"name": name, "template": source} for name, source in template.items()]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        **tokenizer.named_tokens,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    if template is not None:
        config["chat_template"] = template
    return config


def generation_config(tokenizer: Tokenizer, sampling: Mapping[str, Any] | None = None) -> dict:
    """``generation_config.json``: BOS/PAD ids, and as EOS the tokenizer's EOS plus the chat
    template's end of turn (``<|im_end|>``) when it has one, so that ``generate`` stops after an
    assistant turn; then ``sampling``, transformers' names of :data:`SAMPLING_FIELDS` (a
    ``temperature`` above zero turns ``do_sample`` on unless given)."""
    unknown = sorted(set(sampling or {}) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"unknown sampling fields {unknown}; expected some of {SAMPLING_FIELDS}")
    stops = [i for i in (tokenizer.eos_id, tokenizer.special_ids.get(IM_END)) if i is not None]
    config = {
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": stops[0] if len(set(stops)) == 1 else list(dict.fromkeys(stops)),
        "pad_token_id": tokenizer.pad_id,
    }
    config = {k: v for k, v in config.items() if v not in (None, [])}
    sampling = dict(sampling or {})
    if "temperature" in sampling:
        sampling.setdefault("do_sample", sampling["temperature"] > 0)
    return {**config, **sampling}


def serving_configs(
    tokenizer: Tokenizer, max_length: int, sampling: Mapping[str, Any] | None = None
) -> dict[str, dict]:
    """``{file name: content}`` of :func:`tokenizer_config` and :func:`generation_config`."""
    return {
        TOKENIZER_CONFIG_FILE: tokenizer_config(tokenizer, max_length),
        GENERATION_CONFIG_FILE: generation_config(tokenizer, sampling),
    }


def write_serving_files(path, tokenizer: Tokenizer, configs: Mapping[str, dict]) -> None:
    """Writes :data:`TOKENIZER_FILE` and the :func:`serving_configs` into the directory ``path``."""
    path = Path(path)
    tokenizer.save(path / TOKENIZER_FILE)
    for name, content in configs.items():
        (path / name).write_text(json.dumps(content, indent=2, ensure_ascii=False))
