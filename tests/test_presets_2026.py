"""The device and cluster presets of the machines of 2026 (B200, GB200 NVL72, MI300X, MI355X, TPU
v5p/v5e/v6e), and device counts that are not powers of two (a 72-GPU NVLink domain, 9 replicas).

Device figures are checked against the published facts their presets cite (each fact's source is
in the preset's comment); clusters are composed as the CLI composes them, shrunk to a few blocks,
and planned by ``nest`` and ``megatron``."""

from pathlib import Path

import hydra
import numpy as np
import pytest
from hydra.utils import instantiate

from baselines.megatron import MegatronPlanner
from nest.app.cli import CONF_DIR
from nest.app.config import PHYSICAL_RANGES, build_device, build_problem, load_preset
from nest.core.errors import Infeasible
from nest.core.units import GB, TFLOP, GiB
from nest.cost import check_plan, evaluate
from nest.dp.planner import NestPlanner
from nest.dp.space import SpaceOptions, configurations

from .conftest import (
    assert_not_faster_than_peak,
    make_cluster,
    make_device,
    make_problem,
    make_spec,
)
from .test_planners import SOLVERS, planner_from_config

# Published dense figures of each chip (TFLOP/s, GB or GiB, GB/s), and its dense FP8 rate where
# its FP8 GEMMs run faster than its BF16 ones (None: no FP8 rate above BF16 is published). Sources:
# NVIDIA DGX B200 datasheet and GB200 NVL72 specifications (sparse figures halved), AMD MI300X data
# sheet and MI355X specifications, cloud.google.com/tpu/docs/v5p, v5e and v6e (v5p lists FP8 at
# its BF16 rate, 459; v5e and v6e list BF16 and int8 only). The B200's and GB200's HBM is what
# CUDA exposes of their datasheets' 180 and 186 GB (conf/device/b200.yaml, gb200.yaml: 182,631 MiB
# and 187.28 GiB, as PyTorch and torchtitan print them); the MI300X's is what the HIP runtime
# exposes (conf/device/mi300x.yaml: 196,592 MiB, as PyTorch on ROCm prints it, ROCm/ROCm#4203).
# TPU v5e's and v6e's "16 GB" and "32 GB" and v5p's "95 GiB" are JAX's hardware table's 17.2e9,
# 34.4e9 and 103e9 bytes (jax-ml/jax@cec06d1:jax/_src/tpu_info.py; 103e9 bytes = 95.9 GiB).
PUBLISHED = {
    "b200": dict(bf16=2250, fp8=4500, hbm_bytes=191.5 * GB, hbm_gbps=8000, mxfp8=True),
    "gb200": dict(bf16=2500, fp8=5000, hbm_bytes=201.1 * GB, hbm_gbps=8000, mxfp8=True),
    "mi300x": dict(bf16=1307.4, fp8=2614.9, hbm_bytes=196592 * 2**20, hbm_gbps=5300, mxfp8=False),
    "mi355x": dict(bf16=2500, fp8=5000, hbm_bytes=288 * GB, hbm_gbps=8000, mxfp8=True),
    "tpu_v5p": dict(bf16=459, fp8=None, hbm_bytes=103 * GB, hbm_gbps=2765, mxfp8=False),
    "tpu_v5e": dict(bf16=197, fp8=None, hbm_bytes=17.2 * GB, hbm_gbps=819, mxfp8=False),
    "tpu_v6e": dict(bf16=918, fp8=None, hbm_bytes=34.4 * GB, hbm_gbps=1640, mxfp8=False),
}

# Each new cluster composed small: (overrides, devices). Inner fan-outs shrink where the preset's
# smallest multiple would make a slow test; the levels, bandwidths and device stay the preset's.
SMALL = {
    "dgx_b200": ("cluster.levels.1.fanout=2", 32),
    "gb200_nvl72": ("cluster.levels.1.fanout=1", 144),
    "mi300x_pod": ("cluster.levels.1.fanout=2", 32),
    "tpu_v5p_pod": (None, 128),
    "tpu_v6e_multislice": ("cluster.levels.0.fanout=16", 32),
}


