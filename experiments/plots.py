"""Comparison plots of a sweep (PNG, headless: ``matplotlib.figure.Figure``, no pyplot state).

- :func:`plot_throughput_lines`: throughput against devices (the shape of the NEST paper's
  Figure 5) or against the microbatch size (Figure 6), one panel per model, one line per planner;
  a job without a feasible plan is a marker on the x axis saying why (out of memory, invalid
  published configuration, failed job).
- :func:`plot_stage_memory`: per pipeline rank, the memory terms of the shared evaluator stacked
  (GiB) with the device's HBM as a dashed line.
- :func:`plot_placement`: the devices laid out on the network hierarchy (one row per block of an
  upper level), coloured by pipeline stage or by data-parallel replica; idle devices grey.
- :func:`save_memory_figure`, :func:`save_placement_figure`: one panel per planner, side by side;
  :func:`plot_job`: ``memory.png`` and ``placement.png`` of one run directory.
- :func:`plot_network`, :func:`save_network_figure`: a graph cluster drawn (torus planes side by
  side, rails, leaves and spines at the generators' positions), its devices coloured by stage or
  replica and the links the plan's transfers cross drawn darker (:func:`plan_traffic`);
  ``network.png`` of a run on a graph cluster.

Inputs are the JSON files a run writes (``report.json``, ``plan.json``, ``row.json``) and the
aggregator's comparison frame, so a sweep's plots can be redrawn from its directory alone.
"""

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from nest.analysis.explain import memory_terms
from nest.app.results import FAILED_STATUSES
from nest.core.files import atomic_path
from nest.core.units import GiB

DPI = 110
MEMORY_TERMS = (  # the keys of MemoryReport.terms (report.json breakdown.ranks[].memory.terms)
    ("weights", "weights"),
    ("fp8_copies", "FP8 weight copies"),
    ("gradients", "gradients"),
    ("optimizer_state", "optimizer state"),
    ("activations", "stored activations"),
    ("comm_buffers", "communication buffers"),
    ("transient", "transient buffers"),
    ("reserve", "reserve"),
)
MEMORY_COLORS = (
    "#4c72b0",
    "#64b5cd",
    "#55a868",
    "#8172b2",
    "#dd8452",
    "#ccb974",
    "#c44e52",
    "#8c8c8c",
)


def planner_colors(planners: Sequence[str]) -> dict[str, str]:
    """A fixed colour per planner, in the order given (baseline first)."""
    cycle = colormaps["tab10"].colors
    return {p: cycle[i % len(cycle)] for i, p in enumerate(planners)}


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


# ------------------------------------------------------------------------------------------------
# Throughput lines (Figures 5 and 6)
# ------------------------------------------------------------------------------------------------


NO_PLAN_MARKERS = {
    "oom": ({"marker": "x", "ms": 8, "mew": 2}, "out of memory"),
    "invalid": ({"marker": "s", "ms": 7, "mew": 1.5, "mfc": "none"}, "invalid published config"),
    "failed": ({"marker": "$?$", "ms": 9, "mew": 0.5}, "job failed"),
}
"""How a job without a feasible plan is drawn on the x axis, by :func:`no_plan_kind`."""


def no_plan_kind(status) -> str | None:
    """``oom`` (nothing fits memory: ``infeasible``, or a plan that does not fit), ``invalid``
    (a published configuration that cannot run as published), ``failed`` (no answer:
    :data:`nest.app.results.FAILED_STATUSES`), or None for ``unpublished`` (the paper has no such
    row: nothing to draw)."""
    if status == "unpublished":
        return None
    if status == "invalid":
        return "invalid"
    if status in FAILED_STATUSES:
        return "failed"
    return "oom"


