"""Tables, histogram and summary of an optimality-study sweep.

    python -m experiments.optimality.aggregate multirun/optimality/<time>

Reads every job's ``row.json`` and writes into the sweep directory ``optimality.csv`` (one row
per instance: size, each solver's value, status and time, the restricted-vs-general gap),
``gap_histogram.png`` and ``summary.md`` (agreement of nest with the exact solvers, the share of
instances where the structured space is already optimal in general, the worst gap, solver times
and what the warm start changed). The Hydra callback runs it at the end of the sweep.
"""

import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from experiments.aggregate import rowless_job
from nest.core.files import atomic_path, write_text

log = logging.getLogger(__name__)

ROW_FILE = "row.json"
REL = 1e-6


def load_rows(sweep_dir: Path) -> list[dict]:
    """Every instance's row; an instance directory without one (killed, or its worker process
    died: the ``parallel`` launcher's ``error.txt`` says so) is named in a note on stderr."""
    rows = []
    for path in sorted(sweep_dir.glob(f"*/{ROW_FILE}"), key=lambda p: p.parent.name):
        try:
            rows.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            print(f"note: {path} is not a readable row; skipped", file=sys.stderr)
    for job_dir in sorted(p.parent for p in sweep_dir.glob("*/.hydra")):
        if not (job_dir / ROW_FILE).exists():
            why = rowless_job(job_dir)["error"]  # the sweep aggregation's reading of it
            print(f"note: {job_dir} has no {ROW_FILE} ({why}); skipped", file=sys.stderr)
    return rows


def table(rows: list[dict]) -> pd.DataFrame:
    records = []
    for row in rows:
        rec = {k: v for k, v in row.items() if k not in ("solvers",)}
        for name, res in row.get("solvers", {}).items():
            rec[f"{name}_s"] = res.get("value_s")
            rec[f"{name}_status"] = res.get("status")
            rec[f"{name}_time_s"] = res.get("time_s")
            if "time_solver_s" in res.get("search", {}):
                rec[f"{name}_solver_s"] = res["search"]["time_solver_s"]
        records.append(rec)
    df = pd.DataFrame.from_records(records)
    if len(rows) and all("solvers" in row for row in rows):  # from proven optima only
        from experiments.optimality.run import general_gap

        df["general_gap"] = [general_gap(row["solvers"]) for row in rows]
    return df.sort_values(["seed", *(["network"] if "network" in df else [])]).reset_index(
        drop=True
    )


def _same(a, b) -> bool:
    return a is not None and b is not None and abs(a - b) <= REL * max(abs(a), abs(b))


