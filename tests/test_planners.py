"""Conformance suite over every planner in conf/solver/, plus the megatron rules' behaviour."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from baselines.megatron import MegatronPlanner
from nest.app.cli import CONF_DIR
from nest.core.errors import Infeasible
from nest.core.serialize import plan_to_dict
from nest.cost import check_plan, evaluate

from .conftest import (
    assert_not_faster_than_peak,
    make_cluster,
    make_device,
    make_problem,
    make_spec,
)

SOLVERS = sorted(p.stem for p in (Path(CONF_DIR) / "solver").glob("*.yaml"))


# Brute force is exponential in the stages: its contract is checked on a restricted space here
# (tests/test_nest_dp.py compares it with nest over full spaces of tiny problems).
RESTRICT = {
    "brute": [
        "solver.zero_stages=[1]",
        "solver.rank_orders=[tp-cp-dp-pp]",
        "solver.recompute=[none,full]",
        "solver.schedules=[1f1b]",
    ],
    # a small budget keeps the two runs per problem quick; the stop is still the budget's
    "mcmc": ["solver.max_evaluations=150", "solver.min_evaluations=150"],
    # the paper's tables have no rows for the tiny problems: a table file with rows for them
    "paper_table": [
        "solver.setup=test",
        f"solver.tables_file={Path(__file__).parent / 'data' / 'paper_tables_tiny.yaml'}",
    ],
}
# the per-table options are paper_table with a fixed table: the same tiny tables file
for _table in ("manual", "mcmc", "phaze"):
    RESTRICT[f"paper_{_table}"] = RESTRICT["paper_table"]


def planner_from_config(name: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"solver={name}", *RESTRICT.get(name, [])])
    return instantiate(cfg.solver, _convert_="all")


def small_problems():
    yield make_problem(make_spec(layers=4), make_cluster(fanouts=(4, 2)), global_batch=16)
    yield make_problem(
        make_spec(layers=6, heads=4),
        make_cluster(fanouts=(2, 2, 2), bws_gbps=(400, 100, 25), lat_us=(1, 5, 9)),
        global_batch=8,
    )
    moe = make_spec(layers=3, num_experts=4, top_k=2, activation="swiglu")
    yield make_problem(moe, make_cluster(fanouts=(2, 4)), global_batch=16)
    # a mixed chain of the modern shapes: MLA, block 0 dense (first_dense_layers), then MoE
    # every second block with a shared expert, a sliding window on every other block, and an
    # MTP module in the head (of the last block's kind: MoE, local); 3 blocks, as the MoE
    # problem above (the paper tables' tiny rows split 3 blocks)
    mixed = make_spec(
        layers=3,
        attention="mla",
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        activation="swiglu",
        norm="rmsnorm",
        bias=False,
        position="rope",
        num_experts=4,
        top_k=2,
        moe_ffn_hidden=128,
        shared_experts=1,
        first_dense_layers=1,
        moe_layer_freq=2,
        window=16,
        global_every=2,
        mtp_layers=1,
    )
    yield make_problem(mixed, make_cluster(fanouts=(2, 4)), global_batch=16)


@pytest.mark.parametrize("name", SOLVERS)
def test_planner_conformance(name):
    for problem in small_problems():
        planner = planner_from_config(name)
        assert planner.name == name
        plan = planner.solve(problem)
        check_plan(problem, plan)  # contiguous stages covering the chain, devices exist, no reuse
        covered = [i for s in plan.stages for i in s.layers]
        assert covered == list(range(problem.num_layers))  # every layer placed exactly once
        report = evaluate(problem, plan)
        assert_not_faster_than_peak(problem, plan)
        assert plan.solver == name
        assert plan.status in ("optimal", "feasible", "infeasible", "timeout")
        if plan.status in ("optimal", "feasible"):
            assert report.feasible
        again = planner_from_config(name).solve(problem)
        a, b = plan_to_dict(plan), plan_to_dict(again)
        for d in (a, b):
            d.pop("solve_time_s")
            d["search"] = {k: v for k, v in d["search"].items() if not k.startswith("time_")}
        assert a == b  # deterministic


def test_megatron_keeps_tp_inside_the_node_and_as_wide_as_allowed():
    problem = make_problem(
        make_spec(layers=4, heads=8), make_cluster(fanouts=(4, 4)), global_batch=16
    )
    plan = MegatronPlanner().solve(problem)
    assert plan.tp == 4
    for stage in plan.stages:
        for replica in stage.devices:
            for ranks in replica:
                assert problem.cluster.group_factors(ranks) == (4, 1)
    # heads limit the width: 2 heads allow tp <= 2 even on 4-device nodes
    narrow = make_problem(
        make_spec(layers=4, heads=2, hidden=128), make_cluster(fanouts=(4, 4)), global_batch=16
    )
    assert MegatronPlanner().solve(narrow).tp == 2


def test_megatron_takes_the_smallest_pipeline_that_fits():
    """Shrink HBM until pp=1 no longer fits: the rules move to the next pp, never beyond, and
    take the lightest recompute mode that fits at that pp. The sizes are chosen so that every
    branch is exercised: 64 MiB (pp=1, no recompute), 32 MiB (pp=1, full recompute: the lighter
    modes were refused), 28 and 24 MiB (pp=2: every pp=1 configuration was refused), 16 MiB
    (nothing fits)."""
    spec = make_spec(layers=8, hidden=256, ffn_hidden=1024, vocab=4096, seq_len=128)
    roomy = make_problem(spec, make_cluster(fanouts=(2, 4)), global_batch=16)
    planner = MegatronPlanner()
    assert planner.solve(roomy).pp == 1
    refused_pp = refused_mode = infeasible = 0
    for hbm_mib in (64, 32, 28, 24, 16):
        tight = make_problem(
            spec,
            make_cluster(fanouts=(2, 4), device=make_device(hbm_bytes=hbm_mib * 2**20)),
            global_batch=16,
        )
        try:
            plan = planner.solve(tight)
        except Infeasible:
            infeasible += 1
            continue
        smaller = [c for c in planner.candidates(tight) if c.pp < plan.pp]
        assert all(not evaluate(tight, c).feasible for c in smaller)
        refused_pp += len(smaller)
        same = [c for c in planner.candidates(tight) if c.pp == plan.pp]
        # full recompute only if needed: no lighter mode at this pp fits with any microbatch
        order = ["none", "selective", "full"]
        lighter = [
            c
            for c in same
            if order.index(c.stages[0].recompute) < order.index(plan.stages[0].recompute)
        ]
        assert all(not evaluate(tight, c).feasible for c in lighter)
        refused_mode += len(lighter)
    # the checks above ran on non-empty lists: smaller pipelines and lighter modes were refused
    assert refused_pp > 0 and refused_mode > 0 and infeasible == 1, (refused_pp, refused_mode)


def test_megatron_reports_the_memory_it_would_need():
    spec = make_spec(layers=2, hidden=1024, ffn_hidden=4096, heads=8)
    problem = make_problem(
        spec, make_cluster(fanouts=(2,), device=make_device(hbm_bytes=2**20)), global_batch=4
    )
    with pytest.raises(Infeasible) as info:
        MegatronPlanner().solve(problem)
    err = info.value
    assert err.min_memory_bytes > problem.cluster.device.hbm_bytes
    assert "GiB" in err.reason and "\n" not in err.reason


def test_megatron_pipeline_degree_need_not_divide_the_devices():
    """6 blocks on 16 devices of 4 per node: pp=3 divides the layers but not 16 / tp; the rules
    still consider it (dp takes what the batch allows, the rest stay idle)."""
    spec = make_spec(layers=6, hidden=256, ffn_hidden=1024, vocab=4096, seq_len=128, heads=4)
    planner = MegatronPlanner()
    problem = make_problem(spec, make_cluster(fanouts=(4, 4)), global_batch=16)
    assert 3 in {c.pp for c in planner.candidates(problem)}
