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


# Rooms: a top-level module file (``nest/planner.py``) or a sub-package as a whole
# (``nest/cost/``); an import between two rooms is an edge, wherever it stands (inside a function,
# under TYPE_CHECKING): a cycle between rooms means neither can be read, tested or loaded alone.
ROOM_PACKAGES = ("nest", "baselines", "experiments")

LAYERS = (
    ("nest.core",),
    ("nest", "nest.cost", "nest.graph", "nest.profile"),
    ("nest.planner", "nest.export"),
    ("nest.dp",),
    ("nest.exact",),
    ("nest.analysis",),
    ("nest.app",),
    ("nest.explain", "nest.validate", "nest.calibrate"),
)
"""The library's layers, lowest first: a room imports only rooms of lower layers, so rooms of one
layer (the cost model and the graph, say) never import each other."""


def _module_files(packages) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages``."""
    out = {}
    for package in packages:
        for path in _sources(package):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _room(module: str) -> str:
    """``nest.cost.groups`` -> ``nest.cost``; ``nest.planner`` -> itself."""
    return ".".join(module.split(".")[:2])


def _imported_modules(module: str, path: Path) -> list[str]:
    """Every module an import statement of ``path`` names (relative ones resolved; for
    ``from X import y`` both ``X`` and ``X.y``, which may be a module)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return out


def room_graph(packages=ROOM_PACKAGES) -> dict[str, set[str]]:
    """Room -> the other rooms of ``packages`` it imports."""
    modules = _module_files(packages)
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        here = _room(module)
        edges.setdefault(here, set())
        for name in _imported_modules(module, path):
            while name and name not in modules:  # an imported name, not a module
                name = name.rpartition(".")[0]
            if name and _room(name) != here:
                edges[here].add(_room(name))
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_rooms():
    cycle = find_cycle(room_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_cycles_and_sees_nested_imports():
    """The check above cannot pass by seeing nothing: it finds a planted cycle, and the room
    graph holds imports made inside functions (the exact solvers import OR-Tools there; the
    sweep's callback imports the aggregation there)."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    edges = room_graph()
    assert "experiments.aggregate" in edges["experiments.callbacks"]  # inside a method
    assert "nest.graph" in edges["nest.app"]  # inside build_cluster
    assert {"nest.cost", "nest.core"} <= edges["nest.planner"]


def test_the_core_imports_nothing_above_it():
    """``nest.core`` (errors, units, hardware, model, topology, problem, plan, report) is what
    every other room is written in; it imports no other room of the library."""
    above = room_graph(("nest",))["nest.core"]
    assert not above, f"nest.core imports {sorted(above)}"


def test_the_library_is_layered():
    """Each room of ``nest`` imports only rooms of lower layers (:data:`LAYERS`); a new room
    must be given a layer."""
    layer = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
    edges = room_graph(("nest",))
    assert set(edges) == set(layer), f"rooms without a layer: {sorted(set(edges) - set(layer))}"
    bad = [
        f"{room} (layer {layer[room]}) imports {other} (layer {layer[other]})"
        for room, targets in edges.items()
        for other in targets
        if layer[other] >= layer[room]
    ]
    assert not bad, bad


FABRIC_HOMES = ("nest/core/topology.py", "nest/core/fabric.py", "nest/core/hierarchy.py")
"""Where a cluster's network is chosen and implemented (with ``nest/graph/``): the only places
that may look at which fabric a cluster has."""
FABRIC_TYPES = {"GroupClass", "LinkClass", "Network", "Hierarchy"}


def _fabric_branches(source: str, name: str) -> list[str]:
    """Every place in ``source`` (the text of file ``name``) that reads ``.network`` or tests a
    value against a fabric's or a cost class's type: a branch on which network a cluster has."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "network":
            out.append(f"{name}:{node.lineno} reads .network")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            named = {k.id for k in kinds if isinstance(k, ast.Name)}
            if named & FABRIC_TYPES:
                out.append(f"{name}:{node.lineno} isinstance {sorted(named)}")
    return out


def test_the_cost_model_never_asks_which_fabric_it_got():
    """The network is one interface (:class:`nest.core.fabric.Fabric`) with two implementations
    (a hierarchy of levels, a routed graph): the cost model, the planners and the reports ask
    ``cluster.fabric`` and never branch on which one they got, so a new network term is written
    once per fabric, behind the interface, and nowhere else."""
    bad = [
        hit
        for package in ("nest", "baselines")
        for path in _sources(package)
        if str(path.relative_to(ROOT)) not in FABRIC_HOMES
        and not path.is_relative_to(ROOT / "nest" / "graph")
        for hit in _fabric_branches(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not bad, bad


def test_the_fabric_check_sees_branches():
    """The check above cannot pass by seeing nothing: the cluster, which chooses its fabric,
    reads ``.network``, and planted branches (the two this refactor removed) are found."""
    topology = ROOT / "nest" / "core" / "topology.py"
    assert _fabric_branches(topology.read_text(), "topology.py")
    planted = (
        "if cluster.network is not None:\n    pass\n"
        "if isinstance(level, (int, LinkClass)):\n    pass\n"
    )
    assert sorted(_fabric_branches(planted, "x.py")) == [
        "x.py:1 reads .network",
        "x.py:3 isinstance ['LinkClass', 'int']",
    ]
