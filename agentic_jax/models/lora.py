"""LoRA: trainable low-rank adapters over a frozen transformer (Hu et al. 2021, arXiv:2106.09685).

A target projection ``y = x W`` (``W`` frozen, shaped ``[in..., out...]``) becomes

    y = x W + (α / r) · dropout(x) A B,    A: [in..., r],  B: [r, out...]

and only ``A`` and ``B`` are trained: ``r · (in + out)`` parameters per projection and layer instead of
``in · out``.  ``A`` starts as U(-1/√in, 1/√in) (the Kaiming-uniform default of ``torch.nn.Linear``
that PEFT uses) and ``B`` at zero, so training starts exactly at the base model.

The adapters run as their own path in the forward pass, next to the untouched base weights:
:meth:`LoRA.model_params` attaches them to the base as ``params["layers"]["lora"][name] =
{"a": [L, in..., r], "b": [L, r, out...]}`` (stacked on the layers axis like every layer parameter,
with α/r folded into ``b``), and the transformer block adds ``x A B`` to that projection; with a
key it also adds ``params["layers"]["lora_dropout"]`` (per-layer, per-projection dropout keys).
:meth:`LoRA.merged` folds the adapters into the weights, ``W + (α/r) A B``, for serving or export;
:meth:`LoRA.unmerge` takes them out again.  :func:`save_adapters` / :func:`load_adapters` store
only the adapters, with the fingerprint of the base they were trained on.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import gin
import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.transformer import param_axes

# Every projection an adapter can target: (parameter group, number of input dims of its weight
# ``[L, in..., out...]``).
PROJECTIONS = {
    "q": ("attn", 1),
    "k": ("attn", 1),
    "v": ("attn", 1),
    "o": ("attn", 2),
    "gate": ("mlp", 1),
    "up": ("mlp", 1),
    "down": ("mlp", 1),
}
ADAPTERS_FILE = "adapters.safetensors"
CONFIG_FILE = "adapter_config.json"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Adapter rank ``r``, scale numerator ``α`` (the path is scaled by α/r), dropout rate on the
    adapters' input, and the projections adapted (any of q, k, v, o, gate, up, down)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = tuple(PROJECTIONS)

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ValueError(f"LoraConfig.rank must be a positive integer, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoraConfig.alpha must be positive, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.targets, str):
            raise TypeError(
                f"LoraConfig.targets must be a sequence of projection names, not the "
                f"string {self.targets!r}"
            )
        targets = tuple(self.targets)
        unknown = [t for t in targets if t not in PROJECTIONS]
        if not targets or unknown or len(set(targets)) != len(targets):
            raise ValueError(
                f"LoraConfig.targets={targets!r} must be distinct names from "
                f"{tuple(PROJECTIONS)}, at least one" + (f"; unknown: {unknown}" if unknown else "")
            )
        object.__setattr__(self, "targets", targets)  # a gin list becomes a hashable tuple

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _weight(params, name):
    group, _ = PROJECTIONS[name]
    return params["layers"][group][name]


def _split(dims: tuple, name: str, rank):
    """``W``'s ``[L, in..., out...]`` dims (shape or logical axes) -> those of ``(A, B)``."""
    n_in = 1 + PROJECTIONS[name][1]
    return dims[:n_in] + (rank,), dims[:1] + (rank,) + dims[n_in:]


