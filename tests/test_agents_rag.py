"""The RAG control flows (``agents.rag``) over BM25 and a few hand-made passages, with scripted
generators that answer by what the prompt asks; and the triple graph they share with memory
(``retrieval.graph``), its k-hop neighbourhood against a slow reference."""

import gin
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.agents import FileCheckpointer, ScriptedPolicy
from agentic_jax.agents.rag import (
    Source,
    build_adaptive_rag,
    build_corrective_rag,
    build_graph_rag,
    build_multi_source_rag,
    build_self_rag,
    build_standard_rag,
    index_chunks,
    parse_citations,
    run,
)
from agentic_jax.agents.rag.common import mentioned, parse_choice
from agentic_jax.retrieval import BM25, reciprocal_rank_fusion
from agentic_jax.retrieval.graph import Triple, TripleGraph, normal_form, parse_triples

PASSAGES = {
    "ring": "Ring attention splits the sequence across devices and passes key blocks in a ring.",
    "flash": "Flash attention tiles the attention computation to stay in fast on-chip memory.",
    "eiffel": "The Eiffel Tower stands in Paris, the capital of France.",
    "bm25": "BM25 ranks documents by term frequency and inverse document frequency.",
    "paged": "Paged attention stores the KV cache of every request in fixed-size blocks.",
}
FACTS = {
    "g1": "Ada Lovelace worked with Charles Babbage.",
    "g2": "Charles Babbage designed the Analytical Engine.",
    "g3": "The Analytical Engine read punched cards.",
    "g4": "Punched cards came from the Jacquard loom.",
}
TRIPLES = {
    "g1": "(Ada Lovelace | worked with | Charles Babbage)",
    "g2": "1. (Charles Babbage | designed | Analytical Engine)\nSure, here you go!",
    "g3": "(analytical  engine | read | punched cards)",
    "g4": "- (Punched cards | came from | Jacquard loom)",
}


def bm25(passages):
    return BM25(list(passages.values()), list(passages))


class Script:
    """A generator answering by the first rule whose every key the prompt holds; it keeps the
    prompts it was asked."""

    def __init__(self, *rules):
        self.rules, self.prompts = rules, []

    def __call__(self, prompt):
        self.prompts.append(prompt)
        for keys, reply in self.rules:
            if all(k in prompt for k in ([keys] if isinstance(keys, str) else keys)):
                return reply
        raise AssertionError(f"no rule for prompt {prompt!r}")

    def asked(self, key):
        return [p for p in self.prompts if key in p]


ANSWER = "numbered passages"  # in every answer prompt


# --- shared parsing ---


def test_citations_are_parsed_and_out_of_range_markers_dropped():
    assert parse_citations("A [2][1, 3]; B [9] and [2] again, [0].", 3) == ([2, 1, 3], [9, 0])
    assert parse_citations("no markers, [x], [ ]", 3) == ([], [])


def test_choices_are_whole_words_first_named_first():
    relevance = {"relevant": True, "irrelevant": False, "not relevant": False}
    assert parse_choice("Irrelevant.", relevance) is False
    assert parse_choice("**Not  relevant** at all", relevance) is False
    assert parse_choice("Relevant; not irrelevant", relevance) is True
    assert parse_choice("maybe", relevance) is None
    assert mentioned("code_review, then DOCS and code", ["code", "docs", "facts"]) == [
        "docs",
        "code",
    ]


# --- standard RAG ---


def test_standard_rag_numbers_the_passages_and_parses_citations():
    generate = Script((ANSWER, "It passes key blocks in a ring [1], see [7]."))
    graph = build_standard_rag(bm25(PASSAGES), PASSAGES, generate, k=2)
    result = graph.invoke({"question": "How does ring attention work?"})
    assert result.path == ("retrieve", "answer")
    state = result.state
    assert state.passages[0].id == "ring" and len(state.passages) == 2
    assert f"[1] {PASSAGES['ring']}" in generate.prompts[0]
    assert f"[2] {state.passages[1].text}" in generate.prompts[0]
    assert state.answer == "It passes key blocks in a ring [1], see [7]."
    assert state.cited == ["ring"] and state.dropped_citations == [7]
    assert state.failures == ["answer: dropped citations [7] of 2 passages"]


