"""Inference: ``decoding`` (generating tokens inside one jitted loop) and ``serving`` (the engine
that batches many requests continuously, and what serves it to callers)."""

from agentic_jax.inference.decoding.beam_search import BeamResult, beam_search
from agentic_jax.inference.decoding.constrained import (
    TokenConstraint,
    json_schema_constraint,
    regex_constraint,
    token_bytes,
)
from agentic_jax.inference.decoding.contrastive import contrastive_search
from agentic_jax.inference.decoding.generate import (
    GenerationResult,
    TextGeneration,
    generate,
    generate_text,
    truncate_at_stop_strings,
)
from agentic_jax.inference.decoding.kv_cache import KVCache, init_cache
from agentic_jax.inference.decoding.prompts import PromptBatch
from agentic_jax.inference.decoding.recompute import generate_recompute
from agentic_jax.inference.decoding.sampling import (
    Sample,
    SamplingArrays,
    SamplingParams,
    add_tokens,
    count_tokens,
    filtered_logits,
    sample,
)
from agentic_jax.inference.decoding.speculation_policy import SpeculationAdvice, advise_speculation
from agentic_jax.inference.decoding.speculative import SpeculativeResult, speculative_generate
from agentic_jax.inference.decoding.streaming import StreamingCache
from agentic_jax.inference.serving.block_manager import BlockManager
from agentic_jax.inference.serving.engine import (
    Completion,
    Engine,
    EngineConfig,
    Request,
    StepOutput,
    stream_text,
)
from agentic_jax.inference.serving.paged_cache import PagedBatch, PagedKVCache, paged_forward
from agentic_jax.inference.serving.scheduler import Scheduler

__all__ = [
    "BeamResult",
    "BlockManager",
    "Completion",
    "Engine",
    "EngineConfig",
    "GenerationResult",
    "KVCache",
    "PagedBatch",
    "PagedKVCache",
    "PromptBatch",
    "Request",
    "Sample",
    "SamplingArrays",
    "SamplingParams",
    "Scheduler",
    "SpeculationAdvice",
    "SpeculativeResult",
    "StepOutput",
    "StreamingCache",
    "TextGeneration",
    "TokenConstraint",
    "add_tokens",
    "advise_speculation",
    "beam_search",
    "contrastive_search",
    "count_tokens",
    "filtered_logits",
    "generate",
    "generate_recompute",
    "generate_text",
    "init_cache",
    "json_schema_constraint",
    "paged_forward",
    "regex_constraint",
    "sample",
    "speculative_generate",
    "stream_text",
    "token_bytes",
    "truncate_at_stop_strings",
]
