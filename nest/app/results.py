"""One tidy result row per job (``row.json`` in the job's run directory), whatever happened.

A sweep never loses a row: :func:`run_recorded` wraps :func:`nest.app.cli.run` so that a planned,
infeasible, rejected (``UserError``) or crashed job (any other exception) each writes the same
flat row, and a crash in a multirun is recorded (traceback in ``error.txt``) instead of stopping
the sweep. ``experiments.aggregate`` concatenates the rows into the comparison tables.

Row columns (:data:`ROW_COLUMNS`), units in the names:

- identity: ``job`` (Hydra job number, null in single runs), ``solver`` (the solver's ``name``),
  ``planner`` (``solver`` plus any ``solver.*`` overrides, e.g. ``fixed(tp=2)``: the label tables
  and plots use), ``model``, ``seq_len`` (tokens per sequence, the training length the run planned
  at), ``cluster``, ``devices``, ``level_fanouts`` (innermost first, e.g.
  ``8x4x32``; a graph cluster's derived levels), ``network`` (``hierarchy`` or ``graph``: a
  cluster given as a network graph, :mod:`nest.graph`), ``hbm_bytes`` (per device),
  ``global_batch``, ``microbatch_candidates`` (``training.microbatch_sizes``, e.g. ``1`` or
  ``1,2,4``);
- outcome: ``status`` (the planner's ``optimal`` / ``feasible`` / ``timeout``, or ``infeasible``,
  ``error`` for a user mistake, ``crashed`` for an unexpected exception; the aggregator adds
  ``missing`` for a job that never wrote its row, and ``crashed`` for one whose worker process
  died, from the ``error.txt`` the ``parallel`` launcher wrote); ``feasible`` (a plan that fits
  memory), ``error`` (one line);
- the plan: ``tp, cp, ep, dp, pp, devices_used, microbatch_size, num_microbatches, zero_stage,
  zero_shard, schedule, virtual_stages, rank_order, recompute`` (``zero_shard``: hybrid
  sharding's shard degree, empty when the state is sharded over all ``dp``; ``recompute``:
  run-length per stage, e.g. ``full*3,none``);
- the shared evaluator's numbers: ``iteration_time_s, throughput_samples_per_s, tokens_per_s,
  mfu, peak_memory_bytes``; ``min_memory_bytes`` when nothing fits;
- cost: ``solve_wall_s`` (the planner's own wall time), ``job_wall_s`` (the whole job);
- ``overrides``: the job's Hydra overrides (a list in ``row.json``; the tables join them with
  spaces).
"""

import contextlib
import json
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from itertools import groupby
from pathlib import Path

from omegaconf import DictConfig

from nest.app.config import build_problem
from nest.core.files import Unwritable, output_error_line, write_text

log = logging.getLogger(__name__)

ROW_FILE = "row.json"
SWEEP_FILE = "sweep.json"
"""Written into a sweep directory at the start of a multirun: the jobs it will launch."""
ERROR_FILE = "error.txt"
"""A crashed job's traceback; the ``parallel`` launcher writes it alone (one line) for a job that
killed its worker process (``hydra_plugins/nest_launcher``), which therefore has no row."""

IDENTITY_COLUMNS = (
    "job",
    "solver",
    "planner",
    "model",
    "seq_len",
    "cluster",
    "devices",
    "level_fanouts",
    "network",
    "hbm_bytes",
    "global_batch",
    "microbatch_candidates",
)
PLAN_COLUMNS = (
    "tp",
    "cp",
    "ep",
    "dp",
    "pp",
    "devices_used",
    "microbatch_size",
    "num_microbatches",
    "zero_stage",
    "zero_shard",
    "optimizer_offload",
    "activation_offload",
    "activation_offload_blocks",
    "schedule",
    "virtual_stages",
    "rank_order",
    "recompute",
)
METRIC_COLUMNS = (
    "iteration_time_s",
    "throughput_samples_per_s",
    "tokens_per_s",
    "mfu",
    "peak_memory_bytes",
    "min_memory_bytes",
    "solve_wall_s",
    "job_wall_s",
)
ROW_COLUMNS = (
    *IDENTITY_COLUMNS,
    "status",
    "feasible",
    *PLAN_COLUMNS,
    *METRIC_COLUMNS,
    "overrides",
    "error",
)

