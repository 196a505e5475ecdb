"""Logical-axis rules: the one place where model axis names meet mesh axes.

Model code names array dimensions by role ("embed", "mlp", "activation_batch", ...) and never by
mesh axis, so one model runs unchanged on any layout; a rule table maps roles to mesh axes.  The
table is ordered and a logical name may appear several times: each dimension takes the first of
its rules whose mesh axes are still free in that array, so later rules act as fallbacks (e.g.
``("embed", "fsdp")`` then ``("embed", None)``).  Mesh axes of size 1 are dropped before matching,
so they never cause conflicts and never show up in a ``PartitionSpec``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Mapping, Sequence

import gin
import jax
from jax.sharding import PartitionSpec

from sharding.mesh import axis_sizes


class ShardingError(ValueError):
    """A logical layout that cannot be realised on the mesh (conflict, unknown name, divisibility)."""


def _as_axes(target) -> tuple[str, ...]:
    if target is None:
        return ()
    if isinstance(target, str):
        return (target,)
    axes = tuple(target)
    if not all(isinstance(a, str) for a in axes) or len(set(axes)) != len(axes):
        raise ShardingError(
            f"a rule target must be None, a mesh axis or distinct mesh axes; got {target!r}"
        )
    return axes


@dataclasses.dataclass(frozen=True)
class AxisRules:
    """Ordered ``(logical name, mesh axes)`` pairs; mesh axes are stored as a (possibly empty) tuple.

    Construct from a mapping or a sequence of pairs whose targets are None, a mesh axis name or
    a tuple of names.  Hashable, so it can be a static argument.
    """

    rules: tuple[tuple[str, tuple[str, ...]], ...]

    def __init__(self, rules):
        if isinstance(rules, AxisRules):
            pairs = rules.rules
        else:
            pairs = rules.items() if isinstance(rules, Mapping) else rules
        object.__setattr__(
            self, "rules", tuple((str(name), _as_axes(target)) for name, target in pairs)
        )

    def __add__(self, other) -> AxisRules:
        """``overrides + base``: rules of the left operand are tried first."""
        return AxisRules(self.rules + AxisRules(other).rules)

    def candidates(self, name: str) -> list[tuple[str, ...]]:
        return [axes for rule_name, axes in self.rules if rule_name == name]

    def resolve(
        self, logical_axes: Sequence[str | None], mesh=None, *, shape=None, path: str | None = None
    ) -> PartitionSpec:
        """The ``PartitionSpec`` for one array; see :func:`logical_to_spec`."""
        logical_axes = tuple(logical_axes)
        where = f"{path}: " if path else ""
        sizes = None if mesh is None else axis_sizes(mesh)
        used: set[str] = set()
        spec = []
        for name in logical_axes:
            if name is None:
                spec.append(())
                continue
            candidates = self.candidates(name)
            if not candidates:
                raise ShardingError(f"{where}no rule for logical axis {name!r} of {logical_axes}")
            for axes in candidates:
                axes = tuple(a for a in axes if sizes is None or sizes.get(a, 1) > 1)
                if used.isdisjoint(axes):
                    break
            else:
                raise ShardingError(
                    f"{where}logical axis {name!r} of {logical_axes} has no rule whose mesh axes are "
                    f"free: candidates {candidates}, already used by other dimensions {sorted(used)}"
                )
            used.update(axes)
            spec.append(axes)
        if shape is not None:
            _check_divisible(logical_axes, spec, tuple(shape), sizes or {}, where)
        return PartitionSpec(*(None if not a else a[0] if len(a) == 1 else a for a in spec))


def _check_divisible(logical_axes, spec, shape, sizes, where):
    if len(shape) != len(logical_axes):
        raise ShardingError(
            f"{where}shape {shape} has rank {len(shape)} but logical axes "
            f"{logical_axes} have {len(logical_axes)}"
        )
    for dim, (name, axes, size) in enumerate(zip(logical_axes, spec, shape)):
        parts = math.prod(sizes.get(a, 1) for a in axes)
        if size % parts:
            raise ShardingError(
                f"{where}dimension {dim} ({name!r}) of shape {shape} has size {size}, not divisible by "
                f"mesh axes {axes} of total size {parts} (logical axes {logical_axes})"
            )


# Megatron layout: column-parallel in-projections (q/k/v, gate/up shard their output on "tensor"),
# row-parallel out-projections (o, down shard their input on "tensor"), so each attention / MLP
# sub-layer needs one reduction in the forward pass.  "embed" on "fsdp" is ZeRO-3 style parameter
# sharding; activations keep "embed" whole and split batch over data x fsdp.
DEFAULT_TABLE = (
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("vocab", "tensor"),
    ("head_dim", None),
    ("layers", "stage"),  # a pipeline stage holds its own layers (sharding.pipeline)
    ("norm", None),
    ("lora_rank", None),  # LoRA adapters' rank r: small, kept whole
    # Multi-head latent attention's query and key-value latents (and the cached latent): small
    # next to the heads they expand into, kept whole.
    ("q_lora", None),
    ("kv_lora", None),
    ("retrieval_embed", None),  # a retrieval encoder's projected embedding: small, kept whole
    ("expert", "expert"),  # a mixture of experts' expert dimension: expert parallelism
    # Outside the experts, the expert axis is one more data axis (it splits the tokens that its
    # all-to-alls exchange).
    ("activation_batch", ("data", "fsdp", "expert")),
    ("activation_length", "sequence"),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    # Decode-time KV cache [layers, batch, length, kv_heads, head_dim]: length stays whole.
    ("cache_batch", ("data", "fsdp", "expert")),
    ("cache_length", None),
    ("cache_kv_heads", "tensor"),
)

DEFAULT_RULES = AxisRules(DEFAULT_TABLE)


@gin.configurable(module="sharding")
def axis_rules(rules=DEFAULT_TABLE, overrides=()) -> AxisRules:
    """The gin-configured rule table: ``overrides`` are tried before ``rules``.

    gin: ``sharding.axis_rules.overrides = [("embed", None)]`` to replicate parameters, or
    ``sharding.axis_rules.rules = [...]`` to replace the whole table.
    """
    return AxisRules(overrides) + rules


_ACTIVE_RULES: contextvars.ContextVar[AxisRules | None] = contextvars.ContextVar(
    "rules", default=None
)


@contextlib.contextmanager
def use_rules(rules):
    """Makes ``rules`` the active table inside the block (nestable; innermost wins)."""
    token = _ACTIVE_RULES.set(AxisRules(rules))
    try:
        yield _ACTIVE_RULES.get()
    finally:
        _ACTIVE_RULES.reset(token)


def current_rules() -> AxisRules:
    """The innermost ``use_rules`` table, else the gin-configured :func:`axis_rules`."""
    active = _ACTIVE_RULES.get()
    return axis_rules() if active is None else active


def logical_to_spec(
    logical_axes: Sequence[str | None],
    rules: AxisRules | None = None,
    mesh=None,
    *,
    shape=None,
    path: str | None = None,
) -> PartitionSpec:
    """Maps one array's logical axes to a ``PartitionSpec``.

    Each dimension takes the first of its rules whose (non-trivial) mesh axes no earlier dimension
    of the array uses; a ``None`` name stays replicated.  ``mesh`` (Mesh, AbstractMesh, MeshSpec or
    ``{axis: size}``) lets size-1 axes be dropped; with ``shape`` every dimension must divide its
    mesh axes.  Unknown names, unresolvable conflicts and indivisible dimensions raise
    ``ShardingError`` naming ``path`` and the logical axes.  ``rules`` and ``mesh`` default to the
    active ones (``use_rules`` / ``jax.set_mesh``).
    """
    if rules is None:
        rules = current_rules()
    if mesh is None and not jax.sharding.get_abstract_mesh().empty:
        mesh = jax.sharding.get_abstract_mesh()
    return AxisRules(rules).resolve(logical_axes, mesh, shape=shape, path=path)
