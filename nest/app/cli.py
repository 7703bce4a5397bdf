"""The Hydra entry point: ``python run.py solver=<name> cluster=<name> model=<name> [k=v ...]``.

A run builds the problem, builds the planner from ``cfg.solver`` (:func:`nest.planner.build_planner`
calls the config's ``_target_`` only if it is a planner class), scores the plan with the shared
evaluator, prints the summary and writes ``plan.json``, ``report.json`` and ``summary.txt`` into the
Hydra run directory. A planner with ``solver.top_k=K`` (``nest``, ``brute``) adds the K best
configurations (``report.json["alternatives"]``, a table in the summary); ``robust=true`` re-scores
them under the cost model's uncertainty (``report.json["robustness"]``, ``robustness.png``;
:mod:`nest.analysis.robust`). User mistakes (``UserError``) and infeasible problems
(``Infeasible``) print one line, never a traceback; a configuration given as data that cannot run
as given (``InvalidConfiguration``, e.g. a published table row) is reported with status
``invalid``. Mistakes Hydra finds while composing the config (a malformed YAML file, an unknown
preset, key or override) print one ``error:`` line too (:func:`main`).
"""

import json
import os
import sys
import time
from pathlib import Path

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nest.analysis.alternatives import alternatives_to_dict, describe, format_alternatives
from nest.analysis.explain import explain_report, format_explain
from nest.analysis.robust import (
    check_ranges,
    format_robustness,
    plot_robustness,
    robustness,
    settings_from_config,
)
from nest.analysis.simulate import plot_timeline, simulate
from nest.app.config import build_problem, check_config, register_schemas
from nest.app.results import run_recorded
from nest.app.summary import format_summary, seq_len_source
from nest.core.errors import (
    Infeasible,
    InvalidConfiguration,
    NotPublished,
    SolverTimeout,
    UserError,
    yaml_error_text,
)
from nest.core.files import write_text
from nest.core.progress import Progress
from nest.core.serialize import plan_to_dict, report_to_dict
from nest.cost import evaluate
from nest.export import export_plan, format_export, targets_of, write_export
from nest.planner import build_planner, check_memory_floor, solve_ranked

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")

register_schemas()


def _write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _section_name(cfg: DictConfig, section: str, *keys: str) -> str:
    """What names a section (``model.name``, else its file), "?" while it cannot be read (the
    run then reports why)."""
    node = cfg.get(section)
    if not isinstance(node, DictConfig):
        return "?"
    try:
        return str(next((node[k] for k in keys if node.get(k)), "?"))
    except OmegaConfBaseException:
        return "?"


def run(cfg: DictConfig, out_dir: Path, *, echo=None) -> dict:
    """Plan one case; returns the ``report.json`` content (also written to ``out_dir``).

    The summary goes to ``echo`` (default: stdout) and error lines to ``echo`` too when one is
    given (default: stderr).
    """
    echo_error = echo or _stderr
    echo = echo or print
    out_dir.mkdir(parents=True, exist_ok=True)
    solver_name = _section_name(cfg, "solver", "name")
    base = {
        "solver": solver_name,
        "model": _section_name(cfg, "model", "name", "config_path", "path"),
        "cluster": _section_name(cfg, "cluster", "name"),
    }
    started = time.perf_counter()
    try:
        check_config(cfg)
        problem = build_problem(cfg)
        base["model"] = problem.model.name
        base["seq_len"] = problem.model.seq_len or None
        base["seq_len_source"] = seq_len_source(problem.model)
        export_targets = targets_of(cfg.get("export"))
        robust = _robust_settings(cfg)
        if robust is not None:
            check_ranges(problem, robust)
        planner = build_planner(cfg.solver)
        if not getattr(planner, "scores_given_plan", False):
            check_memory_floor(problem, solver_name)  # a search on a model that fits nowhere
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
    write_text(out_dir / "summary.txt", summary + "\n")
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
        write_text(out_dir / "explain.txt", text + "\n")
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
def hydra_main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    # every job writes row.json (nest/app/results.py); in a multirun a crash becomes a row, not a
    # stop
    result = run_recorded(
        run,
        cfg,
        Path(hydra_cfg.runtime.output_dir),
        overrides=list(hydra_cfg.overrides.task),
        job=hydra_cfg.job.get("num") if multirun else None,
        keep_going=multirun,
    )
    code = exit_status(result["status"])
    if not multirun and code:
        sys.exit(code)


def exit_status(status: str) -> int:
    """A single run's exit status: 2 for a user mistake (``error``), 1 when it produced no plan
    (``infeasible``, ``invalid``, ``unpublished``, ``timeout``), else 0."""
    if status == "error":
        return 2
    return 1 if status in ("infeasible", "invalid", "unpublished", "timeout") else 0


def _flatten(text: str) -> str:
    """Hydra's several-line messages on one line (an indented list joined with commas), without
    the search path it appends and the schemas it lists among a group's presets."""
    out = ""
    for raw in text.split("\nConfig search path:")[0].splitlines():
        line = raw.strip()
        if not line or (raw.startswith("\t") and line.endswith("_schema")):
            continue
        if not out:
            out = line
        elif raw.startswith("\t") and not out.endswith(":"):
            out += f", {line}"
        else:
            out += f" {line}" if out.endswith((":", ".")) else f"; {line}"
    return out


def _file_being_read(exc: BaseException) -> str:
    """The config file Hydra was reading when ``exc`` was raised (its file source's
    ``full_path``), or "a config file"."""
    tb = exc.__traceback__
    found = "a config file"
    while tb is not None:
        path = tb.tb_frame.f_locals.get("full_path")
        if isinstance(path, str):
            found = path
        tb = tb.tb_next
    return found


def hydra_error_line(exc: BaseException) -> str | None:
    """One line for a mistake found while Hydra composes the config, or None (a bug, which keeps
    its traceback): a malformed YAML file (the file, line and column), or Hydra's own report of
    an unknown preset, key or override (with OmegaConf's reason)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, yaml.YAMLError):
            return f"malformed YAML: {yaml_error_text(seen)}"
        if isinstance(seen, UnicodeDecodeError):
            where = _file_being_read(seen)
            return f"{where} is not UTF-8 text ({seen.reason} at byte {seen.start})"
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, CompactHydraException) and not isinstance(exc, InstantiationException):
        text = str(exc)
        if isinstance(exc.__cause__, OmegaConfBaseException):
            text += "\n" + str(exc.__cause__).splitlines()[0]
        return _flatten(text)
    return None


def main() -> None:
    """``python run.py ...``: :func:`hydra_main`, with a mistake Hydra finds while composing the
    config printed as one ``error:`` line and exit status 2, as a run's own mistakes are (Hydra
    would print a parser's traceback for a malformed YAML file). ``HYDRA_FULL_ERROR=1`` keeps
    Hydra's full report."""
    previous = os.environ.get("HYDRA_FULL_ERROR")
    if previous == "1":
        hydra_main()
        return
    from nest.core.files import INTERRUPTED, Unwritable, output_error_line

    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises instead of printing its own report
    try:
        hydra_main()
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback
        print(INTERRUPTED, file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT, what a shell reports for a process Ctrl-C stopped
    except Unwritable as exc:  # the run's own outputs (nest.app.results.run_recorded)
        print(f"error: {exc.line}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:
        # an output directory that cannot be written (a file, read-only, full): one line too
        line = hydra_error_line(exc) or output_error_line(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous


__all__ = ["exit_status", "hydra_error_line", "hydra_main", "main", "run"]
