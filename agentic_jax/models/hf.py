"""Hugging Face checkpoint interop for Llama / Mistral / Qwen2 causal LMs.

A HF checkpoint directory is a ``config.json`` plus safetensors weights (one ``model.safetensors``,
or shards listed by ``model.safetensors.index.json``).  The two layouts differ only mechanically:

* HF keeps one ``nn.Linear`` weight ``[out, in]`` per layer; we keep ``[in, ...out]`` stacked on a
  leading layers axis (``q[L, D, N, H]``), so a HF weight maps to ours by a transpose and a reshape.
  Our RoPE uses HF's rotate-half layout, so q/k need no row permutation.
* Config fields are renamed, and HF's rope parameters moved between versions (transformers 5 keeps
  ``rope_theta`` inside ``rope_parameters``; older configs have top-level ``rope_theta`` and
  ``rope_scaling``).  Both spellings are read; the older one is written, since every transformers
  version reads it.

Loading streams one tensor at a time from ``safe_open(framework="numpy")`` into preallocated stacked
host buffers, and saving writes the safetensors format one tensor at a time, so neither direction
ever holds a second full copy of the model.  Reading BF16 into numpy needs a safetensors release
that maps it to ``ml_dtypes.bfloat16`` (0.8 does; 0.5 raises).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.transformer import param_shapes

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_ST_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# Tensors a checkpoint may carry that we rebuild ourselves: rotary ``inv_freq`` buffers, which old
# transformers versions persisted, and a tied LM head (checked in :func:`_ignored`).
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
# rope.py's llama3 defaults; HF has none, so they must be written out.
_LLAMA3_DEFAULTS = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


# ---------------------------------------------------------------------------------------------
# config.json <-> TransformerConfig


def _required(hf: Mapping[str, Any], key: str):
    if hf.get(key) is None:
        raise ValueError(f"HF config.json lacks required field {key!r}")
    return hf[key]


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _rope_from_hf(hf: Mapping[str, Any], max_pos: int) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) as transformers 5 resolves them (``standardize_rope_params``)."""
    given = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if any(isinstance(v, Mapping) for v in given.values()):
        raise NotImplementedError(f"per-layer-type rope parameters {dict(given)}")
    params = {k: v for k, v in given.items() if v is not None}
    kind = params.pop("rope_type", None) or params.get("type") or "default"
    params.pop("type", None)
    theta = float(params.pop("rope_theta", None) or hf.get("rope_theta") or 10000.0)
    partial = params.pop("partial_rotary_factor", None) or hf.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise NotImplementedError(f"partial_rotary_factor={partial}: RoPE on part of a head")
    if kind == "default":
        return theta, None
    if kind not in ("linear", "dynamic", "yarn", "llama3"):
        raise NotImplementedError(
            f"HF rope type {kind!r}; supported: linear, dynamic, yarn, llama3"
        )
    if kind == "dynamic":
        # HF grows dynamic NTK from max_position_embeddings, whatever the dict says.
        params["original_max_position_embeddings"] = max_pos
    if kind in ("yarn", "llama3"):
        params.setdefault("original_max_position_embeddings", max_pos)
    if kind == "yarn":
        params.setdefault("factor", max_pos / params["original_max_position_embeddings"])
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if "attention_factor" not in params and mscale and mscale_all_dim:
            params["attention_factor"] = _yarn_mscale(params["factor"], mscale) / _yarn_mscale(
                params["factor"], mscale_all_dim
            )
    return theta, {"type": kind, **params}


def _sliding_window_from_hf(hf: Mapping[str, Any]) -> int | None:
    """Mistral windows every layer; Qwen2 the layers >= max_window_layers (or per layer_types)."""
    if hf["model_type"] == "llama":
        return None
    if hf["model_type"] == "mistral":
        return hf.get("sliding_window", 4096)
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window") else None
    if window is None:
        return None
    n_layers = hf["num_hidden_layers"]
    first = hf.get("max_window_layers", 28)
    types = hf.get("layer_types") or [
        "sliding_attention" if i >= first else "full_attention" for i in range(n_layers)
    ]
    sliding = {t == "sliding_attention" for t in types}
    if sliding == {False}:
        return None
    if sliding == {True}:
        return window
    raise NotImplementedError(
        f"Qwen2 sliding window on some layers only ({types}); the model "
        "applies one window to every layer"
    )


