"""The house map of docs/architecture.md holds: every module imports, and no package imports one
that its row does not allow (so the layering cannot silently grow a back door)."""

import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("agentic_jax", "pallas_kernels", "sharding")


def house_map() -> dict[str, set[str]]:
    """``{package: packages it may import}`` from the table in docs/architecture.md."""
    rules = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[\w.]+`", cells[0]):
            rules[cells[0].strip("`")] = set(re.findall(r"`([\w.]+)`", cells[2]))
    return rules


def modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def unit_of(module: str, rules) -> str | None:
    """The row of the table that ``module`` belongs to (the longest matching prefix)."""
    matches = [u for u in rules if module == u or module.startswith(u + ".")]
    return max(matches, key=len) if matches else None


def imported(module: str) -> set[str]:
    """Every project module ``module`` imports, at its top or inside functions."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return {n for n in names if n.split(".")[0] in PACKAGES}


def test_the_table_names_every_package_once():
    rules = house_map()
    assert {"agentic_jax.rl", "agentic_jax.models", "agentic_jax.agents"} <= set(rules)
    unmapped = [m for m in modules() if m != "agentic_jax" and unit_of(m, rules) is None]
    assert not unmapped, f"modules outside every row of docs/architecture.md: {unmapped}"
    for allowed in rules.values():
        assert allowed <= set(rules), f"a row allows unknown packages: {allowed - set(rules)}"


@pytest.mark.parametrize("module", modules())
def test_every_module_imports(module):
    importlib.import_module(module)


def violations(imports: dict[str, set[str]], rules) -> list[str]:
    """The imports of ``{module: imported modules}`` that the table does not allow."""
    found = []
    for module, names in imports.items():
        unit = unit_of(module, rules)
        if unit is None:  # the top-level package itself
            continue
        for name in names:
            target = unit_of(name, rules)
            if target is not None and target != unit and target not in rules[unit]:
                found.append(f"{module} imports {name} ({unit} may not import {target})")
    return found


def test_dependencies_point_down_the_house_map():
    found = violations({m: imported(m) for m in modules()}, house_map())
    assert not found, "\n".join(found)


def test_the_rl_leaf_imports_only_itself():
    assert house_map()["agentic_jax.rl"] == set()
    for module in modules():
        if module.startswith("agentic_jax.rl"):
            assert all(
                n.startswith("agentic_jax.rl") or n == "agentic_jax" for n in imported(module)
            ), module


def test_the_check_reports_a_back_door():
    rules = house_map()
    back_door = {
        "agentic_jax.models.transformer": {"agentic_jax.inference.serving.engine"},
        "agentic_jax.rl.kl": {"agentic_jax.post_training.rl"},
        "agentic_jax.agents.tools.base": {"agentic_jax.data.chat"},
    }  # the last is allowed
    assert [v.split(" imports ")[0] for v in violations(back_door, rules)] == [
        "agentic_jax.models.transformer",
        "agentic_jax.rl.kl",
    ]
