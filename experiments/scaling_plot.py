"""The scaling plot: what a model gets from each planner at each device count.

``plots/scaling.png`` (drawn at the end of a sweep by :mod:`experiments.sweep_plots`, redrawn by
``python -m experiments.scaling``) shows, per planner, against the device count:

- throughput (tokens/s, the shared evaluator's);
- MFU (model FLOPs over the devices' peak);
- the cost of a million tokens: device-hours, or dollars at ``gpu_hour_usd`` per device-hour.
  Every device of the cluster is billed, idle ones included (a rented cluster is paid whole).

The price is the user's (``hydra.callbacks.sweep.gpu_hour_usd``, or ``--gpu-hour-usd`` of
``python -m experiments.scaling``): it scales the cost axis only, so which planner is cheaper does
not depend on it.
"""

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from experiments.plots import DPI, planner_colors
from nest.core.files import atomic_path

GROUP_KEYS = ("model", "cluster", "variant", "global_batch", "microbatch")


def _metrics(gpu_hour_usd: float | None) -> list[tuple[str, str, float]]:
    """(column, axis label, scale) of the three panels."""
    cost = (
        ("usd_per_mtok", f"\\$ per million tokens (at \\${gpu_hour_usd:g}/device-hour)", 1.0)
        if gpu_hour_usd is not None
        else ("gpu_hours_per_mtok", "device-hours per million tokens", 1.0)
    )
    return [
        ("tokens_per_s", "throughput (million tokens/s, log scale)", 1e-6),
        ("mfu", "MFU (%)", 100.0),
        cost,
    ]


def _linear_reference(ax, part: pd.DataFrame, values: pd.Series, planners: Sequence[str]) -> None:
    """A dotted line of perfect scaling from the first planner's smallest feasible point."""
    for planner in planners:
        ok = (part["planner"] == planner) & part["feasible"] & values.notna()
        if ok.any():
            first = part[ok].sort_values("devices").index[0]
            d0, v0 = part.loc[first, "devices"], values[first]
            xs = np.array(sorted(part["devices"].dropna().unique()), dtype=float)
            ax.plot(xs, v0 * xs / d0, ":", color="grey", lw=1.2)
            return


def plot_scaling(
    comp: pd.DataFrame,
    path: Path,
    *,
    planners: Sequence[str],
    gpu_hour_usd: float | None = None,
) -> Path:
    """One row of three panels per case (model, cluster, batch...), one line per planner."""
    keys = [k for k in GROUP_KEYS if k == "model" or comp[k].nunique(dropna=True) > 1]
    groups = list(comp.groupby(keys, sort=False, dropna=False))
    metrics = _metrics(gpu_hour_usd)
    fig = Figure(figsize=(14, 3.6 * len(groups) + 1.0), layout="constrained")
    axes = fig.subplots(len(groups), len(metrics), squeeze=False)
    colors = planner_colors(planners)
    for row, (key, part) in zip(axes, groups, strict=True):
        key = key if isinstance(key, tuple) else (key,)
        where = ", ".join(str(v) for v in key if not pd.isna(v) and v != "")
        xs = sorted(part["devices"].dropna().unique())
        for ax, (column, label, scale) in zip(row, metrics, strict=True):
            values = pd.to_numeric(part[column], errors="coerce") * scale
            for planner in planners:
                mine = part["planner"] == planner
                ok = mine & part["feasible"] & values.notna()
                order = part[ok].sort_values("devices").index
                ax.plot(
                    part.loc[order, "devices"],
                    values[order],
                    "o-",
                    color=colors[planner],
                    lw=1.6,
                    ms=4.5,
                )
                bad = part[mine & ~part["feasible"]]
                ax.plot(bad["devices"], np.zeros(len(bad)), "x", color=colors[planner], mew=2)
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{v:g}" for v in xs])
            if column == "tokens_per_s":
                _linear_reference(ax, part, values, planners)
                ax.set_yscale("log", base=2)
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            else:
                ax.set_ylim(bottom=0)
            ax.minorticks_off()
            ax.grid(alpha=0.3)
            ax.set_xlabel("devices")
            ax.set_ylabel(label)
            ax.set_title(f"{where}: {label.split(' (')[0]}")
    handles = [Line2D([], [], color=colors[p], marker="o", label=p) for p in planners]
    handles.append(Line2D([], [], color="grey", ls=":", label="linear scaling"))
    handles.append(Line2D([], [], color="k", marker="x", ls="", mew=2, label="no feasible plan"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6))
    billed = "every device billed, idle ones included"
    fig.suptitle(f"Scaling per planner: throughput, MFU and cost per token ({billed})")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI)
    return path
