"""The two kinds of error a user can cause.

``UserError`` is bad input (a value that cannot be right: a fan-out that does not multiply to the
device count, a degree that does not divide). ``Infeasible`` is a well-formed problem or plan that
cannot run (memory over capacity, no plan fits). Both carry a one-line message that names the value
and the fix; the entry point prints it without a traceback. Anything else is a bug.
"""


class UserError(ValueError):
    """Bad input: the message names the offending value and how to fix it."""


class Infeasible(Exception):
    """No plan (or not this plan) can run; ``reason`` says what is missing and what would help.

    ``min_memory_bytes`` is, when known, the smallest per-device memory any plan would need.
    """

    def __init__(self, reason: str, *, min_memory_bytes: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.min_memory_bytes = min_memory_bytes


class InvalidConfiguration(UserError):
    """A configuration given as data (e.g. a row of a published table) that cannot run on this
    problem as given. ``reason`` lists every rule it breaks; a run reports it with status
    ``invalid`` (a result about the data, not a mistake in the command)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotPublished(UserError):
    """A published table has no row for this case (e.g. the NEST paper gives no Manual plan for
    GPT-3 at microbatch 4). A run reports it with status ``unpublished``: a gap in the data, not
    a mistake in the command."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SolverTimeout(Exception):
    """An exact solver's time limit passed before it found any plan; a run reports it with
    status ``timeout`` (a limit of the run, not a property of the problem)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def yaml_error_text(exc: Exception) -> str:
    """One line for a YAML parse error: the file, the line and column (1-based) and the problem.

    PyYAML's messages span several lines (``while parsing ... in "f", line 5, column 9 /
    expected ... in "f", line 6, column 7``); this keeps the same facts on one line, the place of
    the problem first.
    """
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(exc).split())
    text = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, at = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        where = f" at line {at.line + 1}, column {at.column + 1}" if at is not None else ""
        text += f" ({context}{where})"
    return " ".join(text.split())
