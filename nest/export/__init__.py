"""Plans that run in other launchers: Megatron-LM arguments and a torchtitan config section.

``export_plan(problem, plan, target)`` returns an :class:`~nest.export.common.Export`; a plan the
target cannot express is exported as its nearest expressible plan, with a warning that gives that
plan's evaluated iteration time next to the chosen one's.
"""

import json
from pathlib import Path

from nest.core.errors import UserError
from nest.core.files import write_text
from nest.export.common import Export
from nest.export.megatron import export_megatron
from nest.export.torchtitan import export_torchtitan

TARGETS = {"megatron": export_megatron, "torchtitan": export_torchtitan}


def targets_of(value) -> list[str]:
    """``export=megatron``, ``export=[megatron,torchtitan]`` or null/none."""
    if value is None or value is False:
        return []
    items = [value] if isinstance(value, str) else list(value)
    names = [str(v).strip().lower() for v in items for v in str(v).split(",") if str(v).strip()]
    names = [n for n in names if n not in ("none", "null", "")]
    for name in names:
        if name not in TARGETS:
            raise UserError(f"export={name!r}; use one of {sorted(TARGETS)} (or a list of them)")
    return list(dict.fromkeys(names))


def export_plan(problem, plan, target: str, report=None, replan=None) -> Export:
    """``replan(option)``, when given, returns the plan the planner finds with the solver option
    that keeps it inside what ``target`` runs (``solver.export_runnable=...``), or ``None``."""
    if target not in TARGETS:
        raise UserError(f"export={target!r}; use one of {sorted(TARGETS)}")
    return TARGETS[target](problem, plan, report, replan)


def write_export(exp: Export, out_dir: Path) -> list[str]:
    """Write the paste-able file and ``export_<target>.json``; return the file names."""
    write_text(out_dir / exp.filename, exp.text)
    name = f"export_{exp.filename.split('.')[0]}.json"
    write_text(out_dir / name, json.dumps(exp.to_dict(), indent=2) + "\n")
    return [exp.filename, name]


def format_export(exp: Export) -> str:
    lines = [exp.text.rstrip()]
    lines += [f"warning: {w}" for w in exp.warnings]
    lines += [f"note: {n}" for n in exp.notes]
    return "\n".join(lines)


__all__ = ["Export", "TARGETS", "export_plan", "format_export", "targets_of", "write_export"]
