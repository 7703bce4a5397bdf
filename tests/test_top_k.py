"""``solver.top_k``: the K best configurations, exact against brute force's sorted list."""

import json
import random

import pytest

from baselines.brute import BrutePlanner
from nest.analysis.alternatives import CONFIG_FIELDS, differs
from nest.core.errors import Infeasible, UserError
from nest.core.model import ModelSpec
from nest.dp.planner import NestPlanner, TopK
from nest.planner import build_planner, solve_ranked

from .conftest import make_cluster, make_problem
from .test_cli import run_case
from .test_nest_dp import tiny_case


def ranked(planner, problem) -> list:
    try:
        return planner.solve_ranked(problem)
    except Infeasible:
        return []


def test_top_k_equals_brute_forces_sorted_list_on_random_problems():
    """On 100 random small problems (``tiny_case``: 3-8 chain layers, 2-16 devices, 1-3 levels,
    random restrictions of the space, some infeasible), ``nest`` with ``top_k=K`` (K in 2, 3,
    5, 8) returns exactly the first K of brute force's list of per-configuration bests sorted by
    time: the same values (1e-9) at every position, distinct configurations, each plan the best
    of its configuration; the first is ``top_k=1``'s optimum."""
    beyond_k = compared = 0
    for seed in range(300, 400):
        problem, options = tiny_case(seed)
        k = random.Random(seed).choice([2, 3, 5, 8])
        oracle = ranked(BrutePlanner(top_k=10**6, **options), problem)
        found = ranked(NestPlanner(top_k=k, **options), problem)
        assert len(found) == min(k, len(oracle)), seed
        best_of = {p.config.unordered(): p.objective_s for p in oracle}
        assert len(best_of) == len(oracle)  # brute's list holds one plan per configuration
        for position, (got, want) in enumerate(zip(found, oracle, strict=False)):
            assert got.objective_s == pytest.approx(want.objective_s, rel=1e-9), (seed, position)
            assert got.objective_s == pytest.approx(best_of[got.config.unordered()], rel=1e-9)
        assert len({p.config.unordered() for p in found}) == len(found)
        if found:
            single = NestPlanner(**options).solve(problem)
            assert single.objective_s == found[0].objective_s
            compared += 1
        beyond_k += len(oracle) > k
    # the cut at K is exercised: the feasible cases have more configurations than K (93 of 93)
    assert compared >= 80 and beyond_k >= 80, (compared, beyond_k)


def test_top_k_bookkeeping_keeps_the_k_best_distinct_keys():
    """:class:`TopK` against a plain re-sort of every offer: the kept keys, values and
    threshold after each of 400 random offers (repeated keys improving or not, ties)."""
    rng = random.Random(3)
    for _ in range(50):
        k = rng.randint(1, 4)
        top, best = TopK(k), {}
        for n in range(8):
            key, value = rng.randint(0, 6), float(rng.randint(1, 9))
            top.offer(key, value, None, n)
            if key not in best or value < best[key][0]:
                best[key] = (value, n)
            want = sorted(best.items(), key=lambda kv: kv[1])[:k]
            assert [e[0] for e in top.best] == [v for _, (v, _) in want]
            assert sorted(e[1] for e in top.best) == sorted(key for key, _ in want)
            full = len(want) == k
            assert top.threshold == (want[-1][1][0] if full else float("inf"))
            for key in range(7):
                kept = dict((e[1], e[0]) for e in top.best)
                assert top.incumbent(key) == kept.get(key, top.threshold)


