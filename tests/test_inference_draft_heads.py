"""Draft heads (Medusa, EAGLE) with branching trees: greedy identity, exact sampling, tree shape."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from test_inference_speculative import (
    CFG,
    NEW,
    PENALTIES,
    ROWS,
    _exact_marginals,
    _random_params,
    assert_follows_marginals,
)

from agentic_jax.inference import SamplingParams, generate
from agentic_jax.inference.decoding.draft_heads import init_eagle, init_medusa
from agentic_jax.inference.decoding.draft_tree import (
    DraftTree,
    TreeShape,
    grow_tree,
    tree_ancestors,
    verify_tree,
)
from agentic_jax.inference.decoding.tree_speculative import tree_speculative_generate

SHAPE = TreeShape(depth=3, branching=2, budget=7)  # widths (2, 4, 1): level 2 branches
PROMPT = [3, 4, 5, 3, 4, 6, 3, 4]
GREEDY_PROMPTS = [[5, 9, 3], [7, 7, 7, 7, 2, 1, 11, 4], [12, 2], [1, 2, 3, 4, 5]]


@pytest.fixture(scope="module")
def params():
    return _random_params(0, 0.5)


def _heads(params):
    return {
        "medusa": init_medusa(params, CFG, SHAPE.depth, jax.random.key(1), std=0.5),
        "eagle": init_eagle(CFG, jax.random.key(2)),
    }


def _batch():
    """Greedy rows, then ROWS sampled rows of one prompt with penalties, in one call."""
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW)
    sampled = SamplingParams(temperature=0.8, top_k=10, max_tokens=NEW, **PENALTIES)
    rows = GREEDY_PROMPTS + [PROMPT] * ROWS
    return rows, [greedy] * len(GREEDY_PROMPTS) + [sampled] * ROWS, sampled


def _decode(params, head, key=3):
    rows, sampling, _ = _batch()  # every call has these shapes and statics: one compilation
    return tree_speculative_generate(
        params, CFG, rows, head=head, sampling=sampling, key=jax.random.key(key), shape=SHAPE
    )


@pytest.fixture(scope="module", params=["medusa", "eagle"])
def decoded(request, params):
    head = _heads(params)[request.param]
    return request.param, head, _decode(params, head)


def test_greedy_rows_equal_greedy_decoding(params, decoded):
    _, _, result = decoded
    _, sampling, _ = _batch()
    n = len(GREEDY_PROMPTS)
    want = generate(params, CFG, GREEDY_PROMPTS, sampling=sampling[0], key=jax.random.key(0))
    np.testing.assert_array_equal(result.generation.tokens[:n], want.tokens)
    np.testing.assert_allclose(
        result.generation.raw_logprobs[:n], want.raw_logprobs, atol=1e-5, rtol=1e-5
    )


def test_sampled_rows_follow_the_target_distribution(params, decoded):
    _, _, result = decoded
    _, _, sampled = _batch()
    tokens = np.asarray(result.generation.tokens)[len(GREEDY_PROMPTS) :]
    assert (np.asarray(result.generation.lengths) == NEW).all()
    assert 0.01 < result.acceptance_rate < 0.95  # both branches of the rule are exercised
    assert_follows_marginals(tokens, _exact_marginals(params, PROMPT, sampled, 3))


def test_a_round_emits_its_accepted_drafts_plus_one(decoded):
    """``accepted`` and ``target_steps`` account for every emitted token (none is cut here:
    NEW tokens, no stop token), which is what ``tokens_per_step`` reports."""
    _, _, r = decoded
    lengths, steps, accepted = (
        np.asarray(a) for a in (r.generation.lengths, r.target_steps, r.accepted)
    )
    assert (lengths <= steps + accepted).all() and (
        lengths > steps + accepted - SHAPE.depth - 1
    ).all()
    assert (accepted <= steps * SHAPE.depth).all()
    assert 1.0 < r.tokens_per_step <= SHAPE.depth + 1


def test_a_head_that_agrees_with_the_target_fills_every_level(params, decoded):
    """With an all-zero embedding every logit is 0: greedy picks token 0 and so does every
    head's top-1 (ties go to the lowest index), so each round accepts a whole path."""
    kind, head, _ = decoded
    r = _decode({**params, "embed": jnp.zeros_like(params["embed"])}, head)
    n = len(GREEDY_PROMPTS)
    steps, accepted = np.asarray(r.target_steps[:n]), np.asarray(r.accepted[:n])
    assert (np.asarray(r.generation.tokens[:n]) == 0).all()
    np.testing.assert_array_equal(steps, np.ceil(NEW / (SHAPE.depth + 1)))
    np.testing.assert_array_equal(accepted, steps * SHAPE.depth, err_msg=kind)


