"""Aggregate a sweep directory into one comparison: ``python -m experiments.aggregate DIR``.

Reads every job's ``row.json`` (:mod:`nest.app.results`) under ``DIR``; a job directory without one
(killed, timed out, still running) or with one that cannot be read (not JSON, cut short: a note
lists them) and a job listed in ``sweep.json`` that never started each become a ``missing`` row,
and one without a row but with an ``error.txt`` (its worker process died: the ``parallel``
launcher wrote why) a ``crashed`` row, so the table always has one row per job. Writes into ``DIR``:

- ``results.csv`` and ``results.parquet`` (every column; parquet needs the optional ``parquet``
  extra, pyarrow, and is skipped with a note without it), ``results.md`` (readable tables);
- ``comparison.csv``: per job, ``norm_throughput`` = throughput / the baseline planner's
  throughput at its smallest feasible scale of the same model and cluster (the NEST paper's
  normalisation, to "Manual"), ``speedup_vs_baseline`` at the same scale, ``speedup_vs_<name>``
  for each further reference planner (``also``, e.g. ``recipes``), and the cost of a token:
  ``gpu_hours_per_mtok`` (device-hours per million tokens, every device of the cluster billed,
  idle ones included) and, with a price per device-hour, ``usd_per_mtok``;
- ``plots/``: throughput vs devices and vs microbatch size, per-stage memory and placement maps
  (:mod:`experiments.plots`).

The outputs are a function of the rows only (no clock, sorted by job), so aggregating the same
directory again rewrites the same files. The multirun callback (:mod:`experiments.callbacks`) calls
:func:`aggregate` at the end of every sweep.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from experiments import tables
from nest.app.results import (
    ERROR_FILE,
    FAILED_STATUSES,
    ROW_COLUMNS,
    ROW_FILE,
    SWEEP_FILE,
    one_line,
    planner_label,
)
from nest.core.files import atomic_path, write_text

PLOTS_DIR = "plots"
DEFAULT_BASELINE = "megatron"

GROUP_KEYS = ("cluster", "model", "global_batch", "variant")
"""A comparison group: the paper normalises each model (on one cluster) to one reference."""
CASE_KEYS = (*GROUP_KEYS, "devices", "microbatch")
"""One point of the comparison: the planners are compared within a case."""
CASE_OVERRIDES = frozenset(
    {"model", "cluster", "cluster.devices", "training.microbatch_sizes", "training.global_batch"}
)
NON_CASE_ROOTS = frozenset(
    {"solver", "hydra", "experiment", "print_summary", "plots", "simulate", "explain", "export"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Aggregate:
    """What :func:`aggregate` wrote and what it found."""

    sweep_dir: Path
    jobs: int
    status_counts: dict[str, int]
    baseline: str
    files: tuple[Path, ...]
    plots: tuple[Path, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> dict[str, int]:
        """Jobs per failed status (:data:`nest.app.results.FAILED_STATUSES`): no answer."""
        return {s: n for s, n in sorted(self.status_counts.items()) if s in FAILED_STATUSES}

    def describe(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.status_counts.items()))
        lines = [
            f"aggregated {self.jobs} jobs ({counts}) in {self.sweep_dir}",
            "tables: " + ", ".join(str(p) for p in self.files),
        ]
        if self.plots:
            lines.append(f"plots: {self.sweep_dir / PLOTS_DIR} ({len(self.plots)} PNG)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Rows
# ------------------------------------------------------------------------------------------------


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def variant(overrides: list[str]) -> str:
    """The overrides that make a case other than model, cluster, devices, batch and planner."""
    keep = [
        o.lstrip("+~")
        for o in overrides
        if _key(o) not in CASE_OVERRIDES
        and _key(o).split(".")[0].split("/")[0] not in NON_CASE_ROOTS
    ]
    return " ".join(sorted(keep))


def _missing_row(overrides: list[str], job: int | None, why: str) -> dict:
    given = {_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}
    solver = given.get("solver", "?")
    row = dict.fromkeys(ROW_COLUMNS)
    row.update(
        job=job,
        solver=solver,
        planner=planner_label(solver, overrides),
        model=given.get("model"),
        cluster=given.get("cluster"),
        status="missing",
        feasible=False,
        overrides=overrides,
        error=why,
    )
    if given.get("cluster.devices", "").isdigit():
        row["devices"] = int(given["cluster.devices"])
    return row


def _job_dirs(sweep_dir: Path) -> list[Path]:
    found = {p.parent for p in sweep_dir.rglob(ROW_FILE)}
    found |= {p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")}
    return sorted(found)


def _read_row(path: Path) -> tuple[dict | None, str | None]:
    """A job's row, or None and why it cannot be read (not JSON, cut short, not a row)."""
    try:
        row = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, one_line(f"{type(exc).__name__}: {exc}", 120)
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    if "status" not in row:
        return None, "no 'status' field"
    return {**dict.fromkeys(ROW_COLUMNS), **row}, None


