"""The architecture docs/architecture.md states: imports go experiments -> baselines -> nest, and no
private name of the cost model is used outside it (one set of formulas, public terms)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every import statement, nested ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_the_library_imports_neither_baselines_nor_experiments():
    bad = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in _sources("nest")
        for module, _ in _imports(path)
        if module.split(".")[0] in ("baselines", "experiments")
    ]
    assert not bad, bad


def test_baselines_do_not_import_experiments():
    bad = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in _sources("baselines")
        for module, _ in _imports(path)
        if module.split(".")[0] == "experiments"
    ]
    assert not bad, bad


def test_no_private_name_of_the_cost_model_is_imported_outside_it():
    bad = []
    for package in ("nest", "baselines", "experiments", "tests"):
        for path in _sources(package):
            if path.is_relative_to(ROOT / "nest" / "cost"):
                continue
            for module, names in _imports(path):
                if module.startswith("nest.cost"):
                    bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("_")]
    assert not bad, bad


def test_the_layering_check_sees_imports():
    """The checks above would pass on files they cannot parse: make sure they see real imports
    (the evaluator imports the cost terms, fixed imports the plan builder)."""
    evaluate = dict(_imports(ROOT / "nest" / "cost" / "evaluate.py"))
    assert "nest.cost.state" in evaluate
    assert "nest.core.build" in dict(_imports(ROOT / "baselines" / "fixed.py"))
