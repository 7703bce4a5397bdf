"""``robust=true``: the best plans re-scored by ``evaluate`` on perturbed problems."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from nest.analysis.robust import (
    RANGE_NAMES,
    Ranges,
    RobustSettings,
    Worlds,
    robustness,
    sample_times,
    settings_from_config,
    summarise,
    verdict,
)
from nest.core.errors import UserError
from nest.cost import evaluate
from nest.dp.planner import NestPlanner
from nest.graph.build import graph_cluster
from nest.graph.generators import rail_optimized

from .conftest import make_cluster, make_problem
from .test_cli import CONF_DIR, run_case

OFF = {name: (1.0, 1.0) for name in RANGE_NAMES}


def exactly(**factors) -> RobustSettings:
    """Settings whose every range is one value: each world is the problem scaled by it."""
    return RobustSettings(samples=3, ranges=Ranges(**{**OFF, **factors}))


@pytest.fixture(scope="module")
def case():
    """A small problem and its three best configurations."""
    problem = make_problem(cluster=make_cluster(fanouts=(4, 2)), global_batch=16)
    return problem, NestPlanner(top_k=3).solve_ranked(problem)


def scaled_problem(problem, *, peak=1.0, hbm_bw=1.0, hbm=1.0, bw=1.0, lat=1.0):
    """The problem with device and network inputs scaled by hand."""
    cluster, device = problem.cluster, problem.cluster.device
    device = replace(
        device,
        peak_flops_per_s=device.peak_flops_per_s * peak,
        hbm_bw_bytes_per_s=device.hbm_bw_bytes_per_s * hbm_bw,
        hbm_bytes=device.hbm_bytes * hbm,
    )
    levels = tuple(
        replace(lv, bw_bytes_per_s=lv.bw_bytes_per_s * bw, latency_s=lv.latency_s * lat)
        for lv in cluster.levels
    )
    return replace(problem, cluster=replace(cluster, device=device, levels=levels))


def test_robustness_is_deterministic_for_a_seed(case):
    """The same seed gives the same report, to the last bit; another seed other samples."""
    problem, plans = case
    settings = RobustSettings(samples=40, seed=7)
    first = robustness(problem, plans, settings)
    again = robustness(problem, plans, settings)
    assert json.dumps(first) == json.dumps(again)
    other = robustness(problem, plans, replace(settings, seed=8))
    assert other["sample_times_s"] != first["sample_times_s"]


def test_the_cli_report_is_reproducible(tmp_path):
    """Two runs with ``robust=true`` and the same seed write the same report.json["robustness"]
    and a robustness.png; ``seed=1`` changes the samples (robustness.seed: null takes it)."""
    args = ("solver=nest", "model=tiny", "cluster=dgx_8x8", "solver.top_k=3", "robust=true")
    args += ("robustness.samples=30",)
    reports = [run_case(tmp_path / str(k), *args)[2]["robustness"] for k in range(2)]
    assert reports[0] == reports[1]
    assert (tmp_path / "0" / "robustness.png").stat().st_size > 0
    assert reports[0]["win_probability"] == reports[0]["plans"][0]["win_probability"]
    assert len(reports[0]["plans"]) == 3 and reports[0]["seed"] == 0
    _, _, other, _, lines = run_case(tmp_path / "s1", *args, "seed=1")
    assert other["robustness"]["seed"] == 1
    assert other["robustness"]["sample_times_s"] != reports[0]["sample_times_s"]
    assert any(line.startswith("verdict: ") for line in "\n".join(lines).splitlines())


def test_ranges_of_one_value_scale_exactly_that_input(case):
    """A range ``[c, c]`` gives worlds that are the problem with that input scaled by ``c``,
    scored by ``evaluate``: each perturbation is the stated one and nothing else."""
    problem, plans = case
    nominal = [evaluate(problem, p).iteration_time_s for p in plans]
    assert sample_times(problem, plans, exactly()).tolist() == [nominal] * 3
    for name, by_hand in [
        ("matmul_efficiency", dict(peak=1.3)),
        ("hbm_bandwidth", dict(hbm_bw=1.3)),
        ("network_bandwidth", dict(bw=1.3)),
        ("network_latency", dict(lat=1.3)),
    ]:
        times = sample_times(problem, plans, exactly(**{name: (1.3, 1.3)}))
        want = [evaluate(scaled_problem(problem, **by_hand), p).iteration_time_s for p in plans]
        assert times[0].tolist() == pytest.approx(want, rel=1e-12), name
        assert times[0].tolist() != pytest.approx(nominal, rel=1e-6), name


def test_layer_time_scales_compute_and_its_trend_follows_the_shard(case):
    """``layer_time [c, c]`` multiplies every layer's compute (forward, backward, recompute)
    by ``c``; ``layer_time_per_doubling [g, g]`` leaves the chosen plan's shard alone and scales
    a layer on another shard by ``g ** log2(W / W_1)`` (``W``: its nominal forward time)."""
    problem, plans = case
    worlds = Worlds(problem, exactly(layer_time=(1.25, 1.25)), plans[0].config.shard(True))
    world = worlds.world(0)
    for plan in plans:
        got, base = evaluate(world, plan), evaluate(problem, plan)
        for s, b in zip(got.stages, base.stages, strict=True):
            assert s.compute_fwd_s == pytest.approx(1.25 * b.compute_fwd_s, rel=1e-12)
            assert s.compute_bwd_s == pytest.approx(1.25 * b.compute_bwd_s, rel=1e-12)
            assert s.recompute_s == pytest.approx(1.25 * b.recompute_s, rel=1e-12)
            assert s.tp_comm_s == b.tp_comm_s and s.p2p_fwd_s == b.p2p_fwd_s
    g = 1.2
    ref = plans[0].config.shard(plans[0].sequence_parallel)
    worlds = Worlds(problem, exactly(layer_time_per_doubling=(g, g)), ref)
    model, device = problem.model, problem.cluster.device
    other = replace(ref, mbs=2 * ref.mbs)
    for layer in model.chain:
        assert worlds.layer_factors(layer, ref)[0] == 1.0
        size = model.layer_cost(layer, other, device).fwd_s
        size_1 = model.layer_cost(layer, ref, device).fwd_s
        want = g ** math.log2(size / size_1)
        assert worlds.layer_factors(layer, other)[0] == pytest.approx(want, rel=1e-12)
        cost = worlds.world(1).model.layer_cost(layer, other, device)
        assert cost.fwd_s == pytest.approx(want * size, rel=1e-12)


def test_adding_alternatives_does_not_change_the_chosen_plans_samples(case):
    """Factors are drawn per world and per (layer, shard), not per plan: the chosen plan's
    sampled times are the same alone or with two alternatives beside it."""
    problem, plans = case
    settings = RobustSettings(samples=25, seed=3)
    alone = sample_times(problem, plans[:1], settings)[:, 0]
    together = sample_times(problem, plans, settings)[:, 0]
    assert alone.tolist() == together.tolist()
    assert len(set(alone.tolist())) == 25  # every world differs


def test_a_plan_that_does_not_fit_loses_its_samples(case):
    """With the memory scaled between two plans' peaks, the larger one fits in no sample: it
    wins none, its regrets are undefined, the other wins all; when nothing fits, no plan wins."""
    problem, plans = case
    peaks = [evaluate(problem, p).peak_memory_bytes for p in plans]
    small, big = int(np.argmin(peaks)), int(np.argmax(peaks))
    assert peaks[small] < peaks[big]
    c = (peaks[small] + peaks[big]) / 2 / problem.cluster.device.hbm_bytes
    pair = [plans[small], plans[big]]
    result = robustness(problem, pair, exactly(hbm_capacity=(c, c)))
    first, second = result["plans"]
    assert first["win_probability"] == 1.0 and first["fits_probability"] == 1.0
    assert second["win_probability"] == 0.0 and second["fits_probability"] == 0.0
    assert second["expected_regret_s"] is None and second["iteration_time_s"] is None
    assert second["beats_chosen_probability"] == 0.0
    assert result["sample_times_s"][0][1] is None
    tiny = robustness(problem, pair, exactly(hbm_capacity=(1e-6, 1e-6)))
    assert [p["win_probability"] for p in tiny["plans"]] == [0.0, 0.0]
    assert "no plan fits" in tiny["verdict"]["text"]


def test_summarise_counts_wins_ties_and_regrets():
    """Wins go to each sample's fastest plan that fits (ties shared), regret is the time over
    that sample's fastest, a plan that does not fit has no regret there."""
    inf = np.inf
    times = np.array([[1.0, 1.0, 3.0], [2.0, 1.5, inf], [inf, inf, inf], [1.0, 2.0, 0.5]])
    got = summarise(times, [1.0, 1.0, 1.0])
    assert [p["win_probability"] for p in got] == [0.5 / 4, 1.5 / 4, 1 / 4]
    assert got[0]["expected_regret_s"] == pytest.approx((0 + 0.5 + 0.5) / 3)
    assert got[0]["worst_regret_s"] == 0.5
    assert got[2]["fits_probability"] == 0.5 and got[2]["worst_regret_s"] == 2.0
    assert got[1]["beats_chosen_probability"] == 0.25  # only sample 1 (ties do not beat)
    assert got[2]["beats_chosen_probability"] == 0.25
    assert not got[1]["tied_with_chosen"]
    assert summarise(np.array([[1.0, 1.0], [2.0, 2.0]]), [1.0, 1.0])[1]["tied_with_chosen"]


