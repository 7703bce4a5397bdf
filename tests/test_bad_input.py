"""User mistakes never give a traceback: each gets one line that names the value and the fix.

In-process cases call ``nest.app.cli.run`` with a list as the ``echo`` collector; a few run
``python run.py`` in a subprocess to check the exit code and that no traceback is printed. All
outputs go to ``tmp_path``. The corpus at the end holds bad input by kind (each kind is refused
at the one place that reads it), generated over every planner in ``conf/solver/`` where the kind
concerns planners.
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
import yaml
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import get_class, instantiate

import baselines.brute
import nest.app.cli
from baselines.brute import BrutePlanner, one_f_one_b_plans, partitions, plans_to_score
from nest.app.config import LIMITS, build_cluster, build_device, build_problem
from nest.core.errors import Infeasible, UserError
from nest.core.model import ModelSpec
from nest.core.units import GiB
from nest.cost import evaluate
from nest.planner import check_memory_floor, model_state_lower_bound_bytes

from .conftest import make_cluster, make_device, make_problem, make_spec
from .randomcase import random_case

CONF_DIR = nest.app.cli.CONF_DIR
RUN_PY = Path(CONF_DIR).parent / "run.py"
FIXED = ["solver=fixed"]


def compose(*overrides: str):
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra.compose(config_name="config", overrides=list(overrides))


def run_case(tmp_path: Path, *overrides: str) -> tuple[dict, list[str]]:
    lines: list[str] = []
    result = nest.app.cli.run(compose(*overrides), tmp_path, echo=lines.append)
    return result, lines


def assert_one_line(message) -> None:
    assert isinstance(message, str) and message.strip(), message
    assert "\n" not in message, message
    assert "Traceback" not in message


def run_py(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [sys.executable, str(RUN_PY), *overrides, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, run_dir


# ------------------------------------------------------------------------------------------------
# In-process: every mistake is a one-line "error: ..." naming the value
# ------------------------------------------------------------------------------------------------

USER_ERRORS = [
    # fan-outs and device counts
    (
        "devices-not-multiple-of-node",
        ["cluster.devices=60"],
        ["cluster.devices=60", "multiple of 8"],
    ),
    (
        "fanouts-contradict-devices",
        ["cluster.levels.1.fanout=4"],
        ["[8, 4]", "32", "cluster.devices=64"],
    ),
    ("inner-fanout-null", ["cluster.levels.0.fanout=null"], ["level 0", "null"]),
    ("fanout-zero", ["cluster.levels.0.fanout=0"], ["fanout=0"]),
    ("no-levels", ["cluster.levels=[]"], ["cluster.levels"]),
    ("devices-zero", ["cluster.devices=0"], ["cluster.devices=0", "positive"]),
    ("devices-negative", ["cluster.devices=-8"], ["cluster.devices=-8"]),
    ("top-null-without-devices", ["cluster.devices=null"], ["cluster.devices"]),
    # non-positive sizes
    ("hidden-zero", ["model.hidden=0"], ["hidden=0", "positive"]),
    ("layers-zero", ["model.layers=0"], ["layers=0"]),
    ("vocab-zero", ["model.vocab=0"], ["vocab=0"]),
    ("seq-len-zero", ["model=tiny", "model.seq_len=0"], ["seq_len=0"]),
    ("bw-negative", ["cluster.levels.0.bw_gbps=-1"], ["nvlink", "> 0"]),
    ("bw-zero", ["cluster.levels.1.bw_gbps=0"], ["ib", "> 0"]),
    ("latency-negative", ["cluster.levels.1.latency_us=-1"], ["ib", ">= 0"]),
    (
        "oversubscription-below-1",
        ["cluster.levels.0.oversubscription=0.5"],
        ["oversubscription=0.5"],
    ),
    ("peak-zero", ["cluster.device.peak_tflops=0"], ["h100_sxm", "> 0"]),
    ("hbm-zero", ["cluster.device.hbm_gb=0"], ["h100_sxm", "> 0"]),
    ("matmul-efficiency-zero", ["cluster.device.matmul_efficiency=0"], ["matmul_efficiency=0"]),
    ("hbm-both-units", ["cluster.device.hbm_gib=80"], ["hbm_gb", "hbm_gib", "exactly one"]),
    ("hbm-no-unit", ["cluster.device.hbm_gb=null"], ["hbm_gb", "hbm_gib", "exactly one"]),
    ("global-batch-zero", ["training.global_batch=0"], ["global_batch=0"]),
    ("microbatch-zero", ["training.microbatch_sizes=[0]"], ["microbatch_sizes=[0]"]),
    ("microbatch-empty", ["training.microbatch_sizes=[]"], ["microbatch_sizes=[]"]),
    # model shape
    ("heads-not-dividing-hidden", ["model.heads=7"], ["hidden=4096", "heads=7"]),
    ("kv-heads-not-dividing-heads", ["model.kv_heads=5"], ["kv_heads=5", "heads=32"]),
    ("activation", ["model.activation=relu"], ["relu", "gelu", "swiglu"]),
    ("experts-zero", ["model.num_experts=0"], ["num_experts=0"]),
    # training
    (
        "global-batch-not-divisible-by-microbatch",
        ["training.global_batch=1000", "training.microbatch_sizes=[3]"],
        ["global_batch=1000", "3"],
    ),
    ("optimizer", ["training.optimizer=lamb"], ["lamb", "adam", "sgd"]),
    ("grad-bytes", ["training.grad_bytes=3"], ["grad_bytes=3"]),
    # degrees that do not divide (fixed solver)
    (
        "tp-not-dividing-heads",
        [*FIXED, "model=tiny", "solver.tp=3", "solver.dp=1"],
        ["tp=3", "heads=8"],
    ),
    (
        "tp-not-dividing-heads-batch-ok",
        [*FIXED, "model=tiny", "solver.tp=3", "training.global_batch=1008"],
        ["tp=3", "heads=8"],
    ),
    (
        "cp-not-dividing-seq",
        [*FIXED, "model=tiny", "solver.cp=3", "solver.dp=1"],
        ["cp=3", "seq_len=256"],
    ),
    ("ep-on-dense-model", [*FIXED, "model=tiny", "solver.ep=2"], ["ep=2", "no experts", "ep=1"]),
    (
        "ep-not-dividing-experts",
        [*FIXED, "model=tiny_moe", "solver.ep=8"],
        ["ep=8", "num_experts=4"],
    ),
    (
        "ep-not-dividing-dp",
        [*FIXED, "model=tiny_moe", "solver.ep=4", "solver.dp=2"],
        ["ep=4", "dp*cp = 2"],
    ),
    (
        "fixed-microbatch-not-dividing-batch",
        [*FIXED, "solver.microbatch_size=3"],
        ["global_batch=1024", "microbatch_size(3)"],
    ),
    ("degrees-exceed-devices", [*FIXED, "solver.tp=128"], ["128", "64 devices"]),
    ("dp-exceeds-devices", [*FIXED, "model=tiny", "solver.dp=128"], ["128", "has 64"]),
    ("pp-zero", [*FIXED, "solver.pp=0"], ["solver.pp=0", "positive"]),
    ("tp-not-integer", [*FIXED, "solver.tp=2.5"], ["solver.tp=2.5"]),
    (
        "pp-more-than-blocks",
        [*FIXED, "model=tiny", "solver.pp=8", "solver.dp=1"],
        ["8 pipeline chunks", "4 transformer blocks"],
    ),
    ("partition-length", [*FIXED, "solver.layer_partition=[1,2]"], ["2 entries", "= 1"]),
    (
        "partition-sum",
        [*FIXED, "solver.pp=2", "solver.layer_partition=[1,2]"],
        ["sums to 3", "32", "34"],
    ),
    (
        "partition-empty-stage",
        [*FIXED, "solver.pp=2", "solver.layer_partition=[0,34]"],
        ["empty stage 0"],
    ),
    (
        "recompute-count",
        [*FIXED, "solver.pp=2", "solver.recompute=[full,none,none]"],
        ["3 entries", "(2)"],
    ),
    ("recompute-name", [*FIXED, "solver.recompute=bogus"], ["bogus", "selective"]),
    ("schedule-name", [*FIXED, "solver.schedule=bogus"], ["bogus", "1f1b"]),
    (
        "virtual-stages-without-interleaved",
        [*FIXED, "solver.virtual_stages=2"],
        ["virtual_stages=2", "interleaved"],
    ),
    (
        "interleaved-without-virtual",
        [*FIXED, "solver.schedule=interleaved", "solver.pp=2"],
        ["interleaved", "virtual_stages"],
    ),
    ("zero-stage", [*FIXED, "solver.zero_stage=5"], ["zero_stage=5"]),
    ("rank-order-axis", [*FIXED, "solver.rank_order=[tp,xx]"], ["'xx'", "permutation"]),
    ("rank-order-twice", [*FIXED, "solver.rank_order=[tp,tp]"], ["'tp' twice"]),
    ("megatron-zero-stage", ["solver.zero_stage=7"], ["zero_stage=7"]),
    (
        "zero3-prefetch-params",
        [*FIXED, "training.zero3_prefetch_params=0.5"],
        ["zero3_prefetch_params=0.5", "null"],
    ),
]


@pytest.mark.parametrize(
    "overrides, expected", [pytest.param(o, e, id=i) for i, o, e in USER_ERRORS]
)
def test_user_mistake_is_one_line_error(tmp_path, overrides, expected):
    result, lines = run_case(tmp_path, *overrides)
    assert result["status"] == "error", result
    assert result["feasible"] is False
    message = result["error"]
    assert_one_line(message)
    for text in expected:
        assert text in message, (text, message)
    assert lines == [f"error: {message}"]
    assert json.loads((tmp_path / "report.json").read_text()) == result
    assert not (tmp_path / "plan.json").exists()


# Messages must name the value the user typed, in the units the user typed it.
MESSAGE_BUGS = [
    pytest.param(
        [*FIXED, "model=tiny", "solver.tp=3"],
        "tp=3",
        id="tp3-masked-by-derived-dp",
    ),
    *[
        pytest.param(
            [override],
            key,
            id=f"{key}-named-in-user-units",
        )
        for override, key in [
            ("cluster.levels.0.bw_gbps=-1", "bw_gbps=-1"),
            ("cluster.levels.1.latency_us=-1", "latency_us=-1"),
            ("cluster.device.peak_tflops=0", "peak_tflops=0"),
            ("cluster.device.hbm_gb=0", "hbm_gb=0"),
            ("cluster.device.memory_reserve_gib=100", "memory_reserve_gib=100"),
        ]
    ],
    pytest.param(
        [*FIXED, "solver.dp=0"],
        "solver.dp=0",
        id="dp-zero-wrong-message",
    ),
]


@pytest.mark.parametrize("overrides, named", MESSAGE_BUGS)
def test_message_names_the_value_the_user_typed(tmp_path, overrides, named):
    result, lines = run_case(tmp_path, *overrides)
    assert result["status"] == "error"
    assert_one_line(result["error"])
    assert named in result["error"], result["error"]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(
            [*FIXED, "solver.microbatch_size=0"],
            id="fixed-microbatch-zero",
        ),
        pytest.param(
            ["solver.max_tp=0"],
            id="megatron-max-tp-zero",
        ),
        pytest.param(
            ["solver.max_tp=-1"],
            id="megatron-max-tp-negative",
        ),
    ],
)
def test_non_positive_solver_knob_is_rejected(tmp_path, overrides):
    result, _ = run_case(tmp_path, *overrides)
    assert result["status"] == "error", result.get("plan")
    assert_one_line(result["error"])


# ------------------------------------------------------------------------------------------------
# build_cluster / build_device on plain dicts
# ------------------------------------------------------------------------------------------------

DEVICE = {"name": "dev", "peak_tflops": 100, "hbm_gb": 80, "hbm_bw_gbps": 2000}


def cluster_dict(fanouts, devices=None, **level_over):
    return {
        "name": "c",
        "devices": devices,
        "device": dict(DEVICE),
        "levels": [
            {"name": f"l{i}", "fanout": f, "bw_gbps": 100, "latency_us": 1, **level_over}
            for i, f in enumerate(fanouts)
        ],
    }


@pytest.mark.parametrize(
    "fanouts, devices, expected",
    [
        ([8, 8], 60, ["[8, 8]", "64", "cluster.devices=60"]),
        ([8, 8], 128, ["[8, 8]", "64", "cluster.devices=128"]),
        ([4, 2, 2], 8, ["[4, 2, 2]", "16", "cluster.devices=8"]),
        ([8, None], 60, ["cluster.devices=60", "multiple of 8"]),
        ([8, None], None, ["cluster.devices"]),
        ([None, 8], 64, ["level 0"]),
        ([8, 0], None, ["fanout=0"]),
        ([8, 2.0], None, ["fanout=2.0"]),
        ([8, None], 0, ["cluster.devices=0"]),
        ([8] * 9, None, ["9 levels"]),
    ],
)
def test_build_cluster_rejects_inconsistent_fanouts(fanouts, devices, expected):
    with pytest.raises(UserError) as info:
        build_cluster(cluster_dict(fanouts, devices))
    message = str(info.value)
    assert_one_line(message)
    for text in expected:
        assert text in message, (text, message)


@pytest.mark.parametrize(
    "fanouts, devices, total",
    [([8, 8], 64, 64), ([8, 8], None, 64), ([8, None], 128, 128), ([4, 2, None], 64, 64)],
)
def test_build_cluster_accepts_consistent_fanouts(fanouts, devices, total):
    assert build_cluster(cluster_dict(fanouts, devices)).num_devices == total


@pytest.mark.parametrize(
    "fanouts, devices, placed",
    [
        ([8, 32, None], 64, [8, 8, 1]),  # 8 nodes under one leaf of a SuperPOD
        ([8, 32, None], 8, [8, 1, 1]),  # one node
        ([8, 32, None], 4, [4, 1, 1]),  # half a node
        ([72, 8, None], 144, [72, 2, 1]),  # two NVL72 racks
        ([72, 8, None], 64, [64, 1, 1]),  # 64 GPUs of one rack
        ([8, None], 4, [4, 1]),
        ([8, 4, 8, None], 96, [8, 4, 3, 1]),  # three 32-GPU units of a three-level unit
    ],
)
def test_fewer_devices_than_one_inner_unit_fill_whole_units_bottom_up(fanouts, devices, placed):
    """A job smaller than one unit of the inner levels is placed as a topology-aware scheduler
    places it: whole nodes, then nodes under one leaf; the level where the count runs out is
    partly filled and every level above it has one member (and so costs nothing)."""
    cluster = build_cluster(cluster_dict(fanouts, devices))
    assert [lv.fanout for lv in cluster.levels] == placed
    assert cluster.num_devices == devices


def test_every_count_below_one_unit_is_placed_or_refused_in_one_line():
    """Every count below one leaf of [8, 32] nodes either keeps its devices exactly, with each
    level no wider than the preset's, or is one line naming the value (12 GPUs: 1.5 nodes)."""
    refused = 0
    for devices in range(1, 256):
        try:
            cluster = build_cluster(cluster_dict([8, 32, None], devices))
        except UserError as error:
            refused += 1
            assert_one_line(str(error))
            assert f"cluster.devices={devices}" in str(error) and "multiple of 8" in str(error)
            assert devices > 8 and devices % 8
            continue
        assert cluster.num_devices == devices
        widths = [lv.fanout for lv in cluster.levels]
        assert widths[0] <= 8 and widths[1] <= 32 and widths[2] == 1
    assert refused == 255 - 8 - 30  # 1-8 GPUs in one node, 2-31 whole nodes under one leaf


