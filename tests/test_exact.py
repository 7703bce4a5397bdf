"""The exact planners (``cpsat``, ``milp``): oracle tests against ``nest`` and brute force.

Restricted mode is exactly the DP's space, so on every instance ``nest == cpsat == milp ==
brute`` (1e-6 relative: CP-SAT's integer ticks are within 6e-7, HiGHS's tolerances within
1e-9 here) and all agree on infeasibility. General mode searches every placement, so it is never
worse than restricted, and it equals a brute force over every injective rank -> device map.
"""

import random
from itertools import permutations, product

import numpy as np
import pytest

from baselines.brute import BrutePlanner, partitions
from nest.core.axes import Recompute, Schedule
from nest.core.errors import Infeasible, SolverTimeout, UserError
from nest.core.plan import Plan, make_structured_plan
from nest.cost import evaluate
from nest.dp.planner import NestPlanner
from nest.dp.space import SpaceOptions, configurations, interleaved_chunks
from nest.exact.placements import orderly_assignments, placement_classes
from nest.exact.planner import ExactPlanner

from .conftest import make_cluster, make_problem, make_spec
from .test_nest_dp import tiny_case
from .test_nest_interleaved import interleaved_case

REL = 1e-6


def exact(backend: str, options: dict, **kw) -> ExactPlanner:
    return ExactPlanner(name=backend, backend=backend, **options, **kw)


def solve_or_none(planner, problem):
    try:
        return planner.solve(problem)
    except Infeasible:
        return None


def check_exact_plan(problem, plan):
    report = evaluate(problem, plan)
    assert report.feasible
    if plan.search["backend"] == "cpsat":
        # the solver's own objective (integer ticks of its linear model) prices the plan as the
        # evaluator does, to within the rounding the model declares
        model_s = plan.search["objective_ticks"] * plan.search["tick_s"]
        assert abs(model_s - plan.objective_s) <= plan.search["rounding_error_s"], (
            model_s,
            plan.objective_s,
        )
    assert plan.status == "optimal"
    assert plan.bound_s is not None and plan.bound_s <= plan.objective_s * (1 + 1e-12)
    assert 0.0 <= plan.search["gap"] <= REL


def _agree(problem, options) -> Plan | None:
    """Solve with brute, nest, cpsat and milp (restricted); assert they agree; brute's plan."""
    values = {}
    for name, planner in (
        ("brute", BrutePlanner(**options)),
        ("nest", NestPlanner(**options)),
        ("cpsat", exact("cpsat", options)),
        ("milp", exact("milp", options)),
    ):
        plan = solve_or_none(planner, problem)
        if plan is not None and name in ("cpsat", "milp"):
            check_exact_plan(problem, plan)
        values[name] = plan
    if values["brute"] is None:
        assert all(p is None for p in values.values()), (options, values)
        return None
    best = values["brute"].objective_s
    got = {k: p.objective_s for k, p in values.items() if p is not None}
    assert len(got) == 4, (options, got)
    for name, value in got.items():
        assert value == pytest.approx(best, rel=REL), (name, got, options)
    return values["brute"]


def test_restricted_equals_nest_and_brute_on_200_random_problems():
    """``nest == cpsat == milp == brute`` (restricted) on 200 random small problems (2-16
    devices, 1-3 levels, 3-8 layers), infeasible ones among them; a disagreement prints the
    instance's options and every solver's value."""
    agreed = infeasible = 0
    for seed in range(200):
        problem, options = tiny_case(seed)
        try:
            best = _agree(problem, options)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from None
        agreed += best is not None
        infeasible += best is None
    assert agreed >= 120 and infeasible >= 5, (agreed, infeasible)


def test_restricted_equals_nest_and_brute_where_interleaved_competes():
    """The same on 40 problems whose space holds interleaved plans (per-chunk recompute);
    interleaved plans win some of them."""
    assert _interleaved_wins() >= 5


