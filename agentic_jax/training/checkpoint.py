"""Orbax checkpoints of the train state and the data-iterator state, saved together.

Saves are asynchronous (training continues while files are written) and atomic: orbax writes to a
temporary directory and renames it on completion, so a process killed mid-save (SIGKILL included)
leaves the previous checkpoint as the latest valid one.
"""

from __future__ import annotations

import json
import os

import grain.checkpoint
import jax
import orbax.checkpoint as ocp


class _IteratorSnapshot:
    """A data-iterator state frozen at save time, in the form grain's orbax handler writes.

    Handing grain the live iterator would let it read the position whenever the (asynchronous)
    save runs, after training has moved on; the snapshot pins it to the checkpoint's step.
    """

    def __init__(self, state: dict):
        self._state = json.dumps(state, indent=4).encode()

    def get_state(self) -> bytes:
        return self._state


class Checkpointer:
    """``CheckpointManager`` holding ``state`` (a pytree) and ``data`` (the data iterator's position).

    The data item is written by grain's handler, one file per process, so every host of a
    multi-host run resumes its own shard of the input stream.
    """

    def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True):
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        self.manager = ocp.CheckpointManager(
            os.path.abspath(directory), options=options, item_names=("state", "data")
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iterator) -> None:
        snapshot = _IteratorSnapshot(data_iterator.get_state())
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(snapshot)
            ),
        )

    def restore(self, step: int, abstract_state, data_iterator):
        """Restores the state (arrays land with ``abstract_state``'s shardings) and moves
        ``data_iterator`` to the saved position."""
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target),
                data=grain.checkpoint.CheckpointRestore(data_iterator),
            ),
        )
        return restored["state"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
