"""The space of ``nest`` / ``brute`` / ``cpsat`` / ``milp`` against an independent enumeration.

:mod:`tests.space_oracle` enumerates the structured space from its written rules without
importing :mod:`nest.dp.space`; these tests compare the two point by point (a point: the
configuration without its rank order, and the placement its rank order produces), check the
space's claim about which rank orders are duplicates by computing the placements, and check that
``nest``'s optimum is the minimum of ``evaluate`` over every plan the oracle's space holds.
"""

import math
import random
from collections import Counter
from dataclasses import replace
from itertools import product

import pytest

from nest.core.axes import Axis, Optimizer, Recompute
from nest.core.model import ModelSpec

from .conftest import make_cluster, make_device, make_problem
from .space_oracle import (
    ALL_ORDERS,
    ORDER_STRINGS,
    divisors,
    grid,
    oracle_space,
    placement,
    plan_count,
    plans,
    space_points,
)


def tiny_problem(rng: random.Random, *, max_devices: int = 16):
    """A random model on a random hierarchy of at most ``max_devices`` devices: degrees that
    divide some of heads / KV heads / FFN / sequence / experts and not others, batches with odd
    factors (6, 12), microbatch sizes that divide the batch."""
    while True:
        fanouts = tuple(rng.choice([2, 2, 3, 4]) for _ in range(rng.randint(1, 3)))
        if math.prod(fanouts) <= max_devices:
            break
    moe = rng.random() < 0.3
    heads = rng.choice([2, 4, 6, 8])
    spec = ModelSpec(
        name="tiny",
        hidden=heads * 16,
        layers=rng.randint(1, 6),
        heads=heads,
        kv_heads=rng.choice([d for d in divisors(heads)]),
        ffn_hidden=rng.choice([96, 128, 256]),
        vocab=rng.choice([256, 1000]),
        seq_len=rng.choice([12, 32, 48, 64]),
        activation=rng.choice(["gelu", "swiglu"]),
        num_experts=rng.choice([2, 4, 6]) if moe else 1,
        top_k=2 if moe else 1,
    )
    gb = rng.choice([2, 4, 6, 8, 12])
    problem = make_problem(
        spec,
        make_cluster(fanouts=fanouts, device=make_device()),
        global_batch=gb,
        microbatch_sizes=tuple(b for b in (1, 2, 3) if gb % b == 0),
        optimizer=rng.choice([Optimizer.ADAM, Optimizer.SGD]),
        sequence_parallel=rng.random() < 0.8,
    )
    return problem


def random_options(rng: random.Random, n_devices: int) -> dict:
    """A random restriction of the space, as the planners take it (values that the rules would
    reject anyway included: a restriction intersects the space)."""
    opts: dict = {}
    for key in ("tp", "cp", "ep", "pp"):
        if rng.random() < 0.3:
            k = rng.randint(1, min(3, n_devices))
            opts[key] = sorted(rng.sample(range(1, n_devices + 1), k))
    if rng.random() < 0.5:
        opts["zero_stages"] = sorted(rng.sample([0, 1, 2, 3], rng.randint(1, 3)))
    if rng.random() < 0.5:
        given = rng.sample(ORDER_STRINGS, rng.randint(1, 4))
        # the artifact's short form: axes left out follow in Megatron order
        opts["rank_orders"] = [o.replace(",cp", "") if rng.random() < 0.2 else o for o in given]
    opts["schedules"] = rng.choice([["1f1b"], ["interleaved"], ["1f1b", "interleaved"]])
    if rng.random() < 0.3:
        opts["virtual_stages"] = sorted(rng.sample([2, 3, 4], rng.randint(1, 2)))
    return opts


def _space_configs(problem, options):
    from nest.dp.space import SpaceOptions, configurations

    return list(configurations(problem, SpaceOptions(**options)))


