"""bench/serving.py's smoke mode: a few clients for a couple of seconds against this checkout's
server (no baseline) on the bench's own random model; every request succeeds and the figures
agree with the requests they count (not how fast: that is the bench's to measure)."""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import serving as bench

SMOKE = ["--clients", "3", "--duration_s", "2", "--warmup_s", "0", "--baseline", "none"]
SMOKE += ["--prompt_words", "8", "24", "--max_tokens", "3", "6", "--num_slots", "4"]
SMOKE += ["--max_seq_len", "128"]


def test_the_smoke_run_has_no_errors_and_consistent_counts(tmp_path, capsys):
    results = bench.main(["--out", str(tmp_path), *SMOKE])
    [name] = results["servers"]
    new = results["servers"][name]
    assert name == "new" and "ratio" not in results
    assert new["errors"] == 0 and new["error_messages"] == []
    requests = new["per_request"]
    assert new["requests"] == len(requests) >= new["clients"] == 3
    assert new["completion_tokens"] == sum(r["completion_tokens"] for r in requests)
    assert new["prompt_tokens"] == sum(r["prompt_tokens"] for r in requests)
    # Greedy decoding never picks a special token of the bench's model: every reply is as long as
    # it asked for, and prompts of more words have more tokens.
    assert all(r["completion_tokens"] == r["max_tokens"] for r in requests)
    assert {r["prompt_words"] for r in requests} <= {8, 24}
    assert all(0 < r["ttft_s"] <= r["latency_s"] for r in requests)
    assert all(1 <= r["text_chunks"] <= r["completion_tokens"] for r in requests)
    for figure in ("ttft", "itl"):
        assert 0 <= new[figure]["p50_ms"] <= new[figure]["p99_ms"]
    assert new["output_tokens_per_s"] == new["completion_tokens"] / new["elapsed_s"]
    assert new["elapsed_s"] >= new["duration_s"] == 2
    # What it writes: the same numbers, the table, the server's log.
    written = json.loads((tmp_path / "results.json").read_text())["servers"][name]
    assert written["requests"] == new["requests"] and written["ttft"] == new["ttft"]
    table = (tmp_path / "report.md").read_text()
    assert f"| requests | {new['requests']} |" in table and "| errors | 0 |" in table
    assert "serving 'bench'" in (tmp_path / "new.log").read_text()
    assert f"{new['requests']} requests" in capsys.readouterr().out
