"""The largest instance each exact solver proves optimal within a time limit.

    python -m experiments.optimality.scaling [--time-limit-s 60] [--out DIR]

A series of growing problems (a 512-wide, 8-head transformer of 2 to 32 blocks on 4 to 512
devices, 8 devices per node, nest's full space), solved in turn by ``cpsat`` and ``milp`` in
both modes until one is not proven optimal within the limit, counted as the whole solve's wall
time (DP, tables, model and solver), or the general mode's placement enumeration refuses the
size. Prints a table and one JSON line per solve; with
``--out`` also writes ``scaling.csv`` there.
"""

import argparse
import json
import signal
import time
from pathlib import Path

import pandas as pd

from nest.core.errors import Infeasible, SolverTimeout, UserError
from nest.core.files import atomic_path
from nest.core.hardware import Device
from nest.core.layers import AnalyticModel
from nest.core.model import ModelSpec
from nest.core.problem import Problem, Training
from nest.core.topology import Cluster, Level
from nest.core.units import GB, TFLOP, US, GiB
from nest.exact.planner import ExactPlanner

SERIES = ((4, 2), (8, 4), (16, 6), (32, 8), (64, 12), (128, 16), (256, 24), (512, 32))
"""(devices, transformer blocks) of each step."""


def step_problem(devices: int, blocks: int) -> Problem:
    per_node = min(devices, 8)
    levels = [Level(name="node", fanout=per_node, bw_bytes_per_s=450 * GB, latency_s=2 * US)]
    if devices > per_node:
        levels.append(
            Level(name="net", fanout=devices // per_node, bw_bytes_per_s=50 * GB, latency_s=8 * US)
        )
    device = Device(
        name="h100-like",
        peak_flops_per_s=989 * TFLOP,
        hbm_bytes=80 * GiB,
        hbm_bw_bytes_per_s=3350 * GB,
        matmul_efficiency=0.6,
    )
    spec = ModelSpec(
        name=f"w512x{blocks}",
        hidden=512,
        layers=blocks,
        heads=8,
        ffn_hidden=2048,
        vocab=8192,
        seq_len=512,
        activation="swiglu",
        dropout=False,
    )
    training = Training(
        global_batch=2 * devices,
        microbatch_sizes=(1, 2),
        overlap_grad_sync=False,
        tp_comm_overlap=False,  # the model below overlaps nothing
        cp_comm_overlap=False,
    )
    return Problem(
        model=AnalyticModel(spec),
        cluster=Cluster(name=f"{devices}dev", device=device, levels=tuple(levels)),
        training=training,
    )


class OverTime(Exception):
    """The whole solve passed the limit before the solver was reached or returned."""


def _over_time(signum, frame):
    raise OverTime("over the time limit")


def run(time_limit_s: float) -> pd.DataFrame:
    records = []
    for backend in ("cpsat", "milp"):
        for mode in ("restricted", "general"):
            for devices, blocks in SERIES:
                problem = step_problem(devices, blocks)
                planner = ExactPlanner(
                    name=backend, backend=backend, mode=mode, time_limit_s=time_limit_s
                )
                started = time.perf_counter()
                rec = {"solver": backend, "mode": mode, "devices": devices, "blocks": blocks}
                # the limit covers the Python side too (the DP, the tables, building the model)
                signal.signal(signal.SIGALRM, _over_time)
                signal.setitimer(signal.ITIMER_REAL, time_limit_s + 1.0)
                try:
                    plan = planner.solve(problem)
                    rec.update(status=plan.status, gap=plan.search.get("gap"))
                    rec["booleans"] = plan.search.get("booleans")
                    rec["solver_s"] = plan.search.get("time_solver_s")
                except (Infeasible, SolverTimeout, UserError, OverTime) as exc:
                    rec.update(status=type(exc).__name__, note=str(exc)[:120])
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                rec["wall_s"] = time.perf_counter() - started
                # "within the limit" counts the whole solve: the DP, the tables and the model
                rec["proven_within_limit"] = (
                    rec["status"] == "optimal" and rec["wall_s"] <= time_limit_s
                )
                print(json.dumps(rec), flush=True)
                records.append(rec)
                if not rec["proven_within_limit"]:
                    break
    return pd.DataFrame.from_records(records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    df = run(args.time_limit_s)
    print(df.to_markdown(index=False, floatfmt=".3g"))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_path(args.out / "scaling.csv") as tmp:
            df.to_csv(tmp, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
