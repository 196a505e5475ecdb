"""bench/retrieval.py at a tiny size, from a random trunk: every pipeline is measured on the same
held-out queries with its metrics in range, the budget is stated, and a rerun reloads the
finished models instead of training them again."""

import json
import pathlib
import sys

from tiny_models import CORPUS

from agentic_jax.data.tokenizer import train_tokenizer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import retrieval as bench

TINY = {
    "--max_documents": 12,
    "--dense_steps": 2,
    "--colbert_steps": 2,
    "--reranker_steps": 2,
    "--batch_size": 4,
    "--reranker_batch_size": 2,
    "--query_length": 16,
    "--passage_length": 32,
    "--reranker_length": 48,
    "--dim": 16,
    "--colbert_dim": 8,
    "--centroids": 128,
    "--depth": 10,
    "--rerank_depth": 5,
}


def test_every_pipeline_is_measured_side_by_side(tmp_path, capsys):
    train_tokenizer(tmp_path / "tokenizer.json", files=[CORPUS], vocab_size=300)
    out, png = tmp_path / "out", tmp_path / "bench.png"
    argv = ["--out", str(out), "--tokenizer", str(tmp_path / "tokenizer.json")]
    argv += ["--plot", str(png), "--no-progress", *(str(a) for kv in TINY.items() for a in kv)]
    results = bench.main(argv)
    table, budget = results["table"], results["budget"]
    assert list(table) == list(bench.PIPELINES)
    for row in table.values():
        assert all(0 <= row[metric] <= 1 for metric in bench.METRICS)
        assert row["recall@1"] <= row["recall@5"] <= row["recall@10"]
        assert row["recall@1"] <= row["mrr@10"] <= row["recall@10"]
        assert row["queries/s"] > 0
    assert table["bm25"]["recall@10"] > 0.5  # the queries share words with their passages
    assert budget["queries"] > 0 and budget["passages"] > 0
    assert budget["training steps"] == {"dense": [2, 4], "colbert": [2, 4], "reranker": [2, 2]}
    report = capsys.readouterr().out
    assert all(f"| {name} |" in report for name in bench.PIPELINES)
    assert f"{budget['queries']} held-out queries over {budget['passages']}" in report
    assert json.loads((out / "results.json").read_text())["table"] == table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A rerun reloads the finished models: the same rankings, nothing trained.
    finished = (out / "dense" / "encoder.json").stat().st_mtime_ns
    again = bench.main(argv)["table"]
    assert (out / "dense" / "encoder.json").stat().st_mtime_ns == finished
    for name in bench.PIPELINES:
        assert all(again[name][m] == table[name][m] for m in bench.METRICS), name