def throughput_figure(
    comp: pd.DataFrame,
    *,
    x: str,
    xlabel: str,
    ylabel: str,
    value: str,
    title: str,
    planners: Sequence[str],
    panel_keys: Sequence[str],
    panel_title=None,
) -> Figure:
    """One panel per value of ``panel_keys``, one line per planner: ``value`` against ``x``.

    ``panel_title(key)`` names a panel from its ``panel_keys`` values (default: joined).

    A row whose ``feasible`` is false is a marker on the x axis that says why
    (:data:`NO_PLAN_MARKERS`: out of memory, invalid published configuration, failed job);
    ``unpublished`` rows are not drawn. The legend lists the kinds present.
    """
    panels = list(comp.groupby(list(panel_keys), sort=False, dropna=False))
    rows, cols = _grid(len(panels))
    fig = Figure(figsize=(4.6 * cols, 3.5 * rows + 1.0), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colors = planner_colors(planners)
    kinds_drawn = set()
    for ax, (key, part) in zip(axes, panels, strict=False):
        for planner in planners:
            mine = part[part["planner"] == planner].sort_values(x)
            ok = mine[mine["feasible"] & mine[value].notna()]
            ax.plot(ok[x], ok[value], "o-", color=colors[planner], lw=1.6, ms=4.5)
            bad = mine[~mine["feasible"]]
            kinds = bad["status"].map(no_plan_kind)
            for kind, (style, _) in NO_PLAN_MARKERS.items():
                here = bad[kinds == kind]
                if len(here):
                    kinds_drawn.add(kind)
                    ax.plot(here[x], np.zeros(len(here)), ls="", color=colors[planner], **style)
        xs = sorted(part[x].dropna().unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{v:g}" for v in xs])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        key = key if isinstance(key, tuple) else (key,)
        shown = [str(v) for v in key if not pd.isna(v) and v != ""]
        ax.set_title(panel_title(key) if panel_title else ", ".join(shown))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=colors[p], marker="o", label=p) for p in planners]
    handles += [
        Line2D([], [], color="k", ls="", label=label, **style)
        for kind, (style, label) in NO_PLAN_MARKERS.items()
        if kind in kinds_drawn
    ]
    per_row = max(2, int(4.6 * cols / 1.8))  # about 1.8 inches an entry: the legend fits
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), per_row))
    fig.suptitle(title)
    return fig


def plot_throughput_lines(comp: pd.DataFrame, path: Path, **kwargs) -> Path:
    """:func:`throughput_figure` saved as ``path`` (PNG)."""
    fig = throughput_figure(comp, **kwargs)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI)
    return path


# ------------------------------------------------------------------------------------------------
# Per-stage memory
# ------------------------------------------------------------------------------------------------


def plot_stage_memory(ax, report: Mapping, *, title: str) -> None:
    """Stacked memory terms per pipeline rank (GiB) and the HBM capacity as a dashed line."""
    ranks = report["breakdown"]["ranks"]
    xs = np.arange(len(ranks))
    bottom = np.zeros(len(ranks))
    for (key, label), color in zip(MEMORY_TERMS, MEMORY_COLORS, strict=True):
        vals = np.array([memory_terms(r["memory"])[key] for r in ranks]) / GiB
        ax.bar(xs, vals, bottom=bottom, color=color, label=label, width=0.8)
        bottom += vals
    capacity = ranks[0]["memory"]["capacity_bytes"] / GiB
    top = max(capacity, bottom.max()) * 1.12
    if len(ranks) <= 16:  # the totals: inside tall bars, above short ones (readable either way)
        for x, total in zip(xs, bottom, strict=True):
            inside = total > 0.15 * top
            ax.text(
                x,
                total - 0.01 * top if inside else total,
                f"{total:.3g}",
                ha="center",
                va="top" if inside else "bottom",
                fontsize=7,
                color="white" if inside else "black",
            )
    ax.axhline(capacity, color="k", ls="--", lw=1.2)
    ax.text(xs[0] - 0.4, capacity, f"HBM {capacity:.0f} GiB", ha="left", va="bottom", fontsize=8)
    ax.set_ylim(0, top)
    step = max(1, len(ranks) // 16)
    ax.set_xticks(xs[::step])
    ax.set_xlabel("pipeline rank (stage)")
    ax.set_ylabel("memory per device (GiB)")
    ax.set_title(title, fontsize=10)


def _memory_legend(fig) -> None:
    handles = [
        Patch(color=c, label=lbl) for (_, lbl), c in zip(MEMORY_TERMS, MEMORY_COLORS, strict=True)
    ]
    handles.append(Line2D([], [], color="k", ls="--", label="HBM capacity"))
    fig.legend(handles=handles, loc="outside lower center", ncol=4)


def save_memory_figure(panels: Mapping[str, Mapping], path: Path, *, title: str) -> Path:
    """One memory panel per label (planner) -> its ``report.json`` content."""
    rows, cols = _grid(len(panels), 4)
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows + 1.0), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    for ax, (label, report) in zip(axes, panels.items(), strict=False):
        plot_stage_memory(ax, report, title=f"{label}: {_degrees(report['plan'])}")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    _memory_legend(fig)
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI)
    return path


