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

import contextlib
import gc
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

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
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.progress import Progress
from nest.core.serialize import plan_to_dict, report_to_dict
from nest.cost import evaluate
from nest.cost.mfu import mfu_figures
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
    given (default: stderr). Two steps: :func:`_plan` (every check, the problem, the search),
    then :func:`_report` (the score, the files, the options asked for); a mistake or a problem
    without a plan stops after the first with one line (:func:`_no_plan_result`).
    """
    echo_error = echo or _stderr
    echo = echo or print
    out_dir.mkdir(parents=True, exist_ok=True)
    base = {
        "solver": _section_name(cfg, "solver", "name"),
        "model": _section_name(cfg, "model", "name", "config_path", "path"),
        "cluster": _section_name(cfg, "cluster", "name"),
    }
    started = time.perf_counter()
    try:
        planned = _plan(cfg, base)
    except (UserError, Infeasible, SolverTimeout) as exc:
        result, line = _no_plan_result(exc, base, time.perf_counter() - started)
        _write_json(out_dir / "report.json", result)
        echo_error(line)
        return result
    return _report(cfg, planned, base, out_dir, echo)


@dataclass(frozen=True, slots=True)
class _Planned:
    """What :func:`_plan` found: the problem, the planner, its plans (best first) and the
    options checked before the search."""

    problem: Problem
    planner: Any
    plans: list[Plan]
    robust: Any  # nest.analysis.robust.RobustSettings when robust=true, else None
    export_targets: list[str]


def _plan(cfg: DictConfig, base: dict) -> _Planned:
    """Check the config, build the problem (its model's name and sequence length go into
    ``base``), check the options, build the planner and search. Raises :class:`UserError`,
    :class:`Infeasible` or :class:`SolverTimeout`."""
    solver_name = base["solver"]
    check_config(cfg)
    problem = build_problem(cfg)
    base["model"] = problem.model.name
    base["seq_len"] = problem.model.seq_len or None
    base["seq_len_source"] = seq_len_source(problem.model)
    export_targets = _export_targets(cfg)
    robust = _robust_settings(cfg, problem)
    planner = build_planner(cfg.solver)
    if not getattr(planner, "scores_given_plan", False):
        # a search on a model that fits nowhere (with the optimizer state on the host when the
        # planner's space offloads it)
        check_memory_floor(problem, solver_name, bool(getattr(planner, "offload", False)))
    with Progress(f"planning with {solver_name}"):
        plans = solve_ranked(planner, problem)
    return _Planned(problem, planner, plans, robust, export_targets)


def _no_plan_result(exc: Exception, base: dict, elapsed_s: float) -> tuple[dict, str]:
    """The ``report.json`` content and the one line of a run that stopped before a plan: a
    configuration that cannot run as given (``invalid``, ``unpublished``), a search that ran
    out of time (``timeout``), a user mistake (``error``), or no plan that fits
    (``infeasible``)."""
    if isinstance(exc, (InvalidConfiguration, NotPublished, SolverTimeout)):
        status = {InvalidConfiguration: "invalid", NotPublished: "unpublished"}.get(
            type(exc), "timeout"
        )
        result = {**base, "status": status, "feasible": False, "error": exc.reason}
        return result, f"{status}: {exc.reason}"
    if isinstance(exc, UserError):
        return {**base, "status": "error", "feasible": False, "error": str(exc)}, f"error: {exc}"
    result = {
        **base,
        "status": "infeasible",
        "feasible": False,
        "error": exc.reason,
        "min_memory_bytes": exc.min_memory_bytes,
        "solve_time_s": elapsed_s,
    }
    return result, f"infeasible: {exc.reason}"


def _report(cfg: DictConfig, planned: _Planned, base: dict, out_dir: Path, echo) -> dict:
    """Score the best plan with the shared evaluator, write ``plan.json``, ``report.json`` and
    ``summary.txt`` and what the options ask for, print the summary; returns ``report.json``'s
    content."""
    problem, plan = planned.problem, planned.plans[0]
    report = evaluate(problem, plan)
    result = {**base, **report_to_dict(plan, report), **mfu_figures(problem, report)}
    if hasattr(problem.model, "model_stats"):
        result["model_stats"] = problem.model.model_stats()
    _write_json(out_dir / "plan.json", plan_to_dict(plan))
    _write_json(out_dir / "report.json", result)
    summary = format_summary(problem, plan, report)
    notes = (*problem.model.notes, *problem.cluster.device.notes)
    summary += "".join(f"\nnote: {n}" for n in notes)
    if cfg.get("simulate", False):
        summary += _simulate(problem, plan, report, result, out_dir)
    written = ["plan.json", "report.json", "summary.txt"]
    summary += _alternatives(planned, report, result, out_dir, written)
    write_text(out_dir / "summary.txt", summary + "\n")
    extra = _explain_and_export(cfg, planned, report, result, out_dir, written)
    if cfg.get("print_summary", True):
        echo(summary)
        for block in extra:
            echo("\n" + block)
        echo(f"\nwrote {', '.join(written)} to {out_dir}")
    return result


def _export_targets(cfg: DictConfig) -> list[str]:
    """``export=...``'s targets, checked before planning (none: :mod:`nest.export` is not
    loaded)."""
    value = cfg.get("export")
    if value is None:
        return []
    from nest.export import targets_of

    return targets_of(value)


def _robust_settings(cfg: DictConfig, problem: Problem):
    """The robustness settings when ``robust=true``, checked against the problem before
    planning, else None (:mod:`nest.analysis.robust` is loaded only then)."""
    robust = cfg.get("robust", False)
    if not isinstance(robust, bool):
        raise UserError(f"robust={robust!r}; use robust=true or robust=false")
    if not robust:
        return None
    from nest.analysis.robust import check_ranges, settings_from_config

    block = cfg.get("robustness")
    plain = OmegaConf.to_container(block, resolve=True) if isinstance(block, DictConfig) else block
    settings = settings_from_config(plain, int(cfg.get("seed", 0) or 0))
    check_ranges(problem, settings)
    return settings


def _simulate(problem: Problem, plan: Plan, report, result: dict, out_dir: Path) -> str:
    """``simulate=true``: the event-driven simulation into ``report.json["simulation"]`` and
    ``timeline.png``; returns the summary's extra line."""
    from nest.analysis.simulate import plot_timeline, simulate

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
    return (
        f"\nsimulated iteration {sim.makespan_s:.4f} s (the analytic formula is "
        f"{100 * sim.relative_error:+.2f} % off); timeline.png"
    )


