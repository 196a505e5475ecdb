"""Test setup: 8 fake CPU devices, so sharding code runs as it would on a slice."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", False)

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=10, deadline=None, derandomize=True)
settings.load_profile("ci")
