"""Where a Pallas kernel of this package may run, and with which compiler parameters.

Most kernels are written against the Mosaic TPU programming model (VMEM scratch, a
sequential innermost grid axis); flash attention also has a Triton family for NVIDIA GPUs
(``flash_triton``).  Every kernel source runs on any host in Pallas' interpreter, which is
how the CPU tests exercise it; on GPU the fused paths chosen automatically are cuDNN and
tokamax (see ``pallas_kernels.dispatch``).  A CPU host can also lower the kernels for a
TPU or GPU it does not have (``lower_for_tpu``, ``lower_for_gpu``), which checks them against
Mosaic's or Triton's rules without running them.
"""

from __future__ import annotations

import jax
from jax.experimental.pallas import tpu as pltpu


def target_platform() -> str:
    """The platform programs are being built for.

    Normally the default backend; inside ``jax.sharding.use_abstract_mesh`` with an
    ``AbstractDevice`` it is that device's platform, which is how a CPU host lowers the
    kernels for a TPU it does not have (see ``tests/test_pallas_tpu_lowering.py``).
    """
    device = jax.sharding.get_abstract_mesh().abstract_device
    return jax.default_backend() if device is None else device.platform


def _lower_for(fn, args, jit_kwargs, device, lowering_platform: str) -> jax.stages.Lowered:
    mesh = jax.sharding.AbstractMesh((1,), ("_target",), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn, **jit_kwargs).trace(*args).lower(lowering_platforms=(lowering_platform,))


def lower_for_tpu(
    fn, *args, device_kind: str = "TPU v5 lite", num_cores: int = 1, **jit_kwargs
) -> jax.stages.Lowered:
    """``jax.jit(fn)`` lowered for a TPU generation this host need not have.

    Inside, :func:`target_platform` is ``"tpu"``, so the kernels compile instead of
    interpreting and Pallas lowers them to Mosaic (checking block shapes, layouts and ops);
    only the final Mosaic-to-machine-code step, done by the TPU runtime, is left out.
    ``device_kind`` is a TPU's ``device_kind`` ("TPU v4", "TPU v5 lite", "TPU v5" -- a v5p on
    a TPU VM, "TPU v5p" under Pathways --, "TPU v6 lite", ...); ``args`` may be arrays or
    ``jax.ShapeDtypeStruct``s.
    """
    device = jax.sharding.AbstractDevice(
        device_kind=device_kind, num_cores=num_cores, platform="tpu"
    )
    return _lower_for(fn, args, jit_kwargs, device, "tpu")


def lower_for_gpu(fn, *args, device_kind: str = "NVIDIA H200", **jit_kwargs) -> jax.stages.Lowered:
    """``jax.jit(fn)`` lowered for an NVIDIA GPU this host need not have.

    Inside, :func:`target_platform` is ``"gpu"``, so the Triton kernels compile instead of
    interpreting and Pallas lowers them to Triton IR (every op of the kernel bodies needs a
    Triton rule, every array a power-of-two shape); Triton's own compile to PTX, done by
    XLA on the GPU host, is left out.
    """
    device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu")
    return _lower_for(fn, args, jit_kwargs, device, "cuda")


_COMPILERS = {"tpu": "Mosaic TPU", "gpu": "Pallas' Triton lowering (NVIDIA GPUs)"}


def resolve_interpret(interpret: bool | None, kernel: str, compiles_for: str = "tpu") -> bool:
    """``interpret=None`` means: compile on ``compiles_for`` (the platform the kernel is written
    for, ``"tpu"`` or ``"gpu"``), interpret on CPU, refuse elsewhere."""
    platform = target_platform()
    if interpret is None:
        interpret = platform == "cpu"
    if not interpret and platform != compiles_for:
        raise NotImplementedError(
            f"{kernel} compiles with {_COMPILERS[compiles_for]} only (backend is "
            f"{platform!r}). On GPU, flash_attention runs its Triton kernels and "
            "pallas_kernels.gpu_attention picks cuDNN / tokamax; pass interpret=True to run "
            "the kernel source in Pallas' (slow) interpreter."
        )
    return bool(interpret)


def tpu_compiler_params(*parallel: bool):
    """Mosaic grid semantics: ``True`` axes may be split across cores, ``False`` carry state."""
    return pltpu.CompilerParams(
        dimension_semantics=tuple(pltpu.PARALLEL if p else pltpu.ARBITRARY for p in parallel)
    )


# XLA:CPU options for programs built around interpreted kernels: the interpreter emits
# large while-loop bodies whose LLVM optimisation dominates compile time, yet the work they
# do is tiny, so skipping it cuts compile time by about a third (tests, small CPU configs).
# Use as ``jax.jit(f, compiler_options=INTERPRET_COMPILER_OPTIONS)``.
INTERPRET_COMPILER_OPTIONS = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}
