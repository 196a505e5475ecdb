"""Cross-encoder reranking: the trunk reads a query and a passage together and a linear head
scores the pair, so every query token can attend to every passage token (Nogueira & Cho 2019,
"Passage Re-ranking with BERT", arXiv:1901.04085) at the price of one trunk pass per pair: it
reorders a first stage's short list.

The model is ``{"trunk": transformer params, "head": {"w": [D], "b": []}}``; a pair is the row
``BOS query EOS passage EOS`` (the passage cut to fit) and its score ``s(q, p) = w · h_last + b``,
read at the last token, the only one of a causal trunk that has read both.  Trained on a query,
its positive and its hard negatives ``s⁺, s⁻_1..H`` with

* ``"listwise"``: softmax cross-entropy over the list, ``ℓ = −log softmax(s⁺, s⁻_1..H)_0``
  (localised contrastive estimation, Gao, Dai & Callan 2021, "Rethink Training of BERT Rerankers
  in Multi-Stage Retrieval Pipeline", arXiv:2101.08751);
* ``"pairwise"``: RankNet (Burges et al. 2005, "Learning to Rank using Gradient Descent"),
  ``ℓ = mean_j −log σ(s⁺ − s⁻_j)``.

`train_reranker` is the gin job; `load_reranker` reads its result, and `RerankingRetriever`
puts it behind any first-stage retriever.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.models import TransformerConfig, hidden_states, param_axes
from agentic_jax.retrieval.retriever import Hit, Retriever, check_k, ranked
from agentic_jax.retrieval.trainer import TrainSettings, load_run, load_trunk, train
from agentic_jax.retrieval.training_data import RetrievalDataSpec, RetrievalSplit
from agentic_jax.retrieval.trunk import map_rows, pad_rows, pool, wrap

HEAD = "reranker"
LOSSES = ("listwise", "pairwise")


def init_reranker(trunk, config: TransformerConfig, key) -> dict:
    """A reranker over ``trunk``; the head ``w ~ N(0, 1/D)`` starts from a random ranking (a zero
    head would tie every pair)."""
    w = config.d_model**-0.5 * jax.random.normal(key, (config.d_model,), jnp.float32)
    return {"trunk": trunk, "head": {"w": w, "b": jnp.zeros((), jnp.float32)}}


def reranker_axes(config: TransformerConfig) -> dict:
    """Logical axes of :func:`init_reranker`'s parameters, for ``sharding``."""
    return {"trunk": param_axes(config), "head": {"w": ("embed",), "b": ()}}


def pair_rows(
    tokenizer: Tokenizer,
    queries: Sequence[Sequence[int]],
    passages: Sequence[Sequence[int]],
    length: int,
    query_length: int,
):
    """``(tokens, mask)`` of ``BOS query EOS passage EOS`` rows from token ids: the query cut to
    ``query_length`` tokens, the passage to what is left of ``length``."""
    rows = []
    for query, passage in zip(queries, passages):
        head = wrap(tokenizer, query, query_length + 2)
        rows.append(head + wrap(tokenizer, passage, length - len(head) + 1)[1:])
    return pad_rows(rows, length)


def score_pairs(params, config: TransformerConfig, tokens, mask) -> jax.Array:
    """``s(q, p) [B]`` of pair rows."""
    h = hidden_states(params["trunk"], config, jnp.asarray(tokens)).astype(jnp.float32)
    return pool(h, mask, "last") @ params["head"]["w"] + params["head"]["b"]


def ranking_loss(scores, kind: str) -> jax.Array:
    """``ℓ [B]`` of ``scores [B, 1 + H]`` whose column 0 is the positive (module docstring)."""
    if kind == "listwise":
        return -jax.nn.log_softmax(scores, axis=1)[:, 0]
    if kind == "pairwise":
        return jnp.mean(-jax.nn.log_sigmoid(scores[:, :1] - scores[:, 1:]), axis=1)
    raise ValueError(f"loss={kind!r}; expected one of {LOSSES}")


def reranker_loss(config: TransformerConfig, kind: str):
    """``loss(params, batch, key) -> (Σ ℓ, B, sums)`` over ``tokens``, ``mask [B, 1 + H, L]``
    (the positive first); sums: ``accuracy`` (the positive strictly first)."""

    def loss(params, batch, key):
        del key
        groups, size, length = batch["tokens"].shape
        flat = (x.reshape(groups * size, length) for x in (batch["tokens"], batch["mask"]))
        scores = score_pairs(params, config, *flat).reshape(groups, size)
        correct = jnp.sum(scores[:, 0] > jnp.max(scores[:, 1:], axis=1))
        return jnp.sum(ranking_loss(scores, kind)), jnp.float32(groups), {"accuracy": correct}

    return loss


_score_pairs = jax.jit(score_pairs, static_argnums=1)


