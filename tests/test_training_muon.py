"""Muon with the project's parameter partition, QK-Clip and the SGDR schedule."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from decoding_oracle import assert_generate_matches_forward, prompts
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import tiny_mla

from agentic_jax.models import TransformerConfig, hidden_states, init_params
from agentic_jax.models.attention import max_attention_logits
from agentic_jax.models.rope import apply_rope, rope_tables
from agentic_jax.models.transformer import embed_tokens
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step
from agentic_jax.training.optim import MUON_MATRICES, muon_dimension_numbers, muon_labels
from agentic_jax.training.qk_clip import hidden_states_with_max_logits, qk_clip
from agentic_jax.training.step import batch_loss
from pallas_kernels.masks import dense_mask

# Rectangular matrices (aspect >= 2): a square Gaussian matrix has singular values near 0, which
# five Newton-Schulz steps do not lift into the band the test checks.
CFG = TransformerConfig(
    vocab_size=64,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=1,
    head_dim=16,
    d_ff=96,
    qkv_bias=True,
    tie_embeddings=False,
)
# Multi-head latent attention (Kimi K2's), its values wide enough for a rectangular ``o``; and
# with one query projection and YaRN's ``mscale_all_dim``, which MLA's softmax scale includes.
MLA = tiny_mla(CFG.replace(qkv_bias=False)).replace(v_head_dim=16)
MLA_YARN = MLA.replace(
    q_lora_rank=None,
    rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale=0.707,
        mscale_all_dim=1.0,
    ),
)  # fmt: skip
# Newton-Schulz with Jordan's quintic coefficients (3.4445, -4.775, 2.0315) and 5 steps maps
# every singular value into about [0.68, 1.13] (measured here; Jordan 2024 calls it roughly
# uniform around 1), keeping the singular vectors exactly.
NS_BAND = (0.65, 1.2)


def _random_grads(params):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    return jax.tree.unflatten(
        treedef, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    )


def _layer_matrices(x, inputs):
    """``[L, in..., out...] -> [L, prod(in), prod(out)]``."""
    return np.asarray(x).reshape(x.shape[0], math.prod(x.shape[1 : 1 + inputs]), -1)


def test_partition_puts_hidden_matrices_on_muon_and_the_rest_on_adamw():
    labels = muon_labels(init_params(CFG, jax.random.key(0)))
    muon = {k for k, v in labels["layers"]["attn"].items() if v == "muon"}
    assert muon == {"q", "k", "v", "o"}  # not q_bias, k_bias, v_bias
    assert set(labels["layers"]["mlp"].values()) == {"muon"}
    for name in ("embed", "lm_head", "final_norm"):
        assert labels[name] == "adamw"
    assert labels["layers"]["attn_norm"] == labels["layers"]["mlp_norm"] == "adamw"
    dims = muon_dimension_numbers(init_params(CFG, jax.random.key(0)))
    # The stacked layer axis 0 is in neither: optax vmaps over it, one matrix per layer.
    assert dims["layers"]["attn"]["q"] == ((1,), (2, 3))
    assert dims["layers"]["attn"]["o"] == ((1, 2), (3,))
    assert dims["layers"]["mlp"]["down"] == ((1,), (2,))
    assert dims["embed"] is None and dims["layers"]["attn"]["q_bias"] is None


def test_partition_puts_mla_projections_on_muon():
    labels = muon_labels(init_params(MLA, jax.random.key(0)))["layers"]["attn"]
    muon = {k for k, v in labels.items() if v == "muon"}
    assert muon == {"q_a", "q_b", "kv_a", "k_up", "v_up", "o"}  # not the two norms


@pytest.mark.parametrize("config", [CFG, MLA], ids=["gqa", "mla"])
def test_muon_orthogonalises_each_layers_matrix_and_adamw_takes_the_rest(config):
    params = init_params(config, jax.random.key(0))
    opt = make_optimizer(
        optax.constant_schedule(1.0), kind="muon", weight_decay=0.0, clip_norm=None
    )
    grads = _random_grads(params)
    updates, _ = jax.jit(opt.update)(grads, opt.init(params), params)
    for name, inputs in MUON_MATRICES.items():
        _, group, leaf = name.split("/")
        if leaf not in params["layers"][group]:
            continue
        u = _layer_matrices(updates["layers"][group][leaf], inputs)
        g = _layer_matrices(grads["layers"][group][leaf], inputs)
        rms_scale = 0.2 * math.sqrt(max(u.shape[1:]))  # consistent-RMS scaling (Liu et al. 2025)
        for layer in range(config.n_layers):
            o = -u[layer] / rms_scale
            left, _, right = np.linalg.svd(g[layer], full_matrices=False)
            core = left.T @ o @ right.T  # diagonal iff o shares the gradient's singular vectors
            off = core - np.diag(np.diag(core))
            assert np.abs(off).max() < 1e-5, name
            sv = np.linalg.svd(o, compute_uv=False)
            assert NS_BAND[0] < sv.min() and sv.max() < NS_BAND[1], (name, sv)
    # Adam's first step is -lr * g / |g|: the sign of the gradient.
    for leaf in ("embed", "lm_head", "final_norm"):
        np.testing.assert_allclose(updates[leaf], -np.sign(grads[leaf]), atol=1e-4)
    vector = "kv_a_norm" if config.mla else "q_bias"
    np.testing.assert_allclose(
        updates["layers"]["attn"][vector], -np.sign(grads["layers"]["attn"][vector]), atol=1e-4
    )


def test_orthogonalising_the_flattened_stack_would_fail_the_per_layer_check():
    """The check above tells a per-layer orthogonalisation from one of the stacked
    ``[L D, N H]`` matrix: the stack's polar factor is not each layer's."""
    g = np.asarray(jax.random.normal(jax.random.key(1), (2, 32, 64)))
    stacked = optax.contrib._muon.orthogonalize_via_newton_schulz(
        jnp.asarray(g.reshape(64, 64)), jnp.asarray((3.4445, -4.775, 2.0315))
    )
    o = np.asarray(stacked).reshape(2, 32, 64)[0]
    left, _, right = np.linalg.svd(g[0], full_matrices=False)
    core = left.T @ o @ right.T
    assert np.abs(core - np.diag(np.diag(core))).max() > 1e-2


def _tokens(rows=2, t=12, seed=0):
    return jax.random.randint(jax.random.key(seed), (rows, t), 0, CFG.vocab_size)


def _lm_batch(rows, t, seed):
    """A packed-batch dict of one segment per row, every target counted."""
    tokens = _tokens(rows, t + 1, seed)
    return {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": jnp.ones((rows, t), jnp.int32),
        "positions": jnp.broadcast_to(jnp.arange(t), (rows, t)),
        "loss_mask": jnp.ones((rows, t), jnp.int32),
    }


def test_max_attention_logits_equal_a_brute_force_maximum():
    q = jax.random.normal(jax.random.key(0), (2, 6, 4, 8))
    k = jax.random.normal(jax.random.key(1), (2, 6, 2, 8))
    seg = jnp.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 1]])
    got = max_attention_logits(q, k, segment_ids=(seg, seg), sliding_window=3)
    mask = np.asarray(dense_mask(2, 6, 6, causal=True, sliding_window=3, segment_ids=(seg, seg)))
    qn, kn = np.asarray(q), np.asarray(k)
    for head in range(4):
        logits = np.einsum("bth,bsh->bts", qn[:, :, head], kn[:, :, head // 2]) / math.sqrt(8)
        np.testing.assert_allclose(got[head], logits[mask].max(), rtol=1e-5)


def _sharp_params(config, seed=0):
    """Random parameters with queries and keys large enough for logits of a few units, and
    non-zero biases (QK-Clip must scale them with their weights).  Under MLA the shared rotary
    key (``kv_a``'s last columns; the latent is normalised) is made large too."""
    params = init_params(config, jax.random.key(seed))
    attn = params["layers"]["attn"]
    gain = jnp.linspace(5.0, 40.0, config.n_heads)  # heads of very different sharpness
    if config.mla:
        q = "q_b" if config.q_lora_rank else "q"
        attn[q] = attn[q] * gain[None, None, :, None]
        attn["k_up"] = attn["k_up"] * 20.0
        attn["kv_a"] = attn["kv_a"] * 20.0
        return params
    attn["q"] = attn["q"] * gain[None, None, :, None]
    attn["k"] = attn["k"] * 20.0
    for name in ("q_bias", "k_bias"):
        attn[name] = 0.1 * jax.random.normal(jax.random.key(seed + 1), attn[name].shape)
    return params


CLIP_CONFIGS = [CFG.replace(n_kv_heads=4), CFG.replace(n_kv_heads=2), MLA, MLA_YARN]
CLIP_IDS = ["mha", "gqa", "mla", "mla_yarn"]
# The projections QK-Clip may scale; every other attention parameter must come back unchanged.
CLIPPED = {"q", "k", "q_bias", "k_bias", "q_b", "k_up"}


def _mla_layer0_max_logits(params, config, tokens):
    """``[n_heads]``: layer 0's largest causal logit per head of an MLA model, computed by hand
    in float64 (the model's own RoPE tables), with DeepSeek's softmax scale
    ``yarn_mscale(factor, mscale_all_dim)² / sqrt(d_nope + d_rope)``."""
    a = {k: np.asarray(v[0], np.float64) for k, v in params["layers"]["attn"].items()}
    eps, r, d_nope = config.norm_eps, config.kv_lora_rank, config.qk_nope_head_dim

    def rms(x, w):
        return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps) * w

    x = np.asarray(embed_tokens(params, config, tokens), np.float64)
    h = rms(x, np.asarray(params["layers"]["attn_norm"][0], np.float64))
    q_in = rms(h @ a["q_a"], a["q_a_norm"]) if "q_a" in a else h
    q = np.einsum("btd,dnh->btnh", q_in, a["q_b"] if "q_b" in a else a["q"])
    kv = h @ a["kv_a"]
    k_nope = np.einsum("btr,rnh->btnh", rms(kv[..., :r], a["kv_a_norm"]), a["k_up"])
    cos, sin = rope_tables(config, jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape))
    q_rope = np.asarray(apply_rope(jnp.asarray(q[..., d_nope:], jnp.float32), cos, sin))
    k_rope = np.asarray(apply_rope(jnp.asarray(kv[:, :, None, r:], jnp.float32), cos, sin))[:, :, 0]
    logits = np.einsum("btnh,bsnh->bnts", q[..., :d_nope], k_nope) + np.einsum(
        "btnh,bsh->bnts", q_rope, k_rope
    )
    scaling = config.rope_scaling or {}
    factor = (
        0.1 * scaling.get("mscale_all_dim", 0.0) * math.log(scaling.get("factor", 1)) + 1
    ) ** 2
    logits *= factor / math.sqrt(config.qk_head_dim)
    causal = np.tril(np.ones((tokens.shape[1],) * 2, bool))
    return np.where(causal, logits, -np.inf).max(axis=(0, 2, 3))


