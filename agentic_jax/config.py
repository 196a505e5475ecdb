"""gin configuration: locating config files, parsing flags, saving the operative config."""

from __future__ import annotations

import contextlib
import logging
import os
import tokenize
from importlib import resources
from pathlib import Path

import gin


def config_dir() -> Path:
    """The shipped configs (``agentic_jax/configs``, also reachable as the top-level ``configs/``)."""
    return Path(str(resources.files("agentic_jax.configs")))


def resolve_config(name: str) -> str:
    """A path as given, else a file of that name in the shipped configs (``.gin`` optional).

    Only a bare name or one under a ``configs/`` directory falls back to the shipped configs:
    a mistyped ``my_runs/tiny.gin`` must not silently run the shipped ``tiny.gin``."""
    if os.path.exists(name):
        return name
    folder, base = os.path.split(os.path.normpath(name))
    if folder and os.path.basename(folder) != "configs":
        raise FileNotFoundError(f"gin file {name!r} not found")
    for candidate in (base, f"{base}.gin"):
        path = config_dir() / candidate
        if path.exists():
            return str(path)
    raise FileNotFoundError(
        f"gin file {name!r} not found (looked in the working directory and {config_dir()})"
    )


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
        for path in [resolve_config(f) for f in gin_files]:
            _parse_one(gin.parse_config_file, path, f"gin file {path!r}")
        for binding in gin_params:  # one at a time, so an error names the binding
            _parse_one(gin.parse_config, binding, f"--gin_param {binding!r}")


def _parse_one(parse_fn, source: str, what: str) -> None:
    """gin leaves an unclosed bracket or quote to the tokenizer, whose error names no source."""
    try:
        parse_fn(source)
    except tokenize.TokenError as e:
        raise ValueError(f"{what}: {e.args[0]} (an unclosed bracket or quote?)") from e


def save_config(workdir: str, operative: bool) -> str:
    """Writes the parsed (``config.gin``) or the operative (``operative_config.gin``) config."""
    os.makedirs(workdir, exist_ok=True)
    name, text = (
        ("operative_config.gin", gin.operative_config_str())
        if operative
        else ("config.gin", gin.config_str())
    )
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text)
    return path
