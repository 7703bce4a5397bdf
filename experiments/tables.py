"""The readable tables of a sweep (``results.md``): pivots of the comparison and every job."""

from collections.abc import Callable, Sequence

import pandas as pd

from experiments.published import published_table
from nest.core.units import GiB

STATUS_CELL = {"infeasible": "OOM", "error": "error", "crashed": "crashed", "missing": "missing"}
"""What a pivot cell shows for a job without a feasible plan."""
DEGREES = ("tp", "cp", "ep", "dp", "pp")
ROW_KEYS = ("cluster", "model", "variant", "global_batch", "devices", "microbatch")


def _row_keys(comp: pd.DataFrame) -> list[str]:
    return [k for k in ROW_KEYS if k == "model" or comp[k].nunique(dropna=True) > 1]


def _ordered(comp: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Sort by the keys: text in the order the sweep ran it, numbers numerically."""
    order = comp.copy()
    for k in keys:
        if k in ("devices", "microbatch", "global_batch"):
            order[k] = pd.to_numeric(order[k], errors="coerce").astype("Int64")
        else:
            order[k] = pd.Categorical(order[k], categories=list(dict.fromkeys(order[k])))
    return order.sort_values(list(keys), kind="stable")


def pivot(
    comp: pd.DataFrame, value: str, fmt: Callable[[float], str], planners: Sequence[str]
) -> pd.DataFrame:
    """Cases down, planners across; a cell is ``fmt(value)`` or the job's status (``OOM``...)."""
    keys = _row_keys(comp)
    cells = _ordered(comp, keys)
    cells["cell"] = [
        fmt(v) if ok and pd.notna(v) else STATUS_CELL.get(status, str(status))
        for v, ok, status in zip(cells[value], cells["feasible"], cells["status"], strict=True)
    ]
    table = cells.drop_duplicates([*keys, "planner"]).pivot(
        index=keys, columns="planner", values="cell"
    )
    table = table.reindex(columns=list(planners)).fillna("-")
    table.columns.name = None
    return table.reset_index()


def schedule_cell(schedule, virtual_stages) -> str:
    """``1f1b``, ``gpipe``, ``interleaved v=2`` (model chunks per device); empty without a plan."""
    if not isinstance(schedule, str) or not schedule:
        return ""
    if schedule == "interleaved" and pd.notna(virtual_stages):
        return f"{schedule} v={int(virtual_stages)}"
    return schedule


def _all_jobs(df: pd.DataFrame) -> pd.DataFrame:
    show = pd.DataFrame(
        {
            "job": df["job"],
            "planner": df["planner"],
            "model": df["model"],
            "cluster": df["cluster"],
            "devices": df["devices"],
            "status": df["status"],
            "tp cp ep dp pp": [
                " ".join("-" if pd.isna(r[k]) else str(int(r[k])) for k in DEGREES)
                for _, r in df.iterrows()
            ],
            "mbs": df["microbatch_size"],
            "schedule": [
                schedule_cell(s, v)
                for s, v in zip(df["schedule"], df["virtual_stages"], strict=True)
            ],
            "ZeRO": df["zero_stage"],
            "recompute": df["recompute"],
            "iteration s": df["iteration_time_s"].map(lambda v: f"{v:.4g}" if pd.notna(v) else ""),
            "samples/s": df["throughput_samples_per_s"].map(
                lambda v: f"{v:.4g}" if pd.notna(v) else ""
            ),
            "MFU %": df["mfu"].map(lambda v: f"{100 * v:.1f}" if pd.notna(v) else ""),
            "peak GiB": df["peak_memory_bytes"].map(
                lambda v: f"{v / GiB:.1f}" if pd.notna(v) else ""
            ),
            "solve s": df["solve_wall_s"].map(lambda v: f"{v:.2f}" if pd.notna(v) else ""),
            "error": df["error"].map(
                lambda e: (e[:120] + "...") if isinstance(e, str) and len(e) > 120 else e
            ),
        }
    )
    for col in ("devices", "mbs", "ZeRO"):
        show[col] = pd.to_numeric(show[col], errors="coerce").astype("Int64")
    return show


TOPOLOGY_REFERENCE = "nest"
TOPOLOGY_OTHERS = ("phaze", "mcmc", "alpa", "megatron")
"""Compared with ``nest`` by cluster: ``phaze`` runs nest's search on a flat copy of the network
(every pair at the slowest pair's speed) and ``mcmc`` searches on one too, ``alpa`` on two
levels, ``megatron`` follows fixed rules."""


def topology_table(comp: pd.DataFrame, planners: Sequence[str]) -> pd.DataFrame | None:
    """What topology awareness buys, by cluster: ``nest``'s iteration time and every other
    planner's relative to it, one row per case; None unless the sweep spans several clusters
    and has ``nest`` and one of :data:`TOPOLOGY_OTHERS`."""
    others = [p for p in TOPOLOGY_OTHERS if p in planners]
    if comp["cluster"].nunique() < 2 or TOPOLOGY_REFERENCE not in planners or not others:
        return None
    keys = ["cluster", *(k for k in _row_keys(comp) if k != "cluster")]
    ok = comp["feasible"] & comp["iteration_time_s"].notna()
    cells = _ordered(comp[ok], keys)
    rows = []
    for case, group in cells.groupby(keys, sort=False, observed=True):
        times = group.drop_duplicates("planner").set_index("planner")["iteration_time_s"]
        if TOPOLOGY_REFERENCE not in times:
            continue
        ref = float(times[TOPOLOGY_REFERENCE])
        row = dict(zip(keys, case, strict=True))
        row = {"cluster": row.pop("cluster"), "network": group["network"].iloc[0], **row}
        row["nest iteration s"] = f"{ref:.4g}"
        for p in others:
            row[f"{p} / nest"] = f"{float(times[p]) / ref:.2f}x" if p in times else "-"
        rows.append(row)
    return pd.DataFrame(rows) if rows else None


def _md(table: pd.DataFrame) -> str:
    """Markdown with every cell as written (no re-parsing of "1.00" into 1)."""
    text = table.astype(object).where(table.notna(), "").astype(str)
    return text.to_markdown(index=False, disable_numparse=True)


def results_markdown(
    df: pd.DataFrame,
    comp: pd.DataFrame,
    baseline: str,
    planners: Sequence[str],
    name: str,
    *,
    also: Sequence[str] = (),
    gpu_hour_usd: float | None = None,
) -> str:
    """``results.md``: normalised throughput, speed-ups (over the baseline and each planner of
    ``also``), throughput, MFU, cost per token, wall time, every job."""
    counts = ", ".join(
        f"{n} {s}" for s, n in sorted(df["status"].fillna("?").value_counts().items())
    )
    parts = [
        f"# Sweep results: {name}",
        "",
        f"{len(df)} jobs ({counts}). Baseline planner: `{baseline}`. Built by "
        "`python -m experiments.aggregate`; every column is in `results.csv`. A cell shows the "
        "job's status when it has no feasible plan (OOM: nothing fits memory).",
    ]
    parts += _speedup_sections(comp, baseline, planners, also)
    parts += _context_sections(comp, baseline, planners)
    parts += _measure_sections(df, comp, planners, gpu_hour_usd)
    return "\n".join(parts)


def _speedup_sections(comp, baseline: str, planners, also) -> list[str]:
    """Throughput normalised to the baseline, speed-ups over it and over each of ``also``."""
    parts: list[str] = []
    if comp["norm_throughput"].notna().any():
        parts += [
            "",
            f"## Throughput normalised to `{baseline}` at its smallest feasible scale",
            "",
            "Each model's throughput divided by the baseline's at the smallest device count (then "
            "microbatch size) where the baseline fits: the NEST paper's normalisation (to Manual).",
            "",
            _md(pivot(comp, "norm_throughput", lambda v: f"{v:.2f}", planners)),
            "",
            f"## Speed-up over `{baseline}` at the same scale",
            "",
            _md(pivot(comp, "speedup_vs_baseline", lambda v: f"{v:.2f}x", planners)),
        ]
    for ref in also:
        column = f"speedup_vs_{ref}"
        if column in comp and comp[column].notna().any():
            parts += [
                "",
                f"## Speed-up over `{ref}` at the same scale",
                "",
                f"Each planner's throughput divided by `{ref}`'s in the same case.",
                "",
                _md(pivot(comp, column, lambda v: f"{v:.2f}x", planners)),
            ]
    return parts


def _context_sections(comp, baseline: str, planners) -> list[str]:
    """What topology awareness buys, and the paper's published speed-ups next to this sweep's."""
    parts: list[str] = []
    topology = topology_table(comp, planners)
    if topology is not None:
        parts += [
            "",
            "## What topology awareness buys, by cluster",
            "",
            "Each planner's iteration time over nest's (the search that sees the network): "
            "`phaze` runs the same search on a flat copy of the network and `mcmc` searches on "
            "one too, so their ratio is what knowing the topology buys; `alpa` sees two levels, "
            "`megatron` follows fixed rules. Graph clusters (`network` graph) are scored with "
            "routed, shared links (nest/graph).",
            "",
            _md(topology),
        ]
    published = published_table(comp, baseline, planners)
    if published is not None:
        parts += [
            "",
            "## Next to the NEST paper's published numbers",
            "",
            "Speed-ups at the same scale: the paper's over its Manual configurations "
            "(`experiments/paper/published.csv`), this sweep's over "
            f"`{baseline}`. OOM: out of memory; `norm.`: Manual is out of memory there, so the "
            "paper's value normalised to Manual at its smallest feasible case is shown.",
            "",
            _md(published),
        ]
    return parts


def _measure_sections(df, comp, planners, gpu_hour_usd) -> list[str]:
    """Throughput, MFU, cost per token, planner wall time and every job."""
    return [
        "",
        "## Throughput (samples/s)",
        "",
        _md(pivot(comp, "throughput_samples_per_s", lambda v: f"{v:.4g}", planners)),
        "",
        "## MFU (%)",
        "",
        _md(pivot(comp, "mfu", lambda v: f"{100 * v:.1f}", planners)),
        "",
        "## Cost: device-hours per million tokens",
        "",
        "Every device of the cluster is billed, idle ones included."
        + (
            f" At ${gpu_hour_usd:g} per device-hour, dollars per million tokens follow."
            if gpu_hour_usd is not None
            else ""
        ),
        "",
        _md(pivot(comp, "gpu_hours_per_mtok", lambda v: f"{v:.4g}", planners)),
        "",
        *(
            [
                f"Dollars per million tokens at ${gpu_hour_usd:g} per device-hour:",
                "",
                _md(pivot(comp, "usd_per_mtok", lambda v: f"${v:.4g}", planners)),
                "",
            ]
            if gpu_hour_usd is not None
            else []
        ),
        "## Planner wall time (s)",
        "",
        _md(
            pivot(
                comp.assign(feasible=comp["solve_wall_s"].notna()),
                "solve_wall_s",
                lambda v: f"{v:.2f}",
                planners,
            )
        ),
        "",
        "## Every job",
        "",
        _md(_all_jobs(df)),
        "",
    ]