@pytest.mark.parametrize("config", [MLA, MLA_YARN], ids=["mla", "mla_yarn"])
def test_mla_max_logits_are_the_true_pre_softmax_logits(config):
    params = _sharp_params(config)
    tokens = _tokens()
    _, got, _ = hidden_states_with_max_logits(params, config, tokens)
    np.testing.assert_allclose(got[0], _mla_layer0_max_logits(params, config, tokens), rtol=1e-4)


@pytest.mark.parametrize("config", CLIP_CONFIGS, ids=CLIP_IDS)
def test_qk_clip_rescales_exactly_the_heads_over_the_threshold(config):
    params = _sharp_params(config)
    tokens = _tokens()
    hidden, before, _ = hidden_states_with_max_logits(params, config, tokens)
    np.testing.assert_allclose(hidden, hidden_states(params, config, tokens), rtol=1e-6)
    tau = float(np.median(before))
    over = np.asarray(before > tau)
    assert 0 < over.sum() < over.size
    clipped = qk_clip(params, before, tau)
    _, after, _ = hidden_states_with_max_logits(clipped, config, tokens)
    # Layer 0's inputs do not depend on the clip, so its logits scale exactly; a later layer's
    # inputs moved with the earlier layers' attention, so its maxima are only near tau.
    np.testing.assert_allclose(after[0][over[0]], tau, rtol=1e-4)
    np.testing.assert_allclose(after[0][~over[0]], before[0][~over[0]], rtol=1e-5)
    assert np.all(np.asarray(after)[over] <= tau * 1.05)
    old, new = params["layers"]["attn"], clipped["layers"]["attn"]
    gamma = np.where(over, tau / np.asarray(before), 1.0)[:, None, :, None]
    if config.mla:  # Kimi's rule: sqrt(gamma) on q^C and k^C, gamma on q^R, k^R (kv_a) untouched
        q = "q_b" if config.q_lora_rank else "q"
        d_nope = config.qk_nope_head_dim
        want_q = np.concatenate(
            [old[q][..., :d_nope] * np.sqrt(gamma), old[q][..., d_nope:] * gamma], axis=-1
        )
        expected = {q: want_q, "k_up": old["k_up"] * np.sqrt(gamma)}
    elif config.n_kv_heads == config.n_heads:  # one key per head: sqrt(gamma) on each
        expected = {name: old[name] * np.sqrt(gamma) for name in ("q", "k")}
    else:
        expected = {}
    for name, want in expected.items():
        np.testing.assert_allclose(new[name], want, rtol=1e-6, err_msg=name)
    for name in expected:  # heads under tau: bit for bit
        np.testing.assert_array_equal(
            np.moveaxis(np.asarray(new[name]), 2, 1)[~over],
            np.moveaxis(np.asarray(old[name]), 2, 1)[~over],
        )
    for name in set(old) - CLIPPED:
        np.testing.assert_array_equal(new[name], old[name], err_msg=name)


