"""Observation and action spaces: static descriptions with `sample` / `contains`.

Spaces are plain Python objects (not pytrees): shapes and bounds are known at
trace time, which is what keeps an environment step at static shapes.
`sample(key)` and `contains(x)` are jittable.
"""

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class Space:
    """A set of arrays of one `shape` and `dtype`."""

    shape: tuple[int, ...] = ()
    dtype: jnp.dtype = jnp.float32

    def sample(self, key: jax.Array) -> jax.Array:
        raise NotImplementedError

    def contains(self, x) -> jax.Array:
        raise NotImplementedError


class Discrete(Space):
    """Integers {0, …, n − 1} (a scalar)."""

    def __init__(self, n: int, dtype=jnp.int32):
        if n < 1:
            raise ValueError(f"Discrete needs n >= 1, got {n}")
        self.n, self.shape, self.dtype = int(n), (), jnp.dtype(dtype)

    def sample(self, key):
        return jax.random.randint(key, (), 0, self.n, dtype=self.dtype)

    def contains(self, x):
        x = jnp.asarray(x)
        if x.shape != ():
            return jnp.bool_(False)
        return (x >= 0) & (x < self.n)

    def __repr__(self):
        return f"Discrete({self.n})"


class MultiDiscrete(Space):
    """Integer vectors with `0 <= x[i] < nvec[i]` (any shape of `nvec`)."""

    def __init__(self, nvec, dtype=jnp.int32):
        self.nvec = np.asarray(nvec, np.int64)
        if self.nvec.size == 0 or np.any(self.nvec < 1):
            raise ValueError(f"MultiDiscrete needs a non-empty nvec >= 1, got {nvec}")
        self.shape, self.dtype = self.nvec.shape, jnp.dtype(dtype)

    def sample(self, key):
        return jax.random.randint(
            key, self.shape, 0, jnp.asarray(self.nvec, self.dtype), dtype=self.dtype
        )

    def contains(self, x):
        x = jnp.asarray(x)
        if x.shape != self.shape:
            return jnp.bool_(False)
        return jnp.all((x >= 0) & (x < jnp.asarray(self.nvec)))

    def __repr__(self):
        return f"MultiDiscrete({self.nvec.tolist()})"


class Tokens(MultiDiscrete):
    """A fixed-length token sequence `[length]` over a vocabulary of `vocab_size` ids.

    Variable-length text is padded to `length` (with `pad_id`) so that the
    shape stays static; carry the true length or a mask next to it.
    """

    def __init__(self, vocab_size: int, length: int, pad_id: int = 0, dtype=jnp.int32):
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id {pad_id} is outside the vocabulary [0, {vocab_size})")
        super().__init__(np.full((length,), vocab_size), dtype)
        self.vocab_size, self.length, self.pad_id = int(vocab_size), int(length), int(pad_id)

    def __repr__(self):
        return f"Tokens(vocab_size={self.vocab_size}, length={self.length})"


class Box(Space):
    """Real (or integer) arrays with elementwise bounds `low <= x <= high`."""

    def __init__(self, low, high, shape: Sequence[int] = (), dtype=jnp.float32):
        self.shape, self.dtype = tuple(int(d) for d in shape), jnp.dtype(dtype)
        self.low = np.broadcast_to(np.asarray(low, np.float64), self.shape)
        self.high = np.broadcast_to(np.asarray(high, np.float64), self.shape)
        if np.any(self.low > self.high):
            raise ValueError("Box needs low <= high")

    def sample(self, key):
        """Uniform where both bounds are finite; a standard normal clipped to the bounds elsewhere."""
        low, high = jnp.asarray(self.low, jnp.float32), jnp.asarray(self.high, jnp.float32)
        bounded = jnp.isfinite(low) & jnp.isfinite(high)
        key_uniform, key_normal = jax.random.split(key)
        uniform = jax.random.uniform(
            key_uniform,
            self.shape,
            jnp.float32,
            jnp.where(bounded, low, 0.0),
            jnp.where(bounded, high, 1.0),
        )
        normal = jax.random.normal(key_normal, self.shape, jnp.float32)
        x = jnp.where(bounded, uniform, jnp.clip(normal, low, high))
        discrete = jnp.issubdtype(self.dtype, jnp.integer) or self.dtype == jnp.bool_
        return (jnp.round(x) if discrete else x).astype(self.dtype)

    def contains(self, x):
        x = jnp.asarray(x)
        if x.shape != self.shape:
            return jnp.bool_(False)
        return jnp.all((x >= self.low) & (x <= self.high))

    def __repr__(self):
        return f"Box(shape={self.shape}, dtype={self.dtype.name})"


class Dict(Space):
    """A mapping of named spaces (observations such as {"tokens", "mask"})."""

    def __init__(self, spaces: Mapping[str, Space]):
        self.spaces = dict(spaces)
        self.shape = {name: space.shape for name, space in self.spaces.items()}
        self.dtype = {name: space.dtype for name, space in self.spaces.items()}

    def sample(self, key):
        keys = jax.random.split(key, len(self.spaces))
        return {
            name: space.sample(k)
            for (name, space), k in zip(self.spaces.items(), keys, strict=True)
        }

    def contains(self, x):
        if not isinstance(x, Mapping) or set(x) != set(self.spaces):
            return jnp.asarray(False)
        return jnp.all(
            jnp.stack([jnp.asarray(space.contains(x[name])) for name, space in self.spaces.items()])
        )

    def __repr__(self):
        return f"Dict({self.spaces})"
