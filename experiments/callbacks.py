"""The Hydra callback of every run and sweep (``hydra.callbacks.sweep`` in ``conf/config.yaml``).

- ``on_multirun_start``: expands the sweep as the basic sweeper will and writes ``sweep.json``
  (the job list) into the sweep directory, so progress has a total and jobs that never start
  still get a ``missing`` row when the sweep is aggregated.
- ``on_job_end`` (in the worker, with any launcher): with ``plots=true`` draws the run's
  ``memory.png`` and ``placement.png``; in a multirun logs the progress, e.g.
  ``sweep progress: 12/50 jobs done, 1 failed (1 crashed), 2 without a plan (2 infeasible)``,
  counted from the ``row.json`` files already written (so it holds across worker processes and
  SLURM jobs).
- ``on_multirun_end``: aggregates the sweep (:func:`experiments.aggregate.aggregate`), prints
  where the tables and plots are, and exits with status 1 when a job failed
  (:data:`nest.app.results.FAILED_STATUSES`: ``timeout``, ``error``, ``crashed``, ``missing``; not
  ``infeasible``, ``invalid`` or ``unpublished``, which are answers) or when the aggregation
  itself failed. Jobs never raise (:func:`nest.app.results.run_recorded`) and the ``parallel``
  launcher survives a dead worker, so Hydra reaches this point; when it does not (Ctrl-C, a
  launcher that gives up, e.g. submitit on a job SLURM killed), the process prints at exit the
  command that builds the tables from the rows written so far.
"""

import atexit
import json
import logging
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nest.app.results import FAILED_STATUSES, NO_PLAN_STATUSES, ROW_FILE, SWEEP_FILE
from nest.core.files import write_text
from nest.core.progress import Progress

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def expand_sweep(params: dict[str, str], task_overrides: list[str]) -> list[list[str]]:
    """The jobs the basic sweeper launches for ``hydra.sweeper.params`` plus the command line.

    Same parsing and order as ``BasicSweeper.sweep`` (config params first, then the command
    line; the product of every swept key), so job ``i`` gets the overrides ``jobs[i]``.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    loader = (
        GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    )
    parser = OverridesParser.create(config_loader=loader)
    args = [f"{k}={v}" for k, v in params.items()] + list(task_overrides)
    return BasicSweeper.split_arguments(parser.parse_overrides(args), None)[0]


def write_sweep_record(config: DictConfig) -> dict:
    """``sweep.json`` in the sweep directory: ``total_jobs`` and each job's overrides (null when
    the sweeper is not the basic one); returns it."""
    sweep_dir = Path(config.hydra.sweep.dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    jobs = None
    if config.hydra.sweeper.get("_target_") == BASIC_SWEEPER:
        params = config.hydra.sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=True) if params else {}
        try:
            jobs = expand_sweep(
                {str(k): str(v) for k, v in params.items()}, list(config.hydra.overrides.task)
            )
        except Exception as exc:  # the sweeper will report a bad override itself
            log.warning("could not count the sweep's jobs: %s", exc)
    record = {"total_jobs": len(jobs) if jobs is not None else None, "jobs": jobs}
    write_text(sweep_dir / SWEEP_FILE, json.dumps(record, indent=1) + "\n")
    return record


def sweep_total(sweep_dir: Path) -> int | None:
    """The number of jobs ``sweep.json`` lists, None when unknown."""
    path = sweep_dir / SWEEP_FILE
    return json.loads(path.read_text()).get("total_jobs") if path.exists() else None


def aggregate_command(sweep_dir: Path) -> str:
    """The shell command that (re)builds a sweep's tables and plots."""
    return f"python -m experiments.aggregate {shlex.quote(str(sweep_dir))}"


def _counts(statuses: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))