def test_standard_rag_takes_a_policy_and_records_an_uncited_answer():
    policy = ScriptedPolicy(["Blocks of a fixed size."])
    state = run(build_standard_rag(bm25(PASSAGES), PASSAGES.get, policy, k=1), "KV cache blocks?")
    assert [p.id for p in state.passages] == ["paged"]
    assert state.cited == [] and state.failures == ["answer: cites no passage"]
    assert PASSAGES["paged"] in policy.calls[0][0][0].content


# --- Self-RAG ---


def self_rag_generator(decision="Yes."):
    return Script(
        ("Would passages", decision),
        ((ANSWER, "Paged attention"), "Paged attention keeps the KV cache in blocks [1]."),
        ((ANSWER, "Ring attention"), "Ring attention passes blocks [1]."),
        ((ANSWER, "Flash attention"), "Flash attention tiles blocks [1]."),
        (ANSWER, "I cannot tell."),
        ("Answer the question.", "From memory: blocks."),
        (("supported by the passage", "Paged attention keeps"), "Fully supported."),
        (("supported by the passage", "Ring attention passes"), "Partially supported"),
        ("supported by the passage", "hmm, hard to say"),
        (("How useful", "Paged"), "3"),
        (("How useful", "Ring"), "Usefulness: 5/5"),
        ("How useful", "very"),
    )


def attention_grader(question, passage):
    return "Relevant" if "attention" in passage else "Irrelevant"


def test_self_rag_critiques_each_candidate_and_picks_the_supported_one():
    generate = self_rag_generator()
    graph = build_self_rag(bm25(PASSAGES), PASSAGES, generate, grader=attention_grader, k=4)
    result = graph.invoke({"question": "Which attention keeps the KV cache in blocks?"})
    assert result.path == (
        "decide",
        "retrieve",
        "relevance",
        "generate",
        "support",
        "usefulness",
        "select",
    )
    state = result.state
    assert state.retrieve is True
    assert {p.id for p in state.relevant} == {"paged", "ring", "flash"}
    critiques = {c.passage.id: (c.support, c.usefulness) for c in state.candidates}
    assert critiques == {"paged": ("full", 3), "ring": ("partial", 5), "flash": ("none", 1)}
    scores = {c.passage.id: c.score for c in state.candidates}
    assert scores == {"paged": 1.125, "ring": 0.75, "flash": 0.0}
    # usefulness alone would pick ring; support decides
    assert state.answer == "Paged attention keeps the KV cache in blocks [1]."
    assert state.cited == ["paged"] and [p.id for p in state.passages] == ["paged"]
    assert sorted(state.failures) == [
        "support of the answer from flash: unparseable 'hmm, hard to say', no support",
        "usefulness of the answer from flash: unparseable 'very', rated 1",
    ]


def test_self_rag_answers_closed_book_when_retrieval_would_not_help_or_nothing_is_relevant():
    graph = build_self_rag(bm25(PASSAGES), PASSAGES, self_rag_generator("No."), k=2)
    result = graph.invoke({"question": "What is two plus two?"})
    assert result.path == ("decide", "closed_book")
    assert result.state.answer == "From memory: blocks." and result.state.passages == []

    generate = self_rag_generator("I am not sure")  # unreadable: retrieve, recorded
    graph = build_self_rag(bm25(PASSAGES), PASSAGES, generate, grader=lambda q, p: False, k=2)
    result = graph.invoke({"question": "Which attention keeps the KV cache in blocks?"})
    assert result.path == ("decide", "retrieve", "relevance", "closed_book")
    assert result.state.failures == ["decide: unparseable 'I am not sure', retrieving"]


# --- corrective RAG ---


def crag_generator(rewrite="Eiffel Tower Paris"):
    return Script(
        ("found nothing that answers", rewrite),
        ((ANSWER, "Eiffel"), "It stands in Paris [1]."),
        ("Answer the question.", "Somewhere."),
    )


QUESTION = "What ranks documents by frequency in the capital?"  # BM25 finds the bm25 chunk