def _interleaved_wins() -> int:
    """:func:`_agree` on the 40 interleaved problems; how many an interleaved plan wins."""
    won = 0
    for seed in range(1000, 1040):
        problem, options = interleaved_case(seed)
        try:
            best = _agree(problem, options)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from None
        won += best is not None and best.schedule is Schedule.INTERLEAVED
    return won


def test_reduced_interleaved_choices_keep_the_optimum(monkeypatch):
    """Where a rank's per-chunk modes multiply past ``FULL_PRODUCT_LIMIT`` its choices are the
    dominance-reduced options of :func:`nest.dp.interleaved.rank_options` (nest/exact/tables.py
    docstring: a dropped assignment always has a kept one that fits and is no worse). Forced on
    every rank (limit 1), the exact models still equal brute force and nest on the 40
    interleaved problems, and on at least one the reduced choices are fewer."""
    from nest.exact import tables

    monkeypatch.setattr(tables, "FULL_PRODUCT_LIMIT", 1)
    built = []
    original = tables._reduced_rank
    monkeypatch.setattr(tables, "_reduced_rank", lambda *a: built.append(1) or original(*a))
    won = _interleaved_wins()
    assert built and won >= 5, (len(built), won)


def test_many_chunks_per_rank_build_and_match_nest(monkeypatch):
    """Llama-2 7B's 34 chain layers on 8 H100 (interleaved ranks of up to 17 chunks, 5 modes
    each): the exact models build from the reduced choices and find nest's optimum (listing
    every assignment, the tables did not finish in 10 minutes)."""
    from nest.app.config import build_cluster, build_model_spec, load_preset
    from nest.core.layers import AnalyticModel
    from nest.core.problem import Problem, Training
    from nest.exact import tables

    widest = []
    original = tables._reduced_rank
    monkeypatch.setattr(
        tables,
        "_reduced_rank",
        lambda sm, r, m: widest.append(sm.config.virtual_stages) or original(sm, r, m),
    )

    spec = build_model_spec(load_preset("model", "llama2_7b"))
    cluster = build_cluster({**load_preset("cluster", "dgx_8x8"), "devices": 8})
    training = Training(global_batch=128, microbatch_sizes=(1, 2))
    problem = Problem(
        model=AnalyticModel(spec, overlap=training.overlap, precision=training.numerics),
        cluster=cluster,
        training=training,
    )
    nest_plan = NestPlanner().solve(problem)
    for backend in ("cpsat", "milp"):
        plan = exact(backend, {}).solve(problem)
        check_exact_plan(problem, plan)
        assert plan.objective_s == pytest.approx(nest_plan.objective_s, rel=REL), backend
    assert max(widest) >= 8  # ranks of 8 chunks and more took the reduced choices


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
def test_whole_model_without_the_dp_equals_brute(backend):
    """With no DP bound and no hint the model is the whole space, built without ``nest``: it
    still finds brute force's optimum (40 problems, 37 of them feasible)."""
    compared = 0
    for seed in range(200, 240):
        problem, options = tiny_case(seed)
        oracle = solve_or_none(BrutePlanner(**options), problem)
        found = solve_or_none(exact(backend, options, hint=False, prune=False), problem)
        if oracle is None:
            assert found is None, seed
            continue
        assert found.search["upper_bound_s"] is None and not found.search["hint"]
        assert found.search["groups_pruned"] < found.search["groups"]
        check_exact_plan(problem, found)
        assert found.objective_s == pytest.approx(oracle.objective_s, rel=REL), (seed, options)
        compared += 1
    assert compared >= 30, compared


