"""A fixed-capacity replay buffer in `jnp`: uniform and prioritised sampling.

The buffer is a pytree (a ring of `capacity` transitions, a write position,
a size and one priority per slot), so adding and sampling happen inside a
jitted training loop. Prioritised sampling draws slot i with probability
P(i) = p_i^α / Σ_k p_k^α by inverting the cumulative sum at stratified
uniforms (one search per sample, O(capacity) per batch: a sum-tree's
O(log n) pays off only for much larger buffers), and corrects the bias with
importance weights w_i = (size·P(i))^−β divided by the largest weight in the
batch (as Dopamine does; the paper divides by the largest over the whole
buffer, which also scales every update down but lets one near-zero priority
shrink all of them).
Lin (1992), experience replay; Mnih et al. (2015), "Human-level control
through deep RL"; Schaul et al. (2016), "Prioritized Experience Replay",
arXiv:1511.05952.
"""

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ReplayBuffer:
    data: dict
    priorities: jax.Array  # [capacity]; 0 marks an empty slot
    position: jax.Array
    size: jax.Array


def buffer_init(example: dict, capacity: int) -> ReplayBuffer:
    """An empty buffer for items shaped like `example` (one transition, no batch axis)."""
    data = jax.tree.map(
        lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example
    )
    return ReplayBuffer(data, jnp.zeros((capacity,), jnp.float32), jnp.int32(0), jnp.int32(0))


def buffer_add(buffer: ReplayBuffer, batch: dict) -> ReplayBuffer:
    """Writes a batch [B, ...] at the ring position (overwriting the oldest items).

    New items get the current maximum priority (1 for an empty buffer), so
    every transition is replayed at least once with high probability.
    """
    capacity = buffer.priorities.shape[0]
    num = jax.tree.leaves(batch)[0].shape[0]
    if num > capacity:  # slots would repeat, and which duplicate write lands is unspecified
        raise ValueError(f"cannot add a batch of {num} items to a buffer of capacity {capacity}")
    slots = (buffer.position + jnp.arange(num)) % capacity
    data = jax.tree.map(lambda store, x: store.at[slots].set(x), buffer.data, batch)
    priority = jnp.maximum(jnp.max(buffer.priorities), 1.0)
    return ReplayBuffer(
        data,
        buffer.priorities.at[slots].set(priority),
        (buffer.position + num) % capacity,
        jnp.minimum(buffer.size + num, capacity),
    )


def sample_uniform(buffer: ReplayBuffer, key: jax.Array, batch_size: int):
    """(batch, slots) drawn uniformly, with replacement, from the filled slots."""
    slots = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer.size, 1))
    return jax.tree.map(lambda store: store[slots], buffer.data), slots


def sample_prioritized(
    buffer: ReplayBuffer, key: jax.Array, batch_size: int, alpha: float, beta: float
):
    """(batch, slots, importance weights) with P(i) ∝ p_i^α (stratified over the CDF)."""
    mass = jnp.where(buffer.priorities > 0, buffer.priorities**alpha, 0.0)
    cdf = jnp.cumsum(mass)
    total = cdf[-1]
    targets = (jnp.arange(batch_size) + jax.random.uniform(key, (batch_size,))) / batch_size * total
    slots = jnp.minimum(
        jnp.searchsorted(cdf, targets, side="right"), jnp.maximum(buffer.size, 1) - 1
    )
    probs = mass[slots] / total
    weights = (buffer.size * probs) ** (-beta)
    return jax.tree.map(lambda store: store[slots], buffer.data), slots, weights / jnp.max(weights)


def update_priorities(
    buffer: ReplayBuffer, slots: jax.Array, priorities: jax.Array, eps: float = 1e-6
) -> ReplayBuffer:
    """Sets p_i = |δ_i| + eps for the replayed slots."""
    return buffer.replace(priorities=buffer.priorities.at[slots].set(jnp.abs(priorities) + eps))
