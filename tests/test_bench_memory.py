"""bench/memory.py at a tiny size: every system is reported for every question type with its
metrics in range, contexts stay within the one budget, and memory beats none."""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from agentic_jax.memory.longhorizon import TYPES
from bench import memory as bench


def test_every_system_and_type_is_reported_within_the_budget(tmp_path, capsys):
    out, png = tmp_path / "out", tmp_path / "bench.png"
    argv = ["--out", str(out), "--plot", str(png), "--users", "1", "--sessions", "20"]
    results = bench.main([*argv, "--per_type", "1", "--budget", "256", "--turns", "4", "6"])
    setup, table = results["setup"], results["table"]
    assert list(table) == list(bench.SYSTEMS)
    assert setup["questions"] == len(TYPES) + 1  # temporal: an order and a date
    for name, row in table.items():
        for kind in (*TYPES, "all"):
            assert 0 <= row[kind]["em"] <= row[kind]["f1"] <= 1, (name, kind)
            recall = row[kind]["recall"]
            assert (recall is None) == (kind == "abstention") and (
                recall is None or 0 <= recall <= 1
            )
        assert row["context tokens"]["max"] <= 256
        assert 0 <= row["write ms"]["p50"] <= row["write ms"]["p95"]
        assert 0 <= row["read ms"]["p50"] <= row["read ms"]["p95"]
    none = table["no memory"]
    assert none["abstention"]["em"] == 1 and none["all"]["recall"] == 0 and none["store bytes"] == 0
    for name in ("vector", "mem0", "tiered"):
        assert table[name]["store bytes"] > 0
    assert table["vector"]["all"]["recall"] > table["full context"]["all"]["recall"]
    report = capsys.readouterr().out
    assert all(f"| {name} |" in report for name in bench.SYSTEMS)
    assert "within 256 tokens" in report
    assert json.loads((out / "results.json").read_text())["table"] == table
    assert (out / "report.md").read_text().strip() == report.strip()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