FAILED_STATUSES = frozenset({"timeout", "error", "crashed", "missing"})
"""Jobs that gave no answer: the planner ran out of time (``timeout``), the settings are wrong
(``error``), the job raised or killed its process (``crashed``) or never wrote its row
(``missing``). Any of them makes a multirun exit with status 1 (``experiments.callbacks``): the
comparison has a hole that a rerun (with a longer ``time_limit_s``, fixed settings, the bug
fixed) fills."""
NO_PLAN_STATUSES = FAILED_STATUSES | {"infeasible", "invalid", "unpublished"}
"""Jobs without a usable plan: the failed ones and the answers that no plan runs (``infeasible``:
nothing fits memory, and it may carry the plan that does not fit; ``invalid``: a published
configuration cannot run as published; ``unpublished``: the paper has no such row). Those three
are results of a comparison, not failures. ``feasible`` is the column to filter on."""


def one_line(text: str, limit: int = 400) -> str:
    """Collapse whitespace so an error message fits one table cell."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def planner_label(solver: str, overrides: Sequence[str]) -> str:
    """``solver`` plus its ``solver.*`` overrides: ``fixed(pp=2,tp=2)``."""
    knobs = sorted(
        o.split(".", 1)[1].lstrip("+")
        for o in (s.lstrip("+~") for s in overrides)
        if o.startswith("solver.")
    )
    return f"{solver}({','.join(knobs)})" if knobs else solver


def _recompute_runs(stages: Sequence[dict]) -> str:
    modes = [
        f"full{s['full_blocks']}+{s.get('recompute', '?')}"
        if s.get("full_blocks")
        else s.get("recompute", "?")
        for s in stages
    ]
    return ",".join(m if (n := len(list(g))) == 1 else f"{m}*{n}" for m, g in groupby(modes))


def _model_label(cfg: DictConfig) -> str | None:
    """The model as the config names it: ``name``, else the Hugging Face config or profile file
    (``name`` is null for those: the file names the model), as :func:`nest.app.cli.run` does."""
    m = _section(cfg, "model")
    if m is None:
        return None
    return str(m.get("name") or m.get("config_path") or m.get("path") or "?")


def _section(cfg: DictConfig, name: str) -> DictConfig | None:
    """A group's section, None when missing or not a mapping (a malformed preset file)."""
    node = cfg.get(name)
    return node if isinstance(node, DictConfig) else None


def _case(cfg: DictConfig) -> dict:
    """Identity columns that come from the config (None where the config itself is bad); the
    model's name is the built model's (a Hugging Face config's ``_name_or_path``, a profile's
    name) when the config builds."""
    training, cluster = _section(cfg, "training"), _section(cfg, "cluster")
    sizes = training.get("microbatch_sizes", None) if training is not None else None
    out = {
        "model": _model_label(cfg),
        "seq_len": None,
        "cluster": str(cluster.get("name", "?")) if cluster is not None else None,
        "devices": None,
        "level_fanouts": None,
        "network": None,
        "hbm_bytes": None,
        "global_batch": training.get("global_batch", None) if training is not None else None,
        "microbatch_candidates": (
            ",".join(str(s) for s in sizes)
            if isinstance(sizes, Sequence) and not isinstance(sizes, str)
            else sizes
        ),
    }
    try:
        problem = build_problem(cfg)
    except Exception:  # the job's own row says what was wrong with the config
        return out
    cluster = problem.cluster
    out["model"] = problem.model.name
    out["seq_len"] = problem.model.seq_len or None
    out["devices"] = cluster.num_devices
    out["level_fanouts"] = "x".join(str(lv.fanout) for lv in cluster.levels)
    out["network"] = cluster.fabric.kind
    out["hbm_bytes"] = cluster.device.hbm_bytes
    return out