@pytest.mark.parametrize("devices, unit", [(40, 32), (12, 8), (100, 8), (72, 32)])
def test_a_count_below_a_three_level_unit_is_refused_naming_the_whole_unit_it_misses(devices, unit):
    """Inner levels [8, 4, 8]: 40 GPUs fill 5 nodes, which are not whole 4-node level-1 units;
    the error names the unit in devices (32), not the level's fan-out (4)."""
    with pytest.raises(UserError) as info:
        build_cluster(cluster_dict([8, 4, 8, None], devices))
    message = str(info.value)
    assert_one_line(message)
    assert f"cluster.devices={devices}" in message and f"not a multiple of {unit}" in message


def test_build_cluster_rejects_negative_bandwidth():
    with pytest.raises(UserError) as info:
        build_cluster(cluster_dict([8, None], 64, bw_gbps=-1))
    assert_one_line(str(info.value))
    assert "l0" in str(info.value)


def test_build_device_needs_exactly_one_hbm_unit():
    with pytest.raises(UserError, match="exactly one of hbm_gb or hbm_gib"):
        build_device({**DEVICE, "hbm_gib": 80})
    without = {k: v for k, v in DEVICE.items() if k != "hbm_gb"}
    with pytest.raises(UserError, match="exactly one of hbm_gb or hbm_gib"):
        build_device(without)


