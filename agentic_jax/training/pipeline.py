"""Pipeline-parallel pretraining: the transformer cut into the stages of ``sharding.pipeline``.

The first stage embeds, every stage runs its ``n_layers / p`` blocks, the last one applies the
final norm, the LM head and the cross-entropy; the ``stage`` mesh axis says how many stages there
are (``sharding.make_mesh.spec = {"stage": 4, "data": -1}``) and the rule ``("layers", "stage")``
already places each stage's layers on its devices.  :class:`Pipeline` is the train step's switch
(``make_train_step(..., pipeline=Pipeline("1f1b", 8))``; gin: ``train.pipeline = @Pipeline()``).
The loss and the gradient are those of the unpipelined step: the micro-batches' sums add up
before the one division by the token count (``training.update``).
"""

from __future__ import annotations

import dataclasses

import gin

from agentic_jax.models import TransformerConfig, logits_from_hidden, self_attention
from agentic_jax.models.rope import rope_tables
from agentic_jax.models.transformer import apply_layers, embed_tokens, final_norm
from agentic_jax.training.loss import cross_entropy
from agentic_jax.training.update import split_micro
from sharding.mesh import active_axis_size
from sharding.pipeline import SCHEDULES, bubble_fraction, pipeline_loss


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Pipeline:
    """Pipeline parallelism of the train step: each batch cut into ``microbatches`` that flow
    through the stages of the mesh's ``stage`` axis in the order of ``schedule`` (``gpipe`` |
    ``1f1b``; the same bubble, 1F1B keeps at most ``stages`` micro-batches' activations per
    stage instead of ``microbatches``)."""

    schedule: str = "1f1b"
    microbatches: int = 4

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Pipeline.schedule={self.schedule!r}; expected one of {SCHEDULES}")
        if self.microbatches < 1:
            raise ValueError(f"Pipeline.microbatches must be >= 1, got {self.microbatches}")

    def bubble(self) -> float:
        """The idle share ``(p - 1) / (m + p - 1)`` on the active mesh's ``stage`` axis."""
        return bubble_fraction(active_axis_size("stage"), self.microbatches)

    def check(self, config: TransformerConfig):
        """Raises for the models this pipeline cannot cut: every stage must be the same program
        (a dense model whose layers divide by the stages) and attention must not be its own
        ``shard_map`` (the ring) inside the pipeline's."""
        stages = active_axis_size("stage")
        if config.n_experts:
            raise ValueError("pipeline parallelism takes dense models (n_experts=0)")
        if config.attention_impl == "ring":
            raise ValueError("pipeline parallelism does not combine with attention_impl='ring'")
        if config.n_layers % stages:
            raise ValueError(f"n_layers={config.n_layers} must divide by the {stages} stages")
        if len(set(config.layer_windows)) > 1:
            raise ValueError(
                "pipeline parallelism needs every layer alike; sliding_window_pattern makes "
                "sliding and global layers"
            )

    def batch_loss(self, params, config: TransformerConfig, batch, *, z_loss: float = 0.0):
        """``(total, count, metrics)`` of next-token cross-entropy on ``batch``, as
        ``training.step.batch_loss`` computes it, with the layers run as pipeline stages."""
        self.check(config)
        stage_config = config.replace(n_layers=config.n_layers // active_axis_size("stage"))

        def first(shared, d):
            return embed_tokens(shared, config, d["tokens"])

        def stage(layers, x, d):
            cos, sin = rope_tables(config, d["positions"])
            attend = self_attention(config, d["segment_ids"])
            return apply_layers(stage_config, layers, x, cos, sin, attend)[0]

        def last(shared, x, d):
            h = final_norm(shared, config, x)
            logits = logits_from_hidden(shared, config, h)
            total, count, metrics = cross_entropy(
                logits, d["targets"], d["loss_mask"], z_loss=z_loss
            )
            return total, (count, metrics)

        loss = pipeline_loss(first, stage, last, schedule=self.schedule)
        shared = {name: p for name, p in params.items() if name != "layers"}
        total, (count, metrics) = loss(
            params["layers"], shared, split_micro(batch, self.microbatches)
        )
        return total, count, metrics