def make_row(
    cfg: DictConfig,
    result: dict,
    *,
    overrides: Sequence[str] = (),
    job: int | None = None,
    job_wall_s: float | None = None,
) -> dict:
    """The flat row of one job from its config and :func:`nest.app.cli.run`'s result."""
    solver = str(result.get("solver") or cfg.get("solver", {}).get("name", "?"))
    plan = result.get("plan") or {}
    row = dict.fromkeys(ROW_COLUMNS)
    case = _case(cfg)
    case["model"] = result.get("model") or case["model"]  # the name the run's report gives
    row.update(
        job=job,
        solver=solver,
        planner=planner_label(solver, overrides),
        **case,
        status=result.get("status"),
        feasible=bool(result.get("feasible", False)),
        overrides=list(overrides),
        error=one_line(result["error"])
        if result.get("error")
        else (one_line(result["violation"]) if result.get("violation") else None),
        job_wall_s=job_wall_s,
    )
    for key in ("tp", "cp", "ep", "dp", "pp", "microbatch_size", "num_microbatches"):
        row[key] = plan.get(key)
    row.update(
        zero_stage=plan.get("zero_stage"),
        zero_shard=plan.get("zero_shard"),
        optimizer_offload=plan.get("optimizer_offload"),
        activation_offload=plan.get("activation_offload"),
        activation_offload_blocks=plan.get("activation_offload_blocks"),
        schedule=plan.get("schedule"),
        virtual_stages=plan.get("virtual_stages"),
        rank_order=",".join(plan["rank_order"]) if plan.get("rank_order") else None,
        recompute=_recompute_runs(plan["stages"]) if plan.get("stages") else None,
        devices_used=result.get("devices_used"),
        solve_wall_s=result.get("solve_time_s"),
    )
    for key in ("iteration_time_s", "throughput_samples_per_s", "tokens_per_s", "mfu"):
        row[key] = result.get(key)
    row["peak_memory_bytes"] = result.get("peak_memory_bytes")
    row["min_memory_bytes"] = result.get("min_memory_bytes")
    return row


def write_row(out_dir: Path, row: dict) -> Path:
    """Write ``row.json`` atomically (a reader never sees half a row)."""
    return write_text(out_dir / ROW_FILE, json.dumps(row, indent=1, default=str) + "\n")


def _crash_result(cfg: DictConfig, exc: Exception) -> dict:
    return {
        "solver": str(cfg.get("solver", {}).get("name", "?")),
        "status": "crashed",
        "feasible": False,
        "error": f"{type(exc).__name__}: {one_line(str(exc))}",
    }


def run_recorded(
    run: Callable[..., dict],
    cfg: DictConfig,
    out_dir: Path,
    *,
    overrides: Sequence[str] = (),
    job: int | None = None,
    keep_going: bool = True,
) -> dict:
    """Call ``run(cfg, out_dir)`` and write the job's row, whatever happens.

    An unexpected exception is written as a ``crashed`` row with its traceback in ``error.txt``;
    with ``keep_going`` (multiruns) it is logged in one line and the crash result is returned, so
    the sweep goes on; otherwise (single runs: a crash is a bug) it is re-raised after the row is
    written. An output that cannot be written (a full disk, a read-only directory) is no bug: its
    row says ``error`` with one line naming the file, and a single run raises
    :class:`~nest.core.files.Unwritable` with that line.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        result = run(cfg, out_dir)
    except Exception as exc:
        unwritable = output_error_line(exc)  # a full disk, a read-only directory: not a bug
        with contextlib.suppress(OSError) if unwritable else contextlib.nullcontext():
            write_text(out_dir / ERROR_FILE, traceback.format_exc())
        result = _crash_result(cfg, exc)
        if unwritable:
            result.update(status="error", error=unwritable)
        row = make_row(
            cfg,
            result,
            overrides=overrides,
            job=job,
            job_wall_s=time.perf_counter() - started,
        )
        with contextlib.suppress(OSError) if unwritable else contextlib.nullcontext():
            write_row(out_dir, row)
        if not keep_going:
            if unwritable:
                raise Unwritable(unwritable) from exc
            raise
        log.error("crashed: %s (traceback in %s)", result["error"], out_dir / ERROR_FILE)
        return result
    row = make_row(
        cfg, result, overrides=overrides, job=job, job_wall_s=time.perf_counter() - started
    )
    write_row(out_dir, row)
    return result


__all__ = [
    "ERROR_FILE",
    "FAILED_STATUSES",
    "NO_PLAN_STATUSES",
    "ROW_COLUMNS",
    "ROW_FILE",
    "SWEEP_FILE",
    "make_row",
    "one_line",
    "planner_label",
    "run_recorded",
    "write_row",
]
