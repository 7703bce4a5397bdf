"""``explain``: the per-rank breakdown adds up to the report's totals (time and memory)."""

import json
import math
import subprocess
import sys

import pytest

from baselines.fixed import FixedPlanner
from nest.analysis.explain import MEMORY_TERMS, ROW_TERMS, TIME_TERMS, explain_report, main
from nest.app.config import build_problem
from nest.core.errors import UserError
from nest.core.serialize import plan_from_dict, report_to_dict
from nest.cost import evaluate
from nest.dp.planner import NestPlanner

from .conftest import make_cluster, make_problem, make_spec
from .randomcase import random_case
from .test_cli import REPO_ROOT, run_case


def check_adds_up(report: dict, iteration_time_s: float) -> dict:
    """``iteration_time_s``: the evaluator's own value (its ``Report``), the oracle the rows are
    checked against. ``wait`` is what explain makes each row add up with, so the row sum is not
    tested (it equals the iteration by construction); its terms are, one by one."""
    e = explain_report(report)
    b = report["breakdown"]
    t_iter, m = iteration_time_s, report["plan"]["num_microbatches"]
    assert e["iteration_time_s"] == t_iter
    slowest = max(e["ranks"], key=lambda r: r["per_iteration_s"]["busy"])
    assert slowest["per_iteration_s"]["bubble"] == pytest.approx(b["bubble_s"], abs=1e-12 * t_iter)
    rows = [r["per_iteration_s"] for r in e["ranks"]]
    most_exposed = max(it["dp_sync_exposed"] for it in rows)
    most_optimizer = max(it["optimizer"] for it in rows)
    # T_iter = T_pipe + max_r exposed_r + max_r optimizer_r, from explain's per-rank terms
    assert e["pipeline_time_s"] + most_exposed + most_optimizer == pytest.approx(t_iter, rel=1e-12)
    for r in e["ranks"]:
        it = r["per_iteration_s"]
        assert set(it) == {*TIME_TERMS, *ROW_TERMS}
        assert it["busy"] + it["bubble"] == pytest.approx(e["pipeline_time_s"], rel=1e-12)
        # a rank waits for the slowest rank's exposed sync and optimizer step, no more
        waits_for = (most_exposed - it["dp_sync_exposed"]) + (most_optimizer - it["optimizer"])
        assert it["wait"] == pytest.approx(waits_for, abs=1e-12 * t_iter)
        assert math.fsum(it[k] for k in TIME_TERMS) == pytest.approx(it["busy"], rel=1e-12)
        for k in TIME_TERMS:
            assert it[k] == pytest.approx(m * r["per_microbatch_s"][k], rel=1e-12)
        assert min(it.values()) >= -1e-12 * t_iter
        mem = r["memory_bytes"]
        assert math.fsum(mem[k] for k in MEMORY_TERMS) == pytest.approx(mem["total"], rel=1e-12)
        assert mem["activations_per_microbatch"] * mem["in_flight_microbatches"] == pytest.approx(
            mem["activations"], rel=1e-12
        )
    assert max(r["memory_bytes"]["total"] for r in e["ranks"]) == report["peak_memory_bytes"]
    return e


@pytest.mark.parametrize(
    "kw",
    [
        dict(tp=2, pp=4, dp=2, recompute=["full", "selective", "none", "none"], zero_stage=1),
        dict(tp=1, pp=2, dp=8, schedule="interleaved", virtual_stages=2, zero_stage=3),
        dict(tp=2, cp=2, pp=1, dp=4, recompute="selective", zero_stage=2),
    ],
)
def test_terms_add_up_on_fixed_plans(kw):
    problem = make_problem(
        make_spec(layers=8, heads=8), make_cluster(fanouts=(4, 4)), global_batch=32
    )
    plan = FixedPlanner(microbatch_size=1, **kw).solve(problem)
    evaluated = evaluate(problem, plan)
    e = check_adds_up(report_to_dict(plan, evaluated), evaluated.iteration_time_s)
    assert len(e["ranks"]) == kw["pp"]


@pytest.mark.parametrize(
    "kw",
    [
        dict(tp=1, pp=2, dp=8, zero_stage=1, activation_offload=True),
        dict(tp=1, pp=1, dp=16, zero_stage=1, activation_offload=True, activation_offload_blocks=3),
    ],
)
def test_terms_add_up_with_exposed_activation_offload(kw):
    """Over a 0.1 GB/s host link the offloaded activations' copies outlast the compute: the
    exposed part is its own column (``offload``), and the rows still add up."""
    from .conftest import make_device

    device = make_device(host_link_bw_bytes_per_s=0.1e9)
    problem = make_problem(
        make_spec(layers=8, heads=8), make_cluster(fanouts=(4, 4), device=device), global_batch=32
    )
    plan = FixedPlanner(microbatch_size=1, **kw).solve(problem)
    evaluated = evaluate(problem, plan)
    e = check_adds_up(report_to_dict(plan, evaluated), evaluated.iteration_time_s)
    assert all(r["per_iteration_s"]["offload"] > 0 for r in e["ranks"])


def test_terms_add_up_on_random_and_nest_plans():
    for seed in range(40):
        problem, planner = random_case(seed)
        plan = planner.solve(problem)
        evaluated = evaluate(problem, plan)
        check_adds_up(report_to_dict(plan, evaluated), evaluated.iteration_time_s)
    problem, _ = random_case(3)
    plan = NestPlanner().solve(problem)
    evaluated = evaluate(problem, plan)
    check_adds_up(report_to_dict(plan, evaluated), evaluated.iteration_time_s)


def test_from_a_run_directory_and_as_a_run_option(tmp_path, capsys):
    cfg, result, report, plan, lines = run_case(
        tmp_path, "explain=true", "solver=fixed", "solver.pp=2", "solver.tp=4"
    )
    # the oracle: the saved plan evaluated again, not the report being explained
    evaluated = evaluate(build_problem(cfg), plan_from_dict(plan))
    saved = json.loads((tmp_path / "explain.json").read_text())
    assert saved == json.loads(json.dumps(check_adds_up(report, evaluated.iteration_time_s)))
    text = (tmp_path / "explain.txt").read_text()
    assert "bubble" in text and "act/mb" in text and any("dp-sync" in line for line in lines)
    assert main([str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == saved
    assert main([str(tmp_path / "nope")]) == 2
    assert "report.json" in capsys.readouterr().err
    done = subprocess.run(
        [sys.executable, "-m", "nest.analysis.explain", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    )
    assert done.stdout.strip() == text.strip()


def test_a_report_without_a_plan_is_a_one_line_error(tmp_path):
    _, result, report, _, _ = run_case(tmp_path, "cluster.devices=8", "model=llama3_405b")
    assert report["status"] == "infeasible"
    with pytest.raises(UserError) as err:
        explain_report(report)
    assert "no evaluated plan" in str(err.value) and "\n" not in str(err.value)
