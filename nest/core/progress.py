"""Progress lines for long steps, through :mod:`logging` (Hydra prints INFO to the console).

A step shorter than ``after_s`` says nothing, so fast runs print exactly their summary. A longer
one logs ``<what>: <done>/<total> (<pct> %) after <t> s`` (or ``still running after <t> s`` when
the work has no count, e.g. a planner's search) every ``every_s`` seconds from a daemon thread,
and ``<what>: done in <t> s`` at the end. The lines report wall time only; nothing the step
computes depends on them.

    with Progress("simulating", total=n_tasks) as progress:
        for ...:
            progress.done = tasks_finished  # a plain assignment: cheap in a hot loop
"""

import logging
import threading
import time

log = logging.getLogger(__name__)

AFTER_S = 3.0
"""A step that ends sooner prints nothing."""
EVERY_S = 10.0
"""Seconds between two progress lines of a long step."""


class Progress:
    """Logs the progress of one long step (see the module docstring); a context manager."""

    def __init__(
        self,
        what: str,
        *,
        total: int | None = None,
        after_s: float | None = None,
        every_s: float | None = None,
        logger: logging.Logger = log,
    ):
        self.what = what
        self.total = total
        self.done = 0
        self.after_s = AFTER_S if after_s is None else after_s
        self.every_s = EVERY_S if every_s is None else every_s
        self.logger = logger
        self.lines = 0
        """Progress lines logged so far (the end line not counted)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def __enter__(self) -> "Progress":
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._watch, name=f"progress {self.what}")
        self._thread.daemon = True
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lines and exc[0] is None:
            self.logger.info("%s: done in %.1f s", self.what, self.elapsed_s)

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._started

    def message(self) -> str:
        """The line logged now."""
        if self.total:
            return (
                f"{self.what}: {self.done:,}/{self.total:,} "
                f"({100 * self.done / self.total:.0f} %) after {self.elapsed_s:.0f} s"
            )
        return f"{self.what}: still running after {self.elapsed_s:.0f} s"

    def _watch(self) -> None:
        wait = self.after_s
        while not self._stop.wait(wait):
            self.logger.info("%s", self.message())
            self.lines += 1
            wait = self.every_s