def _degrees(plan: Mapping) -> str:
    text = " ".join(f"{k}{plan[k]}" for k in ("tp", "cp", "ep", "dp", "pp") if plan.get(k, 1) > 1)
    return f"{text or 'single device'}, mbs {plan.get('microbatch_size')}"


# ------------------------------------------------------------------------------------------------
# Placement map
# ------------------------------------------------------------------------------------------------


IDLE_COLOR = "#d9d9d9"


def _stage_palette() -> list:
    """Distinct colours for up to 18 stages, without the greys (grey means idle)."""
    tab10 = [c for i, c in enumerate(colormaps["tab10"].colors) if i != 7]
    tab20 = [c for i, c in enumerate(colormaps["tab20"].colors) if i not in (14, 15)]
    return tab10 + [c for i, c in enumerate(tab20) if i % 2 == 1]


def placement_grid(plan: Mapping, fanouts: Sequence[int]) -> tuple[np.ndarray, np.ndarray, int]:
    """Per device (laid out as rows x cols), its pipeline rank and its DP replica (NaN: idle).

    Columns are one block of the level whose size is closest to the square root of the device
    count, so every row is one such block; returns (stage grid, replica grid, levels per row).
    """
    n = int(np.prod(fanouts))
    sizes = list(np.cumprod(fanouts))
    level = min(range(len(sizes)), key=lambda i: (abs(math.log(sizes[i] / math.sqrt(n))), -i))
    cols = int(sizes[level])
    stage = np.full(n, np.nan)
    replica = np.full(n, np.nan)
    pp = plan["pp"]
    for r, st in enumerate(plan["stages"][:pp]):
        for d, rep in enumerate(st["devices"]):
            ids = np.asarray(rep, dtype=np.int64).ravel()
            stage[ids] = r
            replica[ids] = d
    return stage.reshape(-1, cols), replica.reshape(-1, cols), level


def _stage_colormap(values, color_by: str):
    """``(cmap, norm)`` for device values (NaN: idle): one distinct colour per stage while the
    palette has enough, else viridis."""
    count = int(np.nanmax(values)) + 1 if np.isfinite(values).any() else 1
    palette = _stage_palette()
    if color_by == "stage" and count <= len(palette):
        return ListedColormap(palette[:count]), BoundaryNorm(np.arange(count + 1) - 0.5, count)
    return colormaps["viridis"], None


def plot_placement(ax, plan: Mapping, fanouts: Sequence[int], *, color_by: str, title: str):
    """Devices on the hierarchy coloured by ``stage`` or ``replica``; returns the image."""
    stage, replica, level = placement_grid(plan, fanouts)
    grid = stage if color_by == "stage" else replica
    cmap, norm = _stage_colormap(grid, color_by)
    cmap = cmap.with_extremes(bad=IDLE_COLOR)
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
    rows, cols = grid.shape
    xlabel = f"device within its level-{level} block"
    if fanouts[0] < cols:
        for c in range(fanouts[0], cols, fanouts[0]):
            ax.axvline(c - 0.5, color="white", lw=1.0)
        xlabel += f" (lines: level-0 blocks of {fanouts[0]})"
    ylabel = f"level-{level} block"
    upper = fanouts[level + 1] if level + 1 < len(fanouts) else rows
    for r in range(1, rows):
        if r % upper == 0:
            ax.axhline(r - 0.5, color="k", lw=1.6)
        elif rows <= 64:
            ax.axhline(r - 0.5, color="white", lw=0.5)
    if upper < rows:
        ylabel += f" (black lines: level-{level + 1} blocks of {upper})"
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return image


