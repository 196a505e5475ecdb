"""Training observability: metrics.jsonl mirrored to TensorBoard event files (read back by an
independent TFRecord reader, with TensorBoard's purge on resume), by the pretraining loop and the
post-training runs alike, and ``jax.profiler`` traces of chosen steps."""

import math
import os
import struct
import tempfile

import gin
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tiny_models import CORPUS

from agentic_jax.data.tokenizer import train_tokenizer
from agentic_jax.models import TransformerConfig
from agentic_jax.post_training.runner import TrainerRun
from agentic_jax.training.loop import train
from agentic_jax.training.metrics import MetricsLog, read_metrics


def records_of(path):
    """The records of a TFRecord file: a little-endian u64 length, its CRC, the data, its CRC."""
    with open(path, "rb") as f:
        data = f.read()
    at, out = 0, []
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        out.append(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
    assert at == len(data)
    return out


def scalars(directory):
    """``{(tag, step): value}`` as TensorBoard shows them: files read in name order, a session
    start at step s dropping the values read before it at steps >= s."""
    shown = {}
    for name in sorted(os.listdir(directory)):
        for record in records_of(os.path.join(directory, name)):
            event = Event.FromString(record)
            if event.session_log.status == SessionLog.START:
                shown = {k: v for k, v in shown.items() if k[1] < event.step}
            for value in event.summary.value:
                shown[value.tag, event.step] = value.simple_value
    return shown


def numbers_of(records):
    """The scalars metrics.jsonl holds, at TensorBoard's float32."""
    return {
        (k, r["step"]): np.float32(v)
        for r in records
        for k, v in r.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }


def assert_same(shown, expected):
    assert shown.keys() == expected.keys()
    for key, value in expected.items():
        assert shown[key] == value or (math.isnan(shown[key]) and math.isnan(value)), key


@pytest.fixture
def tensorboard_on():
    gin.parse_config("MetricsLog.tensorboard = True")
    yield
    gin.clear_config()


record_values = st.one_of(
    st.floats(allow_infinity=False, width=32), st.integers(-(2**20), 2**20), st.booleans()
)
records = st.dictionaries(st.sampled_from(["loss", "lr", "flag", "eval_loss"]), record_values)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(records, min_size=1, max_size=6),
    st.lists(records, max_size=4),
    st.data(),
)
def test_event_scalars_equal_the_jsonl_numbers_across_a_resume(first, second, data):
    """A run writes steps 1..n, is resumed from a checkpoint at step r and writes r+1..: what
    TensorBoard shows equals the numbers of metrics.jsonl, which drops the same records."""
    resume = data.draw(st.integers(0, len(first)))
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "metrics.jsonl")
        log = MetricsLog(path, tensorboard=True)
        for step, record in enumerate(first, 1):
            log.write({"step": step, **record, "note": "text", "alarms": ["x"]})
        log = MetricsLog(path, resume_step=resume, tensorboard=True)
        for step, record in enumerate(second, resume + 1):
            log.write({"step": step, **record})
        # Flags, text and lists stay out: numbers_of leaves them out too.
        assert_same(scalars(os.path.join(workdir, "tensorboard")), numbers_of(read_metrics(path)))


def test_no_event_files_by_default_or_for_a_process_that_writes_no_records(tmp_path):
    MetricsLog(str(tmp_path / "metrics.jsonl")).write({"step": 1, "loss": 1.0})
    MetricsLog(os.devnull, tensorboard=True).write({"step": 1, "loss": 1.0})
    assert os.listdir(tmp_path) == ["metrics.jsonl"]


def test_a_post_training_run_writes_its_records_to_tensorboard_by_gin(tmp_path, tensorboard_on):
    run = TrainerRun(str(tmp_path))
    run.start({"w": jnp.zeros(2)})
    run.write({"step": 0, "eval_success": 0.25})
    run.write({"step": 1, "loss": 2.5, "reward_mean": np.float32(0.5)})
    shown = scalars(tmp_path / "tensorboard")
    assert shown == {("eval_success", 0): 0.25, ("loss", 1): 2.5, ("reward_mean", 1): 0.5}
    assert_same(shown, numbers_of(read_metrics(run.path("metrics.jsonl"))))


TINY = TransformerConfig(
    d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32, max_seq_len=16
)


def tiny_train(tmp_path, name, **kwargs):
    tokenizer = tmp_path / "tok.json"
    if not tokenizer.exists():
        train_tokenizer(tokenizer, files=[CORPUS], vocab_size=300)
    gin.parse_config(
        f"train_data.files = ['{CORPUS}']\nheldout_data.files = ['{CORPUS}']\n"
        "make_schedule.warmup_steps = 0"
    )
    workdir = tmp_path / name
    train(
        str(workdir), model=TINY, tokenizer_path=str(tokenizer), steps=2, batch_size=8,
        seq_len=16, eval_every=2, eval_batches=1, checkpoint_every=2, log_every=1,
        progress=False, **kwargs,
    )  # fmt: skip
    return workdir


def traces(workdir):
    """The sizes of the trace files under ``workdir/profile``."""
    return [p.stat().st_size for p in (workdir / "profile").rglob("*.xplane.pb")]


def test_pretraining_writes_tensorboard_scalars_and_a_trace_of_the_chosen_step(
    tmp_path, tensorboard_on
):
    """Two steps with ``profile_steps=(2,)``: one trace; the event file holds every number of
    metrics.jsonl, train and held-out.  Without the settings neither directory appears."""
    workdir = tiny_train(tmp_path, "observed", profile_steps=(2,))
    (size,) = traces(workdir)
    assert size > 0
    records = read_metrics(str(workdir / "metrics.jsonl"))
    assert {r["step"] for r in records} == {1, 2} and any("eval_loss" in r for r in records)
    assert_same(scalars(workdir / "tensorboard"), numbers_of(records))
    gin.clear_config()
    plain = tiny_train(tmp_path, "plain")
    assert not (plain / "profile").exists() and not (plain / "tensorboard").exists()
    with pytest.raises(ValueError, match=r"profile_steps \[3\] are not steps of 1..2"):
        tiny_train(tmp_path, "bad", profile_steps=(3,))
