"""``phaze``: the NEST dynamic program on a flat network, then scored on the real hierarchy.

Phaze (Wang et al., "Integrated Hardware Architecture and Device Placement Search", ICML 2024) is
NEST's network-agnostic predecessor: the same kind of structured search over tensor, pipeline and
data parallelism, but every pair of devices talks at one bandwidth (docs/nest_paper.md §1: NEST's
"network awareness" is exactly what Phaze lacks). This baseline reproduces that view with the
project's own exact DP, so the only difference from ``nest`` is the network the search sees:

1. Build a flat copy of the cluster: the same devices (same count, ids, HBM, FLOP/s), one level,
   every pair at one bandwidth and latency, by default the slowest pair's (the top level's
   bottleneck bandwidth and its latency: :func:`baselines.networks.slowest_pair`); set
   ``flat_bw_gbps`` / ``flat_latency_us`` to choose another.
2. Run :class:`nest.dp.planner.NestPlanner` on the flat problem (same space restrictions as
   ``nest``: ``tp, cp, ep, pp, zero_stages, recompute``).
3. Score the returned plan on the real problem with :func:`nest.planner.finish`. Its device ids
   are valid on both, since the flat copy keeps them.

Rank order. On a flat network every placement of a configuration costs the same (every pair,
hence every group, splits over the one level alike), so all rank orders tie and searching them is
wasted work. Phaze outputs degrees and a partition, not a placement; deployed with Megatron-LM
those degrees get Megatron's default rank order ``tp, cp, dp, pp``, so that is the one order the
flat search is given (``rank_order``). This is faithful to a network-agnostic planner: it has no
reason to prefer an order, and the order it ends up with is the framework default, not a choice.
(A test checks that the flat optimum is the same with every order.)

The reported status is ``feasible``, never ``optimal``: the plan is optimal for the flat network,
and ``report.json["search"]`` holds that flat objective next to the real one.
"""

import time
from collections.abc import Sequence

from baselines.networks import flat_cluster, with_cluster
from nest.core.errors import Infeasible
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.units import GB, US
from nest.dp.planner import NestPlanner
from nest.dp.space import SpacePlanner
from nest.planner import finish


class PhazePlanner(SpacePlanner):
    def __init__(
        self,
        *,
        name: str = "phaze",
        flat_bw_gbps: float | None = None,
        flat_latency_us: float | None = None,
        rank_order: str = "tp,cp,dp,pp",
        tp: Sequence[int] | None = None,
        cp: Sequence[int] | None = None,
        ep: Sequence[int] | None = None,
        pp: Sequence[int] | None = None,
        zero_stages: Sequence[int] = (0, 1, 2, 3),
        recompute: Sequence[str] = ("none", "selective", "full"),
    ) -> None:
        super().__init__(
            name=name,
            tp=tp,
            cp=cp,
            ep=ep,
            pp=pp,
            zero_stages=zero_stages,
            recompute=recompute,
            rank_orders=[rank_order],
        )
        self.flat_bw_gbps = flat_bw_gbps
        """Bandwidth of every pair in the search, decimal GB/s; null: the slowest pair's."""
        self.flat_latency_us = flat_latency_us
        """Latency of every pair in the search, microseconds; null: the slowest pair's."""
        self.rank_order = rank_order
        """The order the degrees are placed with (all tie on a flat network)."""

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        flat = flat_cluster(
            problem.cluster, bw_gbps=self.flat_bw_gbps, latency_us=self.flat_latency_us
        )
        inner = NestPlanner(
            name=self.name,
            tp=self.tp,
            cp=self.cp,
            ep=self.ep,
            pp=self.pp,
            zero_stages=self.zero_stages,
            recompute=self.recompute,
            rank_orders=self.rank_orders,
        )
        try:
            found = inner.solve(with_cluster(problem, flat))
        except Infeasible as exc:
            # memory does not depend on the network: nothing in the space fits on the real one
            raise Infeasible(
                exc.reason.replace(flat.name, problem.cluster.name),
                min_memory_bytes=exc.min_memory_bytes,
            ) from None
        level = flat.levels[0]
        search = {
            "flat_bw_gbps": level.bw_bytes_per_s / GB,
            "flat_latency_us": level.latency_s / US,
            "flat_objective_s": found.objective_s,
            # the flat search's record; wall times keep their "time_" prefix
            **{
                (f"time_flat_{k[5:]}" if k.startswith("time_") else f"flat_{k}"): v
                for k, v in found.search.items()
            },
        }
        plan, _ = finish(
            self.name,
            problem,
            found,
            started_s=started,
            n_evaluations=found.n_evaluations,
            search=search,
        )
        return plan
