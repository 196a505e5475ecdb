"""BUILD stays in sync with the tree: one py_test per test file, no target for a missing file."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _calls(name):
    tree = ast.parse((ROOT / "BUILD").read_text())
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name]


def _kwarg(call, key):
    return next(ast.literal_eval(k.value) for k in call.keywords if k.arg == key)


def test_every_test_file_has_exactly_one_py_test():
    declared = sorted(src for call in _calls("py_test") for src in _kwarg(call, "srcs"))
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    assert declared == on_disk


def test_py_test_names_match_their_files_and_libraries_exist():
    for call in _calls("py_test"):
        (src,) = _kwarg(call, "srcs")
        assert _kwarg(call, "name") == pathlib.Path(src).stem
    libraries = {_kwarg(c, "name") for c in _calls("py_library")}
    assert {"agentic_jax", "pallas_kernels", "sharding"} <= libraries
    binaries = [c for c in _calls("py_binary") if _kwarg(c, "name") == "agentic-jax"]
    assert binaries and _kwarg(binaries[0], "main") == "agentic_jax/cli.py"


def test_build_file_parses_as_starlark_subset():
    text = (ROOT / "BUILD").read_text()
    assert re.search(r'load\("@rules_python//python:defs.bzl"', text)
    ast.parse(text)
