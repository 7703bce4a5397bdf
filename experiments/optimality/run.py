"""The optimality study: one seeded small instance per job, solved by every exact planner.

    python -m experiments.optimality.run -m 'seed=range(0,300)' hydra/launcher=parallel

Per job (one seed, :mod:`experiments.optimality.instances`) it runs ``nest`` (the DP), ``brute``
(when the space has at most ``brute_max_plans`` plans), ``cpsat`` and ``milp`` in the restricted
mode with and without the DP's warm start, and both in the general mode, and writes ``row.json``
with each solver's value (shared evaluator), status, proven bound and wall time, and the
restricted-vs-general gap. A solver that fails writes its status and error instead; the job
never raises. At the end of the sweep :mod:`experiments.optimality.aggregate` builds the table,
the histogram and the summary.

Progress (Hydra's logging: the console and each job's ``run.log``): a solve still running after
``progress_every_s`` logs ``seed 131: cpsat_general still running after 10 s (limit 60 s)``, and
again every ``progress_every_s``; a finished instance logs its values and time; the sweep
callback logs ``optimality progress: 12/300 instances done`` after each.
"""

import json
import logging
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from baselines.brute import BrutePlanner, count_plans
from experiments.optimality.instances import describe, instance
from nest.core.errors import Infeasible, SolverTimeout, UserError
from nest.core.files import write_text
from nest.dp.planner import NestPlanner
from nest.dp.space import SpaceOptions
from nest.exact.planner import ExactPlanner

CONF_DIR = str(Path(__file__).parent / "conf")
ROW_FILE = "row.json"

log = logging.getLogger("experiments.optimality.run")  # also under python -m

SOLVERS = {
    "nest": lambda o, cfg: NestPlanner(**o),
    "brute": lambda o, cfg: BrutePlanner(max_plans=cfg.brute_max_plans, **o),
    "cpsat_restricted": lambda o, cfg: _exact("cpsat", "restricted", True, o, cfg),
    "cpsat_restricted_nohint": lambda o, cfg: _exact("cpsat", "restricted", False, o, cfg),
    "milp_restricted": lambda o, cfg: _exact("milp", "restricted", True, o, cfg),
    "milp_restricted_nohint": lambda o, cfg: _exact("milp", "restricted", False, o, cfg),
    "cpsat_general": lambda o, cfg: _exact("cpsat", "general", True, o, cfg),
    "milp_general": lambda o, cfg: _exact("milp", "general", True, o, cfg),
}


def _exact(backend: str, mode: str, hint: bool, options: dict, cfg) -> ExactPlanner:
    return ExactPlanner(
        name=backend,
        backend=backend,
        mode=mode,
        hint=hint,
        time_limit_s=cfg.time_limit_s,
        max_placements=cfg.max_placements,
        **options,
    )


def solve_one(name: str, problem, options: dict, cfg) -> dict:
    """One solver on one instance: its value, status, bound and time (never raises)."""
    started = time.perf_counter()
    out: dict = {"status": None, "value_s": None, "bound_s": None}
    try:
        plan = SOLVERS[name](options, cfg).solve(problem)
    except Infeasible:
        out["status"] = "infeasible"
    except SolverTimeout:
        out["status"] = "timeout"
    except UserError as exc:
        out.update(status="error", error=str(exc))
    except Exception as exc:  # a bug: recorded, the study goes on
        out.update(status="crashed", error=f"{exc!r}", traceback=traceback.format_exc())
    else:
        out.update(status=plan.status, value_s=plan.objective_s, bound_s=plan.bound_s)
        out["search"] = {
            k: v
            for k, v in plan.search.items()
            if k
            in ("groups", "groups_pruned", "booleans", "placement_classes", "hint", "time_solver_s")
        }
    out["time_s"] = time.perf_counter() - started
    return out


@contextmanager
def still_running(what: str, every_s: float) -> Iterator[None]:
    """Log ``<what> still running after N s`` every ``every_s`` until the block ends."""
    done = threading.Event()
    started = time.perf_counter()

    def watch() -> None:
        while not done.wait(every_s):
            log.info("%s still running after %.3g s", what, time.perf_counter() - started)

    watcher = threading.Thread(target=watch, name="still-running", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def study_row(seed: int, cfg) -> dict:
    problem, options = instance(
        seed, max_devices=cfg.max_devices, restrict=cfg.restrict, network=cfg.network
    )
    row = {"seed": seed, "restrict": bool(cfg.restrict), "network": cfg.network}
    row.update(describe(problem))
    plans = count_plans(problem, SpaceOptions(**options))
    row["space_plans"] = plans
    results = {}
    for name in cfg.solvers:
        if name not in SOLVERS:
            raise UserError(f"solvers entry {name!r}; use some of {sorted(SOLVERS)}")
        if name == "brute" and plans > cfg.brute_max_plans:
            results[name] = {"status": "skipped", "value_s": None, "time_s": 0.0}
            continue
        nothing_fits = results.get("nest", {}).get("status") == "infeasible"
        if name.endswith("_general") and nothing_fits and cfg.get("general_if_infeasible") is False:
            # memory does not depend on the placement: no placement fits either
            results[name] = {"status": "skipped", "value_s": None, "time_s": 0.0}
            continue
        limit = f" (limit {cfg.time_limit_s} s)" if name not in ("nest", "brute") else ""
        with still_running(f"seed {seed}: {name}{limit}", float(cfg.progress_every_s)):
            results[name] = solve_one(name, problem, options, cfg)
    row["solvers"] = results
    row["general_gap"] = general_gap(results)
    return row


def _proven(results: dict, names: tuple[str, ...]) -> float | None:
    """The value of the first of ``names`` that proved its optimum."""
    for name in names:
        got = results.get(name, {})
        if got.get("status") == "optimal" and got.get("value_s") is not None:
            return got["value_s"]
    return None


def general_gap(results: dict) -> float | None:
    """``(restricted - general) / restricted`` from proven optima only (CP-SAT's, else
    HiGHS's): a solve stopped by its time limit holds a plan, not the optimum."""
    restricted = _proven(results, ("cpsat_restricted", "milp_restricted"))
    general = _proven(results, ("cpsat_general", "milp_general"))
    if not restricted or general is None:
        return None
    return (restricted - general) / restricted


@hydra.main(config_path=CONF_DIR, config_name="optimality", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    started = time.perf_counter()
    try:
        row = study_row(int(cfg.seed), cfg)
    except UserError as exc:
        row = {"seed": cfg.seed, "error": str(exc)}
        log.error("error: %s", exc)
    write_text(out_dir / ROW_FILE, json.dumps(row, indent=1, default=str) + "\n")
    log.info(
        "seed %s done in %.1f s: %s",
        cfg.seed,
        time.perf_counter() - started,
        ", ".join(f"{k}={_outcome(v)}" for k, v in row.get("solvers", {}).items()),
    )


def _outcome(result: dict) -> str:
    """A solver's value (seconds per iteration) when it has one, else its status."""
    value = result.get("value_s")
    return f"{value:.6g}" if value is not None else str(result.get("status"))


if __name__ == "__main__":
    main()
