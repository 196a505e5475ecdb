"""The sharded train step on every mesh layout equals the single-device step; FSDP's collectives;
checkpoints restored straight into another mesh's layout.

One tiny model, one batch and one single-device reference step (module fixture) are shared by
every test; each mesh's step is compiled once and reused (the FSDP one also for its HLO).
"""

import re

import grain
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from tiny_models import packed_batch

from agentic_jax.models import TransformerConfig, init_params, param_axes, param_shapes
from agentic_jax.training import (
    Checkpointer,
    TrainState,
    make_optimizer,
    make_schedule,
    make_train_step,
)
from agentic_jax.training.distributed import (
    abstract_with_shardings,
    batch_sharding,
    jit_train_step,
    state_shardings,
)
from sharding import DEFAULT_RULES, activate, make_mesh

# Heads and d_ff divide tensor=4, d_model divides fsdp=8, the batch data x fsdp=8, T sequence=4.
# Every field that shapes the step is given, so gin bindings left by other tests cannot leak in.
CFG = TransformerConfig(
    vocab_size=256,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=4,
    head_dim=8,
    d_ff=64,
    max_seq_len=16,
    tie_embeddings=False,
    scan_layers=True,
    remat_policy="none",
    attention_impl="xla",
    dtype="float32",
    param_dtype="float32",
)
B, T = 8, 16
SCHEDULE = make_schedule(1e-3, 10, kind="constant", warmup_steps=0)
# Adam divides by |g| + eps, so with the usual eps=1e-8 a gradient element that nearly cancels
# (|g| ~ 1e-8) turns summation-order rounding (sharded sums add in another order) into update
# differences of a few 1e-6.  eps=1e-5 keeps that amplification below the tolerance, which then
# still catches any real error (a wrong shard or reduction moves an update by ~lr=1e-3).
OPTIMIZER = make_optimizer(SCHEDULE, b1=0.9, b2=0.95, eps=1e-5, weight_decay=0.1, clip_norm=1.0)
STEP = make_train_step(CFG, OPTIMIZER, SCHEDULE)
# LLVM's optimisation of these small programs is most of their compile time.  It runs after the
# HLO passes (so partitioning and collectives are as usual) and both sides of every comparison
# are compiled alike.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
MESHES = {
    "data8": {"data": 8},
    "fsdp8": {"fsdp": 8},
    "data2_fsdp4": {"data": 2, "fsdp": 4},
    "fsdp2_tensor4": {"fsdp": 2, "tensor": 4},
    "data2_fsdp2_tensor2": {"data": 2, "fsdp": 2, "tensor": 2},
    "sequence4_tensor2": {"sequence": 4, "tensor": 2},
}


def create(key):
    return TrainState.create(init_params(CFG, key), OPTIMIZER, 0)


ABSTRACT = jax.eval_shape(create, jax.random.key(0))


@pytest.fixture(scope="module")
def reference():
    """(initial state, batch, state after one step, metrics) on one device, as numpy."""
    initial = jax.device_get(jax.jit(create)(jax.random.key(0)))
    batch = packed_batch(np.random.default_rng(0), B, T, CFG.vocab_size)
    new_state, metrics = jax.jit(STEP).lower(initial, batch).compile(FAST_COMPILE)(initial, batch)
    return initial, batch, jax.device_get(new_state), jax.device_get(metrics)


@pytest.fixture(scope="module")
def sharded(reference):
    """``run(mesh name)``: the reference step on that mesh, compiled and run once per module."""
    initial, batch, _, _ = reference
    runs = {}

    def run(name):
        if name not in runs:
            mesh = make_mesh(MESHES[name])
            with activate(mesh, DEFAULT_RULES):
                shardings = state_shardings(ABSTRACT, CFG, OPTIMIZER, mesh, DEFAULT_RULES)
                layout = batch_sharding(mesh, DEFAULT_RULES)
                state = jax.device_put(initial, shardings)
                global_batch = jax.device_put(batch, layout)
                compiled = (
                    jit_train_step(STEP, shardings, layout)
                    .lower(state, global_batch)
                    .compile(FAST_COMPILE)
                )
                new_state, metrics = compiled(state, global_batch)
            runs[name] = dict(
                mesh=mesh,
                shardings=shardings,
                donated=state,
                new_state=new_state,
                metrics=metrics,
                hlo=compiled.as_text(),
            )
        return runs[name]

    return run


def assert_trees_close(actual, expected, **tol):
    jax.tree.map(
        lambda a, e: np.testing.assert_allclose(np.asarray(a), np.asarray(e), **tol),
        actual,
        expected,
    )


@pytest.mark.parametrize("name", MESHES)
def test_sharded_step_equals_single_device_step(name, reference, sharded):
    _, _, expected_state, expected_metrics = reference
    run = sharded(name)
    assert_trees_close(run["metrics"], expected_metrics, rtol=2e-5, atol=1e-6)
    assert_trees_close(run["new_state"], expected_state, rtol=2e-5, atol=1e-6)
    # The new state comes back in the layout the rules give it, and the old one was donated.
    assert jax.tree.map(lambda x: x.sharding, run["new_state"]) == run["shardings"]
    assert all(x.is_deleted() for x in jax.tree.leaves(run["donated"]))


