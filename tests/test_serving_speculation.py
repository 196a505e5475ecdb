"""Speculation and per-request logit masks inside the serving engine's continuous batch.

One tiny model (the standalone speculation tests' own, so their exact-marginals oracle applies)
and one engine shape for the whole module: the device steps compile once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_inference_speculative import CFG, PENALTIES, _exact_marginals, _random_params

from agentic_jax.inference import generate, regex_constraint
from agentic_jax.inference.decoding.draft_heads import (
    eagle_config,
    eagle_features,
    init_eagle,
    init_medusa,
    medusa_logits,
)
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.block_manager import BlockManager
from agentic_jax.inference.serving.engine import Engine, EngineConfig, Request
from agentic_jax.inference.serving.scheduler import Scheduler, Sequence
from agentic_jax.models.transformer import hidden_states, logits_from_hidden, self_attention

K = 2
ENGINE = EngineConfig(num_slots=8, block_size=4, max_model_len=32, speculation_tokens=K)
METHODS = ("none", "prompt_lookup", "draft", "medusa", "eagle")
# Tokens 3..15 spell "a".."m"; the automaton alternates [a-f] and [g-m]; token 2 ends a match.
TOKENS = [None, None, None] + [bytes([ord("a") + i]) for i in range(13)]


@pytest.fixture(scope="module")
def params():
    return _random_params(0, 0.5)


@pytest.fixture(scope="module")
def draft_params(params):
    """The target plus noise: a draft that agrees often but not always."""
    return jax.tree.map(lambda a, b: a + b, params, _random_params(1, 0.2))


@pytest.fixture(scope="module")
def constraint():
    return regex_constraint("([a-f][g-m])+", TOKENS, eos_id=2)


@pytest.fixture(scope="module")
def heads(params):
    """Random Medusa heads (one per draft position) and a random EAGLE head whose weights are
    as large as the target's, so that its drafts depend on what its pages hold."""
    rng = np.random.default_rng(2)
    eagle = jax.tree.map(
        lambda x: jnp.asarray(rng.normal(0.0, 0.5, x.shape), x.dtype),
        init_eagle(CFG, jax.random.key(2)),
    )
    return {"medusa": init_medusa(params, CFG, K, jax.random.key(1), std=0.5), "eagle": eagle}


def _engine(params, draft_params, heads):
    return Engine(params, CFG, ENGINE, draft_params=draft_params, draft_config=CFG, **heads)


def _prompts(n, seed=0):
    """Repetitive prompts (prompt lookup finds matches) of 3..8 tokens."""
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 8, rng.integers(3, 9)).tolist() for _ in range(n)]


def _allowed_walk(constraint, tokens):
    """Whether the automaton allows every token of ``tokens`` in turn."""
    allowed, nxt = np.asarray(constraint.allowed), np.asarray(constraint.next_state)
    state = int(constraint.initial)
    for t in tokens:
        if not allowed[state, t]:
            return False
        state = int(nxt[state, t])
    return True


def test_greedy_outputs_equal_greedy_decoding_for_every_method_in_one_mixed_batch(
    params, draft_params, heads, constraint
):
    new = 10
    prompts = _prompts(15)
    requests = []
    for i, prompt in enumerate(prompts):  # methods cycle; every third row is constrained
        penalties = PENALTIES if i % 2 else {}
        requests.append(
            Request(
                prompt,
                SamplingParams(temperature=0.0, max_tokens=new, **penalties),
                speculation=METHODS[i % len(METHODS)],
                constraint=constraint if i % 3 == 2 else None,
            )
        )
    engine = _engine(params, draft_params, heads)
    done = engine.generate(requests)
    for bound in (None, constraint):  # one batched reference call each, rows left-padded
        rows = [i for i, r in enumerate(requests) if r.constraint is bound]
        want = generate(
            params,
            CFG,
            [requests[i].prompt for i in rows],
            sampling=[requests[i].params for i in rows],
            key=jax.random.key(0),
            constraint=bound,
        )
        for i, tokens in zip(rows, np.asarray(want.tokens).tolist()):
            assert list(done[i].tokens) == tokens
            assert bound is None or _allowed_walk(constraint, tokens)
    spec = engine.stats["speculation"]
    assert spec["prompt_lookup"]["accepted"] > 0 and spec["draft"]["accepted"] > 0
    assert spec["medusa"]["proposed"] > 0 and spec["eagle"]["proposed"] > 0
    assert spec["none"]["proposed"] == 0
    # Each request's first token comes from its prefill, every other from a target forward:
    # one per row forward plus one per accepted draft.
    emitted = sum(len(c.tokens) for c in done)
    assert emitted == len(done) + sum(s["forwards"] + s["accepted"] for s in spec.values())
    assert engine.blocks.num_free_blocks == engine.num_blocks  # rejected drafts rolled back


