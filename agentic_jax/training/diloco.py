"""DiLoCo: data parallelism that communicates every H steps instead of every step.

Douillard et al. 2023, "DiLoCo: distributed low-communication training of language models".
``M`` replicas start from the global parameters ``theta``; each takes ``H`` steps of its own
inner optimiser (AdamW by default: the gin-configured ``make_optimizer``) on its own shard of
every batch.  Then the *outer gradient*, the mean over replicas of how far each moved,

    Delta = (1 / M) sum_m (theta - theta_m),

is applied to ``theta`` by the outer optimiser, Nesterov SGD (the paper's lr 0.7, momentum
0.9), and every replica restarts from the new ``theta`` (keeping its inner optimiser state).
Replicas exchange one parameter-sized message per ``H`` steps where synchronous data
parallelism exchanges one per step: communication drops by ``H``.  With ``H = 1``, a plain SGD
inner optimiser and SGD(lr = 1) outside, one outer step is one step of synchronous data
parallelism (the mean of the replicas' SGD steps is the SGD step of the mean gradient).

The outer gradient can also be compressed before it is sent (as Streaming DiLoCo, Douillard et
al. 2025, quantises it), each replica compressing its own ``theta - theta_m``:

* ``int8``: per-tensor absmax quantisation, ``q = round(127 x / max|x|)``, one byte per value
  plus a float32 scale per tensor: about 4 times fewer bytes than float32;
* ``topk``: the ``topk_fraction`` largest-magnitude entries of each tensor, sent as (float32
  value, int32 index) pairs: ``1 / (2 topk_fraction)`` times fewer bytes.

With ``error_feedback`` each replica keeps what compression dropped and adds it to its next
outer gradient (Seide et al. 2014, 1-bit SGD; Karimireddy et al. 2019, EF-SGD): the error
stays bounded, so the sum of what was sent tracks the sum of the true outer gradients and
nothing is lost for good, only delayed.

:func:`bytes_per_outer_step` counts what the replicas send each outer step (each replica's
compressed outer gradient; the broadcast of ``theta`` back is the same size again for an
all-reduce and is not counted twice); the step's metrics carry ``comm_bytes`` (this step) and
``comm_bytes_total``.

The replicas are one leading ``[M]`` axis on every array of their train states.  On a mesh whose
``data`` axis divides ``M``, the training loop lays that axis over ``data``
(:meth:`DiLoCo.state_shardings`) and the step runs in ``jax.shard_map`` over ``data``: each
device ``vmap``s the inner steps of its own replicas with no communication, and the outer step's
average is one explicit ``psum`` over ``data``.  Without one, the same code runs every replica
side by side on each device (the ``psum`` is then the local sum).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.struct
import gin
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from agentic_jax.training import distributed
from agentic_jax.training.state import TrainState
from sharding.mesh import active_axis_size

COMPRESSIONS = ("none", "int8", "topk")
INDEX_BYTES = 4  # an int32 position per value kept by top-k
SCALE_BYTES = 4  # a float32 scale per tensor quantised to int8


def int8_roundtrip(x):
    """``x`` quantised to int8 with one absmax scale and decoded back: what the receiver sees."""
    scale = jnp.max(jnp.abs(x)) / 127.0
    safe = jnp.where(scale > 0, scale, 1.0)
    return (jnp.clip(jnp.round(x / safe), -127, 127) * safe).astype(x.dtype)


def topk_count(size: int, fraction: float) -> int:
    """How many entries of a tensor of ``size`` values top-k keeps (at least one)."""
    return max(1, math.ceil(fraction * size))


def topk_roundtrip(x, fraction: float):
    """``x`` with all but its ``topk_count`` largest-magnitude entries zeroed."""
    flat = x.reshape(-1)
    _, index = jax.lax.top_k(jnp.abs(flat), topk_count(flat.size, fraction))
    return jnp.zeros_like(flat).at[index].set(flat[index]).reshape(x.shape)


@flax.struct.dataclass
class DiLoCoState:
    """The global parameters (``params``, what evaluation and saving read), the outer
    optimiser's state, the replicas' train states (leading ``[M]`` axis), the replicas'
    compression residuals (None without error feedback) and the outer steps taken."""

    params: dict
    outer_opt_state: optax.OptState
    replicas: TrainState
    error: dict | None
    outer_steps: jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DiLoCo:
    """DiLoCo's settings (see the module docstring); ``train.diloco = @DiLoCo()`` in gin."""

    replicas: int = 2
    inner_steps: int = 50
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    compression: str = "none"
    topk_fraction: float = 0.01
    error_feedback: bool = True

    def __post_init__(self):
        if self.replicas < 1 or self.inner_steps < 1:
            raise ValueError(
                f"DiLoCo.replicas={self.replicas} and inner_steps={self.inner_steps} must be >= 1"
            )
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"DiLoCo.compression={self.compression!r}; expected {COMPRESSIONS}")
        if not 0 < self.topk_fraction <= 1:
            raise ValueError(f"DiLoCo.topk_fraction={self.topk_fraction} must be in (0, 1]")

    @property
    def keeps_error(self) -> bool:
        return self.compression != "none" and self.error_feedback

    def outer_optimizer(self) -> optax.GradientTransformation:
        return optax.sgd(
            self.outer_lr, momentum=self.outer_momentum or None, nesterov=self.nesterov
        )

    def compress(self, x):
        """What a receiver decodes of the tensor ``x`` a replica sends."""
        if self.compression == "int8":
            return int8_roundtrip(x)
        if self.compression == "topk":
            return topk_roundtrip(x, self.topk_fraction)
        return x

    def message_bytes(self, x) -> int:
        """Bytes one replica sends for the tensor ``x`` (an array or ``ShapeDtypeStruct``)."""
        size, itemsize = math.prod(x.shape), jnp.dtype(x.dtype).itemsize
        if self.compression == "int8":
            return size + SCALE_BYTES
        if self.compression == "topk":
            return topk_count(size, self.topk_fraction) * (itemsize + INDEX_BYTES)
        return size * itemsize

    def create(self, params, inner_optimizer: optax.GradientTransformation, seed: int):
        """The state at step 0: every replica at ``params``, each with its own RNG stream."""

        def replica(index):
            state = TrainState.create(params, inner_optimizer, seed)
            key = jax.random.fold_in(jax.random.key(seed), index)
            return state.replace(rng=jax.random.key_data(key))

        replicas = jax.vmap(replica)(jnp.arange(self.replicas))
        return DiLoCoState(
            params=params,
            outer_opt_state=self.outer_optimizer().init(params),
            replicas=replicas,
            error=jax.tree.map(jnp.zeros_like, replicas.params) if self.keeps_error else None,
            outer_steps=jnp.zeros((), jnp.int32),
        )

    def outer_step(self, state: DiLoCoState, axis: str | None = None) -> DiLoCoState:
        """Averages the replicas' (compressed) moves, applies the outer optimiser, resets them.

        ``state.replicas`` holds this device's replicas; under ``shard_map`` the others are on
        the devices of mesh ``axis``, and the average is one ``psum`` over it."""
        delta = jax.tree.map(lambda g, r: g[None] - r, state.params, state.replicas.params)
        if state.error is not None:
            delta = jax.tree.map(jnp.add, delta, state.error)
        sent = jax.tree.map(jax.vmap(self.compress), delta)
        error = None if state.error is None else jax.tree.map(jnp.subtract, delta, sent)
        outer_grad = jax.tree.map(lambda s: self._replica_sum(s, axis) / self.replicas, sent)
        updates, outer_opt_state = self.outer_optimizer().update(
            outer_grad, state.outer_opt_state, state.params
        )
        params = optax.apply_updates(state.params, updates)
        replica_params = jax.tree.map(
            lambda p, r: jnp.broadcast_to(p, r.shape), params, state.replicas.params
        )
        return state.replace(
            params=params,
            outer_opt_state=outer_opt_state,
            replicas=state.replicas.replace(params=replica_params),
            error=error,
            outer_steps=state.outer_steps + 1,
        )

    @staticmethod
    def _replica_sum(x, axis: str | None):
        """The sum over every replica of ``x [local replicas, ...]``: this device's, then all's."""
        local = jnp.sum(x, axis=0)
        return local if axis is None else jax.lax.psum(local, axis)

    def wrap_step(self, inner_step, params_like):
        """``step(state, batch) -> (state, metrics)`` from a one-replica ``inner_step`` (e.g.
        ``make_train_step``'s): every replica steps on its ``1 / M`` of the batch's rows, and
        every ``inner_steps``-th step ends with :meth:`outer_step`.  ``params_like`` (arrays or
        shapes) sizes the bandwidth counter.  Not yet jitted.

        Under a mesh whose ``data`` axis divides the replicas, the replicas run in
        ``jax.shard_map`` over ``data``: each device takes its inner steps on its own replicas
        (``vmap``) without communicating, and the outer step's average is an explicit ``psum``
        over ``data``.  Otherwise the same code runs on all the replicas at once."""
        per_outer_step = bytes_per_outer_step(self, params_like)

        def local(state: DiLoCoState, rows, sync, axis):
            replicas, metrics = jax.vmap(inner_step)(state.replicas, rows)
            state = state.replace(replicas=replicas)
            outer = functools.partial(self.outer_step, axis=axis)
            state = jax.lax.cond(sync, outer, lambda s: s, state)
            metrics = {
                k: self._replica_sum(v, axis) / (1 if k == "tokens" else self.replicas)
                for k, v in metrics.items()
            }
            return state, metrics

        def step(state: DiLoCoState, batch):
            (n,) = {x.shape[0] for x in jax.tree.leaves(batch)}
            if n % self.replicas:
                raise ValueError(
                    f"a batch of {n} rows does not split over {self.replicas} replicas"
                )
            rows = jax.tree.map(
                lambda x: x.reshape(self.replicas, x.shape[0] // self.replicas, *x.shape[1:]),
                batch,
            )
            sync = (state.replicas.step[0] + 1) % self.inner_steps == 0
            if replica_axis(self.replicas) is None:
                state, metrics = local(state, rows, sync, None)
            else:
                split = PartitionSpec("data")
                replicated = PartitionSpec()
                specs = DiLoCoState(
                    replicated,
                    replicated,
                    split,
                    None if state.error is None else split,
                    replicated,
                )
                state, metrics = jax.shard_map(
                    functools.partial(local, axis="data"),
                    in_specs=(specs, split, replicated),
                    out_specs=(specs, replicated),
                    axis_names={"data"},
                    # The inner step is any train step, written without varying-axis types.
                    check_vma=False,
                )(state, rows, sync)
            metrics["comm_bytes"] = jnp.where(sync, float(per_outer_step), 0.0)
            metrics["comm_bytes_total"] = state.outer_steps.astype(jnp.float32) * per_outer_step
            return state, metrics

        return step

    def state_shardings(self, abstract: DiLoCoState, config, inner_optimizer, mesh, rules):
        """Layouts of a :class:`DiLoCoState`: the global parameters and the outer optimiser's
        state as a train state's (by logical axes), the replicas' states and residuals likewise with the
        replica axis over ``data`` in front (replicated when ``data`` does not divide it)."""
        one = jax.eval_shape(lambda s: jax.tree.map(lambda x: x[0], s), abstract.replicas)
        inner = distributed.state_shardings(one, config, inner_optimizer, mesh, rules)
        # A train state of the global parameters and the outer optimiser (only those two are read).
        outer = distributed.state_shardings(
            TrainState(abstract.outer_steps, abstract.params, abstract.outer_opt_state, None),
            config,
            self.outer_optimizer(),
            mesh,
            rules,
        )
        data = replica_axis(self.replicas, mesh)

        def stacked(s: NamedSharding):
            return NamedSharding(mesh, PartitionSpec(data, *s.spec))

        replicas = jax.tree.map(stacked, inner)
        replicated = NamedSharding(mesh, PartitionSpec())
        return DiLoCoState(
            params=outer.params,
            outer_opt_state=outer.opt_state,
            replicas=replicas,
            error=None if abstract.error is None else replicas.params,
            outer_steps=replicated,
        )


def replica_axis(replicas: int, mesh=None) -> str | None:
    """``"data"`` when the replicas lay over the ``data`` axis of ``mesh`` (default: the active
    one) of more than one device, which divides them; else None (all on every device)."""
    size = active_axis_size("data", mesh)
    return "data" if size > 1 and replicas % size == 0 else None


def bytes_per_outer_step(diloco: DiLoCo, params_like) -> int:
    """Bytes the ``M`` replicas send in one outer step: each its compressed outer gradient."""
    return diloco.replicas * sum(diloco.message_bytes(x) for x in jax.tree.leaves(params_like))


def data_parallel_bytes_per_step(replicas: int, params_like) -> int:
    """What synchronous data parallelism sends per step, counted the same way: each replica its
    full-precision gradient.  DiLoCo without compression sends this once per ``H`` steps."""
    return bytes_per_outer_step(DiLoCo(replicas=replicas), params_like)
