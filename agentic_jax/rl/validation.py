"""Boundary checks shared by every loss: explicit errors instead of silent broadcasting.

Shapes are static under `jit`, so these checks cost nothing at run time; they
turn the classic "loss silently broadcast [B] against [B, 1]" bug into a
ValueError that names the argument and what was expected.
"""

from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp


def floating(name: str, x) -> jax.Array:
    """Returns `x` as float32, rejecting integer and boolean arrays."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    return x.astype(jnp.float32)


def mask(name: str, x) -> jax.Array:
    """Returns a 0/1 float32 mask; booleans, integers and floats are accepted."""
    x = jnp.asarray(x)
    if not (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.number)):
        raise ValueError(f"{name} must be a boolean or numeric mask, got dtype {x.dtype}")
    return x.astype(jnp.float32)


def numeric(name: str, x) -> jax.Array:
    """Returns an integer or floating array (counts, lengths) as float32."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.number):
        raise ValueError(f"{name} must be an integer or floating-point array, got dtype {x.dtype}")
    return x.astype(jnp.float32)


def integer(name: str, x) -> jax.Array:
    """Returns `x` as int32 (indices, segment ids, actions)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {x.dtype}")
    return x.astype(jnp.int32)


def shape(name: str, x: jax.Array, expected: Sequence[int]) -> jax.Array:
    """Raises unless `x.shape == expected`."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(x.shape)}")
    return x


def rank(name: str, x: jax.Array, ndim: int) -> jax.Array:
    """Raises unless `x` has exactly `ndim` dimensions."""
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    return x


def choice(name: str, value: str, valid: Iterable[str]) -> str:
    """Raises for an unknown option, listing the valid ones."""
    valid = tuple(valid)
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid values: {', '.join(valid)}")
    return value


def required(name: str, x, reason: str):
    """Raises when an optional argument is needed by the chosen variant."""
    if x is None:
        raise ValueError(f"{name} is required {reason}")
    return x


def static_range(name: str, value, low: float, high: float, *, low_open=False, high_open=False):
    """Checks a hyperparameter's range when it is a Python number (traced values pass)."""
    if isinstance(value, (int, float)):
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if too_low or too_high:
            left, right = "(" if low_open else "[", ")" if high_open else "]"
            raise ValueError(f"{name} must lie in {left}{low}, {high}{right}, got {value}")
    return value


def stream(**arrays) -> list[jax.Array]:
    """float32 1-D arrays of one common length (a single time-indexed stream), named if not."""
    out = [rank(name, floating(name, x), 1) for name, x in arrays.items()]
    for name, x in zip(arrays, out, strict=True):
        shape(name, x, out[0].shape)
    return out


def per_step(name: str, x, length: int) -> jax.Array:
    """A scalar or [T] float parameter (λ), broadcast to [T]; integers (``1``) count as floats."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.integer):
        x = x.astype(jnp.float32)
    x = floating(name, x)
    if x.ndim:
        shape(name, x, (length,))
    return jnp.broadcast_to(x, (length,))
