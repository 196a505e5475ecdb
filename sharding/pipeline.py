"""Pipeline parallelism: a model's layers split into stages over the ``stage`` mesh axis.

Stage ``s`` of ``p`` holds layers ``[s L/p, (s+1) L/p)`` (the rule ``("layers", "stage")``), and a
batch is cut into ``m`` micro-batches that flow through the stages: activations forward to the
next stage, their gradients back to the previous one, each a collective permute
(``jax.lax.ppermute``) between neighbours inside one ``jax.shard_map`` over ``stage`` (the other
mesh axes stay automatic, so data, FSDP and tensor parallelism compose with it).

A *schedule* orders each stage's forward (F) and backward (B) passes over the micro-batches:

* **GPipe** (Huang et al. 2019): all forwards, then all backwards.  A stage keeps the input of
  every micro-batch until its backward: ``m`` stored activations.
* **1F1B** (PipeDream-Flush, Narayanan et al. 2021, "Memory-efficient pipeline-parallel DNN
  training"): stage ``s`` runs ``p - s - 1`` warm-up forwards, then alternates one forward with
  one backward, then drains the remaining backwards.  A micro-batch's backward starts as soon as
  the last stage has seen it, so stage ``s`` never holds more than ``p - s`` micro-batches: peak
  activation memory ``p`` micro-batches instead of ``m``, which lets ``m`` grow (and the bubble
  shrink) at constant memory.

Both do the same work in the same time: with F and B one unit each, the pipeline runs
``2 (m + p - 1)`` units of which each stage is busy ``2 m``, so the idle *bubble* fraction is

    bubble = (p - 1) / (m + p - 1)

for GPipe and 1F1B alike (1F1B's gain is memory; the interleaved variant of Narayanan et al.,
``v`` model chunks per device, divides the bubble by ``v``, which this module does not do).
:func:`bubble_fraction` is the formula, :attr:`Schedule.bubble` the idle share of a built
schedule's table, and :attr:`Schedule.slots` its peak stored micro-batches per stage.

Execution.  A schedule is simulated once in Python into static tables ``[ticks, stages]`` (which
pass, which micro-batch, which buffer slot, which slot receives from a neighbour); one ``scan``
over the ticks runs them, every device taking its own branch of a ``lax.switch``.  Each stage
stores only its *input* per micro-batch and recomputes its forward inside the backward (GPipe's
re-materialisation: the boundary activations are all a stage keeps).  The last stage's forward
is folded into its backward, which runs the stage and the loss under one ``jax.value_and_grad``.
The gradient is therefore produced by the forward computation itself: :func:`pipeline_loss`
wraps it in a ``jax.custom_vjp`` whose backward only scales the stored gradients, so
``jax.grad`` of a pipelined loss (``training.make_update``) runs the schedule exactly once.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from sharding.mesh import axis_sizes

SCHEDULES = ("gpipe", "1f1b")
IDLE, FORWARD, BACKWARD = 0, 1, 2


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle share ``(p - 1) / (m + p - 1)`` of a GPipe or 1F1B pipeline (see the module)."""
    if stages < 1 or microbatches < 1:
        raise ValueError(f"need stages >= 1 and microbatches >= 1; got {stages}, {microbatches}")
    return (stages - 1) / (microbatches + stages - 1)


def _stage_order(name: str, stage: int, stages: int, microbatches: int) -> list[tuple[int, int]]:
    """One stage's passes in order, ``(FORWARD | BACKWARD, micro-batch)``."""
    forwards = [(FORWARD, j) for j in range(microbatches)]
    if name == "gpipe":
        return forwards + [(BACKWARD, j) for j in reversed(range(microbatches))]
    warmup = min(stages - stage - 1, microbatches)
    order = forwards[:warmup]
    for j in range(microbatches - warmup):
        order += [forwards[warmup + j], (BACKWARD, j)]
    return order + [(BACKWARD, j) for j in range(microbatches - warmup, microbatches)]


@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compared and hashed by identity
class Schedule:
    """A pipeline schedule as static tables ``[ticks, stages]``.

    ``kind`` (IDLE / FORWARD / BACKWARD) and ``micro`` say what each stage does at each tick;
    ``slot`` is the buffer slot of that micro-batch's stored input (and incoming gradient);
    ``recv_fwd`` / ``recv_bwd`` the slot where the activation from the previous stage / the
    gradient from the next one, sent at this tick, lands (-1: nothing arrives).  ``slots`` is the
    peak number of micro-batches a stage holds at once (its activation memory).
    """

    name: str
    stages: int
    microbatches: int
    kind: np.ndarray
    micro: np.ndarray
    slot: np.ndarray
    recv_fwd: np.ndarray
    recv_bwd: np.ndarray
    slots: int

    @property
    def ticks(self) -> int:
        return self.kind.shape[0]

    @property
    def bubble(self) -> float:
        """The idle share of the stage-ticks of this table."""
        return float(np.mean(self.kind == IDLE))


