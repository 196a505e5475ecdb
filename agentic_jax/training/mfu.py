"""Peak FLOP/s per device, for model-FLOPs utilisation (MFU; Chowdhery et al. 2022)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s from vendors' data sheets, keyed by a substring of device_kind; the
# longest matching key wins, since kinds nest: "NVIDIA L40S" contains "L4", and JAX names a v5p
# chip "TPU v5" but a v5e chip "TPU v5 lite".
PEAK_FLOPS = (
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("TPU v6", 918e12),
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),
    ("TPU v5e", 197e12),
    ("TPU v5 lite", 197e12),
    ("TPU v4", 275e12),
)


def measured_matmul_flops(n: int = 512, repeats: int = 5) -> float:
    """FLOP/s of a float32 ``n x n`` matmul on the default device: the CPU's practical peak."""
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        f(a).block_until_ready()
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def peak_flops_per_device(device=None) -> float:
    """The data-sheet peak for known accelerators; on CPU (or unknown kinds) a measured matmul rate."""
    device = device or jax.devices()[0]
    matches = [(len(name), flops) for name, flops in PEAK_FLOPS if name in device.device_kind]
    return max(matches)[1] if matches else measured_matmul_flops()