# ------------------------------------------------------------------------------------------------
# Models that cannot fit
# ------------------------------------------------------------------------------------------------

NEED_HAVE = re.compile(r"needs ([\d.]+) GiB per device, the device has ([\d.]+) GiB")


def test_megatron_raises_infeasible_with_gib_needed_and_available():
    cfg = compose("model=gpt3_175b", "cluster.devices=8")
    problem = build_problem(cfg)
    planner = instantiate(cfg.solver, _convert_="all")
    with pytest.raises(Infeasible) as info:
        planner.solve(problem)
    exc = info.value
    assert_one_line(exc.reason)
    assert str(exc) == exc.reason
    match = NEED_HAVE.search(exc.reason)
    assert match, exc.reason
    need, have = (float(g) for g in match.groups())
    hbm = problem.cluster.device.hbm_bytes
    assert have == pytest.approx(hbm / GiB, abs=0.05)
    assert need > have
    assert exc.min_memory_bytes is not None and exc.min_memory_bytes > hbm
    assert need == pytest.approx(exc.min_memory_bytes / GiB, abs=0.05)
    assert "gpt3_175b" in exc.reason and "cluster.devices" in exc.reason  # names the fix


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=gpt3_175b", "cluster.devices=8"],
        ["model=llama3_405b"],
        ["model=llama3_405b", "cluster=tpu_v4"],
    ],
)
def test_model_that_cannot_fit_reports_infeasible(tmp_path, overrides):
    result, lines = run_case(tmp_path, *overrides)
    assert result["status"] == "infeasible" and result["feasible"] is False
    assert_one_line(result["error"])
    assert NEED_HAVE.search(result["error"]), result["error"]
    hbm = build_problem(compose(*overrides)).cluster.device.hbm_bytes
    assert result["min_memory_bytes"] > hbm
    assert lines == [f"infeasible: {result['error']}"]
    written = json.loads((tmp_path / "report.json").read_text())
    assert (
        written["status"] == "infeasible"
        and written["min_memory_bytes"] == result["min_memory_bytes"]
    )
    assert not (tmp_path / "plan.json").exists()


def test_fixed_plan_that_does_not_fit_is_scored_and_flagged(tmp_path):
    result, lines = run_case(tmp_path, *FIXED, "model=gpt3_175b", "cluster.devices=8")
    assert result["status"] == "infeasible" and result["feasible"] is False
    violation = result["violation"]
    assert_one_line(violation)
    assert violation.startswith("out of memory") and "GiB" in violation
    assert (
        result["peak_memory_bytes"]
        > build_problem(compose("cluster.devices=8")).cluster.device.hbm_bytes
    )
    assert (tmp_path / "plan.json").is_file()


def test_megatron_leaves_devices_idle_when_the_batch_does_not_divide(tmp_path):
    """dgx_a100 has 1120 GPUs; dp = 1120 / tp never divides global_batch=1024, so the rules take
    the largest dp that divides the batch and leave the rest idle (the NEST paper allows idle
    devices, docs/nest_paper.md §1)."""
    result, _ = run_case(tmp_path, "cluster=dgx_a100", "model=llama2_7b")
    assert result["status"] == "feasible", result.get("error")
    assert 1024 % result["plan"]["dp"] == 0
    assert result["devices_idle"] == 1120 - result["devices_used"] > 0