def _compare(problem, options, what):
    configs = _space_configs(problem, options)
    got = space_points(configs)
    twice = [p for p, k in Counter(got).items() if k > 1]
    assert not twice, (what, "the space holds a placement twice", twice[:1])
    want = oracle_space(problem, options)
    have = set(got)
    missing = [p[0] for p in want if p not in have]
    extra = [p[0] for p in have if p not in want]
    assert not missing, (what, f"{len(missing)} points missing from the space", missing[:3])
    assert not extra, (what, f"{len(extra)} points the rules do not allow", extra[:3])
    for config, point in zip(configs, got, strict=True):
        # the order kept is one of those that place the devices so, and the first of them
        assert config.rank_order == want[point][0], (what, config, want[point])
    return len(configs)


def test_space_equals_the_oracle_on_random_hierarchies():
    """On 150 random tiny problems (1-16 devices, 1-3 levels), with the whole space and with a
    random restriction each, the space's configurations are exactly the oracle's points: none
    missing, none extra, no placement twice, the first order of each placement kept."""
    sizes = []
    for seed in range(150):
        rng = random.Random(seed)
        problem = tiny_problem(rng)
        sizes.append(_compare(problem, {}, (seed, "whole space")))
        options = random_options(rng, problem.cluster.num_devices)
        _compare(problem, options, (seed, options))
    assert sum(sizes) > 5000, sum(sizes)


def test_the_oracle_reads_rank_orders_as_the_plan_builder_does():
    """The oracle's own mixed-radix reading of a rank order is :func:`nest.core.plan.place`'s
    (the function every structured plan is built with), for every order with tp innermost
    and degrees 1-3: the comparison above is about the plans the planners return."""
    from nest.core.plan import place

    for tp, cp, dp, pp in product(range(1, 4), repeat=4):
        for order in ALL_ORDERS:
            want = place(tp=tp, cp=cp, dp=dp, pp=pp, rank_order=order)
            assert (grid(tp, cp, dp, pp, order) == want).all(), (tp, cp, dp, pp, order)


def test_rank_orders_are_duplicates_exactly_when_they_place_every_group_alike():
    """The space's claim (nest/dp/space.py): two orders with ``tp`` innermost place every device
    alike iff their axes of degree > 1 come in the same order. Checked against the groups each
    order forms (tp, cp, ep, dense and expert dp per pipeline rank, and the pipelines), for all
    degrees 1-3 and 4 and every ep dividing dp x cp: orders with the same key form the same
    groups, orders with different keys differ in at least one group."""
    checked = 0
    for tp, cp, dp, pp in product((1, 2, 3, 4), repeat=4):
        if tp * cp * dp * pp > 64:
            continue
        degree = {Axis.TP: tp, Axis.CP: cp, Axis.DP: dp, Axis.PP: pp}
        for ep in divisors(dp * cp):
            by_placement: dict = {}
            for order in ALL_ORDERS:
                by_placement.setdefault(placement(grid(tp, cp, dp, pp, order), ep), set()).add(
                    tuple(a for a in order if degree[a] > 1)
                )
            # same key -> same placement, different key -> different placement
            keys = [k for group in by_placement.values() for k in group]
            assert all(len(group) == 1 for group in by_placement.values()), (tp, cp, dp, pp, ep)
            assert len(keys) == len(set(keys)), (tp, cp, dp, pp, ep)
            checked += 1
    assert checked > 200, checked


def test_space_equals_the_oracle_on_graph_clusters():
    """The space depends on the network only through its device count, so a graph cluster's
    space is its device count's: checked on the first 20 random graph cases of the graph suite
    (tests/graphcase.py, 2-16 devices), whole space and the case's own restriction."""
    from .graphcase import graph_case

    for seed in range(20):
        problem, options = graph_case(seed)
        _compare(problem, {}, (seed, "graph, whole space"))
        _compare(problem, options, (seed, options))


HBM_GIB = (0.001, 0.002, 0.005, 0.01, 0.05, 1)
"""Device memories of the exact cases: from nothing fits to everything fits."""


