"""Segments (nest/core/segment.py): a power-of-two share of every scale-up domain.

The segment view of a cluster renames devices without changing any level split, so a plan of
the view costs on the cluster what it costs on the view; ``nest`` searches the union of the
structured space on the cluster and on its view, and equals brute force over that union."""

import dataclasses
import random

import numpy as np
import pytest

from baselines.brute import BrutePlanner, count_plans
from nest.core.errors import Infeasible, UserError
from nest.core.problem import Problem
from nest.core.segment import on_cluster, real_ids, segment_size, segment_view
from nest.cost import evaluate
from nest.dp.planner import NestPlanner
from nest.dp.space import SpaceOptions

from .conftest import make_cluster, make_problem, make_spec
from .randomcase import random_planner
from .test_nest_dp import tiny_case


def test_segment_size_is_the_largest_power_of_two_below():
    assert [segment_size(f) for f in (1, 2, 3, 6, 8, 9, 72, 64)] == [1, 2, 2, 4, 8, 8, 64, 64]


def test_gb200_view_uses_64_of_72_gpus_per_rack():
    """16 NVL72 racks (72 x 8 x 2 = 1152 GPUs): 64 per rack = 16 of the 18 compute trays of 4
    GPUs (the ModelZoo's SEGMENT=16), 1024 GPUs; view GPU 64 is rack 1's first GPU (id 72), view
    GPU 1023 rack 15's 64th (15 x 72 + 63 = 1143)."""
    cluster = make_cluster(fanouts=(72, 8, 2))
    view = segment_view(cluster)
    assert [lv.fanout for lv in view.levels] == [64, 8, 2]
    assert view.num_devices == 1024
    assert real_ids([0, 63, 64, 130, 1023], view, cluster).tolist() == [0, 63, 72, 146, 1143]
    # every id of the view lands in the same rack at the same slot, none twice
    ids = real_ids(range(1024), view, cluster)
    assert len(set(ids.tolist())) == 1024
    view_ids = np.arange(1024)
    assert (ids // 72 == view_ids // 64).all() and (ids % 72 == view_ids % 64).all()


def test_no_view_where_nothing_is_rounded():
    """A power-of-two domain, or a domain that is the top level or the only one (its idle
    devices are already in the space), has no view."""
    assert segment_view(make_cluster(fanouts=(8, 4))) is None
    assert segment_view(make_cluster(fanouts=(72,))) is None
    # one rack under levels of fanout 1 (cluster.levels.1.fanout=1): the same single domain
    assert segment_view(make_cluster(fanouts=(72, 1, 1))) is None


def test_level_splits_and_boundaries_are_kept():
    """Every pair of view devices has the same lowest common level as its image, and every
    group the same level split (nest/core/hierarchy.py)."""
    cluster = make_cluster(fanouts=(6, 3, 2))
    view = segment_view(cluster)
    rng = random.Random(0)
    for _ in range(200):
        group = rng.sample(range(view.num_devices), rng.randint(1, 8))
        image = real_ids(group, view, cluster).tolist()
        assert cluster.group_factors(image) == view.group_factors(group)
        a, b = group[0], group[-1]
        assert cluster.common_level(*image[:1], image[-1]) == view.common_level(a, b)


def _with_domain(problem, fanout: int, rng: random.Random) -> Problem:
    """The problem on the same levels with a non-power-of-two scale-up domain of ``fanout``
    devices (a second, slower level added where the cluster had one)."""
    levels = list(problem.cluster.levels)
    levels[0] = dataclasses.replace(levels[0], fanout=fanout)
    if len(levels) == 1:
        slow = levels[0].bw_bytes_per_s * rng.uniform(0.05, 0.5)
        levels.append(dataclasses.replace(levels[0], name="l1", fanout=2, bw_bytes_per_s=slow))
    while len(levels) > 2 and fanout * 2 * len(levels) > 24:
        levels.pop()
    cluster = dataclasses.replace(problem.cluster, levels=tuple(levels))
    return Problem(model=problem.model, cluster=cluster, training=problem.training)


def _brute_union(problem, options):
    """Brute force's best over the plans on the cluster and on its segment view (renamed):
    (objective, need) with need the least memory when nothing fits."""
    view = segment_view(problem.cluster)
    best, need = float("inf"), float("inf")
    targets = [(problem, None)]
    if view is not None:  # a single domain has none: the union is the cluster's space
        targets.append((dataclasses.replace(problem, cluster=view), view))
    for target, on in targets:
        try:
            plan = BrutePlanner(**options).solve(target)
        except Infeasible as exc:
            need = min(need, exc.min_memory_bytes)
            continue
        except UserError:  # no configuration of the space on the smaller view
            continue
        if on is not None:  # the renamed plan costs the same on the cluster
            moved = on_cluster(plan, view, problem.cluster)
            assert evaluate(problem, moved).iteration_time_s == pytest.approx(
                plan.objective_s, rel=1e-9
            )
        best = min(best, plan.objective_s)
    return best, need


def test_nest_equals_brute_force_over_the_union_on_random_problems():
    """On 40 random small problems whose scale-up domain holds 3, 5 or 6 devices, ``nest``
    (segments on) equals brute force's best over the cluster's structured space and its
    segment view's (1e-9), or both find nothing and agree on the least memory; the returned
    plan's evaluation on the cluster is its objective. The view wins on some of them."""
    agreed = view_wins = 0
    for seed in range(40):
        rng = random.Random(1000 + seed)
        problem, options = tiny_case(seed)
        problem = _with_domain(problem, rng.choice([3, 5, 6]), rng)
        if count_plans(problem, SpaceOptions(**options)) > 4000:
            continue
        oracle_s, oracle_need = _brute_union(problem, options)
        try:
            plan = NestPlanner(**options).solve(problem)
        except Infeasible as exc:
            assert oracle_s == float("inf"), (seed, options)
            assert exc.min_memory_bytes == pytest.approx(oracle_need, rel=1e-9), seed
            continue
        assert plan.objective_s == pytest.approx(oracle_s, rel=1e-9), (seed, options)
        report = evaluate(problem, plan)
        assert report.iteration_time_s == pytest.approx(plan.objective_s, rel=1e-12)
        assert report.devices_idle == problem.cluster.num_devices - plan.devices_used
        agreed += 1
        view_wins += plan.search.get("segment_chosen", False)
    assert agreed >= 20 and view_wins >= 3, (agreed, view_wins)


def test_top_k_equals_brute_force_over_the_union():
    """``top_k = 3``: nest's three configurations and values equal brute force's best three
    configurations of the union (each configuration at the faster of its two spaces' plans),
    on random small problems with a domain of 3 or 6 devices."""
    compared = 0
    for seed in range(40, 70):
        rng = random.Random(2000 + seed)
        problem, options = tiny_case(seed)
        problem = _with_domain(problem, rng.choice([3, 6]), rng)
        if count_plans(problem, SpaceOptions(**options)) > 3000:
            continue
        view = segment_view(problem.cluster)
        best: dict = {}
        targets = (
            [problem] if view is None else [problem, dataclasses.replace(problem, cluster=view)]
        )
        for target in targets:
            try:
                plans = BrutePlanner(top_k=3, **options).solve_ranked(target)
            except (Infeasible, UserError):
                continue
            for plan in plans:
                key = plan.config.unordered()
                best[key] = min(best.get(key, float("inf")), plan.objective_s)
        oracle = sorted(best.values())[:3]
        try:
            found = NestPlanner(top_k=3, **options).solve_ranked(problem)
        except Infeasible:
            assert not oracle, seed
            continue
        assert [p.objective_s for p in found] == pytest.approx(oracle, rel=1e-9), seed
        compared += 1
    assert compared >= 10, compared


def test_view_plan_costs_the_same_on_the_cluster():
    """Random structured plans of the view of a (3, 2, 2) cluster, renamed: the evaluator gives
    the same iteration time and memory on the cluster, and 3 more idle devices (one per
    domain)."""
    checked = 0
    for seed in range(30):
        rng = random.Random(seed)
        base, _ = tiny_case(seed)
        problem = _with_domain(base, 3, rng)
        view = segment_view(problem.cluster)
        if view is None:  # a single domain (upper levels of fanout 1): nothing to rename
            continue
        checked += 1
        sub = dataclasses.replace(problem, cluster=view)
        plan = random_planner(rng, sub).solve(sub)
        on_view = evaluate(sub, plan)
        on_real = evaluate(problem, on_cluster(plan, view, problem.cluster))
        assert on_real.iteration_time_s == pytest.approx(on_view.iteration_time_s, rel=1e-12)
        assert on_real.peak_memory_bytes == pytest.approx(on_view.peak_memory_bytes, rel=1e-12)
        spare = problem.cluster.num_devices - view.num_devices
        assert on_real.devices_idle == on_view.devices_idle + spare
    assert checked >= 20, checked


def test_tensor_pairs_stay_inside_a_domain_of_three():
    """Two domains of 3 devices at 400 GB/s joined at 25 GB/s, tp=2 forced, 64 sequences: on
    the cluster as given two data-parallel tensor pairs are devices (0, 1) and (2, 3), one pair
    across the slow link, and one pair alone is faster; the view puts the pairs on (0, 1) and
    (3, 4), one per domain, and halves the time; devices 2 and 5 stay idle."""
    cluster = make_cluster(fanouts=(3, 2), bws_gbps=(400, 25))
    problem = make_problem(make_spec(layers=2), cluster, global_batch=64, microbatch_sizes=(1,))
    options = dict(tp=[2], pp=[1], zero_stages=[0], recompute=["none"], schedules=["1f1b"])
    given = NestPlanner(segments=False, **options).solve(problem)
    plan = NestPlanner(**options).solve(problem)
    assert given.dp == 1 and plan.dp == 2
    assert plan.search["segment_chosen"]
    assert plan.objective_s < 0.6 * given.objective_s
    assert sorted(plan.stages[0].device_ids) == [0, 1, 3, 4]
    assert evaluate(problem, plan).devices_idle == 2


def test_segments_setting_is_checked():
    with pytest.raises(UserError, match="solver.segments"):
        NestPlanner(segments="yes")


def test_megatron_export_keeps_the_segment_placement():
    """The segment plan of the (3, 2) example exports as planned: Megatron's tp-cp-dp-pp order
    over the devices it uses ([0, 1, 3, 4], rank r on the r-th) is its placement, so the
    exported plan is the same plan at the same time, and the notes name the allocation."""
    from nest.export.megatron import export_megatron

    cluster = make_cluster(fanouts=(3, 2), bws_gbps=(400, 25))
    problem = make_problem(make_spec(layers=2), cluster, global_batch=64, microbatch_sizes=(1,))
    options = dict(tp=[2], pp=[1], zero_stages=[0], recompute=["none"], schedules=["1f1b"])
    plan = NestPlanner(rank_orders=["tp-cp-dp-pp"], **options).solve(problem)
    out = export_megatron(problem, plan)
    assert out.exported_iteration_time_s == pytest.approx(plan.objective_s, rel=1e-12)
    notes = " ".join(out.notes)
    assert "the r-th device the plan uses, in increasing id (0-1,3-4)" in notes
    assert "allocate the first 2 devices of every l0 x3 domain" in notes
