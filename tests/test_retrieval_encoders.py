"""Dual encoders: InfoNCE against a float64 reference (duplicate positives masked), Matryoshka
prefixes, training data made from the corpus, and the `train_encoder` job through its shipped
gin config (held-out recall@10 rises, save, load, resume)."""

import dataclasses
import json
import pathlib
import re

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import CORPUS, dictionary_splits, retrieval_model_dir

import agentic_jax.data
import sharding
from agentic_jax import config as gin_config
from agentic_jax.jobs import run_job
from agentic_jax.retrieval.documents import Document, load_documents
from agentic_jax.retrieval.encoders import (
    EncoderConfig,
    encoder_axes,
    encoder_loss,
    info_nce,
    init_encoder,
    load_encoder,
    matryoshka_dims,
    truncate,
)
from agentic_jax.retrieval.trainer import load_trunk
from agentic_jax.retrieval.training_data import RetrievalDataSpec, make_splits, title_of
from agentic_jax.training.metrics import read_metrics


def reference_info_nce(scores, ids, temperature, mask_duplicates=True):
    """ℓ_i = −s_ii/τ + log Σ_{j ∈ V_i} exp(s_ij/τ) in float64, V_i every column or, masked, the
    columns whose passage is not query i's positive (its own column kept)."""
    scores = np.asarray(scores, np.float64) / temperature
    out = []
    for i in range(scores.shape[0]):
        keep = [
            j for j in range(scores.shape[1]) if j == i or not mask_duplicates or ids[j] != ids[i]
        ]
        row = scores[i, keep]
        out.append(np.log(np.sum(np.exp(row - row.max()))) + row.max() - scores[i, i])
    return np.asarray(out)


@st.composite
def contrastive_batches(draw):
    rows = draw(st.integers(1, 5))
    columns = rows + draw(st.integers(0, 6))
    ids = draw(st.lists(st.integers(0, columns), min_size=columns, max_size=columns))
    scores = draw(
        st.lists(st.floats(-1, 1, width=32), min_size=rows * columns, max_size=rows * columns)
    )
    temperature = draw(st.floats(0.02, 2.0))
    return (
        np.asarray(scores, np.float32).reshape(rows, columns),
        np.asarray(ids, np.int32),
        temperature,
    )


@given(contrastive_batches(), st.booleans())
def test_info_nce_matches_a_float64_reference(batch, mask_duplicates):
    scores, ids, temperature = batch
    got = jax.jit(info_nce, static_argnames="mask_duplicates")(
        scores, ids, temperature, mask_duplicates=mask_duplicates
    )
    want = reference_info_nce(scores, ids, temperature, mask_duplicates)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)