def eiffel_grader(question, passage):
    return "relevant" if "Eiffel" in passage else "irrelevant"


def test_corrective_rag_rewrites_and_retries_when_the_grader_rejects_the_first_chunks():
    generate = crag_generator()
    graph = build_corrective_rag(bm25(PASSAGES), PASSAGES, generate, grader=eiffel_grader, k=1)
    result = graph.invoke({"question": QUESTION}, thread_id="crag")
    assert result.path == ("retrieve", "grade", "rewrite", "retrieve", "grade", "answer")
    state = result.state
    first, second = state.attempts
    assert (first.query, first.retrieved, first.relevant) == (QUESTION, ["bm25"], [])
    assert (second.query, second.retrieved, second.relevant) == (
        "Eiffel Tower Paris",
        ["eiffel"],
        ["eiffel"],
    )
    # the answer is written from the second retrieval alone
    assert [p.id for p in state.passages] == ["eiffel"] and state.cited == ["eiffel"]
    (answer_prompt,) = generate.asked(ANSWER)
    assert PASSAGES["eiffel"] in answer_prompt and PASSAGES["bm25"] not in answer_prompt
    assert repr(QUESTION) in generate.asked("found nothing")[0]
    # the checkpointed history shows the same: the query before and after the rewrite
    history = graph.checkpointer.history["crag"]
    assert [(c.node, c.state["query"]) for c in history] == [
        ("retrieve", QUESTION),
        ("grade", QUESTION),
        ("rewrite", "Eiffel Tower Paris"),
        ("retrieve", "Eiffel Tower Paris"),
        ("grade", "Eiffel Tower Paris"),
        ("answer", "Eiffel Tower Paris"),
    ]
    assert history[-1].status == "done" and state.failures == []


def test_corrective_rag_bounds_its_retries_and_records_what_failed():
    grades = iter(["irrelevant", "perhaps", "Irrelevant."])
    generate = Script(
        (("found nothing", "'ring attention devices'"), "bm25"),
        ("found nothing", "1. ring attention devices"),
        ("Answer the question.", "Somewhere."),
    )
    graph = build_corrective_rag(
        bm25(PASSAGES), PASSAGES, generate, grader=lambda q, p: next(grades), k=1, max_retries=2
    )
    result = graph.invoke({"question": "ring"})
    assert result.path == ("retrieve", "grade", "rewrite") * 2 + ("retrieve", "grade", "answer")
    assert [a.query for a in result.state.attempts] == ["ring", "ring attention devices", "bm25"]
    assert result.state.answer == "Somewhere." and result.state.passages == []
    assert result.state.failures == [
        "grade of ring: unparseable 'perhaps', counted irrelevant",
        "answer: no relevant chunk in 3 searches, closed-book",
    ]


def test_corrective_rag_stops_on_a_repeated_rewrite_and_is_gin_configurable():
    generate = crag_generator(rewrite=f"Query: {QUESTION}")  # the query already tried
    graph = build_corrective_rag(bm25(PASSAGES), PASSAGES, generate, grader=eiffel_grader, k=1)
    result = graph.invoke({"question": QUESTION})
    assert result.path == ("retrieve", "grade", "rewrite", "answer")
    assert result.state.failures == [
        f"rewrite: unusable 'Query: {QUESTION}', stopping retries",
        "answer: no relevant chunk in 1 searches, closed-book",
    ]
    with gin.unlock_config():
        gin.parse_config(["rag.build_corrective_rag.max_retries = 0"])
    try:
        graph = build_corrective_rag(
            bm25(PASSAGES), PASSAGES, crag_generator(), grader=eiffel_grader
        )
        assert graph.invoke({"question": QUESTION}).path == ("retrieve", "grade", "answer")
    finally:
        gin.clear_config()


# --- adaptive RAG ---


def adaptive_generator():
    return Script(
        (("found so far", "Eiffel"), "DONE"),
        (("found so far", "Query:"), "I think we should look further"),
        ("found so far", "SEARCH: Eiffel Tower Paris"),
        (ANSWER, "Paris [2]."),
        ("Answer the question.", "Four."),
        ("How hard", "It is complex."),
    )