# ------------------------------------------------------------------------------------------------
# Hydra-level mistakes (composition) and the process exit
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, listed",
    [
        ("model=nonexistent", "llama2_7b"),
        ("cluster=nonexistent", "dgx_8x8"),
        ("solver=nonexistent", "megatron"),
    ],
)
def test_unknown_preset_lists_the_options(override, listed):
    with pytest.raises(MissingConfigException) as info:
        compose(override)
    assert "nonexistent" in str(info.value) and listed in str(info.value)


@pytest.mark.parametrize("override", ["model.hiden=3", "model.hidden=abc", "cluster.devices=64.5"])
def test_unknown_key_or_wrong_type_is_rejected_by_the_schema(override):
    with pytest.raises(ConfigCompositionException) as info:
        compose(override)
    assert override.split("=")[0] in str(info.value)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single ``error: ...`` line a refused run prints (exit status 2, no traceback)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    return lines[0]


def test_subprocess_unknown_preset(tmp_path):
    line = one_error_line(run_py(tmp_path, "model=nonexistent")[0])
    assert "nonexistent" in line and "Available options" in line
    for preset in ("bert_large", "gpt3_175b", "llama2_7b", "tiny"):
        assert preset in line
    assert "model_schema" not in line and "search path" not in line  # not presets


def test_subprocess_unknown_key(tmp_path):
    assert "hiden" in one_error_line(run_py(tmp_path, "model.hiden=3")[0])


def test_subprocess_user_error_exits_2_with_one_line(tmp_path):
    proc, run_dir = run_py(tmp_path, "cluster.devices=60")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "60" in errors[0], out
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "error" and "60" in report["error"]


def test_subprocess_infeasible_exits_1_with_one_line(tmp_path):
    proc, run_dir = run_py(tmp_path, "model=gpt3_175b", "cluster.devices=8")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("infeasible: ") and "GiB" in lines[0], out
    assert json.loads((run_dir / "report.json").read_text())["status"] == "infeasible"


# ================================================================================================
# Corpus of bad input by kind. Each kind is refused at the one place that reads it:
#   non-finite numbers and huge integers, empty solver lists, unknown keys:
#     nest.app.config.check_config
#     (the composed config), numbers of a preset: nest.app.config._number;
#   a planner's own setting: its constructor, unwrapped from Hydra's "Error in call to target";
#   a layer partition: nest.core.build.chunk_layer_counts, with the values as typed;
#   sizes beyond the documented limits: nest.app.config (LIMITS), before anything is built;
#   a model no plan can fit: nest.planner.check_memory_floor, before any search;
#   a malformed YAML file: nest.app.cli.hydra_error_line (python run.py: one line, exit status 2).
# Every case asserts the exit status, one line with no traceback, and the value named.
# ================================================================================================

SOLVER_DIR = Path(CONF_DIR) / "solver"
SOLVERS = sorted(p.stem for p in SOLVER_DIR.glob("*.yaml"))


def solver_preset(name: str) -> dict:
    """A solver preset's own keys (``paper_*`` add theirs to ``paper_table``'s)."""
    data = yaml.safe_load((SOLVER_DIR / f"{name}.yaml").read_text())
    for parent in data.pop("defaults", []):
        if parent != "_self_":
            data = {**solver_preset(parent), **data}
    return data


def planner_class(name: str) -> type:
    return get_class(solver_preset(name)["_target_"])


SEARCHING = [s for s in SOLVERS if not getattr(planner_class(s), "scores_given_plan", False)]
GIVEN_PLAN = [s for s in SOLVERS if s not in SEARCHING]

NON_FINITE = [
    *(
        ["cluster.device." + key]
        for key in ("peak_tflops", "hbm_gb", "hbm_bw_gbps", "matmul_efficiency")
    ),
    ["cluster.device.memory_reserve_gib"],
    ["cluster.levels.0.bw_gbps"],
    ["cluster.levels.1.latency_us"],
    ["cluster.levels.1.oversubscription"],
    ["solver=mcmc", "solver.temperature"],
    ["solver=mcmc", "solver.max_seconds"],
    ["solver=mcmc", "solver.flat_bw_gbps"],
    ["solver=phaze", "solver.flat_latency_us"],
    ["solver=alpa", "solver.t_max_gap_s"],
    ["solver=cpsat", "solver.time_limit_s"],
    ["solver=milp", "solver.deterministic_time"],
]


def _non_finite_cases():
    for i, (*groups, key) in enumerate(NON_FINITE):
        value = ("nan", "inf", "-inf")[i % 3]
        yield pytest.param(
            "non-finite", [*groups, f"{key}={value}"], f"{key}={value}", id=f"{key}={value}"
        )


def _empty_list_cases():
    for solver in SOLVERS:
        for key, value in solver_preset(solver).items():
            if isinstance(value, list):
                yield pytest.param(
                    "empty-list",
                    [f"solver={solver}", f"solver.{key}=[]"],
                    f"solver.{key}=[]",
                    id=f"{solver}.{key}=[]",
                )
    for solver, key in [("nest", "tp"), ("nest", "rank_orders"), ("brute", "virtual_stages")]:
        yield pytest.param(
            "empty-list",
            [f"solver={solver}", f"solver.{key}=[]"],
            f"solver.{key}=[]",
            id=f"{solver}.{key}=[]",
        )
    yield pytest.param(
        "empty-list",
        ["solver=fixed", "solver.recompute=[]"],
        "solver.recompute=[]",
        id="fixed.recompute=[]",
    )


def _unknown_key_cases():
    for override, named in [
        ("+foo=1", "foo=1"),
        ("+model.hiden=3", "model.hidden"),  # did you mean
        ("+cluster.bogus=1", "cluster.bogus=1"),
        ("+cluster.device.hbm_tb=1", "cluster.device.hbm_tb=1"),
        ("+cluster.levels.0.fanot=8", "cluster.levels.0.fanout"),
        ("+training.global_bach=8", "training.global_batch"),
    ]:
        yield pytest.param("unknown-key", [override], named, id=override)
    yield pytest.param(
        "unknown-key", ["model=hf", "+model.foo=1"], "model.foo=1", id="hf+model.foo=1"
    )
    for solver in SOLVERS:
        yield pytest.param(
            "unknown-key",
            [f"solver={solver}", "+solver.bogus_knob=1"],
            "solver.bogus_knob=1",
            id=f"{solver}+solver.bogus_knob",
        )


PLANNER_SETTINGS = [
    (["solver=cpsat", "solver.workers=0"], "solver.workers=0"),
    (["solver=milp", "solver.time_limit_s=0"], "solver.time_limit_s=0"),
    (["solver=cpsat", "solver.mode=bogus"], "solver.mode='bogus'"),
    (["solver=milp", "solver.hint=2"], "solver.hint=2"),
    (["solver=cpsat", "solver.seed=x"], "solver.seed='x'"),
]