def compose(*overrides: str):
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra.compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_device_preset_states_the_published_figures_inside_the_physical_ranges(name):
    data = load_preset("device", name)
    device = build_device(data)
    fact = PUBLISHED[name]
    for key in ("peak_tflops", "hbm_bw_gbps", "fp8_peak_tflops", "hbm_gb", "hbm_gib"):
        if data.get(key) is not None:
            low, high, _, _ = PHYSICAL_RANGES[key]
            assert low <= data[key] <= high, (name, key)
    assert device.peak_flops_per_s == pytest.approx(fact["bf16"] * TFLOP)
    assert device.hbm_bytes == pytest.approx(fact["hbm_bytes"])
    assert device.hbm_bw_bytes_per_s == pytest.approx(fact["hbm_gbps"] * GB)
    # FP8 figures exactly where the chip's FP8 GEMMs run faster than BF16, at its dense rate,
    # which is twice the BF16 one on every chip here (a sparse figure would be four times)
    assert device.has_fp8 == (fact["fp8"] is not None)
    if fact["fp8"] is not None:
        assert device.fp8_peak_flops_per_s == pytest.approx(fact["fp8"] * TFLOP)
        assert device.fp8_peak_flops_per_s / device.peak_flops_per_s == pytest.approx(2, rel=0.01)
        assert 0 < device.fp8_gemm_ceiling < 1
    assert device.mxfp8 == fact["mxfp8"]  # Blackwell and CDNA4 only


DEVICES = sorted(p.stem for p in (Path(CONF_DIR) / "device").glob("*.yaml"))


@pytest.mark.parametrize("name", DEVICES)
def test_no_preset_runs_gemms_above_its_measured_ceiling(name):
    """The rate a GEMM keeps inside a step cannot exceed the best isolated GEMM measured on the
    chip: ``matmul_efficiency <= gemm_ceiling`` (both compute models; under ``flat`` nothing
    else caps it). MI300X and MI355X measure below the project's 0.65."""
    device = build_device(load_preset("device", name))
    assert device.matmul_efficiency <= device.gemm_ceiling, name
    if device.has_fp8:  # an FP8 GEMM in a step never beats the FP8 ceiling either
        assert device.fp8_level <= device.fp8_gemm_ceiling


@pytest.mark.parametrize("name", sorted(SMALL))
def test_cluster_preset_is_planned_by_nest_and_megatron(name):
    override, devices = SMALL[name]
    extra = [override] if override else []
    cfg = compose(f"cluster={name}", *extra, f"cluster.devices={devices}", "model=tiny")
    problem = build_problem(cfg)
    assert problem.cluster.num_devices == devices
    assert [lv.name for lv in problem.cluster.levels] == [
        lv["name"] for lv in load_preset("cluster", name)["levels"]
    ]
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        nest = instantiate(hydra.compose(config_name="config", overrides=["solver=nest"]).solver)
    plan = nest.solve(problem)
    assert plan.status == "optimal"
    check_plan(problem, plan)
    assert evaluate(problem, plan).feasible
    assert_not_faster_than_peak(problem, plan)
    try:
        rules = MegatronPlanner().solve(problem)
    except Infeasible:  # the rules may find nothing; NEST's optimum then must not be theirs
        return
    check_plan(problem, rules)
    assert evaluate(problem, rules).feasible
    assert plan.objective_s <= rules.objective_s * (1 + 1e-9)  # NEST's space holds the rules'


def test_the_default_gb200_nvl72_cluster_is_16_racks_of_72():
    cluster = build_problem(compose("cluster=gb200_nvl72")).cluster
    assert cluster.num_devices == 1152
    assert [lv.fanout for lv in cluster.levels] == [72, 8, 2]


# Non-power-of-two degrees: a 72-device NVLink domain (two of them, 144 devices), 72 heads and
# 72 experts, a global batch of 72 sequences.
def nvl72_problem(**spec):
    roomy = make_device(hbm_bytes=GiB**2)
    cluster = make_cluster(fanouts=(72, 2), bws_gbps=(900, 50), device=roomy)
    kw = dict(hidden=576, heads=72, ffn_hidden=1152, layers=3, seq_len=64)
    return make_problem(make_spec(**{**kw, **spec}), cluster, global_batch=72)


def test_degrees_that_are_not_powers_of_two_are_in_the_space():
    dense = {(c.tp, c.dp, c.pp) for c in configurations(nvl72_problem(), SpaceOptions())}
    assert any(tp == 72 for tp, _, _ in dense)  # the whole NVLink domain as one tensor group
    assert any(dp == 9 for _, dp, _ in dense)
    assert any(tp == 8 and dp == 9 and pp == 2 for tp, dp, pp in dense)  # 144 = 8 x 9 x 2
    moe = nvl72_problem(num_experts=72, top_k=2, activation="swiglu")
    assert any(c.ep == 72 for c in configurations(moe, SpaceOptions(tp=[1])))


@pytest.mark.parametrize(
    ("degrees", "split"),
    [
        (dict(tp=[72], pp=[2]), (72, 1)),  # each tensor group fills one NVLink domain
        (dict(tp=[8], pp=[2]), (8, 1)),  # 8 of 72: the groups stay inside a domain
    ],
)
def test_nest_places_non_power_of_two_groups_inside_the_nvlink_domain(degrees, split):
    problem = nvl72_problem()
    plan = NestPlanner(**degrees).solve(problem)
    check_plan(problem, plan)
    assert plan.tp == degrees["tp"][0]
    for stage in plan.stages:
        for replica in np.asarray(stage.devices):
            for ranks in replica:
                assert problem.cluster.group_factors(ranks) == split
    assert evaluate(problem, plan).feasible


