"""Muon with the project's parameter partition, QK-Clip and the SGDR schedule."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentic_jax.models import TransformerConfig, hidden_states, init_params
from agentic_jax.models.attention import max_attention_logits
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


def test_muon_orthogonalises_each_layers_matrix_and_adamw_takes_the_rest():
    params = init_params(CFG, jax.random.key(0))
    opt = make_optimizer(
        optax.constant_schedule(1.0), kind="muon", weight_decay=0.0, clip_norm=None
    )
    grads = _random_grads(params)
    updates, _ = jax.jit(opt.update)(grads, opt.init(params), params)
    for name, inputs in MUON_MATRICES.items():
        _, group, leaf = name.split("/")
        u = _layer_matrices(updates["layers"][group][leaf], inputs)
        g = _layer_matrices(grads["layers"][group][leaf], inputs)
        rms_scale = 0.2 * math.sqrt(max(u.shape[1:]))  # consistent-RMS scaling (Liu et al. 2025)
        for layer in range(CFG.n_layers):
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
    np.testing.assert_allclose(
        updates["layers"]["attn"]["q_bias"], -np.sign(grads["layers"]["attn"]["q_bias"]), atol=1e-4
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
    non-zero biases (QK-Clip must scale them with their weights)."""
    params = init_params(config, jax.random.key(seed))
    attn = params["layers"]["attn"]
    gain = jnp.linspace(5.0, 40.0, config.n_heads)  # heads of very different sharpness
    attn["q"] = attn["q"] * gain[None, None, :, None]
    attn["k"] = attn["k"] * 20.0
    for name in ("q_bias", "k_bias"):
        attn[name] = 0.1 * jax.random.normal(jax.random.key(seed + 1), attn[name].shape)
    return params


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_qk_clip_rescales_exactly_the_heads_over_the_threshold(kv_heads):
    config = CFG.replace(n_kv_heads=kv_heads)
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
    if kv_heads == config.n_heads:  # one key per head: Kimi's sqrt(gamma) on each, others equal
        gamma = np.where(over, tau / np.asarray(before), 1.0)
        for name in ("q", "k"):
            np.testing.assert_allclose(
                clipped["layers"]["attn"][name],
                params["layers"]["attn"][name] * np.sqrt(gamma)[:, None, :, None],
                rtol=1e-6,
            )
            untouched = ~over
            np.testing.assert_array_equal(
                np.moveaxis(np.asarray(clipped["layers"]["attn"][name]), 2, 1)[untouched],
                np.moveaxis(np.asarray(params["layers"]["attn"][name]), 2, 1)[untouched],
            )
    for name in ("v", "o"):
        np.testing.assert_array_equal(
            clipped["layers"]["attn"][name], params["layers"]["attn"][name]
        )


def test_train_step_with_qk_clip_caps_the_next_steps_logits():
    config = CFG.replace(n_layers=1)
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
