"""Approximate (HNSW) against exact dense search: recall@k and queries/s as the search beam grows.

    python -m bench.approximate_index                        # 100k x 64, 1000 queries
    python -m bench.approximate_index --n 20000 --expansion 8 32 128

The corpus is ``--n`` random unit vectors of ``--dim`` dimensions (seeded; ``--clusters C`` draws
them around C random centres instead, nearer the low intrinsic dimension of real embeddings, on
which HNSW does better than on uniform points), the queries ``--queries`` more from the same
distribution.  One :class:`~agentic_jax.retrieval.approximate.ApproximateIndex` is built over the
corpus (its build time reported) and searched with the same query batch at every
``expansion_search`` of ``--expansion``; the exact answer is ``exact_top_k`` (jitted, float32 at
full precision) over the same rows.  Recall@k is the mean fraction of each query's exact top
``k`` that the graph's top ``k`` holds.  Speed is queries/s over the whole batch, the median of
``--repeats`` timed runs after one untimed warm-up (compilation for ``exact_top_k``), for three
arms: ``exact_top_k`` alone (arrays in, arrays out), ``DenseIndex.search_embeddings`` (the same
search with the index's checks and its ``Hit`` lists) and the approximate index's
``search_embeddings`` (graph search, exact rescoring, ``Hit`` lists): the last two answer the
same question and are the fair pair.  Both libraries use every core.  The table is printed in
Markdown; ``--out`` (default docs/approximate_index.png) draws recall against queries/s.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np

from agentic_jax.retrieval import DenseIndex, exact_top_k
from agentic_jax.retrieval.approximate import ApproximateIndex
from bench.figures import save_figure
from pallas_kernels.benchmarking import describe_device


def unit_vectors(rng: np.random.Generator, n: int, dim: int, centres: np.ndarray | None):
    """``n`` unit vectors: uniform on the sphere, or each a random centre plus noise."""
    x = rng.normal(size=(n, dim))
    if centres is not None:
        x = centres[rng.integers(len(centres), size=n)] + 0.5 * x / np.sqrt(dim)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def median_seconds(fn, repeats: int) -> float:
    """The median wall time of ``fn()`` over ``repeats`` runs, after one untimed run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure(args) -> dict:
    rng = np.random.default_rng(args.seed)
    centres = None
    if args.clusters:
        centres = rng.normal(size=(args.clusters, args.dim))
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    corpus = unit_vectors(rng, args.n, args.dim, centres)
    queries = unit_vectors(rng, args.queries, args.dim, centres)
    index = ApproximateIndex(
        args.dim,
        metric=args.metric,
        connectivity=args.connectivity,
        expansion_add=args.expansion_add,
    )
    start = time.perf_counter()
    index.add([str(i) for i in range(args.n)], corpus)
    build_s = time.perf_counter() - start

    def exact():
        return jax.block_until_ready(exact_top_k(queries, corpus, args.k, metric=args.metric))

    truth = [set(map(str, row)) for row in np.asarray(exact()[1])]
    rows = [
        dict(
            arm="exact_top_k",
            expansion_search=None,
            recall=1.0,
            seconds=median_seconds(exact, args.repeats),
        ),
        dict(
            arm="DenseIndex",
            expansion_search=None,
            recall=1.0,
            seconds=median_seconds(
                lambda: DenseIndex.search_embeddings(index, queries, args.k), args.repeats
            ),
        ),
    ]
    for expansion in args.expansion:
        index.expansion_search = expansion
        hits = index.search_embeddings(queries, args.k)
        recall = np.mean([len(t & {h.id for h in row}) / args.k for t, row in zip(truth, hits)])
        seconds = median_seconds(lambda: index.search_embeddings(queries, args.k), args.repeats)
        rows.append(
            dict(arm="HNSW", expansion_search=expansion, recall=float(recall), seconds=seconds)
        )
    for row in rows:
        row["queries_per_s"] = args.queries / row["seconds"]
    return dict(build_s=build_s, rows=rows)


def table(results: dict, k: int) -> str:
    lines = [
        f"| search | expansion_search | recall@{k} | queries/s |",
        "| --- | --- | --- | --- |",
    ]
    for row in results["rows"]:
        expansion = "" if row["expansion_search"] is None else row["expansion_search"]
        lines.append(
            f"| {row['arm']} | {expansion} | {row['recall']:.3f} | {row['queries_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def plot(results: dict, k: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    hnsw = [r for r in results["rows"] if r["arm"] == "HNSW"]
    ax.plot(
        [r["queries_per_s"] for r in hnsw], [r["recall"] for r in hnsw], marker="o", label="HNSW"
    )
    for r in hnsw:
        ax.annotate(str(r["expansion_search"]), (r["queries_per_s"], r["recall"]), fontsize=8)
    for r, marker in zip([r for r in results["rows"] if r["arm"] != "HNSW"], ("s", "D")):
        ax.plot(
            [r["queries_per_s"]], [1.0], marker=marker, linestyle="", label=f"exact ({r['arm']})"
        )
    ax.set_xscale("log")
    ax.set_xlabel("queries/s (log)")
    ax.set_ylabel(f"recall@{k} against exact search")
    ax.set_title("HNSW (labels: expansion_search) vs exact search")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="corpus vectors")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--metric", choices=("cosine", "dot"), default="cosine")
    parser.add_argument("--clusters", type=int, default=0, help="0: uniform on the sphere")
    parser.add_argument("--connectivity", type=int, default=16)
    parser.add_argument("--expansion_add", type=int, default=128)
    parser.add_argument("--expansion", type=int, nargs="+", default=[10, 20, 40, 80, 160, 320])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per arm (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/approximate_index.png")
    args = parser.parse_args(argv)
    print(describe_device(), f"| {os.cpu_count()} cores")
    data = f"{args.clusters} clusters" if args.clusters else "uniform"
    print(
        f"corpus {args.n:,} x {args.dim} ({data}), "
        f"{args.queries:,} queries, k={args.k}, {args.metric}, connectivity={args.connectivity}, "
        f"expansion_add={args.expansion_add}, {args.repeats} timed runs per arm"
    )
    results = measure(args)
    print(f"HNSW build: {results['build_s']:.1f} s ({args.n / results['build_s']:,.0f} vectors/s)")
    print(table(results, args.k))
    plot(results, args.k, args.out)
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
