"""Writing files so that a crash or a concurrent reader never sees half of one."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **open_kwargs) -> Iterator[IO]:
    """A new file to write in, renamed onto ``path`` when the block ends without an error.

    Readers see the old ``path`` or the new one, never part of one (``os.replace`` is atomic).
    The temporary file beside it is opened exclusively with the umask's permissions (not
    ``mkstemp``'s 0600, which would hide a shared cache from other users) and removed if the
    write fails, e.g. on a full disk.  ``mode`` is ``"w"`` or ``"wb"``.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        with open(tmp, mode.replace("w", "x"), **open_kwargs) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, value: Any) -> None:
    """``value`` as indented JSON at ``path``, written atomically (a job's ``report.json``)."""
    with atomic_write(path, encoding="utf-8") as sink:
        sink.write(json.dumps(value, indent=1) + "\n")
