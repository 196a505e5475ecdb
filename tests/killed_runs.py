"""Test helper: run a training command to its end, or SIGKILL it mid-run on an event."""

import os
import signal
import subprocess
import sys
import time

# Subprocesses see the test helpers and the package as the tests do, on the CPU.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "JAX_PLATFORMS": "cpu"}


def run_to_end(cmd, *, timeout: float = 900) -> None:
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]


def kill_when_exists(cmd, marker, *, timeout: float = 900) -> None:
    """Starts ``cmd``, waits until the path ``marker`` exists (a checkpoint the run wrote), and
    SIGKILLs it at once: in the middle of whatever it does next.  Fails if the run ended first."""
    proc = subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(marker):
            assert proc.poll() is None, (
                f"exited with {proc.returncode}: {proc.stderr.read()[-4000:]}"
            )
            assert time.monotonic() < deadline, f"no {marker} after {timeout} s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
