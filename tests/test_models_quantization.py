"""Weight-only quantisation (int8, int4, NF4, AWQ) and 2:4 pruning of the transformer's weights."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec
from scipy.stats import norm
from tiny_models import CORPUS

from agentic_jax.data.tokenizer import train_tokenizer
from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.engine import Engine, EngineConfig, Request
from agentic_jax.models import TransformerConfig, forward, init_params, param_axes
from agentic_jax.models.awq import awq_scale, awq_search
from agentic_jax.models.calibration import calibration_tokens, projection_inputs
from agentic_jax.models.compression import perplexity_deltas
from agentic_jax.models.pruning import prune_params, two_four_mask
from agentic_jax.models.quantization import (
    NF4,
    QuantizedWeight,
    param_bytes,
    quantize,
    quantize_params,
    quantized_param_axes,
)
from sharding.partition import logical_to_specs

CFG = TransformerConfig(
    vocab_size=64,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=4,
    head_dim=16,
    d_ff=128,
    max_seq_len=64,
    tie_embeddings=False,
    init_std=0.1,
)


@pytest.fixture(scope="module")
def model():
    """A random model whose first four embedding channels are 30 times louder (outliers)."""
    params = init_params(CFG, jax.random.key(0))
    params["embed"] = params["embed"].at[:, :4].multiply(30.0)
    tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, CFG.vocab_size)
    return params, tokens


def _per_weight(x, q: QuantizedWeight):
    return np.repeat(np.asarray(x, np.float32), q.group_size, axis=-2).reshape(q.shape)


# ------------------------------------------------------------------------------ round-to-nearest
@settings(deadline=None, max_examples=6)
@given(
    fmt=st.sampled_from(["int8", "int4"]),
    symmetric=st.booleans(),
    groups=st.integers(1, 3),
    group_size=st.sampled_from([2, 8, 32]),
    out=st.integers(1, 5),
    offset=st.floats(-2, 2),
    seed=st.integers(0, 2**16),
)
def test_rtn_is_within_half_a_step_of_every_weight(
    fmt, symmetric, groups, group_size, out, offset, seed
):
    w = np.random.default_rng(seed).normal(offset, 1.0, (2, groups * group_size, out))
    q = quantize(w.astype(np.float32), fmt, group_size=group_size, symmetric=symmetric, n_lead=1)
    step = _per_weight(q.scales, q)
    assert np.all(np.abs(w - np.asarray(q.dequantize())) <= step / 2 * (1 + 1e-5) + 1e-6)
    levels = 2 ** (8 if fmt == "int8" else 4)
    assert np.all(step <= (np.ptp(w, axis=1, keepdims=True) + np.abs(w).max()) / (levels / 2 - 1))


def test_int4_packs_two_codes_per_byte_and_nf4_costs_4_127_bits():
    w = jax.random.normal(jax.random.key(0), (256, 512))
    int4 = quantize(w, "int4", group_size=32)
    assert int4.codes.dtype == jnp.uint8 and int4.codes.shape == (128, 512)
    assert param_bytes(int4) == 256 * 512 // 2 + 4 * (256 // 32) * 512
    nf4 = quantize(w, "nf4")
    bits = 8 * param_bytes(nf4) / w.size
    assert bits == pytest.approx(4 + 8 / 64 + 32 / (64 * 256) + 32 / w.size)
    assert param_bytes(quantize(w, "int8")) == w.size + 4 * 512


def test_bad_formats_and_groups_are_named():
    with pytest.raises(ValueError, match="fmt"):
        quantize(jnp.ones((4, 4)), "int3")
    with pytest.raises(ValueError, match="group_size"):
        quantize(jnp.ones((48, 4)), "int4", group_size=32)
    with pytest.raises(ValueError, match="floating"):
        quantize(jnp.ones((4, 4), jnp.int32), "int8")


# ---------------------------------------------------------------------------------------- NF4
def test_nf4_table_is_qlora_normal_quantiles():
    """bitsandbytes' create_normal_map(offset=0.9677083), rebuilt from scipy's N(0, 1)."""
    offset = 0.9677083
    positive = norm.ppf(np.linspace(offset, 0.5, 9)[:-1])
    negative = -norm.ppf(np.linspace(offset, 0.5, 8)[:-1])
    table = np.sort(np.concatenate([positive, [0.0], negative]))
    np.testing.assert_allclose(NF4, table / table.max(), atol=1e-6)


def test_nf4_round_trips_table_values_and_picks_the_nearest():
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 16, (256, 96))
    idx[::64] = 15  # every block of 64 inputs reaches +1 · absmax
    absmax = rng.uniform(0.5, 2.0, (4, 96))
    w = NF4[idx] * np.repeat(absmax, 64, axis=0)
    q = quantize(jnp.asarray(w, jnp.float32), "nf4")
    codes = np.stack([np.asarray(q.codes) & 15, np.asarray(q.codes) >> 4], 1).reshape(256, 96)
    np.testing.assert_array_equal(codes, idx)
    scales = np.asarray(q.group_scales())
    spread = np.abs(absmax - absmax.mean()).max()
    assert np.abs(scales - absmax).max() <= spread / 16  # float8 e4m3: 3 mantissa bits
    np.testing.assert_allclose(q.dequantize(), NF4[idx] * np.repeat(scales, 64, 0), rtol=1e-6)
    # random weights: each code is the table value nearest w / (its block's absmax)
    v = rng.normal(size=(128, 8)).astype(np.float32)
    q = quantize(v, "nf4")
    blocks = np.abs(v.reshape(2, 64, 8)).max(1)
    nearest = np.abs((v / np.repeat(blocks, 64, 0))[..., None] - NF4).argmin(-1)
    codes = np.stack([np.asarray(q.codes) & 15, np.asarray(q.codes) >> 4], 1).reshape(128, 8)
    np.testing.assert_array_equal(codes, nearest)


# ------------------------------------------------------------------------------- in the model
@pytest.mark.parametrize(
    ("fmt", "options", "tolerance"),
    [
        ("int8", {}, 0.02),
        ("int8", {"symmetric": False}, 0.02),
        ("int4", {"group_size": 32}, 0.25),
        ("nf4", {}, 0.25),
    ],
)
def test_quantised_forward_is_within_tolerance_of_the_float_one(model, fmt, options, tolerance):
    """Max |logit error| ≤ tolerance × the float logits' max |logit| (scanned and jitted, and
    unrolled), with the LM head quantised too."""
    params, tokens = model
    q = quantize_params(params, CFG, fmt, lm_head=True, **options)
    assert isinstance(q["layers"]["attn"]["o"], QuantizedWeight) and "embed" in q
    reference = forward(params, CFG, tokens)
    scale = float(jnp.abs(reference).max())
    for config in (CFG, CFG.replace(scan_layers=False)):
        logits = jax.jit(forward, static_argnums=1)(q, config, tokens)
        assert float(jnp.abs(logits - reference).max()) <= tolerance * scale
    assert param_bytes(q) < param_bytes(params) / (3 if fmt == "int8" else 4.5)


def test_moe_and_mla_models_run_quantised():
    for extra in (
        dict(n_experts=4, experts_per_token=2, moe_layers=2, n_shared_experts=1),
        dict(attention_type="mla", kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8,
             qk_rope_head_dim=8, v_head_dim=8),
    ):  # fmt: skip
        config = CFG.replace(d_model=32, head_dim=8, d_ff=64, n_layers=2, **extra)
        params = init_params(config, jax.random.key(0))
        tokens = jnp.arange(16).reshape(2, 8)
        reference = forward(params, config, tokens)
        logits = forward(quantize_params(params, config, "int8"), config, tokens)
        assert float(jnp.abs(logits - reference).max()) <= 0.02 * float(jnp.abs(reference).max())


def test_quantised_axes_give_partition_specs_of_the_right_rank(model):
    params, _ = model
    q = quantize_params(params, CFG, "nf4")
    axes = quantized_param_axes(param_axes(CFG), q)
    specs = logical_to_specs(axes, {"fsdp": 1, "tensor": 1}, shapes=q)
    leaves = jax.tree.leaves(q)
    specs = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    assert [len(s) for s in specs] == [x.ndim for x in leaves]


def test_generate_and_the_engine_take_quantised_params(model):
    """Greedy decoding of an int4 model: the engine's tokens equal generate's; the first logits
    of int8 generate are within 1% of the float model's."""
    params, _ = model
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    greedy = SamplingParams(temperature=0.0, max_tokens=6)

    def run(p):
        return generate(p, CFG, prompts, sampling=greedy, key=jax.random.key(0), return_logits=True)

    reference, int8 = run(params), run(quantize_params(params, CFG, "int8"))
    scale = float(jnp.abs(reference.logits[:, 0]).max())
    assert float(jnp.abs(int8.logits[:, 0] - reference.logits[:, 0]).max()) <= 0.01 * scale
    int4 = quantize_params(params, CFG, "int4", group_size=32)
    engine = Engine(int4, CFG, EngineConfig(num_slots=2, block_size=4, num_blocks=16))
    done = engine.generate([Request(p, greedy) for p in prompts])
    expected = np.asarray(run(int4).tokens)
    for row, result in enumerate(done):
        np.testing.assert_array_equal(result.tokens, expected[row, : len(result.tokens)])


