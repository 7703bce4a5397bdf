"""Every planner on the paper's Figure 5 grid, and whether NEST is ever beaten.

``python -m experiments.fig5_baselines [--quick] [--solvers nest,megatron,...]``

Cases: bert_large, llama2_7b, llama3_70b, mixtral_8x7b, gpt3_175b x 64..1024 devices on
tpuv4_fattree and h100_spineleaf, global batch 4096, microbatch 1 (the paper's setting). For each
case it runs the planners, the paper's table rows (``paper_table``, as published), prints one line
per case (iteration time per planner, CPU seconds per planner) and a final ``NEST_NEVER_WORSE``
line counting the plans of NEST's space that beat NEST (expected: 0). This is the full-grid check
that the test suite does per configuration (tests/test_fig5_grid.py) because the full NEST search
over the 50 cases costs minutes of CPU.
"""

import argparse
import json
import time

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from experiments.bench_search import problem_for
from nest.app.config import CONF_DIR, register_schemas
from nest.core.errors import Infeasible, InvalidConfiguration, UserError

MODELS = ("bert_large", "llama2_7b", "llama3_70b", "mixtral_8x7b", "gpt3_175b")
DEVICES = (64, 128, 256, 512, 1024)
CLUSTERS = ("tpuv4_fattree", "h100_spineleaf")
GLOBAL_BATCH = 4096


NOT_IN_FIGURE = {
    "brute": "exponential in the stages",
    "cpsat": "an exact solver with a time limit (experiments/optimality compares it)",
    "milp": "an exact solver with a time limit (experiments/optimality compares it)",
    "fixed": "a user-given plan",
    "paper_table": "paper_manual, paper_mcmc and paper_phaze fix its table",
}
"""Planners of conf/solver/ this figure leaves out, and why; it runs every other one."""


def planners(mcmc_evaluations: int = 300) -> dict:
    """Every planner of conf/solver/ but :data:`NOT_IN_FIGURE`, as its preset configures it
    (the paper's microbatch of 1; mcmc with ``mcmc_evaluations`` evaluations)."""
    names = sorted(p.stem for p in (CONF_DIR / "solver").glob("*.yaml"))
    out = {}
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in names:
            if name in NOT_IN_FIGURE:
                continue
            overrides = [f"solver={name}", "training.microbatch_sizes=[1]"]
            if name == "mcmc":
                overrides.append(f"solver.max_evaluations={mcmc_evaluations}")
            cfg = compose(config_name="config", overrides=overrides)
            out[name] = instantiate(cfg.solver, _convert_="all")
    return out


def in_nest_space(problem, plan) -> bool:
    """Whether NEST's full space holds this plan (see nest.dp.space)."""
    n = problem.cluster.num_devices
    training = problem.training
    return (
        plan.schedule.value == "1f1b"
        and plan.rank_order[0].value == "tp"
        and n % plan.tp == 0
        and (n // plan.tp) % plan.cp == 0
        and plan.microbatch_size in training.microbatch_sizes
        and plan.sequence_parallel == (training.sequence_parallel and plan.tp > 1)
    )


def run_case(model, cluster, devices, chosen):
    problem = problem_for(model, cluster, devices, GLOBAL_BATCH, [1])
    row = {"model": model, "cluster": cluster, "devices": devices}
    for name, planner in chosen.items():
        start = time.process_time()
        try:
            plan = planner.solve(problem)
            value = plan.objective_s if plan.status != "infeasible" else None
            row[name] = {"s": value, "in_space": in_nest_space(problem, plan)}
        except (Infeasible, InvalidConfiguration) as exc:
            row[name] = {"s": None, "status": type(exc).__name__}
        except UserError:  # e.g. no paper-table row at this scale
            row[name] = {"s": None, "status": "no_row"}
        row[name]["cpu_s"] = time.process_time() - start
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 and 1024 devices, tpuv4 only")
    parser.add_argument("--solvers", default=None)
    parser.add_argument("--clusters", default=",".join(CLUSTERS))
    args = parser.parse_args(argv)
    chosen = planners()
    if args.solvers:
        chosen = {k: v for k, v in chosen.items() if k in args.solvers.split(",")}
    clusters = CLUSTERS[:1] if args.quick else args.clusters.split(",")
    devices = (64, 1024) if args.quick else DEVICES
    beaten, cpu = 0, {k: 0.0 for k in chosen}
    for cluster in clusters:
        for model in MODELS:
            for n in devices:
                row = run_case(model, cluster, n, chosen)
                nest = row.get("nest", {}).get("s")
                for name in chosen:
                    cpu[name] += row[name]["cpu_s"]
                    other = row[name].get("s")
                    if nest is not None and other is not None and row[name]["in_space"]:
                        beaten += other < nest * (1 - 1e-9)
                cells = " ".join(
                    f"{k}={row[k]['s']:.4g}" if row[k].get("s") else f"{k}=-" for k in chosen
                )
                print(f"{cluster} {model} {n}: {cells}", flush=True)
                print("ROW " + json.dumps(row), flush=True)
    print("CPU_S " + json.dumps({k: round(v, 2) for k, v in cpu.items()}))
    print(f"NEST_NEVER_WORSE beaten={beaten}")
    return 0 if beaten == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
