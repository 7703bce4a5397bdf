"""``solver.export_runnable=megatron``: the search kept inside what Megatron-LM runs as planned.

The oracle is independent of the restriction's implementation: every plan of the NEST space
(brute force's enumeration) that the Megatron exporter expresses without a change (its
``nearest_expressible`` reports no issue) is scored by the evaluator; the restricted ``nest`` must
find the best of them. The export of a plan Megatron cannot run names the option and prices the
fallback against it.
"""

import dataclasses
import random

import pytest

from baselines.brute import count_plans, partitions
from baselines.fixed import FixedPlanner
from nest.core.axes import Recompute
from nest.core.errors import UserError
from nest.core.layers import AnalyticModel
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.dp.planner import NestPlanner, plan_from_choices
from nest.dp.space import SpaceOptions, configurations, interleaved_chunks
from nest.export import export_plan
from nest.export.megatron import nearest_expressible

from .conftest import make_cluster, make_problem, make_spec
from .randomcase import random_problem
from .test_cli import run_case


def best_megatron_runs(problem) -> float | None:
    """The least evaluated time over every plan of the space that Megatron expresses as is."""
    modes = SpaceOptions().recompute_modes
    blocks = {i for i, ref in enumerate(problem.model.chain) if ref.kind.value == "block"}
    best = None
    for config in configurations(problem, SpaceOptions()):
        if config.interleaved:
            splits = [interleaved_chunks(problem.num_layers, config.pp, config.virtual_stages)]
        else:
            splits = partitions(problem.num_layers, config.pp)
        for parts in splits:
            # Megatron applies one recompute mode to every stage (a plan mixing modes is not
            # runnable as is: the check below), so only the uniform assignments are drawn
            has_block = [bool(blocks.intersection(range(i, j + 1))) for i, j in parts]
            uniform = [[m if b else Recompute.NONE for b in has_block] for m in modes]
            for combo in uniform:
                choices = [(i, j, m) for (i, j), m in zip(parts, combo, strict=True)]
                plan = plan_from_choices(problem, config, choices)
                if nearest_expressible(problem, plan)[1]:
                    continue  # Megatron would run another plan
                report = evaluate(problem, plan)
                if report.feasible and (best is None or report.iteration_time_s < best):
                    best = report.iteration_time_s
    return best


# (seed, HBM GiB) of random problems where memory is tight enough that the unrestricted optimum
# mixes recompute modes (found by drawing seeds and memories; the oracle gives the expectation).
# (124, 0.004) left the list when ZeRO-3's gathers became prefetched (nest.cost.fsdp): its
# unrestricted optimum is now a plan Megatron runs as is, so the restriction no longer binds
# there; it bound at (147, 0.004), drawn in its place, until the mlp recompute modes made that
# problem's oracle take 95 s; (154, 0.004) binds and is checked in half a second.
BINDING = [(2, 0.008), (98, 0.008), (127, 0.004), (135, 0.004), (143, 0.008), (154, 0.004)]


@pytest.mark.parametrize("seed, hbm_gib", BINDING)
def test_restricted_nest_equals_brute_force_where_the_restriction_binds(seed, hbm_gib):
    """Exact within the restricted space where it costs something: the unrestricted optimum is
    not runnable as is, and the restricted search finds the best plan Megatron runs."""
    problem = random_problem(random.Random(seed), hbm_gib=hbm_gib)
    unrestricted = NestPlanner().solve(problem)
    assert nearest_expressible(problem, unrestricted)[1]  # the restriction binds here
    want = best_megatron_runs(problem)
    plan = NestPlanner(export_runnable="megatron").solve(problem)
    assert plan.objective_s == pytest.approx(want, rel=1e-9)
    assert not nearest_expressible(problem, plan)[1]
    assert plan.objective_s > unrestricted.objective_s


def restricted_solves(draw, seeds: int, max_plans: int, wanted: int):
    """``(problem, plan, brute optimum)`` of the first ``wanted`` drawn problems small enough to
    enumerate (at most ``max_plans`` plans) that Megatron runs some plan of: the restricted
    search's plan equals the brute-force optimum over what Megatron runs, and exports as is."""
    found = []
    for seed in range(seeds):
        problem = draw(seed)
        if count_plans(problem, SpaceOptions()) > max_plans:
            continue
        want = best_megatron_runs(problem)
        if want is None:
            continue
        plan = NestPlanner(export_runnable="megatron").solve(problem)
        assert plan.objective_s == pytest.approx(want, rel=1e-9), seed
        assert not nearest_expressible(problem, plan)[1], seed
        found.append((problem, plan, want))
        if len(found) == wanted:
            return found
    raise AssertionError(f"only {len(found)} of {wanted} problems drawn in {seeds} seeds")