# ---------------------------------------------------------------------------------------- AWQ
def test_awq_beats_round_to_nearest_with_outlier_channels():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 64)) * np.where(np.arange(64) < 4, 20.0, 1.0)
    w = rng.normal(size=(64, 48))
    _, error, rtn = awq_search(x, [w], "int4", group_size=32)
    assert float(error) < 0.8 * float(rtn)


def test_awq_folds_its_scales_exactly_and_lowers_each_projections_calibration_error(tmp_path):
    """The scaled float model computes the same function; on calibration tokens of the shipped
    corpus, each scaled group's error is at most RTN's and below it in sum."""
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", files=[CORPUS], vocab_size=300)
    config = CFG.replace(vocab_size=tokenizer.vocab_size)
    params = init_params(config, jax.random.key(0))
    params["embed"] = params["embed"].at[:, :4].multiply(30.0)
    tokens = calibration_tokens(tokenizer, rows=2, length=32)
    assert tokens.shape == (2, 32) and tokens.max() < config.vocab_size
    scaled = awq_scale(params, config, tokens, "int4", group_size=32)
    reference = forward(params, config, tokens)
    assert float(jnp.abs(forward(scaled, config, tokens) - reference).max()) < 1e-4 * float(
        jnp.abs(reference).max()
    )
    inputs, attn = projection_inputs(params, config, tokens), params["layers"]["attn"]
    totals = np.zeros(2)
    for i in range(config.n_layers):
        _, error, rtn = awq_search(
            inputs["q"][i], [attn[n][i] for n in "qkv"], "int4", group_size=32
        )
        assert error <= rtn
        totals += [error, rtn]
    assert totals[0] < totals[1]


