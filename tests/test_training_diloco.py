"""DiLoCo: its identity with data parallelism, its bandwidth, compression and error feedback."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step
from agentic_jax.training.diloco import (
    DiLoCo,
    bytes_per_outer_step,
    data_parallel_bytes_per_step,
    replica_axis,
)
from sharding import DEFAULT_RULES, activate, make_mesh

CFG = TransformerConfig(
    vocab_size=61, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24
)
SCHED = make_schedule(1e-2, 100, kind="constant", warmup_steps=0)


def _batch(seed, rows=4, t=8):
    tok = jax.random.randint(jax.random.key(seed), (rows, t + 1), 0, CFG.vocab_size)
    return {
        "tokens": tok[:, :-1],
        "targets": tok[:, 1:],
        "segment_ids": jnp.ones((rows, t), jnp.int32),
        "positions": jnp.broadcast_to(jnp.arange(t), (rows, t)),
        "loss_mask": jnp.ones((rows, t), jnp.int32),  # equal counts: the mean of means is the mean
    }


def _run(diloco, inner, steps, params, seed=0):
    step = jax.jit(diloco.wrap_step(make_train_step(CFG, inner, SCHED), params))
    state = diloco.create(params, inner, seed=0)
    metrics = []
    for i in range(steps):
        state, m = step(state, _batch(seed + i))
        metrics.append(jax.device_get(m))
    return state, metrics


def test_one_inner_step_and_unit_outer_sgd_is_synchronous_data_parallelism():
    params = init_params(CFG, jax.random.key(0))
    inner = optax.sgd(0.5)
    diloco = DiLoCo(replicas=2, inner_steps=1, outer_lr=1.0, outer_momentum=0.0)
    state, _ = _run(diloco, inner, 5, params)
    sync = jax.jit(make_train_step(CFG, inner, SCHED))
    reference = TrainState.create(params, inner, seed=0)
    for i in range(5):
        reference, _ = sync(reference, _batch(i))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(reference.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Every replica restarts from the global parameters.
    for g, r in zip(jax.tree.leaves(state.params), jax.tree.leaves(state.replicas.params)):
        np.testing.assert_array_equal(np.broadcast_to(g, r.shape), r)


def test_communication_drops_by_the_number_of_inner_steps():
    params = init_params(CFG, jax.random.key(0))
    inner = optax.sgd(0.1)
    totals = {}
    for h in (1, 4):
        _, metrics = _run(DiLoCo(replicas=2, inner_steps=h), inner, 8, params)
        totals[h] = metrics[-1]["comm_bytes_total"]
        sent = [m["comm_bytes"] > 0 for m in metrics]
        assert sent == [(i + 1) % h == 0 for i in range(8)]
    assert totals[1] == 8 * data_parallel_bytes_per_step(2, params)
    assert totals[1] / totals[4] == 4


def test_compression_reduces_bytes_by_its_stated_factor():
    params = init_params(CFG, jax.random.key(0))
    dense = bytes_per_outer_step(DiLoCo(replicas=2), params)
    n_values = sum(x.size for x in jax.tree.leaves(params))
    n_tensors = len(jax.tree.leaves(params))
    int8 = bytes_per_outer_step(DiLoCo(replicas=2, compression="int8"), params)
    assert int8 == 2 * (n_values + 4 * n_tensors)  # a byte a value, a float32 scale a tensor
    assert 3.9 < dense / int8 <= 4
    topk = bytes_per_outer_step(DiLoCo(replicas=2, compression="topk", topk_fraction=0.05), params)
    # 1 / (2 * 0.05) = 10, less the rounding up of each tensor's count (norm scales keep 1 of 16).
    assert 9 < dense / topk <= 10


@pytest.mark.parametrize("compression", ["topk", "int8"])
def test_error_feedback_makes_the_accumulated_update_converge(compression):
    """Every outer step each replica has moved by the same ``g``; with unit outer SGD the global
    parameters move by what was sent.  With error feedback what compression dropped is sent
    later, so after T outer steps the parameters have moved by ``-T g``, up to one residual;
    without it top-k drops the same small entries every time."""
    params = {"w": jnp.zeros((64,))}
    g = jax.random.normal(jax.random.key(0), (64,))
    errors = {}
    for feedback in (True, False):
        diloco = DiLoCo(
            replicas=2,
            outer_lr=1.0,
            outer_momentum=0.0,
            compression=compression,
            topk_fraction=0.1,
            error_feedback=feedback,
        )
        state = diloco.create(params, optax.sgd(1.0), seed=0)
        outer = jax.jit(diloco.outer_step)
        steps = 200
        for _ in range(steps):
            moved = jax.tree.map(lambda p: p - g, state.replicas.params)
            state = outer(state.replace(replicas=state.replicas.replace(params=moved)))
        errors[feedback] = float(jnp.linalg.norm(state.params["w"] + steps * g))
        errors[feedback] /= float(steps * jnp.linalg.norm(g))
    assert errors[True] < 0.02
    if compression == "topk":
        assert errors[False] > 0.3


def test_a_tiny_model_trains_with_diloco():
    params = init_params(CFG, jax.random.key(3))
    inner = make_optimizer(SCHED)  # AdamW, DiLoCo's inner optimiser
    diloco = DiLoCo(replicas=2, inner_steps=3, compression="int8")
    step = jax.jit(diloco.wrap_step(make_train_step(CFG, inner, SCHED), params))
    state = diloco.create(params, inner, seed=0)
    batch = _batch(11)
    losses = []
    for _ in range(24):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.6 * losses[0]
    assert int(state.outer_steps) == 8
    with pytest.raises(ValueError, match="replicas"):
        step(state, _batch(0, rows=3))


def test_replicas_under_shard_map_over_four_devices_equal_the_one_device_run():
    """Four replicas on a ``data`` axis of 4 fake devices, one each (inner steps local, the outer
    average a ``psum``), against the same replicas side by side on one device."""
    params = init_params(CFG, jax.random.key(1))
    inner = make_optimizer(SCHED)
    diloco = DiLoCo(replicas=4, inner_steps=2, compression="int8")
    single, single_metrics = _run(diloco, inner, 4, params)
    mesh = make_mesh({"data": 4, "fsdp": -1}, devices=jax.devices()[:4])
    with activate(mesh, DEFAULT_RULES):
        assert replica_axis(4) == "data"
        step = diloco.wrap_step(make_train_step(CFG, inner, SCHED), params)
        program = str(jax.make_jaxpr(step)(diloco.create(params, inner, seed=0), _batch(0)))
        assert "shard_map" in program and "psum" in program
        sharded, sharded_metrics = _run(diloco, inner, 4, params)
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(single_metrics, sharded_metrics):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
        assert a["comm_bytes"] == b["comm_bytes"]
