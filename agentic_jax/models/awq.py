"""AWQ: activation-aware weight quantisation (Lin et al. 2024, arXiv:2306.00978).

A few input channels carry much larger activations than the rest, and the weights they multiply
matter most.  AWQ scales each input channel of a weight up by ``s = mean|x|^α`` before rounding,
``Q(W diag(s))``, and the activation down by the same factor, so the float product is unchanged
and the salient weights lose less to rounding.  ``α`` is searched over a grid in ``[0, 1)``
(``α = 0`` is round-to-nearest) for the least calibration error

    ‖ (x / s) Q(W · s) − x W ‖²,

with ``s`` normalised to ``s / sqrt(max s · min s)`` as in the paper's code.  The ``1 / s`` is
folded into the op before the projection, so the quantised model costs nothing more:

- q, k, v (MLA: q or q_a, and kv_a): one ``s`` for all of them, folded into ``attn_norm`` (and
  its bias under LayerNorm);
- gate, up: one ``s``, folded into ``mlp_norm``;
- down: folded into the output columns of ``up`` (``silu(x W_g) ⊙ (x W_u / s)``);
- o: folded into the output columns of ``v`` when every query head has its own value head
  (``n_kv_heads == n_heads``; attention is linear in the values).

Nothing to fold into, these stay plain round-to-nearest: q, k, v, gate and up of post-norm
models (``norm_position="post"``: the input is the residual stream itself), o under grouped
queries (a value head feeds several query heads, which would need equal scales) and under MLA,
MLA's q_b, the MoE layers' experts (their inputs are routed, not recorded) and the LM head.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.models.calibration import dense_mlp_layers, projection_inputs
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.quantization import quantize, quantize_params


def _scales(mean_abs, alpha):
    s = jnp.maximum(mean_abs, 1e-4) ** alpha
    return s / jnp.sqrt(s.max() * s.min())


@functools.partial(jax.jit, static_argnames=("fmt", "grid", "group_size", "symmetric"))
def _grid_errors(x, w, fmt, grid, group_size, symmetric):
    """``(scales [grid, In], errors [grid])`` of ``α = i / grid`` for ``x [n, In] w [In, Out]``."""
    reference = x @ w
    mean_abs = jnp.mean(jnp.abs(x), axis=0)

    def error(alpha):
        s = _scales(mean_abs, alpha)
        q = quantize(w * s[:, None], fmt, group_size=group_size, symmetric=symmetric)
        return s, jnp.mean(jnp.square((x / s) @ q.dequantize() - reference))

    return jax.lax.map(error, jnp.arange(grid) / grid)


def awq_search(x, weights, fmt: str = "int4", *, grid: int = 20, group_size=None, symmetric=True):
    """``(s [In], error, rtn_error)``: the per-input-channel scale of weights ``[In, Out_i]``
    that share the input ``x [n, In]`` (q, k and v; gate and up), searched over ``α = i / grid``,
    its calibration error and round-to-nearest's (``α = 0``), each the mean squared output error
    over all the weights; ``group_size`` and ``symmetric`` as in
    :func:`~agentic_jax.models.quantization.quantize`."""
    x = jnp.asarray(x, jnp.float32)
    w = jnp.concatenate([jnp.asarray(v, jnp.float32).reshape(x.shape[1], -1) for v in weights], 1)
    scales, errors = _grid_errors(x, w, fmt, grid, group_size, symmetric)
    best = jnp.argmin(errors)
    return scales[best], errors[best], errors[0]


def awq_params(
    params, config: TransformerConfig, tokens, fmt: str = "int4", *, lm_head=False, **options
):
    """:func:`~agentic_jax.models.quantization.quantize_params` (``lm_head``, and ``options``'
    ``group_size`` and ``symmetric``) after :func:`awq_scale` (``options``)."""
    scaled = awq_scale(params, config, tokens, fmt, **options)
    options.pop("grid", None)
    return quantize_params(scaled, config, fmt, lm_head=lm_head, **options)


def awq_scale(
    params,
    config: TransformerConfig,
    tokens,
    fmt: str = "int4",
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    grid: int = 20,
):
    """The float parameters with AWQ's scales applied and folded (the same function of the
    input, up to rounding), searched for ``fmt`` on the calibration ``tokens [B, T]`` (e.g.
    :func:`~agentic_jax.models.calibration.calibration_tokens`)."""
    inputs = projection_inputs(params, config, tokens)
    quant = dict(group_size=group_size, symmetric=symmetric)
    layers = jax.tree.map(lambda a: np.array(a, np.float32), params["layers"])
    attn, mlp = layers["attn"], layers.get("mlp")

    def scale(x, targets, fold):
        """Scales the input rows of each weight in ``targets`` by AWQ's ``s``; ``fold(1 / s)``."""
        s = np.asarray(awq_search(x, targets, fmt, grid=grid, **quant)[0])
        for w in targets:
            w.reshape(s.size, -1)[...] *= s[:, None]  # a view: scales w in place
        fold(1.0 / s)

    def into_norm(name, i):
        def fold(inv):
            for key in (name, f"{name}_bias"):
                if key in layers:
                    layers[key][i] *= inv

        return fold

    def into_values(i):
        def fold(inv):
            heads = inv.reshape(attn["v"].shape[2:])  # [K, H]
            attn["v"][i] *= heads
            if "v_bias" in attn:
                attn["v_bias"][i] *= heads

        return fold

    def into_up(j):
        def fold(inv):
            mlp["up"][j] *= inv

        return fold

    pre_norm = config.norm_position != "post"
    for i in range(config.n_layers):
        if pre_norm:
            names = [n for n in ("q", "k", "v", "q_a", "kv_a") if n in attn]
            scale(inputs[names[0]][i], [attn[n][i] for n in names], into_norm("attn_norm", i))
        if not config.mla and config.n_kv_heads == config.n_heads:
            scale(inputs["o"][i], [attn["o"][i]], into_values(i))
    for j, i in enumerate(dense_mlp_layers(config)):
        if pre_norm:
            scale(inputs["gate"][j], [mlp["gate"][j], mlp["up"][j]], into_norm("mlp_norm", i))
        scale(inputs["down"][j], [mlp["down"][j]], into_up(j))
    layers = jax.tree.map(lambda new, old: jnp.asarray(new, old.dtype), layers, params["layers"])
    return {**params, "layers": layers}