def exact_case(seed: int, max_plans: int = 1000):
    """A tiny problem (2-8 devices, 1-6 blocks, memory from tight to ample) and a random
    restriction whose oracle space holds 1 .. ``max_plans`` plans (a third of them interleaved
    only, on two pipeline ranks), with the points of that space (first order of each placement).
    """
    rng = random.Random(seed)
    for _ in range(200):
        problem = tiny_problem(rng, max_devices=8)
        problem = replace(
            problem,
            cluster=make_cluster(
                fanouts=tuple(lv.fanout for lv in problem.cluster.levels),
                device=make_device(
                    hbm_bytes=rng.choice([0.001, 0.002, 0.005, 0.01, 0.05, 1]) * 2**30
                ),
            ),
        )
        options = random_options(rng, problem.cluster.num_devices)
        options["recompute"] = sorted(rng.sample([r.value for r in Recompute], rng.randint(1, 2)))
        if rng.random() < 0.33:
            options.update(schedules=["interleaved"], pp=[2])
        space = oracle_space(problem, options)
        points = [(config, orders[0]) for (config, _), orders in space.items()]
        count = sum(plan_count(problem, c, options["recompute"]) for c, _ in points)
        if 0 < count <= max_plans:
            return problem, options, points
    raise AssertionError("no exact case drawn")


def test_nest_is_the_minimum_of_evaluate_over_the_oracles_plans():
    """``nest``'s optimum equals, to 1e-9, the least ``evaluate`` of every plan of the oracle's
    space (every point, every partition or the even chunks, every recompute mode per stage), on
    40 tiny restricted problems; when no plan fits, ``nest`` reports the same infeasibility and
    the same smallest peak memory. Nothing of the DP (its space, tables, bounds) is used to
    enumerate or score. And the space's ZeRO claim: with ``dp * cp == 1`` stages 1-3 cost what
    stage 0 costs (time and peak memory) when no expert is replicated either, so keeping stage 0
    alone loses nothing."""
    from nest.core.errors import Infeasible
    from nest.cost import evaluate
    from nest.dp.planner import NestPlanner

    solved = infeasible = zero_checked = 0
    for seed in range(40):
        problem, options, points = exact_case(seed)
        best_s = best_peak = math.inf
        for config, order in points:
            for k, plan in enumerate(plans(problem, config, order, options["recompute"])):
                report = evaluate(problem, plan)
                if report.feasible:
                    best_s = min(best_s, report.iteration_time_s)
                else:
                    best_peak = min(best_peak, report.peak_memory_bytes)
                if k == 0 and config.dp * config.cp == 1 and config.expert_dp == 1:
                    for zero in (1, 2, 3):
                        other = evaluate(
                            problem, replace(plan, config=replace(plan.config, zero_stage=zero))
                        )
                        assert other.iteration_time_s == report.iteration_time_s, (seed, zero)
                        assert other.peak_memory_bytes == report.peak_memory_bytes, (seed, zero)
                    zero_checked += 1
        try:
            # the oracle enumerates the cluster as given; the union with its segment view is
            # tests/test_segment.py's
            found = NestPlanner(**options, segments=False).solve(problem)
        except Infeasible as exc:
            assert best_s == math.inf, (seed, options, best_s)
            assert exc.min_memory_bytes == pytest.approx(best_peak, rel=1e-9), (seed, options)
            infeasible += 1
            continue
        assert found.objective_s == pytest.approx(best_s, rel=1e-9), (seed, options)
        solved += 1
    assert solved >= 20 and infeasible >= 3 and zero_checked >= 20, (
        solved,
        infeasible,
        zero_checked,
    )


def test_the_random_suites_draw_from_every_order_the_space_allows():
    """tests/randomcase.py's :data:`RANK_ORDERS` (what the nest == brute suites draw from) are
    the oracle's six orders and exactly the orders the space yields when every axis but tp has
    degree > 1 (before, the suites drew from four: ``tp,dp,cp,pp`` and ``tp,pp,cp,dp`` were in
    no case)."""
    from .randomcase import RANK_ORDERS

    assert sorted(RANK_ORDERS) == sorted(ORDER_STRINGS)
    spec = ModelSpec(name="t", hidden=64, layers=2, heads=4, ffn_hidden=128, vocab=256, seq_len=64)
    problem = make_problem(spec, make_cluster(fanouts=(2, 4)), global_batch=8)
    options = dict(tp=[1], cp=[2], pp=[2], schedules=["1f1b"])
    used = {",".join(c.rank_order) for c in _space_configs(problem, options) if c.dp == 2}
    assert used == set(RANK_ORDERS), used