def from_hf_config(hf: Mapping[str, Any], **overrides) -> TransformerConfig:
    """The :class:`TransformerConfig` of a HF ``config.json`` dict, plus ``overrides``."""
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"unsupported HF model_type {model_type!r}; expected one of {tuple(ARCHITECTURES)}"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act={hf['hidden_act']!r}; the MLP is SwiGLU (silu)")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise NotImplementedError(
            "Llama attention_bias / mlp_bias: the model has q/k/v biases "
            "only (no o_proj or MLP biases)"
        )
    d_model, n_heads = _required(hf, "hidden_size"), _required(hf, "num_attention_heads")
    max_pos = _required(hf, "max_position_embeddings")
    theta, scaling = _rope_from_hf(hf, max_pos)
    fields = dict(
        vocab_size=_required(hf, "vocab_size"),
        d_model=d_model,
        n_layers=_required(hf, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or d_model // n_heads,
        d_ff=_required(hf, "intermediate_size"),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2",
        sliding_window=_sliding_window_from_hf(hf),
        max_seq_len=max_pos,
    )
    return TransformerConfig(**{**fields, **overrides})


def hf_model_type(config: TransformerConfig) -> str:
    """Qwen2 for q/k/v biases (Llama's attention_bias would add an o_proj bias), else Mistral for a
    sliding window, else Llama."""
    if config.qkv_bias:
        return "qwen2"
    return "mistral" if config.sliding_window else "llama"


def _rope_to_hf(config: TransformerConfig) -> tuple[float, int, dict | None]:
    """(rope_theta, max_position_embeddings, rope_scaling) for HF."""
    scaling, max_pos = config.rope_scaling, config.max_seq_len
    if scaling is None:
        return config.rope_theta, max_pos, None
    kind = scaling["type"]
    rest = {k: v for k, v in scaling.items() if k not in ("type", "rope_type")}
    if kind == "ntk":
        # HF has no static NTK, but it is exactly a larger base: theta * factor^(d / (d - 2)).
        d = config.head_dim
        return config.rope_theta * scaling["factor"] ** (d / (d - 2)), max_pos, None
    if kind == "dynamic":
        # HF's dynamic NTK grows from max_position_embeddings; that must be our original length.
        max_pos = rest.get("original_max_position_embeddings", max_pos)
    if kind == "llama3":
        rest = {**_LLAMA3_DEFAULTS, **rest}
    return config.rope_theta, max_pos, {"rope_type": kind, **rest}


def to_hf_config(config: TransformerConfig, dtype: str | None = None, tokenizer=None) -> dict:
    """The HF ``config.json`` dict of ``config`` (:func:`hf_model_type` picks the architecture).

    ``tokenizer`` (anything with ``bos_id`` / ``eos_id`` / ``pad_id``) supplies the special-token
    ids; without them ``generate`` falls back to the architecture's defaults (Llama's 1 and 2,
    Qwen2's none), which need not be the tokenizer's.  An id the tokenizer lacks is left out.
    """
    model_type = hf_model_type(config)
    theta, max_pos, scaling = _rope_to_hf(config)
    hf = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": jnp.dtype(dtype or config.param_dtype).name,
    }
    if model_type == "llama":
        hf.update(attention_bias=False, mlp_bias=False)
    elif model_type == "mistral":
        hf["sliding_window"] = config.sliding_window
    else:
        hf.update(
            use_sliding_window=config.sliding_window is not None,
            sliding_window=config.sliding_window,
            max_window_layers=0,
        )
    if tokenizer is not None:
        ids = {
            "bos_token_id": tokenizer.bos_id,
            "eos_token_id": tokenizer.eos_id,
            "pad_token_id": tokenizer.pad_id,
        }
        hf.update({k: v for k, v in ids.items() if v is not None})
    return hf


# ---------------------------------------------------------------------------------------------
# Tensor names and layouts


class _Tensor(NamedTuple):
    """One HF tensor: where it lives in our tree and how its layout differs."""

    name: str
    path: tuple[str, ...]
    layer: int | None  # index on the stacked layers axis, None for non-layer parameters
    hf_shape: tuple[int, ...]
    transpose: bool  # nn.Linear weight [out, in] vs our [in, ...out]


