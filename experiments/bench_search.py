"""Benchmark of the NEST search: ``python -m experiments.bench_search [--quick]``.

Times the full-space search (1F1B and interleaved) on the issue's target cases and on two
device-count series, prints a table and one machine-readable JSON line per case
(``BENCH {...}``), and the ratio to the ``megatron`` rules' iteration time in the same run.
``--graphs``: the graph clusters instead (a TPU v4 torus from 64 to 4096 chips, rails and
leaf-spine at 1024 GPUs); ``build s`` is the CPU time of building the problem, the graph and its
derived hierarchy included. Each case runs in a fresh process, so its peak resident memory is its
own; CPU seconds are reported next to wall seconds because the machine may be shared.
``--top-k K`` runs the search for the K best configurations (``solver.top_k``; the row's
``kth_iteration_time_s`` is the K-th's time), ``--targets`` only the issue's two target cases
(the default run adds the 1024-chip target on the TPU v4 torus graph).
"""

import argparse
import json
import multiprocessing
import resource
import time

from hydra import compose, initialize_config_dir

from baselines.megatron import MegatronPlanner
from nest.app.cli import CONF_DIR, register_schemas
from nest.app.config import build_problem
from nest.core.errors import Infeasible
from nest.dp.planner import NestPlanner

ISSUE_TARGETS = [
    ("gpt3_175b", "tpuv4_fattree", 1024, 4096, [1, 2, 4, 8], 10.0),
    ("llama3_405b", "dgx_h100_superpod", 16384, 4096, [1, 2, 4, 8], 60.0),
]
TARGETS = [*ISSUE_TARGETS, ("gpt3_175b", "tpuv4_torus", 1024, 4096, [1, 2, 4, 8], 10.0)]
GRAPHS = [
    ("gpt3_175b", "tpuv4_torus", n, 4096, [1, 2, 4, 8], 10.0 if n == 1024 else None)
    for n in (64, 128, 256, 512, 1024, 2048, 4096)
] + [
    ("gpt3_175b", cluster, 1024, 4096, [1, 2, 4, 8], None)
    for cluster in ("rail_optimized", "leaf_spine")
]
"""Graph clusters (nest/graph): the torus series around the 1024-chip target, and the other
two graph presets at 1024 GPUs."""
SERIES = [
    ("gpt3_175b", "tpuv4_fattree", n, 4096, [1, 2, 4, 8], None)
    for n in (64, 128, 256, 512, 2048, 4096, 8192, 16384)
] + [
    ("llama3_405b", "dgx_h100_superpod", n, 4096, [1, 2, 4, 8], None)
    for n in (256, 1024, 4096)  # the superpod comes in multiples of 256 GPUs
]
QUICK = [
    ("llama2_7b", "dgx_8x8", 64, 1024, [1, 2, 4], None),
    ("gpt3_175b", "tpuv4_fattree", 128, 4096, [1, 2, 4, 8], None),
]


def problem_for(model, cluster, devices, batch, mbs):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                f"model={model}",
                f"cluster={cluster}",
                f"cluster.devices={devices}",
                f"training.global_batch={batch}",
                f"training.microbatch_sizes=[{','.join(map(str, mbs))}]",
            ],
        )
    return build_problem(cfg)


def run_case(model, cluster, devices, batch, mbs, target_s, top_k=1):
    register_schemas()
    start, cpu = time.perf_counter(), time.process_time()
    problem = problem_for(model, cluster, devices, batch, mbs)
    build_wall, build_cpu = time.perf_counter() - start, time.process_time() - cpu
    start, cpu = time.perf_counter(), time.process_time()
    try:
        plans = NestPlanner(top_k=top_k).solve_ranked(problem)
        plan = plans[0]
        status, value, kth = plan.status, plan.objective_s, plans[-1].objective_s
    except Infeasible:
        plan, status, value, kth, plans = None, "infeasible", None, None, []
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    start = time.perf_counter()
    try:
        meg = MegatronPlanner().solve(problem).objective_s
    except Infeasible:
        meg = None
    meg_wall = time.perf_counter() - start
    row = {
        "model": model,
        "cluster": cluster,
        "devices": devices,
        "global_batch": batch,
        "microbatch_sizes": mbs,
        "status": status,
        "iteration_time_s": value,
        "top_k": top_k,
        "configurations_returned": len(plans),
        "kth_iteration_time_s": kth,
        "solve_wall_s": wall,
        "solve_cpu_s": cpu,
        "build_wall_s": build_wall,
        "build_cpu_s": build_cpu,
        "process_peak_rss_bytes": peak,
        "target_s": target_s,
        "megatron_iteration_time_s": meg,
        "megatron_solve_wall_s": meg_wall,
        "speedup_vs_megatron": (meg / value) if meg and value else None,
        "plan": None
        if plan is None
        else {
            "tp": plan.tp,
            "cp": plan.cp,
            "ep": plan.ep,
            "dp": plan.dp,
            "pp": plan.pp,
            "mbs": plan.microbatch_size,
            "zero": plan.zero_stage,
            "rank_order": ",".join(plan.rank_order),
            "schedule": str(plan.schedule),
            "v": plan.virtual_stages,
        },
        "search": None if plan is None else dict(plan.search),
    }
    return row


def run_isolated(case, top_k=1):
    """One case in a fresh process (its own peak memory, no caches from earlier cases)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(run_case, (*case, top_k))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_search")
    parser.add_argument("--quick", action="store_true", help="two small cases only")
    parser.add_argument("--targets", action="store_true", help="the two target cases only")
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="the graph clusters only (torus series, rails, leaf-spine)",
    )
    parser.add_argument(
        "--top-k", type=int, default=1, help="search the K best configurations (solver.top_k)"
    )
    args = parser.parse_args()
    cases = (
        QUICK
        if args.quick
        else ISSUE_TARGETS
        if args.targets
        else GRAPHS
        if args.graphs
        else SERIES + TARGETS
    )
    print(
        f"{'case':<36} {'configs':>9} {'solved':>7} {'build s':>7} {'wall s':>7} {'cpu s':>7} "
        f"{'rss MB':>7} "
        f"{'target':>6} {'iter s':>8} {'x megatron':>10}  plan"
    )
    for case in cases:
        row = run_isolated(case, args.top_k)
        name = f"{row['model']}@{row['cluster']}/{row['devices']}"
        target = f"{row['target_s']:.0f}" if row["target_s"] else "-"
        it = f"{row['iteration_time_s']:.3f}" if row["iteration_time_s"] else row["status"]
        sp = f"{row['speedup_vs_megatron']:.2f}" if row["speedup_vs_megatron"] else "-"
        p = row["plan"] or {}
        search = row["search"] or {}
        print(
            f"{name:<36} {search.get('configurations', 0):>9} "
            f"{search.get('configurations_solved', 0):>7} {row['build_cpu_s']:>7.2f} "
            f"{row['solve_wall_s']:>7.2f} "
            f"{row['solve_cpu_s']:>7.2f} {row['process_peak_rss_bytes'] / 2**20:>7.0f} "
            f"{target:>6} {it:>8} {sp:>10}  {p}"
        )
        print("BENCH " + json.dumps(row, default=str), flush=True)


if __name__ == "__main__":
    main()
