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

Variants, all chosen in :class:`LoraConfig`:

* **DoRA** (``variant="dora"``; Liu et al. 2024, arXiv:2402.09353) splits the adapted weight into
  a magnitude and a direction, ``W' = m · V / ||V||_c`` with ``V = W + (α/r) A B`` and ``||·||_c``
  the norm over the input dims of each output unit.  ``m [L, out...]`` is trained beside ``A``
  and ``B`` and starts at ``||W||_c``, so that with ``B = 0`` ``W' = W``.  The block computes
  ``(x W + x A B) · m / ||V||_c`` with the norm outside the gradient (the paper's §4.3, as PEFT
  does): gradients reach ``A``, ``B`` and ``m`` through the rescaled output only.
* **LoRA+** (``lora_plus_ratio``; Hayou et al. 2024, arXiv:2402.12354): ``B`` learns
  ``lora_plus_ratio`` times faster than ``A`` (:func:`lora_plus`; ``training.make_update``
  applies it through :meth:`LoRA.scale_updates`).
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
import optax
from safetensors.numpy import load_file, save_file

from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.quantization import FORMATS, is_quantized, quantize_params
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
VARIANTS = ("lora", "dora")
ADAPTERS_FILE = "adapters.safetensors"
CONFIG_FILE = "adapter_config.json"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Adapter rank ``r``, scale numerator ``α`` (the path is scaled by α/r), dropout rate on the
    adapters' input, and the projections adapted (any of q, k, v, o, gate, up, down).

    ``variant``: ``"lora"`` or ``"dora"`` (a trainable magnitude per output unit, see the module
    docstring); ``lora_plus_ratio``: LoRA+'s learning-rate ratio of ``B`` to ``A`` (1: plain LoRA);
    ``base_quantization``: None, or the format the frozen base is held in (``"nf4"``: QLoRA).
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = tuple(PROJECTIONS)
    variant: str = "lora"
    lora_plus_ratio: float = 1.0
    base_quantization: str | None = None

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"LoraConfig.variant={self.variant!r}; expected one of {VARIANTS}")
        if not self.lora_plus_ratio > 0:
            raise ValueError(
                f"LoraConfig.lora_plus_ratio must be positive, got {self.lora_plus_ratio!r}"
            )
        if self.base_quantization not in (None, *FORMATS):
            raise ValueError(
                f"LoraConfig.base_quantization={self.base_quantization!r}; expected None or one "
                f"of {FORMATS}"
            )
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
    """``W``'s ``[L, in..., out...]`` dims (shape or logical axes) -> those of ``(A, B, m)``."""
    n_in = 1 + PROJECTIONS[name][1]
    return dims[:n_in] + (rank,), dims[:1] + (rank,) + dims[n_in:], dims[:1] + dims[n_in:]


def _parts(lora_config: LoraConfig) -> tuple[str, ...]:
    """The arrays of one adapter: ``A`` and ``B``, and DoRA's magnitude ``m``."""
    return ("a", "b", "m") if lora_config.variant == "dora" else ("a", "b")


def _column_norm(v, name):
    """``||v||_c``: the float32 norm of ``v [L, in..., out...]`` over its input dims, ``[L, out...]``."""
    in_dims = tuple(range(1, 1 + PROJECTIONS[name][1]))
    return jnp.sqrt(jnp.sum(jnp.square(v.astype(jnp.float32)), axis=in_dims))


def lora_axes(config: TransformerConfig, lora_config: LoraConfig) -> dict:
    """Logical axes of the trainable adapters (``{name: {"a": axes, "b": axes[, "m": axes]}}``),
    for sharding: ``A`` is laid out like ``W``'s input dims, ``B`` and ``m`` like its output dims,
    the rank kept whole."""
    axes = param_axes(config)
    return {
        name: dict(zip(_parts(lora_config), _split(_weight(axes, name), name, "lora_rank")))
        for name in lora_config.targets
    }