def summarise(df: pd.DataFrame) -> dict:
    """The numbers docs/trust/exact.md quotes."""
    solved = df[df["nest_status"] == "optimal"]
    out: dict[str, Any] = {"instances": len(df), "feasible": len(solved)}
    out["infeasible"] = int((df["nest_status"] == "infeasible").sum())
    agree = {}
    for name in ("brute", "cpsat_restricted", "milp_restricted"):
        col = f"{name}_s"
        if col not in df:
            continue
        ran = solved[solved[f"{name}_status"].isin(["optimal", "feasible"])]
        agree[name] = {
            "compared": len(ran),
            "equal": int(sum(_same(a, b) for a, b in zip(ran["nest_s"], ran[col], strict=True))),
        }
    out["nest_agrees_with"] = agree
    statuses = {}
    for col in df.columns:
        if col.endswith("_status"):
            statuses[col[: -len("_status")]] = df[col].value_counts().to_dict()
    out["statuses"] = statuses
    gaps = solved["general_gap"].dropna() if "general_gap" in solved else pd.Series(dtype=float)
    if len(gaps):
        out["general_compared"] = len(gaps)
        out["general_already_optimal_share"] = float((gaps <= REL).mean())
        worst = solved.loc[gaps.idxmax()]
        out["worst_gap"] = float(gaps.max())
        out["worst_gap_seed"] = int(worst["seed"])
        out["mean_gap"] = float(gaps.mean())
        if "monotone_network" in solved:
            for flag, label in ((True, "monotone"), (False, "non_monotone")):
                sub = gaps[solved.loc[gaps.index, "monotone_network"] == flag]
                if len(sub):
                    out[f"{label}_compared"] = len(sub)
                    out[f"{label}_already_optimal_share"] = float((sub <= REL).mean())
                    out[f"{label}_worst_gap"] = float(sub.max())
    if len(gaps) and "network" in solved:
        by_network = {}
        for network, sub in gaps.groupby(solved.loc[gaps.index, "network"], sort=False):
            worst = solved.loc[sub.idxmax()]
            by_network[str(network)] = {
                "compared": len(sub),
                "already_optimal_share": float((sub <= REL).mean()),
                "mean_gap": float(sub.mean()),
                "worst_gap": float(sub.max()),
                "worst_gap_seed": int(worst["seed"]),
            }
        out["by_network"] = by_network
    times = {}
    for col in df.columns:
        if col.endswith("_time_s"):
            t = df[col].dropna()
            t = t[t > 0]
            if len(t):
                times[col[: -len("_time_s")]] = {
                    "median_s": float(t.median()),
                    "p95_s": float(np.percentile(t, 95)),
                    "max_s": float(t.max()),
                }
    out["times"] = times
    for backend in ("cpsat", "milp"):
        # the solver's own time: the DP and the tables are the same with and without the hint
        a, b = f"{backend}_restricted_solver_s", f"{backend}_restricted_nohint_solver_s"
        if a in solved and b in solved:
            pair = solved[[a, b]].dropna()
            ratio = pair[b] / pair[a]
            out[f"{backend}_hint_speedup_median"] = float(ratio.median())
            out[f"{backend}_hint_faster_share"] = float((ratio > 1).mean())
    return out


