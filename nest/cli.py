"""The Hydra entry point: ``python run.py solver=<name> cluster=<name> model=<name> [k=v ...]``.

A run builds the problem, builds the planner from ``cfg.solver`` (:func:`nest.planner.build_planner`
calls the config's ``_target_`` only if it is a planner class), scores the plan with the shared
evaluator, prints the summary and writes ``plan.json``, ``report.json`` and ``summary.txt`` into the
Hydra run directory. A planner with ``solver.top_k=K`` (``nest``, ``brute``) adds the K best
configurations (``report.json["alternatives"]``, a table in the summary); ``robust=true`` re-scores
them under the cost model's uncertainty (``report.json["robustness"]``, ``robustness.png``;
:mod:`nest.robust`). User mistakes (``UserError``) and infeasible problems
(``Infeasible``) print one line, never a traceback; a configuration given as data that cannot run
as given (``InvalidConfiguration``, e.g. a published table row) is reported with status
``invalid``.
"""

import json
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nest.alternatives import alternatives_to_dict, describe, format_alternatives
from nest.config import build_problem, register_schemas
from nest.cost import evaluate
from nest.errors import Infeasible, InvalidConfiguration, NotPublished, SolverTimeout, UserError
from nest.explain import explain_report, format_explain
from nest.export import export_plan, format_export, targets_of, write_export
from nest.planner import build_planner, solve_ranked
from nest.progress import Progress
from nest.results import run_recorded
from nest.robust import (
    check_ranges,
    format_robustness,
    plot_robustness,
    robustness,
    settings_from_config,
)
from nest.serialize import plan_to_dict, report_to_dict
from nest.simulate import plot_timeline, simulate
from nest.summary import format_summary, seq_len_source

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

register_schemas()


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def run(cfg: DictConfig, out_dir: Path, *, echo=None) -> dict:
    """Plan one case; returns the ``report.json`` content (also written to ``out_dir``).

    The summary goes to ``echo`` (default: stdout) and error lines to ``echo`` too when one is
    given (default: stderr).
    """
    echo_error = echo or _stderr
    echo = echo or print
    out_dir.mkdir(parents=True, exist_ok=True)
    solver_name = str(cfg.solver.get("name", "?"))
    base = {
        "solver": solver_name,
        "model": str(
            cfg.model.get("name") or cfg.model.get("config_path") or cfg.model.get("path") or "?"
        ),
        "cluster": str(cfg.cluster.get("name", "?")),
    }
    started = time.perf_counter()
    try:
        problem = build_problem(cfg)
        base["model"] = problem.model.name
        base["seq_len"] = problem.model.seq_len or None
        base["seq_len_source"] = seq_len_source(problem.model)
        export_targets = targets_of(cfg.get("export"))
        robust = _robust_settings(cfg)
        if robust is not None:
            check_ranges(problem, robust)
        planner = build_planner(cfg.solver)
        with Progress(f"planning with {solver_name}"):
            plans = solve_ranked(planner, problem)
        plan = plans[0]
    except (InvalidConfiguration, NotPublished, SolverTimeout) as exc:
        status = {InvalidConfiguration: "invalid", NotPublished: "unpublished"}.get(
            type(exc), "timeout"
        )
        result = {**base, "status": status, "feasible": False, "error": exc.reason}
        _write_json(out_dir / "report.json", result)
        echo_error(f"{status}: {exc.reason}")
        return result
    except UserError as exc:
        result = {**base, "status": "error", "feasible": False, "error": str(exc)}
        _write_json(out_dir / "report.json", result)
        echo_error(f"error: {exc}")
        return result
    except Infeasible as exc:
        result = {
            **base,
            "status": "infeasible",
            "feasible": False,
            "error": exc.reason,
            "min_memory_bytes": exc.min_memory_bytes,
            "solve_time_s": time.perf_counter() - started,
        }
        _write_json(out_dir / "report.json", result)
        echo_error(f"infeasible: {exc.reason}")
        return result
    report = evaluate(problem, plan)
    result = {**base, **report_to_dict(plan, report)}
    _write_json(out_dir / "plan.json", plan_to_dict(plan))
    _write_json(out_dir / "report.json", result)
    if cfg.get("simulate", False):
        sim = simulate(problem, plan, report)
        result["simulation"] = {
            "makespan_s": sim.makespan_s,
            "pipeline_s": sim.pipeline_s,
            "analytic_s": sim.analytic_s,
            "relative_error": sim.relative_error,
            "busy_s": list(sim.busy_s),
            "idle_s": list(sim.idle_s),
            "peak_in_flight": list(sim.peak_in_flight),
        }
        _write_json(out_dir / "report.json", result)
        with Progress("drawing timeline.png"):
            plot_timeline(sim, out_dir / "timeline.png")
    summary = format_summary(problem, plan, report)
    summary += "".join(f"\nnote: {n}" for n in problem.model.notes)
    if "simulation" in result:
        sim_d = result["simulation"]
        summary += (
            f"\nsimulated iteration {sim_d['makespan_s']:.4f} s (the analytic formula is "
            f"{100 * sim_d['relative_error']:+.2f} % off); timeline.png"
        )
    written = ["plan.json", "report.json", "summary.txt"]
    summary += _alternatives(problem, planner, plans, report, robust, result, out_dir, written)
    (out_dir / "summary.txt").write_text(summary + "\n")
    extra = _explain_and_export(
        cfg, problem, plan, report, result, out_dir, export_targets, written
    )
    if cfg.get("print_summary", True):
        echo(summary)
        for block in extra:
            echo("\n" + block)
        echo(f"\nwrote {', '.join(written)} to {out_dir}")
    return result


