"""Beam search and contrastive search against brute force on a tiny model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.inference import beam_search, contrastive_search
from agentic_jax.models import TransformerConfig, param_shapes
from agentic_jax.models.transformer import hidden_states, logits_from_hidden

CFG = TransformerConfig(
    vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32
)
EOS = 2
PROMPTS = [[3, 4, 5], [6, 7]]
WIDTH, ROWS = 16, 256  # every brute-force forward runs on this shape: one compilation


@pytest.fixture(scope="module")
def params():
    rng = np.random.default_rng(1)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, 0.5, s.shape), s.dtype), param_shapes(CFG)
    )


@jax.jit
def _forward(params, tokens):
    h = hidden_states(params, CFG, tokens)
    return h, jax.nn.log_softmax(logits_from_hidden(params, CFG, h))


def _run(params, seqs):
    """Full forward passes: hidden states ``[n, WIDTH, D]`` and next-token log-probs ``[n, V]``."""
    tokens = np.zeros((ROWS, WIDTH), np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    h, logp = _forward(params, jnp.asarray(tokens))
    last = [len(s) - 1 for s in seqs]
    return np.asarray(h[: len(seqs)]), np.asarray(logp[np.arange(len(seqs)), last])


def _next_logprobs(params, seqs):
    return _run(params, seqs)[1]


def _greedy(params, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(_next_logprobs(params, [seq])[0])))
        if seq[-1] == EOS:
            break
    return seq[len(prompt) :]


def _all_hypotheses(params, prompt, n, penalty):
    """Every continuation that ends in EOS or reaches n tokens, with its penalised score."""
    scored, frontier = [], [((), 0.0)]
    for step in range(n):
        logp = _next_logprobs(params, [prompt + list(s) for s, _ in frontier])
        grown = []
        for (seq, lp), row in zip(frontier, logp):
            for tok in range(CFG.vocab_size):
                hyp = (seq + (tok,), lp + row[tok])
                if tok == EOS or step == n - 1:
                    scored.append((hyp[1] / len(hyp[0]) ** penalty, hyp[0]))
                else:
                    grown.append(hyp)
        frontier = grown
    return sorted(scored, reverse=True)


def test_beam_width_one_is_greedy(params):
    result = beam_search(params, CFG, PROMPTS, width=1, max_new_tokens=6, eos_id=EOS)
    for b, prompt in enumerate(PROMPTS):
        want = _greedy(params, prompt, 6)
        assert np.asarray(result.tokens[b, 0, : result.lengths[b, 0]]).tolist() == want


def test_wide_beam_returns_the_exact_n_best_list(params):
    n, penalty, best = 3, 0.7, 4
    width = (CFG.vocab_size - 1) ** (n - 1)  # nothing is ever pruned
    result = beam_search(
        params,
        CFG,
        PROMPTS,
        width=width,
        max_new_tokens=n,
        eos_id=EOS,
        length_penalty=penalty,
        early_stopping=False,
        num_return=best,
    )
    assert result.tokens.shape == (len(PROMPTS), best, n)
    for b, prompt in enumerate(PROMPTS):
        want = _all_hypotheses(params, prompt, n, penalty)[:best]
        got = [
            tuple(np.asarray(result.tokens[b, i, : result.lengths[b, i]]).tolist())
            for i in range(best)
        ]
        assert got == [seq for _, seq in want]
        np.testing.assert_allclose(result.scores[b], [s for s, _ in want], rtol=1e-4)


def _beam_reference(params, prompt, width, n, penalty, eos):
    """The module's alive/finished beam search, run for all ``n`` steps without stopping."""
    alive, finished = [((), 0.0)], []
    for step in range(n):
        logp = _next_logprobs(params, [prompt + list(s) for s, _ in alive])
        grown = sorted(
            (
                (lp + row[tok], s + (tok,))
                for (s, lp), row in zip(alive, logp)
                for tok in range(CFG.vocab_size)
            ),
            reverse=True,
        )[: 2 * width]
        finished += [
            (lp / (step + 1) ** penalty, s) for lp, s in grown if s[-1] == eos or step == n - 1
        ]
        alive = [(s, lp) for lp, s in grown if s[-1] != eos][:width]
    return sorted(finished, reverse=True)[:width]