L = ENGINE.max_model_len  # the dense reference runs padded to this length: one compilation


@jax.jit
def _dense_features(params, tokens):
    """The target's features of ``tokens[L]`` (causal: padding after them changes nothing)."""
    return hidden_states(params, CFG, tokens[None])[0]


@jax.jit
def _dense_eagle(head, params, tokens, features):
    """EAGLE's predicted features ``[L, D]`` of ``tokens[L]`` under plain causal attention."""
    attend = self_attention(eagle_config(CFG), jnp.ones((1, L), jnp.int32))
    out, _ = eagle_features(
        head, params, CFG, tokens[None], features[None], jnp.arange(L)[None], attend, None
    )
    return out[0]


def _dense_chain(params, heads, method, tokens, n):
    """The ``n`` drafts after ``tokens`` (the last one the root) recomputed from scratch: the
    target's features of the whole sequence, then Medusa's heads on the root's predecessor, or
    EAGLE's layer with plain causal attention, each token paired with the feature before it."""
    r = len(tokens) - 1  # the root's position
    padded = np.zeros(L, np.int32)
    padded[: r + 1] = tokens
    h = _dense_features(params, padded)
    if method == "medusa":
        logits = medusa_logits(heads["medusa"], params, CFG, h[None, None, r - 1])[0, 0]
        return np.argmax(logits, -1)[:n].tolist()
    features = jnp.concatenate([jnp.zeros_like(h[:1]), h[:-1]])  # token j with feature j - 1
    for pos in range(r, r + n):
        out = _dense_eagle(heads["eagle"], params, padded, features)
        padded[pos + 1] = np.argmax(logits_from_hidden(params, CFG, out[None, pos : pos + 1]))
        features = features.at[pos + 1].set(out[pos])
    return padded[r + 1 : r + 1 + n].tolist()


def test_head_drafts_in_the_engine_equal_the_heads_recomputed_from_scratch(
    params, draft_params, heads
):
    """The kept features and EAGLE's pages follow every prefill, decode and verification."""
    engine = _engine(params, draft_params, heads)
    rounds, propose = [], engine._propose

    def spy(seqs, tables, rows):  # every round's roots and drafts, as the engine proposed them
        drafts, proposed, *rest = propose(seqs, tables, rows)
        rounds.extend((s.speculation, s.tokens, drafts[s.slot, : proposed[s.slot]]) for s in seqs)
        return drafts, proposed, *rest

    engine._propose = spy
    greedy = SamplingParams(temperature=0.0, max_tokens=9)
    engine.generate(
        Request(p, greedy, speculation=("medusa", "eagle")[i % 2])
        for i, p in enumerate(_prompts(4, seed=3))
    )
    proposals = [r for r in rounds if len(r[2])]  # rows near their end propose nothing
    assert len(proposals) >= 8
    for method, tokens, drafts in proposals:
        assert drafts.tolist() == _dense_chain(params, heads, method, tokens, len(drafts))


def test_a_draft_equal_to_the_target_has_every_proposal_accepted(params, heads):
    engine = _engine(params, params, heads)
    requests = [
        Request(p, SamplingParams(temperature=0.8, top_k=10, max_tokens=10), speculation="draft")
        for p in _prompts(4, seed=1)
    ]
    engine.generate(requests)
    draft = engine.stats["speculation"]["draft"]
    assert draft["accepted"] == draft["proposed"] > 0
    assert draft["accepted_per_forward"] == pytest.approx(K)  # 9 tokens after prefill: 3 rounds


