"""Aggregation: exact reduction over micro-batches, 8 data-parallel shards and packed rows."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from agentic_jax.rl import AGGREGATIONS, LossOutput, aggregate, combine_outputs, segment_mean

B, T = 16, 5
per_token_strategy = hnp.arrays(np.float32, (B, T), elements=st.floats(-10.0, 10.0, width=32))
mask_strategy = hnp.arrays(np.bool_, (B, T))


def _all_modes(per_token, mask, **kw):
    return {mode: aggregate(per_token, mask, mode, **kw) for mode in AGGREGATIONS}


ALL_MODES = {"eager": _all_modes, "jit": jax.jit(_all_modes, static_argnames=("max_length",))}


def _reference(per_token, mask, mode, max_length=T):
    """Slow float64 loop over sequences."""
    x, m = np.float64(per_token), np.float64(mask)
    sequences = [(x[b] * m[b]).sum() for b in range(len(x)) if m[b].sum() > 0]
    lengths = [m[b].sum() for b in range(len(x)) if m[b].sum() > 0]
    if mode == "token-mean":
        return (x * m).sum(), m.sum()
    if mode == "seq-mean-token-mean":
        return sum(s / n for s, n in zip(sequences, lengths, strict=True)), len(sequences)
    if mode == "seq-mean-token-sum":
        return sum(sequences), len(sequences)
    return sum(sequences) / max_length, len(sequences)


@pytest.mark.parametrize("variant", sorted(ALL_MODES))
@given(per_token=per_token_strategy, mask=mask_strategy)
def test_every_mode_matches_a_slow_reference(variant, per_token, mask):
    for mode, (total, count) in ALL_MODES[variant](per_token, mask).items():
        expected_total, expected_count = _reference(per_token, mask, mode)
        np.testing.assert_allclose(total, expected_total, rtol=1e-5, atol=1e-4, err_msg=mode)
        assert count == expected_count, mode


@given(
    per_token=per_token_strategy, mask=mask_strategy, cut=st.sampled_from([4, 8])
)  # few shapes, few compilations
def test_micro_batches_reduce_to_the_whole_batch(per_token, mask, cut):
    whole = ALL_MODES["jit"](per_token, mask)
    first, second = (
        ALL_MODES["jit"](per_token[:cut], mask[:cut]),
        ALL_MODES["jit"](per_token[cut:], mask[cut:]),
    )
    for mode in AGGREGATIONS:
        combined = combine_outputs([LossOutput(*first[mode], {}), LossOutput(*second[mode], {})])
        np.testing.assert_allclose(
            combined.value, LossOutput(*whole[mode], {}).value, rtol=1e-5, atol=1e-6, err_msg=mode
        )


def test_eight_data_parallel_shards_reduce_to_the_whole_batch():
    rng = np.random.default_rng(0)
    per_token = jnp.asarray(rng.normal(size=(B, T)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(B, T)) > 0.4).at[3].set(False)
    mesh = jax.make_mesh((8,), ("data",))
    sharded = [jax.device_put(x, NamedSharding(mesh, P("data"))) for x in (per_token, mask)]

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=P("data"), out_specs=P())
    def reduced(per_token, mask):
        return jax.tree.map(lambda x: jax.lax.psum(x, "data"), _all_modes(per_token, mask))

    whole = ALL_MODES["jit"](per_token, mask)
    for mode, (total, count) in reduced(*sharded).items():
        np.testing.assert_allclose(
            total / count, whole[mode][0] / whole[mode][1], rtol=1e-5, err_msg=mode
        )
        assert count == whole[mode][1]


@given(seed=st.integers(0, 2**16))
def test_packed_rows_match_padded_rows(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, 6)
    padded = np.zeros((6, T), np.float32)
    padded_mask = np.arange(T)[None] < lengths[:, None]
    padded[padded_mask] = rng.normal(size=lengths.sum())
    # Pack the sequences greedily into rows of 2T tokens; unused slots stay masked.
    packed, packed_mask, ids = (
        np.zeros((6, 2 * T), np.float32),
        np.zeros((6, 2 * T), bool),
        np.zeros((6, 2 * T), int),
    )
    row, position, segment = 0, 0, 0
    for b, n in enumerate(lengths):
        if position + n > 2 * T:
            row, position, segment = row + 1, 0, 0
        packed[row, position : position + n] = padded[b, :n]
        packed_mask[row, position : position + n] = True
        ids[row, position : position + n] = segment
        position, segment = position + n, segment + 1
    pack = ALL_MODES["jit"](packed, packed_mask, segment_ids=ids, max_length=T)
    pad = ALL_MODES["jit"](padded, padded_mask, max_length=T)
    for mode in AGGREGATIONS:
        np.testing.assert_allclose(pack[mode][0], pad[mode][0], rtol=1e-5, atol=1e-5, err_msg=mode)
        assert pack[mode][1] == pad[mode][1], mode


def test_segment_mean_broadcasts_each_sequence_mean():
    x = jnp.array([[1.0, 3.0, 10.0, 20.0, 99.0]])
    ids = jnp.array([[0, 0, 1, 1, 2]])
    mask = jnp.array([[1, 1, 1, 1, 0]])
    np.testing.assert_allclose(segment_mean(x, mask, ids), [[2.0, 2.0, 15.0, 15.0, 0.0]])
    np.testing.assert_allclose(segment_mean(x, mask), [[8.5] * 5])


def test_empty_masks_give_zero_without_nan():
    for mode, (total, count) in ALL_MODES["eager"](
        jnp.full((2, T), jnp.nan), jnp.zeros((2, T))
    ).items():
        assert total == 0.0 and count == 0.0 and LossOutput(total, count, {}).value == 0.0, mode
    assert LossOutput(jnp.float32(0.0), jnp.float32(0.0), {}).value == 0.0


def test_outputs_combine_metrics_by_sum_min_and_max():
    a = LossOutput(
        jnp.float32(2.0), jnp.float32(4.0), {"tokens": 4.0, "clip": 1.0, "r_min": 0.5, "r_max": 2.0}
    )
    b = LossOutput(
        jnp.float32(1.0), jnp.float32(2.0), {"tokens": 2.0, "clip": 2.0, "r_min": 0.7, "r_max": 3.0}
    )
    combined = combine_outputs([a, b])
    assert combined.value == pytest.approx(0.5)
    assert combined.metrics == {"tokens": 6.0, "clip": 3.0, "r_min": 0.5, "r_max": 3.0}
    assert combined.metric_means() == {"tokens": 6.0, "clip": 0.5, "r_min": 0.5, "r_max": 3.0}
    with pytest.raises(ValueError, match="different metric keys"):
        combine_outputs([a, LossOutput(a.total, a.count, {})])


def test_errors_name_the_argument_and_the_valid_values():
    with pytest.raises(
        ValueError, match=r"unknown aggregation mode 'mean'; valid values: token-mean, seq-mean"
    ):
        aggregate(jnp.zeros((2, T)), jnp.ones((2, T)), "mean")
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 5\), got \(2, 4\)"):
        aggregate(jnp.zeros((2, T)), jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="segment_ids must be an integer array"):
        aggregate(jnp.zeros((2, T)), jnp.ones((2, T)), segment_ids=jnp.zeros((2, T)))
    with pytest.raises(ValueError, match="per_token must be 2-D"):
        aggregate(jnp.zeros(T), jnp.ones(T))
