"""A test-only planner for the sweep tests: crashes (an unexpected exception, not a user error)
on one chosen cluster and size, kills its own process (SIGKILL: no exception, no row) on another,
raises KeyboardInterrupt (what Ctrl-C does: the sweep stops) on a third, and elsewhere returns the
``fixed`` planner's default plan."""

import os
import signal
from dataclasses import dataclass

from baselines.fixed import FixedPlanner
from nest.core.plan import Plan
from nest.core.problem import Problem


@dataclass(kw_only=True)
class FlakyPlanner:
    name: str = "flaky"
    crash_cluster: str = ""
    crash_devices: int = 0
    kill_cluster: str = ""
    kill_devices: int = 0
    interrupt_cluster: str = ""
    interrupt_devices: int = 0

    def solve(self, problem: Problem) -> Plan:
        cluster = problem.cluster
        if cluster.name == self.crash_cluster and cluster.num_devices == self.crash_devices:
            raise RuntimeError(f"forced crash on {cluster.name} with {cluster.num_devices} devices")
        if cluster.name == self.kill_cluster and cluster.num_devices == self.kill_devices:
            os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does
        if cluster.name == self.interrupt_cluster and cluster.num_devices == self.interrupt_devices:
            raise KeyboardInterrupt
        return FixedPlanner(name=self.name).solve(problem)