def histogram(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gaps = df["general_gap"].dropna() * 100 if "general_gap" in df else pd.Series(dtype=float)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if len(gaps):
        top = max(float(gaps.max()), 1e-3)
        bins = np.linspace(0, top * 1.05, 30)
        if "monotone_network" in df:
            mono = df.loc[gaps.index, "monotone_network"].astype(bool)
            ax.hist(
                [gaps[mono], gaps[~mono]],
                bins=bins,
                stacked=True,
                color=["#4c72b0", "#dd8452"],
                label=["monotone network", "an outer level faster"],
            )
            ax.legend()
        else:
            ax.hist(gaps, bins=bins, color="#4c72b0")
        ax.set_yscale("log")
    ax.set_xlabel("restricted - general, % of restricted iteration time")
    ax.set_ylabel("instances (log)")
    ax.set_title(f"What the structured space leaves on the table ({len(gaps)} instances)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


def markdown(summary: dict) -> str:
    lines = [
        "# Optimality study",
        "",
        f"- instances: {summary['instances']} ({summary['feasible']} feasible, "
        f"{summary['infeasible']} infeasible: every solver agreed none fits)",
    ]
    for name, a in summary["nest_agrees_with"].items():
        lines.append(f"- nest == {name}: {a['equal']} of {a['compared']} (1e-6 relative)")
    if "general_compared" in summary:
        lines.append(
            f"- general placement no better than nest's space on "
            f"{summary['general_already_optimal_share']:.1%} of {summary['general_compared']} "
            f"instances; worst gap {summary['worst_gap']:.2%} (seed {summary['worst_gap_seed']}), "
            f"mean {summary['mean_gap']:.3%}"
        )
    networks = (
        ("monotone", "monotone networks (bandwidth never rising, latency never falling outwards)"),
        ("non_monotone", "other networks"),
    )
    for label, text in networks:
        if f"{label}_compared" in summary:
            lines.append(
                f"  - {text}: {summary[f'{label}_already_optimal_share']:.1%} of "
                f"{summary[f'{label}_compared']}, worst gap {summary[f'{label}_worst_gap']:.2%}"
            )
    if len(summary.get("by_network", {})) > 1 or set(summary.get("by_network", {})) - {"hierarchy"}:
        lines += [
            "",
            "Structured space (nest's, on the cluster's hierarchy or the one derived from its "
            "graph) against every placement, by network:",
            "",
            "| network | instances | structured already optimal | mean gap | worst gap (seed) |",
            "|---|---|---|---|---|",
        ]
        for network, g in summary["by_network"].items():
            lines.append(
                f"| {network} | {g['compared']} | {g['already_optimal_share']:.1%} | "
                f"{g['mean_gap']:.2%} | {g['worst_gap']:.2%} ({g['worst_gap_seed']}) |"
            )
        lines.append("")
    for backend in ("cpsat", "milp"):
        key = f"{backend}_hint_speedup_median"
        if key in summary:
            lines.append(
                f"- {backend} restricted, warm start from the DP: median solver speed-up "
                f"{summary[key]:.2f}x, faster on {summary[f'{backend}_hint_faster_share']:.0%}"
            )
    lines += ["", "| solver | median s | p95 s | max s | statuses |", "|---|---|---|---|---|"]
    for name, t in summary["times"].items():
        st = ", ".join(f"{k} {v}" for k, v in summary["statuses"].get(name, {}).items())
        lines.append(
            f"| {name} | {t['median_s']:.3f} | {t['p95_s']:.3f} | {t['max_s']:.3f} | {st} |"
        )
    return "\n".join(lines) + "\n"


def aggregate(sweep_dir: Path) -> dict:
    rows = load_rows(sweep_dir)
    if not rows:
        raise SystemExit(f"no {ROW_FILE} under {sweep_dir}; is it an optimality sweep?")
    df = table(rows)
    with atomic_path(sweep_dir / "optimality.csv") as tmp:
        df.to_csv(tmp, index=False)
    summary = summarise(df)
    write_text(sweep_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    write_text(sweep_dir / "summary.md", markdown(summary))
    histogram(df, sweep_dir / "gap_histogram.png")
    return summary


def study_progress(sweep_dir: Path) -> str:
    """``12/300 instances done`` (plus ``, 1 with a solver crashed`` or errored) from the rows
    written so far and the total of ``sweep.json``."""
    from experiments.callbacks import sweep_total

    done, troubled = 0, 0
    for path in sweep_dir.glob(f"*/{ROW_FILE}"):
        try:
            row = json.loads(path.read_text())
        except (OSError, ValueError):  # being written
            continue
        done += 1
        statuses = {r.get("status") for r in row.get("solvers", {}).values()}
        troubled += bool(statuses & {"crashed", "error"} or "error" in row)
    total = sweep_total(sweep_dir)
    text = f"{done}/{total if total is not None else '?'} instances done"
    return text + (f", {troubled} with a solver crashed or in error" if troubled else "")


class StudyCallback(Callback):
    """Progress after each instance; the table, histogram and summary at the end."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from experiments.callbacks import write_sweep_record

        record = write_sweep_record(config)
        log.info(
            "optimality study: %s instances into %s",
            record["total_jobs"] or "?",
            config.hydra.sweep.dir,
        )

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            log.info("optimality progress: %s", study_progress(Path(config.hydra.sweep.dir)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        aggregate(sweep_dir)
        print((sweep_dir / "summary.md").read_text(), flush=True)
        print(f"wrote optimality.csv, summary.md, gap_histogram.png to {sweep_dir}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m experiments.optimality.aggregate SWEEP_DIR", file=sys.stderr)
        return 2
    sweep_dir = Path(args[0])
    if not sweep_dir.is_dir():
        print(f"error: {sweep_dir} is not a directory", file=sys.stderr)
        return 2
    aggregate(sweep_dir)
    print((sweep_dir / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
