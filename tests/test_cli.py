"""End-to-end tests of the Hydra entry point (``run.py`` -> :func:`nest.app.cli.run`).

In-process runs compose the config with ``hydra.compose`` and call ``nest.app.cli.run(cfg,
tmp_path)``
(never the ``@hydra.main`` function); one subprocess test runs the main command (with
``solver=megatron``, docs/getting-started.md). Every test writes into ``tmp_path`` only.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
from hydra.core.global_hydra import GlobalHydra

import nest.app.cli
from nest.app.config import build_problem
from nest.core.axes import Recompute
from nest.core.serialize import plan_from_dict
from nest.cost import evaluate
from nest.planner import Planner, build_planner

CONF_DIR = nest.app.cli.CONF_DIR
REPO_ROOT = Path(CONF_DIR).parent
RUN_PY = REPO_ROOT / "run.py"

# Presets found on disk: a new preset is smoke-tested without editing this file. The input
# adapters model=hf / model=profile need a file and have their own tests (test_hf, test_profile).
MODEL_ADAPTERS = {"hf", "profile"}
MODEL_PRESETS = sorted(
    p.stem for p in Path(CONF_DIR, "model").glob("*.yaml") if p.stem not in MODEL_ADAPTERS
)
CLUSTER_PRESETS = sorted(p.stem for p in Path(CONF_DIR, "cluster").glob("*.yaml"))
# Every model runs on these clusters and every cluster runs these models: a hierarchy, a graph and
# a 72-GPU NVLink domain; a dense model, a coarse MoE and one with MLA, shared experts, dense first
# blocks and MTP. The full cross product (about 600 runs) would add over a minute to the suite for
# little: a preset pair fails through its model or its cluster, and each is in a covered pair.
CORE_CLUSTERS = ("dgx_8x8", "tpuv4_torus", "gb200_nvl72")
CORE_MODELS = ("llama2_7b", "mixtral_8x7b", "deepseek_v3")
PRESET_PAIRS = [
    (cluster, model)
    for cluster in CLUSTER_PRESETS
    for model in MODEL_PRESETS
    if cluster in CORE_CLUSTERS or model in CORE_MODELS
]
# the cluster adapters need a file: the smoke loops give them the shipped examples
CLUSTER_INPUTS = {
    "graph": [f"cluster.graph_path={REPO_ROOT / 'data/graphs/dgx_2x4.json'}"],
    "measured": [f"cluster.params.table={REPO_ROOT / 'data/measured/dgx_2x8_example.csv'}"],
}

# -- the frozen CLI surface (a freeze test: changing it must be deliberate) ----------------------
CONFIG_GROUPS = {"solver", "cluster", "model", "training", "device", "experiment"}
# A planner is one module plus one YAML: the solver list is the files, and the tests below check
# that Hydra offers exactly them and that each instantiates a planner named after its file.
SOLVERS = {p.stem for p in Path(CONF_DIR, "solver").glob("*.yaml")}
REQUIRED_MODELS = {
    "bert_large",
    "gpt3_175b",
    "llama2_7b",
    "llama3_70b",
    "mixtral_8x7b",
    "llama3_405b",
    "tiny",
}
REQUIRED_CLUSTERS = {
    "dgx_8x8",
    "dgx_h100_superpod",
    "dgx_a100",
    "tpu_v4",
    "tpuv4_fattree",
    "h100_spineleaf",
}
REPORT_FIELDS = {
    "solver",
    "status",
    "feasible",
    "iteration_time_s",
    "throughput_samples_per_s",
    "tokens_per_s",
    "mfu",
    "solve_time_s",
    "devices_used",
    "plan",
}
REPORT_PLAN_FIELDS = {
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "microbatch_size",
    "num_microbatches",
    "zero_stage",
    "schedule",
    "rank_order",
    "stages",
}
REPORT_STAGE_FIELDS = {"layers", "recompute", "memory_bytes", "time_s"}
MEMORY_TERMS = (
    "weights_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "transient_bytes",
    "reserve_bytes",
)

FIXED_SMALL = [
    "solver=fixed",
    "solver.tp=1",
    "solver.pp=1",
    "solver.dp=8",
    "solver.microbatch_size=1",
]


def compose(*overrides: str):
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra.compose(config_name="config", overrides=list(overrides))


def run_case(tmp_path: Path, *overrides: str):
    """Compose, run, and return (cfg, result, report.json, plan.json or None, echoed lines)."""
    cfg = compose(*overrides)
    lines: list[str] = []
    result = nest.app.cli.run(cfg, tmp_path, echo=lines.append)
    report = json.loads((tmp_path / "report.json").read_text())
    plan_path = tmp_path / "plan.json"
    plan = json.loads(plan_path.read_text()) if plan_path.exists() else None
    return cfg, result, report, plan, lines


def check_memory_adds_up(report: dict) -> None:
    """Every rank's memory terms sum to its total; stages and the peak agree with the ranks."""
    ranks = report["breakdown"]["ranks"]
    for rank in ranks:
        mem = rank["memory"]
        assert math.fsum(mem[t] for t in MEMORY_TERMS) == pytest.approx(mem["total_bytes"])
        assert all(mem[t] >= 0 for t in MEMORY_TERMS)
        assert mem["fits"] == (mem["total_bytes"] <= mem["capacity_bytes"])
    totals = {r["pp_rank"]: r["memory"]["total_bytes"] for r in ranks}
    for stage in report["plan"]["stages"]:
        assert stage["memory_bytes"] == totals[stage["pp_rank"]]
    assert report["peak_memory_bytes"] == max(totals.values())
    assert report["feasible"] == all(r["memory"]["fits"] for r in ranks)
    if not report["feasible"]:
        assert report["status"] == "infeasible"
        assert report["violation"].startswith("out of memory")
        assert "\n" not in report["violation"]


