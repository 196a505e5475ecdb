"""Speculative decoding: exact target distribution, greedy equivalence, tree attention, policy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from agentic_jax.inference import (
    PromptBatch,
    SamplingArrays,
    SamplingParams,
    advise_speculation,
    count_tokens,
    filtered_logits,
    generate,
    init_cache,
    speculative_generate,
)
from agentic_jax.inference.decoding.kv_cache import extend_logits, prefill
from agentic_jax.inference.decoding.prompt_lookup import ngram_drafts
from agentic_jax.inference.decoding.speculation_policy import expected_tokens_per_step
from agentic_jax.inference.decoding.speculative import draft_tree
from agentic_jax.models import TransformerConfig, forward, param_shapes

CFG = TransformerConfig(
    vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32
)
GAMMA, NEW, ROWS, PROMPT_LEN = 2, 6, 4096, 8
# (branches, draft model?): a tree of sampled draft-model chains and a single prompt-lookup chain.
# Every call below has the same shapes and static arguments: one compilation per mode.
MODES = {"draft-tree": (2, True), "ngram-chain": (1, False)}
PENALTIES = {"repetition_penalty": 1.2, "presence_penalty": 0.3}


def _random_params(seed, scale):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, scale, s.shape), s.dtype), param_shapes(CFG)
    )


@pytest.fixture(scope="module")
def params():
    return _random_params(0, 0.5)


@pytest.fixture(scope="module")
def draft_params(params):
    """The target plus noise: a draft that agrees often but not always."""
    noise = _random_params(1, 0.2)
    return jax.tree.map(lambda a, b: a + b, params, noise)


def _speculate(params, draft, mode, prompts, sampling, key=0):
    branches, use_draft = MODES[mode]
    extra = {"draft_params": draft, "draft_config": CFG} if use_draft else {}
    return speculative_generate(
        params,
        CFG,
        prompts,
        sampling=sampling,
        key=jax.random.key(key),
        gamma=GAMMA,
        branches=branches,
        **extra,
    )


@pytest.fixture(scope="module")
def random_prompts():
    """Prompts of 2..8 tokens, even rows left-padded and odd rows right-padded, in one batch."""
    rng = np.random.default_rng(5)
    tokens = rng.integers(3, CFG.vocab_size, (ROWS, PROMPT_LEN), dtype=np.int32)
    lengths = rng.integers(2, PROMPT_LEN + 1, ROWS, dtype=np.int32)
    left = np.arange(ROWS) % 2 == 0
    start = np.where(left, PROMPT_LEN - lengths, 0).astype(np.int32)
    end = np.where(left, PROMPT_LEN, lengths).astype(np.int32)
    return PromptBatch(jnp.asarray(tokens), jnp.asarray(start), jnp.asarray(end))


@pytest.fixture(scope="module")
def greedy_reference(params, random_prompts):
    sampling = SamplingParams(temperature=0.0, max_tokens=NEW, **PENALTIES)
    return sampling, np.asarray(
        generate(params, CFG, random_prompts, sampling=sampling, key=jax.random.key(0)).tokens
    )


@pytest.mark.parametrize("mode", MODES)
def test_greedy_speculation_equals_greedy_decoding(
    params, draft_params, random_prompts, greedy_reference, mode
):
    sampling, want = greedy_reference
    result = _speculate(params, draft_params, mode, random_prompts, sampling)
    np.testing.assert_array_equal(result.generation.tokens, want)
    assert 1.0 < result.tokens_per_step <= GAMMA + 1


@jax.jit
def _target_probs(params, prompts, generated, arrays):
    """The target's sampling distribution after ``prompts[R, P]`` + ``generated[R, G]`` (-1: none)."""
    v = CFG.vocab_size
    tokens = jnp.concatenate([prompts, jnp.maximum(generated, 0)], axis=1)
    last = prompts.shape[1] - 1 + (generated >= 0).sum(1)
    logits = forward(params, CFG, tokens)[jnp.arange(tokens.shape[0]), last]
    counts = count_tokens(jnp.maximum(generated, 0), v, generated >= 0)
    return jax.nn.softmax(
        filtered_logits(logits, arrays, counts, prompt_counts=count_tokens(prompts, v))
    )


def _exact_marginals(params, prompt, sampling, depth, rows=128):
    """Distributions of the first ``depth`` sampled tokens, by enumerating every prefix."""
    arrays = SamplingArrays.from_params(sampling, rows)
    marginals, prefixes = [], {(): 1.0}
    for _ in range(depth):
        seqs = list(prefixes)
        assert len(seqs) <= rows
        generated = np.full((rows, depth), -1, np.int32)
        for i, s in enumerate(seqs):
            generated[i, : len(s)] = s
        probs = np.asarray(
            _target_probs(params, jnp.array([prompt] * rows), jnp.asarray(generated), arrays),
            np.float64,
        )[: len(seqs)]
        weights = np.array([prefixes[s] for s in seqs])
        marginals.append(weights @ probs)
        prefixes = {
            s + (t,): w * probs[i, t]
            for i, (s, w) in enumerate(zip(seqs, weights))
            for t in range(CFG.vocab_size)
            if probs[i, t] > 0
        }
    return marginals