PARTITIONS = [
    # blocks (sum 32): the message shows [-1, 33], never the chain counts [0, 34]
    (["solver.pp=2", "solver.layer_partition=[-1,33]"], "[-1, 33]", "[0, 34]"),
    (["solver.pp=2", "solver.layer_partition=[-1,35]"], "[-1, 35]", None),
    (["solver.pp=2", "solver.layer_partition=[16.5,15.5]"], "[16.5, 15.5]", "[16, 15]"),
    # blocks with an empty middle stage: [0, 0, 0, 32] as typed, not [1, 0, 0, 33]
    (
        ["solver.pp=4", "solver.dp=16", "solver.layer_partition=[0,0,0,32]"],
        "[0, 0, 0, 32]",
        "[1, 0, 0, 33]",
    ),
]


def _huge_cases():
    for solver in SOLVERS:
        yield pytest.param(
            "huge",
            [f"solver={solver}", "model.layers=1000000"],
            "model.layers=1000000",
            id=f"{solver}-layers-1e6",
        )
    for overrides, named in [
        (["cluster.devices=1048576"], "cluster.devices=1048576"),
        (["cluster.levels.0.fanout=1048576", "cluster.devices=null"], "cluster.devices"),
        (["training.global_batch=1073741824"], "training.global_batch=1073741824"),
        (["model=tiny_moe", "model.num_experts=100000000"], "model.num_experts=100000000"),
        (["model.hidden=100000000000000000000"], "model.hidden=100000000000000000000"),
    ]:
        yield pytest.param("huge", overrides, named, id=overrides[-1])


def _physical_range_cases():
    """Figures no device has (a unit mistake): refused with the range and its reason."""
    for override, named in [
        ("cluster.device.hbm_gb=1e12", "hbm_gb=1e+12"),
        ("cluster.device.peak_tflops=1e-9", "peak_tflops=1e-09"),
        ("cluster.device.peak_tflops=9.894e14", "peak_tflops=9.894e+14"),  # FLOP/s for TFLOP/s
        ("cluster.device.hbm_bw_gbps=3.35", "hbm_bw_gbps=3.35"),
        ("cluster.levels.0.bw_gbps=4.5e8", "bw_gbps=4.5e+08"),
    ]:
        yield pytest.param("physical-range", [override], named, id=override)


CORPUS = [
    *_physical_range_cases(),
    *_non_finite_cases(),
    *_empty_list_cases(),
    *_unknown_key_cases(),
    *(pytest.param("planner-setting", o, n, id="setting-" + o[-1]) for o, n in PLANNER_SETTINGS),
    *(
        pytest.param("partition", ["solver=fixed", *o], n, id="partition-" + o[-1])
        for o, n, _ in PARTITIONS
    ),
    *_huge_cases(),
    pytest.param("interpolation", ["solver=nest", "solver.tp=${nope}"], "nope", id="interpolation"),
]


@pytest.mark.parametrize("kind, overrides, named", CORPUS)
def test_bad_input_corpus(tmp_path, kind, overrides, named):
    result, lines = run_case(tmp_path, *overrides)
    assert result["status"] == "error", (kind, result)
    assert nest.app.cli.exit_status(result["status"]) == 2
    message = result["error"]
    assert_one_line(message)
    assert named in message, (kind, named, message)
    assert "Error in call to target" not in message and "full_key" not in message
    assert lines == [f"error: {message}"]
    assert json.loads((tmp_path / "report.json").read_text()) == result


@pytest.mark.parametrize(
    "overrides, typed, derived", [pytest.param(o, t, d, id=o[-1]) for o, t, d in PARTITIONS]
)
def test_partition_message_shows_only_the_typed_values(tmp_path, overrides, typed, derived):
    result, _ = run_case(tmp_path, "solver=fixed", *overrides)
    assert typed in result["error"]
    if derived:
        assert derived not in result["error"]


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_limits_are_named_with_the_value_and_the_limit(tmp_path, key):
    """One past each documented limit is refused with the value and the limit; the limit itself
    is not (it reaches the planner, or its own one-line error)."""
    limit = LIMITS[key]
    extra = {
        "model.num_experts": ["model=tiny_moe"],
        "cluster.devices": ["cluster.levels.0.fanout=1"],  # any device count, not 8 per node
    }.get(key, [])
    result, _ = run_case(tmp_path, *extra, f"{key}={limit + 1}")
    assert result["status"] == "error"
    assert f"{key}={limit + 1}" in result["error"] and f"{limit:,}" in result["error"]
    at_limit, _ = run_case(tmp_path, *extra, f"{key}={limit}", "solver=fixed")
    assert "beyond the limit" not in str(at_limit.get("error"))


# ------------------------------------------------------------------------------------------------
# A model no plan can fit: every searching planner says so before searching
# ------------------------------------------------------------------------------------------------

# Llama-2 7B with 256 blocks (the limit) on 8 GPUs: the model states alone need ~98 GiB per
# device, so no plan fits. Without the floor the searches would run on this chain.
TOO_BIG = [f"model.layers={LIMITS['model.layers']}", "cluster.devices=8"]
FLOOR = re.compile(r"any plan needs ([\d.]+) GiB per device, the device has ([\d.]+) GiB")


@pytest.mark.parametrize("solver", SEARCHING)
def test_searching_planner_answers_a_model_that_fits_nowhere_from_the_floor(tmp_path, solver):
    result, lines = run_case(tmp_path, f"solver={solver}", *TOO_BIG)
    assert result["status"] == "infeasible", result
    assert nest.app.cli.exit_status(result["status"]) == 1
    message = result["error"]
    assert_one_line(message)
    assert lines == [f"infeasible: {message}"]
    match = FLOOR.search(message)
    assert match, message
    problem = build_problem(compose(*TOO_BIG))
    floor = model_state_lower_bound_bytes(problem)
    assert result["min_memory_bytes"] == floor > problem.cluster.device.hbm_bytes
    assert float(match.group(1)) == pytest.approx(floor / GiB, abs=0.05)
    assert "did not search" in message and "cluster.devices >= " in message


def test_memory_floor_names_whole_nodes_that_would_lift_it(tmp_path):
    """dgx_8x8 grows by nodes of 8: the device count the message names is the fewest whole
    nodes whose floor fits."""
    result, _ = run_case(tmp_path, *TOO_BIG)
    needed = int(re.search(r"cluster\.devices >= ([\d,]+)", result["error"])[1].replace(",", ""))
    assert needed % 8 == 0

    def floor_fits(devices):
        problem = build_problem(compose(TOO_BIG[0], f"cluster.devices={devices}"))
        return model_state_lower_bound_bytes(problem) <= problem.cluster.device.hbm_bytes

    assert floor_fits(needed) and not floor_fits(needed - 8)


@pytest.mark.parametrize("solver", GIVEN_PLAN)
def test_given_plan_planner_answers_a_model_that_fits_nowhere(tmp_path, solver):
    """fixed and the paper tables score the plan they are given (the floor does not apply):
    fixed reports where the memory goes, the tables have no row for this case."""
    result, _ = run_case(tmp_path, f"solver={solver}", *TOO_BIG)
    assert result["status"] in ("infeasible", "error", "unpublished"), result
    assert_one_line(result.get("error") or result["violation"])
    if solver == "fixed":
        assert result["violation"].startswith("out of memory")


