"""``fixed``: a user-given configuration, scored by the shared evaluator.

The paper's "Manual", "MCMC" and "Phaze" tables are such configurations (data, not code). The
planner only turns degrees into a placed plan (:func:`nest.core.build.build_plan`); the evaluator
decides whether it fits.
"""

import time
from collections.abc import Sequence

from nest.core.build import PlanSettings, build_plan
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.planner import finish


class FixedPlanner:
    """A plan from given degrees; ``dp`` defaults to what the remaining devices allow."""

    scores_given_plan = True
    """A plan that does not fit is scored and flagged, not refused (nest.planner.Planner)."""

    def __init__(
        self,
        *,
        name: str = "fixed",
        tp: int = 1,
        pp: int = 1,
        dp: int | None = None,
        cp: int = 1,
        ep: int = 1,
        etp: int | None = None,
        microbatch_size: int | None = None,
        recompute: str | Sequence[str] = "none",
        zero_stage: int = 0,
        zero_shard: int | None = None,
        schedule: str = "1f1b",
        virtual_stages: int = 1,
        layer_partition: Sequence[int] | None = None,
        rank_order: str | Sequence[str] = "tp,cp,dp,pp",
        sequence_parallel: bool | None = None,
        optimizer_offload: bool = False,
        activation_offload: bool = False,
        activation_offload_blocks: int | None = None,
    ) -> None:
        self.name = name
        self.tp, self.pp, self.dp, self.cp, self.ep = tp, pp, dp, cp, ep
        self.etp = etp
        self.microbatch_size = microbatch_size
        self.recompute = recompute
        self.zero_stage = zero_stage
        self.zero_shard = zero_shard
        self.schedule = schedule
        self.virtual_stages = virtual_stages
        self.layer_partition = layer_partition
        self.rank_order = rank_order
        self.sequence_parallel = sequence_parallel
        self.optimizer_offload = optimizer_offload
        self.activation_offload = activation_offload
        self.activation_offload_blocks = activation_offload_blocks

    def build(self, problem: Problem) -> Plan:
        """The plan these hyper-parameters describe (unscored):
        :func:`nest.core.build.build_plan`."""
        return build_plan(problem, self.settings())

    def settings(self) -> PlanSettings:
        keys = PlanSettings.__dataclass_fields__
        return PlanSettings(**{k: getattr(self, k) for k in keys})

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        plan = self.build(problem)
        plan, _ = finish(self.name, problem, plan, started_s=started, n_evaluations=1)
        return plan
