"""KV-cache decoding against full forward passes, per-row stopping and host-side stop strings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import sharding
from agentic_jax.inference import (
    GenerationResult,
    PromptBatch,
    SamplingParams,
    beam_search,
    contrastive_search,
    generate,
    generate_recompute,
    init_cache,
    speculative_generate,
    truncate_at_stop_strings,
)
from agentic_jax.models import TransformerConfig, forward, param_shapes

CFG = TransformerConfig(
    vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32
)
EOS = 2
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
NEW = 6


@pytest.fixture(scope="module")
def params():
    """Random weights drawn with numpy (``init_params`` would compile for seconds)."""
    rng = np.random.default_rng(0)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, 0.3, s.shape), s.dtype), param_shapes(CFG)
    )


def _generate(params, config, sampling, *, padding="left", key=1):
    """Every call has the same shapes and static arguments, so they share one compilation."""
    return generate(
        params,
        config,
        PromptBatch.from_lists(PROMPTS, padding=padding, length=5),
        sampling=sampling,
        key=jax.random.key(key),
        eos_id=EOS,
        return_logits=True,
    )


def _full_forward_logits(params, config, result: GenerationResult):
    """Logits of a plain forward pass over each row's prompt + generated tokens, right-padded."""
    seqs = [
        p + np.asarray(result.tokens[b, : result.lengths[b]]).tolist()
        for b, p in enumerate(PROMPTS)
    ]
    width = max(map(len, seqs))
    return forward(params, config, jnp.array([s + [0] * (width - len(s)) for s in seqs]))


@pytest.mark.parametrize("padding,window", [("left", None), ("right", None), ("left", 3)])
def test_cached_logits_equal_a_full_forward_over_the_growing_prefix(params, padding, window):
    config = CFG.replace(sliding_window=window)
    result = _generate(params, config, SamplingParams(max_tokens=NEW), padding=padding)
    full = _full_forward_logits(params, config, result)
    for b, prompt in enumerate(PROMPTS):
        n = int(result.lengths[b])
        assert n >= 1
        want = full[b, len(prompt) - 1 : len(prompt) - 1 + n]
        np.testing.assert_allclose(result.logits[b, :n], want, atol=2e-5, rtol=1e-5)
        tokens = np.asarray(result.tokens[b, :n])
        np.testing.assert_allclose(
            result.raw_logprobs[b, :n], jax.nn.log_softmax(want)[np.arange(n), tokens], atol=2e-5
        )
        # Temperature 1 with no filters: the sampling distribution is the model's.
        np.testing.assert_allclose(
            result.sample_logprobs[b, :n], result.raw_logprobs[b, :n], atol=1e-5
        )


def test_greedy_equals_the_recompute_decoder(params):
    prompt = jnp.array([(p * 5)[:5] for p in PROMPTS])
    got = generate(
        params,
        CFG,
        PromptBatch.from_array(prompt),
        key=jax.random.key(1),
        eos_id=EOS,
        sampling=SamplingParams(temperature=0, max_tokens=NEW),
        return_logits=True,
    )
    want = np.asarray(
        generate_recompute(
            params, CFG, prompt, jax.random.key(0), max_new_tokens=NEW, temperature=0.0
        )
    )[:, 5:]
    for b in range(len(PROMPTS)):
        n = int(got.lengths[b])
        np.testing.assert_array_equal(got.tokens[b, :n], want[b, :n])
        assert n == NEW or want[b, n - 1] == EOS


def test_rows_stop_on_their_own_stop_tokens_and_budgets(params):
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW)
    free = np.asarray(_generate(params, CFG, greedy).tokens)
    stop = int(free[1, 2])
    rows = [
        SamplingParams(temperature=0.0, max_tokens=2),
        SamplingParams(temperature=0.0, max_tokens=NEW, stop_token_ids=(stop,)),
        greedy,
    ]
    result = _generate(params, CFG, rows)
    lengths = np.asarray(result.lengths)
    assert lengths[0] == 2
    assert lengths[1] == free[1].tolist().index(stop) + 1
    eos_at = [i for i, t in enumerate(free[2]) if t == EOS]
    assert lengths[2] == (eos_at[0] + 1 if eos_at else NEW)
    for b in range(3):
        np.testing.assert_array_equal(result.tokens[b, : lengths[b]], free[b, : lengths[b]])
        assert (np.asarray(result.tokens[b, lengths[b] :]) == 0).all()
        assert (np.asarray(result.raw_logprobs[b, lengths[b] :]) == 0).all()
        assert (np.asarray(result.logits[b, lengths[b] :]) == 0).all()


