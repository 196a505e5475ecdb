"""Rule resolution: properties over random tables and the documented special cases."""

import re

import gin
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from sharding import (
    DEFAULT_RULES,
    MESH_AXES,
    AxisRules,
    ShardingError,
    axis_rules,
    current_rules,
    logical_to_spec,
    use_rules,
)

NAMES = ("a", "b", "c", "d")
targets = st.one_of(
    st.none(),
    st.sampled_from(MESH_AXES),
    st.lists(st.sampled_from(MESH_AXES), min_size=1, max_size=3, unique=True).map(tuple),
)
tables = st.lists(st.tuples(st.sampled_from(NAMES), targets), min_size=1, max_size=10)
meshes = st.fixed_dictionaries({name: st.sampled_from([1, 2, 4]) for name in MESH_AXES})
arrays = st.lists(st.one_of(st.none(), st.sampled_from(NAMES)), min_size=1, max_size=4).map(tuple)


def _dims(spec):
    return [() if d is None else (d,) if isinstance(d, str) else tuple(d) for d in spec]


def _expected(rules, sizes, logical):
    """Oracle stated from the rule semantics: dims in order, first rule whose live axes are free."""
    used, dims = set(), []
    for name in logical:
        if name is None:
            dims.append(())
            continue
        live = [tuple(a for a in c if sizes[a] > 1) for c in rules.candidates(name)]
        free = [c for c in live if used.isdisjoint(c)]
        if not free:
            return None
        dims.append(free[0])
        used.update(free[0])
    return dims


@given(tables, meshes, arrays)
def test_resolution_properties(table, sizes, logical):
    rules = AxisRules(table)
    expected = _expected(rules, sizes, logical)
    if expected is None:
        with pytest.raises(ShardingError, match=re.escape(str(logical))):
            rules.resolve(logical, sizes)
        return
    dims = _dims(rules.resolve(logical, sizes))
    flat = [a for d in dims for a in d]
    assert len(flat) == len(set(flat)), "a mesh axis used twice in one spec"
    assert all(sizes[a] > 1 for a in flat), "size-1 axes must be dropped"
    assert dims == expected, "the first free rule in table order must win"


@given(meshes)
def test_size_one_axes_never_conflict(sizes):
    rules = AxisRules([("a", "tensor"), ("b", "tensor")])
    if sizes["tensor"] == 1:
        assert rules.resolve(("a", "b"), sizes) == P(None, None)
    else:
        with pytest.raises(ShardingError, match=r"\('a', 'b'\)"):
            rules.resolve(("a", "b"), sizes)


def test_fallback_rule_used_when_first_is_taken():
    rules = AxisRules([("x", "fsdp"), ("embed", "fsdp"), ("embed", "tensor")])
    sizes = {"fsdp": 2, "tensor": 4}
    assert rules.resolve(("embed",), sizes) == P("fsdp")
    assert rules.resolve(("x", "embed"), sizes) == P("fsdp", "tensor")


def test_conflict_and_unknown_name_raise_with_axes():
    with pytest.raises(ShardingError, match=r"'mlp'.*\('mlp', 'mlp'\)"):
        DEFAULT_RULES.resolve(("mlp", "mlp"), {"tensor": 2})
    with pytest.raises(ShardingError, match=r"no rule for logical axis 'mpl'"):
        DEFAULT_RULES.resolve(("embed", "mpl"), {"tensor": 2})


def test_divisibility_error_names_path_and_sizes():
    with pytest.raises(
        ShardingError, match=r"params/w: dimension 1 \('mlp'\).*size 6.*total size 4"
    ):
        logical_to_spec(
            ("embed", "mlp"), DEFAULT_RULES, {"fsdp": 2, "tensor": 4}, shape=(8, 6), path="params/w"
        )


def test_default_rules_megatron_layout():
    sizes = {"data": 2, "fsdp": 2, "tensor": 2}
    assert DEFAULT_RULES.resolve(("layers", "embed", "q_heads", "head_dim"), sizes) == P(
        None, "fsdp", "tensor", None
    )
    assert DEFAULT_RULES.resolve(("layers", "q_heads", "head_dim", "embed"), sizes) == P(
        None, "tensor", None, "fsdp"
    )
    assert DEFAULT_RULES.resolve(("layers", "mlp", "embed"), sizes) == P(None, "tensor", "fsdp")
    assert DEFAULT_RULES.resolve(
        ("activation_batch", "activation_length", "activation_embed"), sizes
    ) == P(("data", "fsdp"), None, None)


def test_use_rules_nests_and_gin_configures_default():
    assert current_rules() == DEFAULT_RULES
    with use_rules([("embed", "tensor")]):
        with use_rules({"embed": None}):
            assert logical_to_spec(("embed",), mesh={"tensor": 2}) == P(None)
        assert logical_to_spec(("embed",), mesh={"tensor": 2}) == P("tensor")
    gin.parse_config(
        'sharding.axis_rules.overrides = [("embed", None), ("mlp", ("fsdp", "tensor"))]'
    )
    try:
        assert logical_to_spec(("embed", "mlp"), mesh={"fsdp": 2, "tensor": 2}) == P(
            None, ("fsdp", "tensor")
        )
        assert axis_rules().candidates("embed") == [(), ("fsdp",)]
    finally:
        gin.clear_config()
    assert current_rules() == DEFAULT_RULES
