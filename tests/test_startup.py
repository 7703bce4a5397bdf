"""What a run loads and composes: only what it needs (docs/trust/startup.md).

A plain ``python run.py solver=nest cluster=dgx_8x8 model=llama2_7b`` plans on a hierarchy and
prints its summary: it needs neither networkx (graph clusters), matplotlib (plots), pandas
(sweep tables), OR-Tools, PuLP or HiGHS (the exact solvers), nor the top-k, robustness,
simulation, explanation and export code, and Hydra composes its config once. Each check runs
``nest.app.cli.main`` in a fresh interpreter (a module already imported by another test would
hide a stray import) and reads back which modules it loaded; the graph-cluster and option runs
show the same check sees those modules when a run does need them.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

import nest.app.cli

CONF_DIR = Path(nest.app.cli.CONF_DIR)
REPO_ROOT = CONF_DIR.parent

OPTIONAL = (
    "networkx",
    "matplotlib",
    "pandas",
    "ortools",
    "pulp",
    "highspy",
    "nest.graph",
    "nest.exact",
    "nest.analysis.alternatives",
    "nest.analysis.robust",
    "nest.analysis.simulate",
    "nest.analysis.explain",
    "nest.export",
)

PROBE = """
import json, sys
from hydra._internal.hydra import Hydra
composed = []
compose = Hydra.compose_config
def counted(self, *args, **kwargs):
    composed.append(kwargs.get("run_mode"))
    return compose(self, *args, **kwargs)
Hydra.compose_config = counted
optional = json.loads(sys.argv[2])
sys.argv = ["run.py", *json.loads(sys.argv[1])]
import nest.app.cli
nest.app.cli.main()
loaded = sorted(m for m in optional if m in sys.modules)
print("PROBE " + json.dumps({"loaded": loaded, "compositions": len(composed)}))
"""


def _probe(tmp_path: Path, *overrides: str) -> dict:
    """Run ``python run.py OVERRIDES`` in a fresh interpreter: the optional modules it loaded
    and how many times Hydra composed the config."""
    args = [*overrides, "print_summary=false", f"hydra.run.dir={tmp_path}"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(OPTIONAL)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "optimal"
    return json.loads(line.removeprefix("PROBE "))


def test_a_plain_run_loads_only_what_it_needs_and_composes_once(tmp_path):
    got = _probe(tmp_path, "solver=nest", "cluster=dgx_8x8", "model=llama2_7b")
    assert got["loaded"] == [], f"a plain hierarchy run loaded {got['loaded']}"
    assert got["compositions"] == 1


def test_what_a_run_asks_for_is_loaded(tmp_path):
    """A graph cluster loads networkx and the graph package; simulate, explain, export and
    top-k load their code (and the timeline plot matplotlib): the check above can fail."""
    got = _probe(
        tmp_path,
        "solver=nest",
        "solver.top_k=2",
        "cluster=leaf_spine",
        "model=tiny",
        "simulate=true",
        "explain=true",
        "export=megatron",
    )
    assert {
        "networkx",
        "nest.graph",
        "matplotlib",
        "nest.analysis.simulate",
        "nest.analysis.explain",
        "nest.analysis.alternatives",
        "nest.export",
    } <= set(got["loaded"])
    assert not {"pandas", "ortools", "pulp", "highspy", "nest.exact"} & set(got["loaded"])


def test_a_multirun_still_composes_for_its_mode():
    """The one-composition shortcut is taken only when the command line sets no mode."""
    plain = ["solver=nest", "cluster=dgx_8x8", "hydra.run.dir=/tmp/x", "+training.x=1"]
    assert nest.app.cli.sets_no_mode(plain)
    asks = ("-m", "--multirun", "--cfg=job", "hydra.mode=MULTIRUN", "hydra/launcher=parallel")
    for extra in asks:
        assert not nest.app.cli.sets_no_mode([*plain, extra]), extra


def _sets_hydra_mode(node) -> bool:
    if isinstance(node, dict):
        hydra = node.get("hydra")
        if isinstance(hydra, dict) and "mode" in hydra:
            return True
        return any(_sets_hydra_mode(v) for v in node.values())
    return False


def test_no_shipped_config_sets_hydra_mode():
    """The shortcut answers Hydra's "which mode?" with "none set" without composing; that holds
    only while no config under conf/ sets ``hydra.mode`` (a ``hydra/`` group file would set it
    as ``mode:`` at its top)."""
    files = sorted(CONF_DIR.rglob("*.yaml"))
    assert len(files) > 20
    bad = [
        str(path.relative_to(CONF_DIR))
        for path in files
        for doc in [yaml.safe_load(path.read_text()) or {}]
        if _sets_hydra_mode(doc)
        or (path.relative_to(CONF_DIR).parts[0] == "hydra" and "mode" in doc)
    ]
    assert not bad, f"{bad} set hydra.mode: drop nest.app.cli._one_composition"
