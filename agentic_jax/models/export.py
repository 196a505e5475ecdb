"""The project's own format for a trained model, and converters to and from Hugging Face.

A native model directory holds ``config.json`` (every :class:`TransformerConfig` field, so compute
dtype, attention implementation and the like survive, which a HF config cannot carry) and
``params/``, an orbax ``StandardCheckpointer`` checkpoint (the format training checkpoints use,
which restores straight into jax arrays); a compressed model's ``quantization.json`` records how
each quantised weight was made (``quantization.quantization_spec``), so that its codes and scales
restore into ``QuantizedWeight`` nodes.  ``config.json`` is written after the parameters, so its
presence marks a complete save.  A model without its tokenizer cannot be used, so the converters
copy the tokenizer files along with the weights.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from agentic_jax.data.tokenizer import Tokenizer, load_tokenizer
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.hf import check_params, load_hf_checkpoint, save_hf_checkpoint
from agentic_jax.models.quantization import is_quantized, quantization_spec, quantized_shapes
from agentic_jax.models.transformer import param_shapes

CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
QUANTIZATION_FILE = "quantization.json"
# ``tokenizer.json``, the files naming its special tokens (``load_tokenizer`` reads the config)
# and transformers 5's ``chat_template.jinja`` (an imported model's chat template).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def config_to_dict(config: TransformerConfig) -> dict:
    """JSON-ready fields of ``config`` (``rope_scaling`` as a plain dict)."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    if fields["rope_scaling"] is not None:
        fields["rope_scaling"] = dict(fields["rope_scaling"])
    return fields


def config_from_dict(fields: dict) -> TransformerConfig:
    """Inverse of :func:`config_to_dict`; absent fields take their defaults, unknown ones fail."""
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown TransformerConfig fields {unknown} (saved by a newer version?)")
    return TransformerConfig(**fields)


def save_model(path, config: TransformerConfig, params) -> Path:
    """Writes ``path/params`` (orbax), ``path/quantization.json`` if some weights are
    :class:`~agentic_jax.models.quantization.QuantizedWeight` (their codes, scales and zero
    points are arrays of ``params``), then ``path/config.json``; fails if ``path/params`` exists."""
    check_params(config, _float_shapes(params))
    path = Path(path).absolute()  # orbax wants absolute paths
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / PARAMS_DIR, params)
    if jax.process_index() == 0:  # orbax saved collectively; the small files are one process's
        spec = quantization_spec(params)
        if spec:
            (path / QUANTIZATION_FILE).write_text(json.dumps(spec, indent=2))
        (path / CONFIG_FILE).write_text(json.dumps(config_to_dict(config), indent=2))
    return path


def _float_shapes(params):
    """``params`` with each quantised weight seen as the float weight it stands for (its shape)."""
    return jax.tree.map(
        lambda w: jax.ShapeDtypeStruct(w.shape, jnp.float32) if is_quantized(w) else w,
        params,
        is_leaf=is_quantized,
    )


def quantization_file(path) -> Path | None:
    """``quantization.json`` of the saved model ``path`` if its weights are quantised."""
    spec = Path(path) / QUANTIZATION_FILE
    return spec if spec.is_file() else None


def load_model(path) -> tuple[TransformerConfig, dict]:
    """(config, params) saved by :func:`save_model`, parameters in ``config.param_dtype`` (a
    quantised model's weights as the ``QuantizedWeight`` nodes it saved)."""
    path = Path(path).absolute()
    for required in (path / CONFIG_FILE, path / PARAMS_DIR):
        if not required.exists():
            raise FileNotFoundError(f"{required} not found; is {path} a model saved by save_model?")
    config = config_from_dict(json.loads((path / CONFIG_FILE).read_text()))
    target, spec = param_shapes(config), quantization_file(path)
    if spec is not None:
        target = quantized_shapes(target, json.loads(spec.read_text()))
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(path / PARAMS_DIR, target)
    return config, params


def tokenizer_dir(*candidates) -> Path | None:
    """The first of the directories ``candidates`` holding a ``tokenizer.json``."""
    return next((Path(d) for d in candidates if (Path(d) / TOKENIZER_FILES[0]).is_file()), None)


def _copy_tokenizer(src: Path | None, out_dir) -> None:
    """Copies the ``TOKENIZER_FILES`` present in ``src`` (none without one)."""
    for name in TOKENIZER_FILES if src is not None else ():
        if (src / name).is_file():
            shutil.copyfile(src / name, Path(out_dir) / name)


def hf_to_native(hf_dir, out_dir, *, param_dtype: str = "float32") -> TransformerConfig:
    """Converts a HF checkpoint directory (a family of ``hf.FAMILIES``) to a native model
    directory, tokenizer files included."""
    config, params = load_hf_checkpoint(hf_dir, param_dtype=param_dtype)
    save_model(out_dir, config, params)
    _copy_tokenizer(tokenizer_dir(hf_dir), out_dir)
    return config


def native_to_hf(
    native_dir, out_dir, *, dtype: str | None = None, max_shard_bytes: int = 5 * 10**9
) -> TransformerConfig:
    """Converts a native model directory to a HF checkpoint (tensors in ``dtype``, default the
    model's ``param_dtype``; sharded above ``max_shard_bytes``).  The tokenizer files come from
    the model directory or, as training writes ``workdir/model`` beside ``workdir/tokenizer.json``,
    from its parent; ``save_hf_checkpoint`` then writes them with the chat template and the
    generation config, and the HF config names the tokenizer's BOS/EOS/PAD ids."""
    if quantization_file(native_dir) is not None:
        raise ValueError(
            f"{native_dir} holds quantised weights (quantization.json); Hugging Face export "
            "takes a float model: export the model it was compressed from"
        )
    config, params = load_model(native_dir)
    src = tokenizer_dir(native_dir, Path(native_dir).absolute().parent)
    save_hf_checkpoint(
        out_dir,
        config,
        params,
        dtype=dtype,
        max_shard_bytes=max_shard_bytes,
        tokenizer=None if src is None else load_tokenizer(src),
    )
    return config


def load_checkpoint(path) -> tuple[TransformerConfig, dict, Tokenizer]:
    """``(config, params, tokenizer)`` from a training workdir (``model/`` and ``tokenizer.json``)
    or a native model directory holding a ``tokenizer.json`` (or with one beside it)."""
    path = Path(path)
    model_dir = path / "model" if (path / "model" / CONFIG_FILE).exists() else path
    tokenizer_src = tokenizer_dir(path, model_dir, model_dir.parent)
    if tokenizer_src is None:
        raise FileNotFoundError(f"no tokenizer.json in {path} or beside {model_dir}")
    config, params = load_model(model_dir)
    return config, params, load_tokenizer(tokenizer_src)
