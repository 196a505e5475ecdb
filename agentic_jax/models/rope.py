"""Rotary position embeddings (RoFormer, Su et al. 2021) with context-extension scalings.

A head vector is split into halves (x1, x2) and rotated pairwise by angle ``pos * inv_freq``:

    rope(x) = x * cos + rotate_half(x) * sin,    rotate_half(x) = concat(-x2, x1)

so the score q_m · k_n depends only on m - n.  Scalings change ``inv_freq`` (and, for YaRN, the
magnitude of cos/sin):

* linear  (Chen et al. 2023, position interpolation): inv_freq / factor.
* ntk     (NTK-aware, static): base * factor^(d / (d - 2)).
* dynamic (dynamic NTK): as ntk, with the factor grown from the actual length L when L exceeds
  the original context: base * (factor L / L0 - (factor - 1))^(d / (d - 2)).
* yarn    (Peng et al. 2023): per-frequency blend of interpolation and extrapolation with a
  linear ramp between the beta_fast / beta_slow rotation counts, and attention scale
  0.1 ln(factor) + 1.
* llama3  (Meta 2024): long wavelengths divided by factor, short ones kept, smooth in between.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from agentic_jax.models.config import TransformerConfig


def _base_inv_freq(dim: int, base):
    return 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))


def _yarn(dim: int, base: float, scaling) -> tuple[jnp.ndarray, float]:
    factor = scaling["factor"]
    original = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32.0
    beta_slow = scaling.get("beta_slow") or 1.0

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0.0, 1.0)
    extrapolate = 1.0 - ramp
    inv_freq = _base_inv_freq(dim, base)
    inv_freq = (inv_freq / factor) * (1.0 - extrapolate) + inv_freq * extrapolate
    return inv_freq, scaling.get("attention_factor") or yarn_mscale(factor)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 mscale ln(factor) + 1`` (1 when not extending)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_factor(config: TransformerConfig) -> float:
    """What DeepSeek's MLA multiplies its softmax scale by: ``yarn_mscale(factor,
    mscale_all_dim)²`` when ``rope_scaling`` has ``mscale_all_dim`` (DeepSeek-V2/V3's YaRN,
    whose cos/sin magnitude is then ``yarn_mscale(factor, mscale) / yarn_mscale(factor,
    mscale_all_dim)``), else 1.  Hugging Face applies it in DeepSeek's attention only, so GQA
    models ignore the key."""
    scaling = config.rope_scaling
    if not scaling or not scaling.get("mscale_all_dim"):
        return 1.0
    return yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2


def _llama3(dim: int, base: float, scaling) -> jnp.ndarray:
    factor = scaling["factor"]
    low_ff = scaling.get("low_freq_factor", 1.0)
    high_ff = scaling.get("high_freq_factor", 4.0)
    original = scaling.get("original_max_position_embeddings", 8192)
    inv_freq = _base_inv_freq(dim, base)
    wavelen = 2 * math.pi / inv_freq
    long_wave = wavelen > original / low_ff
    short_wave = wavelen < original / high_ff
    smooth = (original / wavelen - low_ff) / (high_ff - low_ff)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return jnp.where(long_wave, inv_freq / factor, jnp.where(short_wave, inv_freq, blended))


def inverse_frequencies(config: TransformerConfig, positions=None) -> tuple[jnp.ndarray, float]:
    """Returns (inv_freq[H/2], cos/sin magnitude).  ``positions`` are needed for ``dynamic``."""
    dim, base, scaling = config.rope_dim, config.rope_theta, config.rope_scaling
    if scaling is None:
        return _base_inv_freq(dim, base), 1.0
    kind = scaling["type"]
    if kind == "linear":
        return _base_inv_freq(dim, base) / scaling["factor"], 1.0
    if kind == "ntk":
        return _base_inv_freq(dim, base * scaling["factor"] ** (dim / (dim - 2))), 1.0
    if kind == "dynamic":
        factor = scaling["factor"]
        original = scaling.get("original_max_position_embeddings", config.max_seq_len)
        length = jnp.maximum(jnp.max(positions) + 1, original).astype(jnp.float32)
        dyn_base = base * (factor * length / original - (factor - 1)) ** (dim / (dim - 2))
        return _base_inv_freq(dim, dyn_base), 1.0
    if kind == "yarn":
        return _yarn(dim, base, scaling)
    return _llama3(dim, base, scaling), 1.0


def rope_tables(config: TransformerConfig, positions) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos, sin of shape ``positions.shape + (config.rope_dim,)`` in float32."""
    inv_freq, magnitude = inverse_frequencies(config, positions)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles) * magnitude, jnp.sin(angles) * magnitude


def apply_rope(x, cos, sin):
    """Rotates ``x[B, T, heads, H]`` by tables ``cos/sin[B, T, H]``; computes in float32."""
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)