def test_sharded_layouts_follow_the_rules(sharded):
    """Spot checks that the meshes really split what they claim (not a replicated no-op)."""
    fsdp, tp = sharded("fsdp8")["new_state"], sharded("fsdp2_tensor4")["new_state"]
    gate_mu = fsdp.opt_state[1][0].mu["layers"]["mlp"]["gate"]  # (clip, (adam, ...))
    assert gate_mu.sharding.spec == P(None, "fsdp", None)
    assert gate_mu.addressable_shards[0].data.shape == (CFG.n_layers, CFG.d_model // 8, CFG.d_ff)
    assert tp.params["layers"]["attn"]["q"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert tp.params["layers"]["attn"]["o"].sharding.spec == P(None, "tensor", None, "fsdp")
    assert tp.params["embed"].addressable_shards[0].data.shape == (
        CFG.vocab_size // 4,
        CFG.d_model // 2,
    )


COLLECTIVE = re.compile(r"= (.*?) (all-gather|all-reduce|reduce-scatter)(?:-start)?\(")
HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(")


def collectives_by_computation(hlo: str) -> dict[str, list[tuple[str, list[tuple[int, ...]]]]]:
    """``{computation: [(op, result shapes)]}`` from compiled HLO text."""
    found, computation = {}, None
    for line in hlo.splitlines():
        if (header := HEADER.match(line)) and line.endswith("{"):
            computation = header.group(1)
        elif match := COLLECTIVE.search(line):
            shapes = [
                tuple(int(d) for d in dims.split(",") if d)
                for dims in re.findall(r"\b[a-z]+\d*\[([\d,]*)\]", match.group(1))
            ]
            found.setdefault(computation, []).append((match.group(2), shapes))
    return found


def test_fsdp_step_gathers_each_layer_and_reduces_gradients_to_shards(sharded):
    hlo = sharded("fsdp8")["hlo"]
    by_computation = collectives_by_computation(hlo)
    loop_bodies = set(re.findall(r"body=%?([\w.\-]+)", hlo))
    shapes, axes = param_shapes(CFG)["layers"], param_axes(CFG)["layers"]
    sharded_weights = [
        s.shape
        for s, a in zip(
            jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
        )
        if "embed" in a
    ]
    per_layer = {shape[1:] for shape in sharded_weights}
    assert len(sharded_weights) == 7 and len(per_layer) == 4  # q k v o gate up down

    def shapes_of(body, op):
        return {s for o, result in by_computation.get(body, []) if o == op for s in result}

    # Parameters are gathered one layer at a time inside the scanned layer loop, forward and again
    # in the backward loop (ZeRO-3 re-gathers rather than keeping gathered weights alive) ...
    gathering_loops = [body for body in loop_bodies if per_layer <= shapes_of(body, "all-gather")]
    assert len(gathering_loops) == 2, by_computation
    # ... and no device ever holds a whole stacked weight, gathered or as a gradient.
    for shape in sharded_weights:
        assert f"[{','.join(map(str, shape))}]" not in hlo, shape
    # Gradients: XLA's SPMD partitioner emits a gradient that must end up sharded as all-reduce +
    # dynamic-slice, which GPU and TPU pipelines rewrite into a reduce-scatter.  The CPU pipeline
    # has no such rewrite, so here each layer's gradients are all-reduced (one combined op in the
    # backward loop) and only this device's slice is kept: the stacked gradients are sharded,
    # as the check above shows.  On CPU, that all-reduce is the reduce-scatter.
    assert any(
        per_layer <= shapes_of(body, "all-reduce") | shapes_of(body, "reduce-scatter")
        for body in loop_bodies
    ), by_computation


def test_checkpoint_from_fsdp_mesh_restores_onto_data_tensor_mesh(sharded, tmp_path):
    saved = sharded("fsdp8")["new_state"]
    data = iter(grain.MapDataset.range(10).to_iter_dataset())
    for _ in range(7):
        next(data)
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, saved, data)
    next(data)  # the checkpoint keeps the position at save time
    ckpt.wait()
    ckpt.close()

    mesh = make_mesh({"data": 2, "tensor": 4})
    target_shardings = state_shardings(ABSTRACT, CFG, OPTIMIZER, mesh, DEFAULT_RULES)
    restorer = Checkpointer(str(tmp_path / "ckpt"))
    fresh = iter(grain.MapDataset.range(10).to_iter_dataset())
    restored = restorer.restore(1, abstract_with_shardings(ABSTRACT, target_shardings), fresh)
    restorer.close()

    assert next(fresh) == 7
    assert jax.tree.map(lambda x: x.sharding, restored) == target_shardings
    gate = restored.params["layers"]["mlp"]["gate"]
    assert gate.sharding.spec == P(None, None, "tensor")  # saved as (None, "fsdp") on 8 devices
    assert gate.addressable_shards[0].data.shape == (CFG.n_layers, CFG.d_model, CFG.d_ff // 4)
    assert_trees_close(restored, jax.device_get(saved), rtol=0, atol=0)