@pytest.mark.parametrize("mode", MODES)
def test_speculative_samples_follow_the_target_distribution(params, draft_params, mode):
    prompt = [3, 4, 5, 3, 4, 6, 3, 4]
    sampling = SamplingParams(temperature=0.8, top_k=10, max_tokens=NEW, **PENALTIES)
    result = _speculate(params, draft_params, mode, jnp.array([prompt] * ROWS), sampling, key=3)
    tokens = np.asarray(result.generation.tokens)
    assert (np.asarray(result.generation.lengths) == NEW).all()
    assert 0.01 < result.acceptance_rate < 0.95  # both branches of the rule are exercised
    assert_follows_marginals(tokens, _exact_marginals(params, prompt, sampling, 3))


def assert_follows_marginals(tokens, marginals):
    """Chi-square tests of each column of ``tokens[ROWS, N]`` against its exact marginal."""
    for i, exact in enumerate(marginals):
        observed = np.bincount(tokens[:, i], minlength=CFG.vocab_size)
        assert observed[exact == 0].sum() == 0
        support = exact > 0
        _, p_value = stats.chisquare(
            observed[support], ROWS * exact[support] / exact[support].sum()
        )
        assert p_value > 1e-3, (i, p_value)


def test_a_draft_equal_to_the_target_is_always_accepted(params, random_prompts):
    sampling = SamplingParams(temperature=0.8, top_k=10, max_tokens=NEW, **PENALTIES)
    result = _speculate(params, params, "draft-tree", random_prompts, sampling)
    assert result.acceptance_rate > 0.999
    assert result.tokens_per_step > GAMMA + 0.99


@jax.jit
def _tree_logits(params, prompt, branches):
    """Prefill all but the prompt's last token, then score it and two branches as one tree."""
    cache = init_cache(CFG, 1, 16)
    start, end = jnp.array([0]), jnp.array([prompt.shape[1] - 1])
    _, cache = prefill(params, CFG, cache, prompt[:, :-1], start, end)
    block = jnp.concatenate([prompt[:, -1:], branches.reshape(1, -1)], axis=1)
    return extend_logits(params, CFG, cache, block, start, end, draft_tree(2, 3))[0]


def test_tree_attention_scores_every_branch_like_a_forward_pass(params):
    prompt = jnp.array([[3, 4, 5, 6]])
    branches = jnp.array([[[7, 8, 9], [10, 11, 12]]])
    logits = _tree_logits(params, prompt, branches)
    for c in range(2):
        full = forward(params, CFG, jnp.concatenate([prompt, branches[:, c]], axis=1))[0, 3:]
        nodes = [0] + [1 + c * 3 + i for i in range(3)]
        np.testing.assert_allclose(logits[0, nodes], full, atol=2e-5)


def test_a_draft_model_tree_has_at_most_one_branch_per_token():
    # Greedy rows start each chain from a different token of the draft's top-branches.
    with pytest.raises(ValueError, match="branches"):
        speculative_generate(
            None,
            CFG,
            [[3, 4]],
            sampling=SamplingParams(temperature=0.0),
            key=jax.random.key(0),
            branches=CFG.vocab_size + 1,
            draft_params={},
            draft_config=CFG,
        )


def test_prompt_lookup_proposes_what_followed_the_latest_ngram():
    seq = jnp.array(
        [
            [0, 0, 1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 0, 0],
            [7, 8, 9, 7, 8, 9, 7, 0, 0, 0, 0, 0, 0, 0],
            [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ]
    )
    lookup = jax.jit(ngram_drafts, static_argnames=("max_ngram", "gamma", "branches"))
    drafts = lookup(
        seq, jnp.array([2, 0, 0]), jnp.array([12, 7, 4]), max_ngram=3, gamma=3, branches=2
    )
    np.testing.assert_array_equal(drafts[0], [[3, 5, 1], [3, 4, 1]])  # "1 2" twice: latest first
    np.testing.assert_array_equal(drafts[1], [[8, 9, 7], [8, 9, 7]])  # "8 9 7" once
    np.testing.assert_array_equal(drafts[2], [[4, 4, 4], [4, 4, 4]])  # no match: last token


def test_policy_declines_large_batches_short_outputs_and_low_acceptance():
    assert expected_tokens_per_step(1.0, 4) == 5 and expected_tokens_per_step(0.0, 4) == 1
    good = advise_speculation(acceptance_rate=0.8, draft_cost=0.05, batch=1)
    assert good.speculate and good.gamma > 1 and good.speedup > 2
    assert not advise_speculation(acceptance_rate=0.8, draft_cost=0.05, batch=512).speculate
    assert not advise_speculation(acceptance_rate=0.8, draft_cost=0.05, output_tokens=4).speculate
    assert not advise_speculation(acceptance_rate=0.1, draft_cost=0.3).speculate
