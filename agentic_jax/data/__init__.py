"""Text data for the agent stack: shipped corpus, BPE tokenizer, chat template, packed batches."""

from agentic_jax.data.chat import (
    Message,
    RenderedIds,
    ToolCall,
    parse,
    parse_assistant,
    render,
    render_ids,
)
from agentic_jax.data.corpus import corpus_files, corpus_manifest
from agentic_jax.data.documents import read_documents, write_documents
from agentic_jax.data.packing import next_token_example, pack_batches
from agentic_jax.data.pipeline import heldout_data, train_data
from agentic_jax.data.stats import unigram_entropy
from agentic_jax.data.tokenized_corpus import TokenizedCorpus, tokenize_files
from agentic_jax.data.tokenizer import SPECIAL_TOKENS, Tokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "Message",
    "RenderedIds",
    "TokenizedCorpus",
    "Tokenizer",
    "ToolCall",
    "corpus_files",
    "corpus_manifest",
    "heldout_data",
    "load_tokenizer",
    "next_token_example",
    "pack_batches",
    "parse",
    "parse_assistant",
    "read_documents",
    "render",
    "render_ids",
    "tokenize_files",
    "train_data",
    "train_tokenizer",
    "unigram_entropy",
    "write_documents",
]