def lora_plus(ratio: float) -> optax.GradientTransformation:
    """LoRA+ (Hayou et al. 2024, arXiv:2402.12354): ``η_B = ratio · η_A``.  Chained after an
    optimiser, it multiplies the updates of every ``B`` (a leaf named ``"b"``) by ``ratio`` and
    leaves ``A`` (and DoRA's ``m``) alone; stateless."""
    return optax.masked(
        optax.scale(ratio),
        lambda tree: jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == "b", tree),
    )


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LoRA:
    """The LoRA `Finetune` (see ``agentic_jax.post_training.common``): the trainable tree holds only
    the adapters ``{name: {"a", "b"}}`` (and ``"m"`` under DoRA); the base parameters stay frozen
    beside it."""

    config: LoraConfig | None = None

    def __post_init__(self):
        if self.config is None:  # built at call time, so gin bindings of LoraConfig apply
            object.__setattr__(self, "config", LoraConfig())
        if not isinstance(self.config, LoraConfig):
            raise TypeError(f"LoRA.config must be a LoraConfig, got {type(self.config).__name__}")

    def init(self, params, key):
        """Fresh adapters for ``params``: ``A ~ U(±1/√in)``, ``B = 0``, DoRA's ``m = ||W||_c``
        (of the weight the forward uses: the quantised one under QLoRA), in the weights' dtype
        (float32 for weights given already quantised)."""
        keys = jax.random.split(key, len(self.config.targets))
        frozen = self.frozen(params) if self.config.variant == "dora" else params
        adapters = {}
        for name, k in zip(self.config.targets, keys):
            w = _weight(params, name)
            dtype = jnp.float32 if is_quantized(w) else w.dtype
            a_shape, b_shape, _ = _split(w.shape, name, self.config.rank)
            bound = 1.0 / math.sqrt(math.prod(a_shape[1:-1]))
            adapters[name] = {
                "a": jax.random.uniform(k, a_shape, jnp.float32, -bound, bound).astype(dtype),
                "b": jnp.zeros(b_shape, dtype),
            }
            if self.config.variant == "dora":
                adapters[name]["m"] = _column_norm(_weight(frozen, name), name).astype(dtype)
        return adapters

    def frozen(self, base):
        """The frozen tree the trainers keep beside the adapters (``make_update``'s ``base``):
        ``base`` itself, or under QLoRA (``base_quantization``) ``base`` with its projection
        weights quantised by ``quantization.quantize_params`` (NF4: blocks of 64, double-quantised
        absmax), which the forward dequantises layer by layer."""
        if self.config.base_quantization is None:
            return base
        # quantize_params reads its config only for lm_head=True (a tied head cannot be quantised).
        return quantize_params(base, None, self.config.base_quantization, lm_head=False)

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
        parts = _parts(self.config)
        for name, adapter in trainable.items():
            expected = _split(_weight(base, name).shape, name, self.config.rank)[: len(parts)]
            got = tuple(adapter[p].shape if p in adapter else None for p in parts)
            if got != expected or len(adapter) != len(parts):
                raise ValueError(
                    f"adapter {name!r} has shapes {got} for {sorted(adapter)}; variant "
                    f"{self.config.variant!r}, this base and rank {self.config.rank} need "
                    f"{expected} for {list(parts)}"
                )

    def _check_quantized(self, base):
        if self.config.base_quantization and not any(
            is_quantized(w) for w in jax.tree.leaves(base["layers"], is_leaf=is_quantized)
        ):
            raise ValueError(
                f"LoraConfig.base_quantization={self.config.base_quantization!r}, but the base is "
                "not quantised: pass LoRA.frozen(base), the base the adapters are trained on"
            )

    def model_params(self, trainable, base, key=None):
        """``base`` with the adapters attached (α/r folded into B); ``key`` turns dropout on."""
        self._check(trainable, base)
        self._check_quantized(base)
        targets, layers = self.config.targets, dict(base["layers"])
        layers["lora"] = {}
        for name in targets:
            b = trainable[name]["b"]
            layers["lora"][name] = {
                **trainable[name],
                "b": b * jnp.asarray(self.config.scale, b.dtype),
            }
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

    def _replace(self, params, trainable, new_weight):
        """``params`` with each target's weight ``W`` replaced by ``new_weight(W, adapter, name)``
        (computed in float32, stored back in ``W``'s dtype)."""
        layers = dict(params["layers"])
        for name, adapter in trainable.items():
            group, _ = PROJECTIONS[name]
            w = layers[group][name]
            layers[group] = {**layers[group], name: new_weight(w, adapter, name).astype(w.dtype)}
        return {**params, "layers": layers}

    def _merged_weight(self, w, adapter, name):
        """``V = W + (α/r) A B``; under DoRA ``m · V / ||V||_c``."""
        v = w.astype(jnp.float32) + self._delta(adapter, w.shape)
        if "m" not in adapter:
            return v
        scale = adapter["m"].astype(jnp.float32) / _column_norm(v, name)
        return v * jnp.expand_dims(scale, tuple(range(1, 1 + PROJECTIONS[name][1])))

    def merged(self, trainable, base):
        """Plain model parameters with the adapters folded in: ``W + (α/r) A B`` per target
        (DoRA: ``m (W + (α/r) A B) / ||W + (α/r) A B||_c``).  A quantised base (QLoRA) is
        dequantised first, to the embedding's dtype: the merged model is a float model."""
        self._check(trainable, base)
        self._check_quantized(base)
        dtype = base["embed"].dtype
        base = jax.tree.map(
            lambda w: w.dequantize(dtype) if is_quantized(w) else w, base, is_leaf=is_quantized
        )
        return self._replace(base, trainable, self._merged_weight)

    def unmerge(self, merged, trainable):
        """The base back from :meth:`merged` parameters: ``W - (α/r) A B`` (exact up to rounding).
        DoRA's merge has no inverse (``m V / ||V||_c`` is the same for every positive rescaling of
        a column of ``V``): keep the base instead."""
        self._check(trainable, merged)
        if self.config.variant == "dora":
            raise ValueError(
                "LoRA.unmerge: a DoRA merge cannot be undone (the merged weight fixes each "
                "column of W + (α/r) A B only up to its norm); keep the base parameters"
            )
        return self._replace(merged, trainable, lambda w, ad, _: w - self._delta(ad, w.shape))

    def scale_updates(self, updates):
        """The optimiser's ``updates`` with :func:`lora_plus`'s ratio applied to every ``B``."""
        if self.config.lora_plus_ratio == 1.0:
            return updates
        transform = lora_plus(self.config.lora_plus_ratio)
        return transform.update(updates, transform.init(updates))[0]