def _brute_general(problem, options: dict) -> float | None:
    """The best plan over every configuration, every injective placement (all permutations, no
    symmetry), every partition and recompute mode, each through ``evaluate``."""
    space = SpaceOptions(**options)
    modes = space.recompute_modes
    n = problem.num_layers
    blocks = {i for i, ref in enumerate(problem.model.chain) if ref.kind.value == "block"}
    best, seen = None, set()
    for c in configurations(problem, space):
        key = c.unordered()  # the rank orders of one configuration are scored once
        if key in seen:
            continue
        seen.add(key)
        m = problem.training.global_batch // (c.microbatch_size * c.dp)
        splits = (
            [interleaved_chunks(n, c.pp, c.virtual_stages)]
            if c.interleaved
            else list(partitions(n, c.pp))
        )
        ranks = c.pp * c.dp * c.cp * c.tp
        for devices in permutations(range(problem.cluster.num_devices), ranks):
            grid = np.asarray(devices).reshape(c.pp, c.dp, c.cp, c.tp)
            for parts in splits:
                per_stage = [
                    modes if blocks.intersection(range(i, j + 1)) else (Recompute.NONE,)
                    for i, j in parts
                ]
                for combo in product(*per_stage):
                    plan = make_structured_plan(
                        c.unordered(),
                        layer_counts=[j - i + 1 for i, j in parts],
                        recompute=combo,
                        num_microbatches=m,
                        sequence_parallel=problem.training.sequence_parallel,
                        grid=grid,
                    )
                    report = evaluate(problem, plan)
                    if report.feasible and (best is None or report.iteration_time_s < best):
                        best = report.iteration_time_s
    return best


def small_general_case(seed: int):
    """A problem on 4 devices in 2 levels with a random network, 2-4 blocks, and a space small
    enough to enumerate every placement."""
    rng = random.Random(seed)
    fanouts = rng.choice([(2, 2), (4,), (2, 2), (1, 4)])
    if fanouts[0] == 1:
        fanouts = (2, 2)
    n_levels = len(fanouts)
    cluster = make_cluster(
        fanouts=fanouts,
        bws_gbps=tuple(rng.uniform(1, 500) for _ in range(n_levels)),
        lat_us=tuple(rng.uniform(0, 40) for _ in range(n_levels)),
    )
    spec = make_spec(layers=rng.randint(1, 3), heads=4, hidden=rng.choice([64, 256]))
    problem = make_problem(spec, cluster, global_batch=rng.choice([4, 8]))
    options = dict(
        zero_stages=[rng.choice([0, 1, 3])],
        recompute=rng.sample(["none", "full"], rng.randint(1, 2)),
        schedules=["1f1b"],
    )
    return problem, options


def test_general_equals_brute_force_over_every_placement():
    """General mode == the best plan over every injective placement of the ranks (no symmetry
    used), on 12 problems on 4 devices (all feasible); and it is never worse than the restricted
    optimum."""
    compared = 0
    for seed in range(12):
        problem, options = small_general_case(seed)
        oracle = _brute_general(problem, options)
        cp = solve_or_none(exact("cpsat", options, mode="general"), problem)
        mi = solve_or_none(exact("milp", options, mode="general"), problem)
        restricted = solve_or_none(exact("cpsat", options), problem)
        if oracle is None:
            assert cp is None and mi is None and restricted is None, seed
            continue
        check_exact_plan(problem, cp)
        check_exact_plan(problem, mi)
        whole = exact("cpsat", options, mode="general", prune=False, hint=False).solve(problem)
        assert whole.objective_s == pytest.approx(cp.objective_s, rel=REL), seed
        assert cp.rank_order is None and cp.search["placement_classes"] >= 1
        assert cp.objective_s == pytest.approx(oracle, rel=REL), (seed, options)
        assert mi.objective_s == pytest.approx(oracle, rel=REL), (seed, options)
        assert cp.objective_s <= restricted.objective_s * (1 + REL)
        compared += 1
    assert compared == 12, compared


