"""bench/efficiency.py at a tiny size: every row is reported, every compared method spends the
same token budget, and every speculative method reproduces greedy decoding (not which is fastest:
that is the bench's to measure)."""

import json
import math
import pathlib
import sys

from tiny_models import CORPUS, make_model_dir

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import efficiency as bench

TINY = {
    "--prompt_len": 8,
    "--new_tokens": 4,
    "--repeats": 1,
    "--quant_batch": 2,
    "--group_size": 16,
    "--nf4_block": 16,
    "--ppl_rows": 2,
    "--ppl_len": 32,
    "--calibration_rows": 2,
    "--spec_batch": 1,  # batch 1 only: batched speculation has its own tests
    "--draft_d_model": 16,
    "--draft_steps": 2,
    "--head_steps": 2,
    "--train_steps": 2,
    "--train_batch": 2,
    "--train_seq_len": 32,
}


def run(tmp_path, part: str) -> tuple[dict, pathlib.Path, pathlib.Path]:
    """One part of the bench at the tiny size (each part is its own test, so they run apart)."""
    make_model_dir(tmp_path / "model", max_seq_len=64)
    out, png = tmp_path / "out", tmp_path / "efficiency.png"
    argv = ["--init_from", str(tmp_path / "model"), "--out", str(out), "--plot", str(png)]
    argv += ["--files", CORPUS, "--parts", part, *(str(x) for kv in TINY.items() for x in kv)]
    results = bench.main(argv)
    assert part in results and not ({"compression", "speculation", "fp8"} - {part}) & set(results)
    assert (out / "report.md").exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return results, out, png


def test_every_compression_variant_is_reported_within_one_budget(tmp_path, capsys):
    results, out, _ = run(tmp_path, "compression")
    quant = results["compression"]
    assert list(quant) == [
        "float32",
        "bfloat16",
        "int8",
        "int4",
        "int4_awq",
        "nf4",
        "2:4_magnitude",
        "2:4_wanda",
    ]
    assert {r["generated_tokens"] for r in quant.values()} == {2 * 4}
    assert quant["float32"]["greedy_agreement"] == 1.0 and quant["float32"]["perplexity_delta"] == 0
    # Parameter bytes (the float32 embedding dominates a model this small; NF4 pads its
    # double-quantised scales to blocks of 256): 2:4 keeps dense float32 storage.
    bytes_ = {name: r["param_bytes"] for name, r in quant.items()}
    assert bytes_["int4"] == bytes_["int4_awq"] < bytes_["int8"] < bytes_["float32"]
    assert bytes_["nf4"] < bytes_["float32"] == bytes_["2:4_magnitude"] == bytes_["2:4_wanda"]
    assert bytes_["bfloat16"] * 2 == bytes_["float32"]
    for r in quant.values():
        assert math.isfinite(r["perplexity"]) and r["tokens_per_s"] > 0
        assert 0 <= r["greedy_agreement"] <= 1
    report = capsys.readouterr().out
    for name in quant:
        assert f"| {name} |" in report
    assert json.loads((out / "results.json").read_text())["compression"].keys() == quant.keys()
    assert (out / "report.md").read_text().strip() in report


def test_every_speculative_method_spends_one_budget_and_matches_greedy(tmp_path, capsys):
    results, _, _ = run(tmp_path, "speculation")
    rows = results["speculation"]["rows"]
    methods = [
        "plain decoding",
        "draft model, chain of 4",
        "draft model, tree 2x4",
        "Medusa, tree",
        "EAGLE, tree",
    ]
    assert [(r["batch"], r["method"]) for r in rows] == [(1, m) for m in methods]
    for r in rows:  # the same budget for every method, and each exact under greedy decoding
        assert r["generated_tokens"] == r["batch"] * 4
        assert r["same_as_greedy"]
        assert 1 <= r["tokens_per_forward"] <= 5  # the root plus at most 4 accepted drafts
    assert results["speculation"]["setup"]["head_steps"] == 2
    report = capsys.readouterr().out
    for name in methods:
        assert f"| {name} |" in report


def test_fp8_bfloat16_and_float32_train_on_the_same_batches(tmp_path, capsys):
    results, _, _ = run(tmp_path, "fp8")
    train = results["fp8"]
    assert list(train) == ["float32", "bfloat16", "fp8"]
    assert {r["tokens"] for r in train.values()} == {2 * 2 * 32}
    # One initialisation, one batch: the first losses differ only by the compute's rounding.
    assert train["bfloat16"]["losses"][0] != train["float32"]["losses"][0]
    assert abs(train["bfloat16"]["losses"][0] - train["float32"]["losses"][0]) < 0.05
    assert all(len(r["losses"]) == 2 and math.isfinite(r["heldout_loss"]) for r in train.values())

    report = capsys.readouterr().out
    assert "| fp8 |" in report and "| bfloat16 |" in report
    assert "simulated" in report  # a CPU has no FP8 matrix unit