def test_stopping_without_early_stopping_never_changes_the_beams(params):
    # A prompt stops once no alive beam can beat its worst finished hypothesis; that must only
    # save steps.  Token 15 is this model's likeliest, so as EOS it ends beams early and most
    # prompts stop before the last step.  With a negative penalty the bound is the alive beam's
    # score at its next length.
    eos, penalty = 15, -0.5
    prompts = np.random.default_rng(3).integers(0, CFG.vocab_size, (12, 3)).tolist()
    result = beam_search(
        params,
        CFG,
        prompts,
        width=2,
        max_new_tokens=6,
        eos_id=eos,
        length_penalty=penalty,
        early_stopping=False,
    )
    for b, prompt in enumerate(prompts):
        want = _beam_reference(params, prompt, 2, 6, penalty, eos)
        got = [
            tuple(np.asarray(result.tokens[b, i, : result.lengths[b, i]]).tolist())
            for i in range(2)
        ]
        assert got == [seq for _, seq in want]
        np.testing.assert_allclose(result.scores[b], [s for s, _ in want], rtol=1e-4)


def test_contrastive_search_without_penalty_is_greedy(params):
    result = contrastive_search(
        params, CFG, PROMPTS, alpha=0.0, top_k=3, max_new_tokens=6, eos_id=EOS
    )
    for b, prompt in enumerate(PROMPTS):
        assert np.asarray(result.tokens[b, : result.lengths[b]]).tolist() == _greedy(
            params, prompt, 6
        )


def test_contrastive_search_maximises_the_degeneration_penalised_score(params):
    alpha, k, n = 0.6, 3, 6
    result = contrastive_search(
        params, CFG, PROMPTS, alpha=alpha, top_k=k, max_new_tokens=n, eos_id=EOS
    )
    for b, prompt in enumerate(PROMPTS):
        seq = list(prompt)
        while len(seq) < len(prompt) + n and seq[-1] != EOS:
            probs = np.exp(_next_logprobs(params, [seq])[0])
            candidates = np.argsort(-probs)[:k]
            h, _ = _run(params, [seq + [int(c)] for c in candidates])
            h = h[:, : len(seq) + 1] / np.linalg.norm(h[:, : len(seq) + 1], axis=-1, keepdims=True)
            penalty = np.einsum("cd,csd->cs", h[:, -1], h[:, :-1]).max(-1)
            seq.append(
                int(candidates[np.argmax((1 - alpha) * probs[candidates] - alpha * penalty)])
            )
        assert np.asarray(result.tokens[b, : result.lengths[b]]).tolist() == seq[len(prompt) :]
    # The penalty changes the output of this model (else the test would not tell).
    greedy = contrastive_search(
        params, CFG, PROMPTS, alpha=0.0, top_k=k, max_new_tokens=n, eos_id=EOS
    )
    assert not np.array_equal(greedy.tokens, result.tokens)


def test_a_prompt_gets_the_same_beams_alone_and_in_a_batch(params):
    # [11, 4] has two finished hypotheses after a few steps, [6, 7] runs to the end: a done prompt
    # must not take the better (longer) hypotheses its alive beams find meanwhile.
    kwargs = {"width": 2, "max_new_tokens": 6, "eos_id": EOS, "early_stopping": True}
    alone = beam_search(params, CFG, [[11, 4]], **kwargs)
    batch = beam_search(params, CFG, [[11, 4], [6, 7]], **kwargs)
    np.testing.assert_array_equal(alone.tokens[0], batch.tokens[0])
    np.testing.assert_array_equal(alone.lengths[0], batch.lengths[0])
    np.testing.assert_allclose(alone.scores[0], batch.scores[0], rtol=1e-5)


def test_invalid_arguments_are_named():
    with pytest.raises(ValueError, match="max_new_tokens"):
        beam_search(None, CFG, PROMPTS, width=2, max_new_tokens=0)
    with pytest.raises(ValueError, match="width"):
        beam_search(None, CFG, PROMPTS, width=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="vocab_size"):
        contrastive_search(None, CFG, PROMPTS, top_k=CFG.vocab_size + 1)
