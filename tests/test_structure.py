"""Structure rules of the library code (nest/, baselines/, experiments/), as failing tests."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
"""A function longer than this is usually several steps waiting for names (docs STYLE.md)."""
EXEMPT = {("nest/app/cli.py", "run")}  # being split into steps separately (issue 25)
LONG_REASON = re.compile(r"Long:\s*\S")


def long_functions() -> list[tuple[str, str, int, bool]]:
    """(path, name, lines, has a "Long:" reason in its docstring) of every library function
    over :data:`MAX_LINES` lines."""
    out = []
    for package in ("nest", "baselines", "experiments"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES and (rel, node.name) not in EXEMPT:
                    doc = ast.get_docstring(node) or ""
                    out.append((rel, node.name, lines, bool(LONG_REASON.search(doc))))
    return out


def test_long_functions_are_split_or_say_why():
    """A library function over 80 lines is split into named steps, or its docstring says why
    not with ``Long:`` and a reason (e.g. a hot loop whose locals a split would pass around)."""
    bad = [
        f"{path}:{name} ({lines} lines)" for path, name, lines, why in long_functions() if not why
    ]
    assert not bad, bad


def test_the_length_check_sees_functions():
    """The check above would pass on code it cannot see: it finds the documented long
    functions (at least one has a reason) and measures a known short one as short."""
    found = long_functions()
    assert any(why for *_, why in found)
    tree = ast.parse((ROOT / "nest" / "core" / "axes.py").read_text())
    divisors = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "divisors")
    assert divisors.end_lineno - divisors.lineno + 1 < MAX_LINES
