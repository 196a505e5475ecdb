"""Agent memory: typed records in a crash-safe SQLite store per memory space, and the policies
that write and read them (see docs/memory.md)."""

from agentic_jax.memory.consolidate import consolidate, consolidation_job, merge_duplicates
from agentic_jax.memory.decisions import LoggedDecision, decisions, log_decision
from agentic_jax.memory.embed import HashingEmbedder
from agentic_jax.memory.graph import GraphMemory, GraphWrite
from agentic_jax.memory.links import (
    NoteLinker,
    derived_embedding,
    insert_derived,
    parse_keywords,
)
from agentic_jax.memory.permissions import (
    LEVELS,
    AgentStore,
    AuditEntry,
    PermissionDenied,
    SharedSpace,
)
from agentic_jax.memory.read import MemoryReader, Recall, min_max, mmr_order, token_counter
from agentic_jax.memory.records import STORED_TYPES, TYPES, MemoryRecord
from agentic_jax.memory.reflection import REFLECTION_PROMPT, Reflector, parse_insights
from agentic_jax.memory.store import MIGRATIONS, SCHEMA_VERSION, MemoryStore, migrate
from agentic_jax.memory.tiers import SUMMARY_PROMPT, TierChange, Tiers
from agentic_jax.memory.update import (
    DECIDE_PROMPT,
    EXTRACT_PROMPT,
    Decision,
    Fact,
    FactExtractor,
    MemoryUpdater,
    ModelDecider,
    RuleDecider,
    UpdateResult,
    parse_decision,
    parse_facts,
)
from agentic_jax.memory.working import WorkingMemory
from agentic_jax.memory.write import (
    IMPORTANCE_PROMPT,
    ImportanceScorer,
    MemoryWriter,
    WriteResult,
    parse_importance,
    redact_pii,
)

__all__ = [
    "DECIDE_PROMPT",
    "EXTRACT_PROMPT",
    "IMPORTANCE_PROMPT",
    "LEVELS",
    "MIGRATIONS",
    "REFLECTION_PROMPT",
    "SCHEMA_VERSION",
    "STORED_TYPES",
    "SUMMARY_PROMPT",
    "TYPES",
    "AgentStore",
    "AuditEntry",
    "Decision",
    "Fact",
    "FactExtractor",
    "GraphMemory",
    "GraphWrite",
    "HashingEmbedder",
    "ImportanceScorer",
    "LoggedDecision",
    "MemoryReader",
    "MemoryRecord",
    "MemoryStore",
    "MemoryUpdater",
    "MemoryWriter",
    "ModelDecider",
    "NoteLinker",
    "PermissionDenied",
    "Recall",
    "Reflector",
    "RuleDecider",
    "SharedSpace",
    "TierChange",
    "Tiers",
    "UpdateResult",
    "WorkingMemory",
    "WriteResult",
    "consolidate",
    "consolidation_job",
    "decisions",
    "derived_embedding",
    "insert_derived",
    "log_decision",
    "merge_duplicates",
    "migrate",
    "min_max",
    "mmr_order",
    "parse_decision",
    "parse_facts",
    "parse_importance",
    "parse_insights",
    "parse_keywords",
    "redact_pii",
    "token_counter",
]
