"""bench/architectures.py at a tiny size: every comparison is reported with finite values, and
compared runs spend one budget (not which architecture wins: that is the bench's to measure)."""

import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import architectures as bench

TINY = {
    "--vocab_size": 300,
    "--d_model": 32,
    "--n_layers": 1,
    "--n_heads": 2,
    "--n_kv_heads": 1,
    "--head_dim": 16,
    "--d_ff": 64,
    "--experts": 4,
    "--steps": 2,
    "--batch_size": 2,
    "--seq_len": 32,
    "--adamw_lrs": 0.003,
    "--muon_lrs": 0.003,
    "--eval_every": 1,
    "--eval_batches": 1,
    "--final_eval_batches": 2,
    "--kv_lora_rank": 16,
    "--qk_rope_head_dim": 8,
    "--decode_batch": 2,
    "--prompt_len": 4,
    "--new_tokens": 3,
}


def test_every_comparison_is_reported_within_one_budget(tmp_path, capsys):
    out, png = tmp_path / "out", tmp_path / "architectures.png"
    argv = ["--out", str(out), "--plot", str(png)]
    results = bench.main([*argv, *(str(x) for kv in TINY.items() for x in kv)])
    runs = results["runs"]
    # One dense run per optimiser (the AdamW one is also dense vs MoE's), and the MoE run.
    assert sorted((r["model"], r["optimizer"]) for r in runs.values()) == [
        ("MoE", "adamw"),
        ("dense", "adamw"),
        ("dense", "muon"),
    ]
    for run in runs.values():  # the same batches for every run
        assert (run["steps"], run["samples"]) == (2, 4)
        assert run["tokens"] == runs[results["dense_vs_moe"]["dense"]]["tokens"] > 0
        assert [step for step, _ in run["curve"]] == [1, 2]
        assert all(math.isfinite(x) for x in (run["tokens_per_s"], run["heldout_loss"]))
    dense, moe = (runs[results["dense_vs_moe"][k]] for k in ("dense", "moe"))
    assert moe["total_params"] > dense["total_params"] == dense["active_params"]
    assert abs(moe["active_params"] / dense["active_params"] - 1) < 0.05
    assert results["dense_vs_moe"]["ratios"]["tokens"] == 1
    assert set(results["muon_vs_adamw"]["best"]) == {"adamw", "muon"}

    mla = results["mla_vs_gqa"]
    if "skipped" not in mla:
        assert mla["budget"] == {"batch": 2, "prompt_tokens": 4, "new_tokens": 3}
        # GQA caches 2 x 1 head x 16; MLA the 16-wide latent and the 8-wide rope key.
        assert mla["rows"]["GQA"]["cache_width"] == 32 and mla["rows"]["MLA"]["cache_width"] == 24
        assert all(math.isfinite(v) and v > 0 for row in mla["rows"].values() for v in row.values())

    report = capsys.readouterr().out
    assert "Dense vs MoE" in report and "Muon vs AdamW" in report and "MLA vs GQA" in report
    assert "| MoE / dense |" in report and "budget of every training run" in report
    assert json.loads((out / "results.json").read_text())["runs"].keys() == runs.keys()
    assert (out / "report.md").read_text().strip() in report
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
