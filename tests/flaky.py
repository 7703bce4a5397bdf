"""A test-only planner for the sweep tests: crashes (an unexpected exception, not a user error)
on one chosen cluster and size, and elsewhere returns the ``fixed`` planner's default plan."""

from dataclasses import dataclass

from baselines.fixed import FixedPlanner
from nest.plan import Plan
from nest.problem import Problem


@dataclass(kw_only=True)
class FlakyPlanner:
    name: str = "flaky"
    crash_cluster: str = ""
    crash_devices: int = 0

    def solve(self, problem: Problem) -> Plan:
        cluster = problem.cluster
        if cluster.name == self.crash_cluster and cluster.num_devices == self.crash_devices:
            raise RuntimeError(f"forced crash on {cluster.name} with {cluster.num_devices} devices")
        return FixedPlanner(name=self.name).solve(problem)
