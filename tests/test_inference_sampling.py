"""Sampling filters, penalties, seeds and the empirical distribution of sampled tokens."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from agentic_jax.inference.sampling import (SamplingArrays, SamplingParams, count_tokens,
                                            filtered_logits, sample)

V = 16
EOS = 2
B = 4  # every filter test uses this batch, so they share one compilation
N = 8192  # draws in the distribution tests


@jax.jit
def _filter(logits, arrays, counts, prompt_counts, allowed):
    return filtered_logits(logits, arrays, counts, prompt_counts=prompt_counts, allowed=allowed,
                           eos_id=EOS)


@jax.jit
def _draw(logits, key, arrays, counts, prompt_counts, step):
    return sample(logits, key, arrays, counts, step=step, prompt_counts=prompt_counts, eos_id=EOS)


def _logits(seed):
    """Random logits with EOS on top, so that protecting it never changes what filters keep."""
    z = 2.0 * jax.random.normal(jax.random.key(seed), (B, V))
    return z.at[:, EOS].set(z.max(-1) + 1.0)


def _arrays(*params):
    return SamplingArrays.from_params(list(params))


def _no_counts(rows=B):
    return jnp.zeros((rows, V), jnp.int32)


def filtered(logits, arrays, counts=None, prompt_counts=None, allowed=None):
    return _filter(logits, arrays, _no_counts() if counts is None else counts,
                   _no_counts() if prompt_counts is None else prompt_counts,
                   jnp.ones((B, V), bool) if allowed is None else allowed)


def draw(logits, key, arrays, counts=None, step=0):
    rows = logits.shape[0]
    counts = _no_counts(rows) if counts is None else counts
    return _draw(logits, key, arrays, counts, counts, jnp.broadcast_to(jnp.asarray(step, jnp.int32), (rows,)))


def _kept(f):
    return np.isfinite(np.asarray(f))


def test_top_k_keeps_exactly_k_highest():
    ks = [1, 3, 7, 0]
    logits = _logits(len(ks))
    kept = _kept(filtered(logits, _arrays(*(SamplingParams(top_k=k) for k in ks))))
    for row, k in enumerate(ks):
        assert kept[row].sum() == (k or V)
        order = np.argsort(-np.asarray(logits[row]))
        assert kept[row, order[:k or V]].all()


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    ps = [0.1, 0.5, 0.9, 0.99]
    logits = _logits(len(ps), seed=1)
    kept = _kept(filtered(logits, _arrays(*(SamplingParams(top_p=p, temperature=0.7) for p in ps))))
    probs = np.asarray(jax.nn.softmax(logits / 0.7))
    for row, p in enumerate(ps):
        mass = np.sort(probs[row][kept[row]])
        assert mass.sum() >= p - 1e-6  # reaches p ...
        assert mass.sum() - mass[0] < p  # ... and no smaller set of top tokens does
        assert probs[row][~kept[row]].max(initial=0) <= mass[0]


def test_min_p_threshold_is_relative_to_the_top_token():
    logits = _logits(3, seed=2)
    ms = [0.05, 0.2, 0.6]
    kept = _kept(filtered(logits, _arrays(*(SamplingParams(min_p=m) for m in ms))))
    probs = np.asarray(jax.nn.softmax(logits))
    for row, m in enumerate(ms):
        np.testing.assert_array_equal(kept[row], probs[row] >= m * probs[row].max())


def test_penalties_follow_their_formulas():
    logits = _logits(1, seed=3)
    generated = jnp.array([[4, 4, 5]])
    prompt = jnp.array([[6, 7]])
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.2)
    got = np.asarray(filtered(logits, _arrays(params), count_tokens(generated, V),
                              prompt_counts=count_tokens(prompt, V)))[0]
    want = np.asarray(logits[0]).copy()
    for tok in (4, 5, 6, 7):
        want[tok] = want[tok] / 1.5 if want[tok] > 0 else want[tok] * 1.5
    want[4] -= 0.3 * 2 + 0.2
    want[5] -= 0.3 * 1 + 0.2
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_eos_survives_truncation_unless_a_constraint_forbids_it():
    logits = _logits(2, seed=4).at[:, EOS].set(-10.0)
    params = SamplingParams(top_k=1, top_p=0.1, min_p=0.9)
    kept = _kept(filtered(logits, _arrays(params, params), eos_id=EOS))
    assert kept[:, EOS].all() and (kept.sum(-1) == 2).all()
    allowed = jnp.ones((2, V), bool).at[1, EOS].set(False)
    kept = _kept(filtered(logits, _arrays(params, params), allowed=allowed, eos_id=EOS))
    assert kept[0, EOS] and not kept[1, EOS]


def test_greedy_rows_take_the_argmax_with_log_probability_zero():
    logits = _logits(3, seed=5)
    s = draw(logits, jax.random.key(0), _arrays(*[SamplingParams(temperature=0.0)] * 3))
    np.testing.assert_array_equal(s.tokens, jnp.argmax(logits, -1))
    np.testing.assert_array_equal(s.sample_logprobs, 0.0)
    np.testing.assert_allclose(s.raw_logprobs, jax.nn.log_softmax(logits).max(-1), rtol=1e-6)


def test_seeded_rows_do_not_depend_on_their_batch():
    logits = jnp.tile(_logits(1, seed=6), (3, 1))
    seeded = SamplingParams(seed=1234)
    a = draw(logits, jax.random.key(0), _arrays(seeded, SamplingParams(), SamplingParams()), step=5)
    b = draw(logits, jax.random.key(9), _arrays(SamplingParams(), SamplingParams(), seeded),
             step=jnp.array([0, 1, 5]))
    assert a.tokens[0] == b.tokens[2]
    steps = jnp.arange(64)
    rows = draw(jnp.tile(logits[:1], (64, 1)), jax.random.key(0), _arrays(*[seeded] * 64), step=steps)
    assert len(set(np.asarray(rows.tokens).tolist())) > 1  # the step is folded into the key


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=6),
    SamplingParams(temperature=1.3, top_p=0.8, min_p=0.02, repetition_penalty=1.3,
                   frequency_penalty=0.4),
], ids=["top_k", "top_p+min_p+penalties"])
def test_sampled_frequencies_match_the_filtered_distribution(params):
    n = 20_000
    logits = jnp.tile(_logits(1, seed=7), (n, 1))
    counts = jnp.tile(count_tokens(jnp.array([[1, 1, 3]]), V), (n, 1))
    arrays = SamplingArrays.from_params(params, n)
    s = draw(logits, jax.random.key(42), arrays, counts, prompt_counts=counts, eos_id=EOS)
    target = np.asarray(jax.nn.softmax(filtered(logits[:1], SamplingArrays.from_params(params, 1),
                                                counts[:1], prompt_counts=counts[:1], eos_id=EOS)))[0]
    target = target.astype(np.float64)
    observed = np.bincount(np.asarray(s.tokens), minlength=V)
    assert observed[target == 0].sum() == 0
    support = target > 0
    _, p_value = stats.chisquare(observed[support], n * target[support] / target[support].sum())
    assert p_value > 1e-3
    np.testing.assert_allclose(s.sample_logprobs, np.log(target[np.asarray(s.tokens)]), rtol=1e-4)


def test_invalid_params_are_rejected():
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingArrays.from_params([SamplingParams()], batch=2)
