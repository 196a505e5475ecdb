"""Decoding: generating tokens from a trained model."""
from agentic_jax.inference.beam_search import BeamResult, beam_search
from agentic_jax.inference.block_manager import BlockManager
from agentic_jax.inference.constrained import (TokenConstraint, json_schema_constraint,
                                               regex_constraint, token_bytes)
from agentic_jax.inference.contrastive import contrastive_search
from agentic_jax.inference.engine import (Completion, Engine, EngineConfig, Request, StepOutput,
                                          load_checkpoint, stream_text)
from agentic_jax.inference.generate import (GenerationResult, TextGeneration, generate,
                                            generate_text, truncate_at_stop_strings)
from agentic_jax.inference.kv_cache import KVCache, init_cache
from agentic_jax.inference.paged_cache import PagedBatch, PagedKVCache, paged_forward
from agentic_jax.inference.prompts import PromptBatch
from agentic_jax.inference.recompute import generate_recompute
from agentic_jax.inference.scheduler import Scheduler
from agentic_jax.inference.sampling import (Sample, SamplingArrays, SamplingParams, add_tokens,
                                            count_tokens, filtered_logits, sample)
from agentic_jax.inference.speculation_policy import SpeculationAdvice, advise_speculation
from agentic_jax.inference.speculative import SpeculativeResult, speculative_generate

__all__ = ["BlockManager", "Completion", "Engine", "EngineConfig", "PagedBatch", "PagedKVCache",
           "Request", "Scheduler", "StepOutput", "load_checkpoint", "paged_forward", "stream_text",
           "Sample", "SamplingArrays", "SamplingParams", "add_tokens", "count_tokens",
           "filtered_logits", "generate_recompute", "sample",
           "BeamResult", "GenerationResult", "KVCache", "PromptBatch", "SpeculationAdvice",
           "SpeculativeResult", "TextGeneration", "TokenConstraint", "advise_speculation",
           "beam_search", "contrastive_search", "generate", "generate_text", "init_cache",
           "json_schema_constraint", "regex_constraint", "speculative_generate", "token_bytes",
           "truncate_at_stop_strings"]