def _tensor_table(c: TransformerConfig) -> list[_Tensor]:
    """Every HF tensor of ``c`` in HF's order (embedding, layer by layer, final norm, head)."""
    D, N, K, H, F, V = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size
    per_layer = [
        ("input_layernorm.weight", ("attn_norm",), (D,), False),
        ("self_attn.q_proj.weight", ("attn", "q"), (N * H, D), True),
        ("self_attn.k_proj.weight", ("attn", "k"), (K * H, D), True),
        ("self_attn.v_proj.weight", ("attn", "v"), (K * H, D), True),
        ("self_attn.o_proj.weight", ("attn", "o"), (D, N * H), True),
        ("post_attention_layernorm.weight", ("mlp_norm",), (D,), False),
        ("mlp.gate_proj.weight", ("mlp", "gate"), (F, D), True),
        ("mlp.up_proj.weight", ("mlp", "up"), (F, D), True),
        ("mlp.down_proj.weight", ("mlp", "down"), (D, F), True),
    ]
    if c.qkv_bias:
        per_layer += [
            ("self_attn.q_proj.bias", ("attn", "q_bias"), (N * H,), False),
            ("self_attn.k_proj.bias", ("attn", "k_bias"), (K * H,), False),
            ("self_attn.v_proj.bias", ("attn", "v_bias"), (K * H,), False),
        ]
    table = [_Tensor("model.embed_tokens.weight", ("embed",), None, (V, D), False)]
    table += [
        _Tensor(f"model.layers.{i}.{name}", ("layers",) + path, i, shape, transpose)
        for i in range(c.n_layers)
        for name, path, shape, transpose in per_layer
    ]
    table.append(_Tensor("model.norm.weight", ("final_norm",), None, (D,), False))
    if not c.tie_embeddings:
        table.append(_Tensor("lm_head.weight", ("lm_head",), None, (V, D), True))
    return table


def _ignored(name: str, config: TransformerConfig) -> bool:
    return bool(_IGNORED.fullmatch(name)) or (config.tie_embeddings and name == "lm_head.weight")


def _leaves_by_path(tree) -> tuple[dict, Any]:
    """{("layers", "attn", "q"): leaf, ...} and the treedef to rebuild the tree."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return {tuple(k.key for k in path): leaf for path, leaf in flat}, treedef


def check_params(config: TransformerConfig, params) -> dict:
    """Fails, naming the leaves, unless ``params`` has the tree and shapes of ``config``; returns
    the leaves by path.  Checked before writing anything, so a mismatch leaves no partial files."""
    leaves, _ = _leaves_by_path(params)
    expected, _ = _leaves_by_path(param_shapes(config))
    wrong = sorted(
        "/".join(p)
        for p in set(leaves) | set(expected)
        if p not in leaves or p not in expected or np.shape(leaves[p]) != expected[p].shape
    )
    if wrong:
        raise ValueError(f"params do not match the config's parameter tree at {wrong}")
    return leaves


# ---------------------------------------------------------------------------------------------
# Loading


def _weight_files(path: Path) -> dict[str, list[str]]:
    """{file: [tensor names]} from the shard index, or from the single weights file."""
    index = path / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"shard index {index} has no 'weight_map' object")
        names: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            names.setdefault(file, []).append(name)
        files = names
    elif (path / SINGLE_FILE).exists():
        with safe_open(str(path / SINGLE_FILE), framework="numpy") as f:
            files = {SINGLE_FILE: list(f.keys())}
    else:
        raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")
    for file in files:
        if not (path / file).exists():
            raise FileNotFoundError(f"weights shard {path / file} (listed in {index}) is missing")
    return files


def _check_names(files: dict[str, list[str]], table: list[_Tensor], config: TransformerConfig):
    """Fails before any data is read if a tensor is unknown, missing or duplicated."""
    found = Counter(n for names in files.values() for n in names if not _ignored(n, config))
    expected = {t.name for t in table}
    unknown = sorted(set(found) - expected)
    missing = sorted(expected - set(found))
    duplicated = sorted(n for n, count in found.items() if count > 1)
    for what, names in (("unknown", unknown), ("missing", missing), ("duplicated", duplicated)):
        if names:
            raise ValueError(
                f"{what} tensors in the HF checkpoint for {hf_model_type(config)} "
                f"config: {names[:8]}{' ...' if len(names) > 8 else ''}"
            )


def _read(f, name: str) -> np.ndarray:
    try:
        return f.get_tensor(name)
    except TypeError as e:  # old safetensors cannot build BF16 numpy arrays
        raise TypeError(f"cannot read tensor {name!r} into numpy ({e}); upgrade safetensors") from e


def load_hf_checkpoint(
    path, *, param_dtype: str = "float32", **config_overrides
) -> tuple[TransformerConfig, dict]:
    """(config, params) of a local HF Llama / Mistral / Qwen2 causal-LM directory.

    Parameters are cast to ``param_dtype``; ``config_overrides`` set non-architecture fields such
    as ``dtype`` or ``attention_impl``.  Rotary ``inv_freq`` buffers, and ``lm_head.weight`` of a
    tied model, are skipped; any other tensor we have no place for is an error.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"HF checkpoint directory {path} does not exist")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path / 'config.json'} not found")
    config = from_hf_config(
        json.loads((path / "config.json").read_text()), param_dtype=param_dtype, **config_overrides
    )
    table = _tensor_table(config)
    files = _weight_files(path)
    _check_names(files, table, config)
    by_name = {t.name: t for t in table}
    shapes, treedef = _leaves_by_path(param_shapes(config))
    buffers = {p: np.empty(s.shape, s.dtype) for p, s in shapes.items()}
    for file, names in files.items():
        with safe_open(str(path / file), framework="numpy") as f:
            for name in names:
                if _ignored(name, config):
                    continue
                t, array = by_name[name], _read(f, name)
                if array.shape != t.hf_shape:
                    raise ValueError(
                        f"HF tensor {name} has shape {array.shape}; the config implies {t.hf_shape}"
                    )
                dest = buffers[t.path] if t.layer is None else buffers[t.path][t.layer]
                dest[...] = (array.T if t.transpose else array).reshape(dest.shape)
    # Popping hands each host buffer to the device and frees it before the next one is copied.
    leaves = [jnp.asarray(buffers.pop(p)) for p in shapes]
    return config, jax.tree_util.tree_unflatten(treedef, leaves)


