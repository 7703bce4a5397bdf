"""NEST is never worse than a baseline whose plan lies in its space, on the paper's Figure 5 grid.

Grid: bert_large, llama2_7b, llama3_70b, mixtral_8x7b, gpt3_175b x 64, 128, 256, 512, 1024
devices on tpuv4_fattree and h100_spineleaf; global batch 4096, microbatch 1 (the paper's setting).
Baselines per case: megatron, alpa, mcmc (a 60-evaluation budget), the paper's Manual / MCMC /
Phaze rows that run as published, and phaze at 64 devices.

How it is checked, and why that is honest. The full NEST search over the 50 cases costs about
270 s of CPU on this repository's CI machine (GPT-3 on h100_spineleaf at 1024 devices alone ~50 s)
and phaze another ~150 s, too slow for CI. NEST is exact over its space (tests/test_nest_dp.py:
equal to brute force on 200 random problems; configurations are pruned only by a proven lower
bound), so ``nest <= b`` for a baseline plan ``b`` follows from two facts this test asserts for
every ``b``: (1) ``b`` lies in NEST's space (degrees, rank order with tp innermost, 1F1B,
microbatch, sequence parallelism as the space has them), and (2) NEST's DP restricted to ``b``'s
configuration (its tp, cp, ep, pp, ZeRO stage and rank order; partition and recompute free)
returns a plan at least as fast as ``b``. On the cheap cases (``FULL_NEST``) the full NEST search
runs too and is asserted directly. ``python -m experiments.fig5_baselines`` runs the full search
on all 50 cases with every planner (docs/compare/baselines.md).
"""

import pytest

from baselines.alpa import AlpaPlanner
from baselines.mcmc import MCMCPlanner
from baselines.megatron import MegatronPlanner
from baselines.paper_table import PaperTablePlanner
from baselines.phaze import PhazePlanner
from experiments.bench_search import problem_for
from experiments.fig5_baselines import CLUSTERS, DEVICES, GLOBAL_BATCH, MODELS, in_nest_space
from nest.core.errors import Infeasible, InvalidConfiguration, UserError
from nest.dp.planner import NestPlanner

# cases where the full NEST search takes well under a second
FULL_NEST = {
    ("tpuv4_fattree", "bert_large", 64),
    ("tpuv4_fattree", "llama2_7b", 64),
    ("tpuv4_fattree", "llama2_7b", 256),
    ("tpuv4_fattree", "llama2_7b", 1024),
    ("tpuv4_fattree", "mixtral_8x7b", 128),
    ("h100_spineleaf", "llama2_7b", 128),
}


def baselines(n_devices: int) -> dict:
    out = {
        "megatron": MegatronPlanner(),
        "alpa": AlpaPlanner(),
        "mcmc": MCMCPlanner(max_evaluations=60, min_evaluations=60),
    }
    for table in ("Manual", "MCMC", "Phaze"):
        out[f"paper_{table}"] = PaperTablePlanner(name=f"paper_{table}", table=table)
    if n_devices == 64:
        out["phaze"] = PhazePlanner()
    return out


def restricted_nest(problem, plan):
    """NEST's DP over the plan's configuration only (partition and recompute free)."""
    order = ",".join(a.value for a in plan.rank_order)
    return NestPlanner(
        tp=[plan.tp],
        cp=[plan.cp],
        ep=[plan.ep],
        pp=[plan.pp],
        zero_stages=[plan.zero_stage],
        rank_orders=[order],
    ).solve(problem)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("cluster", CLUSTERS)
def test_nest_is_never_worse_than_a_baseline_in_its_space(cluster, model):
    checked = 0
    for n in DEVICES:
        problem = problem_for(model, cluster, n, GLOBAL_BATCH, [1])
        best_of_config: dict = {}
        plans = {}
        for name, planner in baselines(n).items():
            try:
                plan = planner.solve(problem)
            except (Infeasible, InvalidConfiguration):
                continue
            except UserError:  # no paper-table row at this scale
                continue
            if plan.status != "infeasible" and in_nest_space(problem, plan):
                plans[name] = plan
        for name, plan in plans.items():
            key = (plan.tp, plan.cp, plan.ep, plan.pp, plan.zero_stage, plan.rank_order)
            if key not in best_of_config:
                best_of_config[key] = restricted_nest(problem, plan).objective_s
            assert best_of_config[key] <= plan.objective_s * (1 + 1e-9), (name, n, plan.degrees())
            checked += 1
        if (cluster, model, n) in FULL_NEST:
            nest = NestPlanner().solve(problem).objective_s
            assert all(nest <= p.objective_s * (1 + 1e-9) for p in plans.values())
            assert all(nest <= v * (1 + 1e-9) for v in best_of_config.values())
    assert checked >= 3 * len(DEVICES)  # megatron, alpa and mcmc plans at least, at every scale
