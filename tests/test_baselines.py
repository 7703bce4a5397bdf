"""Each baseline's defining behaviour on hand-made cases: phaze, alpa, mcmc, megatron's options,
and the network views they search on."""

from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest

from baselines.alpa import AlpaPlanner, submesh_shapes
from baselines.alpa_stages import StageChoice, StageCosts, inter_op_dp
from baselines.mcmc import MCMCPlanner
from baselines.megatron import MegatronPlanner
from baselines.networks import flat_cluster, slowest_pair, two_level_cluster, with_cluster
from baselines.phaze import PhazePlanner
from nest.core.axes import MEGATRON_RANK_ORDER, Recompute, Schedule
from nest.core.errors import Infeasible, UserError
from nest.core.plan import make_structured_plan
from nest.core.units import GB, US
from nest.cost import evaluate
from nest.dp.planner import NestPlanner

from .conftest import make_cluster, make_device, make_problem, make_spec


def dense_dp_factors(problem, plan) -> set:
    """Level splits of every data-parallel group (one per tensor rank and stage)."""
    out = set()
    for stage in plan.stages[: plan.pp]:
        arr = np.asarray(stage.devices)
        flat = arr.reshape(-1, arr.shape[2])
        out |= problem.cluster.distinct_group_factors(flat.T) if flat.shape[0] > 1 else set()
    return out


# ----------------------------------------------------------------------------- network views


def test_flat_view_keeps_devices_and_takes_the_slowest_pair():
    cluster = make_cluster(fanouts=(4, 2, 2), bws_gbps=(400, 50, 100), lat_us=(1, 5, 9))
    # the top level is reached through level 1: its pairs run at min(400, 50, 100) = 50 GB/s
    assert slowest_pair(cluster) == (50 * GB, 9 * US)
    flat = flat_cluster(cluster)
    assert flat.num_devices == cluster.num_devices and flat.device == cluster.device
    assert flat.num_levels == 1 and flat.levels[0].bw_bytes_per_s == 50 * GB
    assert flat_cluster(cluster, bw_gbps=7, latency_us=2).levels[0].latency_s == 2 * US
    with pytest.raises(UserError, match="flat_bw_gbps"):
        flat_cluster(cluster, bw_gbps=0)


def test_two_level_view_keeps_the_node_and_collapses_the_rest():
    cluster = make_cluster(fanouts=(4, 2, 2), bws_gbps=(400, 50, 100), lat_us=(1, 5, 9))
    view = two_level_cluster(cluster)
    assert [lv.fanout for lv in view.levels] == [4, 4]
    assert view.levels[0].bw_bytes_per_s == 400 * GB
    assert (view.levels[1].bw_bytes_per_s, view.levels[1].latency_s) == (50 * GB, 9 * US)


# ----------------------------------------------------------------------------- phaze

# A case found by search over small problems: sequence 512, batch 16, a slow second level.
PHAZE_SPEC = dict(hidden=1024, layers=4, ffn_hidden=4096, seq_len=512, heads=8)


def phaze_problem(bw0=400, bw1=5):
    cluster = make_cluster(fanouts=(4, 4), bws_gbps=(bw0, bw1), lat_us=(1, 5))
    return make_problem(make_spec(**PHAZE_SPEC), cluster, global_batch=16, microbatch_sizes=(1,))


def test_phaze_data_parallel_group_crosses_the_slow_level_where_nest_does_not():
    """Told that every pair is as fast as the node (flat 400 GB/s), Phaze spreads 8 replicas over
    both nodes; NEST keeps its data-parallel groups inside a node and is faster on the real
    network."""
    problem = phaze_problem()
    nest = NestPlanner().solve(problem)
    phaze = PhazePlanner(flat_bw_gbps=400, flat_latency_us=1).solve(problem)
    crosses = [f for f in dense_dp_factors(problem, phaze) if f[1] > 1]
    assert crosses, phaze.degrees()
    assert all(f[1] == 1 for f in dense_dp_factors(problem, nest))
    assert nest.objective_s < phaze.objective_s
    # scored on the real network, where its data-parallel groups cross the 5 GB/s level: slower
    # than its search's view of every pair at 400 GB/s
    assert phaze.objective_s > phaze.search["flat_objective_s"]