def test_pruning_keeps_the_general_optimum_when_tensor_groups_gain_from_spreading():
    """Regression: with the outer level's latency lower than the inner one's, a tensor group
    spread over two nodes beats an aligned one; the configuration floor of general mode prices
    tensor groups over every split, so pruning keeps that plan (it once dropped it)."""
    cluster = make_cluster(fanouts=(2, 2), bws_gbps=(100, 100), lat_us=(40, 0))
    problem = make_problem(make_spec(layers=2, heads=4, hidden=64), cluster, global_batch=4)
    options = dict(zero_stages=[0], recompute=["none"], schedules=["1f1b"], pp=[1], cp=[1])
    whole = exact("cpsat", options, mode="general", prune=False, hint=False).solve(problem)
    for backend in ("cpsat", "milp"):
        pruned = exact(backend, options, mode="general").solve(problem)
        assert pruned.objective_s == pytest.approx(whole.objective_s, rel=REL)
    spread = {s.devices[0][0] for s in whole.stages}  # one tensor group, its two devices
    assert whole.tp == 2 and any(cluster.common_level(*group) == 1 for group in spread)
    restricted = exact("cpsat", options).solve(problem)
    assert whole.objective_s < 0.9 * restricted.objective_s


def test_general_interleaved_equals_brute_force_over_every_placement():
    """Interleaved plans (2 ranks x 2 chunks) over every placement on 4 devices."""
    for seed in range(3):
        rng = random.Random(seed)
        cluster = make_cluster(
            fanouts=(2, 2),
            bws_gbps=(rng.uniform(1, 500), rng.uniform(1, 500)),
            lat_us=(rng.uniform(0, 40), rng.uniform(0, 40)),
        )
        problem = make_problem(make_spec(layers=4, heads=4, hidden=64), cluster, global_batch=4)
        options = dict(
            zero_stages=[0],
            recompute=["none", "full"],
            schedules=["interleaved"],
            pp=[2],
            cp=[1],
            virtual_stages=[2],
        )
        oracle = _brute_general(problem, options)
        for backend in ("cpsat", "milp"):
            plan = exact(backend, options, mode="general").solve(problem)
            check_exact_plan(problem, plan)
            assert plan.schedule is Schedule.INTERLEAVED
            assert plan.objective_s == pytest.approx(oracle, rel=REL), (seed, backend)


def test_general_is_never_worse_than_restricted():
    """``general <= restricted`` for both solvers on 40 random problems of up to 8 devices, and
    strictly better on some (the larger space matters)."""
    checked = better = 0
    for seed in range(40):
        problem, options = tiny_case(seed)
        if problem.cluster.num_devices > 8:
            continue
        restricted = solve_or_none(exact("cpsat", options), problem)
        for backend in ("cpsat", "milp"):
            general = solve_or_none(exact(backend, options, mode="general"), problem)
            assert (general is None) == (restricted is None), (seed, backend)
            if general is not None:
                check_exact_plan(problem, general)
                assert general.objective_s <= restricted.objective_s * (1 + REL), seed
                better += general.objective_s < restricted.objective_s * (1 - 1e-3)
        checked += 1
    assert checked >= 30 and better >= 2, (checked, better)


def test_placement_enumeration_covers_every_orbit():
    """The orderly enumeration visits one map per orbit of the tree's symmetry: 8! / 2^7 = 315
    on ``[2, 2, 2]``, and the signature classes are a subset of what it visits."""
    cluster = make_cluster(fanouts=(2, 2, 2))
    maps = list(orderly_assignments(cluster, 8, max_visits=10**6))
    assert len(maps) == 315 and len(set(maps)) == 315
    classes = placement_classes(cluster, tp=2, cp=1, dp=2, pp=2, ep=1, max_visits=10**6)
    assert 1 < len(classes) < 315
    with pytest.raises(UserError, match="max_placements=10"):
        list(orderly_assignments(cluster, 8, max_visits=10))


def _automorphisms(cluster) -> list[tuple[int, ...]]:
    """Every symmetry of the hierarchy as a permutation of device ids (closure of the swaps of
    two children of one node and the cyclic shift of a node's children)."""
    n = cluster.num_devices
    gens = []
    for level in range(cluster.num_levels):
        inner = cluster.block_size(level - 1) if level > 0 else 1
        outer = cluster.block_size(level)
        fan = cluster.levels[level].fanout
        for start in range(0, n, outer):
            # the cyclic shift of the node's children, and (for more than two) a transposition
            moves = [lambda c, f=fan: (c + 1) % f]
            if fan > 2:
                moves.append(lambda c: {0: 1, 1: 0}.get(c, c))
            for move in moves:
                perm = list(range(n))
                for d in range(start, start + outer):
                    child, rest = divmod(d - start, inner)
                    perm[d] = start + move(child) * inner + rest
                gens.append(tuple(perm))
    group, frontier = {tuple(range(n))}, [tuple(range(n))]
    while frontier:
        g = frontier.pop()
        for h in gens:
            gh = tuple(h[g[i]] for i in range(n))
            if gh not in group:
                group.add(gh)
                frontier.append(gh)
    return sorted(group)