def _plan(rank, win, regret=0.01):
    return {
        "rank": rank,
        "win_probability": win,
        "tied_with_chosen": False,
        "expected_regret_fraction": regret,
        "worst_regret_fraction": 2 * regret,
        "iteration_time_s": {"p05": 1.0, "p95": 2.0},
    }


def test_the_verdict_says_plainly_when_plans_are_indistinguishable():
    robust = verdict([_plan(1, 0.95), _plan(2, 0.05)], 200, 0.9)
    assert robust["kind"] == "robust" and robust["contenders"] == [1]
    assert robust["text"].startswith("robust: plan 1 is the fastest of the 2 in 95 % of 200")
    close = verdict([_plan(1, 0.5), _plan(2, 0.45), _plan(3, 0.05)], 200, 0.9)
    assert close["kind"] == "indistinguishable" and close["contenders"] == [1, 2]
    assert "plans 1 and 2 are each the fastest in 50 %, 45 % of 200 samples" in close["text"]
    assert "try them on the cluster" in close["text"] and not close["negligible"]
    # the same wins, but plan 1 is never more than 0.2 % slower: it does not matter which
    small = verdict([_plan(1, 0.5, 0.001), _plan(2, 0.45), _plan(3, 0.05)], 200, 0.9)
    assert small["negligible"] and "it hardly matters which" in small["text"]
    assert "0.20 % at worst" in small["text"] and "cluster" not in small["text"]
    beaten = verdict([_plan(1, 0.05), _plan(2, 0.95)], 200, 0.9)
    assert beaten["contenders"] == [2] and "the chosen plan in 5 %" in beaten["text"]
    spread = verdict([_plan(r, 1 / 12) for r in range(1, 13)], 200, 0.9)
    assert spread["contenders"] == list(range(1, 13))
    single = verdict([_plan(1, 1.0)], 200, 0.9)
    assert single["kind"] == "single" and "solver.top_k=5" in single["text"]


