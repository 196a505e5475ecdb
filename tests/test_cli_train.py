"""`agentic-jax train` end to end: outputs, fail-fast config errors, exact kill-and-resume."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agentic_jax.cli import main
from agentic_jax.training.metrics import read_metrics

HERE = os.path.dirname(__file__)
CORPUS = os.path.join(HERE, "data", "tiny_corpus.txt")
# Small files so the tokenizer and the tokenized corpus build in a moment.
FAST = [
    f"train_tokenizer.files = ['{CORPUS}']",
    f"train_data.files = ['{CORPUS}']",
    f"heldout_data.files = ['{CORPUS}']",
]


def _params(*extra):
    return [arg for p in FAST + list(extra) for arg in ("--gin_param", p)]


def test_train_writes_checkpoints_metrics_plot_and_configs(tmp_path):
    workdir = str(tmp_path / "run")
    assert (
        main(["train", "--gin_file", "tiny", "--workdir", workdir, *_params("train.steps=10")]) == 0
    )
    files = set(os.listdir(workdir))
    assert {
        "config.gin",
        "operative_config.gin",
        "tokenizer.json",
        "metrics.jsonl",
        "loss_curve.png",
        "checkpoints",
        "model",
    } <= files
    assert sorted(
        int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()
    ) == [5, 10]
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    train_steps = [r["step"] for r in records if "loss" in r]
    assert train_steps == list(range(1, 11))
    assert all(r["tokens_per_sec"] > 0 and r["mfu"] > 0 for r in records if "loss" in r)
    assert [r["step"] for r in records if "eval_loss" in r] == [10]
    with open(os.path.join(workdir, "operative_config.gin")) as f:
        assert "train.steps = 10" in f.read()
    with open(os.path.join(workdir, "loss_curve.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_misspelt_binding_fails_before_any_work(tmp_path):
    workdir = tmp_path / "never"
    with pytest.raises(ValueError, match="stepz"):
        main(
            [
                "train",
                "--gin_file",
                "tiny",
                "--workdir",
                str(workdir),
                "--gin_param",
                "train.stepz=3",
            ]
        )
    assert not workdir.exists()
    with pytest.raises(FileNotFoundError, match="no_such_config"):
        main(["train", "--gin_file", "no_such_config", "--workdir", str(workdir)])


def test_unclosed_bracket_and_mistyped_config_path_are_named(tmp_path):
    workdir = tmp_path / "never"
    with pytest.raises(ValueError, match=r"--gin_param 'train.steps=\[1'"):
        main(
            [
                "train",
                "--gin_file",
                "tiny",
                "--workdir",
                str(workdir),
                "--gin_param",
                "train.steps=[1",
            ]
        )
    # A path whose folder is not configs/ never falls back to the shipped file of that name.
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        main(
            [
                "train",
                "--gin_file",
                str(tmp_path / "no_such_dir" / "tiny.gin"),
                "--workdir",
                str(workdir),
            ]
        )
    assert not workdir.exists()


def _train_losses(workdir):
    return [
        (r["step"], r["loss"], r["grad_norm"])
        for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
        if "loss" in r
    ]


def test_sigkill_and_resume_reproduces_the_uninterrupted_losses(tmp_path):
    steps = 30
    extra = [
        f"train.steps={steps}",
        "train.checkpoint_every=3",
        "train.log_every=1",
        "train.eval_every=1000",
        "train.progress=False",
    ]
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    assert main(["train", "--gin_file", "tiny", "--workdir", straight, *_params(*extra)]) == 0

    cmd = [
        sys.executable,
        "-m",
        "agentic_jax.cli",
        "train",
        "--gin_file",
        "tiny",
        "--workdir",
        killed,
        *_params(*extra),
    ]
    metrics = os.path.join(killed, "metrics.jsonl")
    with _running(cmd) as proc:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if len(read_metrics_safe(metrics)) >= 10:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed_at = len(read_metrics_safe(metrics))
    assert killed_at < steps

    assert main(["train", "--gin_file", "tiny", "--workdir", killed, *_params(*extra)]) == 0
    assert _train_losses(killed) == _train_losses(straight)


@contextlib.contextmanager
def _running(cmd):
    """A training subprocess, killed on the way out if a failed assertion left it running."""
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def read_metrics_safe(path):
    """Records fully written so far (the writer may be mid-line)."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line]


def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint(tmp_path):
    workdir = str(tmp_path / "stopped")
    extra = [
        "train.steps=400",
        "train.checkpoint_every=1000",
        "train.log_every=1",
        "train.eval_every=1000",
        "train.progress=False",
    ]
    cmd = [
        sys.executable,
        "-m",
        "agentic_jax.cli",
        "train",
        "--gin_file",
        "tiny",
        "--workdir",
        workdir,
        *_params(*extra),
    ]
    metrics = os.path.join(workdir, "metrics.jsonl")
    with _running(cmd) as proc:
        deadline = time.time() + 300
        while (
            time.time() < deadline and proc.poll() is None and len(read_metrics_safe(metrics)) < 5
        ):
            time.sleep(0.01)
        assert proc.poll() is None, "the run finished before it could be stopped"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130
    logged = [r["step"] for r in read_metrics(metrics) if "loss" in r]
    saved = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()]
    # No periodic checkpoint was due: the one saved is the stop's, at the last step taken,
    # and every step up to it is in the log.
    assert saved == [logged[-1]] and logged == list(range(1, logged[-1] + 1)) and logged[-1] < 400
