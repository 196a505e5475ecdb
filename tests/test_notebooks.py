"""The shipped notebooks: the expected six, each self-installing on Colab, each running top to bottom."""

import importlib.metadata
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = {
    "quickstart.ipynb",
    "rl_losses.ipynb",
    "environments.ipynb",
    "agents.ipynb",
    "sharding.ipynb",
    "bring_your_own_model.ipynb",
}
COLAB = "https://colab.research.google.com/github/agentic-jax/agentic-jax/blob/main/notebooks/"
BADGE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
GITHUB = "git+https://github.com/agentic-jax/agentic-jax"


def read(path):
    return nbformat.read(path, as_version=4)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def install_cell(path):
    return code_cells(read(path))[0].source


def outputs_text(nb) -> str:
    """Everything the executed cells printed or displayed as text."""
    parts = []
    for cell in code_cells(nb):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def images(nb) -> int:
    return sum(
        "image/png" in out.get("data", {}) for c in code_cells(nb) for out in c.get("outputs", [])
    )


def test_the_expected_notebooks_are_shipped():
    assert {p.name for p in NOTEBOOKS} == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_in_colab_and_is_stored_clean(path):
    nb = read(path)
    nbformat.validate(nb)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert f"{BADGE}({COLAB}{path.name})" in first.source  # the badge opens this very file
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.metadata["kernelspec"]["language"] == "python"
    for cell in code_cells(nb):
        assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]
    assert any(c.cell_type == "markdown" for c in nb.cells[2:])  # explained, not just code


def test_every_notebook_starts_with_the_same_install_cell():
    cells = {p.name: install_cell(p) for p in NOTEBOOKS}
    reference = cells["quickstart.ipynb"]
    assert all(cell == reference for cell in cells.values()), [
        name for name, cell in cells.items() if cell != reference
    ]
    assert 'find_spec("agentic_jax")' in reference and GITHUB in reference
    assert '"-e"' in reference and "agentic-jax" in reference
    for path in NOTEBOOKS:  # and nothing before it: the title cell, then the install cell
        nb = read(path)
        assert nb.cells[1].cell_type == "code" and nb.cells[1].source == reference


class Pip:
    """Records the pip commands the install cell would run, instead of running them."""

    def __init__(self):
        self.calls = []

    def __call__(self, command, *args, **kwargs):
        self.calls.append(command)
        return 0


class Dist:
    def __init__(self, name):
        self.metadata = {"Name": name}


@pytest.fixture
def run_install_cell(monkeypatch, tmp_path):
    """``run(cwd, importable=..., dists=...)`` executes the install cell there; returns pip's calls."""
    source = install_cell(NOTEBOOK_DIR / "quickstart.ipynb")
    real_find_spec = importlib.util.find_spec

    def run(cwd, *, importable=False, dists=("numpy", "jax")):
        pip = Pip()

        def find_spec(name, *args, **kwargs):
            if name == "agentic_jax" and not importable:
                return None
            return real_find_spec(name, *args, **kwargs)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        monkeypatch.setattr(subprocess, "check_call", pip)
        monkeypatch.setattr(importlib.metadata, "distributions", lambda: map(Dist, dists))
        monkeypatch.setattr(sys, "path", list(sys.path))
        monkeypatch.chdir(cwd)
        exec(compile(source, "install-cell", "exec"), {"__name__": "__main__"})
        return pip.calls

    return run


def test_the_install_cell_does_nothing_when_agentic_jax_is_importable(run_install_cell, tmp_path):
    assert run_install_cell(tmp_path, importable=True) == []


def test_the_install_cell_installs_the_checkout_it_sits_in(run_install_cell, tmp_path):
    repo = tmp_path / "agentic-jax"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[project]\nname = "agentic-jax"\nversion = "0.1.0"\n')
    (calls,) = run_install_cell(repo / "notebooks")
    assert calls[:4] == [sys.executable, "-m", "pip", "install"]
    assert calls[-2:] == ["-e", str(repo)] and GITHUB not in calls
    assert sys.path[0] == str(repo)  # importable at once, before the kernel restarts


def test_the_install_cell_installs_from_github_elsewhere(run_install_cell, tmp_path):
    other = tmp_path / "other-project"
    (other / "src").mkdir(parents=True)
    (other / "pyproject.toml").write_text('[project]\nname = "not-agentic-jax"\n')
    (calls,) = run_install_cell(other / "src")  # another project's checkout does not count
    assert GITHUB in calls and "-e" not in calls
    assert not any(c.startswith("jax[") for c in calls)


@pytest.mark.parametrize(
    "plugin, extra",
    [
        ("jax-cuda12-plugin", "jax[cuda12]"),
        ("jax_cuda12_plugin", "jax[cuda12]"),
        ("libtpu", "jax[tpu]"),
    ],
)
def test_the_install_cell_keeps_an_accelerator_plugin_in_step(
    run_install_cell, tmp_path, plugin, extra
):
    (calls,) = run_install_cell(tmp_path, dists=("jax", plugin))
    assert GITHUB in calls and extra in calls


# What each executed notebook must print (beyond running without an error), and its plots.
KEY_OUTPUTS = {
    "quickstart.ipynb": (["eval_loss", "parameters;", "loss_curve.png"], 1),
    "rl_losses.ipynb": (["policy losses:", "computed", "sigmoid: loss at h = 0  0.693"], 2),
    "environments.ipynb": (["python loop over jitted env.step", "4096 envs", "greedy return"], 2),
    "agents.ipynb": (
        ["answer: 3 miles plus 1 km is about 5828 m.", "stop: answer", "direct call: 2000 m"],
        0,
    ),
    "sharding.ipynb": (["per-device shape", "sharded step = single-device step"], 0),
    "bring_your_own_model.ipynb": (
        [
            "JinjaChatTemplate",
            "tool-call format: hermes",
            'tool_choice=required: content=None, tool_calls=[{"id": "call_',
            "same prompt ids: True",
            "logits match transformers: True",
        ],
        0,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path):
    nb = read(path)
    start = time.perf_counter()
    nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    print(f"{path.name} executed in {time.perf_counter() - start:.1f}s")  # shown with -s
    errors = [
        o for c in code_cells(nb) for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors, json.dumps(errors, indent=1)[:4000]
    assert all(c.execution_count for c in code_cells(nb))  # every cell ran
    expected, plots = KEY_OUTPUTS[path.name]
    text = outputs_text(nb)
    missing = [key for key in expected if key not in text]
    assert not missing, (missing, text[-4000:])
    assert images(nb) >= plots
    if (
        path.name == "sharding.ipynb"
    ):  # the kernel inherits this process's JAX_PLATFORMS and XLA_FLAGS
        import jax

        devices = jax.devices()  # the suite's conftest makes these 8 CPU devices
        assert f"{len(devices)} devices: {devices[0].platform}" in text
    if path.name == "rl_losses.ipynb":
        from agentic_jax.rl import POLICY_LOSSES

        assert re.search(rf"\b{len(POLICY_LOSSES)} policy losses:", text)
        assert text.count(", A = +1:") == text.count(", A = -1:") == len(POLICY_LOSSES)