# ---------------------------------------------------------------------------------------------
# Saving


def _write_safetensors(path: Path, tensors: list[tuple[_Tensor, Any]], dtype: np.dtype):
    """Writes the safetensors format (u64 header size, JSON header, raw little-endian data)
    streaming: ``tensors`` pairs a name with a thunk, called only when its bytes are written."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t, _ in tensors:
        size = math.prod(t.hf_shape) * dtype.itemsize
        header[t.name] = {
            "dtype": _ST_DTYPES[dtype.name],
            "shape": list(t.hf_shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _t, produce in tensors:
            np.ascontiguousarray(produce(), dtype=dtype).tofile(f)


def _shards(table: list[_Tensor], itemsize: int, max_shard_bytes: int) -> list[list[_Tensor]]:
    """Consecutive groups under ``max_shard_bytes`` (a larger tensor gets a shard of its own)."""
    shards, size = [[]], 0
    for t in table:
        nbytes = math.prod(t.hf_shape) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    return shards


def save_hf_checkpoint(
    path,
    config: TransformerConfig,
    params,
    *,
    dtype: str | None = None,
    max_shard_bytes: int = 5 * 10**9,
    tokenizer=None,
) -> Path:
    """Writes ``config.json`` and safetensors weights that ``transformers`` loads as
    :func:`hf_model_type` (``config``).  Tensors are cast to ``dtype`` (default
    ``config.param_dtype``) and written one at a time; over ``max_shard_bytes`` the weights are
    sharded with a ``model.safetensors.index.json``.  Refuses a directory that already holds
    weights, since stale shards would mix with the new ones.  ``tokenizer``, if given, puts its
    special-token ids in ``config.json`` (see :func:`to_hf_config`).
    """
    path = Path(path)
    if path.exists() and any(path.glob("*.safetensors*")):
        raise FileExistsError(f"{path} already holds safetensors weights")
    leaves = check_params(config, params)
    np_dtype = np.dtype(jnp.dtype(dtype or config.param_dtype))
    table = _tensor_table(config)

    def producer(t: _Tensor):
        def produce():
            leaf = leaves[t.path] if t.layer is None else leaves[t.path][t.layer]
            ours = np.asarray(leaf)
            return ours.reshape(t.hf_shape[::-1]).T if t.transpose else ours.reshape(t.hf_shape)

        return produce

    path.mkdir(parents=True, exist_ok=True)
    shards = _shards(table, np_dtype.itemsize, max_shard_bytes)
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for name, shard in zip(names, shards):
        _write_safetensors(path / name, [(t, producer(t)) for t in shard], np_dtype)
    if len(shards) > 1:
        total = sum(math.prod(t.hf_shape) for t in table) * np_dtype.itemsize
        index = {
            "metadata": {"total_size": total},
            "weight_map": {t.name: name for name, shard in zip(names, shards) for t in shard},
        }
        (path / INDEX_FILE).write_text(json.dumps(index, indent=2))
    (path / "config.json").write_text(json.dumps(to_hf_config(config, dtype, tokenizer), indent=2))
    return path
