"""Which plots a sweep gets (``DIR/plots/``), drawn with :mod:`experiments.plots`.

- ``throughput_vs_devices.png`` when the sweep has several device counts (Figure 5's shape);
- ``throughput_vs_microbatch.png`` when it has several microbatch sizes (Figure 6's shape);
- ``scaling.png`` when it has several device counts: throughput, MFU and cost per token against
  the devices (:mod:`experiments.scaling_plot`);
- per model and cluster, at the largest scale where some planner fits: ``memory_<case>.png``
  (per-stage memory, one panel per planner) and ``placement_<case>.png`` (the devices coloured by
  stage and by replica, one row per planner).

Plots normalise throughput like the tables when every panel has a baseline reference, and show
samples/s otherwise.
"""

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from experiments import plots
from experiments.scaling_plot import plot_scaling
from nest.core.files import safe_name

PANEL_KEYS = ("model", "cluster", "variant", "devices", "microbatch")


def _varying(comp: pd.DataFrame, keys: Sequence[str], exclude: str) -> list[str]:
    return [k for k in keys if k != exclude and (k == "model" or comp[k].nunique() > 1)]


def _value(comp: pd.DataFrame, baseline: str) -> tuple[str, str]:
    if (
        comp["norm_throughput"].notna().any()
        and comp.groupby("model")["ref_throughput"].apply(lambda s: s.notna().any()).all()
    ):
        return "norm_throughput", f"throughput / {baseline}'s at its smallest scale"
    return "throughput_samples_per_s", "throughput (samples/s)"


def _panel_title(keys: Sequence[str]):
    def title(values: tuple) -> str:
        parts = []
        for k, v in zip(keys, values, strict=True):
            if pd.isna(v) or v == "":
                continue
            if k == "devices":
                parts.append(f"{int(v)} devices")
            elif k == "microbatch":
                parts.append(f"microbatch {int(v)}")
            else:
                parts.append(str(v))
        return ", ".join(parts)

    return title


def _lines(comp, path, *, x, xlabel, title, baseline, planners) -> Path:
    value, ylabel = _value(comp, baseline)
    keys = _varying(comp, PANEL_KEYS, x)
    return plots.plot_throughput_lines(
        comp,
        path,
        x=x,
        xlabel=xlabel,
        ylabel=ylabel,
        value=value,
        title=title,
        planners=planners,
        panel_keys=keys,
        panel_title=_panel_title(keys),
    )


def _slug(*parts) -> str:
    """The case's part of a file name: safe characters, cut to a length every file system
    takes (a 300-character model name still makes a file; :func:`nest.core.files.safe_name`)."""
    text = "_".join(str(p) for p in parts if p not in ("", None) and not pd.isna(p))
    return safe_name(re.sub(r"[^A-Za-z0-9_.-]+", "-", text))


def _largest_cases(comp: pd.DataFrame) -> list[pd.DataFrame]:
    """Per (cluster, model, variant): the jobs of the largest case with a plan to draw."""
    out = []
    drawable = comp[comp["job_dir"].notna()]
    for _, group in drawable.groupby(["cluster", "model", "variant"], sort=False, dropna=False):
        with_plan = group[group["feasible"]]
        if with_plan.empty:
            continue
        last = with_plan.sort_values(["devices", "microbatch"]).iloc[-1]
        same = (group["devices"] == last["devices"]) & (
            (group["microbatch"] == last["microbatch"])
            | (group["microbatch"].isna() & pd.isna(last["microbatch"]))
        )
        out.append(group[same])
    return out


def _job_files(sweep_dir: Path, case: pd.DataFrame, name: str) -> dict[str, dict]:
    found = {}
    for _, job in case.iterrows():
        path = sweep_dir / job["job_dir"] / name
        if path.exists() and job["planner"] not in found:
            data = json.loads(path.read_text())
            if name != "report.json" or "plan" in data:  # failed jobs' reports hold no plan
                found[job["planner"]] = data
    return found


def _case_plots(comp: pd.DataFrame, out_dir: Path, planners: Sequence[str]) -> list[Path]:
    drawn = []
    sweep_dir = out_dir.parent
    name_mbs = comp["microbatch"].nunique() > 1
    for case in _largest_cases(comp):
        case = case.assign(order=case["planner"].map({p: i for i, p in enumerate(planners)}))
        case = case.sort_values("order")
        first = case.iloc[0]
        mbs = f"mbs{int(first['microbatch'])}" if name_mbs else ""
        slug = _slug(first["model"], first["cluster"], int(first["devices"]), mbs, first["variant"])
        where = f"{first['model']} on {first['cluster']}, {int(first['devices'])} devices"
        if not pd.isna(first["microbatch"]):
            where += f", microbatch {int(first['microbatch'])}"
        reports = _job_files(sweep_dir, case, "report.json")
        if reports:
            drawn.append(
                plots.save_memory_figure(
                    reports, out_dir / f"memory_{slug}.png", title=f"Memory per device: {where}"
                )
            )
        plans = _job_files(sweep_dir, case, "plan.json")
        if plans:
            fanouts = [int(f) for f in str(first["level_fanouts"]).split("x")]
            drawn.append(
                plots.save_placement_figure(
                    plans, fanouts, out_dir / f"placement_{slug}.png", title=f"Placement: {where}"
                )
            )
    return drawn


def draw_sweep_plots(
    comp: pd.DataFrame,
    out_dir: Path,
    baseline: str,
    planners: Sequence[str],
    *,
    gpu_hour_usd: float | None = None,
) -> list[Path]:
    """Every plot of a sweep into ``out_dir`` (created); returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    if comp["devices"].nunique() > 1:
        drawn.append(
            _lines(
                comp,
                out_dir / "throughput_vs_devices.png",
                x="devices",
                xlabel="devices",
                title="Throughput vs devices per planner (the shape of NEST's Figure 5)",
                baseline=baseline,
                planners=planners,
            )
        )
        drawn.append(
            plot_scaling(
                comp, out_dir / "scaling.png", planners=planners, gpu_hour_usd=gpu_hour_usd
            )
        )
    if comp["microbatch"].nunique() > 1:
        drawn.append(
            _lines(
                comp,
                out_dir / "throughput_vs_microbatch.png",
                x="microbatch",
                xlabel="microbatch size (sequences)",
                title="Throughput vs microbatch size per planner (the shape of NEST's Figure 6)",
                baseline=baseline,
                planners=planners,
            )
        )
    return drawn + _case_plots(comp, out_dir, planners)
