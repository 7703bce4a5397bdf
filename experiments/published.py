"""The NEST paper's published numbers next to a sweep's own (a section of ``results.md``).

``paper/published.csv`` holds the paper's throughputs as published (Figure 5, Figure 6, Table 3;
``docs/nest_paper.md`` §3), each normalised as the paper normalises it. Dividing a planner's
value by Manual's at the same case gives the paper's speed-up over Manual at that scale, which does
not depend on the normalisation point; the sweep's counterpart is each planner's speed-up over the
sweep's baseline at the same case. The section lists every published case the sweep also ran.
"""

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

PUBLISHED_CSV = Path(__file__).parent / "paper" / "published.csv"
PAPER_PLANNERS = ("NEST", "Phaze", "MCMC", "Alpa-E")
CASE = ("cluster", "model", "devices", "microbatch")


def load_published(path: Path = PUBLISHED_CSV) -> pd.DataFrame:
    return pd.read_csv(path, comment="#")


def published_speedups(pub: pd.DataFrame) -> pd.DataFrame:
    """Per published case: ``source`` and each planner's speed-up over Manual (or ``OOM``)."""
    keys = ["source", *CASE]
    manual = pub[pub["planner"] == "Manual"].set_index(keys)["norm_throughput"]
    out = {}
    for _, row in pub[pub["planner"] != "Manual"].iterrows():
        key = tuple(row[k] for k in keys)
        cell = out.setdefault(key, {})
        base = manual.get(key)
        if row["status"] == "OOM" or pd.isna(row["norm_throughput"]):
            cell[row["planner"]] = "OOM"
        elif base is not None and not pd.isna(base):
            cell[row["planner"]] = f"{row['norm_throughput'] / base:.2f}x"
        else:  # Manual has no value here (out of memory): the published normalised value
            cell[row["planner"]] = f"{row['norm_throughput']:.2f} norm."
    table = pd.DataFrame.from_dict(out, orient="index")
    table.index = pd.MultiIndex.from_tuples(table.index, names=keys)
    return table.reset_index()


def _ours(comp: pd.DataFrame, baseline: str, planners: Sequence[str]) -> pd.DataFrame:
    cells = comp.copy()
    cells["cell"] = [
        f"{v:.2f}x" if ok and pd.notna(v) else ("OOM" if status == "infeasible" else str(status))
        for v, ok, status in zip(
            cells["speedup_vs_baseline"], cells["feasible"], cells["status"], strict=True
        )
    ]
    table = cells.drop_duplicates([*CASE, "planner"]).pivot(
        index=list(CASE), columns="planner", values="cell"
    )
    shown = [p for p in planners if p != baseline]
    table = table.reindex(columns=shown)
    table.columns = [f"here {p}/{baseline}" for p in shown]
    return table.reset_index()


def published_table(
    comp: pd.DataFrame, baseline: str, planners: Sequence[str]
) -> pd.DataFrame | None:
    """Published cases this sweep ran: the paper's speed-ups over Manual, then the sweep's."""
    paper = published_speedups(load_published())
    ours = _ours(comp.dropna(subset=["devices", "microbatch"]), baseline, planners)
    if ours.empty:
        return None
    for key in ("devices", "microbatch"):
        paper[key] = paper[key].astype(int)
        ours[key] = ours[key].astype(int)
    both = paper.merge(ours, on=list(CASE), how="inner")
    if both.empty:
        return None
    paper_cols = [p for p in PAPER_PLANNERS if p in both.columns and both[p].notna().any()]
    both = both.rename(columns={p: f"paper {p}/Manual" for p in paper_cols})
    keep = ["source", "cluster", "model", "devices", "microbatch"]
    keep = [k for k in keep if k in ("source", "model", "devices") or both[k].nunique() > 1]
    cols = [*keep, *(f"paper {p}/Manual" for p in paper_cols)]
    cols += [c for c in both.columns if c.startswith("here ")]
    return both[cols].fillna("-")


__all__ = ["PUBLISHED_CSV", "load_published", "published_speedups", "published_table"]