def check_report_facts(cfg, report: dict, plan_json: dict) -> None:
    """The facts every written report of a scored plan must satisfy."""
    assert report.keys() >= REPORT_FIELDS
    p = report["plan"]
    assert p.keys() >= REPORT_PLAN_FIELDS
    assert report["solver"] == cfg.solver.name
    problem = build_problem(cfg)
    n_devices = problem.cluster.num_devices
    global_batch = cfg.training.global_batch
    blocks = cfg.model.layers

    # degrees and devices
    assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == report["devices_used"]
    assert report["devices_used"] + report["devices_idle"] == n_devices
    assert 1 <= report["devices_used"] <= n_devices
    assert sorted(p["rank_order"]) == ["cp", "dp", "pp", "tp"]
    assert p["num_microbatches"] * p["microbatch_size"] * p["dp"] == global_batch
    assert p["microbatch_size"] in cfg.training.microbatch_sizes or cfg.solver.name == "fixed"

    # stages: contiguous, cover the chain 0..L+1 (embedding, L blocks, head)
    stages = p["stages"]
    assert len(stages) == p["pp"] * p.get("virtual_stages", 1)
    expected_first = 0
    for k, stage in enumerate(stages):
        assert stage.keys() >= REPORT_STAGE_FIELDS
        first, last = stage["layers"]
        assert first == expected_first and last >= first
        expected_first = last + 1
        assert stage["recompute"] in {r.value for r in Recompute}
        assert stage["memory_bytes"] > 0 and stage["time_s"] > 0
        assert stage["pp_rank"] == k % p["pp"]
    assert expected_first == blocks + 2

    # headline numbers
    t = report["iteration_time_s"]
    assert t > 0
    assert report["throughput_samples_per_s"] == pytest.approx(global_batch / t, rel=1e-12)
    assert report["tokens_per_s"] == pytest.approx(global_batch * cfg.model.seq_len / t, rel=1e-12)
    breakdown = report["breakdown"]
    assert t == pytest.approx(
        breakdown["pipeline_time_s"] + breakdown["dp_sync_exposed_s"] + breakdown["optimizer_s"],
        rel=1e-12,
    )
    peak = problem.cluster.device.peak_flops_per_s
    assert report["mfu"] == pytest.approx(
        breakdown["model_flops_per_iteration"] / (t * report["devices_used"] * peak), rel=1e-12
    )
    assert 0 < report["mfu"] <= 1
    if p["schedule"] != "interleaved":  # the slowest stage runs every microbatch
        assert t >= p["num_microbatches"] * max(s["time_s"] for s in stages) * (1 - 1e-12)
    assert report["solve_time_s"] >= 0
    # the planner's objective is the shared evaluator's iteration time
    assert report["search"]["objective_s"] == pytest.approx(t, rel=1e-12)
    check_memory_adds_up(report)

    # plan.json agrees with report.json and re-evaluates to the same iteration time
    for key in ("tp", "pp", "dp", "cp", "ep", "microbatch_size", "num_microbatches", "zero_stage"):
        assert plan_json[key] == p[key], key
    assert [s["layers"] for s in plan_json["stages"]] == [s["layers"] for s in stages]
    assert [s["recompute"] for s in plan_json["stages"]] == [s["recompute"] for s in stages]
    used = {
        d for s in plan_json["stages"][: p["pp"]] for rep in s["devices"] for r in rep for d in r
    }
    assert len(used) == report["devices_used"]
    assert all(0 <= d < n_devices for d in used)
    plan = plan_from_dict(plan_json)
    assert evaluate(problem, plan).iteration_time_s == pytest.approx(t, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# The default run and the main command
# ------------------------------------------------------------------------------------------------


def test_default_run_writes_report_plan_and_summary(tmp_path):
    cfg, result, report, plan, lines = run_case(tmp_path)
    assert (tmp_path / "report.json").is_file()
    assert (tmp_path / "plan.json").is_file()
    assert (tmp_path / "summary.txt").is_file()
    assert report == json.loads(json.dumps(result, default=str))
    assert report["solver"] == "megatron"
    assert report["status"] == "feasible" and report["feasible"] is True
    assert report["violation"] is None
    check_report_facts(cfg, report, plan)
    # the echoed summary has the degrees line with the written degrees
    p = report["plan"]
    degrees = f"degrees tp={p['tp']} cp={p['cp']} ep={p['ep']} dp={p['dp']} pp={p['pp']}"
    assert any(line.startswith(degrees) for line in "\n".join(lines).splitlines())
    assert (tmp_path / "summary.txt").read_text().strip() == lines[0].strip()


def test_readme_main_command_subprocess(tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [
            sys.executable,
            str(RUN_PY),
            "solver=megatron",
            "cluster=dgx_8x8",
            "model=llama2_7b",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    match = re.search(r"^degrees tp=(\d+) cp=(\d+) ep=(\d+) dp=(\d+) pp=(\d+)", proc.stdout, re.M)
    assert match, proc.stdout
    report = json.loads((run_dir / "report.json").read_text())
    assert (run_dir / "plan.json").is_file()
    p = report["plan"]
    assert tuple(int(g) for g in match.groups()) == (p["tp"], p["cp"], p["ep"], p["dp"], p["pp"])
    assert p["tp"] == 8  # Megatron rule 1: tensor parallelism as wide as the node (8 GPUs)
    assert report["devices_used"] == 64 and report["feasible"] is True


def test_print_summary_false_is_quiet_but_writes_files(tmp_path):
    _, result, report, plan, lines = run_case(tmp_path, "model=tiny", "print_summary=false")
    assert lines == []
    assert report["status"] == "feasible" and plan is not None
    assert (tmp_path / "summary.txt").is_file()


# ------------------------------------------------------------------------------------------------
# Overrides
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, devices",
    [
        (["cluster.devices=128"], 128),
        (["cluster=tpu_v4", "cluster.devices=128"], 128),
        (["cluster=dgx_h100_superpod", "cluster.devices=512", "model=tiny"], 512),
        (["cluster.levels.1.fanout=2", "cluster.devices=null"], 16),
    ],
)
def test_cluster_size_override(tmp_path, overrides, devices):
    cfg, _, report, plan, _ = run_case(tmp_path, *overrides)
    assert build_problem(cfg).cluster.num_devices == devices
    assert report["devices_used"] + report["devices_idle"] == devices
    assert report["devices_used"] == devices  # megatron gives the remaining devices to dp
    check_report_facts(cfg, report, plan)


def test_cluster_devices_override_changes_the_plan(tmp_path):
    _, _, small, _, _ = run_case(tmp_path / "a")
    _, _, big, _, _ = run_case(tmp_path / "b", "cluster.devices=128")
    assert (small["devices_used"], big["devices_used"]) == (64, 128)
    assert big["plan"]["dp"] == 2 * small["plan"]["dp"]


def test_training_and_model_overrides(tmp_path):
    cfg, _, report, plan, _ = run_case(
        tmp_path, "model=tiny", "training.global_batch=512", "model.layers=8"
    )
    assert cfg.model.layers == 8 and cfg.training.global_batch == 512
    p = report["plan"]
    assert p["num_microbatches"] * p["microbatch_size"] * p["dp"] == 512
    assert p["stages"][-1]["layers"][1] == 9  # embedding + 8 blocks + head
    check_report_facts(cfg, report, plan)


def test_microbatch_sizes_override(tmp_path):
    cfg, _, report, plan, _ = run_case(tmp_path, "model=tiny", "training.microbatch_sizes=[2]")
    assert report["plan"]["microbatch_size"] == 2
    check_report_facts(cfg, report, plan)


def test_megatron_max_tp_override(tmp_path):
    cfg, _, report, plan, _ = run_case(tmp_path, "solver.max_tp=2")
    assert report["plan"]["tp"] == 2
    check_report_facts(cfg, report, plan)


def test_fixed_solver_degrees_are_exact(tmp_path):
    cfg, _, report, plan, _ = run_case(
        tmp_path, "solver=fixed", "solver.tp=2", "solver.pp=2", "solver.microbatch_size=1"
    )
    p = report["plan"]
    assert report["solver"] == "fixed"
    assert (p["tp"], p["pp"], p["cp"], p["ep"], p["dp"]) == (2, 2, 1, 1, 16)  # dp = 64 / (2*2)
    assert p["microbatch_size"] == 1 and p["num_microbatches"] == 1024 // 16
    assert p["zero_stage"] == 0 and p["schedule"] == "1f1b"
    check_report_facts(cfg, report, plan)


def test_fixed_solver_explicit_dp_leaves_devices_idle(tmp_path):
    cfg, _, report, plan, _ = run_case(
        tmp_path, "model=tiny", "solver=fixed", "solver.tp=2", "solver.dp=4", "solver.zero_stage=1"
    )
    p = report["plan"]
    assert (p["tp"], p["dp"], p["pp"], p["zero_stage"]) == (2, 4, 1, 1)
    assert (report["devices_used"], report["devices_idle"]) == (8, 56)
    check_report_facts(cfg, report, plan)


@pytest.mark.parametrize(
    "partition, layers",
    [
        ("[20,12]", [[0, 20], [21, 33]]),  # counts blocks: embedding joins stage 0, head the last
        ("[10,24]", [[0, 9], [10, 33]]),  # counts all 34 chain layers
    ],
)
def test_fixed_layer_partition_and_per_stage_recompute(tmp_path, partition, layers):
    cfg, _, report, plan, _ = run_case(
        tmp_path,
        "solver=fixed",
        "solver.pp=2",
        f"solver.layer_partition={partition}",
        "solver.recompute=[full,none]",
    )
    assert [s["layers"] for s in report["plan"]["stages"]] == layers
    assert [s["layers"] for s in plan["stages"]] == layers
    assert [s["recompute"] for s in report["plan"]["stages"]] == ["full", "none"]
    assert [s["recompute"] for s in plan["stages"]] == ["full", "none"]
    check_report_facts(cfg, report, plan)


def test_fixed_interleaved_schedule(tmp_path):
    cfg, _, report, plan, _ = run_case(
        tmp_path,
        "model=tiny",
        "solver=fixed",
        "solver.pp=2",
        "solver.schedule=interleaved",
        "solver.virtual_stages=2",
    )
    p = report["plan"]
    assert p["schedule"] == "interleaved" and p["virtual_stages"] == 2
    assert [s["pp_rank"] for s in p["stages"]] == [0, 1, 0, 1]
    check_report_facts(cfg, report, plan)


def test_fixed_moe_expert_parallelism(tmp_path):
    cfg, _, report, plan, _ = run_case(tmp_path, "model=tiny_moe", "solver=fixed", "solver.ep=4")
    assert report["plan"]["ep"] == 4
    check_report_facts(cfg, report, plan)


# ------------------------------------------------------------------------------------------------
# Every cluster preset x every model preset (smoke loop)
# ------------------------------------------------------------------------------------------------


def test_preset_lists_are_found():
    assert set(MODEL_PRESETS) >= REQUIRED_MODELS
    assert set(CLUSTER_PRESETS) >= REQUIRED_CLUSTERS
    assert set(CORE_CLUSTERS) <= set(CLUSTER_PRESETS) and set(CORE_MODELS) <= set(MODEL_PRESETS)
    covered_models = {m for _, m in PRESET_PAIRS}
    covered_clusters = {c for c, _ in PRESET_PAIRS}
    assert covered_models == set(MODEL_PRESETS) and covered_clusters == set(CLUSTER_PRESETS)


@pytest.mark.parametrize("cluster,model", PRESET_PAIRS)
def test_every_preset_pair_fixed_small_plan(tmp_path, cluster, model):
    """tp=pp=1, dp=8, microbatch 1: valid on every preset; big models may not fit (fine)."""
    cfg, _, report, plan, _ = run_case(
        tmp_path,
        *FIXED_SMALL,
        f"cluster={cluster}",
        *CLUSTER_INPUTS.get(cluster, []),
        f"model={model}",
    )
    assert report["status"] in ("feasible", "infeasible")
    assert plan is not None
    p = report["plan"]
    assert (p["tp"], p["pp"], p["dp"], report["devices_used"]) == (1, 1, 8, 8)
    check_report_facts(cfg, report, plan)


@pytest.mark.parametrize("cluster,model", PRESET_PAIRS)
def test_every_preset_pair_megatron(tmp_path, cluster, model):
    """Megatron either plans (and the report holds) or says in one line why not."""
    cfg, result, report, plan, lines = run_case(
        tmp_path, f"cluster={cluster}", *CLUSTER_INPUTS.get(cluster, []), f"model={model}"
    )
    assert result["status"] in ("feasible", "infeasible"), result.get("error")
    if result["status"] == "infeasible" and plan is None:
        assert "\n" not in result["error"] and result["error"]
        assert lines == [f"infeasible: {result['error']}"]
        assert result["min_memory_bytes"] > 0
    else:
        check_report_facts(cfg, report, plan)


# ------------------------------------------------------------------------------------------------
# API freeze
# ------------------------------------------------------------------------------------------------


def test_config_groups_and_solver_names_are_frozen():
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        groups = set(loader.list_groups("")) - {"hydra"}
        options = {g: set(loader.get_group_options(g)) for g in CONFIG_GROUPS}
    assert groups == CONFIG_GROUPS
    # Hydra offers exactly the planner files (no schema-only or stray option)
    assert options["solver"] == SOLVERS
    assert {"nest", "megatron", "phaze", "mcmc", "alpa", "fixed", "brute", "cpsat"} <= SOLVERS
    assert options["model"] >= REQUIRED_MODELS
    assert options["cluster"] >= REQUIRED_CLUSTERS
    assert "default" in options["training"]


def test_default_config_is_frozen():
    cfg = compose()
    assert {"solver", "cluster", "model", "training", "seed", "print_summary"} <= set(cfg)
    # issue 16: robust=true and its settings (docs/plan/top-k-robust.md)
    assert cfg.robust is False
    assert {"samples", "seed", "confidence", "negligible_regret", "ranges"} == set(cfg.robustness)
    assert (cfg.solver.name, cfg.cluster.name, cfg.model.name) == (
        "megatron",
        "dgx_8x8",
        "llama2_7b",
    )
    assert cfg.training.global_batch == 1024
    assert {"name", "peak_tflops", "hbm_bw_gbps"} <= set(cfg.cluster.device)


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_every_solver_instantiates_a_planner(solver):
    cfg = compose(f"solver={solver}")
    assert cfg.solver.name == solver
    planner = build_planner(cfg.solver)  # the CLI's checked path: every shipped solver passes it
    assert isinstance(planner, Planner)
    assert planner.name == solver


def test_ranking_planners_take_top_k():
    """solver.top_k (issue 16) is a knob of the planners that can rank, 1 by default."""
    for solver in ("nest", "brute"):
        assert compose(f"solver={solver}").solver.top_k == 1


def test_fixed_solver_knobs_are_frozen():
    cfg = compose("solver=fixed")
    assert {
        "tp",
        "pp",
        "dp",
        "cp",
        "ep",
        "microbatch_size",
        "recompute",
        "zero_stage",
        "schedule",
        "virtual_stages",
        "layer_partition",
        "rank_order",
    } <= set(cfg.solver)


def test_an_exact_solver_timeout_is_a_row_not_a_traceback(tmp_path):
    """``solver=cpsat`` with a limit too short for any plan (no DP to fall back on): the run
    writes status ``timeout`` with a one-line reason naming the knob, and no plan."""
    _, result, report, plan, lines = run_case(
        tmp_path,
        "solver=cpsat",
        "model=tiny",
        "cluster=dgx_8x8",
        "solver.hint=false",
        "solver.prune=false",
        "solver.time_limit_s=0.000001",
    )
    assert result["status"] == report["status"] == "timeout" and plan is None
    assert "solver.time_limit_s" in report["error"]
    assert any(line.startswith("timeout: ") for line in lines)


def test_exact_solver_general_mode_from_the_command_line(tmp_path):
    """``solver=milp solver.mode=general`` returns an explicit placement (no rank order)."""
    _, result, report, plan, _ = run_case(
        tmp_path,
        "solver=milp",
        "solver.mode=general",
        "model=tiny",
        "cluster=dgx_8x8",
        "cluster.devices=4",
        "cluster.levels.0.fanout=4",
        "cluster.levels.1.fanout=1",
    )
    assert report["status"] == "optimal" and plan["rank_order"] is None


# ------------------------------------------------------------------------------------------------
# A solver config names a planner class, never any other callable
# ------------------------------------------------------------------------------------------------


def _solver_dir(tmp_path: Path, name: str, text: str) -> Path:
    """A config directory with ``solver/<name>.yaml``, to put on Hydra's search path."""
    conf = tmp_path / "extra_conf"
    (conf / "solver").mkdir(parents=True, exist_ok=True)
    (conf / "solver" / f"{name}.yaml").write_text(text)
    return conf


def test_a_solver_yaml_cannot_call_an_arbitrary_callable(tmp_path):
    """``_target_: shutil.copy`` on the search path: refused before it is called (the file is not
    copied), one-line error naming the target; a nested target is refused the same way."""
    src, dst = tmp_path / "secret.txt", tmp_path / "copied.txt"
    src.write_text("x")
    conf = _solver_dir(tmp_path, "evil", f"_target_: shutil.copy\nsrc: {src}\ndst: {dst}\n")
    _solver_dir(
        tmp_path,
        "nested",
        "_target_: baselines.fixed.FixedPlanner\nname: fixed\n"
        f"extra:\n  _target_: shutil.copy\n  src: {src}\n  dst: {dst}\n",
    )
    search = f"hydra.searchpath=[file://{conf}]"
    _, result, report, plan, lines = run_case(tmp_path / "out1", search, "solver=evil")
    assert not dst.exists()
    assert result["status"] == report["status"] == "error" and plan is None
    assert "solver._target_='shutil.copy' is not a planner class" in result["error"]
    assert lines == [f"error: {result['error']}"]
    _, result, _, _, lines = run_case(tmp_path / "out2", search, "solver=nested")
    assert not dst.exists()
    assert result["status"] == "error" and "solver.extra._target_" in result["error"]


def test_a_planner_class_from_the_users_own_package_still_runs(tmp_path, monkeypatch):
    package = tmp_path / "pkg" / "my_planners"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from baselines.fixed import FixedPlanner\n\n\nclass Mine(FixedPlanner):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    conf = _solver_dir(
        tmp_path, "mine", "_target_: my_planners.Mine\nname: mine\ntp: 1\npp: 1\ndp: 8\n"
    )
    _, result, report, plan, _ = run_case(
        tmp_path / "out", f"hydra.searchpath=[file://{conf}]", "solver=mine", "model=tiny"
    )
    assert result["status"] == "feasible" and report["solver"] == "mine"
    assert (plan["tp"], plan["pp"], plan["dp"]) == (1, 1, 8)
