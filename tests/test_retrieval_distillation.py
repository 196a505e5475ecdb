"""Reasoning-aware retrieval fine-tuning: the KL(Q ‖ P) loss against a float64 reference, the
`train_ra_rft` job through its shipped config (held-out ranking of the helpful demonstration rises
over the untrained encoder), and the utility measurement with a scripted policy that succeeds
only when the helpful demonstration is in its prompt."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import dictionary_splits, retrieval_model_dir, task_tokenizer

from agentic_jax import config as gin_config
from agentic_jax.data.tokenizer import IM_END
from agentic_jax.envs.text import Arithmetic
from agentic_jax.jobs import run_job
from agentic_jax.models import TransformerConfig
from agentic_jax.post_training.demonstration_utility import (
    demonstration_text,
    demonstration_utilities,
    question,
)
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.retrieval.distillation import (
    UtilityRecord,
    distillation_loss,
    read_utilities,
    write_utilities,
)
from agentic_jax.retrieval.encoders import load_encoder
from agentic_jax.training.metrics import read_metrics


def reference_kl(scores, utility, mask, temperature, target_temperature):
    """KL(Q ‖ P) per row in float64 over the row's real candidates; 0 for an empty row."""
    out = []
    for s, u, m in zip(scores, utility, mask):
        real = np.flatnonzero(m)
        if real.size == 0:
            out.append(0.0)
            continue
        p = np.asarray(s, np.float64)[real] / temperature
        q = np.asarray(u, np.float64)[real] / target_temperature
        log_p = p - p.max() - np.log(np.sum(np.exp(p - p.max())))
        log_q = q - q.max() - np.log(np.sum(np.exp(q - q.max())))
        out.append(float(np.sum(np.exp(log_q) * (log_q - log_p))))
    return np.asarray(out)


@st.composite
def candidate_lists(draw):
    rows, width = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    floats = st.floats(-1, 1, width=32)
    scores = draw(st.lists(floats, min_size=rows * width, max_size=rows * width))
    utility = draw(
        st.lists(st.floats(0, 1, width=32), min_size=rows * width, max_size=rows * width)
    )
    mask = draw(st.lists(st.booleans(), min_size=rows * width, max_size=rows * width))
    shape = (rows, width)
    return (
        np.asarray(scores, np.float32).reshape(shape),
        np.asarray(utility, np.float32).reshape(shape),
        np.asarray(mask).reshape(shape),
        draw(st.floats(0.05, 2.0)),
        draw(st.floats(0.05, 2.0)),
    )


@jax.jit
def loss(scores, utility, mask, gamma, tau):
    return distillation_loss(scores, utility, mask, temperature=gamma, target_temperature=tau)


grad = jax.jit(jax.grad(lambda *args: jnp.sum(loss(*args))))


@given(candidate_lists())
def test_loss_matches_a_float64_reference(batch):
    scores, utility, mask, gamma, tau = batch
    got = loss(scores, utility, mask, gamma, tau)
    want = reference_kl(scores, utility, mask, gamma, tau)
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@given(candidate_lists())
def test_the_gradient_is_p_minus_q_and_vanishes_when_p_equals_q(batch):
    scores, utility, mask, gamma, tau = batch

    grads = np.asarray(grad(scores, utility, mask, gamma, tau))
    assert np.all(grads[~mask] == 0)  # padding gets no gradient
    for s, u, m, g in zip(scores, utility, mask, grads):
        real = np.flatnonzero(m)
        if real.size:
            p = np.exp(s[real] / gamma - np.logaddexp.reduce(s[real] / gamma))
            q = np.exp(u[real] / tau - np.logaddexp.reduce(u[real] / tau))
            np.testing.assert_allclose(g[real], (p - q) / gamma, atol=1e-3 / gamma)
    # Scores that rank as the utilities do, at the same sharpness, plus a per-row shift: P = Q.
    matched = utility * (gamma / tau) + np.arange(len(utility))[:, None]
    matched = matched.astype(np.float32)
    np.testing.assert_allclose(grad(matched, utility, mask, gamma, tau), 0, atol=2e-5 / gamma)
    assert np.all(np.asarray(loss(matched, utility, mask, gamma, tau)) < 1e-5)


def test_records_round_trip_and_uninformative_ones_are_flagged(tmp_path):
    records = [
        UtilityRecord("q1", ("a", "b"), (1.0, 0.0), "Arithmetic/1", ("Arithmetic/7", "x/8")),
        UtilityRecord("q2", ("a", "c"), (0.5, 0.5)),
    ]
    write_utilities(tmp_path / "u.jsonl", records)
    assert read_utilities(tmp_path / "u.jsonl") == records
    assert [r.informative for r in records] == [True, False]
    with pytest.raises(ValueError, match="2 candidates but 1 utilities"):
        UtilityRecord("q", ("a", "b"), (1.0,))


def helpful_demonstration_records(tokenizer, candidates: int = 4) -> list[UtilityRecord]:
    """Each dictionary query (tiny_models) with its own passage, the one helpful demonstration
    (utility 1), among ``candidates - 1`` other passages (utility 0), shuffled: an untrained
    encoder ranks the helpful one first by chance, a learned dictionary matches them."""
    rng = np.random.default_rng(0)
    records = []
    for split in dictionary_splits(tokenizer).values():
        for i, query in enumerate(split.queries):
            others = rng.choice(np.delete(np.arange(len(split.passages)), i), candidates - 1, False)
            order = rng.permutation([i, *others])
            records.append(
                UtilityRecord(
                    query,
                    tuple(split.passages[j] for j in order),
                    tuple(float(j == i) for j in order),
                )
            )
    return records


