"""Training across devices and processes: where the train state and batches live, and how a
process joins a multi-host job.

The layout is derived once, from the logical-axis rules (:mod:`sharding`), and used by the
training loop, the tests and checkpoint restores alike:

* parameters by their logical axes (``embed`` on ``fsdp`` is ZeRO-3: every device keeps a slice,
  and the step gathers each layer's weights just before using them);
* optimiser moments exactly like their parameters, so they are never gathered, and gradients end
  up with the same layout (XLA reduce-scatters them) because the update combines them elementwise;
* batches split over ``data`` x ``fsdp`` (rows) and ``sequence`` (positions).

Several processes (one per host, or per GPU) form one job through ``jax.distributed``; each
feeds its own rows of every global batch (``jax.make_array_from_process_local_data``) and the
mesh spans all processes' devices.
"""

from __future__ import annotations

import os

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

import sharding
from agentic_jax.models import TransformerConfig, param_axes
from agentic_jax.training.state import TrainState

BATCH_AXES = ("activation_batch", "activation_length")

# Read when the corresponding argument is not given; JAX itself reads JAX_COORDINATOR_ADDRESS too.
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:  # int()'s own message would not say which variable is wrong
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto_detect: bool = False,
) -> bool:
    """Joins a multi-process JAX job; a no-op (returning False) for a single process.

    Each argument defaults to its environment variable (``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``).  With none of them set, nothing happens unless
    ``auto_detect``: then ``jax.distributed.initialize()`` finds all three from the cluster
    (Cloud TPU pod slices, SLURM, Open MPI, Kubernetes), which is how a TPU pod runs the same
    command on every host.  ``num_processes == 1`` is a single process too.

    Must run before anything touches a JAX backend (``jax.devices()``, any computation):
    ``jax.distributed.initialize`` fails afterwards, because the backend is created knowing its
    peers.  Calling it again once initialised does nothing, so notebooks may rerun a cell.
    """
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    num_processes = _env_int(ENV_NUM_PROCESSES) if num_processes is None else num_processes
    process_id = _env_int(ENV_PROCESS_ID) if process_id is None else process_id
    if jax.distributed.is_initialized():
        return True
    given = (coordinator_address, num_processes, process_id)
    if num_processes == 1 or (not auto_detect and given == (None, None, None)):
        return False
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
    return True


def state_shardings(
    abstract_state: TrainState,
    config: TransformerConfig,
    optimizer: optax.GradientTransformation,
    mesh,
    rules,
) -> TrainState:
    """``NamedSharding``s for the whole train state: parameters by their logical axes, optimiser
    moments like their parameters, scalars (step, RNG, schedule counts) replicated.

    ``abstract_state`` is the state's ``jax.eval_shape``; the result, paired with it, is also
    the restore target that makes orbax load a checkpoint straight into this layout.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    params = sharding.logical_to_sharding(
        param_axes(config), mesh, rules, shapes=abstract_state.params
    )
    # A partitioned optimiser (``optax.multi_transform``: Muon and AdamW) holds each moment tree
    # with ``MaskedNode`` where the other partition's parameters are; those stay as they are.
    masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    opt = optax.tree_map_params(
        optimizer,
        lambda x, s: x if masked(x) else s,
        abstract_state.opt_state,
        params,
        transform_non_params=lambda _: replicated,
        is_leaf=masked,
    )
    loss_scale = jax.tree.map(lambda _: replicated, abstract_state.loss_scale)
    return TrainState(
        step=replicated, params=params, opt_state=opt, rng=replicated, loss_scale=loss_scale
    )


def abstract_with_shardings(abstract_state, shardings):
    """``ShapeDtypeStruct``s carrying ``shardings``: a restore target or a ``lower()`` argument."""
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings
    )


def batch_sharding(mesh, rules) -> NamedSharding:
    """Layout of a global ``[batch, length]`` array of the step's inputs."""
    return NamedSharding(mesh, sharding.logical_to_spec(BATCH_AXES, rules, mesh))


def jit_train_step(step, shardings: TrainState, batch_layout: NamedSharding):
    """``jax.jit(step)`` taking and returning the state laid out by ``shardings``, metrics replicated.

    Pinning the output layout to the input one keeps the state where it belongs from step to step
    (nothing is resharded between calls) and lets XLA reuse the donated input buffers for the
    new state, so a step holds one copy of parameters and optimiser state, not two.
    """
    replicated = NamedSharding(batch_layout.mesh, PartitionSpec())
    return jax.jit(
        step,
        in_shardings=(shardings, batch_layout),
        out_shardings=(shardings, replicated),
        donate_argnums=0,
    )
