"""Retrieval pipelines side by side on the held-out queries: quality and queries per second.

    python -m bench.retrieval --init_from runs/quickstart/pretrain --out runs/retrieval_bench

The data are ``retrieval.training_data``'s splits of the shipped corpus (``--max_documents``):
the encoders train on the training split's queries, and every pipeline searches the held-out
split's passages (disjoint from the training ones) for its held-out queries, each with its one
relevant passage.  The bench trains its own models, from the trunk of run ``--init_from`` or,
without one, from a random trunk over ``--tokenizer`` (for the test), each with the trainers'
jobs (``encoders.train_encoder``, ``rerank.train_reranker``) into a run directory under
``--out``; a finished run is reloaded and not trained again.

* ``bm25``: ``sparse.BM25`` over the passages;
* ``dense``: a dual encoder (mean pooling, a ``--dim`` projection), exact top-k in a
  ``dense.DenseIndex``;
* ``colbert``: a late-interaction encoder (``pooling="tokens"``, ``--colbert_dim``), its
  passages' token vectors compressed to ``--bits`` bits a dimension around ``--centroids``
  centroids and searched by PLAID (``late_interaction.LateInteractionRetriever``);
* ``hybrid``: BM25 and dense, each ``--depth`` deep, fused by reciprocal rank fusion (k = 60);
* ``bm25+rerank``, ``hybrid+rerank``: the cross-encoder reorders that first stage's best
  ``--rerank_depth``.

Each query is searched alone (``search(query, 10)``, as an agent's tool would), the pipelines
taking turns query by query, so that load from other processes falls on all of them alike;
every pipeline first searches ``--warmup`` queries untimed (``jit`` compiles there).  Quality,
with ``r`` the rank of the query's relevant passage in the 10 returned (∞ when absent):
recall@k ``= [r ≤ k]``, MRR@10 ``= 1/r``, nDCG@10 ``= 1/log2(1 + r)`` (one relevant passage
makes the ideal DCG 1), each the mean over queries (``eval.ranking``); queries/s is the
number of queries over the summed wall-clock of their searches.  ``OUT/results.json`` holds the
table and the budget, ``OUT/report.md`` the table (also printed), and ``--plot`` (default
``docs/retrieval_bench.png``) draws quality against queries/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import types

import jax
import numpy as np

from agentic_jax.data.tokenizer import load_tokenizer
from agentic_jax.eval.ranking import mean_reciprocal_rank, ndcg_at_k, recall_at_k
from agentic_jax.models import TransformerConfig
from agentic_jax.retrieval import BM25, DenseIndex, DenseRetriever, FusionRetriever
from agentic_jax.retrieval.encoders import EncoderConfig, load_encoder, train_encoder
from agentic_jax.retrieval.late_interaction import (
    LateInteractionRetriever,
    build_index,
    fit_codec,
)
from agentic_jax.retrieval.rerank import RerankingRetriever, load_reranker, train_reranker
from agentic_jax.retrieval.trainer import TrainSettings
from agentic_jax.retrieval.training_data import RetrievalDataSpec
from agentic_jax.training.metrics import read_metrics
from bench.figures import save_figure

PIPELINES = ("bm25", "dense", "colbert", "hybrid", "bm25+rerank", "hybrid+rerank")
RECALL_KS = (1, 5, 10)
DEPTH = 10  # every pipeline returns its 10 best; MRR and nDCG are @10
METRICS = (*(f"recall@{k}" for k in RECALL_KS), "mrr@10", "ndcg@10")


def _trained(kind: str, workdir: str, train, settings: TrainSettings, **job):
    """``(model, steps)``: the model of the finished run ``workdir`` (``kind``: encoder or
    reranker) and the steps it trained, trained first by ``train(workdir, settings=settings,
    **job)`` unless the run finished before."""
    load = load_encoder if kind == "encoder" else load_reranker
    if not os.path.exists(os.path.join(workdir, f"{kind}.json")):
        train(workdir, settings=settings, **job)
    return load(workdir), read_metrics(os.path.join(workdir, "metrics.jsonl"))[-1]["step"]


def _trunk(args) -> dict:
    """``train_encoder``'s / ``train_reranker``'s trunk arguments: ``--init_from``, or a random
    model of ``--d_model`` and ``--n_layers`` over ``--tokenizer``."""
    if args.init_from:
        return {"init_from": args.init_from}
    if not args.tokenizer:
        raise SystemExit("give --init_from (a run directory) or --tokenizer (random init)")
    model = TransformerConfig(
        vocab_size=load_tokenizer(args.tokenizer).vocab_size,
        d_model=args.d_model,
        n_layers=args.n_layers,
        head_dim=args.d_model // 4,
        d_ff=3 * args.d_model,
        max_seq_len=max(args.passage_length, args.reranker_length),
    )
    return {"tokenizer": args.tokenizer, "model": model}


def build_pipelines(args, splits) -> tuple[dict, dict]:
    """``(retrievers by pipeline name, the training budget)``: the three models trained (or
    reloaded) under ``--out``, and the indexes over the held-out passages."""
    passages = splits["heldout"].passages
    ids = [str(i) for i in range(len(passages))]
    data = types.SimpleNamespace(splits=lambda: splits)  # split once, for every trainer
    trunk = _trunk(args)
    trained = {}  # steps and batch size of each model

    def settings(steps: int, batch_size: int, lr: float) -> TrainSettings:
        return TrainSettings(
            steps=steps,
            batch_size=batch_size,
            peak_lr=lr,
            eval_every=steps,
            checkpoint_every=steps,
            seed=args.seed,
            progress=args.progress,
        )

    def encoder(name: str, pooling: str, dim: int, steps: int, lr: float):
        config = EncoderConfig(
            pooling=pooling,
            dim=dim,
            query_length=args.query_length,
            passage_length=args.passage_length,
        )
        out, done = _trained(
            "encoder",
            os.path.join(args.out, name),
            train_encoder,
            settings(steps, args.batch_size, lr),
            encoder=config,
            data=data,
            **trunk,
        )
        trained[name] = [done, args.batch_size]
        return out, dataclasses.replace(out, batch_size=1)  # passages in batches, queries alone

    dense_encoder, dense_queries = encoder("dense", "mean", args.dim, args.dense_steps, args.lr)
    index = DenseIndex(metric="dot")
    index.add(ids, dense_encoder.encode_passages(passages))
    dense = DenseRetriever(index, dense_queries.encode_queries)

    colbert_encoder, colbert_queries = encoder(
        "colbert", "tokens", args.colbert_dim, args.colbert_steps, args.colbert_lr
    )
    vectors, mask = colbert_encoder.encode_passages(passages)
    tokens = vectors[mask > 0]
    codec = fit_codec(
        tokens,
        jax.random.key(args.seed),
        num_centroids=min(args.centroids, len(tokens)),
        bits=args.bits,
    )
    colbert = LateInteractionRetriever(
        build_index(codec, vectors, mask),
        ids,
        colbert_queries.encode_queries,
        nprobe=args.nprobe,
        max_candidates=args.candidates,
    )

    reranker, done = _trained(
        "reranker",
        os.path.join(args.out, "reranker"),
        train_reranker,
        settings(args.reranker_steps, args.reranker_batch_size, args.reranker_lr),
        data=data,
        length=args.reranker_length,
        query_length=args.query_length,
        **trunk,
    )
    trained["reranker"] = [done, args.reranker_batch_size]
    # One trunk call scores a query's whole short list.
    reranker = dataclasses.replace(reranker, batch_size=args.rerank_depth)
    bm25 = BM25(passages, ids)
    hybrid = FusionRetriever([bm25, dense], depth=args.depth)

    def text(i: str) -> str:
        return passages[int(i)]

    retrievers = {
        "bm25": bm25,
        "dense": dense,
        "colbert": colbert,
        "hybrid": hybrid,
        "bm25+rerank": RerankingRetriever(bm25, reranker, text, args.rerank_depth),
        "hybrid+rerank": RerankingRetriever(hybrid, reranker, text, args.rerank_depth),
    }
    budget = {
        "trunk": args.init_from or f"random d={args.d_model}, {args.n_layers} layers",
        "training queries": len(splits["train"].queries),
        "training steps": trained,
        "colbert index": {
            "token vectors": len(tokens),
            "centroids": int(codec.centroids.shape[0]),
            "bits": args.bits,
        },
    }
    return retrievers, budget


def measure(retrievers: dict, queries, relevant, warmup: int) -> dict:
    """Per pipeline: the metrics of the module docstring over ``queries`` (``relevant[i]``: the
    id of query ``i``'s passage) and ``queries/s``; the searches interleaved, warm-up apart."""
    for query in queries[:warmup]:
        for retriever in retrievers.values():
            retriever.search(query, DEPTH)
    rankings = {name: [] for name in retrievers}
    seconds = dict.fromkeys(retrievers, 0.0)
    for query in queries:
        for name, retriever in retrievers.items():
            start = time.perf_counter()
            hits = retriever.search(query, DEPTH)
            seconds[name] += time.perf_counter() - start
            rankings[name].append([hit.id for hit in hits])
    relevants = [{r} for r in relevant]
    table = {}
    for name, ranked in rankings.items():
        row = {
            f"recall@{k}": float(np.mean([recall_at_k(r, s, k) for r, s in zip(ranked, relevants)]))
            for k in RECALL_KS
        }
        row["mrr@10"] = mean_reciprocal_rank(ranked, relevants)
        row["ndcg@10"] = float(
            np.mean([ndcg_at_k(r, dict.fromkeys(s, 1), DEPTH) for r, s in zip(ranked, relevants)])
        )
        row["queries/s"] = len(queries) / seconds[name]
        table[name] = row
    return table


def report(table: dict, budget: dict) -> str:
    steps = ", ".join(
        f"{name} {s} steps × {b}" for name, (s, b) in budget["training steps"].items()
    )
    index = budget["colbert index"]
    lines = [
        f"{budget['queries']} held-out queries over {budget['passages']} held-out passages; "
        f"trunk: {budget['trunk']}; trained on {budget['training queries']} queries: {steps}; "
        f"ColBERT index: {index['token vectors']} token vectors, {index['centroids']} "
        f"centroids, {index['bits']} bits.",
        "",
        "| pipeline | " + " | ".join(METRICS) + " | queries/s |",
        "|---|" + "---:|" * (len(METRICS) + 1),
    ]
    for name, row in table.items():
        cells = [f"{row[m]:.3f}" for m in METRICS] + [f"{row['queries/s']:.1f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(table: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("ndcg@10", "recall@10")):
        for name, row in table.items():
            ax.scatter(row["queries/s"], row[metric])
            ax.annotate(
                name,
                (row["queries/s"], row[metric]),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.margins(x=0.2, y=0.1)
        ax.set_xlabel("queries/s (one query at a time)")
        ax.set_ylabel(f"held-out {metric}")
    save_figure(fig, path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the models' runs and the results")
    parser.add_argument("--init_from", help="the trunk: a run or model directory")
    parser.add_argument("--tokenizer", help="without --init_from: a random trunk over this")
    parser.add_argument("--d_model", type=int, default=32, help="the random trunk's width")
    parser.add_argument("--n_layers", type=int, default=1, help="the random trunk's depth")
    parser.add_argument("--documents", help="documents to split (default: the shipped corpus)")
    parser.add_argument("--max_documents", type=int, default=300)
    parser.add_argument("--heldout_every", type=int, default=10)
    parser.add_argument("--queries", type=int, help="search only the first held-out queries")
    parser.add_argument("--dense_steps", type=int, default=150)
    parser.add_argument("--colbert_steps", type=int, default=150)
    parser.add_argument("--reranker_steps", type=int, default=150)
    parser.add_argument("--batch_size", type=int, default=16, help="the encoders' queries a step")
    parser.add_argument("--reranker_batch_size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3, help="the dense encoder's peak lr")
    parser.add_argument("--colbert_lr", type=float, default=1e-4)
    parser.add_argument("--reranker_lr", type=float, default=1e-3)
    parser.add_argument("--dim", type=int, default=128, help="the dense embedding's width")
    parser.add_argument("--colbert_dim", type=int, default=64)
    parser.add_argument("--query_length", type=int, default=48)
    parser.add_argument("--passage_length", type=int, default=128)
    parser.add_argument("--reranker_length", type=int, default=176)
    parser.add_argument("--centroids", type=int, default=256)
    parser.add_argument("--bits", type=int, default=4, choices=(1, 2, 4, 8))
    parser.add_argument("--nprobe", type=int, default=4)
    parser.add_argument("--candidates", type=int, default=128, help="PLAID's exactly scored")
    parser.add_argument("--depth", type=int, default=50, help="each fused retriever's depth")
    parser.add_argument("--rerank_depth", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="docs/retrieval_bench.png")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    spec = RetrievalDataSpec(
        path=args.documents,
        max_documents=args.max_documents,
        heldout_every=args.heldout_every,
        seed=args.seed,
    )
    splits = spec.splits()
    heldout = splits["heldout"]
    retrievers, budget = build_pipelines(args, splits)
    queries = list(heldout.queries[: args.queries])
    relevant = [str(p) for p in heldout.positives[: len(queries)]]
    table = measure(retrievers, queries, relevant, args.warmup)
    budget = {"queries": len(queries), "passages": len(heldout.passages), **budget}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"budget": budget, "table": table}, f, indent=1)
    text = report(table, budget)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text + "\n")
    plot(table, args.plot)
    print(text)
    return {"budget": budget, "table": table}


if __name__ == "__main__":
    main()