# -------------------------------------------------------------------------------------- 2:4
@settings(deadline=None, max_examples=25)
@given(groups=st.integers(1, 4), out=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_two_four_masks_keep_exactly_two_of_every_four(groups, out, seed):
    score = np.abs(np.random.default_rng(seed).normal(size=(3, 4 * groups, out))) + 1e-3
    mask = np.asarray(two_four_mask(jnp.asarray(score), n_lead=1))
    np.testing.assert_array_equal(mask.reshape(3, groups, 4, out).sum(2), 2)
    kept = np.where(mask, score, np.inf).reshape(3, groups, 4, out).min(2)
    dropped = np.where(mask, -np.inf, score).reshape(3, groups, 4, out).max(2)
    assert np.all(kept >= dropped)


def test_wanda_differs_from_magnitude_and_loses_less_on_skewed_activations(model):
    params, tokens = model
    magnitude = prune_params(params, CFG, "magnitude")
    wanda = prune_params(params, CFG, "wanda", tokens)
    for pruned in (magnitude, wanda):
        w = np.asarray(pruned["layers"]["mlp"]["gate"])
        np.testing.assert_array_equal((w.reshape(2, 16, 4, 128) != 0).sum(2), 2)
    assert (
        np.mean(np.asarray(magnitude["layers"]["attn"]["q"] != wanda["layers"]["attn"]["q"])) > 0.01
    )
    inputs = projection_inputs(params, CFG, tokens)

    def error(pruned):
        x, w = inputs["q"], params["layers"]["attn"]["q"].reshape(2, 64, -1)
        wp = pruned["layers"]["attn"]["q"].reshape(2, 64, -1)
        return float(jnp.sum(jnp.square(x @ w - x @ wp)))

    assert error(wanda) < error(magnitude)
    with pytest.raises(ValueError, match="calibration"):
        prune_params(params, CFG, "wanda")


def test_perplexity_deltas_report_every_variant(model):
    params, tokens = model
    report = perplexity_deltas(params, CFG, tokens, tokens[:2], group_size=32)
    assert set(report) == {"float", "int8", "int4", "int4_awq", "nf4", "2:4_magnitude", "2:4_wanda"}
    assert report["float"]["delta"] == 0.0
    assert abs(report["int8"]["delta"]) < 0.01 * report["float"]["perplexity"]
    assert all(math.isfinite(r["perplexity"]) and r["perplexity"] > 1 for r in report.values())


# ------------------------------------------------------------------------------------- RL
def test_rl_sampler_quantization_samples_with_the_quantised_policy(tmp_path):
    """``RLConfig.sampler_quantization``: rollouts come from the int8 sampler, and their
    behaviour log-probs are its own (what the off-policy correction compares the learner to)."""
    from tiny_models import task_model_dir

    from agentic_jax.envs.text import Arithmetic
    from agentic_jax.post_training.rl import RLConfig, StepRandom, init_learner, make_setup, sample
    from agentic_jax.post_training.tasks import TaskSpec

    config, base, tokenizer = task_model_dir(tmp_path, max_seq_len=192)
    spec = TaskSpec(generators=(Arithmetic(1),), num_train=2, num_heldout=1, max_length=160,
                    action_length=16)  # fmt: skip
    algo = RLConfig(group_size=2, prompts_per_step=1, sampler_quantization="int8")
    setup = make_setup(config, base, spec.env(tokenizer, "train"), algo, steps=1, peak_lr=1e-3)
    learner = init_learner(setup)
    params, _ = setup.sampler(learner)
    assert isinstance(params["layers"]["mlp"]["down"], QuantizedWeight)
    rollouts = sample(setup, learner, StepRandom(0, 1)).rollouts
    mask = rollouts.loss_mask.astype(bool)
    quantised = np.asarray(setup.logp_fn(params, jnp.asarray(rollouts.tokens)))
    full = np.asarray(setup.logp_fn(setup.policy_params(learner), jnp.asarray(rollouts.tokens)))
    np.testing.assert_allclose(rollouts.behaviour_logp[mask], quantised[mask], atol=2e-3)
    assert np.abs(full[mask] - quantised[mask]).max() > 1e-5
    with pytest.raises(ValueError, match="sampler_quantization"):
        RLConfig(sampler_quantization="int3")
