"""Pipeline parallelism: the schedules' tables (bubble, memory) and pipelined training equal to
unpipelined training on 4 of the fake CPU devices, for GPipe and 1F1B."""

import functools

import jax
import numpy as np
import pytest
from tiny_models import packed_batch, tiny_mla

from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step
from agentic_jax.training.distributed import batch_sharding, jit_train_step, state_shardings
from agentic_jax.training.pipeline import Pipeline
from sharding import DEFAULT_RULES, activate, bubble_fraction, make_mesh
from sharding.pipeline import BACKWARD, FORWARD, IDLE
from sharding.pipeline import make_schedule as pipeline_schedule

CFG = TransformerConfig(
    vocab_size=64,
    d_model=16,
    n_layers=4,
    n_heads=2,
    n_kv_heads=1,
    head_dim=8,
    d_ff=32,
    max_seq_len=8,
    tie_embeddings=True,
    attention_impl="xla",
    dtype="float32",
    param_dtype="float32",
)
MLA = tiny_mla(CFG)
B, T, STEPS = 8, 8, 3
SCHEDULE = make_schedule(1e-2, 10, kind="constant", warmup_steps=0)
# eps=1e-5: see tests/test_sharding_train.py (Adam would amplify summation-order rounding).
OPTIMIZER = make_optimizer(SCHEDULE, eps=1e-5, weight_decay=0.1, clip_norm=1.0)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def test_bubble_fraction_formula():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    with pytest.raises(ValueError):
        bubble_fraction(0, 4)


@pytest.mark.parametrize("stages, micro", [(2, 4), (4, 4), (4, 8), (3, 7)])
def test_schedules_run_every_pass_once_with_the_formula_bubble(stages, micro):
    gpipe, one_f_one_b = (pipeline_schedule(n, stages, micro) for n in ("gpipe", "1f1b"))
    for plan in (gpipe, one_f_one_b):
        for s in range(stages):
            for kind in (FORWARD, BACKWARD):
                done = plan.micro[:, s][plan.kind[:, s] == kind]
                assert sorted(done.tolist()) == list(range(micro))
        assert plan.ticks == 2 * (micro + stages - 1)
        assert plan.bubble == pytest.approx(bubble_fraction(stages, micro))
        assert np.all((plan.kind == IDLE) | (plan.micro >= 0))
    # 1F1B's memory advantage: at most `stages` stored micro-batches per stage, GPipe all of them.
    assert gpipe.slots == micro
    assert one_f_one_b.slots == min(stages, micro)


def train(step, state, batches):
    compiled = step.lower(state, batches[0]).compile(FAST_COMPILE)
    losses = []
    for batch in batches:
        state, metrics = compiled(state, batch)
        losses.append(metrics["loss"])
    return jax.device_get(state), np.asarray(losses), jax.device_get(metrics)


@functools.cache
def reference(config):
    """The unpipelined run: initial state, batches, final state and losses (once per model)."""
    state = jax.jit(lambda k: TrainState.create(init_params(config, k), OPTIMIZER, 0))(
        jax.random.key(0)
    )
    rng = np.random.default_rng(0)
    batches = [packed_batch(rng, B, T, config.vocab_size) for _ in range(STEPS)]
    step = jax.jit(make_train_step(config, OPTIMIZER, SCHEDULE))
    final, losses, _ = train(step, state, batches)
    return jax.device_get(state), batches, final, losses


@pytest.mark.parametrize(
    "schedule, mesh, config",
    [
        ("gpipe", {"stage": 4}, CFG),
        ("1f1b", {"stage": 4}, CFG),
        ("1f1b", {"stage": 2, "data": 2}, CFG),
        ("1f1b", {"stage": 2, "data": 2}, MLA),
    ],
    ids=["gpipe", "1f1b", "1f1b-data", "1f1b-data-mla"],
)
def test_pipelined_training_equals_unpipelined(schedule, mesh, config):
    initial, batches, want_state, want_losses = reference(config)
    pipeline = Pipeline(schedule, microbatches=4)
    mesh = make_mesh(mesh, devices=jax.devices()[:4])
    step = make_train_step(config, OPTIMIZER, SCHEDULE, pipeline=pipeline)
    with activate(mesh, DEFAULT_RULES):
        abstract = jax.eval_shape(lambda: initial)
        shardings = state_shardings(abstract, config, OPTIMIZER, mesh, DEFAULT_RULES)
        layout = batch_sharding(mesh, DEFAULT_RULES)
        state = jax.device_put(initial, shardings)
        # Each stage holds only its own layers.
        norm = state.params["layers"]["attn_norm"]
        assert norm.addressable_shards[0].data.shape[0] == config.n_layers // mesh.shape["stage"]
        got_state, got_losses, metrics = train(
            jit_train_step(step, shardings, layout), state, batches
        )
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5, atol=1e-6)
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6),
        got_state,
        want_state,
    )
    assert metrics["pipeline_bubble"] == pytest.approx(bubble_fraction(mesh.shape["stage"], 4))


@pytest.mark.parametrize(
    "config, match",
    [
        (CFG.replace(n_layers=3), "divide"),
        (CFG.replace(n_experts=2), "dense"),
        (CFG.replace(sliding_window=4, sliding_window_pattern=2), "every layer alike"),
    ],
)
def test_a_model_the_stages_cannot_share_is_refused(config, match):
    mesh = make_mesh({"stage": 2, "data": -1})
    with activate(mesh, DEFAULT_RULES), pytest.raises(ValueError, match=match):
        Pipeline().check(config)
