"""`agentic-jax train` as two processes on localhost, each with 4 fake CPU devices forming one
8-device mesh, trains exactly like a single process fed the same global batches."""

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from agentic_jax.data.pipeline import train_data
from agentic_jax.data.tokenizer import load_tokenizer
from agentic_jax.models import init_params
from agentic_jax.models.export import config_from_dict, load_model
from agentic_jax.training import (
    TrainState,
    distributed,
    make_optimizer,
    make_schedule,
    make_train_step,
)
from agentic_jax.training.metrics import read_metrics

CORPUS = os.path.join(os.path.dirname(__file__), "data", "tiny_corpus.txt")
STEPS, BATCH, SEQ, PROCESSES, LOCAL_DEVICES = 3, 8, 32, 2, 4
# data spans the two processes (the slower link), fsdp and tensor the devices within each.
MESH = '{"data": 2, "fsdp": 2, "tensor": 2}'
# Adam eps as in test_sharding_train: keeps near-cancelling gradients from amplifying the
# different summation order of sharded reductions beyond the tolerance.
LR, EPS = 1e-3, 1e-5
GIN = [
    f"train_tokenizer.files=['{CORPUS}']",
    f"train_data.files=['{CORPUS}']",
    f"heldout_data.files=['{CORPUS}']",
    f"sharding.make_mesh.spec={MESH}",
    "TransformerConfig.n_heads=4",
    "TransformerConfig.n_kv_heads=2",
    "TransformerConfig.head_dim=8",
    f"train.steps={STEPS}",
    f"train.batch_size={BATCH}",
    f"train.seq_len={SEQ}",
    "train.seed=0",
    "train.log_every=1",
    "train.progress=False",
    "make_schedule.kind='constant'",
    f"make_schedule.peak_lr={LR}",
    "make_schedule.warmup_steps=0",
    f"make_optimizer.eps={EPS}",
]
# LLVM optimisation is most of the compile time of these small programs and changes no HLO.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra) -> dict:
    """The test's environment without its 8-device flag, proxies or a distributed setup."""
    drop = {
        "XLA_FLAGS",
        distributed.ENV_COORDINATOR,
        distributed.ENV_NUM_PROCESSES,
        distributed.ENV_PROCESS_ID,
    }
    env = {k: v for k, v in os.environ.items() if k not in drop and "_proxy" not in k.lower()}
    flags = " ".join(f"--{k}={str(v).lower()}" for k, v in FAST_COMPILE.items())
    return {
        **env,
        "JAX_PLATFORMS": "cpu",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={LOCAL_DEVICES} {flags}",
        **extra,
    }