def _alternatives(planned: _Planned, report, result: dict, out_dir: Path, written: list) -> str:
    """``solver.top_k`` > 1: ``report.json["alternatives"]``; ``robust=true``:
    ``report.json["robustness"]`` and ``robustness.png``. Returns the summary's extra lines."""
    problem, planner, plans, robust = (
        planned.problem,
        planned.planner,
        planned.plans,
        planned.robust,
    )
    text = ""
    if getattr(planner, "top_k", 1) > 1:
        from nest.analysis.alternatives import alternatives_to_dict, format_alternatives

        reports = [report] + [evaluate(problem, p) for p in plans[1:]]
        result["alternatives"] = alternatives_to_dict(plans, reports)
        text += "\n\n" + format_alternatives(problem, result["alternatives"])
        if len(plans) < planner.top_k:
            text += (
                f"\nonly {len(plans)} configurations of the space have a plan that fits "
                f"(solver.top_k={planner.top_k})"
            )
    if robust is not None:
        from nest.analysis.alternatives import describe
        from nest.analysis.robust import format_robustness, plot_robustness, robustness

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


def _replanner(cfg, problem):
    """``replan(option)`` for an export that falls back: the solver run again with the option
    that keeps it inside what the target runs (a solver that has the option and did not use it),
    ``None`` when that finds nothing."""
    solver = OmegaConf.to_container(cfg.solver, resolve=True)
    if "export_runnable" not in solver or solver.get("export_runnable"):
        return None

    def replan(option: str):
        key, _, value = option.partition("=")
        restricted = {**solver, key.removeprefix("solver."): value, "top_k": 1}
        try:
            with Progress(f"re-planning with {option}"):
                return build_planner(restricted).solve(problem)
        except (UserError, Infeasible):
            return None

    return replan


def _explain_and_export(cfg, planned: _Planned, report, result, out_dir, written) -> list:
    """``explain=true`` and ``export=...``: write their files, return the text blocks to print."""
    blocks = []
    if cfg.get("explain", False):
        from nest.analysis.explain import explain_report, format_explain

        explanation = explain_report(result)
        text = format_explain(explanation)
        _write_json(out_dir / "explain.json", explanation)
        write_text(out_dir / "explain.txt", text + "\n")
        written += ["explain.txt", "explain.json"]
        blocks.append(text)
    if planned.export_targets:
        from nest.export import export_plan, format_export, write_export

        for target in planned.export_targets:
            exp = export_plan(
                planned.problem,
                planned.plans[0],
                target,
                report,
                _replanner(cfg, planned.problem),
            )
            written += write_export(exp, out_dir)
            result.setdefault("export", {})[target] = {
                k: v for k, v in exp.to_dict().items() if k != "text"
            }
            blocks.append(format_export(exp))
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


def sets_no_mode(argv: list[str]) -> bool:
    """Whether a command line leaves Hydra's run mode to the configs: no flag (``-m``,
    ``--cfg``, ``--config-dir``, ...), no override of ``hydra.mode`` or of the config search path,
    no choice in a ``hydra/`` group."""
    for arg in argv:
        key = arg.split("=", 1)[0].lstrip("+~")
        if arg.startswith("-") or key.startswith(("hydra.mode", "hydra.searchpath", "hydra/")):
            return False
    return True


@contextlib.contextmanager
def _one_composition():
    """Hydra composes the whole config twice for one run: first in ``Hydra.get_mode``, only to
    read ``hydra.mode``, then for the run (about a quarter of a quick run's time). When nothing
    sets a mode (no shipped config does: tests/test_startup.py) that first composition answers
    None, and Hydra runs one job with ``hydra.mode=RUN``; inside this block ``get_mode`` answers
    None without composing. Used only where the command line sets no mode
    (:func:`sets_no_mode`); a config that fails to compose still fails in the run's
    composition, with the same error."""
    from hydra._internal.hydra import Hydra

    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = original


def main() -> None:
    """``python run.py ...``: :func:`hydra_main`, with a mistake Hydra finds while composing the
    config printed as one ``error:`` line and exit status 2, as a run's own mistakes are (Hydra
    would print a parser's traceback for a malformed YAML file). ``HYDRA_FULL_ERROR=1`` keeps
    Hydra's full report. A single run's config is composed once (:func:`_one_composition`).

    The objects the imports made (modules, classes, functions) live as long as the process:
    ``gc.freeze()`` keeps the collector from scanning them again (a run spent about 0.1 s in
    collections, one full pass over them alone 0.04 to 0.1 s)."""
    gc.freeze()
    once = _one_composition() if sets_no_mode(sys.argv[1:]) else contextlib.nullcontext()
    with once:
        _main()


def _main() -> None:
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


__all__ = ["exit_status", "hydra_error_line", "hydra_main", "main", "run", "sets_no_mode"]