def test_phaze_is_blind_to_the_inner_levels():
    """Phaze's plan depends only on the slowest pair: changing the node's bandwidth changes
    nothing in its plan, while NEST's plan moves."""
    fast, slow = phaze_problem(bw0=400), phaze_problem(bw0=6)
    a, b = PhazePlanner().solve(fast), PhazePlanner().solve(slow)
    layout = [(s.first_layer, s.last_layer, s.recompute, s.devices) for s in a.stages]
    assert a.degrees() == b.degrees()
    assert layout == [(s.first_layer, s.last_layer, s.recompute, s.devices) for s in b.stages]
    n_fast, n_slow = NestPlanner().solve(fast), NestPlanner().solve(slow)
    assert (n_fast.degrees(), n_fast.rank_order) != (n_slow.degrees(), n_slow.rank_order)


def test_on_a_flat_network_every_rank_order_ties():
    """Why phaze searches one order: the flat optimum is the same with all of them."""
    problem = phaze_problem()
    flat = with_cluster(problem, flat_cluster(problem.cluster))
    every = NestPlanner().solve(flat).objective_s
    one = NestPlanner(rank_orders=["tp,cp,dp,pp"]).solve(flat).objective_s
    assert one == pytest.approx(every, rel=1e-12)


def test_phaze_equals_nest_on_a_network_that_is_flat():
    cluster = make_cluster(fanouts=(8,), bws_gbps=(50,), lat_us=(3,))
    problem = make_problem(make_spec(layers=4), cluster, global_batch=16)
    assert PhazePlanner().solve(problem).objective_s == pytest.approx(
        NestPlanner().solve(problem).objective_s, rel=1e-12
    )


# ----------------------------------------------------------------------------- megatron


def test_megatron_as_needed_takes_the_smallest_model_parallel_size_that_fits():
    """SC21 Takeaway #2: the smallest t * p that fits; every smaller one does not."""
    spec = make_spec(layers=8, hidden=512, ffn_hidden=2048, vocab=4096, seq_len=256)
    refused = infeasible = 0
    for hbm_mib in (512, 96, 48, 32):  # t * p = 1, 2, 8, nothing fits
        problem = make_problem(
            spec,
            make_cluster(fanouts=(4, 4), device=make_device(hbm_bytes=hbm_mib * 2**20)),
            global_batch=16,
        )
        planner = MegatronPlanner(tensor="as_needed")
        try:
            plan = planner.solve(problem)
        except Infeasible:
            infeasible += 1
            continue
        size = plan.tp * plan.pp
        smaller = [c for c in planner.candidates(problem) if c.tp * c.pp < size]
        assert all(not evaluate(problem, c).feasible for c in smaller)
        refused += len(smaller)
        assert plan.tp <= 4  # inside the node
    assert refused > 0 and infeasible == 1, (refused, infeasible)  # the checks above ran
    roomy = make_problem(spec, make_cluster(fanouts=(4, 4)), global_batch=16)
    assert MegatronPlanner(tensor="as_needed").solve(roomy).tp == 1
    assert MegatronPlanner().solve(roomy).tp == 4  # fill_node: as wide as the node allows


# ----------------------------------------------------------------------------- alpa


def test_alpa_submesh_shapes_are_the_papers():
    """Alpa §5 (get_submesh_choices, "all"): (1, 2^k) inside a host, (n, M) for n = 2..N."""
    assert submesh_shapes(4, 8) == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8), (4, 8)]
    assert submesh_shapes(1, 4) == [(1, 1), (1, 2), (1, 4)]


def alpa_problems():
    yield make_problem(
        make_spec(layers=6, hidden=256, ffn_hidden=1024, seq_len=128, heads=8),
        make_cluster(fanouts=(4, 4), bws_gbps=(400, 10), lat_us=(1, 20)),
        global_batch=32,
    )
    yield make_problem(
        make_spec(layers=5, heads=4),
        make_cluster(fanouts=(2, 2, 2), bws_gbps=(400, 100, 25), lat_us=(1, 5, 9)),
        global_batch=16,
    )
    tight = make_device(hbm_bytes=80 * 2**20)  # needs full recompute on the first stage
    yield make_problem(
        make_spec(layers=8, hidden=512, ffn_hidden=2048, vocab=4096, seq_len=256),
        make_cluster(fanouts=(4, 2), device=tight),
        global_batch=16,
    )