def test_fewer_configurations_than_k_return_them_all():
    """A space of six configurations (dp 1 or 2 x microbatch 1 or 2 x ZeRO 0 or 1, dp 1 with
    ZeRO 0 only) asked for five returns five distinct ones, asked for fifty all six, sorted."""
    problem = make_problem(cluster=make_cluster(fanouts=(2,)), global_batch=4)
    planner = NestPlanner(
        top_k=5, tp=[1], cp=[1], pp=[1], zero_stages=[0, 1], schedules=["1f1b"], rank_orders=None
    )
    plans = planner.solve_ranked(problem)
    configs = {(p.dp, p.microbatch_size, p.zero_stage) for p in plans}
    # dp in {1, 2} x mbs in {1, 2} x zero in {0, 1} (dp=1 has only ZeRO 0): 6 configurations
    assert len(plans) == len(configs) == 5
    everything = NestPlanner(
        top_k=50, tp=[1], cp=[1], pp=[1], zero_stages=[0, 1], schedules=["1f1b"]
    ).solve_ranked(problem)
    assert len(everything) == 6
    assert [p.objective_s for p in everything] == sorted(p.objective_s for p in everything)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True])
def test_a_bad_top_k_is_a_one_line_error(bad):
    with pytest.raises(UserError, match=r"solver.top_k=.* must be a positive integer") as err:
        NestPlanner(top_k=bad).solve(make_problem())
    assert "\n" not in str(err.value)


def test_a_planner_that_builds_one_plan_refuses_top_k_above_one():
    """``+solver.top_k=3`` on ``megatron``: one line naming the value and the planners that rank;
    ``top_k=1`` is what it does anyway and runs."""
    with pytest.raises(UserError) as err:
        build_planner({"_target_": "baselines.megatron.MegatronPlanner", "top_k": 3})
    assert "solver.top_k=3" in str(err.value) and "solver=nest" in str(err.value)
    planner = build_planner({"_target_": "baselines.megatron.MegatronPlanner", "top_k": 1})
    assert len(solve_ranked(planner, make_problem())) == 1


def test_top_k_from_the_command_line(tmp_path):
    """``solver=nest solver.top_k=4``: report.json["alternatives"] holds four entries, best
    first, the first equal to the run's plan; each entry's iteration time is its plan's, its
    slowdown is against the first, ``differs`` names exactly the configuration fields whose
    values differ from the first's, and the summary prints the table."""
    _, result, report, plan, lines = run_case(
        tmp_path, "solver=nest", "model=tiny", "cluster=dgx_8x8", "solver.top_k=4"
    )
    alts = report["alternatives"]
    assert [a["rank"] for a in alts] == [1, 2, 3, 4]
    assert alts[0]["iteration_time_s"] == report["iteration_time_s"]
    assert alts[0]["plan"] == report["plan"] and alts[0]["differs"] == {}
    times = [a["iteration_time_s"] for a in alts]
    assert times == sorted(times)
    keys = {tuple(a["plan"][f] for f in CONFIG_FIELDS) for a in alts}
    assert len(keys) == 4
    for a in alts:
        assert a["slowdown_vs_best"] == pytest.approx(a["iteration_time_s"] / times[0] - 1)
        assert a["feasible"] and a["breakdown"]["iteration_time_s"] == a["iteration_time_s"]
        for f in CONFIG_FIELDS:
            assert (f in a["differs"]) == (a["plan"][f] != alts[0]["plan"][f])
    text = "\n".join(lines)
    assert "top 4 configurations" in text and (tmp_path / "summary.txt").read_text().count(
        "top 4 configurations"
    )
    json.dumps(report)  # plain JSON throughout


def test_differs_names_what_changed():
    """Two plans of different configurations: ``differs`` lists each field with both values."""
    problem = make_problem(
        ModelSpec(name="x", hidden=64, layers=4, heads=4, ffn_hidden=128, vocab=256, seq_len=32),
        make_cluster(fanouts=(4,)),
        global_batch=8,
    )
    a = NestPlanner(tp=[1], pp=[1], zero_stages=[1]).solve(problem)
    b = NestPlanner(tp=[2], pp=[2], zero_stages=[0], schedules=["1f1b"]).solve(problem)
    got = differs(a, b)
    assert got["tp"] == [1, 2] and got["pp"] == [1, 2]
    assert (a.zero_stage, b.zero_stage) == (1, 0)  # dp 4 takes ZeRO-1; dp 1 has only 0
    assert got["zero_stage"] == [1, 0]
    assert got["layer_partition"] == [[6], [len(s.layers) for s in b.stages]]
    assert differs(a, a) == {}
