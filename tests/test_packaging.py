"""Honest packaging: every distribution the code imports is declared, every declared one is used,
CI's install is pinned, and ``python -m agentic_jax`` is the command line."""

import ast
import functools
import importlib.metadata
import importlib.util
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The project's packages, and the tests' own modules (helpers, and test files whose strategies or
# models another test reuses), importable because pytest puts tests/ on the path.
OURS = {"agentic_jax", "pallas_kernels", "sharding", "bench"} | {
    path.stem for path in (ROOT / "tests").glob("*.py")
}
# Declared test dependencies that are used without an import statement of ours.
NOT_IMPORTED = {
    "ruff": "a command CI runs",
    "ipykernel": "the kernel the notebook tests start",
    "mcp-server-time": "a third-party MCP server the tests start as a subprocess",
    "six": "gymnax imports it without declaring it",
    "pytest-xdist": "pytest's -n option",
}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported(globs) -> set[str]:
    """Modules imported (anywhere in a file, ``importorskip`` too) by the files of ``globs``."""
    found = set()
    for pattern in globs:
        for path in ROOT.glob(pattern):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module)
                    found |= {f"{node.module}.{a.name}" for a in node.names}
                elif (  # pytest.importorskip("name"): an optional test oracle
                    isinstance(node, ast.Call)
                    and getattr(node.func, "attr", None) == "importorskip"
                    and isinstance(node.args[0], ast.Constant)
                ):
                    found.add(node.args[0].value)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    return {m for m in found if m.split(".")[0] not in OURS | stdlib}


@functools.cache
def _providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def _file_owners() -> dict[str, str]:
    """``{relative path of an installed file: its distribution}``."""
    owners = {}
    for dist in importlib.metadata.distributions():
        name = _name(dist.metadata["Name"])
        owners.update(dict.fromkeys(map(str, dist.files or ()), name))
    return owners


def _distribution(module: str) -> str | None:
    """The distribution that installs ``module``: by its top-level name, or, for a namespace
    package that several distributions share (``google``, ``opentelemetry``), by its file
    (None for the namespace itself and for names imported from it: its modules say)."""
    providers = _providers().get(module.split(".")[0], [])
    if len(set(providers)) == 1:
        return _name(providers[0])
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # ``module`` is a class or function imported from a module
        return None
    if spec is None or spec.origin is None:  # a name imported from it, or the namespace itself
        return None
    origin = pathlib.Path(spec.origin).resolve()
    entries = [p.resolve() for p in map(pathlib.Path, sys.path) if p.is_dir()]
    entry = max((e for e in entries if origin.is_relative_to(e)), key=lambda e: len(e.parts))
    return _file_owners()[origin.relative_to(entry).as_posix()]


def _distributions(modules: set[str]) -> set[str]:
    return {_distribution(m) for m in modules} - {None}


def test_the_library_imports_exactly_its_declared_dependencies():
    declared = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    optional = {  # an extra's (ann: usearch), imported only where its feature is used
        _name(r)
        for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items()
        if extra != "test"
        for r in requirements
    }
    used = _distributions(
        _imported(["agentic_jax/**/*.py", "pallas_kernels/**/*.py", "sharding/**/*.py"])
    )
    assert used - declared - optional == set(), "imported by the library but not declared"
    assert declared - used == set(), "declared but never imported by the library"


def test_the_tests_and_benchmarks_import_only_declared_dependencies():
    extras = PYPROJECT["project"]["optional-dependencies"]
    declared = {_name(r) for r in [*PYPROJECT["project"]["dependencies"], *extras["test"]]}
    used = _distributions(_imported(["tests/**/*.py", "bench/**/*.py"]))
    assert used - declared == set(), "imported by tests or benchmarks but not declared"
    unused = {_name(r) for r in extras["test"]} - used - set(NOT_IMPORTED)
    assert unused == set(), "test dependencies nothing uses"


def test_ci_installs_pinned_versions_and_runs_lint_before_the_tests():
    pins = {
        _name(line): line.split("==")[1]
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    for requirement in [
        *PYPROJECT["project"]["dependencies"],
        *PYPROJECT["project"]["optional-dependencies"]["test"],
    ]:
        assert _name(requirement) in pins, f"{requirement} is not pinned in constraints.txt"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-c constraints.txt" in ci
    assert ci.index("ruff check") < ci.index("ruff format --check") < ci.index("pytest")
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -c constraints.txt "torch==2.13.0" -e ".[test]"' in readme
    assert f"jax {pins['jax']}" in readme  # the version the README says CI runs


def test_python_dash_m_runs_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "agentic_jax", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0 and "usage: agentic-jax" in done.stdout
    assert "train" in done.stdout and "serve" in done.stdout


def test_the_package_ships_its_license_and_type_marker():
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    for package in ("agentic_jax", "pallas_kernels", "sharding"):
        assert (ROOT / package / "py.typed").exists()