# brute scores up to max_plans plans, each costing a pass over the chain: on a long chain that
# was minutes before its "more than max_plans" error. It now counts its space exactly first.


@pytest.mark.parametrize("n_layers", range(3, 9))
def test_brute_one_f_one_b_count_is_exact(n_layers):
    blocks = set(range(1, n_layers - 1))
    for pp in range(1, n_layers + 1):
        for modes in (1, 2, 3):
            enumerated = sum(
                math.prod(modes if blocks & set(range(i, j + 1)) else 1 for i, j in parts)
                for parts in partitions(n_layers, pp)
            )
            assert one_f_one_b_plans(n_layers, pp, modes) == enumerated, (pp, modes)


def small_brute_problem():
    return make_problem(make_spec(layers=3), make_cluster(fanouts=(2, 2)), global_batch=8)


def test_brute_scores_exactly_the_plans_it_counts():
    problem = small_brute_problem()
    planner = BrutePlanner()
    plan = planner.solve(problem)
    assert plan.n_evaluations == plans_to_score(problem, planner.options(), 10**9)


def test_brute_refuses_a_space_past_max_plans_before_scoring(monkeypatch):
    problem = small_brute_problem()
    total = plans_to_score(problem, BrutePlanner().options(), 10**9)
    assert BrutePlanner(max_plans=total).solve(problem).n_evaluations == total

    def scored(*args):
        raise AssertionError("brute scored a plan of a space it must refuse")

    monkeypatch.setattr(baselines.brute, "evaluate", scored)
    with pytest.raises(UserError) as info:
        BrutePlanner(max_plans=total - 1).solve(problem)
    assert_one_line(str(info.value))
    assert f"max_plans={total - 1}" in str(info.value)


@pytest.mark.parametrize("seed", range(300))
def test_memory_floor_is_below_every_plans_peak(seed):
    """The floor refuses a problem only when no plan fits: no valid plan's peak is below it."""
    problem, planner = random_case(seed)
    try:
        plan = planner.build(problem)
    except UserError:
        return
    peak = evaluate(problem, plan).peak_memory_bytes
    assert peak >= model_state_lower_bound_bytes(problem) * (1 - 1e-12)


def test_memory_floor_names_the_device_count_that_would_lift_it():
    spec = ModelSpec(
        name="m", hidden=4096, layers=32, heads=32, ffn_hidden=11008, vocab=32000, seq_len=4096
    )
    device = make_device(hbm_bytes=16 * GiB)

    def on(devices):
        return make_problem(spec, make_cluster(fanouts=(devices,), device=device))

    with pytest.raises(Infeasible) as info:
        check_memory_floor(on(4), "p")
    assert_one_line(info.value.reason)
    needed = int(re.search(r"cluster\.devices >= ([\d,]+)", info.value.reason)[1].replace(",", ""))
    check_memory_floor(on(needed), "p")  # the floor no longer refuses it
    with pytest.raises(Infeasible):
        check_memory_floor(on(needed - 1), "p")


# ------------------------------------------------------------------------------------------------
# Numbers of a preset given as data (build_device / build_cluster on dicts)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("key", ["peak_tflops", "hbm_gb", "hbm_bw_gbps", "matmul_efficiency"])
def test_build_device_refuses_non_finite(key, value):
    with pytest.raises(UserError) as info:
        build_device({**DEVICE, key: value})
    assert_one_line(str(info.value))
    assert f"{key}={value:g}" in str(info.value) and "finite" in str(info.value)


@pytest.mark.parametrize("key", ["bw_gbps", "latency_us", "oversubscription"])
def test_build_cluster_refuses_non_finite(key):
    with pytest.raises(UserError) as info:
        build_cluster(cluster_dict([8, None], 64, **{key: math.inf}))
    assert f"{key}=inf" in str(info.value) and "finite" in str(info.value)


# ------------------------------------------------------------------------------------------------
# Malformed YAML on the search path
# ------------------------------------------------------------------------------------------------

MALFORMED = {
    # name: (text, line the message must name)
    "flow": ("name: bad\nhidden: [4096\nlayers: 32\n", 3),
    "tab": ("name: bad\nhidden: 1\n\tlayers: 2\n", 3),
    "quote": ('name: "bad\nhidden: 1\n', 3),
    "duplicate": ("name: a\nname: b\n", 2),
}


def presets_dir(tmp_path: Path, name: str, content: bytes) -> Path:
    (tmp_path / "presets" / "model").mkdir(parents=True)
    (tmp_path / "presets" / "model" / f"{name}.yaml").write_bytes(content)
    return tmp_path / "presets"


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_yaml_is_one_line_naming_the_file_and_line(tmp_path, name):
    text, line = MALFORMED[name]
    presets = presets_dir(tmp_path, name, text.encode())
    with pytest.raises(Exception) as info:
        compose(f"model={name}", f"hydra.searchpath=[file://{presets}]")
    message = nest.app.cli.hydra_error_line(info.value)
    assert_one_line(message)
    assert str(presets / "model" / f"{name}.yaml") in message
    assert f"line {line}," in message


def test_config_file_not_utf8_is_one_line_naming_the_file(tmp_path):
    presets = presets_dir(tmp_path, "latin1", "name: m\n# 5 \u00b5s\n".encode("latin-1"))
    with pytest.raises(Exception) as info:
        compose("model=latin1", f"hydra.searchpath=[file://{presets}]")
    message = nest.app.cli.hydra_error_line(info.value)
    assert_one_line(message)
    assert str(presets / "model" / "latin1.yaml") in message and "UTF-8" in message


def test_preset_that_is_not_a_mapping_is_one_line(tmp_path):
    presets = presets_dir(tmp_path, "alist", b"- 1\n- 2\n")
    result, _ = run_case(tmp_path, "model=alist", f"hydra.searchpath=[file://{presets}]")
    assert result["status"] == "error"
    assert_one_line(result["error"])
    assert "model=[1, 2]" in result["error"] and "mapping" in result["error"]


def test_malformed_paper_tables_file_is_one_line_naming_the_file_and_line(tmp_path):
    tables = tmp_path / "tables.yaml"
    tables.write_text("rows:\n  - {setup: x, devices: [1\n")
    result, _ = run_case(
        tmp_path, "solver=paper_manual", "cluster=tpuv4_fattree", f"solver.tables_file={tables}"
    )
    assert result["status"] == "error"
    assert_one_line(result["error"])
    assert str(tables) in result["error"] and "line 3," in result["error"]


