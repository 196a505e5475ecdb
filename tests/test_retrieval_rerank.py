"""Cross-encoder reranking: pair rows, the ranking losses, and the `train_reranker` job (a few
steps rank the relevant passage first more often; save, load, rerank a first stage)."""

import gin
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import dictionary_splits, retrieval_model_dir

from agentic_jax import config as gin_config
from agentic_jax.jobs import run_job
from agentic_jax.retrieval.rerank import (
    RerankingRetriever,
    load_reranker,
    pair_rows,
    ranking_loss,
)
from agentic_jax.retrieval.retriever import ranked
from agentic_jax.training.metrics import read_metrics


class Tokens:
    bos_id, eos_id = 1, 2


def test_pair_rows_read_query_then_passage_and_cut_the_passage():
    tokens, mask = pair_rows(Tokens(), [[5, 6, 7], [5]], [[8, 9], list(range(10, 30))], 10, 2)
    np.testing.assert_array_equal(tokens[0], [1, 5, 6, 2, 8, 9, 2, 0, 0, 0])
    np.testing.assert_array_equal(tokens[1], [1, 5, 2, 10, 11, 12, 13, 14, 15, 2])
    np.testing.assert_array_equal(mask.sum(1), [7, 10])


def test_ranking_losses():
    scores = np.asarray([[2.0, 0.5, -1.0], [0.0, 1.0, 1.0]])
    listwise = np.log(np.exp(scores).sum(1)) - scores[:, 0]
    pairwise = np.mean(np.log1p(np.exp(scores[:, 1:] - scores[:, :1])), axis=1)
    np.testing.assert_allclose(ranking_loss(jnp.asarray(scores), "listwise"), listwise, rtol=1e-6)
    np.testing.assert_allclose(ranking_loss(jnp.asarray(scores), "pairwise"), pairwise, rtol=1e-6)
    with pytest.raises(ValueError, match="expected one of"):
        ranking_loss(jnp.asarray(scores), "pointwise")


class Splits:
    def __init__(self, splits):
        self._splits = splits

    def splits(self):
        return self._splits


class Listed:
    """A first stage that returns its passages in a fixed order."""

    def __init__(self, ids):
        self.ids = ids

    def search(self, query, k):
        return ranked((i, 0.0) for i in self.ids[:k])


def test_train_reranker_ranks_the_relevant_passage_first_more_often(tmp_path):
    # Larger initial weights than a language model's: the last token then reads the pair
    # through attention from the start, and the dictionary is learnt in 250 steps.
    _, _, tokenizer = retrieval_model_dir(tmp_path, init_std=0.2)
    splits = dictionary_splits(tokenizer, words=16, hard_negatives=3)
    workdir = str(tmp_path / "reranker")
    gin_config.parse(
        ["retrieval_reranker"],
        [
            f"train_reranker.init_from = '{tmp_path}'",
            "TrainSettings.steps = 250",
            "TrainSettings.batch_size = 8",
            "TrainSettings.peak_lr = 4e-3",
            "TrainSettings.warmup_steps = 2",
            "TrainSettings.eval_every = 250",
            "TrainSettings.checkpoint_every = 250",
            "train_reranker.length = 12",
            "train_reranker.query_length = 4",
            "TrainSettings.progress = False",
        ],
    )
    gin.bind_parameter("train_reranker.data", Splits(splits))
    try:
        last = run_job(workdir)
    finally:
        gin.clear_config()
    first = read_metrics(f"{workdir}/metrics.jsonl")[0]
    assert first["step"] == 0 and first["eval_top1"] < 0.45  # chance is 1 / 4
    assert last["eval_top1"] > first["eval_top1"] + 0.15
    assert last["eval_mrr"] > first["eval_mrr"]

    reranker = load_reranker(workdir)
    heldout = splits["heldout"]
    assert reranker.top1(heldout)["top1"] == pytest.approx(last["eval_top1"])
    query, group = heldout.queries[0], [heldout.positives[0], *heldout.hard_negatives[0]]
    texts = {f"p{i}": heldout.passages[i] for i in group}
    order = np.argsort(-reranker.scores(query, [texts[f"p{i}"] for i in group]), kind="stable")
    first_stage = Listed([f"p{i}" for i in group])
    hits = RerankingRetriever(first_stage, reranker, texts.__getitem__, depth=4).search(query, 3)
    assert [h.id for h in hits] == [f"p{group[i]}" for i in order[:3]]
    assert [h.rank for h in hits] == [1, 2, 3]