@pytest.mark.parametrize(
    "difficulty, path",
    [
        ("simple", ("classify", "closed_book")),
        ("Moderate.", ("classify", "retrieve", "answer")),
        ("complex", ("classify", "search", "reason", "search", "reason", "answer")),
    ],
)
def test_adaptive_rag_routes_each_difficulty_to_its_branch(difficulty, path):
    generate = adaptive_generator()
    graph = build_adaptive_rag(
        bm25(PASSAGES), PASSAGES, generate, classifier=lambda q: difficulty, k=1
    )
    result = graph.invoke({"question": QUESTION})
    assert result.path == path
    state = result.state
    if path[1] == "closed_book":
        assert state.answer == "Four." and state.passages == [] and state.queries == []
    elif path[1] == "retrieve":
        assert [p.id for p in state.passages] == ["bm25"] and state.queries == []
    else:
        assert state.queries == [QUESTION, "Eiffel Tower Paris"]
        assert [p.id for p in state.passages] == ["bm25", "eiffel"]
        assert state.answer == "Paris [2]." and state.cited == ["eiffel"]
    if path[1] == "retrieve":  # "Paris [2]." of one passage
        assert state.failures == [
            "answer: dropped citations [2] of 1 passages",
            "answer: cites no passage",
        ]
    else:
        assert state.failures == []


def test_adaptive_rag_asks_the_generator_and_records_what_it_cannot_read():
    generate = adaptive_generator()
    graph = build_adaptive_rag(bm25(PASSAGES), PASSAGES, generate, k=1, max_steps=1)
    result = graph.invoke({"question": QUESTION})  # "It is complex.", then out of steps
    assert result.path == ("classify", "search", "reason", "answer")
    assert result.state.difficulty == "complex" and result.state.queries == [QUESTION]

    graph = build_adaptive_rag(bm25(PASSAGES), PASSAGES, generate, classifier=lambda q: "?", k=1)
    result = graph.invoke({"question": "Query: ring"})
    assert result.path == ("classify", "retrieve", "answer")
    assert result.state.failures[0] == "classify: unparseable '?', moderate"

    graph = build_adaptive_rag(bm25(PASSAGES), PASSAGES, generate, classifier=lambda q: "complex")
    result = graph.invoke({"question": "Query: ring"})
    assert result.path == ("classify", "search", "reason", "answer")
    assert result.state.failures[0].startswith("reason: unparseable")


# --- Graph RAG ---


def extractor():
    rules = [((f"Passage: {text}",), TRIPLES[i]) for i, text in FACTS.items()]
    return Script(*rules, (ANSWER, "With Charles Babbage [1], who designed it [2]."))


def test_graph_rag_answers_from_exactly_the_k_hop_facts_and_their_chunks():
    generate = extractor()
    graph = TripleGraph()
    rejected = index_chunks(graph, FACTS, FACTS, generate)
    assert rejected == {"g2": ["Sure, here you go!"]}
    assert len(graph) == 4 and graph.sources == set(FACTS)
    flow = build_graph_rag(bm25(FACTS), FACTS, generate, graph=graph, hops=2)
    result = flow.invoke({"question": "Whom did Ada Lovelace work with?"})
    assert result.path == ("retrieve", "extract", "match", "expand", "answer")
    state = result.state
    assert state.extracted == [] and state.entities == ["Ada Lovelace"]
    assert state.triples == [
        Triple("Ada Lovelace", "worked with", "Charles Babbage", "g1"),
        Triple("Charles Babbage", "designed", "Analytical Engine", "g2"),
    ]
    assert [p.id for p in state.passages] == ["g1", "g2"] and state.cited == ["g1", "g2"]
    (prompt,) = generate.asked(ANSWER)
    assert "(Ada Lovelace | worked with | Charles Babbage) [1]\n" in prompt
    assert "(Charles Babbage | designed | Analytical Engine) [2]\n" in prompt
    assert f"[2] {FACTS['g2']}" in prompt and "punched" not in prompt.lower()


