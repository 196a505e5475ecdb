"""LoRA and DoRA adapters in PEFT's layout: PEFT loads the adapters trained here, and we load its.

A PEFT LoRA directory holds ``adapter_config.json`` (``peft_type: LORA``, ``r``, ``lora_alpha``,
``target_modules`` by HF module name, ``use_dora``, ``use_rslora``, ...) and
``adapter_model.safetensors`` with, for each adapted ``nn.Linear`` ``M`` (such as
``model.layers.3.self_attn.q_proj``)::

    base_model.model.M.lora_A.weight          [r, in]
    base_model.model.M.lora_B.weight          [out, r]
    base_model.model.M.lora_magnitude_vector  [out]      (DoRA)

PEFT computes ``y = x Wᵀ + s · x Aᵀ Bᵀ`` with ``s = α / r``, or ``α / √r`` under rsLoRA
(Kalajdzievski 2023, arXiv:2312.03732); ours (:mod:`agentic_jax.models.lora`) computes
``y = x W + (α / r) · x A B`` with ``A [in..., r]`` and ``B [r, out...]``, both unscaled in the
trainable tree.  So PEFT's ``lora_A`` is our ``A`` transposed and its ``lora_B`` our ``B``
transposed, each flattened the way the HF weight flattens ours (our per-head ``[D, N, H]`` is
HF's ``[N·H, D]``); which module each layer's slot is comes from hf.py's family tables
(:func:`hf.hf_linear_modules`).  rsLoRA's scale is ours with ``α' = α √r``.  DoRA's magnitude
is per output unit in both (the norm of ``W + s A B`` over the input dims of that unit), laid
out like ``B``'s output dims.

LoRA+'s learning-rate ratio and QLoRA's base format are training matters that PEFT's file does
not carry: they are not exported, and an import gets the defaults.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.hf import hf_linear_modules
from agentic_jax.models.lora import PROJECTIONS, LoraConfig, _check_names, _parts, _split
from agentic_jax.models.transformer import param_shapes

PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_SUFFIXES = {"a": "lora_A.weight", "b": "lora_B.weight", "m": "lora_magnitude_vector"}
# adapter_config.json fields that change what the adapter computes, which ours cannot express.
_UNSUPPORTED = (
    "rank_pattern",
    "alpha_pattern",
    "layers_to_transform",
    "layer_replication",
    "modules_to_save",
    "fan_in_fan_out",
    "lora_bias",
    "target_parameters",
    "trainable_token_indices",
    "use_qalora",
)


def _slots(config: TransformerConfig, targets) -> dict[str, list[str]]:
    """``{target: [HF module of each slot of its stacked weight, in slot order]}``."""
    modules = hf_linear_modules(config)
    out = {}
    for name in targets:
        path = ("layers", PROJECTIONS[name][0], name)
        n_slots = param_shapes(config)["layers"][path[1]][name].shape[0]
        missing = [i for i in range(n_slots) if (path, (i,)) not in modules]
        if missing:
            raise NotImplementedError(
                f"LoRA target {name!r}: slots {missing} of its weight have no HF nn.Linear "
                "holding them whole (an MLA projection?); PEFT cannot express that adapter"
            )
        out[name] = [modules[(path, (i,))] for i in range(n_slots)]
    return out


def _target_modules(config: TransformerConfig, adapted: set[str]) -> list[str] | str:
    """PEFT's ``target_modules``: the module names' last parts when they match (as PEFT matches a
    list, by suffix) exactly the adapted modules; else a regular expression of their full names
    (PEFT full-matches a string), e.g. when ``gate_proj`` also names the MoE experts'."""
    everything = set(hf_linear_modules(config).values())
    suffixes = sorted({m.rsplit(".", 1)[-1] for m in adapted})
    if {m for m in everything if m.rsplit(".", 1)[-1] in suffixes} == adapted:
        return suffixes
    return "|".join(re.escape(m) for m in sorted(adapted))


def save_peft_adapters(
    path,
    trainable,
    lora_config: LoraConfig,
    config: TransformerConfig,
    *,
    base_model_name_or_path: str | None = None,
) -> Path:
    """Writes ``trainable`` (adapters of :class:`lora.LoRA` on a ``config`` model) as a PEFT
    LoRA directory: ``PeftModel.from_pretrained(model, path)`` on the model
    :func:`hf.save_hf_checkpoint` writes computes what ours does with the adapters attached.
    ``base_model_name_or_path`` names that model in the config (PEFT loads it from there when
    asked to).  Refuses a directory that already holds an adapter."""
    path = Path(path)
    if (path / PEFT_CONFIG_FILE).exists():
        raise FileExistsError(f"{path / PEFT_CONFIG_FILE} exists; adapters are never overwritten")
    _check_names(trainable, lora_config, "the adapters")
    slots = _slots(config, lora_config.targets)
    tensors = {}
    for name, adapter in trainable.items():
        arrays = {p: np.asarray(jax.device_get(v)) for p, v in adapter.items()}
        if arrays["a"].shape[0] != len(slots[name]):
            raise ValueError(
                f"adapter {name!r} has {arrays['a'].shape[0]} layers; the config's {name} "
                f"weight has {len(slots[name])}"
            )
        r = lora_config.rank
        for i, module in enumerate(slots[name]):
            key = _PREFIX + module + "."
            tensors[key + _SUFFIXES["a"]] = arrays["a"][i].reshape(-1, r).T
            tensors[key + _SUFFIXES["b"]] = arrays["b"][i].reshape(r, -1).T
            if "m" in arrays:
                tensors[key + _SUFFIXES["m"]] = arrays["m"][i].reshape(-1)
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path / PEFT_WEIGHTS_FILE)
    )
    adapted = {m for modules in slots.values() for m in modules}
    peft_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora_config.rank,
        "lora_alpha": lora_config.alpha,
        "lora_dropout": lora_config.dropout,
        "target_modules": _target_modules(config, adapted),
        "bias": "none",
        "use_rslora": False,
        "use_dora": lora_config.variant == "dora",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (path / PEFT_CONFIG_FILE).write_text(json.dumps(peft_config, indent=2))
    return path