def _robust_settings(cfg: DictConfig):
    """The robustness settings when ``robust=true`` (checked before planning), else None."""
    robust = cfg.get("robust", False)
    if not isinstance(robust, bool):
        raise UserError(f"robust={robust!r}; use robust=true or robust=false")
    if not robust:
        return None
    block = cfg.get("robustness")
    plain = OmegaConf.to_container(block, resolve=True) if isinstance(block, DictConfig) else block
    return settings_from_config(plain, int(cfg.get("seed", 0) or 0))


def _alternatives(problem, planner, plans, report, robust, result, out_dir, written) -> str:
    """``solver.top_k`` > 1: ``report.json["alternatives"]``; ``robust=true``:
    ``report.json["robustness"]`` and ``robustness.png``. Returns the summary's extra lines."""
    text = ""
    if getattr(planner, "top_k", 1) > 1:
        reports = [report] + [evaluate(problem, p) for p in plans[1:]]
        result["alternatives"] = alternatives_to_dict(plans, reports)
        text += "\n\n" + format_alternatives(problem, result["alternatives"])
        if len(plans) < planner.top_k:
            text += (
                f"\nonly {len(plans)} configurations of the space have a plan that fits "
                f"(solver.top_k={planner.top_k})"
            )
    if robust is not None:
        total = robust.samples
        with Progress(f"re-scoring {len(plans)} plans in {total} samples", total=total) as prog:
            result["robustness"] = robustness(problem, plans, robust, prog)
        with Progress("drawing robustness.png"):
            labels = [describe(p) for p in plans]
            plot_robustness(result["robustness"], labels, out_dir / "robustness.png")
        result["robustness"]["plot"] = "robustness.png"
        written.append("robustness.png")
        text += "\n\n" + format_robustness(result["robustness"])
    if text:
        _write_json(out_dir / "report.json", result)
    return text


def _explain_and_export(cfg, problem, plan, report, result, out_dir, targets, written) -> list:
    """``explain=true`` and ``export=...``: write their files, return the text blocks to print."""
    blocks = []
    if cfg.get("explain", False):
        explanation = explain_report(result)
        text = format_explain(explanation)
        _write_json(out_dir / "explain.json", explanation)
        (out_dir / "explain.txt").write_text(text + "\n")
        written += ["explain.txt", "explain.json"]
        blocks.append(text)
    for target in targets:
        exp = export_plan(problem, plan, target, report)
        written += write_export(exp, out_dir)
        result.setdefault("export", {})[target] = {
            k: v for k, v in exp.to_dict().items() if k != "text"
        }
        blocks.append(format_export(exp))
    if targets:
        _write_json(out_dir / "report.json", result)
    return blocks


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    # every job writes row.json (nest/results.py); in a multirun a crash becomes a row, not a stop
    result = run_recorded(
        run,
        cfg,
        Path(hydra_cfg.runtime.output_dir),
        overrides=list(hydra_cfg.overrides.task),
        job=hydra_cfg.job.get("num") if multirun else None,
        keep_going=multirun,
    )
    failed = ("error", "infeasible", "invalid", "unpublished", "timeout")
    if not multirun and result["status"] in failed:
        sys.exit(2 if result["status"] == "error" else 1)


__all__ = ["main", "run"]
