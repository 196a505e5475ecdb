"""Orbax checkpoints of the train state and the data-iterator state, saved together.

Saves are asynchronous (training continues while files are written) and atomic: orbax writes to a
temporary directory and renames it on completion, so a process killed mid-save (SIGKILL included)
leaves the previous checkpoint as the latest valid one.
"""
from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """``CheckpointManager`` holding ``state`` (a pytree) and ``data`` (a JSON-able iterator state)."""

    def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True):
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                               enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(os.path.abspath(directory), options=options,
                                             item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_state) -> None:
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        data=ocp.args.JsonSave(data_state)))

    def restore(self, step: int, abstract_state):
        """Restores ``(state, data_state)``; arrays land with ``abstract_state``'s shardings."""
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
        return restored["state"], restored["data"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
