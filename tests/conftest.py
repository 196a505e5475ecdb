"""Test setup: 8 fake CPU devices, so sharding code runs as it would on a slice.

The suite is bound by XLA compile time, not run time, so LLVM's code-generation optimisations
are off by default (``JAX_DISABLE_MOST_OPTIMIZATIONS=1``, inherited by the subprocesses that
tests start).  That flag keeps every HLO pass (fusion, buffer assignment), so compiled memory
analysis is unchanged; it saves about a third of the suite's time.  Set it to 0 to test the
fully optimised code.

Compiled programs also go to a persistent cache shared by the workers and by the subprocesses
tests start (``JAX_COMPILATION_CACHE_DIR``, one directory per user under the temp dir; delete it
freely): many tests compile the same tiny model's programs through jit objects of their own, and
the cache compiles each once.  Its key is the program, the flags and the versions, so a stale
entry is never hit.  It has no size limit: with one, every write lists the whole directory under
a lock to evict, which costs more than the cache saves.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"agentic-jax-xla-cache-{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
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
