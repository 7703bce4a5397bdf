"""``hydra/launcher=parallel`` for this project: parallel jobs in loky worker processes, and a job
that kills its worker does not stop the sweep.

With the stock joblib launcher a worker that dies (``os._exit``, a segfault, SIGKILL from the
kernel's out-of-memory killer) breaks the whole process pool: every unfinished job fails with
``TerminatedWorkerError``, Hydra stops the sweep, the remaining jobs never run and nothing is
aggregated. Here each job is a future of joblib's loky executor, and when the pool breaks:

1. the jobs that finished keep their results;
2. the jobs that had started (each writes a marker before it runs: ``.launcher/<num>`` in the
   sweep directory, holding its run directory) are rerun **one at a time, alone in the pool**,
   so one that dies again is the one that kills its worker: it is recorded as crashed by writing
   ``error.txt`` into its run directory (there is no Python traceback to write), and its Hydra
   result is a completed job with no return value, so the sweep goes on;
3. the jobs that never started run in parallel again, and so on until every job ran.

A job killed collaterally (it shared the pool with the one that died) therefore runs again and
keeps its row. Jobs that raise an ordinary exception are Hydra's business as with any launcher
(this project's entry points never raise: :func:`nest.app.results.run_recorded`).

Configured by ``conf/hydra/launcher/parallel.yaml`` (``n_jobs``: worker processes, -1 for every
CPU, as joblib counts them). Needs ``joblib`` (``pip install '.[parallel]'``).
"""

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from nest.core.files import write_text

log = logging.getLogger(__name__)

MARKER_DIR = ".launcher"
"""Under the sweep directory: ``<num>`` is written by job ``num`` when it starts."""
ERROR_FILE = "error.txt"
"""What a crashed job leaves in its run directory (``nest.app.results.ERROR_FILE``)."""
DIED_PREFIX = "worker process died"
"""The first words of the ``error.txt`` of a job that killed its worker."""


def _job_config(hydra_context: HydraContext, config: DictConfig, num: int, overrides) -> Any:
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{num}"
        sweep_config.hydra.job.num = num
    return sweep_config


def run_one(
    num: int,
    overrides: Sequence[str],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict,
    marker_dir: str,
) -> JobReturn:
    """Job ``num`` in a worker process: its marker, then Hydra's ``run_job``."""
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = _job_config(hydra_context, config, num, overrides)
    HydraConfig.instance().set_config(sweep_config)
    run_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
    write_text(Path(marker_dir) / str(num), str(run_dir.absolute()) + "\n")
    return run_job(
        hydra_context=hydra_context,
        task_function=task_function,
        config=sweep_config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def _exit_codes(exc: BaseException) -> str:
    """``SIGKILL(-9)`` from loky's message, else the exception's name."""
    found = re.search(r"exit codes of the workers are \{([^}]*)\}", str(exc))
    return found.group(1) if found else type(exc).__name__


class SurvivingJoblibLauncher(Launcher):
    """Hydra launcher: jobs in ``n_jobs`` loky processes; a dead worker costs one job, not the
    sweep (see the module doc)."""

    def __init__(self, n_jobs: int = -1, **ignored: Any) -> None:
        self.n_jobs = n_jobs
        self.ignored = ignored
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self._state: dict = {}

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from joblib import effective_n_jobs

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        marker_dir = sweep_dir / MARKER_DIR
        marker_dir.mkdir(parents=True, exist_ok=True)
        jobs = {initial_job_idx + i: list(o) for i, o in enumerate(job_overrides)}
        for num in jobs:
            (marker_dir / str(num)).unlink(missing_ok=True)
        workers = max(1, min(effective_n_jobs(self.n_jobs), len(jobs)))
        if self.ignored:
            log.warning("joblib launcher: ignoring %s", ", ".join(sorted(self.ignored)))
        log.info(
            "Launching %d jobs in %d worker processes, sweep output dir: %s",
            len(jobs),
            workers,
            sweep_dir,
        )
        for num, overrides in jobs.items():
            log.info("\t#%d : %s", num, " ".join(filter_overrides(overrides)))
        results: dict[int, JobReturn] = {}
        self._state = Singleton.get_state()
        todo = list(jobs)
        while todo:
            lost, why = self._run_parallel(todo, jobs, workers, marker_dir, results)
            started = [n for n in lost if (marker_dir / str(n)).exists()]
            if lost and not started and len(lost) == len(todo):
                raise RuntimeError(
                    f"the joblib worker processes die before running any job ({why}); "
                    "run the sweep with the default launcher to see why"
                )
            if lost:
                log.warning(
                    "a worker process died (%s) with %d jobs unfinished; rerunning the %d that "
                    "had started one at a time, alone, to find the one that kills its worker",
                    why,
                    len(lost),
                    len(started),
                )
            for num in started:
                self._run_alone(num, jobs[num], marker_dir, results)
            todo = [n for n in lost if n not in started]
        for num in jobs:  # every job ran: the markers have served
            (marker_dir / str(num)).unlink(missing_ok=True)
            # and a worker the broken pool terminated while it wrote its marker leaves the
            # atomic write's temporary file (nest.core.files.atomic_path) behind
            for leftover in marker_dir.glob(f".{num}.*.tmp"):
                leftover.unlink(missing_ok=True)
        if not any(marker_dir.iterdir()):
            marker_dir.rmdir()
        return [results[n] for n in jobs]

    def _submit(self, executor, num: int, overrides: list[str], marker_dir: Path):
        return executor.submit(
            run_one,
            num,
            overrides,
            self.hydra_context,
            self.config,
            self.task_function,
            self._state,
            str(marker_dir),
        )

    def _run_parallel(self, todo, jobs, workers, marker_dir, results) -> tuple[list[int], str]:
        """Run ``todo`` in the pool; returns the jobs lost to a dead worker and its exit codes."""
        from concurrent.futures.process import BrokenProcessPool

        from joblib.externals.loky import get_reusable_executor

        executor = get_reusable_executor(max_workers=min(workers, len(todo)))
        futures = {num: self._submit(executor, num, jobs[num], marker_dir) for num in todo}
        lost, why = [], ""
        try:
            for num, future in futures.items():
                try:
                    results[num] = future.result()
                except BrokenProcessPool as exc:
                    lost.append(num)
                    why = _exit_codes(exc)
        except BaseException:  # Ctrl-C, or a job's exception outside run_job: stop the workers
            executor.shutdown(wait=False, kill_workers=True)
            raise
        return lost, why

    def _run_alone(self, num: int, overrides: list[str], marker_dir: Path, results) -> None:
        from concurrent.futures.process import BrokenProcessPool

        from joblib.externals.loky import get_reusable_executor

        run_dir = Path((marker_dir / str(num)).read_text().strip())
        try:
            results[num] = self._submit(
                get_reusable_executor(max_workers=1), num, overrides, marker_dir
            ).result()
            log.info("job #%d ran alone and finished: it was not the one that died", num)
            return
        except BrokenProcessPool as exc:
            why = _exit_codes(exc)
        message = (
            f"{DIED_PREFIX} ({why}) while running this job, twice, the second time alone: "
            "no Python traceback (killed by a signal, os._exit, a segfault in native code or the "
            "out-of-memory killer)"
        )
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / ERROR_FILE, message + "\n")
        log.error("job #%d killed its worker process (%s): recorded in %s", num, why, run_dir)
        results[num] = JobReturn(
            overrides=overrides,
            working_dir=str(run_dir),
            task_name=str(self.config.hydra.job.name),
            status=JobStatus.COMPLETED,  # the sweep goes on; error.txt records the crash
            _return_value=None,
        )
