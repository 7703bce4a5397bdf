"""Where iteration time and memory go, per pipeline rank: ``python -m nest.explain RUN_DIR``.

Built from ``report.json`` alone (the evaluator's every term is in its ``breakdown``), so a past
run can be explained without re-solving; ``explain=true`` on a run does the same and writes
``explain.txt`` / ``explain.json``. For pipeline rank ``r`` with ``m`` microbatches and
per-microbatch time ``t_r`` (its chunks' compute, recompute, TP / CP / EP collectives, ZeRO-3
traffic, p2p and the activation offload's exposed copies, :mod:`nest.cost.offload`):

``T_iter = m t_r + bubble_r + exposed DP sync_r + optimizer_r + wait_r``, where
``bubble_r = T_pipe - m t_r`` (the rank idles inside the pipeline schedule) and ``wait_r`` is the
time the rank waits for the slowest rank's exposed sync and optimizer step
(``T_iter = T_pipe + max_r exposed_r + max_r optimizer_r``, :mod:`nest.cost.evaluate`). Every row
therefore adds up to the iteration time. Memory per device of rank ``r``: weights + FP8 weight
copies + gradients + optimizer state + activations of one microbatch x in-flight microbatches +
communication buffers (ZeRO-3 gathered weights) + other transient buffers + reserve = its total
(:meth:`nest.core.report.MemoryReport.terms`, :mod:`nest.cost.memory`).
"""

import argparse
import json
import sys
from pathlib import Path

from nest.core.errors import UserError
from nest.core.units import GiB

TIME_TERMS = ("compute", "recompute", "tp", "cp", "ep", "zero3", "p2p", "offload")
ROW_TERMS = ("busy", "bubble", "dp_sync_exposed", "optimizer", "wait")
MEMORY_TERMS = (
    "weights",
    "fp8_copies",
    "gradients",
    "optimizer_state",
    "activations",
    "comm_buffers",
    "transient",
    "reserve",
)
"""The disjoint memory terms (:meth:`nest.core.report.MemoryReport.terms`)."""


def memory_terms(mem: dict) -> dict:
    """A rank's memory terms from ``report.json`` (``breakdown.ranks[].memory``); a report
    written before the terms were recorded keeps the FP8 copies in the weights and the
    communication buffers in the transient."""
    if "terms" in mem:
        return mem["terms"]
    return {
        "weights": mem["weights_bytes"],
        "fp8_copies": 0.0,
        "gradients": mem["grads_bytes"],
        "optimizer_state": mem["optimizer_bytes"],
        "activations": mem["activations_bytes"],
        "comm_buffers": 0.0,
        "transient": mem["transient_bytes"],
        "reserve": mem["reserve_bytes"],
    }


def explain_report(report: dict) -> dict:
    """The per-rank breakdown of a ``report.json`` (see the module docstring), all in SI units."""
    b = report.get("breakdown")
    if not b or not b.get("ranks"):
        raise UserError(
            "the report has no evaluated plan to explain (status "
            f"{report.get('status', '?')!r}: {report.get('error') or report.get('violation')})"
        )
    m = report["plan"]["num_microbatches"]
    t_pipe, t_iter = b["pipeline_time_s"], b["iteration_time_s"]
    ranks = []
    for rank in b["ranks"]:
        r = rank["pp_rank"]
        chunks = [s for s in b["stages"] if s["pp_rank"] == r]
        per_mb = {
            "compute": sum(s["compute_fwd_s"] + s["compute_bwd_s"] for s in chunks),
            "recompute": sum(s["recompute_s"] for s in chunks),
            "tp": sum(s["tp_exposed_s"] for s in chunks),
            "cp": sum(s["cp_exposed_s"] for s in chunks),
            "ep": sum(s["ep_exposed_s"] for s in chunks),
            "zero3": sum(s["zero3_exposed_s"] for s in chunks),
            "p2p": sum(s["p2p_fwd_s"] + s["p2p_bwd_s"] for s in chunks),
            # activation offload's copies the compute does not hide (absent in older reports)
            "offload": sum(s.get("offload_exposed_s", 0.0) for s in chunks),
        }
        busy = m * (rank["fwd_s"] + rank["bwd_s"])
        row = {
            "busy": busy,
            "bubble": t_pipe - busy,
            "dp_sync_exposed": rank["dp_sync_exposed_s"],
            "optimizer": rank["optimizer_s"],
        }
        row["wait"] = t_iter - sum(row.values())
        mem = rank["memory"]
        in_flight = mem["in_flight_microbatches"]
        ranks.append(
            {
                "pp_rank": r,
                "layers": [s["first_layer"] for s in chunks[:1]] + [chunks[-1]["last_layer"]],
                "chunks": [[s["first_layer"], s["last_layer"]] for s in chunks],
                "recompute": sorted({s["recompute"] for s in chunks}),
                "per_microbatch_s": per_mb,
                # communication the overlap features hide under compute (not in the sums)
                "hidden_comm_per_microbatch_s": sum(
                    s[f"{axis}_comm_s"] - s[f"{axis}_exposed_s"]
                    for s in chunks
                    for axis in ("tp", "cp", "ep")
                ),
                "per_iteration_s": {**{k: m * v for k, v in per_mb.items()}, **row},
                "dp_sync_s": rank["dp_sync_s"],
                "memory_bytes": {
                    **memory_terms(mem),
                    "activations_per_microbatch": mem["activations_bytes"] / in_flight
                    if in_flight
                    else 0.0,
                    "in_flight_microbatches": in_flight,
                    "total": mem["total_bytes"],
                    "capacity": mem["capacity_bytes"],
                },
            }
        )
    return {
        "solver": report.get("solver"),
        "num_microbatches": m,
        "schedule": report["plan"].get("schedule"),
        "iteration_time_s": t_iter,
        "pipeline_time_s": t_pipe,
        "dp_sync_exposed_s": b["dp_sync_exposed_s"],
        "optimizer_s": b["optimizer_s"],
        "peak_memory_bytes": b["peak_memory_bytes"],
        "ranks": ranks,
    }