def run_two_processes(workdir, logdir) -> None:
    """Process 0 gets its coordinates as flags, process 1 from the environment (both supported).

    The coordinator binds to loopback only (JAX's default is every interface).
    """
    address = f"127.0.0.1:{free_port()}"
    loopback = {"JAX_COORDINATOR_BIND_ADDRESS": address}
    cmd = [
        sys.executable,
        "-m",
        "agentic_jax.cli",
        "train",
        "--gin_file",
        "tiny",
        "--workdir",
        workdir,
        *(arg for p in GIN for arg in ("--gin_param", p)),
    ]
    launches = [
        (
            cmd + ["--coordinator_address", address, "--num_processes", "2", "--process_id", "0"],
            child_env(**loopback),
        ),
        (
            cmd,
            child_env(
                **loopback,
                **{
                    distributed.ENV_COORDINATOR: address,
                    distributed.ENV_NUM_PROCESSES: "2",
                    distributed.ENV_PROCESS_ID: "1",
                },
            ),
        ),
    ]
    with contextlib.ExitStack() as stack:  # closes the logs once the processes are gone
        logs = [
            stack.enter_context(open(os.path.join(logdir, f"process{i}.log"), "w"))
            for i in range(PROCESSES)
        ]
        procs = [
            subprocess.Popen(c, env=e, stdout=log, stderr=subprocess.STDOUT)
            for (c, e), log in zip(launches, logs)
        ]
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                if any(p.poll() not in (None, 0) for p in procs):
                    break  # one failed: the other would wait for it until the heartbeat timeout
                time.sleep(0.2)
            codes = [p.poll() for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
    if codes != [0] * PROCESSES:
        tails = [pathlib.Path(log.name).read_text()[-3000:] for log in logs]
        pytest.fail(
            f"exit codes {codes} (None: killed after {TIMEOUT_S}s)\n"
            + "\n".join(f"--- process {i} ---\n{tail}" for i, tail in enumerate(tails))
        )


def single_process_reference(workdir):
    """Per-step (loss, grad_norm) and final params of one device fed each step's global batch:
    the concatenation of the rows every process reads from its share of the data."""
    with open(os.path.join(workdir, "model", "config.json")) as f:
        config = config_from_dict(json.load(f))  # the model as trained (vocab from the tokenizer)
    tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer.json"))
    schedule = make_schedule(LR, STEPS, kind="constant", warmup_steps=0)
    optimizer = make_optimizer(schedule, b1=0.9, b2=0.95, eps=EPS, weight_decay=0.1, clip_norm=1.0)
    shards = [
        iter(
            train_data(
                tokenizer,
                [CORPUS],
                seq_len=SEQ,
                batch_size=BATCH // PROCESSES,
                seed=0,
                prefetch=0,
                shard_index=i,
                shard_count=PROCESSES,
            )
        )
        for i in range(PROCESSES)
    ]
    state = jax.jit(lambda key: TrainState.create(init_params(config, key), optimizer, 0))(
        jax.random.key(0)
    )
    step, records = None, []
    for _ in range(STEPS):
        local = [next(shard) for shard in shards]
        batch = {k: np.concatenate([b[k] for b in local]) for k in local[0]}
        if step is None:
            step = (
                jax.jit(make_train_step(config, optimizer, schedule))
                .lower(state, batch)
                .compile(FAST_COMPILE)
            )
        state, metrics = step(state, batch)
        records.append((float(metrics["loss"]), float(metrics["grad_norm"])))
    return records, jax.device_get(state.params)


def test_two_processes_train_like_one(tmp_path):
    workdir = str(tmp_path / "run")
    run_two_processes(workdir, str(tmp_path))

    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))  # process 0 alone writes it
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [str(STEPS)]
    expected, expected_params = single_process_reference(workdir)
    np.testing.assert_allclose([(r["loss"], r["grad_norm"]) for r in train], expected, rtol=1e-5)
    _, params = load_model(os.path.join(workdir, "model"))  # gathered from both processes
    jax.tree.map(
        lambda a, e: np.testing.assert_allclose(np.asarray(a), e, rtol=1e-5, atol=1e-6),
        params,
        expected_params,
    )


def test_initialize_distributed_reads_flags_then_environment(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args: calls.append(args))
    for name in (
        distributed.ENV_COORDINATOR,
        distributed.ENV_NUM_PROCESSES,
        distributed.ENV_PROCESS_ID,
    ):
        monkeypatch.delenv(name, raising=False)

    assert not distributed.initialize_distributed()  # nothing given: a single process
    assert not distributed.initialize_distributed("127.0.0.1:1", 1, 0)  # one process needs no peers
    assert distributed.initialize_distributed(auto_detect=True)  # the cluster supplies everything
    monkeypatch.setenv(distributed.ENV_COORDINATOR, "127.0.0.1:2")
    monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "4")
    monkeypatch.setenv(distributed.ENV_PROCESS_ID, "3")
    assert distributed.initialize_distributed(process_id=1)
    assert calls == [(None, None, None), ("127.0.0.1:2", 4, 1)]


def test_a_malformed_environment_variable_is_named(monkeypatch):
    monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two'"):
        distributed.initialize_distributed()