@pytest.mark.parametrize("index", range(3))
def test_alpa_stages_are_equal_sub_meshes_covering_the_cluster(index):
    problem = list(alpa_problems())[index]
    plan = AlpaPlanner().solve(problem)
    per_host = problem.cluster.levels[0].fanout
    size = plan.tp * plan.dp
    shapes = submesh_shapes(problem.cluster.num_devices // per_host, per_host)
    assert size in {h * m for h, m in shapes}
    assert plan.devices_used == problem.cluster.num_devices  # the sub-meshes cover the cluster
    for stage in plan.stages:
        ids = sorted(stage.device_ids)
        assert ids == list(range(ids[0], ids[0] + size))  # contiguous
        if size < per_host:
            assert ids[0] // per_host == ids[-1] // per_host  # inside one host
        else:
            assert ids[0] % per_host == 0  # whole hosts
        assert plan.tp <= per_host and per_host % plan.tp == 0  # tensor ranks inside a host


@pytest.mark.parametrize("index", range(3))
def test_alpa_stage_costs_equal_the_evaluator_on_the_two_level_view(index):
    """Alpa's 'profiler' is the shared cost model: per-stage f + b and memory fit agree with
    evaluate() on the two-level view for random partitions and modes."""
    problem = list(alpa_problems())[index]
    view = with_cluster(problem, two_level_cluster(problem.cluster))
    rng = np.random.default_rng(index)
    alpa = AlpaPlanner()
    configs = list(alpa.configurations(problem))
    n = problem.num_layers
    for k in rng.choice(len(configs), size=min(6, len(configs)), replace=False):
        _, config = configs[k]
        stages = config.pp
        cuts = sorted(rng.choice(np.arange(1, n), size=stages - 1, replace=False))
        bounds = [0, *cuts, n]
        modes = [Recompute(rng.choice(["none", "full"])) for _ in range(stages)]
        plan = make_structured_plan(
            replace(config, cp=1, schedule=Schedule.ONE_F_ONE_B, rank_order=MEGATRON_RANK_ORDER),
            layer_counts=[bounds[r + 1] - bounds[r] for r in range(stages)],
            recompute=modes,
            num_microbatches=config.num_microbatches(problem.training.global_batch),
            sequence_parallel=problem.training.sequence_parallel,
        )
        report = evaluate(view, plan)
        both = StageCosts(view, config, (Recompute.NONE, Recompute.FULL))
        for r in range(stages):
            i, j, mode = bounds[r], bounds[r + 1] - 1, modes[r]
            fits = report.ranks[r].memory.fits
            t, _ = StageCosts(view, config, (mode,)).stage(stages - r)
            if fits:
                assert t[i, j] == pytest.approx(report.stages[r].time_s, rel=1e-9)
            else:
                assert t[i, j] == float("inf")
            best, _ = both.stage(stages - r)
            assert best[i, j] <= t[i, j]  # the cheapest mode that fits


def brute_force_alpa(costs: StageCosts, n_layers: int, stages: int, m: int):
    """min over partitions of sum t + (m - 1) max t (each stage its cheapest fitting mode)."""
    tables = [costs.stage(stages - r)[0] for r in range(stages)]
    best = float("inf")
    for cuts in combinations(range(1, n_layers), stages - 1):
        bounds = (0, *cuts, n_layers)
        times = [tables[r][bounds[r], bounds[r + 1] - 1] for r in range(stages)]
        if all(np.isfinite(times)):
            best = min(best, sum(times) + (m - 1) * max(times))
    return best


@pytest.mark.parametrize("index", range(3))
def test_alpa_inter_op_dp_is_exact_for_its_objective(index):
    """Alpa's t_max enumeration with our added stops finds the brute-force minimum of
    sum t + (B - 1) max t for every uniform configuration."""
    problem = list(alpa_problems())[index]
    view = with_cluster(problem, two_level_cluster(problem.cluster))
    n, n_dev = problem.num_layers, problem.cluster.num_devices
    planner = AlpaPlanner()
    modes = (Recompute.NONE, Recompute.FULL)
    for shape, config in planner.configurations(problem):
        stages = config.pp
        costs = StageCosts(view, config, modes)
        choice = StageChoice(size=shape[0] * shape[1], cost=lambda s, d, c=costs: c.stage(s))
        tables: dict = {}
        free = inter_op_dp(n, n_dev, [choice], tables, float("inf"))
        expected = brute_force_alpa(costs, n, stages, costs.m)
        if free is None:
            assert expected == float("inf")
            continue
        stats = {"t_max_tried": 0}
        found = planner._t_max_loop(n, n_dev, choice, tables, free, costs.m, float("inf"), stats)
        assert found is not None
        assert found[0] == pytest.approx(expected, rel=1e-12)


def test_alpa_uses_recompute_only_where_memory_needs_it():
    problem = list(alpa_problems())[2]
    plan = AlpaPlanner().solve(problem)
    assert evaluate(problem, plan).feasible
    assert [s.recompute for s in plan.stages] == [Recompute.FULL, Recompute.NONE]
    without = AlpaPlanner(recompute=["none"]).solve(problem)
    # more stage choices never make Alpa's own objective worse; here they make it better
    assert plan.search["alpa_objective_s"] < without.search["alpa_objective_s"]
    roomy = AlpaPlanner().solve(list(alpa_problems())[0])
    assert all(s.recompute is Recompute.NONE for s in roomy.stages)


def test_alpa_rejects_zero_3_and_bad_modes():
    problem = list(alpa_problems())[0]
    with pytest.raises(UserError, match="ZeRO 0, 1 and 2"):
        AlpaPlanner(zero_stages=[3]).solve(problem)
    with pytest.raises(UserError, match="recompute"):
        AlpaPlanner(recompute=["sometimes"]).solve(problem)


# ----------------------------------------------------------------------------- mcmc


def mcmc_problem():
    spec = make_spec(layers=8, hidden=512, ffn_hidden=2048, vocab=4096, seq_len=256)
    cluster = make_cluster(fanouts=(4, 4), bws_gbps=(400, 25), lat_us=(1, 10))
    return make_problem(spec, cluster, global_batch=64, microbatch_sizes=(1, 2, 4))


def test_mcmc_improves_over_its_start_and_respects_its_budget():
    problem = mcmc_problem()
    for start in ("data_parallel", "megatron"):
        plan = MCMCPlanner(start=start, max_evaluations=300, stop_early=False).solve(problem)
        s = plan.search
        assert s["evaluations"] == 300 == plan.n_evaluations
        assert s["stopped_by"] == "evaluations"
        assert s["best_flat_objective_s"] < s["start_flat_objective_s"]
    early = MCMCPlanner(max_evaluations=5000, min_evaluations=50).solve(problem)
    assert early.search["stopped_by"] == "no_improvement"
    assert early.search["evaluations"] >= 2 * early.search["best_found_at_evaluation"]


def test_mcmc_same_seed_same_plan_and_the_seconds_cap_is_recorded():
    problem = mcmc_problem()
    a = MCMCPlanner(seed=3, max_evaluations=200).solve(problem)
    b = MCMCPlanner(seed=3, max_evaluations=200).solve(problem)
    assert [s.devices for s in a.stages] == [s.devices for s in b.stages]
    assert (a.objective_s, a.search["evaluations"]) == (b.objective_s, b.search["evaluations"])
    capped = MCMCPlanner(max_seconds=1e-9).solve(problem)
    assert capped.search["stopped_by"] == "seconds"
    assert capped.search["evaluations"] == 1  # only the start was scored


def test_mcmc_searches_the_flat_network_and_is_scored_on_the_real_one():
    problem = mcmc_problem()
    plan = MCMCPlanner(max_evaluations=100).solve(problem)
    flat = with_cluster(problem, flat_cluster(problem.cluster))
    assert plan.search["best_flat_objective_s"] == pytest.approx(
        evaluate(flat, plan).iteration_time_s, rel=1e-12
    )
    # the flat view puts every pair at the slowest pair's bandwidth and latency: the real
    # network, faster inside a node, prices the same plan lower
    assert plan.objective_s < plan.search["best_flat_objective_s"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_evaluations": 0}, "max_evaluations"),
        ({"temperature": 0}, "temperature"),
        ({"start": "random"}, "start"),
        ({"zero_stages": [5]}, "zero_stages"),
    ],
)
def test_mcmc_bad_hyper_parameters(kwargs, match):
    with pytest.raises(UserError, match=match):
        MCMCPlanner(**kwargs).solve(mcmc_problem())


def test_mcmc_reports_memory_when_nothing_fits():
    spec = make_spec(layers=2, hidden=1024, ffn_hidden=4096, heads=8)
    problem = make_problem(
        spec, make_cluster(fanouts=(2,), device=make_device(hbm_bytes=2**20)), global_batch=4
    )
    with pytest.raises(Infeasible) as info:
        MCMCPlanner(max_evaluations=50).solve(problem)
    assert info.value.min_memory_bytes > problem.cluster.device.hbm_bytes
    assert "GiB" in info.value.reason
