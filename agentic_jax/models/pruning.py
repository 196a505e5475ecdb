"""2:4 structured sparsity: in every group of four consecutive inputs of each output unit, two
weights are kept (the pattern sparse tensor cores run at twice the dense rate).

The kept two are those of the highest score: the weight's magnitude ``|W|``, or Wanda's
``|W_ij| · ‖X_i‖₂`` (Sun et al. 2023, arXiv:2306.11695), which weighs each weight by the norm of
its input channel over calibration tokens, so a small weight on a loud channel outranks a larger
one on a quiet channel.  Pruning is one shot, without retraining or weight updates.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from agentic_jax.models.calibration import projection_inputs
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.quantization import projection_layout

METHODS = ("magnitude", "wanda")
GROUP = 4
KEEP = 2


def two_four_mask(score, n_lead: int = 0, n_in: int = 1):
    """bool mask shaped like ``score [*lead, in..., out...]`` keeping the ``KEEP`` highest scores
    of each group of ``GROUP`` consecutive (flattened) inputs per output unit."""
    lead = score.shape[:n_lead]
    n_input = math.prod(score.shape[n_lead : n_lead + n_in])
    if n_input % GROUP:
        raise ValueError(f"2:4 pruning needs inputs in groups of 4; shape {score.shape}")
    groups = score.reshape(*lead, n_input // GROUP, GROUP, -1)
    rank = jnp.argsort(jnp.argsort(-groups, axis=-2, stable=True), axis=-2, stable=True)
    return (rank < KEEP).reshape(score.shape)


def prune_params(params, config: TransformerConfig, method: str = "magnitude", tokens=None):
    """The parameters with every projection (those of
    :func:`~agentic_jax.models.quantization.quantize_params`, the LM head excepted) 2:4-sparse.
    ``wanda`` needs calibration ``tokens [B, T]``; the MoE experts, whose inputs are routed and
    not recorded, are pruned by magnitude under either method."""
    if method not in METHODS:
        raise ValueError(f"prune_params: method={method!r}; expected one of {METHODS}")
    if method == "wanda" and tokens is None:
        raise ValueError("prune_params: method='wanda' needs calibration tokens")
    norms = {}
    if method == "wanda":
        inputs = projection_inputs(params, config, tokens)
        norms = {name: jnp.linalg.norm(x, axis=1) for name, x in inputs.items()}  # [L, In]

    def prune(path, w):
        keys = tuple(getattr(k, "key", None) for k in path)
        layout = projection_layout(keys)
        if layout is None:
            return w
        n_lead, n_in = layout
        score = jnp.abs(w.astype(jnp.float32))
        if norms and keys[-2] in ("attn", "mlp"):  # what runs through _dense, recorded
            n_out = w.ndim - n_lead - n_in
            score = score * norms[keys[-1]].reshape(w.shape[: n_lead + n_in] + (1,) * n_out)
        return jnp.where(two_four_mask(score, n_lead, n_in), w, 0).astype(w.dtype)

    return jax.tree_util.tree_map_with_path(prune, params)