def test_the_documented_defaults_are_the_codes():
    """conf/config.yaml's ``robustness`` block (what a run uses) equals :class:`RobustSettings`'
    defaults (what the library uses), and is read back unchanged."""
    conf = yaml.safe_load(Path(CONF_DIR, "config.yaml").read_text())
    assert conf["robust"] is False
    block = conf["robustness"]
    default = RobustSettings()
    assert block["seed"] is None
    assert (block["samples"], block["confidence"]) == (default.samples, default.confidence)
    assert block["negligible_regret"] == default.negligible_regret
    assert block["ranges"] == default.ranges.to_dict()
    assert settings_from_config(block, run_seed=0) == default
    assert settings_from_config(block, run_seed=5).seed == 5


@pytest.mark.parametrize(
    "block, words",
    [
        ({"samples": 0}, "robustness.samples=0"),
        ({"seed": -1}, "robustness.seed=-1"),
        ({"confidence": 1.0}, "robustness.confidence=1.0"),
        ({"negligible_regret": -0.1}, "robustness.negligible_regret=-0.1"),
        ({"ranges": {"layer_time": [1.1, 0.9]}}, "robustness.ranges.layer_time=[1.1, 0.9]"),
        ({"ranges": {"layer_time": [0, 1]}}, "robustness.ranges.layer_time=[0, 1]"),
        ({"ranges": {"gemm": [1, 1]}}, "robustness.ranges.gemm is not an uncertain input"),
        ({"sample": 10}, "robustness.sample is not a setting"),
    ],
)
def test_bad_robustness_settings_are_one_line_errors(block, words):
    with pytest.raises(UserError) as err:
        settings_from_config(block, run_seed=0)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_an_hbm_capacity_below_the_reserve_is_refused_before_planning(tmp_path):
    """dgx_8x8's H100 keeps a reserve: a capacity range reaching under it is a one-line error
    naming the range, not a traceback halfway through the samples."""
    _, result, _, plan, lines = run_case(
        tmp_path, "model=tiny", "robust=true", "robustness.ranges.hbm_capacity=[0.01,1]"
    )
    assert result["status"] == "error" and plan is None
    assert lines == [f"error: {result['error']}"]
    assert "robustness.ranges.hbm_capacity=[0.01, 1.0]" in result["error"]