def _placement_colorbar(fig, ax, image, color_by: str, plan: Mapping) -> None:
    count = plan["pp"] if color_by == "stage" else plan["dp"]
    label = "pipeline stage" if color_by == "stage" else "data-parallel replica"
    bar = fig.colorbar(image, ax=ax, shrink=0.9)
    bar.set_label(f"{label} (grey: idle)")
    if color_by == "stage" and count <= len(_stage_palette()):
        bar.set_ticks(range(count))


def save_placement_figure(
    panels: Mapping[str, Mapping], fanouts: Sequence[int], path: Path, *, title: str
) -> Path:
    """Per label (planner) -> ``plan.json`` content: a row with the stage and replica maps."""
    fig = Figure(figsize=(11, 3.6 * len(panels) + 0.6), layout="constrained")
    axes = fig.subplots(len(panels), 2, squeeze=False)
    for (label, plan), row in zip(panels.items(), axes, strict=True):
        for ax, color_by in zip(row, ("stage", "replica"), strict=True):
            image = plot_placement(
                ax, plan, fanouts, color_by=color_by, title=f"{label}: {_degrees(plan)}"
            )
            _placement_colorbar(fig, ax, image, color_by, plan)
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI)
    return path


# ------------------------------------------------------------------------------------------------
# Graph clusters: the network drawn, the plan's devices and traffic on it
# ------------------------------------------------------------------------------------------------


def plan_traffic(network, plan: Mapping) -> np.ndarray:
    """Per undirected link of a graph cluster's network, how many of the plan's transfers cross
    it: every pipeline boundary's device pairs and, per rank, the ring of each tensor, context
    and data-parallel group (its members in id order), routed as the cost model routes them
    (shares of a split flow count as shares)."""
    from nest.core.plan import group_arrays

    load = np.zeros(network.num_links)
    pairs: list[tuple[int, int]] = []
    pp = plan["pp"]
    ranks = [np.asarray(st["devices"], dtype=np.int64) for st in plan["stages"][:pp]]
    for a, b in zip(ranks, ranks[1:], strict=False):
        pairs += list(zip(a.ravel().tolist(), b.ravel().tolist(), strict=True))
    for grid in ranks:
        arrays = group_arrays(grid, plan.get("ep", 1))
        for kind in ("tp", "cp", "dense_dp"):
            for group in arrays[kind].tolist():
                ring = sorted(group)
                if len(ring) > 1:
                    pairs += list(zip(ring, ring[1:] + ring[:1], strict=True))
    for u, v in pairs:
        route = network.route(int(u), int(v))
        np.add.at(load, route.links, route.fracs)
    return load[0::2] + load[1::2]  # links 2e and 2e + 1 are edge e both ways


def _node_positions(network) -> dict:
    keys = list(network.devices) + list(network.switches)
    if all(k in network.positions for k in keys):
        return {k: network.positions[k] for k in keys}
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(keys)
    graph.add_edges_from(
        (keys[int(a)], keys[int(b)])
        for a, b in zip(network.link_src[0::2], network.link_dst[0::2], strict=True)
    )
    layout = nx.circular_layout if len(keys) <= 64 else nx.spring_layout
    pos = layout(graph) if layout is nx.circular_layout else layout(graph, seed=0)
    return {k: tuple(v) for k, v in pos.items()}