def test_graph_rag_reads_the_retrieved_chunks_and_survives_a_restart(tmp_path):
    generate = extractor()
    graph = TripleGraph()
    flow = build_graph_rag(
        bm25(FACTS),
        FACTS,
        generate,
        graph=graph,
        k=4,
        hops=1,
        checkpointer=FileCheckpointer(tmp_path),
        interrupt_before=["answer"],
    )
    paused = flow.invoke({"question": "What did Charles Babbage design?"}, thread_id="t")
    assert paused.status == "interrupted"
    assert paused.state.extracted == ["g1", "g2"]  # g3 and g4 share no word with it
    assert paused.state.failures == ["extract from g2: not a triple: 'Sure, here you go!'"]
    reloaded = build_graph_rag(
        bm25(FACTS), FACTS, generate, graph=graph, checkpointer=FileCheckpointer(tmp_path)
    )
    done = reloaded.resume("t")
    assert done.path == ("answer",) and [t.source for t in done.state.triples] == ["g1", "g2"]
    assert isinstance(done.state.triples[0], Triple)


def test_graph_rag_without_entities_answers_from_the_retrieved_chunks():
    flow = build_graph_rag(bm25(FACTS), FACTS, extractor(), k=1)
    state = run(flow, "Which loom?")  # g4 is read, but "loom" alone names no entity
    assert state.extracted == ["g4"] and state.entities == [] and state.triples == []
    assert [p.id for p in state.passages] == ["g4"] and state.cited == ["g4"]
    assert state.failures == [
        "match: no entity of the question is in the graph",
        "answer: dropped citations [2] of 1 passages",
        "answer: no facts around the question, from the chunks",
    ]


# --- multi-source routing ---

CODE = {
    "code/ring.py": "def ring_attention(q, k, v): pass blocks around the ring of devices",
    "code/bm25.py": "def bm25_scores(query): term frequency times idf",
}
FACT_STORE = {"fact/paris": "Paris is the capital of France."}
SOURCES = {
    "docs": Source(bm25(PASSAGES), "prose documentation"),
    "code": Source(bm25(CODE), "the source code"),
    "facts": Source(bm25(FACT_STORE), "short facts about the world"),
}
ALL_TEXT = {**PASSAGES, **CODE, **FACT_STORE}


def test_multi_source_routing_fuses_several_sources_by_rrf():
    generate = Script((ANSWER, "In a ring [1][2]."))
    flow = build_multi_source_rag(
        SOURCES, ALL_TEXT, generate, router=lambda q: ["code", "docs", "web"], k=3
    )
    result = flow.invoke({"question": "ring attention devices"})
    assert result.path == ("route", "retrieve", "answer")
    state = result.state
    assert state.sources == ["docs", "code"]
    assert state.failures == ["route: unknown source 'web' dropped"]
    fused = reciprocal_rank_fusion([state.rankings["docs"], state.rankings["code"]])
    assert [p.id for p in state.passages] == [h.id for h in fused[:3]]
    assert [p.id for p in state.passages[:2]] == ["ring", "code/ring.py"]
    assert state.cited == ["ring", "code/ring.py"]


def test_multi_source_routing_by_the_generator():
    generate = Script(
        (("Which of these sources", "capital"), "facts"),
        ("Which of these sources", "I do not know"),
        (ANSWER, "Paris [1]."),
    )
    flow = build_multi_source_rag(SOURCES, ALL_TEXT, generate, k=2)
    state = run(flow, "What is the capital of France?")
    assert state.sources == ["facts"] and list(state.rankings) == ["facts"]
    assert [p.id for p in state.passages] == ["fact/paris"] and state.cited == ["fact/paris"]
    assert "- code: the source code" in generate.prompts[0]
    state = run(flow, "ring attention")
    assert state.sources == ["docs", "code", "facts"]
    assert state.failures[0] == "route: unparseable 'I do not know', every source"


# --- the triple graph ---


def hand_made_graph():
    return TripleGraph(
        [
            Triple("A", "r", "B", "c1"),
            Triple("B", "r", "C", "c2"),
            Triple("C", "r", "D", "c3"),
            Triple("E", "r", "b", "c4"),  # "b" is B
            Triple("X", "r", "Y", "c5"),
            Triple("D", "r", "A", "c6"),
        ]
    )


