"""Running Python in a subprocess with time, memory and file-size limits and no network.

The child is ``python -I`` (isolated: no user site, no ``PYTHON*`` variables, no current directory
on ``sys.path``) started in a fresh temporary directory.  Before the model's code runs, the child
lowers its own resource limits (soft and hard, so the code cannot raise them again):

* ``RLIMIT_CPU``: CPU seconds, one more than the wall-clock limit (a backstop for a parent too
  starved to kill in time; its soft limit ends the child with SIGXCPU, which counts as reaching
  the time limit, and the hard one a second later with SIGKILL);
* ``RLIMIT_AS``: address space; ``RLIMIT_FSIZE``: bytes per file, stdout and stderr included;

and installs an audit hook (PEP 578, ``sys.addaudithook``) that raises ``PermissionError`` for
opening a file for writing outside the sandbox directory, for every ``socket.*`` event (no network),
for starting processes, and for path-changing ``os`` calls outside the directory.  The parent also
kills the whole process group at the wall-clock timeout (``time.sleep`` uses no CPU).

**This is a best-effort guard, not a security boundary.**  Audit hooks see only what the
interpreter reports; ``ctypes`` is blocked at ``dlopen``, but native extensions already loaded can
do anything, and the code runs as the calling user.  For untrusted code use a container, a VM or
gVisor, and keep this for catching accidents of well-meaning models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from agentic_jax.text import clip

_BOOTSTRAP = r"""
import os, resource, sys
limits = {limits!r}
for name, (soft, hard) in limits.items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# The path arguments each event changes: both ends of a move or hard link (moving a file out
# writes outside; a hard link to an outside file makes it writable from inside).  A symlink's
# target may point anywhere: writes through it are checked on their resolved path.
PATH_EVENTS = {{"os.remove": (0,), "os.rename": (0, 1), "os.replace": (0, 1), "os.rmdir": (0,),
                "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,), "os.link": (0, 1),
                "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,),
                "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.move": (0, 1)}}
BLOCKED = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "ctypes.dlopen", "sys.addaudithook", "os.chdir")

def inside(path):
    if isinstance(path, int):
        return True  # an already open descriptor
    path = os.fsdecode(path)
    full = os.path.realpath(os.path.join(ROOT, path))
    return full == ROOT or full.startswith(ROOT + os.sep)

def hook(event, args):
    if event.startswith("socket."):
        raise PermissionError(f"sandbox: network access is blocked ({{event}})")
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {{event}} is blocked")
    if event == "open":
        path, mode, flags = args
        writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS)
        if writing and path is not None and not inside(path):
            raise PermissionError(f"sandbox: writing outside the sandbox is blocked ({{path}})")
    elif event in PATH_EVENTS and not all(inside(args[i]) for i in PATH_EVENTS[event]):
        raise PermissionError(f"sandbox: {{event}} outside the sandbox is blocked")

source = open("main.py", encoding="utf-8").read()
sys.addaudithook(hook)
exec(compile(source, "main.py", "exec"), {{"__name__": "__main__"}})
"""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def text(self) -> str:
        """What the model sees: output, then the error tail and the reason it stopped."""
        parts = [self.stdout.rstrip()] if self.stdout.strip() else []
        if self.stderr.strip():
            parts.append("stderr:\n" + self.stderr.rstrip())
        if self.timed_out:
            parts.append("killed: time limit reached")
        elif self.returncode and self.returncode < 0:
            parts.append(f"killed by signal {signal.Signals(-self.returncode).name}")
        elif self.returncode:
            parts.append(f"exit code {self.returncode}")
        return "\n".join(parts) or "(no output)"


def _read(file) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="replace")


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_file_mb: int = 16,
    max_output_chars: int = 8000,
    workdir: str | os.PathLike | None = None,
) -> SandboxResult:
    """Runs ``code`` in the sandbox; ``workdir`` (default: a fresh temporary directory, removed
    afterwards) is the only place it may write."""
    with tempfile.TemporaryDirectory(prefix="agent-sandbox-") as scratch:
        root = Path(workdir or scratch)
        (root / "main.py").write_text(code, encoding="utf-8")
        cpu_s, memory, file_size = math.ceil(timeout_s) + 1, memory_mb * 2**20, max_file_mb * 2**20
        limits = {
            "RLIMIT_CPU": (cpu_s, cpu_s + 1),
            "RLIMIT_AS": (memory, memory),
            "RLIMIT_FSIZE": (file_size, file_size),
        }
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        # Output goes to files, not pipes, so that RLIMIT_FSIZE bounds it as well: a program
        # printing in a loop gets "File too large" instead of filling the parent's memory.
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOTSTRAP.format(limits=limits)],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                # ProcessLookupError: it ended on its own just now.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                timed_out = True
            timed_out = timed_out or proc.returncode == -signal.SIGXCPU
            out = clip(_read(stdout), max_output_chars)
            err = clip(_read(stderr), max_output_chars, tail=True)
    return SandboxResult(out, err, proc.returncode, timed_out)
