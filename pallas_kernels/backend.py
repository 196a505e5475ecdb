"""Where a Pallas kernel of this package may run, and with which compiler parameters.

The kernels are written against the Mosaic TPU programming model (VMEM scratch, a
sequential innermost grid axis).  The same source runs on any host in Pallas'
interpreter, which is how the CPU tests exercise it; on GPU the fast paths are cuDNN and
tokamax (see ``pallas_kernels.dispatch``), and a Mosaic GPU port is later work.
"""
from __future__ import annotations

import jax
from jax.experimental.pallas import tpu as pltpu


def resolve_interpret(interpret: bool | None, kernel: str) -> bool:
    """``interpret=None`` means: compile on TPU, interpret on CPU, refuse elsewhere."""
    platform = jax.default_backend()
    if interpret is None:
        interpret = platform == "cpu"
    if not interpret and platform != "tpu":
        raise NotImplementedError(
            f"{kernel} compiles with Mosaic TPU only (backend is {platform!r}). On GPU use "
            "pallas_kernels.gpu_attention (cuDNN / tokamax); pass interpret=True to run the "
            "kernel source in Pallas' (slow) interpreter.")
    return bool(interpret)


def tpu_compiler_params(*parallel: bool):
    """Mosaic grid semantics: ``True`` axes may be split across cores, ``False`` carry state."""
    return pltpu.CompilerParams(
        dimension_semantics=tuple(pltpu.PARALLEL if p else pltpu.ARBITRARY for p in parallel))


# XLA:CPU options for programs built around interpreted kernels: the interpreter emits
# large while-loop bodies whose LLVM optimisation dominates compile time, yet the work they
# do is tiny, so skipping it cuts compile time by about a third (tests, small CPU configs).
# Use as ``jax.jit(f, compiler_options=INTERPRET_COMPILER_OPTIONS)``.
INTERPRET_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0,
                              "xla_llvm_disable_expensive_passes": True}