def test_qk_clip_refuses_logits_of_another_shape():
    params = init_params(MLA, jax.random.key(0))
    with pytest.raises(ValueError, match=r"\[n_layers, n_heads\] = \(2, 4\)"):
        qk_clip(params, jnp.ones((2, 3)), 1.0)


@settings(max_examples=12, deadline=None)
@given(fraction=st.floats(0.05, 1.2), seed=st.integers(0, 3))
def test_qk_clip_caps_every_mla_head_at_tau_on_the_same_batch(fraction, seed):
    """With one layer nothing upstream of the logits moves: after the clip every head's largest
    logit on the same batch is exactly ``min(S_h, tau)``."""
    config = MLA.replace(n_layers=1)
    params = _sharp_params(config, seed)
    tokens = _tokens(seed=seed)
    measure = jax.jit(lambda p: hidden_states_with_max_logits(p, config, tokens)[1])
    before = measure(params)
    tau = fraction * float(before.max())
    after = measure(qk_clip(params, before, tau))
    np.testing.assert_allclose(after, np.minimum(before, tau), rtol=1e-5)


def test_absorbed_decoding_equals_the_training_path_after_qk_clip():
    params = _sharp_params(MLA)
    tokens = _tokens()
    _, before, _ = hidden_states_with_max_logits(params, MLA, tokens)
    clipped = qk_clip(params, before, float(np.median(before)))
    assert_generate_matches_forward(clipped, MLA, prompts(MLA))