def test_restricted_nest_equals_brute_force_over_what_megatron_runs():
    """On random small problems the restricted search is exact within the restricted space, its
    plan exports without a change, and it is never better than the unrestricted optimum."""
    cases = restricted_solves(lambda seed: random_problem(random.Random(seed)), 60, 4000, 8)
    for problem, plan, want in cases:
        assert plan.search["export_runnable"] == "megatron"
        assert NestPlanner().solve(problem).objective_s <= want * (1 + 1e-12)


def test_the_export_names_the_option_and_prices_the_fallback_against_it():
    problem = make_problem(
        make_spec(layers=8, heads=8), make_cluster(fanouts=(4, 4)), global_batch=32
    )
    plan = FixedPlanner(tp=1, pp=2, dp=4, microbatch_size=1, recompute=["full", "none"]).solve(
        problem
    )
    restricted = NestPlanner(export_runnable="megatron").solve(problem)
    exp = export_plan(problem, plan, "megatron", replan=lambda option: restricted)
    option_s = evaluate(problem, restricted).iteration_time_s
    warning = exp.warnings[0]
    assert "solver.export_runnable=megatron" in warning and f"{option_s:.4f} s" in warning
    found = exp.to_dict()["runnable_option"]
    assert found["option"] == "solver.export_runnable=megatron"
    assert found["iteration_time_s"] == pytest.approx(option_s, rel=1e-12)
    assert found["fallback_vs_option"] == pytest.approx(
        exp.exported_iteration_time_s / option_s, rel=1e-12
    )
    # without a re-planner the warning still names the option
    alone = export_plan(problem, plan, "megatron")
    assert "solver.export_runnable=megatron" in alone.warnings[0]
    assert alone.runnable_option == {}


def test_cli_export_runnable_plans_what_megatron_runs(tmp_path):
    _, result, report, plan, _ = run_case(
        tmp_path, "solver=nest", "solver.export_runnable=megatron", "export=megatron"
    )
    assert result["status"] == "optimal", result.get("error")
    saved = report["export"]["megatron"]
    assert not saved["warnings"]
    assert saved["exported_iteration_time_s"] == report["iteration_time_s"]
    _, bad, _, _, lines = run_case(
        tmp_path / "bad", "solver=nest", "solver.export_runnable=deepspeed"
    )
    assert bad["status"] == "error" and "solver.export_runnable='deepspeed'" in bad["error"]
    assert len(lines) == 1


def test_export_runnable_with_no_megatron_order_is_a_one_line_error():
    problem = make_problem(make_spec(layers=2), make_cluster(fanouts=(2,)), global_batch=4)
    with pytest.raises(UserError, match="has no order megatron runs"):
        NestPlanner(export_runnable="megatron", rank_orders=["tp-dp-cp-pp"]).solve(problem)


def with_fp8_param_gather(problem):
    """The problem with FP8 GEMMs and FP8 parameter gather, on its device given FP8 tensor cores
    (twice the BF16 peak, as the H100's 1979 vs 989 TFLOP/s dense)."""
    training = dataclasses.replace(problem.training, precision="fp8", fp8_param_gather=True)
    dev = problem.cluster.device
    device = dataclasses.replace(
        dev, fp8_peak_flops_per_s=2 * dev.peak_flops_per_s, fp8_gemm_ceiling=0.8
    )
    model = AnalyticModel(
        problem.model.spec,
        flash_attention=problem.model.flash_attention,
        overlap=training.overlap,
        precision=training.numerics,
    )
    cluster = dataclasses.replace(problem.cluster, device=device)
    return Problem(model=model, cluster=cluster, training=training)


def test_restricted_nest_with_fp8_param_gather_searches_what_megatron_runs():
    """Megatron accepts --fp8-param-gather only with the distributed optimizer
    (megatron/training/arguments.py @ 000c4ac24f61, validate_args): a ZeRO-0 plan with data
    parallelism is not runnable as planned. The restricted search is exact over the plans the
    exporter expresses without a change, and its plan exports with --fp8-param-gather."""

    def draw(seed):
        return with_fp8_param_gather(random_problem(random.Random(seed)))

    for problem, plan, _ in restricted_solves(draw, 40, 2500, 4):
        assert plan.zero_stage >= 1 or plan.dp * plan.cp == 1
        exp = export_plan(problem, plan, "megatron")
        assert "--fp8-param-gather" in exp.text and not exp.warnings
    problem = with_fp8_param_gather(random_problem(random.Random(1)))
    with pytest.raises(UserError, match="solver.zero_stages=\\[0\\] has no stage Megatron runs"):
        NestPlanner(export_runnable="megatron", zero_stages=[0]).solve(problem)