def _peft_shape(part: str, ours: tuple[int, ...]) -> tuple[int, ...]:
    """PEFT's shape of one layer's ``A [in..., r]``, ``B [r, out...]`` or ``m [out...]``."""
    if part == "a":
        return (ours[-1], math.prod(ours[:-1]))
    if part == "b":
        return (math.prod(ours[1:]), ours[0])
    return (math.prod(ours),)


def _read_lora_config(peft_config: dict, targets: tuple[str, ...], where: Path) -> LoraConfig:
    """Our :class:`LoraConfig` of a PEFT ``adapter_config.json``; fails on what ours lacks."""
    if peft_config.get("peft_type") != "LORA":
        raise ValueError(f"{where}: peft_type={peft_config.get('peft_type')!r}; expected 'LORA'")
    if peft_config.get("bias", "none") != "none":
        raise ValueError(f"{where}: bias={peft_config['bias']!r}; only 'none' is supported")
    unsupported = [k for k in _UNSUPPORTED if peft_config.get(k)]
    if unsupported:
        raise ValueError(f"{where}: unsupported PEFT LoRA options {unsupported}")
    rank, alpha = peft_config["r"], peft_config["lora_alpha"]
    if peft_config.get("use_rslora"):
        alpha = alpha * math.sqrt(rank)  # α / √r = (α √r) / r
    return LoraConfig(
        rank=rank,
        alpha=alpha,
        dropout=peft_config.get("lora_dropout") or 0.0,
        targets=targets,
        variant="dora" if peft_config.get("use_dora") else "lora",
    )


def load_peft_adapters(path, config: TransformerConfig) -> tuple[dict, LoraConfig]:
    """``(trainable, lora_config)`` of a PEFT LoRA (or DoRA) directory made for the HF export of a
    ``config`` model (by :func:`save_peft_adapters`, or by PEFT's ``save_pretrained``), to
    attach with ``LoRA(lora_config).model_params(trainable, base)``.  Every layer of each adapted
    projection must be adapted (ours adapts a projection in all layers or none)."""
    path = Path(path)
    for required in (path / PEFT_CONFIG_FILE, path / PEFT_WEIGHTS_FILE):
        if not required.exists():
            raise FileNotFoundError(f"{required} not found; is {path} a PEFT adapter directory?")
    tensors = load_file(str(path / PEFT_WEIGHTS_FILE))
    where = {m: key for key, m in hf_linear_modules(config).items() if key[0][-1] in PROJECTIONS}
    found: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for key, value in tensors.items():
        part = next((p for p, s in _SUFFIXES.items() if key.endswith("." + s)), None)
        module = key.removeprefix(_PREFIX).removesuffix("." + _SUFFIXES.get(part, ""))
        if part is None or not key.startswith(_PREFIX) or module not in where:
            raise ValueError(f"{path / PEFT_WEIGHTS_FILE}: tensor {key!r} adapts nothing ours can")
        (_, _, name), (slot,) = where[module]
        found.setdefault(name, {}).setdefault(slot, {})[part] = value
    lora_config = _read_lora_config(
        json.loads((path / PEFT_CONFIG_FILE).read_text()),
        tuple(n for n in PROJECTIONS if n in found),
        path / PEFT_CONFIG_FILE,
    )
    shapes, r = param_shapes(config)["layers"], lora_config.rank
    trainable = {}
    for name, by_slot in found.items():
        w = shapes[PROJECTIONS[name][0]][name]
        wanted = dict(zip(_parts(lora_config), _split(w.shape, name, r)))
        missing = sorted(set(range(w.shape[0])) - set(by_slot))
        if missing:
            raise ValueError(f"{path}: {name} is adapted in some layers only (not in {missing})")
        trainable[name] = {}
        for part, shape in wanted.items():
            per_slot = [by_slot[i].get(part) for i in range(w.shape[0])]
            if any(x is None for x in per_slot):
                raise ValueError(f"{path}: {name} lacks {_SUFFIXES[part]} in some layers")
            peft_shape = _peft_shape(part, shape[1:])
            wrong = [x.shape for x in per_slot if x.shape != peft_shape]
            if wrong:
                raise ValueError(
                    f"{path}: {name}'s {_SUFFIXES[part]} has shape {wrong[0]}; rank {r} and "
                    f"this config need {peft_shape}"
                )
            # PEFT's A and B are ours transposed
            trainable[name][part] = np.stack(
                [(x.T if part in "ab" else x).reshape(shape[1:]) for x in per_slot]
            )
    _check_names(trainable, lora_config, str(path / PEFT_WEIGHTS_FILE))
    return jax.tree.map(jnp.asarray, trainable), lora_config