@pytest.mark.parametrize("config", [CFG, MLA], ids=["gqa", "mla"])
def test_train_step_with_qk_clip_caps_the_next_steps_logits(config):
    config = config.replace(n_layers=1)
    params = _sharp_params(config)
    sched = make_schedule(1e-3, 10, kind="constant", warmup_steps=0)
    opt = make_optimizer(sched, kind="muon")
    batch = _lm_batch(rows=2, t=8, seed=3)
    _, before, _ = hidden_states_with_max_logits(params, config, batch["tokens"])
    tau = float(np.median(before))
    step = jax.jit(make_train_step(config, opt, sched, qk_clip_threshold=tau))
    state, metrics = step(TrainState.create(params, opt, seed=0), batch)
    np.testing.assert_allclose(metrics["attn_logit_max"], before.max(), rtol=1e-5)
    assert int(metrics["qk_clipped_heads"]) == int((before > tau).sum())
    _, after, _ = hidden_states_with_max_logits(state.params, config, batch["tokens"])
    # Measured before the optimiser step, applied after it: tau up to one small step's change.
    assert float(after.max()) <= tau * 1.05


def test_recording_logits_for_qk_clip_keeps_a_mixture_of_experts_loss():
    """QK-Clip's recording forward is the training forward: the same loss, the MoE auxiliary
    loss and router metrics included, and the same tokens dropped over capacity."""
    config = CFG.replace(n_experts=4, experts_per_token=2, capacity_factor=1.0)
    params = init_params(config, jax.random.key(0))
    batch = _lm_batch(rows=2, t=8, seed=4)
    plain = batch_loss(params, config, batch)
    recorded = batch_loss(params, config, batch, max_logits=True)
    np.testing.assert_allclose(recorded[0], plain[0], rtol=1e-6)
    assert recorded[2]["attn_logit_max"].shape == (config.n_layers, config.n_heads)
    for name, value in plain[2].items():
        np.testing.assert_allclose(recorded[2][name], value, rtol=1e-6, err_msg=name)
    assert any(name.startswith("moe_") for name in plain[2])