def _t(seconds: float, unit: float) -> str:
    return f"{seconds / unit:.2f}"


def format_explain(e: dict) -> str:
    """Two terminal tables: time per iteration and memory per device, one row per pipeline rank."""
    m = e["num_microbatches"]
    unit, uname = (1.0, "s") if e["iteration_time_s"] >= 10 else (1e-3, "ms")
    head = ["rank", "layers", "recomp", *TIME_TERMS, "bubble", "dp-sync", "optim", "wait", "total"]
    rows = []
    for r in e["ranks"]:
        it = r["per_iteration_s"]
        total = sum(it[k] for k in ROW_TERMS)
        rows.append(
            [str(r["pp_rank"]), f"{r['layers'][0]}-{r['layers'][1]}", "/".join(r["recompute"])]
            + [_t(it[k], unit) for k in (*TIME_TERMS, *ROW_TERMS[1:])]
            + [_t(total, unit)]
        )
    mem_head = [
        "rank",
        "weights",
        "fp8",
        "grads",
        "optim",
        "act/mb",
        "x inflt",
        "= acts",
        "comm",
        "buffers",
        "reserve",
        "total",
        "of",
    ]
    mem_rows = []
    for r in e["ranks"]:
        mb = r["memory_bytes"]
        mem_rows.append(
            [str(r["pp_rank"])]
            + [f"{mb[k] / GiB:.2f}" for k in MEMORY_TERMS[:4]]
            + [f"{mb['activations_per_microbatch'] / GiB:.3f}", f"{mb['in_flight_microbatches']:g}"]
            + [f"{mb[k] / GiB:.2f}" for k in (*MEMORY_TERMS[4:], "total")]
            + [f"{mb['capacity'] / GiB:.2f}"]
        )
    out = [
        f"time per iteration ({uname}), {e['num_microbatches']} microbatches, {e['schedule']}: "
        "compute..p2p = m x per-microbatch time; every row adds up to the iteration",
        *_table(head, rows),
        f"iteration {_t(e['iteration_time_s'], unit)} {uname} = pipeline "
        f"{_t(e['pipeline_time_s'], unit)} + max exposed DP sync "
        f"{_t(e['dp_sync_exposed_s'], unit)} + max optimizer {_t(e['optimizer_s'], unit)}",
        "tp/cp/ep columns are the exposed communication; hidden under compute per iteration: "
        + ", ".join(
            f"rank {r['pp_rank']} {_t(m * r['hidden_comm_per_microbatch_s'], unit)}"
            for r in e["ranks"]
        )
        + f" {uname}",
        "",
        "memory per device (GiB): weights + fp8 copies + grads + optim + act/mb x in-flight + "
        "comm buffers + other buffers + reserve",
        *_table(mem_head, mem_rows),
        f"peak {e['peak_memory_bytes'] / GiB:.2f} GiB",
    ]
    return "\n".join(out)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: " ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return [line(head), *(line(row) for row in rows)]


def load_report(run_dir: Path) -> dict:
    path = run_dir / "report.json" if run_dir.is_dir() else run_dir
    if not path.is_file():
        raise UserError(f"{path} does not exist; give a run directory holding report.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON: {exc}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nest.explain", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dir", type=Path, help="a run directory (or its report.json)")
    parser.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    args = parser.parse_args(argv)
    try:
        e = explain_report(load_report(args.run_dir))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(e, indent=2) if args.json else format_explain(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
