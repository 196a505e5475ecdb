"""gin configuration: locating config files, parsing flags, saving the operative config."""
from __future__ import annotations

import contextlib
import logging
import os
from importlib import resources
from pathlib import Path

import gin


def config_dir() -> Path:
    """The shipped configs (``agentic_jax/configs``, also reachable as the top-level ``configs/``)."""
    return Path(str(resources.files("agentic_jax.configs")))


def resolve_config(name: str) -> str:
    """A path as given, else a file of that name in the shipped configs (``.gin`` optional)."""
    if os.path.exists(name):
        return name
    base = os.path.basename(name)  # "configs/x.gin" also finds the shipped x.gin from anywhere
    for candidate in (base, f"{base}.gin"):
        path = config_dir() / candidate
        if path.exists():
            return str(path)
    raise FileNotFoundError(f"gin file {name!r} not found (looked in the working directory and "
                            f"{config_dir()})")


class _SearchMisses(logging.Filter):
    """Drops gin's "Path not found" errors: an ``include`` is tried as a Python package path
    before the config directory, and that expected miss is logged as an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Path not found")


@contextlib.contextmanager
def _quiet_search():
    root, quiet = logging.getLogger(), _SearchMisses()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def parse(gin_files: list[str], gin_params: list[str]) -> None:
    """Parses files then bindings; an unknown configurable or parameter raises before any work.

    ``include 'x.gin'`` inside a config finds ``x`` among the shipped configs."""
    gin.clear_config()
    gin.add_config_file_search_path(str(config_dir()))
    with _quiet_search():
        gin.parse_config_files_and_bindings([resolve_config(f) for f in gin_files], gin_params,
                                            finalize_config=False)


def save_config(workdir: str, operative: bool) -> str:
    """Writes the parsed (``config.gin``) or the operative (``operative_config.gin``) config."""
    os.makedirs(workdir, exist_ok=True)
    name, text = (("operative_config.gin", gin.operative_config_str()) if operative else
                  ("config.gin", gin.config_str()))
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path