@functools.lru_cache(maxsize=64)
def make_schedule(name: str, stages: int, microbatches: int) -> Schedule:
    """Simulates ``name`` (``gpipe`` | ``1f1b``) tick by tick: each stage runs its next pass as
    soon as its input is there (an activation or gradient sent at tick t is usable at t + 1), and
    a micro-batch holds a buffer slot on a stage from the arrival of its input to its backward."""
    if name not in SCHEDULES:
        raise ValueError(f"pipeline schedule {name!r}; expected one of {SCHEDULES}")
    bubble_fraction(stages, microbatches)  # validates the sizes
    p, m = stages, microbatches
    orders = [_stage_order(name, s, p, m) for s in range(p)]
    done = {}  # (kind, stage, micro) -> tick
    events = []  # (tick, stage, kind, micro)
    nxt, t = [0] * p, 0
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            if nxt[s] == len(orders[s]):
                continue
            kind, j = orders[s][nxt[s]]
            if kind == FORWARD:  # the previous stage's output (the first stage reads the data)
                needs = None if s == 0 else (FORWARD, s - 1, j)
            else:  # the next stage's input gradient (the last stage's own forward)
                needs = (FORWARD, s, j) if s == p - 1 else (BACKWARD, s + 1, j)
            if needs is None or done.get(needs, t) < t:
                done[(kind, s, j)] = t
                events.append((t, s, kind, j))
                nxt[s] += 1
        t += 1
    ticks = t
    slot_of, slots = {}, 1
    for s in range(p):
        arrival = {j: done[(FORWARD, s - 1 if s else s, j)] for j in range(m)}
        free_at: list[int] = []  # per slot, its occupant's backward tick (free from then on)
        for j in sorted(range(m), key=arrival.get):
            slot = next((i for i, f in enumerate(free_at) if f <= arrival[j]), len(free_at))
            free_at[slot : slot + 1] = [done[(BACKWARD, s, j)]]
            slot_of[(s, j)] = slot
        slots = max(slots, len(free_at))
    tables = {
        table: np.full((ticks, p), fill, np.int32)
        for table, fill in (
            ("kind", IDLE),
            ("micro", 0),
            ("slot", 0),
            ("recv_fwd", -1),
            ("recv_bwd", -1),
        )
    }
    for tick, s, kind, j in events:
        tables["kind"][tick, s], tables["micro"][tick, s] = kind, j
        tables["slot"][tick, s] = slot_of[(s, j)]
        if kind == FORWARD and s < p - 1:
            tables["recv_fwd"][tick, s + 1] = slot_of[(s + 1, j)]
        if kind == BACKWARD and s > 0:
            tables["recv_bwd"][tick, s - 1] = slot_of[(s - 1, j)]
    return Schedule(name, p, m, slots=slots, **tables)


