"""A post-training run's work directory: configs, checkpoints with metadata, metrics, the model.

Every trainer writes the same layout::

    config.gin, operative_config.gin   the gin config as parsed and as used
    checkpoints/<step>/                orbax: ``state`` (a pytree: params or adapters, optimizer
                                       state, step, RNG, iterator positions) + ``meta`` (JSON:
                                       e.g. the reference model's fingerprint)
    metrics.jsonl                      one record per step (``MetricsLog``: restarts drop the
                                       records written after the checkpoint they resume from)
    model/ (+ tokenizer.json)          the final model, loadable with ``models.export.load_checkpoint``

Checkpoint saves are atomic (orbax renames a finished temporary directory), so a run killed at
any moment resumes from its last complete checkpoint and, with everything random derived from
the stored RNG and step, repeats exactly the steps an uninterrupted run would have taken.
"""

from __future__ import annotations

import os
import shutil

import jax
import orbax.checkpoint as ocp

from agentic_jax import config as gin_config
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.models import TransformerConfig
from agentic_jax.models.export import save_model
from agentic_jax.models.hf_serving_files import (
    TOKENIZER_CONFIG_FILE,
    tokenizer_config,
    write_serving_files,
)
from agentic_jax.post_training.common import on_device
from agentic_jax.training.metrics import MetricsLog


class TrainerRun:
    """Checkpoints and records of one trainer run in ``workdir`` (see the module docstring)."""

    def __init__(self, workdir: str, *, keep_checkpoints: int = 2):
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        gin_config.save_config(self.workdir, operative=False)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep_checkpoints, create=True, enable_async_checkpointing=False
        )
        self.manager = ocp.CheckpointManager(
            os.path.join(self.workdir, "checkpoints"), options=options, item_names=("state", "meta")
        )
        self.log: MetricsLog | None = None

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def start(self, state, meta: dict | None = None):
        """``(state, meta, step)``: the latest checkpoint's, or the given fresh ones at step 0.

        ``meta`` entries present in both must agree (a resumed run must train the same thing:
        e.g. the same reference model), else ``ValueError``.  Opens the metrics log.  The state
        comes back committed to the default device (``common.on_device``).
        """
        step = self.latest_step()
        meta = dict(meta or {})
        if step is None:
            self.log = MetricsLog(self.path("metrics.jsonl"), resume_step=0)
            return on_device(state), meta, 0
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
            ),
        )
        saved = restored["meta"]
        clash = {k: (saved[k], v) for k, v in meta.items() if k in saved and saved[k] != v}
        if clash:
            raise ValueError(
                f"{self.workdir} holds a run with different settings {clash} (saved, now); "
                "use a new workdir or restore the original settings"
            )
        self.log = MetricsLog(self.path("metrics.jsonl"), resume_step=step)
        print(f"resumed from step {step} in {self.workdir}", flush=True)
        return on_device(restored["state"]), {**meta, **saved}, step

    def save(self, step: int, state, meta: dict) -> None:
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
        )
        self.manager.wait_until_finished()

    def write(self, record: dict) -> None:
        self.log.write(record)

    def finish(self, config: TransformerConfig, params, tokenizer: Tokenizer | None = None) -> str:
        """Saves the final model under ``model/``, the tokenizer beside it (an imported one with
        its ``tokenizer_config.json``: special tokens, chat template) and the operative config."""
        gin_config.save_config(self.workdir, operative=True)
        model_dir = self.path("model")
        if os.path.exists(model_dir):
            shutil.rmtree(model_dir)
        save_model(model_dir, config, jax.device_get(params))
        if tokenizer is not None and tokenizer.chat_template is not None:
            # An imported model's tokenizer: its special tokens and chat template go along.
            configs = {TOKENIZER_CONFIG_FILE: tokenizer_config(tokenizer, config.max_seq_len)}
            write_serving_files(self.workdir, tokenizer, configs)
        elif tokenizer is not None:
            tokenizer.save(self.path("tokenizer.json"))
        self.manager.close()
        return model_dir