def save_adapters(path, trainable, lora_config: LoraConfig, base_fingerprint: str) -> Path:
    """Writes ``path/adapters.safetensors`` then ``path/adapter_config.json`` (the LoraConfig and
    the base model's fingerprint; written last, so its presence marks a complete save).  Call it
    from one process, with adapters every process can read whole (replicated or gathered)."""
    path = Path(path)
    if (path / CONFIG_FILE).exists():
        raise FileExistsError(f"{path / CONFIG_FILE} exists; adapters are never overwritten")
    _check_names(trainable, lora_config, "the adapters")
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            f"{name}.{p}": np.asarray(jax.device_get(ad[p]))
            for name, ad in trainable.items()
            for p in ad
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
                f"{required} not found; is {path} a directory written by save_adapters? (PEFT's "
                "adapter_model.safetensors loads with peft_adapters.load_peft_adapters)"
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
    _check_names(trainable, lora_config, str(path / ADAPTERS_FILE))
    return trainable, lora_config


def _check_names(trainable, lora_config: LoraConfig, what: str):
    """Fails unless ``trainable`` holds exactly the config's targets, each with its parts."""
    parts = _parts(lora_config)
    held = {name: sorted(adapter) for name, adapter in trainable.items()}
    if set(held) != set(lora_config.targets) or any(p != sorted(parts) for p in held.values()):
        raise ValueError(
            f"{what} hold {held}, but LoraConfig.targets={lora_config.targets} with "
            f"variant={lora_config.variant!r} needs {parts} for each target"
        )
