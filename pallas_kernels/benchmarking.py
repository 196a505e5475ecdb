"""Measurement helpers shared by the benchmark scripts in ``bench/``.

Memory comes from XLA's compiled memory analysis (compile only, nothing is allocated), so
it can size problems far larger than the host could run.  Times are medians over a few
runs after a warm-up, with ``block_until_ready`` so asynchronous dispatch is not mistaken
for speed.
"""

from __future__ import annotations

import statistics
import time
from typing import NamedTuple

import jax


class CompiledMemory(NamedTuple):
    peak: int  # arguments + outputs + temporaries, minus donated aliases
    temp: int  # temporaries alone: the working memory the computation adds


def compiled_memory(fn, *args) -> CompiledMemory:
    """Memory of ``jit(fn)`` on ``args`` (arrays or ``jax.ShapeDtypeStruct``), in bytes."""
    m = jax.jit(fn).lower(*args).compile().memory_analysis()
    peak = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )
    return CompiledMemory(peak, m.temp_size_in_bytes)


def median_seconds(fn, *args, iters: int = 5) -> float:
    """Median wall time of the compiled ``fn(*args)`` after one warm-up call."""
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def describe_device() -> str:
    device = jax.devices()[0]
    return f"{device.platform}: {getattr(device, 'device_kind', device)} (jax {jax.__version__})"
