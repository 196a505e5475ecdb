"""Sampling filters, penalties, seeds and the empirical distribution of sampled tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from agentic_jax.inference.decoding.sampling import (
    SamplingArrays,
    SamplingParams,
    count_tokens,
    filtered_logits,
    sample,
)

V = 16
EOS = 2
B = 4  # every filter test uses this batch, so they share one compilation
N = 8192  # draws in the distribution tests


@jax.jit
def _filter(logits, arrays, counts, prompt_counts, allowed):
    return filtered_logits(
        logits, arrays, counts, prompt_counts=prompt_counts, allowed=allowed, eos_id=EOS
    )


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
    return _filter(
        logits,
        arrays,
        _no_counts() if counts is None else counts,
        _no_counts() if prompt_counts is None else prompt_counts,
        jnp.ones((B, V), bool) if allowed is None else allowed,
    )


def draw(logits, key, arrays, counts=None, step=0):
    rows = logits.shape[0]
    counts = _no_counts(rows) if counts is None else counts
    return _draw(
        logits, key, arrays, counts, counts, jnp.broadcast_to(jnp.asarray(step, jnp.int32), (rows,))
    )


def _kept(f):
    return np.isfinite(np.asarray(f))


def test_top_k_keeps_exactly_k_highest():
    ks = [1, 3, 7, 0]
    logits = _logits(0)
    kept = _kept(filtered(logits, _arrays(*(SamplingParams(top_k=k) for k in ks))))
    for row, k in enumerate(ks):
        assert kept[row].sum() == (k or V)
        order = np.argsort(-np.asarray(logits[row]))
        assert kept[row, order[: k or V]].all()


def test_ties_are_broken_by_token_id():
    logits = jnp.zeros((B, V)).at[:, EOS].set(1.0)  # EOS, then fifteen tied tokens
    params = [
        SamplingParams(top_k=3),
        SamplingParams(top_k=1),
        SamplingParams(top_p=0.5),
        SamplingParams(top_p=0.5, temperature=0.1),
    ]
    kept = _kept(filtered(logits, _arrays(*params)))
    assert sorted(np.flatnonzero(kept[0])) == [0, 1, EOS]
    assert sorted(np.flatnonzero(kept[1])) == [EOS]
    # p(EOS) = e / (e + 15) < 0.5: the tied tokens join in id order until the mass reaches 0.5.
    p_eos, p_tie = np.e / (np.e + 15), 1 / (np.e + 15)
    need = int(np.ceil((0.5 - p_eos) / p_tie))
    assert sorted(np.flatnonzero(kept[2])) == sorted(
        [EOS] + [i for i in range(V) if i != EOS][:need]
    )
    assert sorted(np.flatnonzero(kept[3])) == [EOS]  # at T=0.1 EOS alone holds the mass


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    ps = [0.3, 0.5, 0.9, 0.99]
    logits = _logits(1)
    kept = _kept(filtered(logits, _arrays(*(SamplingParams(top_p=p, temperature=0.7) for p in ps))))
    probs = np.asarray(jax.nn.softmax(logits / 0.7))
    for row, p in enumerate(ps):
        mass = np.sort(probs[row][kept[row]])
        assert mass.sum() >= p - 1e-6  # reaches p ...
        assert mass.sum() - mass[0] < p  # ... and no smaller set of top tokens does
        assert probs[row][~kept[row]].max(initial=0) <= mass[0]


def _kept_by_sorting(z, p: SamplingParams):
    """Steps 3-7 of ``sampling.py`` the slow way: sort by (-logit, id) and walk the ranking.

    Also says whether rounding could flip the answer (a mass or ratio within 1e-5 of its bound).
    """
    s = z / np.float32(p.temperature)
    order = sorted(range(V), key=lambda t: (-s[t], t))
    top_k = np.zeros(V, bool)
    top_k[order[: p.top_k or V]] = True
    e = np.where(top_k, np.exp(s - s[top_k].max()), 0.0)
    probs = e / e.sum()
    top_p, before, close = np.zeros(V, bool), 0.0, False
    for t in order:
        top_p[t] = before < p.top_p or p.top_p == 1
        close |= p.top_p < 1 and abs(before - p.top_p) < 1e-5
        before += probs[t]
    close |= p.min_p > 0 and bool(np.any(np.abs(probs / probs.max() - p.min_p) < 1e-5))
    keep = top_k & top_p & (probs >= p.min_p * probs.max())
    keep[EOS] = True
    return keep & np.isfinite(s), close


_rows = st.tuples(
    # Few distinct values, so ties (and ties across the top-k / top-p boundary) are common; 20
    # leaves the rest so little mass that the float sum before them reaches 1 (top_p = 1).
    st.lists(
        st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 1.0, 2.5, 20.0]), min_size=V, max_size=V
    ).filter(lambda z: np.isfinite(z).any()),
    st.builds(
        SamplingParams,
        temperature=st.sampled_from([0.5, 1.0, 3.0]),
        top_k=st.integers(0, V + 1),
        top_p=st.sampled_from([0.2, 0.5, 0.9, 1.0]),
        min_p=st.sampled_from([0.0, 0.1, 0.5]),
    ),
)


@settings(max_examples=20, deadline=None)
@given(st.lists(_rows, min_size=B, max_size=B))
def test_truncation_keeps_what_a_sorted_walk_keeps(rows):
    logits = np.array([z for z, _ in rows], np.float32)
    kept = _kept(filtered(jnp.asarray(logits), _arrays(*(p for _, p in rows))))
    for b, (_z, p) in enumerate(rows):
        want, close = _kept_by_sorting(logits[b], p)
        if not close:
            np.testing.assert_array_equal(kept[b], want, err_msg=str(p))


def test_min_p_threshold_is_relative_to_the_top_token():
    ms = [0.0, 0.05, 0.2, 0.6]
    logits = _logits(2)
    kept = _kept(filtered(logits, _arrays(*(SamplingParams(min_p=m) for m in ms))))
    probs = np.asarray(jax.nn.softmax(logits))
    for row, m in enumerate(ms):
        np.testing.assert_array_equal(kept[row], probs[row] >= m * probs[row].max())


def test_penalties_follow_their_formulas():
    logits = _logits(3)
    generated = count_tokens(jnp.tile(jnp.array([[4, 4, 5]]), (B, 1)), V)
    prompt = count_tokens(jnp.tile(jnp.array([[6, 7]]), (B, 1)), V)
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.2)
    got = np.asarray(filtered(logits, _arrays(*[params] * B), generated, prompt))
    want = np.asarray(logits).copy()
    for tok in (4, 5, 6, 7):
        want[:, tok] = np.where(want[:, tok] > 0, want[:, tok] / 1.5, want[:, tok] * 1.5)
    want[:, 4] -= 0.3 * 2 + 0.2
    want[:, 5] -= 0.3 * 1 + 0.2
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_eos_survives_truncation_unless_a_constraint_forbids_it():
    logits = _logits(4).at[:, EOS].set(-10.0)
    params = SamplingParams(top_k=1, top_p=0.1, min_p=0.9)
    kept = _kept(filtered(logits, _arrays(*[params] * B)))
    assert kept[:, EOS].all() and (kept.sum(-1) == 2).all()
    allowed = jnp.ones((B, V), bool).at[1, EOS].set(False)
    kept = _kept(filtered(logits, _arrays(*[params] * B), allowed=allowed))
    assert kept[0, EOS] and not kept[1, EOS] and kept[1].sum() == 1


def test_greedy_rows_take_the_argmax_with_log_probability_zero():
    logits = _logits(5).at[:, EOS].set(0.0)
    s = draw(logits, jax.random.key(0), _arrays(*[SamplingParams(temperature=0.0)] * B))
    np.testing.assert_array_equal(s.tokens, jnp.argmax(logits, -1))
    np.testing.assert_array_equal(s.sample_logprobs, 0.0)
    np.testing.assert_allclose(s.raw_logprobs, jax.nn.log_softmax(logits).max(-1), rtol=1e-6)


def test_seeded_rows_do_not_depend_on_their_batch_but_on_their_step():
    logits = jnp.zeros((B, V))
    seeded, free = SamplingParams(seed=1234), SamplingParams()
    a = draw(logits, jax.random.key(0), _arrays(seeded, free, free, free), step=5)
    b = draw(
        logits, jax.random.key(9), _arrays(free, free, seeded, free), step=jnp.array([0, 1, 5, 2])
    )
    assert a.tokens[0] == b.tokens[2]
    c = draw(logits, jax.random.key(0), _arrays(*[seeded] * B), step=jnp.arange(B))
    assert len(set(np.asarray(c.tokens).tolist())) > 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=6),
        SamplingParams(
            temperature=1.3, top_p=0.8, min_p=0.02, repetition_penalty=1.3, frequency_penalty=0.4
        ),
    ],
    ids=["top_k", "top_p+min_p+penalties"],
)
def test_sampled_frequencies_match_the_filtered_distribution(params):
    logits = jnp.tile(_logits(7)[:1].at[:, EOS].set(0.0), (N, 1))
    counts = jnp.tile(count_tokens(jnp.array([[1, 1, 3]]), V), (N, 1))
    arrays = SamplingArrays.from_params(params, N)
    s = draw(logits, jax.random.key(42), arrays, counts)
    target = np.asarray(
        jax.nn.softmax(
            filtered(logits[:B], SamplingArrays.from_params(params, B), counts[:B], counts[:B])
        )
    )[0].astype(np.float64)
    observed = np.bincount(np.asarray(s.tokens), minlength=V)
    assert observed[target == 0].sum() == 0
    support = target > 0
    assert support.sum() > 2
    _, p_value = stats.chisquare(observed[support], N * target[support] / target[support].sum())
    assert p_value > 1e-3
    np.testing.assert_allclose(s.sample_logprobs, np.log(target[np.asarray(s.tokens)]), rtol=1e-4)


def test_invalid_params_are_rejected():
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingArrays.from_params([SamplingParams()], batch=2)
    for counts in ({"top_k": 2.5}, {"max_tokens": 3.5}):
        with pytest.raises(ValueError, match="not an integer"):
            SamplingParams(**counts)
    params = SamplingParams(top_k=np.int64(3), max_tokens=4.0)
    assert type(params.top_k) is type(params.max_tokens) is int
