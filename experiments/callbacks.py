"""The Hydra callback of every run and sweep (``hydra.callbacks.sweep`` in ``conf/config.yaml``).

- ``on_multirun_start``: expands the sweep as the basic sweeper will and writes ``sweep.json``
  (the job list) into the sweep directory, so progress has a total and jobs that never start
  still get a ``missing`` row when the sweep is aggregated.
- ``on_job_end`` (in the worker, with any launcher): with ``plots=true`` draws the run's
  ``memory.png`` and ``placement.png``; in a multirun logs the progress, e.g.
  ``sweep progress: 12/50 jobs done, 1 failed (1 infeasible)``, counted from the ``row.json``
  files already written (so it holds across joblib workers and SLURM jobs).
- ``on_multirun_end``: aggregates the sweep (:func:`experiments.aggregate.aggregate`) and prints
  where the tables and plots are. Jobs never raise (:func:`nest.results.run_recorded`), so Hydra
  always reaches this point.
"""

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nest.results import FAILED_STATUSES, ROW_FILE, SWEEP_FILE

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


def sweep_progress(sweep_dir: Path) -> str:
    """``12/50 jobs done, 1 failed (1 infeasible)`` from the rows written so far."""
    statuses = Counter()
    for path in sweep_dir.rglob(ROW_FILE):
        try:
            statuses[json.loads(path.read_text()).get("status")] += 1
        except (OSError, ValueError):  # a row being replaced right now
            continue
    total = None
    if (sweep_dir / SWEEP_FILE).exists():
        total = json.loads((sweep_dir / SWEEP_FILE).read_text()).get("total_jobs")
    done = sum(statuses.values())
    failed = {s: n for s, n in statuses.items() if s in FAILED_STATUSES}
    text = f"{done}/{total if total is not None else '?'} jobs done, {sum(failed.values())} failed"
    if failed:
        text += " (" + ", ".join(f"{n} {s}" for s, n in sorted(failed.items())) + ")"
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
        self.also = [str(a) for a in also or ()]
        self.gpu_hour_usd = None if gpu_hour_usd is None else float(gpu_hour_usd)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
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
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(record, indent=1) + "\n")
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
        from experiments.aggregate import aggregate

        result = aggregate(
            Path(config.hydra.sweep.dir),
            baseline=self.baseline,
            plots=self.plots,
            also=self.also,
            gpu_hour_usd=self.gpu_hour_usd,
        )
        print(result.describe(), flush=True)