def test_sgdr_schedule_follows_its_closed_form():
    peak, final_ratio, warmup, period, mult, total = 1e-3, 0.1, 5, 10, 2, 80
    f = make_schedule(
        peak,
        total,
        kind="cosine_restarts",
        warmup_steps=warmup,
        final_lr_ratio=final_ratio,
        restart_period=period,
        restart_mult=mult,
    )
    got = np.asarray(f(jnp.arange(total + 1)))
    expected = []
    for step in range(total + 1):
        if step < warmup:
            expected.append(peak * step / warmup)
            continue
        t, length = step - warmup, period
        while t >= length:  # SGDR: cycle i lasts period * mult**i steps
            t, length = t - length, length * mult
        cosine = 0.5 * (1 + math.cos(math.pi * t / length))
        expected.append(final_ratio * peak + (peak - final_ratio * peak) * cosine)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-10)
    restarts = [warmup + period, warmup + period + period * mult]
    np.testing.assert_allclose(got[restarts], peak, rtol=1e-6)
    with pytest.raises(ValueError, match="restart_period"):
        make_schedule(kind="cosine_restarts", restart_period=0)


def test_a_tiny_model_trains_with_muon():
    config = CFG.replace(n_layers=1)
    sched = make_schedule(2e-2, 30, kind="constant", warmup_steps=0)
    opt = make_optimizer(sched, kind="muon")
    state = TrainState.create(init_params(config, jax.random.key(2)), opt, seed=0)
    batch = _lm_batch(rows=4, t=8, seed=5)
    step = jax.jit(make_train_step(config, opt, sched))
    losses = []
    for _ in range(25):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0]
    with pytest.raises(ValueError, match="kind"):
        make_optimizer(sched, kind="lion")