def test_robust_with_a_planner_of_one_plan_reports_its_spread(tmp_path):
    """``megatron`` (no ranking) with ``robust=true``: one plan, verdict ``single``, its time's
    spread; a bad ``robust`` value is a one-line error before planning."""
    _, result, report, _, _ = run_case(
        tmp_path / "a", "model=tiny", "robust=true", "robustness.samples=20"
    )
    rob = report["robustness"]
    assert rob["verdict"]["kind"] == "single" and rob["win_probability"] == 1.0
    assert "alternatives" not in report
    spread = rob["plans"][0]["iteration_time_s"]
    assert spread["min"] <= report["iteration_time_s"] * 1.5 and spread["p05"] <= spread["p95"]
    _, result, _, _, lines = run_case(tmp_path / "b", "model=tiny", "robust=maybe")
    assert result["status"] == "error" and lines == [
        "error: robust='maybe'; use robust=true or robust=false"
    ]


def test_network_factors_are_reported_as_not_applied_on_a_graph(case):
    """A graph cluster prices communication on its links and routes, which the per-level network
    factors do not reach: there the sample times are the nominal ones whatever the network
    ranges, and the report says the network was not perturbed; on a hierarchy the same ranges
    move the times."""
    problem, plans = case
    halved = exactly(network_bandwidth=(0.5, 0.5), network_latency=(2.0, 2.0))
    tree = robustness(problem, plans[:1], halved)
    assert tree["network_perturbed"] is True
    assert tree["sample_times_s"][0][0] > evaluate(problem, plans[0]).iteration_time_s
    cluster = graph_cluster("rails", problem.cluster.device, rail_optimized(8, gpus_per_node=4))
    graph_problem = replace(problem, cluster=cluster)
    plan = NestPlanner().solve(graph_problem)
    result = robustness(graph_problem, [plan], halved)
    assert result["network_perturbed"] is False
    nominal = evaluate(graph_problem, plan).iteration_time_s
    assert all(row[0] == pytest.approx(nominal, rel=1e-12) for row in result["sample_times_s"])