FAST = [
    "TrainSettings.steps = 20",
    "TrainSettings.batch_size = 16",
    "TrainSettings.peak_lr = 3e-3",
    "TrainSettings.warmup_steps = 2",
    "TrainSettings.eval_every = 20",
    "TrainSettings.checkpoint_every = 20",
    "TrainSettings.progress = False",
    "train_ra_rft.heldout_every = 4",
    "train_ra_rft.encoder = @EncoderConfig()",
    "train_ra_rft.dims = (8,)",
    "EncoderConfig.dim = 16",
    "EncoderConfig.query_length = 8",
    "EncoderConfig.passage_length = 8",
]


def test_ra_rft_raises_the_heldout_rank_of_the_helpful_demonstration(tmp_path):
    _, _, tokenizer = retrieval_model_dir(tmp_path / "model")
    utilities = tmp_path / "utilities.jsonl"
    write_utilities(utilities, helpful_demonstration_records(tokenizer))
    workdir = str(tmp_path / "ra_rft")

    def run(workdir, init_from, *extra):
        bindings = [f"train_ra_rft.utilities = '{utilities}'", *FAST, *extra]
        gin_config.parse(
            ["retrieval_ra_rft"], [f"train_ra_rft.init_from = '{init_from}'", *bindings]
        )
        try:
            return run_job(workdir)
        finally:
            gin.clear_config()

    last = run(workdir, tmp_path / "model")
    evals = [r for r in read_metrics(f"{workdir}/metrics.jsonl") if "eval_best@1" in r]
    assert [r["step"] for r in evals] == [0, 20]
    before = evals[0]
    assert before["eval_best@1"] < 0.45  # chance is 1 / 4
    assert last["eval_best@1"] > before["eval_best@1"] + 0.25
    assert last["eval_kl"] < before["eval_kl"]
    assert last["eval_utility@1"] == pytest.approx(last["eval_best@1"])  # one helpful, utility 1
    assert {"loss_dim8", "loss_dim16", "best@1"} <= set(last)

    encoder = load_encoder(workdir)  # an RA-RFT run is an encoder run
    assert encoder.dims == (8, 16) and encoder.encoder.dim == 16
    # Fine-tuning an encoder run again keeps its head and config; its pooling is not to change.
    again = run(str(tmp_path / "again"), workdir, "TrainSettings.steps = 1")
    assert again["eval_best@1"] == pytest.approx(last["eval_best@1"], abs=0.1)
    with pytest.raises(ValueError, match="pooling='last'"):
        run(str(tmp_path / "changed"), workdir, "EncoderConfig.pooling = 'last'")


SPEC = TaskSpec(generators=(Arithmetic(1),), num_train=4, max_length=256, action_length=24)


def test_a_policy_helped_by_one_demonstration_gives_it_utility_one(tmp_path):
    """Query ``i`` is solved exactly when pool problem ``i`` is in its prompt; pool problem 4 is
    query 0's own problem, never its candidate."""
    tokenizer = task_tokenizer(tmp_path)
    queries = SPEC.tasks("train")
    pool = Arithmetic(1).tasks(range(100, 104)) + [queries[0]]
    env = SPEC.env(tokenizer)
    pad = env.default_params.vocab.pad_id

    def reply(text):
        i = max(range(len(queries)), key=lambda i: text.rfind(question(queries[i])))
        answer = queries[i].answer if question(pool[i]) in text else "nothing"
        ids = tokenizer.encode(f"<think>so</think><answer>{answer}</answer>")
        ids = ids + [tokenizer.token_id(IM_END)]
        return ids + [pad] * (SPEC.action_length - len(ids))

    def scripted(tokens, length, active, key):
        actions = np.asarray(
            [reply(tokenizer.decode(t[:n].tolist())) for t, n in zip(tokens, length)], np.int32
        )
        return actions, np.where(actions != pad, -1.0, 0.0).astype(np.float32)

    config = TransformerConfig(vocab_size=tokenizer.vocab_size, max_seq_len=SPEC.context_length)
    for samples in (0, 2):
        records = demonstration_utilities(
            None, config, env, queries, pool, samples=samples, batch_rows=5, backend=scripted
        )
        assert [r.query for r in records] == [question(q) for q in queries]
        for i, record in enumerate(records):
            ids = [f"Arithmetic/{s}" for s in (100, 101, 102, 103, 0) if not (i == 0 and s == 0)]
            assert record.query_id == f"Arithmetic/{i}" and list(record.candidate_ids) == ids
            helpful = [float(c == f"Arithmetic/{100 + i}") for c in ids]
            assert list(record.utility) == helpful
            assert record.candidates[ids.index(f"Arithmetic/{100 + i}")] == demonstration_text(
                pool[i]
            )

    some = demonstration_utilities(
        None, config, env, queries, pool, candidates=2, seed=3, batch_rows=5, backend=scripted
    )
    for i, record in enumerate(some):
        assert len(record.candidates) == 2 and f"Arithmetic/{i}" not in record.candidate_ids
        assert list(record.utility) == [
            float(c == f"Arithmetic/{100 + i}") for c in record.candidate_ids
        ]
    write_utilities(tmp_path / "u.jsonl", some)
    assert read_utilities(tmp_path / "u.jsonl") == some