def plot_network(ax, plan: Mapping, network, *, color_by: str, title: str, traffic=None):
    """The graph: devices coloured by pipeline ``stage`` or data-parallel ``replica`` (grey:
    idle), switches as small grey diamonds, every link thin and grey, the links the plan's
    transfers cross drawn over them, wider and darker the more cross (:func:`plan_traffic`)."""
    from matplotlib.collections import LineCollection

    keys = list(network.devices) + list(network.switches)
    pos = _node_positions(network)
    xy = np.array([pos[k] for k in keys], dtype=float)
    src, dst = network.link_src[0::2], network.link_dst[0::2]
    segments = np.stack([xy[src], xy[dst]], axis=1)
    n = network.num_devices
    if network.routing == "dimension_order":  # a torus: its planes side by side, the wrap-around
        # and between-plane links would cross the picture; drawn are the in-plane grid links
        keep = np.linalg.norm(segments[:, 0] - segments[:, 1], axis=1) <= 1.5
        segments = np.where(keep[:, None, None], segments, np.nan)
    ax.add_collection(LineCollection(segments, colors="#cccccc", linewidths=0.4, zorder=1))
    traffic = plan_traffic(network, plan) if traffic is None else traffic
    used = traffic > 0
    if used.any():
        width = 0.6 + 3.0 * traffic[used] / traffic[used].max()
        ax.add_collection(
            LineCollection(segments[used], colors="#7a1f1f", linewidths=width, alpha=0.55, zorder=2)
        )
    stage, replica = np.full(n, np.nan), np.full(n, np.nan)
    for r, st in enumerate(plan["stages"][: plan["pp"]]):
        for d, rep in enumerate(st["devices"]):
            ids = np.asarray(rep, dtype=np.int64).ravel()
            stage[ids], replica[ids] = r, d
    values = stage if color_by == "stage" else replica
    cmap, norm = _stage_colormap(values, color_by)
    size = max(6.0, min(60.0, 4000.0 / max(n, 1)))
    idle = ~np.isfinite(values)
    ax.scatter(*xy[:n][idle].T, s=size, c=IDLE_COLOR, marker="s", zorder=3, linewidths=0)
    image = ax.scatter(
        *xy[:n][~idle].T,
        s=size,
        c=values[~idle],
        cmap=cmap,
        norm=norm,
        marker="s",
        zorder=4,
        linewidths=0,
    )
    if len(keys) > n:
        ax.scatter(*xy[n:].T, s=size * 0.8, c="#666666", marker="D", zorder=3, linewidths=0)
    ax.set_title(title, fontsize=10)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xticks([])
    ax.set_yticks([])
    return image


def save_network_figure(plan: Mapping, network, path: Path, *, title: str) -> Path:
    """``network.png``: the plan on the graph, by stage and by replica (:func:`plot_network`)."""
    fig = Figure(figsize=(12, 5.6), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False)[0]
    traffic = plan_traffic(network, plan)
    for ax, color_by in zip(axes, ("stage", "replica"), strict=True):
        image = plot_network(
            ax, plan, network, color_by=color_by, title=_degrees(plan), traffic=traffic
        )
        _placement_colorbar(fig, ax, image, color_by, plan)
    note = "dark links: the plan's pipeline transfers and group rings, wider = more"
    if network.routing == "dimension_order":
        note += "; z planes side by side, wrap-around links not drawn"
    fig.suptitle(f"{title}\n({note})")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI)
    return path


def _job_network(job_dir: Path):
    """The graph network of a run directory's cluster (its ``.hydra/config.yaml``), or None."""
    from omegaconf import OmegaConf

    from nest.app.config import build_cluster

    config = job_dir / ".hydra" / "config.yaml"
    if not config.exists():
        return None
    return build_cluster(OmegaConf.load(config).cluster).network


def plot_job(job_dir: Path) -> list[Path]:
    """``memory.png`` and ``placement.png`` of one run directory (when it holds a plan), and
    ``network.png`` when its cluster is a graph."""
    report_path, plan_path, row_path = (
        job_dir / f for f in ("report.json", "plan.json", "row.json")
    )
    if not (plan_path.exists() and report_path.exists() and row_path.exists()):
        return []
    report = json.loads(report_path.read_text())
    plan = json.loads(plan_path.read_text())
    row = json.loads(row_path.read_text())
    fanouts = [int(f) for f in row["level_fanouts"].split("x")]
    title = f"{row['planner']}: {row['model']} on {row['cluster']} ({row['devices']} devices)"
    drawn = [
        save_memory_figure({row["planner"]: report}, job_dir / "memory.png", title=title),
        save_placement_figure(
            {row["planner"]: plan}, fanouts, job_dir / "placement.png", title=title
        ),
    ]
    if row.get("network") == "graph":
        network = _job_network(job_dir)
        if network is not None:
            drawn.append(save_network_figure(plan, network, job_dir / "network.png", title=title))
    return drawn


__all__ = [
    "NO_PLAN_MARKERS",
    "no_plan_kind",
    "placement_grid",
    "plot_job",
    "plan_traffic",
    "plot_network",
    "plot_placement",
    "plot_stage_memory",
    "plot_throughput_lines",
    "save_memory_figure",
    "save_network_figure",
    "save_placement_figure",
    "throughput_figure",
]