@pytest.mark.parametrize("method", METHODS[1:])
def test_sampled_speculation_in_the_engine_follows_the_target_distribution(
    params, draft_params, heads, method
):
    rows, depth = 768, 3
    prompt = [3, 4, 5, 3, 4, 6, 3, 4]
    sampling = SamplingParams(temperature=0.8, top_k=10, max_tokens=depth + 1, **PENALTIES)
    engine = _engine(params, draft_params, heads)
    done = engine.generate([Request(prompt, sampling, speculation=method)] * rows)
    tokens = np.asarray([c.tokens for c in done])
    spec = engine.stats["speculation"][method]
    assert 0.01 < spec["accepted"] / spec["proposed"] < 0.95  # both branches of the rule
    for i, exact in enumerate(_exact_marginals(params, prompt, sampling, depth)):
        observed = np.bincount(tokens[:, i], minlength=CFG.vocab_size)
        assert observed[exact == 0].sum() == 0
        support = exact > 0
        _, p_value = stats.chisquare(
            observed[support], rows * exact[support] / exact[support].sum()
        )
        assert p_value > 1e-3, (i, p_value)


def test_a_constrained_request_shares_the_batch_and_leaves_the_others_unchanged(
    params, draft_params, heads, constraint
):
    free = [
        Request(p, SamplingParams(temperature=1.0, max_tokens=8, seed=i), request_id=f"free-{i}")
        for i, p in enumerate(_prompts(3, seed=2))
    ]
    bound = Request(
        [3, 9, 4],
        SamplingParams(temperature=1.0, max_tokens=8, seed=7),
        request_id="bound",
        constraint=constraint,
    )
    with_it = _engine(params, draft_params, heads).generate([free[0], bound, *free[1:]])
    without = _engine(params, draft_params, heads).generate(free)
    assert _allowed_walk(constraint, with_it[1].tokens)
    assert not _allowed_walk(constraint, [t for c in without for t in c.tokens])  # it binds
    for got, want in zip([with_it[0], *with_it[2:]], without):
        assert got.tokens == want.tokens
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


def test_requests_the_engine_cannot_serve_are_refused(params, constraint):
    engine = Engine(params, CFG, ENGINE)  # no draft model, no heads
    prompt = [3, 4, 5]
    with pytest.raises(RequestError, match="draft model"):
        engine.add_request(Request(prompt, speculation="draft"))
    for head in ("medusa", "eagle"):
        with pytest.raises(RequestError, match="its head"):
            engine.add_request(Request(prompt, speculation=head))
    with pytest.raises(RequestError, match="speculation"):
        engine.add_request(Request(prompt, speculation="lookahead"))
    narrow = constraint._replace(allowed=constraint.allowed[:, :8])
    with pytest.raises(RequestError, match="cover 8 tokens"):
        engine.add_request(Request(prompt, constraint=narrow))
    assert not engine.has_unfinished()


def test_truncate_returns_the_blocks_reserved_past_the_accepted_tokens():
    blocks = BlockManager(8, 4)
    blocks.allocate("a", list(range(6)))
    blocks.prepare_write("a", 0, 6)
    blocks.commit("a", list(range(6)), 6)
    blocks.prepare_write("a", 6, 13)  # the next token and six drafts: two more blocks
    assert len(blocks.block_table("a")) == 4 and blocks.num_free_blocks == 4
    blocks.truncate("a", 7)  # one draft accepted: positions 0..6 hold K/V
    assert len(blocks.block_table("a")) == 2 and blocks.num_free_blocks == 6
    with pytest.raises(ValueError, match="computed blocks"):
        blocks.truncate("a", 0)  # block 0 is full and named in the prefix cache


def test_a_sequence_without_room_for_its_drafts_decodes_one_token_instead_of_preempting():
    blocks = BlockManager(4, 4)
    scheduler = Scheduler(blocks, 2)
    seqs = [
        Sequence(f"s{i}", tuple(range(4)), SamplingParams(), np.zeros(2, np.uint32), 0, 0.0)
        for i in range(2)
    ]
    for seq in seqs:
        scheduler.add(seq)
    scheduler.schedule(0)  # both admitted: one block each, two left
    for seq in seqs:
        seq.num_computed, seq.lookahead = 4, 8  # eight drafts need two more blocks each
    plan = scheduler.schedule(1)
    assert plan.decodes == seqs and not plan.preempted
    assert [s.lookahead for s in seqs] == [0, 0]