def test_seeded_rows_reproduce_across_batches(params):
    seeded = SamplingParams(max_tokens=NEW, seed=7)
    a = _generate(params, CFG, [seeded, SamplingParams(max_tokens=NEW), seeded], key=1)
    b = _generate(params, CFG, [seeded, seeded, seeded], key=2)
    np.testing.assert_array_equal(a.tokens[0], b.tokens[0])
    np.testing.assert_array_equal(a.tokens[2], b.tokens[2])


class _CharTokenizer:
    """Token ``i`` is the character ``chr(ord('a') + i)``."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + int(i)) for i in ids)


def test_stop_strings_cut_after_the_completing_token():
    tokens = jnp.array([[0, 1, 2, 3, 4], [2, 3, 2, 3, 0]])
    result = GenerationResult(tokens, jnp.array([5, 4]), jnp.ones((2, 5)), jnp.ones((2, 5)))
    params = [SamplingParams(stop_strings=("cd", "zz")), SamplingParams(stop_strings=("q",))]
    cut = truncate_at_stop_strings(result, _CharTokenizer(), params)
    np.testing.assert_array_equal(cut.lengths, [4, 4])
    np.testing.assert_array_equal(cut.tokens[0], [0, 1, 2, 3, 0])
    np.testing.assert_array_equal(cut.sample_logprobs[0], [1, 1, 1, 1, 0])


def test_cache_is_laid_out_by_its_logical_axes():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2}, devices=jax.devices()[:4])
    with sharding.activate(mesh):
        cache = jax.jit(lambda: init_cache(CFG, 4, 8))()
    assert cache.k.shape == (CFG.n_layers, 4, 8, CFG.n_kv_heads, CFG.head_dim)
    # cache_batch over (data, fsdp); cache_length whole; one kv head cannot split over tensor.
    want = NamedSharding(mesh, PartitionSpec(None, ("data", "fsdp"), None, None, None))
    assert cache.k.sharding.is_equivalent_to(want, 5) and cache.v.sharding.is_equivalent_to(want, 5)


@pytest.mark.parametrize(
    "prompts", [np.array([1, 2, 3]), np.zeros((2, 0), np.int32)], ids=["one-dimensional", "empty"]
)
def test_prompt_arrays_must_be_batches_of_nonempty_rows(prompts):
    # An empty row would silently read its logits from position -1.
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        PromptBatch.from_array(prompts)


@pytest.mark.parametrize(
    "prompts", [[[3], [1, CFG.vocab_size]], np.array([[-1, 3]])], ids=["lists", "numpy"]
)
def test_host_prompts_outside_the_vocabulary_are_rejected(prompts):
    # The embedding lookup would silently clamp them (device arrays go unchecked: no sync).
    sampling = SamplingParams(max_tokens=1)
    decoders = [
        lambda: generate(None, CFG, prompts, sampling=sampling, key=None),
        lambda: speculative_generate(None, CFG, prompts, sampling=sampling, key=None),
        lambda: beam_search(None, CFG, prompts, width=1, max_new_tokens=1),
        lambda: contrastive_search(None, CFG, prompts, top_k=1, max_new_tokens=1),
    ]
    for decode in decoders:
        with pytest.raises(ValueError, match="token ids"):
            decode()


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("fork", [[0, 0, 0, 1, 2, 2], [2, 1, 0, 1, 2, 0]])
def test_forked_rows_share_a_prefill_and_equal_the_repeated_prompts(params, padding, fork):
    """Forking a prompt's prefill into several rows samples exactly what the prompt repeated does."""
    sampling = SamplingParams(temperature=1.0, max_tokens=NEW)
    options = {"sampling": sampling, "key": jax.random.key(3), "eos_id": EOS}
    forked = generate(
        params, CFG, PromptBatch.from_lists(PROMPTS, padding=padding), fork=fork, **options
    )
    repeated = generate(
        params, CFG, PromptBatch.from_lists([PROMPTS[i] for i in fork], padding=padding), **options
    )
    np.testing.assert_array_equal(forked.tokens, repeated.tokens)
    np.testing.assert_array_equal(forked.lengths, repeated.lengths)
    np.testing.assert_allclose(forked.raw_logprobs, repeated.raw_logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="outside"):
        generate(params, CFG, PromptBatch.from_lists(PROMPTS), fork=[0, 3], **options)