@pytest.mark.parametrize(("fanouts", "ranks"), [((2, 2), 3), ((2, 2, 2), 3), ((4, 2), 5)])
def test_orderly_enumeration_meets_every_orbit_of_partial_placements(fanouts, ranks):
    """Against a brute force: every injective map of ``ranks`` ranks to the devices, grouped
    into orbits under every automorphism of the tree; the enumeration hits each orbit."""
    cluster = make_cluster(fanouts=fanouts)
    autos = _automorphisms(cluster)
    assert len(autos) == {(2, 2): 8, (2, 2, 2): 128, (4, 2): 24 * 24 * 2}[fanouts]

    def orbit(m):
        return min(tuple(a[d] for d in m) for a in autos)

    every = {orbit(m) for m in permutations(range(cluster.num_devices), ranks)}
    visited = {orbit(m) for m in orderly_assignments(cluster, ranks, max_visits=10**6)}
    assert visited == every


def test_hint_is_the_dp_plan_and_the_report_says_so():
    problem, options = tiny_case(7)
    plan = exact("cpsat", options).solve(problem)
    assert plan.search["hint"] and plan.search["upper_bound_s"] is not None
    assert plan.search["tick_s"] * 2**24 == pytest.approx(plan.search["upper_bound_s"])
    assert plan.search["rounding_error_s"] <= 1e-6 * plan.objective_s
    for key in ("time_dp_s", "time_tables_s", "time_solver_s", "booleans", "gap"):
        assert key in plan.search


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
def test_a_time_limit_without_a_plan_is_a_timeout(backend):
    """A limit too short to find any plan raises SolverTimeout (no DP run), or returns the DP's
    plan marked ``timeout`` (with the DP), never an unproven plan called optimal."""
    problem = make_problem(make_spec(layers=4), make_cluster(fanouts=(4, 2)), global_batch=8)
    planner = exact(backend, {}, hint=False, prune=False, time_limit_s=1e-6)
    with pytest.raises(SolverTimeout, match="time_limit_s"):
        planner.solve(problem)
    plan = exact(backend, {}, hint=True, prune=False, time_limit_s=1e-6).solve(problem)
    dp = NestPlanner().solve(problem)
    # 1 us proves nothing: CP-SAT stops before a solution (the DP's plan, "timeout"); HiGHS
    # stops at the hinted start ("feasible", no bound). Either way, no better than the DP's
    # optimum of the same space and never called optimal.
    assert plan.status in ("timeout", "feasible"), plan.status
    assert plan.objective_s >= dp.objective_s * (1 - REL)
    if plan.status == "timeout":
        assert plan.objective_s == dp.objective_s and plan.search["gap"] is None
    else:
        assert plan.bound_s is None or plan.bound_s < plan.objective_s * (1 - REL)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "exhaustive"}, "solver.mode='exhaustive'"),
        ({"backend": "gurobi"}, "solver.backend='gurobi'"),
        ({"time_limit_s": 0}, "solver.time_limit_s=0"),
        ({"workers": 0}, "solver.workers=0"),
        ({"seed": 1.5}, "solver.seed=1.5"),
        ({"hint": "yes"}, "solver.hint='yes'"),
        ({"max_placements": 0}, "solver.max_placements=0"),
        ({"deterministic_time": -1}, "solver.deterministic_time=-1"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, match):
    args = {"name": "cpsat", "backend": "cpsat", **kwargs}
    with pytest.raises(UserError, match=match):
        ExactPlanner(**args)