def test_k_hop_neighbourhood_of_a_hand_made_graph():
    graph = hand_made_graph()
    assert graph.entities() == ["A", "B", "C", "D", "E", "X", "Y"]
    assert graph.lookup(" b ") == "B" and graph.lookup("Z") is None
    assert graph.distances(["a"], 2) == {"A": 0, "B": 1, "D": 1, "C": 2, "E": 2}
    sources = lambda k: [t.source for t in graph.neighbourhood(["A"], k)]  # noqa: E731
    assert sources(0) == []
    assert sources(1) == ["c1", "c6"]  # about A itself
    assert sources(2) == ["c1", "c6", "c2", "c3", "c4"]  # then about B and D, as added
    assert sources(5) == sources(3) == sources(2)
    assert graph.neighbourhood(["nobody"], 3) == []
    with pytest.raises(ValueError):
        graph.distances(["A"], -1)


def test_facts_are_filtered_by_time_and_deduplicated():
    graph = TripleGraph()
    graph.add("Alice", "works at", "Acme", "c1", valid_from=2010, valid_to=2015)
    graph.add("Alice", "works at", "Initech", "c2", valid_from=2015)
    graph.add("Acme", "based in", "Berlin", "c3")
    assert graph.add("alice", "works at", "acme", "c1", 2010, 2015).subject == "Alice"
    assert len(graph) == 3
    at = lambda t: [x.object for x in graph.neighbourhood(["Alice"], 2, at=t)]  # noqa: E731
    assert at(2012) == ["Acme", "Berlin"] and at(2015) == ["Initech"] and at(2000) == []
    assert [x.object for x in graph.neighbourhood(["Alice"], 2)] == ["Acme", "Initech", "Berlin"]
    with pytest.raises(ValueError):
        graph.add("Alice", " ", "Bob")


def test_triple_lines_and_mentions():
    text = "(A | r | B)\n2) ( C|s | D ).\n(E | | F)\nnoise\n\n(G | t | H) trailing"
    assert parse_triples(text) == (
        [("A", "r", "B"), ("C", "s", "D")],
        ["(E | | F)", "noise", "(G | t | H) trailing"],
    )
    graph = TripleGraph([Triple("ring attention", "uses", "attention"), Triple("KV", "in", "X")])
    assert graph.mentions("Does Ring  Attention beat attention? kv") == [
        "ring attention",
        "attention",
        "KV",
    ]
    assert graph.mentions("ringattention, XKV") == []


def reference(triples, seeds, k):
    """The k-hop facts by repeated set expansion: k times, take every fact touching what is
    reached, and reach its ends."""
    key = normal_form
    reached = {key(s) for s in seeds} & {key(e) for t in triples for e in (t[0], t[2])}
    distance, facts = dict.fromkeys(reached, 0), set()
    for hop in range(1, k + 1):
        touching = {t for t in triples if key(t[0]) in reached or key(t[2]) in reached}
        facts |= touching
        reached |= {key(e) for t in touching for e in (t[0], t[2])}
        for entity in reached:
            distance.setdefault(entity, hop)
    return facts, distance


names = st.sampled_from(["a", "b", "c", "d", "e", "f", "A", "B "])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(names, st.sampled_from(["r", "s"]), names), max_size=14),
    st.lists(names, max_size=3),
    st.integers(0, 5),
)
def test_k_hop_equals_repeated_set_expansion(edges, seeds, k):
    graph = TripleGraph(Triple(*e) for e in edges)
    got = graph.neighbourhood(seeds, k)
    facts, distance = reference([Triple(*e) for e in edges], seeds, k)
    key = normal_form
    assert {(key(t.subject), t.relation, key(t.object)) for t in got} == {
        (key(t[0]), t[1], key(t[2])) for t in facts
    }
    assert len(got) == len(set(got))
    assert {key(e): d for e, d in graph.distances(seeds, k).items()} == distance
    # ordered by the nearer end's hop count, then as added
    near = [min(distance[key(t.subject)], distance[key(t.object)]) for t in got]
    order = [graph.triples.index(t) for t in got]
    assert list(zip(near, order)) == sorted(zip(near, order))