@dataclasses.dataclass(frozen=True, eq=False)
class Reranker:
    """A trained reranker (:func:`load_reranker`)."""

    config: TransformerConfig
    params: dict
    tokenizer: Tokenizer
    length: int
    query_length: int
    batch_size: int = 32

    def score_ids(self, queries, passages) -> np.ndarray:
        """``s(q, p) [N]`` of pairs of token-id lists."""
        tokens, mask = pair_rows(self.tokenizer, queries, passages, self.length, self.query_length)
        fn = functools.partial(_score_pairs, self.params, self.config)
        return map_rows(fn, [tokens, mask], self.batch_size)

    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """``s(query, p)`` of each passage."""
        ids = self.tokenizer.encode_batch([query, *passages])
        return self.score_ids([ids[0]] * len(passages), ids[1:])

    def rerank(self, query: str, hits: Sequence[Hit], text: Callable[[str], str]) -> list[Hit]:
        """``hits`` reordered by the reranker (stable on ties), its scores and new ranks;
        ``text(id)`` is a hit's passage."""
        if not hits:
            return []
        scores = self.scores(query, [text(hit.id) for hit in hits])
        order = np.argsort(-scores, kind="stable")
        return ranked((hits[i].id, scores[i]) for i in order)

    def top1(self, split: RetrievalSplit) -> dict[str, float]:
        """On ``split``'s queries, each with its positive and hard negatives: ``top1`` (the
        positive strictly first) and ``mrr`` (the mean of 1 / its rank, ties counted against)."""
        groups = np.concatenate([split.positives[:, None], split.hard_negatives], axis=1)
        ids = self.tokenizer.encode_batch([*split.queries, *split.passages])
        queries, passages = ids[: len(split.queries)], ids[len(split.queries) :]
        scores = self.score_ids(
            [queries[q] for q in range(len(groups)) for _ in groups[q]],
            [passages[p] for p in groups.ravel()],
        ).reshape(groups.shape)
        rank = 1 + np.sum(scores[:, 1:] >= scores[:, :1], axis=1)
        return {"top1": float(np.mean(rank == 1)), "mrr": float(np.mean(1.0 / rank))}


class RerankingRetriever:
    """``first_stage``'s best ``depth`` hits reordered by ``reranker``: a
    :class:`~agentic_jax.retrieval.retriever.Retriever`; ``text(id)`` is a hit's passage."""

    def __init__(
        self,
        first_stage: Retriever,
        reranker: Reranker,
        text: Callable[[str], str],
        depth: int = 50,
    ):
        check_k(depth)
        self.first_stage, self.reranker, self.text, self.depth = first_stage, reranker, text, depth

    def search(self, query: str, k: int) -> list[Hit]:
        check_k(k)
        hits = self.first_stage.search(query, max(k, self.depth))
        return self.reranker.rerank(query, hits, self.text)[:k]


def load_reranker(run_dir) -> Reranker:
    """The reranker of a `train_reranker` run (``model/``, ``tokenizer.json``, the head)."""
    config, params, tokenizer, info = load_run(run_dir, HEAD)
    return Reranker(config, params, tokenizer, info["length"], info["query_length"])


@gin.configurable(module="retrieval")
def train_reranker(
    workdir: str,
    *,
    init_from: str | None = None,
    tokenizer: str | None = None,
    model: TransformerConfig | None = None,
    data: RetrievalDataSpec = RetrievalDataSpec(),
    loss: str = "listwise",
    length: int = 160,
    query_length: int = 32,
    settings: TrainSettings = TrainSettings(batch_size=8),
) -> dict:
    """Trains a reranker on ``data``'s training queries (``batch_size`` lists of the positive
    and its hard negatives a step), its trunk from run ``init_from`` (or a random ``model`` over
    the ``tokenizer`` file), with the ``loss`` of the module docstring.  Records held-out
    ``top1`` and ``mrr`` over each query's list at every evaluation; resumes from the latest
    checkpoint in ``workdir``; saves the trunk as ``workdir/model`` and the head beside it
    (:func:`load_reranker`).  Returns the final metrics."""
    if loss not in LOSSES:
        raise ValueError(f"train_reranker.loss={loss!r}; expected one of {LOSSES}")
    config, trunk, tok = load_trunk(init_from, tokenizer=tokenizer, model=model, seed=settings.seed)
    if config.max_seq_len < length:
        raise ValueError(f"the model's max_seq_len={config.max_seq_len} < length={length}")
    splits = data.splits()
    train_split, heldout = splits["train"], splits["heldout"]
    queries = tok.encode_batch(list(train_split.queries))
    passages = tok.encode_batch(list(train_split.passages))

    def batch_of(examples):
        groups = np.concatenate(
            [train_split.positives[examples, None], train_split.hard_negatives[examples]], axis=1
        )
        tokens, mask = pair_rows(
            tok,
            [queries[q] for q in examples for _ in range(groups.shape[1])],
            [passages[p] for p in groups.ravel()],
            length,
            query_length,
        )
        return {
            "tokens": tokens.reshape(*groups.shape, length),
            "mask": mask.reshape(*groups.shape, length),
        }

    def evaluate(params):
        return Reranker(config, params, tok, length, query_length, settings.batch_size).top1(
            heldout
        )

    return train(
        workdir,
        config=config,
        tokenizer=tok,
        params=init_reranker(trunk, config, jax.random.key(settings.seed)),
        loss=reranker_loss(config, loss),
        batch_of=batch_of,
        num_examples=len(train_split.queries),
        evaluate=evaluate,
        settings=settings,
        name=HEAD,
        info={"loss": loss, "length": length, "query_length": query_length},
    )
