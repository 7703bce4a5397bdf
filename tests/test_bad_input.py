"""User mistakes never give a traceback: each gets one line that names the value and the fix.

In-process cases call ``nest.cli.run`` with a list as the ``echo`` collector; a few run
``python run.py`` in a subprocess to check the exit code and that no traceback is printed. All
outputs go to ``tmp_path``.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate

import nest.cli
from nest.config import build_cluster, build_device, build_problem
from nest.errors import Infeasible, UserError
from nest.units import GiB

CONF_DIR = nest.cli.CONF_DIR
RUN_PY = Path(CONF_DIR).parent / "run.py"
FIXED = ["solver=fixed"]


def compose(*overrides: str):
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra.compose(config_name="config", overrides=list(overrides))


def run_case(tmp_path: Path, *overrides: str) -> tuple[dict, list[str]]:
    lines: list[str] = []
    result = nest.cli.run(compose(*overrides), tmp_path, echo=lines.append)
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


def test_subprocess_unknown_preset(tmp_path):
    proc, _ = run_py(tmp_path, "model=nonexistent")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out
    assert "nonexistent" in out and "Available options" in out
    for preset in ("bert_large", "gpt3_175b", "llama2_7b", "tiny"):
        assert preset in out


def test_subprocess_unknown_key(tmp_path):
    proc, _ = run_py(tmp_path, "model.hiden=3")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out and "hiden" in out


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