def test_a_repeated_positive_is_no_negative():
    """Queries 0 and 1 were made from passage 7: column 1 is query 0's answer too, so the masked
    loss leaves it out of query 0's denominator (and column 0 out of query 1's)."""
    scores = np.asarray([[0.9, 0.8, 0.1, 0.0], [0.7, 0.9, 0.2, 0.1], [0.1, 0.3, 0.8, 0.6]])
    ids = np.asarray([7, 7, 3, 5])
    masked = np.asarray(info_nce(jnp.asarray(scores), jnp.asarray(ids), 0.5))
    unmasked = np.asarray(
        info_nce(jnp.asarray(scores), jnp.asarray(ids), 0.5, mask_duplicates=False)
    )
    without = [
        reference_info_nce(scores[i : i + 1, [i, 2, 3]], np.arange(3), 0.5)[0] for i in (0, 1)
    ]
    np.testing.assert_allclose(masked[:2], without, rtol=1e-5)
    np.testing.assert_allclose(masked[2], unmasked[2], rtol=1e-6)  # query 2's positive is unique
    assert np.all(unmasked[:2] > masked[:2] + 0.1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("retrieval_model")
    return (*retrieval_model_dir(path), path)


def test_matryoshka_adds_a_loss_term_per_prefix_and_prefixes_are_unit_vectors(model_dir):
    config, trunk, _, _ = model_dir
    encoder = EncoderConfig(pooling="mean", dim=12)
    params = init_encoder(trunk, config, encoder, jax.random.key(1))
    dims = matryoshka_dims((4, 8), config, encoder)
    assert dims == (4, 8, 12)
    rng = np.random.default_rng(0)
    batch = {
        "query": rng.integers(3, 64, (4, 6)).astype(np.int32),
        "query_mask": np.ones((4, 6), np.int32),
        "passages": rng.integers(3, 64, (4, 2, 10)).astype(np.int32),
        "passage_mask": np.ones((4, 2, 10), np.int32),
        "ids": np.arange(8, dtype=np.int32).reshape(2, 4).T,
    }
    total, count, sums = jax.jit(encoder_loss(config, encoder, temperature=0.1, dims=dims))(
        params, batch, None
    )
    assert {f"loss_dim{d}" for d in dims} <= set(sums) and count == 4
    np.testing.assert_allclose(total, sum(sums[f"loss_dim{d}"] for d in dims), rtol=1e-6)
    assert len({round(float(sums[f"loss_dim{d}"]), 4) for d in dims}) == 3  # three different terms
    prefixes = [
        truncate(jnp.asarray(np.random.default_rng(1).normal(size=(3, 12))), d) for d in dims
    ]
    for d, prefix in zip(dims, prefixes):
        assert prefix.shape == (3, d)
        np.testing.assert_allclose(np.linalg.norm(prefix, axis=1), 1, rtol=1e-5)
    with pytest.raises(ValueError, match="matryoshka dims"):
        matryoshka_dims((16,), config, encoder)


def test_encoder_parameters_have_logical_axes_the_rules_place(model_dir):
    config, trunk, _, _ = model_dir
    encoder = EncoderConfig(dim=8)
    params = init_encoder(trunk, config, encoder, jax.random.key(1))
    specs = sharding.logical_to_specs(encoder_axes(config, encoder), {"fsdp": 2}, shapes=params)
    assert specs["proj"] == jax.sharding.PartitionSpec("fsdp", None)


RESEARCH = pathlib.Path(agentic_jax.data.__file__).parent / "research_corpus"


def tiny_documents() -> list[Document]:
    """The tiny corpus cut into its documentation topics (a title line underlined), and the
    research corpus's Markdown notes."""
    text = pathlib.Path(CORPUS).read_text()
    topics = re.split(r"\n(?=[^\n]+\n[*=-]{3,}\n)", text)
    return [Document(f"topic#{n}", t) for n, t in enumerate(topics)] + load_documents(RESEARCH)


def test_training_data_from_documents():
    documents = tiny_documents()
    assert len(documents) == 13
    settings = dict(max_chars=300, heldout_every=3, hard_negatives=2)
    splits = make_splits(documents, **settings)
    train, heldout = splits["train"], splits["heldout"]
    assert not set(train.passages) & set(heldout.passages)  # disjoint by passage
    texts = [" ".join(d.text.split()) for d in documents]
    kept = 0
    for split in (train, heldout):
        assert len(split.queries) == len(split.positives) == len(split.hard_negatives)
        assert "sentence" in split.kinds
        flat = [" ".join(p.split()) for p in split.passages]
        for query, kind, positive, negatives in zip(
            split.queries, split.kinds, split.positives, split.hard_negatives
        ):
            assert positive not in negatives and len(set(negatives)) == 2
            if kind == "sentence":  # cut out of its passage: the inverse cloze task
                kept += query in flat[positive]  # only where the passage repeats it
                assert any(
                    query in d and set(flat[positive].split()) <= set(d.split()) for d in texts
                )
                assert not any(query in flat[n] for n in negatives)
    assert kept <= 0.02 * (train.kinds.count("sentence") + heldout.kinds.count("sentence"))
    again = make_splits(documents, **settings)
    np.testing.assert_array_equal(again["train"].hard_negatives, train.hard_negatives)

    titles = {title_of(d.text): d.text for d in documents}
    only = make_splits(documents, max_chars=300, heldout_every=2, kinds=("title",))
    assert sum(len(split.queries) for split in only.values()) >= 8
    for split in only.values():  # a title asks for its document's first passage
        for query, positive in zip(split.queries, split.positives):
            text = titles[query]
            assert len(text[: text.index(split.passages[positive])].split()) <= 4
    spec = RetrievalDataSpec(path=CORPUS, max_documents=1)
    assert [d.id for d in spec.documents()] == ["tiny_corpus.txt"]


class Splits:
    """Data for `train_encoder`: anything whose ``splits()`` gives train and held-out splits."""

    def __init__(self, splits):
        self._splits = splits

    def splits(self):
        return self._splits


FAST = [
    "TrainSettings.steps = 30",
    "TrainSettings.batch_size = 16",
    "TrainSettings.peak_lr = 3e-3",
    "TrainSettings.warmup_steps = 2",
    "train_encoder.temperature = 0.1",
    "TrainSettings.eval_every = 15",
    "TrainSettings.checkpoint_every = 15",
    "train_encoder.dims = (8,)",
    "TrainSettings.progress = False",
    "EncoderConfig.dim = 16",
    "EncoderConfig.query_length = 8",
    "EncoderConfig.passage_length = 8",
]


def test_train_encoder_raises_heldout_recall_and_resumes(model_dir, tmp_path):
    _, _, tokenizer, path = model_dir
    splits = dictionary_splits(tokenizer)
    workdir = str(tmp_path / "encoder")

    def run(*extra):
        gin_config.parse(
            ["retrieval_encoder"], [f"train_encoder.init_from = '{path}'", *FAST, *extra]
        )
        gin.bind_parameter("train_encoder.data", Splits(splits))
        try:
            return run_job(workdir)
        finally:
            gin.clear_config()

    last = run()
    records = read_metrics(f"{workdir}/metrics.jsonl")
    evals = [r for r in records if "eval_recall@10" in r]
    assert [r["step"] for r in evals] == [0, 15, 30]
    assert evals[0]["eval_recall@10"] < 0.35  # chance is 10 / 60
    assert last["eval_recall@10"] > evals[0]["eval_recall@10"] + 0.25
    assert "eval_recall@10_dim8" in last and "loss_dim8" in last and "loss_dim16" in last

    encoder = load_encoder(workdir)
    assert encoder.dims == (8, 16) and encoder.encoder.dim == 16
    assert encoder.recall(splits["heldout"])["recall@10"] == pytest.approx(last["eval_recall@10"])
    vectors = encoder.encode_passages(["item must path", "values bound"], dim=8)
    assert vectors.shape == (2, 8)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, rtol=1e-5)
    with open(f"{workdir}/encoder.json") as f:
        assert json.load(f)["dims"] == [8, 16]

    resumed = run("TrainSettings.steps = 32")  # resumes at step 30, the last checkpoint
    assert [r["step"] for r in read_metrics(f"{workdir}/metrics.jsonl")] == list(range(33))
    assert resumed["step"] == 32


def test_a_trunk_from_a_run_or_random(model_dir):
    config, trunk, tokenizer, path = model_dir
    loaded, params, _ = load_trunk(str(path))
    assert loaded == config
    np.testing.assert_array_equal(params["embed"], trunk["embed"])
    random, params, tok = load_trunk(None, tokenizer=str(path / "tokenizer.json"), model=config)
    assert random == config and tok.vocab_size == tokenizer.vocab_size
    assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, trunk)
    with pytest.raises(ValueError, match="vocab_size"):
        small = dataclasses.replace(config, vocab_size=10)
        load_trunk(None, tokenizer=str(path / "tokenizer.json"), model=small)