def _missing_job(job_dir: Path, why: str) -> dict:
    """The ``missing`` row of a job directory, from the overrides Hydra saved in it."""
    overrides_yaml = job_dir / ".hydra/overrides.yaml"
    overrides = list(OmegaConf.load(overrides_yaml)) if overrides_yaml.exists() else []
    hydra_yaml = job_dir / ".hydra/hydra.yaml"
    num = OmegaConf.load(hydra_yaml).hydra.job.get("num") if hydra_yaml.exists() else None
    return _missing_row(overrides, num, why)


def rowless_job(job_dir: Path) -> dict:
    """A job directory without ``row.json``: ``crashed`` when it holds an ``error.txt`` (the
    ``parallel`` launcher writes one for a job that killed its worker process; the last line of a
    traceback otherwise), else ``missing``."""
    error = job_dir / ERROR_FILE
    lines = error.read_text(errors="replace").strip().splitlines() if error.is_file() else []
    if not lines:
        return _missing_job(
            job_dir, "no row.json: the job was killed, timed out or is still running"
        )
    row = _missing_job(job_dir, one_line(lines[-1]))
    row["status"] = "crashed"
    return row


def load_rows(sweep_dir: Path, notes: list[str] | None = None) -> pd.DataFrame:
    """One row per job of the sweep, ``missing`` rows included, sorted by job number.

    A ``row.json`` that cannot be read makes its job ``missing`` too (the error column says why)
    and, when ``notes`` is given, a note listing those files is appended to it."""
    rows, unreadable = [], []
    for job_dir in _job_dirs(sweep_dir):
        where = job_dir.relative_to(sweep_dir)
        if (job_dir / ROW_FILE).exists():
            row, problem = _read_row(job_dir / ROW_FILE)
            if row is None:
                unreadable.append(str(where / ROW_FILE))
                row = _missing_job(
                    job_dir, f"row.json is unreadable ({problem}); rerun the job to rewrite it"
                )
        else:
            row = rowless_job(job_dir)
        row["job_dir"] = str(where)
        rows.append(row)
    if unreadable and notes is not None:
        notes.append(
            f"{len(unreadable)} unreadable row.json reported as missing ({', '.join(unreadable)}); "
            "rerun those jobs"
        )
    sweep_file = sweep_dir / SWEEP_FILE
    if sweep_file.exists():
        seen = {r["job"] for r in rows}
        listed = json.loads(sweep_file.read_text()).get("jobs") or []
        for num, overrides in enumerate(listed):
            if num not in seen:
                row = _missing_row(overrides, num, "the job never started")
                rows.append({**row, "job_dir": None})
    if not rows:
        raise FileNotFoundError(f"{sweep_dir}: no job directories (row.json or .hydra/) found")
    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in ROW_COLUMNS and c != "job_dir"]
    df = df[[*ROW_COLUMNS, "job_dir", *extra]]
    df["variant"] = df["overrides"].map(lambda o: variant(list(o or [])))
    df["overrides"] = df["overrides"].map(lambda o: " ".join(o or []))
    df["job"] = df["job"].astype("Int64")
    df["feasible"] = df["feasible"].fillna(False).astype(bool)
    return df.sort_values(["job", "job_dir"], na_position="last").reset_index(drop=True)


# ------------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------------


def planner_order(df: pd.DataFrame, baseline: str) -> list[str]:
    """The baseline first, then the planners in the order the sweep ran them."""
    seen = list(dict.fromkeys(df["planner"]))
    return ([baseline] if baseline in seen else []) + [p for p in seen if p != baseline]