# ------------------------------------------------------------------------------------------------
# End to end: python run.py prints one line, no traceback, exit status 2
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["+foo=1"], "foo=1"),
        (["cluster.device.peak_tflops=nan"], "peak_tflops=nan"),
        (["solver=cpsat", "solver.workers=0"], "solver.workers=0"),
        (["model.layers=1000000"], "model.layers=1000000"),
    ],
)
def test_subprocess_bad_input_is_one_line(tmp_path, overrides, named):
    assert named in one_error_line(run_py(tmp_path, *overrides)[0])


def test_subprocess_malformed_yaml_is_one_line(tmp_path):
    presets = presets_dir(tmp_path, "flow", MALFORMED["flow"][0].encode())
    line = one_error_line(run_py(tmp_path, "model=flow", f"hydra.searchpath=[file://{presets}]")[0])
    assert "malformed YAML" in line and "flow.yaml, line 3," in line


# ------------------------------------------------------------------------------------------------
# Devices without their own kernel figures, and graphs with attributes the model would ignore
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override", ["cluster.device.hbm_gb=1e12", "cluster.device.peak_tflops=1e-9"]
)
def test_physical_range_message_states_the_range(tmp_path, override):
    result, _ = run_case(tmp_path, override)
    assert "outside the physical range" in result["error"] and "check the unit" in result["error"]
    assert re.search(r"\d[\d,.]*-[\d,.]+ (GB|TFLOP/s)", result["error"])


def test_a_device_given_by_overrides_does_not_run_on_h100_kernel_figures(tmp_path):
    """B200-like figures over the H100 preset (compute_model: shape): the GEMM ceiling, kernel
    overhead and FlashAttention table are H100's, so the run uses the flat model (every FLOP at
    peak x matmul_efficiency) and says so in one line."""
    b200 = [
        "cluster.device.name=b200",
        "cluster.device.peak_tflops=2250",
        "cluster.device.hbm_gb=192",
    ]
    cfg = compose("cluster=dgx_h100_superpod", *b200)
    device = build_problem(cfg).cluster.device
    assert device.compute_model == "flat"
    (note,) = device.notes
    assert_one_line(note)
    assert "peak_tflops=2250" in note and "compute_model=flat" in note
    # the preset itself keeps the shape model (its own published figures)
    assert build_problem(compose("cluster=dgx_h100_superpod")).cluster.device.compute_model == (
        "shape"
    )
    result, lines = run_case(tmp_path, "solver=fixed", "model=tiny", *b200)
    assert result["status"] != "error", result.get("error")
    assert any(f"note: {note}" in line for line in lines)


def _graph(**node_extra):
    from networkx import Graph

    graph = Graph()
    graph.add_node("a", kind="gpu", **node_extra)
    graph.add_node("b", kind="gpu")
    graph.add_edge("a", "b", bw_gbps=100, latency_us=1)
    return graph


def test_a_per_node_device_in_a_graph_is_refused():
    from nest.graph.build import network_from_graph

    with pytest.raises(UserError) as info:
        network_from_graph(_graph(device="a100_80gb"), "g")
    assert_one_line(str(info.value))
    assert "device='a100_80gb'" in str(info.value) and "heterogeneous" in str(info.value)


def test_unknown_graph_node_and_edge_attributes_are_refused():
    from nest.graph.build import network_from_graph

    with pytest.raises(UserError, match=r"node 'a' has attributes \['hbm_gb'\]"):
        network_from_graph(_graph(hbm_gb=40), "g")
    graph = _graph()
    graph.edges["a", "b"]["bandwidth"] = 5
    with pytest.raises(UserError, match=r"edge 'a' - 'b' has attributes \['bandwidth'\]"):
        network_from_graph(graph, "g")


# ================================================================================================
# Failures of the machine and of files, not of the settings (issue 26). Each prints one line:
#   Ctrl-C: nest.app.cli.main, exit status 130;
#   an output directory that cannot be written (a file, read-only, a full disk):
#     nest.app.cli.main through nest.core.files.output_error_line, exit status 2;
#   a write that fails half-way leaves the previous file whole (nest.core.files.atomic_path);
#   a preset with no fields, a name too long for a file, too many alternatives, a graph file
#   that lists a node or link twice or cannot route without relays, CSV saved by Excel.
# ================================================================================================

ROOT = Path(CONF_DIR).parent


