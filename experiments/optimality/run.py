"""The optimality study: one seeded small instance per job, solved by every exact planner.

    python -m experiments.optimality.run -m 'seed=range(0,300)' hydra/launcher=joblib

Per job (one seed, :mod:`experiments.optimality.instances`) it runs ``nest`` (the DP), ``brute``
(when the space has at most ``brute_max_plans`` plans), ``cpsat`` and ``milp`` in the restricted
mode with and without the DP's warm start, and both in the general mode, and writes ``row.json``
with each solver's value (shared evaluator), status, proven bound and wall time, and the
restricted-vs-general gap. A solver that fails writes its status and error instead; the job
never raises. At the end of the sweep :mod:`experiments.optimality.aggregate` builds the table,
the histogram and the summary.
"""

import json
import time
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from baselines.brute import BrutePlanner, count_plans
from experiments.optimality.instances import describe, instance
from nest.dp.planner import NestPlanner
from nest.dp.space import SpaceOptions
from nest.errors import Infeasible, SolverTimeout, UserError
from nest.exact.planner import ExactPlanner

CONF_DIR = str(Path(__file__).parent / "conf")
ROW_FILE = "row.json"

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


def study_row(seed: int, cfg) -> dict:
    problem, options = instance(seed, max_devices=cfg.max_devices, restrict=cfg.restrict)
    row = {"seed": seed, "restrict": bool(cfg.restrict), **describe(problem)}
    plans = count_plans(problem, SpaceOptions(**options))
    row["space_plans"] = plans
    results = {}
    for name in cfg.solvers:
        if name not in SOLVERS:
            raise UserError(f"solvers entry {name!r}; use some of {sorted(SOLVERS)}")
        if name == "brute" and plans > cfg.brute_max_plans:
            results[name] = {"status": "skipped", "value_s": None, "time_s": 0.0}
            continue
        results[name] = solve_one(name, problem, options, cfg)
    row["solvers"] = results
    restricted = results.get("cpsat_restricted", {}).get("value_s")
    general = results.get("cpsat_general", {}).get("value_s")
    row["general_gap"] = (
        (restricted - general) / restricted if restricted and general is not None else None
    )
    return row


@hydra.main(config_path=CONF_DIR, config_name="optimality", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        row = study_row(int(cfg.seed), cfg)
    except UserError as exc:
        row = {"seed": cfg.seed, "error": str(exc)}
        print(f"error: {exc}")
    (out_dir / ROW_FILE).write_text(json.dumps(row, indent=1, default=str) + "\n")
    values = {k: v.get("value_s") for k, v in row.get("solvers", {}).items()}
    print(f"seed {cfg.seed}: " + ", ".join(f"{k}={v}" for k, v in values.items()))


if __name__ == "__main__":
    main()