def _same_case(comp: pd.DataFrame, ok: pd.Series, planner: str) -> pd.Series:
    """Per job, the throughput of ``planner`` in the same case (NaN where it has none)."""
    base = comp[ok & (comp["planner"] == planner)]
    same = (
        base.groupby(list(CASE_KEYS), dropna=False)["throughput_samples_per_s"]
        .first()
        .rename("same")
    )
    return comp[list(CASE_KEYS)].merge(same, on=list(CASE_KEYS), how="left")["same"]


def comparison(
    df: pd.DataFrame,
    baseline: str,
    also: Sequence[str] = (),
    gpu_hour_usd: float | None = None,
) -> pd.DataFrame:
    """Per job: ``norm_throughput`` (the paper's, see the module doc), ``speedup_vs_baseline``,
    ``speedup_vs_<name>`` for each planner of ``also``, and the cost of a million tokens."""
    comp = df[
        [
            "job",
            "planner",
            "cluster",
            "model",
            "global_batch",
            "variant",
            "devices",
            "microbatch_candidates",
            "status",
            "feasible",
            "throughput_samples_per_s",
            "tokens_per_s",
            "iteration_time_s",
            "mfu",
            "peak_memory_bytes",
            "solve_wall_s",
            "level_fanouts",
            "network",
            "job_dir",
        ]
    ].copy()
    comp["microbatch"] = pd.to_numeric(comp["microbatch_candidates"], errors="coerce")
    comp["devices"] = pd.to_numeric(comp["devices"], errors="coerce")
    ok = comp["feasible"] & comp["throughput_samples_per_s"].notna()
    base = comp[ok & (comp["planner"] == baseline)]
    ref = (
        base.sort_values(["devices", "microbatch", "job"])
        .groupby(list(GROUP_KEYS), dropna=False)[["throughput_samples_per_s", "devices"]]
        .first()
        .rename(columns={"throughput_samples_per_s": "ref_throughput", "devices": "ref_devices"})
    )
    comp["baseline_throughput"] = _same_case(comp, ok, baseline).to_numpy()
    comp = comp.merge(ref, on=list(GROUP_KEYS), how="left")
    ok = comp["feasible"] & comp["throughput_samples_per_s"].notna()
    tput = comp["throughput_samples_per_s"].where(ok.to_numpy())
    comp["speedup_vs_baseline"] = tput / comp["baseline_throughput"]
    comp["norm_throughput"] = tput / comp["ref_throughput"]
    for name in also:
        comp[f"speedup_vs_{name}"] = tput / _same_case(comp, ok, name).to_numpy()
    tokens = pd.to_numeric(comp["tokens_per_s"], errors="coerce").where(ok.to_numpy())
    comp["gpu_hours_per_mtok"] = comp["devices"] / 3600.0 / tokens * 1e6
    if gpu_hour_usd is not None:
        comp["usd_per_mtok"] = comp["gpu_hours_per_mtok"] * gpu_hour_usd
    return comp.sort_values("job", na_position="last").reset_index(drop=True)


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------


def _write_parquet(df: pd.DataFrame, path: Path) -> str | None:
    """``results.parquet``, or the note saying why not (pandas finds no parquet engine)."""
    try:
        with atomic_path(path) as tmp:
            df.to_parquet(tmp, index=False)
    except ImportError as exc:
        path.unlink(missing_ok=True)
        return (
            f"results.parquet skipped ({one_line(str(exc), 80)}): pip install "
            "'nest-planner[parquet]' for pyarrow; results.csv has the same rows"
        )
    return None