@settings(max_examples=30, deadline=None)
@given(
    depth=st.integers(1, 5),
    branching=st.integers(1, 4),
    extra=st.integers(0, 20),
)
def test_tree_shape_grows_by_branching_within_the_budget(depth, branching, extra):
    shape = TreeShape(depth=depth, branching=branching, budget=depth + extra)
    widths = shape.widths
    assert len(widths) == depth and min(widths) >= 1
    assert shape.nodes - 1 == sum(widths) <= shape.budget
    assert all(w <= prev * branching for prev, w in zip((1,) + widths, widths))
    if branching > 1 and extra > 0:
        assert widths[0] > 1  # the root branches


@functools.partial(jax.jit, static_argnums=(0, 2))
def _random_tree(shape, key, b):
    """A tree grown from random drafter log-probabilities, and those log-probabilities."""
    logp = jax.nn.log_softmax(jax.random.normal(key, (b, shape.nodes, CFG.vocab_size)))

    def children(level, tree, carry):
        first, width = shape.levels[level - 1]
        return logp[:, first : first + width], carry

    return grow_tree(shape, logp[:, 0], children), logp


def test_grown_trees_branch_below_the_root_with_distinct_siblings():
    shape = TreeShape(depth=3, branching=3, budget=10)  # widths (3, 6, 1)
    tree, _ = _random_tree(shape, jax.random.key(0), 3)
    parents, tokens = np.asarray(tree.parents), np.asarray(tree.tokens)
    depth = shape.node_depth
    for b in range(parents.shape[0]):
        assert (depth[1:][np.arange(shape.nodes - 1)] == depth[parents[b]] + 1).all()
        children = np.bincount(parents[b], minlength=shape.nodes)
        assert children[1:].max() >= 2  # a draft node, not only the root, has two children
        for node in range(shape.nodes):
            kids = tokens[b][parents[b] == node]
            assert len(set(kids.tolist())) == len(kids)
    ancestors = np.asarray(tree_ancestors(shape, tree.parents))
    assert ancestors[:, :, 0].all() and (ancestors.sum(-1) == depth[None] + 1).all()


@jax.jit
def _first_tokens(p, tree, keys):
    """Per key: the first two emitted tokens and the node the first was accepted at (0: none)."""
    b = keys.shape[0]
    p, tree = jax.tree.map(lambda a: jnp.broadcast_to(a, (b,) + a.shape[1:]), (p, tree))
    verdict = verify_tree(SHAPE, p, DraftTree(*tree), keys)
    on_path = jnp.take_along_axis(tree.tokens, jnp.maximum(verdict.path - 1, 0), axis=1)
    first = jnp.where(verdict.accepted > 0, on_path[:, 0], verdict.final)
    second = jnp.where(verdict.accepted > 1, on_path[:, 1], verdict.final)
    return first, jnp.where(verdict.accepted > 0, verdict.path[:, 0], 0), second


def test_tree_verification_draws_each_token_from_the_target():
    """The multi-candidate rule on a fixed tree and target: the first token follows the root's
    distribution, and after an accepted child ``c`` the next token follows ``p`` at ``c``."""
    tree, _ = _random_tree(SHAPE, jax.random.key(1), 1)
    p = jax.nn.softmax(2.0 * jax.random.normal(jax.random.key(7), (1, SHAPE.nodes, CFG.vocab_size)))
    n = 20000
    first, node, second = (
        np.asarray(a) for a in _first_tokens(p, tree, jax.random.split(jax.random.key(0), n))
    )
    p = np.asarray(p[0], np.float64)
    p /= p.sum(-1, keepdims=True)
    _, p_value = stats.chisquare(np.bincount(first, minlength=CFG.vocab_size), n * p[0])
    assert p_value > 1e-3
    child = np.bincount(node[node > 0]).argmax()  # the child accepted most often
    after = second[node == child]
    _, p_value = stats.chisquare(
        np.bincount(after, minlength=CFG.vocab_size), len(after) * p[child]
    )
    assert p_value > 1e-3