def test_nine_nodes_nine_replicas():
    """A cluster of 9 nodes of 8 (a fan-out of 9 above the node): with tensor groups of 8 and no
    pipeline, the configurations of 1, 2, 3, 4, 6, 8 and 9 replicas (the divisors of the batch of
    72 that fit 9 nodes) all get a valid plan, scored by the shared evaluator; 9 replicas use
    every device, one node each, and sync their gradients across the 9 nodes."""
    roomy = make_device(hbm_bytes=GiB**2)
    cluster = make_cluster(fanouts=(8, 9), bws_gbps=(900, 50), device=roomy)
    problem = make_problem(make_spec(hidden=256, heads=8, layers=3), cluster, global_batch=72)
    planner = NestPlanner(tp=[8], pp=[1], zero_stages=[1], top_k=100)
    plans = planner.solve_ranked(problem)
    assert {p.dp for p in plans} == {1, 2, 3, 4, 6, 8, 9}
    nine = [p for p in plans if p.dp == 9]
    for plan in nine:
        check_plan(problem, plan)
        assert plan.devices_used == 72
        assert evaluate(problem, plan).iteration_time_s == pytest.approx(plan.objective_s)
        nodes = {d // 8 for ranks in np.asarray(plan.stages[0].devices)[:, 0, :] for d in ranks}
        assert nodes == set(range(9))


def non_power_of_two_problems():
    yield make_problem(
        make_spec(layers=4, heads=6, hidden=96), make_cluster(fanouts=(3, 3)), global_batch=18
    )
    moe = make_spec(layers=3, heads=6, hidden=96, num_experts=6, top_k=2, activation="swiglu")
    yield make_problem(moe, make_cluster(fanouts=(6, 2)), global_batch=12)


@pytest.mark.parametrize("name", [s for s in SOLVERS if not s.startswith("paper_")])
def test_every_planner_plans_on_fan_outs_of_3_and_6(name):
    """The conformance checks of tests/test_planners.py on nodes of 3 and 6 devices (9 and 12 in
    all, 6 experts): a valid plan, feasible when it says so, never faster than the peak. The
    paper's table planners are left out: their tables have rows for 8 devices only."""
    for problem in non_power_of_two_problems():
        plan = planner_from_config(name).solve(problem)
        check_plan(problem, plan)
        assert_not_faster_than_peak(problem, plan)
        if plan.status in ("optimal", "feasible"):
            assert evaluate(problem, plan).feasible


# Each new cluster at 8 devices, with the preset's levels, bandwidths, device and options
# (NVLink SHARP on where the preset has it): the inner fan-outs shrink, the top level takes the
# rest.
EIGHT = {
    "dgx_b200": ["cluster.levels.0.fanout=4", "cluster.levels.1.fanout=1"],
    "gb200_nvl72": ["cluster.levels.0.fanout=4", "cluster.levels.1.fanout=1"],
    "mi300x_pod": ["cluster.levels.0.fanout=4", "cluster.levels.1.fanout=1"],
    "tpu_v5p_pod": ["cluster.levels.0.fanout=4"],
    "tpu_v6e_multislice": ["cluster.levels.0.fanout=4"],
}
CONFORMING = [s for s in SOLVERS if not s.startswith("paper_")]


@pytest.mark.parametrize("cluster", sorted(EIGHT))
def test_every_planner_passes_conformance_on_each_new_cluster(cluster):
    """The issue's done-when: the conformance checks of tests/test_planners.py (a valid plan
    covering every layer once, feasible when it says so, never faster than the peak, the
    planner's own name and status) for every planner on each cluster of 2026 at 8 devices. The
    paper's table planners are left out: their tables have rows for the paper's clusters only."""
    assert set(EIGHT) == set(SMALL)
    problem = build_problem(
        compose(f"cluster={cluster}", *EIGHT[cluster], "cluster.devices=8", "model=tiny")
    )
    assert problem.cluster.num_devices == 8
    for name in CONFORMING:
        plan = planner_from_config(name).solve(problem)
        check_plan(problem, plan)
        assert [i for s in plan.stages for i in s.layers] == list(range(problem.num_layers))
        assert plan.solver == name
        assert plan.status in ("optimal", "feasible", "infeasible", "timeout")
        assert_not_faster_than_peak(problem, plan)
        if plan.status in ("optimal", "feasible"):
            assert evaluate(problem, plan).feasible, (cluster, name)
