"""Standard retrieval-augmented generation with citations (Lewis et al. 2020,
*Retrieval-Augmented Generation for Knowledge-Intensive NLP Tasks*, arXiv:2005.11401, as a
retrieve-then-read pipeline): the ``k`` best chunks, numbered ``[1]..[k]`` in the prompt, and an
answer that cites them by number, so every claim can be traced to the chunk it came from (the
attributed-QA setting of Gao et al. 2023, *Enabling Large Language Models to Generate Text with
Citations*, arXiv:2305.14627).  Graph: ``retrieve -> answer``.
"""

from __future__ import annotations

import gin

from agentic_jax.agents.loops.graph import CompiledGraph, StateGraph
from agentic_jax.agents.rag.common import RagState, TextOf, answer_node, fetch, text_reader
from agentic_jax.retrieval import Retriever, as_generator


@gin.configurable(module="rag")
def build_standard_rag(
    retriever: Retriever, text_of: TextOf, generate, k: int = 4, **compile_args
) -> CompiledGraph:
    """The flow over ``retriever`` (chunk text from ``text_of``, a mapping or function) and
    ``generate`` (a prompt -> text callable or a policy); its state is a
    :class:`~agentic_jax.agents.rag.common.RagState`."""
    read, generate = text_reader(text_of), as_generator(generate)
    return (
        StateGraph(RagState)
        .add_node("retrieve", lambda s: {"passages": fetch(retriever.search(s.question, k), read)})
        .add_node("answer", answer_node(generate, lambda s: s.passages))
        .add_edge("retrieve", "answer")
        .compile(**compile_args)
    )
