"""`LossOutput`: a loss as (total, count, metrics), never as a pre-divided mean.

A mean of means is not the mean of the whole batch. Keeping the numerator and
the denominator apart means that micro-batches (gradient accumulation) and
data-parallel shards reduce *exactly*: sum the totals, sum the counts, divide
once. Metrics follow the same rule: they are sums over valid tokens (with the
token count under "tokens"), except keys ending in "_min" / "_max", which
reduce by min / max.
"""

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.rl.numerics import safe_div


class LossOutput(NamedTuple):
    """A reducible loss: `value == total / count` (0 when nothing is counted)."""

    total: jax.Array
    count: jax.Array
    metrics: dict[str, jax.Array]

    @property
    def value(self) -> jax.Array:
        return safe_div(self.total, self.count)

    def metric_means(self) -> dict[str, jax.Array]:
        """Per-token means of the summed metrics; min/max metrics unchanged."""
        tokens = self.metrics["tokens"]

        def mean(key, value):
            if key == "tokens" or _reduction(key) is not jnp.add:
                return value
            return safe_div(value, tokens)

        return {key: mean(key, value) for key, value in self.metrics.items()}


def _reduction(key: str):
    if key.endswith("_max"):
        return jnp.maximum
    if key.endswith("_min"):
        return jnp.minimum
    return jnp.add


def combine_outputs(outputs: Sequence[LossOutput]) -> LossOutput:
    """Reduces the outputs of micro-batches of one batch, exactly."""
    if not outputs:
        raise ValueError("outputs must be a non-empty sequence of LossOutput")
    first, *rest = outputs
    total, count, metrics = first.total, first.count, dict(first.metrics)
    for out in rest:
        if out.metrics.keys() != metrics.keys():
            raise ValueError(
                f"outputs have different metric keys: {sorted(metrics)} vs {sorted(out.metrics)}"
            )
        total, count = total + out.total, count + out.count
        metrics = {key: _reduction(key)(metrics[key], out.metrics[key]) for key in metrics}
    return LossOutput(total, count, metrics)


def psum_output(output: LossOutput, axis_name) -> LossOutput:
    """Reduces a LossOutput over a mapped axis (inside `jax.shard_map` or `pmap`)."""
    collective = {jnp.add: jax.lax.psum, jnp.maximum: jax.lax.pmax, jnp.minimum: jax.lax.pmin}
    metrics = {
        key: collective[_reduction(key)](value, axis_name) for key, value in output.metrics.items()
    }
    return LossOutput(
        jax.lax.psum(output.total, axis_name), jax.lax.psum(output.count, axis_name), metrics
    )
