"""bench/approximate_index.py at a tiny size: every arm timed, recall measured against exact search
(1 for the exact arms, near 1 for a beam as wide as the corpus), the plot written."""

import pathlib
import sys

import pytest

pytest.importorskip("usearch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import approximate_index as bench


@pytest.mark.parametrize("clusters", [0, 4])
def test_every_arm_is_timed_and_recall_is_measured(tmp_path, clusters):
    out = tmp_path / "curve.png"
    argv = ["--n", "300", "--dim", "8", "--queries", "16", "--k", "5", "--repeats", "1"]
    argv += ["--expansion", "1", "300", "--clusters", str(clusters), "--out", str(out)]
    results = bench.main(argv)
    rows = results["rows"]
    assert [(r["arm"], r["expansion_search"]) for r in rows] == [
        ("exact_top_k", None),
        ("DenseIndex", None),
        ("HNSW", 1),
        ("HNSW", 300),
    ]
    assert all(r["queries_per_s"] > 0 for r in rows) and results["build_s"] > 0
    assert rows[-1]["recall"] >= 0.99 and 0 <= rows[-2]["recall"] <= rows[-1]["recall"]
    assert "| HNSW | 300 |" in bench.table(results, 5)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