def aggregate(
    sweep_dir: Path,
    *,
    baseline: str = DEFAULT_BASELINE,
    plots: bool = True,
    also: Sequence[str] = (),
    gpu_hour_usd: float | None = None,
) -> Aggregate:
    """Build the tables (and plots) of ``sweep_dir`` into it; idempotent.

    ``also``: further planners to give a speed-up column (and a section of ``results.md``) of
    their own; ``gpu_hour_usd``: the price of one device-hour, for the cost per token."""
    sweep_dir = Path(sweep_dir)
    notes: list[str] = []
    df = load_rows(sweep_dir, notes)
    planners = planner_order(df, baseline)
    also = [a for a in also if a != baseline]
    for name in [baseline, *also]:
        if name not in planners:
            notes.append(
                f"reference planner {name!r} is not in this sweep ({', '.join(planners)}); "
                "pass --baseline NAME / --also NAME (or hydra.callbacks.sweep.baseline / .also) "
                "to normalise"
            )
    also = [a for a in also if a in planners]
    comp = comparison(df, baseline, also, gpu_hour_usd)
    files = [sweep_dir / "results.csv", sweep_dir / "comparison.csv", sweep_dir / "results.md"]
    for frame, file in ((df, files[0]), (comp, files[1])):
        with atomic_path(file) as tmp:
            frame.to_csv(tmp, index=False)
    write_text(
        files[2],
        tables.results_markdown(
            df, comp, baseline, planners, sweep_dir.name, also=also, gpu_hour_usd=gpu_hour_usd
        ),
    )
    note = _write_parquet(df, sweep_dir / "results.parquet")
    if note:
        notes.append(note)
    else:
        files.append(sweep_dir / "results.parquet")
    drawn: list[Path] = []
    if plots:
        from experiments.sweep_plots import draw_sweep_plots

        drawn = draw_sweep_plots(
            comp, sweep_dir / PLOTS_DIR, baseline, planners, gpu_hour_usd=gpu_hour_usd
        )
    return Aggregate(
        sweep_dir=sweep_dir,
        jobs=len(df),
        status_counts=df["status"].fillna("?").value_counts().to_dict(),
        baseline=baseline,
        files=tuple(files),
        plots=tuple(drawn),
        notes=tuple(notes),
    )


def _sweep_setting(sweep_dir: Path, key: str):
    """``hydra.callbacks.sweep.<key>`` as the sweep was configured (``multirun.yaml``, written by
    Hydra at the start of a multirun), or None."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    value = OmegaConf.select(OmegaConf.load(path), f"hydra.callbacks.sweep.{key}", default=None)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def sweep_baseline(sweep_dir: Path) -> str:
    """The baseline the sweep was configured with, so rebuilding a sweep's tables gives what its
    callback wrote."""
    return str(_sweep_setting(sweep_dir, "baseline") or DEFAULT_BASELINE)


def sweep_also(sweep_dir: Path) -> list[str]:
    """The further reference planners the sweep was configured with (``also``)."""
    return [str(a) for a in _sweep_setting(sweep_dir, "also") or []]


def sweep_price(sweep_dir: Path) -> float | None:
    """The price per device-hour the sweep was configured with (``gpu_hour_usd``)."""
    price = _sweep_setting(sweep_dir, "gpu_hour_usd")
    return None if price is None else float(price)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.aggregate",
        description="Build results.csv/.md/.parquet, comparison.csv and plots/ of a sweep dir.",
    )
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun directory")
    parser.add_argument(
        "--baseline",
        default=None,
        help="planner label to normalise to (default: the sweep's own "
        f"hydra.callbacks.sweep.baseline, else {DEFAULT_BASELINE})",
    )
    parser.add_argument(
        "--also",
        default=None,
        help="comma-separated planners that get a speed-up column of their own (default: the "
        "sweep's hydra.callbacks.sweep.also)",
    )
    parser.add_argument(
        "--gpu-hour-usd",
        type=float,
        default=None,
        help="price of one device-hour for the cost per token (default: the sweep's "
        "hydra.callbacks.sweep.gpu_hour_usd)",
    )
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(
            f"error: {args.sweep_dir} is not a directory; give a sweep directory", file=sys.stderr
        )
        return 2
    try:
        baseline = args.baseline or sweep_baseline(args.sweep_dir)
        also = args.also.split(",") if args.also is not None else sweep_also(args.sweep_dir)
        price = args.gpu_hour_usd if args.gpu_hour_usd is not None else sweep_price(args.sweep_dir)
        result = aggregate(
            args.sweep_dir,
            baseline=baseline,
            plots=not args.no_plots,
            also=[a.strip() for a in also if a.strip()],
            gpu_hour_usd=price,
        )
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