def lora_axes(config: TransformerConfig, lora_config: LoraConfig) -> dict:
    """Logical axes of the trainable adapters (``{name: {"a": axes, "b": axes}}``), for sharding:
    ``A`` is laid out like ``W``'s input dims, ``B`` like its output dims, the rank kept whole."""
    axes = param_axes(config)
    return {
        name: dict(zip("ab", _split(_weight(axes, name), name, "lora_rank")))
        for name in lora_config.targets
    }


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LoRA:
    """The LoRA `Finetune` (see ``agentic_jax.post_training.common``): the trainable tree holds only
    the adapters ``{name: {"a", "b"}}``; the base parameters stay frozen beside it."""

    config: LoraConfig | None = None

    def __post_init__(self):
        if self.config is None:  # built at call time, so gin bindings of LoraConfig apply
            object.__setattr__(self, "config", LoraConfig())
        if not isinstance(self.config, LoraConfig):
            raise TypeError(f"LoRA.config must be a LoraConfig, got {type(self.config).__name__}")

    def init(self, params, key):
        """Fresh adapters for ``params``: ``A ~ U(±1/√in)``, ``B = 0``, in the weights' dtype."""
        keys = jax.random.split(key, len(self.config.targets))
        adapters = {}
        for name, k in zip(self.config.targets, keys):
            w = _weight(params, name)
            a_shape, b_shape = _split(w.shape, name, self.config.rank)
            bound = 1.0 / math.sqrt(math.prod(a_shape[1:-1]))
            adapters[name] = {
                "a": jax.random.uniform(k, a_shape, jnp.float32, -bound, bound).astype(w.dtype),
                "b": jnp.zeros(b_shape, w.dtype),
            }
        return adapters

    def _check(self, trainable, base):
        if "lora" in base["layers"]:
            raise ValueError(
                "base params already carry LoRA adapters; pass the plain base parameters"
            )
        if set(trainable) != set(self.config.targets):
            raise ValueError(
                f"adapters for {sorted(trainable)} do not match LoraConfig.targets="
                f"{self.config.targets}"
            )
        for name, adapter in trainable.items():
            expected = _split(_weight(base, name).shape, name, self.config.rank)
            got = (adapter["a"].shape, adapter["b"].shape)
            if got != expected:
                raise ValueError(
                    f"adapter {name!r} has shapes (a, b) = {got}; this base and rank "
                    f"{self.config.rank} need {expected}"
                )

    def model_params(self, trainable, base, key=None):
        """``base`` with the adapters attached (α/r folded into B); ``key`` turns dropout on."""
        self._check(trainable, base)
        targets, layers = self.config.targets, dict(base["layers"])
        layers["lora"] = {}
        for name in targets:
            a, b = trainable[name]["a"], trainable[name]["b"]
            layers["lora"][name] = {"a": a, "b": b * jnp.asarray(self.config.scale, b.dtype)}
        if key is not None and self.config.dropout > 0:
            n_layers = base["layers"]["attn_norm"].shape[0]
            keys = jax.random.split(key, (len(targets), n_layers))
            layers["lora_dropout"] = {
                "rate": jnp.full((n_layers,), self.config.dropout, jnp.float32),
                "key": dict(zip(targets, keys)),
            }
        return {**base, "layers": layers}

    def _delta(self, adapter, shape):
        """``(α/r) A B`` per layer, ``[L, in..., out...]``, in float32 at full matmul precision."""
        a, b = (adapter[p].astype(jnp.float32) for p in "ab")
        r = self.config.rank
        ab = jnp.matmul(
            a.reshape(shape[0], -1, r),
            b.reshape(shape[0], r, -1),
            precision=jax.lax.Precision.HIGHEST,
        )
        return self.config.scale * ab.reshape(shape)

    def _shift(self, params, trainable, sign):
        layers = dict(params["layers"])
        for name, adapter in trainable.items():
            group, _ = PROJECTIONS[name]
            w = layers[group][name]
            layers[group] = {
                **layers[group],
                name: (w.astype(jnp.float32) + sign * self._delta(adapter, w.shape)).astype(
                    w.dtype
                ),
            }
        return {**params, "layers": layers}

    def merged(self, trainable, base):
        """Plain model parameters with the adapters folded in: ``W + (α/r) A B`` per target."""
        self._check(trainable, base)
        return self._shift(base, trainable, 1.0)

    def unmerge(self, merged, trainable):
        """The base back from :meth:`merged` parameters: ``W - (α/r) A B`` (exact up to rounding)."""
        self._check(trainable, merged)
        return self._shift(merged, trainable, -1.0)


def save_adapters(path, trainable, lora_config: LoraConfig, base_fingerprint: str) -> Path:
    """Writes ``path/adapters.safetensors`` then ``path/adapter_config.json`` (the LoraConfig and
    the base model's fingerprint; written last, so its presence marks a complete save).  Call it
    from one process, with adapters every process can read whole (replicated or gathered)."""
    path = Path(path)
    if (path / CONFIG_FILE).exists():
        raise FileExistsError(f"{path / CONFIG_FILE} exists; adapters are never overwritten")
    if set(trainable) != set(lora_config.targets):
        raise ValueError(
            f"adapters for {sorted(trainable)} do not match LoraConfig.targets="
            f"{lora_config.targets}"
        )
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            f"{name}.{p}": np.asarray(jax.device_get(ad[p]))
            for name, ad in trainable.items()
            for p in "ab"
        },
        str(path / ADAPTERS_FILE),
    )
    meta = {"lora_config": dataclasses.asdict(lora_config), "base_fingerprint": base_fingerprint}
    (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
    return path


def load_adapters(path, *, base_fingerprint: str | None = None) -> tuple[dict, LoraConfig]:
    """``(trainable, lora_config)`` saved by :func:`save_adapters`.  Pass ``base_fingerprint``
    (``tree_fingerprint(base)``) to fail unless the adapters were trained on that base."""
    path = Path(path)
    for required in (path / CONFIG_FILE, path / ADAPTERS_FILE):
        if not required.exists():
            raise FileNotFoundError(
                f"{required} not found; is {path} a directory written by save_adapters?"
            )
    meta = json.loads((path / CONFIG_FILE).read_text())
    if base_fingerprint is not None and meta["base_fingerprint"] != base_fingerprint:
        raise ValueError(
            f"the adapters in {path} were trained on base {meta['base_fingerprint']}, not on "
            f"this base ({base_fingerprint}); load the base model they were trained on"
        )
    lora_config = LoraConfig(**meta["lora_config"])
    trainable = {}
    for key, value in load_file(str(path / ADAPTERS_FILE)).items():
        name, part = key.split(".")
        trainable.setdefault(name, {})[part] = jnp.asarray(value)
    if set(trainable) != set(lora_config.targets):
        raise ValueError(
            f"{path / ADAPTERS_FILE} holds adapters for {sorted(trainable)}, but its "
            f"config names {lora_config.targets}"
        )
    return trainable, lora_config