def _python(code: str, tmp_path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_ctrl_c_is_one_line_and_exit_status_130(tmp_path):
    """SIGINT while planning (the planner stands in as a sleep): one line, no traceback, 130."""
    import signal

    code = (
        "import sys, time\n"
        "import nest.app.cli as cli\n"
        "def busy():\n"
        "    print('planning', flush=True)\n"
        "    time.sleep(60)\n"
        "cli.hydra_main = busy\n"
        "cli.main()\n"
    )
    proc = _python(code, tmp_path)
    assert proc.stdout.readline().strip() == "planning"
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted"), out


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_run_directory_that_is_a_file_is_one_line(tmp_path, where):
    target = tmp_path / "taken"
    target.write_text("not a directory\n")
    run_dir = target if where == "file" else target / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [sys.executable, str(RUN_PY), "solver=fixed", "model=tiny", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = one_error_line(proc)
    assert str(run_dir) in line and "hydra.run.dir" in line, line
    assert target.read_text() == "not a directory\n"


@pytest.mark.parametrize(
    "error, fix",
    [
        (PermissionError(13, "Permission denied", "/ro/run/.hydra/config.yaml"), "writable"),
        (OSError(30, "Read-only file system", "/ro/run/plan.json"), "writable"),
        (OSError(28, "No space left on device", "/full/run/plan.json"), "free space"),
    ],
    ids=["permission", "read-only", "disk-full"],
)
def test_output_that_cannot_be_written_is_one_line(monkeypatch, capsys, error, fix):
    def fail():
        raise error

    monkeypatch.setattr(nest.app.cli, "hydra_main", fail)
    with pytest.raises(SystemExit) as info:
        nest.app.cli.main()
    assert info.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert error.filename in lines[0] and error.strerror in lines[0] and fix in lines[0]


def test_a_write_that_fails_half_way_leaves_the_previous_files_whole(tmp_path, monkeypatch):
    """A full disk while the second run writes its outputs: the first run's plan.json and
    report.json stay as they were, and no partial or temporary file is left."""
    run_case(tmp_path, *FIXED, "model=tiny", "solver.dp=64")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert "plan.json" in before

    class HalfWrite:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):
            self.handle.write(text[: len(text) // 2])
            raise OSError(28, "No space left on device", self.handle.name)

        def __getattr__(self, name):
            return getattr(self.handle, name)

    real_open = Path.open

    def full_disk(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        return HalfWrite(handle) if "w" in mode else handle

    monkeypatch.setattr(Path, "open", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run_case(tmp_path, *FIXED, "model=tiny", "solver.dp=32", "solver.pp=2")
    monkeypatch.undo()
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before


def test_a_full_disk_in_a_single_run_is_one_line(tmp_path, monkeypatch, capsys):
    """The run's own writes fail (every write to the run directory: plan.json, then error.txt
    and row.json): python run.py prints one line naming plan.json, exit status 2, and leaves no
    partial file (the previous code left an empty plan.json and error.txt and 59 lines of
    traceback on a full 12 KiB tmpfs)."""
    from nest.app.results import run_recorded
    from nest.core import files

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)  # after the first bytes reach the file
    cfg = compose(*FIXED, "model=tiny", "solver.dp=64")

    def hydra_main():
        run_recorded(nest.app.cli.run, cfg, tmp_path, keep_going=False)

    monkeypatch.setattr(nest.app.cli, "hydra_main", hydra_main)
    with pytest.raises(SystemExit) as info:
        nest.app.cli.main()
    assert info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: cannot write ") and "plan.json" in lines[0], lines
    assert "No space left on device" in lines[0] and "free space" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_empty_model_preset_is_one_line(tmp_path):
    presets = presets_dir(tmp_path, "empty", b"")
    result, _ = run_case(tmp_path, "model=empty", f"hydra.searchpath=[file://{presets}]")
    assert result["status"] == "error", result
    assert_one_line(result["error"])
    for field in ("hidden", "layers", "heads"):
        assert field in result["error"], result["error"]


def test_sweep_plot_names_fit_a_file_system(tmp_path):
    """A 300-character model name still makes the sweep's plot files (255 bytes per name)."""
    from experiments.sweep_plots import _slug

    names = [_slug("m" * 300 + tail, "dgx_8x8", 64, "", "v") for tail in ("a", "b")]
    assert names[0] != names[1]
    for slug in names:
        name = f"placement_{slug}.png"
        assert len(name.encode()) <= 255
        (tmp_path / name).write_bytes(b"")  # the file system takes it


def test_top_k_beyond_the_limit_is_one_line(tmp_path):
    result, _ = run_case(tmp_path, "solver=nest", "solver.top_k=100000", "model=tiny")
    assert result["status"] == "error", result.get("plan")
    assert_one_line(result["error"])
    assert "solver.top_k=100000" in result["error"] and "100" in result["error"]


def _graph_file(tmp_path: Path, nodes, edges, **graph) -> Path:
    doc = {"directed": False, "multigraph": False, "graph": graph, "nodes": nodes, "edges": edges}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    return path


def _link(a, b, bw=100):
    return {"source": a, "target": b, "bw_gbps": bw, "latency_us": 1}


GPUS = [{"id": f"g{i}", "kind": "gpu"} for i in range(4)]
CHAIN = [_link("g0", "g1"), _link("g1", "g2"), _link("g2", "g3")]
GRAPH_FILES = [
    ("duplicate-node", [*GPUS, GPUS[1]], CHAIN, {}, ["'g1'", "twice"]),
    (
        "duplicate-edge-reversed",
        GPUS,
        [*CHAIN, _link("g1", "g0", bw=10)],
        {},
        ["'g1' - 'g0'", "twice"],
    ),
    ("duplicate-edge", GPUS, [*CHAIN, _link("g2", "g3")], {}, ["'g2' - 'g3'", "twice"]),
    ("relay-false-chain", GPUS, CHAIN, {"relay": False}, ["relay", "cannot reach"]),
]


@pytest.mark.parametrize(
    "nodes, edges, graph, named", [pytest.param(*c[1:], id=c[0]) for c in GRAPH_FILES]
)
def test_graph_file_mistakes_are_one_line(tmp_path, nodes, edges, graph, named):
    path = _graph_file(tmp_path, nodes, edges, **graph)
    result, _ = run_case(
        tmp_path, "cluster=graph", f"cluster.graph_path={path}", "model=tiny", *FIXED
    )
    assert result["status"] == "error", result
    assert_one_line(result["error"])
    for text in named:
        assert text in result["error"], (text, result["error"])


@pytest.mark.parametrize("twice", ["node", "edge"])
def test_graphml_listing_a_node_or_edge_twice_is_one_line(tmp_path, twice):
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from((f"g{i}", {"kind": "gpu"}) for i in range(2))
    graph.add_edge("g0", "g1", bw_gbps=100.0, latency_us=1.0)
    path = tmp_path / "g.graphml"
    nx.write_graphml(graph, path)
    text = path.read_text()
    pattern = r'<node id="g1">.*?</node>' if twice == "node" else r"<edge .*?</edge>"
    element = re.search(pattern, text, re.S).group(0)
    if twice == "edge":  # reversed, with another bandwidth
        element = element.replace('source="g0" target="g1"', 'source="g1" target="g0"')
        element = element.replace(">100.0<", ">10.0<")
    path.write_text(text.replace("</graph>", element + "</graph>"))
    result, _ = run_case(tmp_path, "cluster=graph", f"cluster.graph_path={path}", "model=tiny")
    assert result["status"] == "error", result
    assert_one_line(result["error"])
    assert "twice" in result["error"], result["error"]


def test_relay_false_through_a_switch_is_planned(tmp_path):
    """The same four devices behind one switch route without relays."""
    nodes = [*GPUS, {"id": "s", "kind": "switch"}]
    path = _graph_file(tmp_path, nodes, [_link(f"g{i}", "s") for i in range(4)], relay=False)
    result, _ = run_case(tmp_path, "cluster=graph", f"cluster.graph_path={path}", "model=tiny")
    assert result["status"] == "feasible", result.get("error")


def _excel(source: Path, target: Path) -> Path:
    """``source`` as Excel saves "CSV UTF-8": a byte-order mark and CRLF line ends."""
    text = source.read_text(encoding="utf-8").replace("\r\n", "\n")
    target.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    return target


@pytest.mark.parametrize(
    "reader, source, overrides",
    [
        ("measured", "data/measured/dgx_2x8_example.csv", ["cluster=measured"]),
        ("profile", "data/profiles/example_tiny.csv", ["model=profile"]),
    ],
)
def test_csv_saved_by_excel_is_read_as_the_same_file(tmp_path, reader, source, overrides):
    key = "cluster.params.table" if reader == "measured" else "model.path"
    plain, _ = run_case(tmp_path / "plain", *overrides, f"{key}={ROOT / source}")
    assert plain["status"] == "feasible", plain.get("error")
    excel = _excel(ROOT / source, tmp_path / "excel.csv")
    result, _ = run_case(tmp_path / "excel", *overrides, f"{key}={excel}")
    assert result["status"] == "feasible", result.get("error")
    assert result["iteration_time_s"] == plain["iteration_time_s"]


def test_validation_csv_saved_by_excel_is_read_as_the_same_file(tmp_path):
    from nest.app import validate

    cases = ROOT / "experiments" / "validation" / "cases.csv"
    plain = validate.run(cases, None, echo=lambda _: None)
    excel = validate.run(_excel(cases, tmp_path / "cases.csv"), None, echo=lambda _: None)
    assert excel == plain