def _store(buffer, value, slot):
    """``buffer`` with ``value`` written at ``slot``, unless ``slot`` is -1."""
    i = jnp.maximum(slot, 0)
    return jax.lax.dynamic_update_index_in_dim(buffer, jnp.where(slot >= 0, value, buffer[i]), i, 0)


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def _run(first_fn, stage_fn, last_fn, stage_params, shared, data, *, schedule, axis_name, mesh):
    """``((total, aux), (stage grads, shared grads))`` of the pipelined loss (see
    :func:`pipeline_loss`), every pass of ``schedule`` run in one ``shard_map`` over ``axis_name``."""
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            raise ValueError("the pipeline needs a mesh: pass mesh= or call it under jax.set_mesh")
    p = axis_sizes(mesh)[axis_name]
    m = {x.shape[0] for x in jax.tree.leaves(data)}
    if len(m) != 1:
        raise ValueError(f"data leaves disagree on the number of micro-batches: {sorted(m)}")
    layers = {x.shape[0] for x in jax.tree.leaves(stage_params)}
    if len(layers) != 1 or layers.pop() % p:
        raise ValueError(f"stage parameters need one leading layer axis divisible by {p} stages")
    plan = schedule if isinstance(schedule, Schedule) else make_schedule(schedule, p, m.pop())
    # The last stage's forward is part of its backward (stage and loss under one value_and_grad).
    op = np.where((plan.kind == FORWARD) & (np.arange(p) == p - 1), IDLE, plan.kind)
    tables = tuple(
        jnp.asarray(a) for a in (op, plan.micro, plan.slot, plan.recv_fwd, plan.recv_bwd)
    )
    fwd_perm = [(i, i + 1) for i in range(p - 1)]
    bwd_perm = [(i + 1, i) for i in range(p - 1)]

    def body(stage_params, shared, data):
        s = jax.lax.axis_index(axis_name)
        first, last = s == 0, s == p - 1

        def micro(j):
            return jax.tree.map(lambda a: a[j], data)

        x_like = jax.eval_shape(first_fn, shared, micro(0))
        x_zero = jnp.zeros(x_like.shape, x_like.dtype)
        result_zero = jax.tree.map(
            lambda a: jnp.zeros(a.shape, a.dtype),
            jax.eval_shape(lambda: last_fn(shared, first_fn(shared, micro(0)), micro(0))),
        )

        def stage(sp, sh, x_in, d):
            x = jax.lax.cond(first, lambda: first_fn(sh, d), lambda: x_in)
            return stage_fn(sp, x, d)

        def idle(carry, j, slot):
            return carry, x_zero, x_zero

        def forward(carry, j, slot):
            d = micro(j)
            return carry, stage(stage_params, shared, carry[0][slot], d), x_zero

        def backward(carry, j, slot):
            inputs, cots, g_stage, g_shared, out = carry
            d, dy = micro(j), cots[slot]

            def objective(sp, sh, x_in):
                y = stage(sp, sh, x_in, d)

                def loss():
                    result = last_fn(sh, y, d)
                    return result[0], result

                def pullback():  # d/dy of <y, dy> is dy: the chain rule from the next stage
                    return jnp.vdot(y.astype(jnp.float32), dy.astype(jnp.float32)), result_zero

                return jax.lax.cond(last, loss, pullback)

            (_, result), (gs, gsh, gx) = jax.value_and_grad(
                objective, argnums=(0, 1, 2), has_aux=True
            )(stage_params, shared, inputs[slot])
            carry = (inputs, cots, _add(g_stage, gs), _add(g_shared, gsh), _add(out, result))
            return carry, x_zero, gx.astype(x_zero.dtype)

        def tick(carry, row):
            kind, j, slot, recv_fwd, recv_bwd = (r[s] for r in row)
            carry, send_fwd, send_bwd = jax.lax.switch(
                kind, (idle, forward, backward), carry, j, slot
            )
            inputs, cots, *rest = carry
            inputs = _store(inputs, jax.lax.ppermute(send_fwd, axis_name, fwd_perm), recv_fwd)
            cots = _store(cots, jax.lax.ppermute(send_bwd, axis_name, bwd_perm), recv_bwd)
            return (inputs, cots, *rest), None

        buffers = jnp.zeros((plan.slots, *x_like.shape), x_like.dtype)
        zeros = functools.partial(jax.tree.map, jnp.zeros_like)
        init = (buffers, buffers, zeros(stage_params), zeros(shared), result_zero)
        (_, _, g_stage, g_shared, out), _ = jax.lax.scan(tick, init, tables)
        return jax.lax.psum((out, g_shared), axis_name), g_stage

    (out, g_shared), g_stage = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(PartitionSpec(axis_name), PartitionSpec(), PartitionSpec()),
        out_specs=((PartitionSpec(), PartitionSpec()), PartitionSpec(axis_name)),
        axis_names=frozenset({axis_name}),
        check_vma=False,
    )(stage_params, shared, data)
    return out, (g_stage, g_shared)


def pipeline_loss(first_fn, stage_fn, last_fn, *, schedule="1f1b", axis_name="stage", mesh=None):
    """``loss(stage_params, shared, data) -> (total, aux)``, pipelined over ``axis_name``.

    The value is ``sum_j last_fn(shared, stages(first_fn(shared, d_j)), d_j)`` over the
    micro-batches ``d_j`` (``data``'s leaves have a leading micro-batch axis), where ``stages``
    runs ``stage_fn(stage_slice, x, d)`` on each stage's slice of ``stage_params`` (leaves with a
    leading layer axis, split over the stages) in turn; ``last_fn`` returns ``(total, aux)`` and
    both are summed (``aux`` must therefore be sums, e.g. a token count).  ``shared`` (embedding,
    final norm, head) is whole on every stage: ``first_fn`` runs on the first, ``last_fn`` on the
    last.  ``schedule`` is ``gpipe``, ``1f1b`` or a :class:`Schedule`.

    Differentiable in ``stage_params`` and ``shared`` (``data`` gets no gradient): the schedule
    computes the gradient during the forward call, and the custom VJP scales it by the
    cotangent of ``total`` (the cotangent of ``aux`` is ignored, as ``has_aux`` does).
    """
    run = functools.partial(
        _run, first_fn, stage_fn, last_fn, schedule=schedule, axis_name=axis_name, mesh=mesh
    )

    @jax.custom_vjp
    def loss(stage_params, shared, data):
        return run(stage_params, shared, data)[0]

    def loss_bwd(grads, cotangent):
        g = cotangent[0]
        return (*jax.tree.map(lambda x: (x * g).astype(x.dtype), grads), None)

    loss.defvjp(run, loss_bwd)
    return loss