def sweep_progress(sweep_dir: Path) -> str:
    """``12/50 jobs done, 1 failed (1 crashed), 2 without a plan (2 infeasible)`` from the rows
    written so far: failed as in :data:`nest.app.results.FAILED_STATUSES`."""
    statuses = Counter()
    for path in sweep_dir.rglob(ROW_FILE):
        try:
            statuses[json.loads(path.read_text()).get("status")] += 1
        except (OSError, ValueError):  # a row being replaced right now
            continue
    total = sweep_total(sweep_dir)
    done = sum(statuses.values())
    failed = {s: n for s, n in statuses.items() if s in FAILED_STATUSES}
    no_plan = {s: n for s, n in statuses.items() if s in NO_PLAN_STATUSES - FAILED_STATUSES}
    text = f"{done}/{total if total is not None else '?'} jobs done, {sum(failed.values())} failed"
    if failed:
        text += f" ({_counts(failed)})"
    if no_plan:
        text += f", {sum(no_plan.values())} without a plan ({_counts(no_plan)})"
    return text


class SweepCallback(Callback):
    """Progress, per-run plots and the aggregation at the end of a multirun.

    ``baseline``: the planner label throughput is normalised to; ``plots``: draw the sweep's
    plots when aggregating; ``also``: further planners with a speed-up column of their own;
    ``gpu_hour_usd``: the price of a device-hour for the cost per token (None: device-hours only).
    """

    def __init__(
        self,
        baseline: str = "megatron",
        plots: bool = True,
        also: list[str] | tuple[str, ...] = (),
        gpu_hour_usd: float | None = None,
    ) -> None:
        self.baseline = baseline
        self.plots = plots
        self._ended = False
        self.also = [str(a) for a in also or ()]
        self.gpu_hour_usd = None if gpu_hour_usd is None else float(gpu_hour_usd)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        atexit.register(self._note_if_not_ended, sweep_dir)
        record = write_sweep_record(config)
        log.info("sweep of %s jobs into %s", record["total_jobs"] or "?", sweep_dir)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        hydra_cfg = HydraConfig.get()
        out_dir = Path(hydra_cfg.runtime.output_dir)
        if config.get("plots", False):
            from experiments.plots import plot_job

            try:
                plot_job(out_dir)
            except Exception as exc:  # a plot must never cost the row
                log.warning("plots of %s failed: %s", out_dir, exc)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            log.info("sweep progress: %s", sweep_progress(Path(config.hydra.sweep.dir)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Aggregate, then exit 1 if a job failed or the tables could not be built."""
        from experiments.aggregate import aggregate

        sweep_dir = Path(config.hydra.sweep.dir)
        self._ended = True
        try:
            with Progress(f"aggregating {sweep_dir}"):
                result = aggregate(
                    sweep_dir,
                    baseline=self.baseline,
                    plots=self.plots,
                    also=self.also,
                    gpu_hour_usd=self.gpu_hour_usd,
                )
        except Exception as exc:  # Hydra would turn it into a warning and exit 0
            log.exception("aggregating %s failed", sweep_dir)
            print(
                f"error: the sweep's tables could not be built ({type(exc).__name__}: {exc}); "
                f"once fixed, build them with: {aggregate_command(sweep_dir)}",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(1) from exc
        print(result.describe(), flush=True)
        if result.failed:
            print(
                f"error: {sum(result.failed.values())} of {result.jobs} jobs failed "
                f"({_counts(result.failed)}): the status and error columns of results.md say "
                "why; exit status 1",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(1)

    def _note_if_not_ended(self, sweep_dir: Path) -> None:
        """At exit of a multirun that never reached ``on_multirun_end``: how to get the tables."""
        if self._ended or not sweep_dir.is_dir():
            return
        if not (any(sweep_dir.rglob(ROW_FILE)) or any(sweep_dir.rglob(".hydra"))):
            return  # no job started: nothing to aggregate
        print(
            "note: the sweep stopped before its end-of-sweep step; build the tables and plots "
            f"from the rows written so far with: {aggregate_command(sweep_dir)}",
            file=sys.stderr,
            flush=True,
        )
