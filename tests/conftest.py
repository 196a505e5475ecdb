"""Test setup: 8 fake CPU devices, so sharding code runs as it would on a slice.

The suite is bound by XLA compile time, not run time, so LLVM's code-generation optimisations
are off by default (``JAX_DISABLE_MOST_OPTIMIZATIONS=1``, inherited by the subprocesses that
tests start).  That flag keeps every HLO pass (fusion, buffer assignment), so compiled memory
analysis is unchanged; it saves about a third of the suite's time.  Set it to 0 to test the
fully optimised code.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", False)

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=10, deadline=None, derandomize=True)
settings.load_profile("ci")

import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops every compiled program after each test module.  Each XLA:CPU executable holds about
    a dozen memory mappings, and a worker process that keeps the thousands a whole suite compiles
    passes Linux's ``vm.max_map_count`` (65,530): the next compile's mmap fails and LLVM
    segfaults, killing the worker.  Modules rarely share programs, so little is recompiled."""
    yield
    jax.clear_caches()
    gc.collect()
