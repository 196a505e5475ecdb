"""The Python sandbox kills runaway code and blocks writes outside its directory and the network."""

import sys

import pytest

from agentic_jax.agents import ToolExecutor, python_tool, run_python
from agentic_jax.data.chat import ToolCall

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="resource limits and audit hooks")


def test_code_runs_and_may_write_inside_its_directory():
    result = run_python("open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())")
    assert result.ok and result.stdout.strip() == "kept"


def test_runaway_code_is_killed():
    spin = run_python("while True:\n    pass", timeout_s=1)
    assert spin.timed_out and not spin.ok and "time limit" in spin.text()
    sleep = run_python("import time\ntime.sleep(60)", timeout_s=0.5)
    assert sleep.timed_out
    memory = run_python("x = bytearray(4 * 1024 ** 3)", memory_mb=256)
    assert not memory.ok and "MemoryError" in memory.stderr
    # The CPU-time backstop (soft limit: SIGXCPU) counts as reaching the time limit too.
    cpu = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")
    assert cpu.timed_out and not cpu.ok and "time limit" in cpu.text()


def test_writes_outside_the_sandbox_are_blocked(tmp_path):
    target = tmp_path / "escaped.txt"
    for code in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.close(os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY))",
        f"open('../{target.name}', 'a')",
    ):
        result = run_python(code)
        assert not result.ok and "writing outside the sandbox is blocked" in result.stderr
    assert not target.exists()
    removed = run_python(f"import os\nos.remove({str(tmp_path)!r})")
    assert "outside the sandbox is blocked" in removed.stderr and tmp_path.exists()


def test_files_cannot_be_moved_out_or_hard_linked_in(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("original")
    moved = run_python(
        f"import os\nopen('x', 'w').write('evil')\nos.rename('x', {str(tmp_path / 'moved.txt')!r})"
    )
    assert "os.rename outside the sandbox is blocked" in moved.stderr
    linked = run_python(f"import os\nos.link({str(outside)!r}, 'h')\nopen('h', 'w').write('evil')")
    assert "os.link outside the sandbox is blocked" in linked.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside.txt"]
    assert outside.read_text() == "original"


def test_output_is_bounded_by_the_file_size_limit():
    flood = run_python(
        "import sys\nfor _ in range(4):\n    sys.stdout.write('x' * 2 ** 20)",
        max_file_mb=1,
        max_output_chars=100,
    )
    assert not flood.ok and "File too large" in flood.stderr
    assert flood.stdout.startswith("x" * 100) and "chars cut" in flood.stdout


def test_long_stderr_keeps_its_tail_where_the_error_is():
    noisy = run_python(
        "import sys\nsys.stderr.write('warning\\n' * 100)\n1/0", max_output_chars=200
    )
    assert noisy.stderr.startswith("... [") and "ZeroDivisionError" in noisy.stderr


def test_network_and_processes_are_blocked():
    sock = run_python("import socket\nsocket.create_connection(('127.0.0.1', 9))")
    assert not sock.ok and "network access is blocked" in sock.stderr
    proc = run_python("import subprocess\nsubprocess.run(['true'])")
    assert not proc.ok and "subprocess.Popen is blocked" in proc.stderr


def test_the_python_tool_returns_output_or_the_error_to_the_model():
    executor = ToolExecutor([python_tool(timeout_s=2)])
    ok = executor.execute(ToolCall("python", {"code": "print(sum(range(10)))"}))
    assert ok.ok and ok.content == "45"
    bad = executor.execute(ToolCall("python", {"code": "1/0"}))
    assert bad.ok and bad.content == "error: ZeroDivisionError: division by zero"
