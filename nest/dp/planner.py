"""``nest``: the exact structured dynamic program.

Search space (:mod:`nest.dp.space`, its single definition): ``tp, cp, ep, dp, pp`` with product
at most the devices (idle devices allowed), microbatch size, ZeRO stage 0-3, every rank order with
``tp`` innermost, and either 1F1B with a non-uniform contiguous partition of the whole chain
(embedding and head are layers) and a recompute mode per stage, or Megatron's interleaved schedule
with ``v`` virtual stages, its equal-block chunks and a recompute mode per chunk.

Two levels:
1. Configurations, best first by a lower bound (:mod:`nest.dp.bounds`: compute, cheapest
   recompute, the cheapest possible tensor / context / expert / ZeRO-3 / p2p traffic, the exposed
   sync of rank 0 and the optimizer step, each proven a floor there). The bound does not depend
   on the rank order, so it is computed once per (family, ZeRO stage, schedule) and the orders
   are expanded only when visited. Entries are visited in increasing bound and the search stops
   at the first whose bound exceeds the best plan found: none after it can be better.
2. For each configuration, the recurrence of :mod:`nest.dp.recurrence` (1F1B) or
   :mod:`nest.dp.interleaved` finds the optimal partition and recompute modes exactly, pruning
   only by dominance and by bound.

A heuristic first pass (one label per state) over the best-bounded configurations seeds the
incumbent. The returned plan is re-scored by the shared evaluator (``finish``), and that value is
the reported objective. Exactness is tested against ``solver=brute`` on random small problems.
"""

import time

import numpy as np

from nest.dp.bounds import Floors
from nest.dp.interleaved import smallest_peak_interleaved, solve_interleaved
from nest.dp.recurrence import DPStats, solve_config
from nest.dp.space import SpaceOptions, SpacePlanner, families
from nest.dp.stages import StageModel
from nest.errors import UserError
from nest.plan import ParallelConfig, Plan, make_structured_plan
from nest.planner import finish, infeasible_memory
from nest.problem import Problem

BOUND_SLACK = 1e-12
"""Relative slack before a bound prunes: floors are sums of the same floating-point terms as
the evaluator's, in another order, so an exactly tight floor may exceed the value by rounding."""


def plan_from_choices(problem: Problem, config: ParallelConfig, choices) -> Plan:
    """The structured plan of a configuration and its (first, last, mode) stages or chunks."""
    training = problem.training
    return make_structured_plan(
        tp=config.tp,
        cp=config.cp,
        ep=config.ep,
        dp=config.dp,
        pp=config.pp,
        layer_counts=[j - i + 1 for i, j, _ in choices],
        recompute=[mode for _, _, mode in choices],
        microbatch_size=config.microbatch_size,
        num_microbatches=training.global_batch // (config.microbatch_size * config.dp),
        zero_stage=config.zero_stage,
        schedule=config.schedule,
        virtual_stages=config.virtual_stages,
        sequence_parallel=training.sequence_parallel,
        rank_order=config.rank_order,
    )


def smallest_peak_bytes(sm: StageModel, modes) -> float:
    """The least per-device peak memory of any plan of this configuration (a min-max DP over
    the partition and recompute modes, ignoring time): what the device would need."""
    if sm.config.interleaved:
        return smallest_peak_interleaved(sm, modes)
    n, pp = sm.n_layers, sm.config.pp
    best = np.full(n + 1, np.inf)  # best[i]: least peak of ranks so far holding layers < i
    best[0] = 0.0
    for r in range(pp):
        rest = pp - r - 1
        nxt = np.full(n + 1, np.inf)
        for i in np.flatnonzero(np.isfinite(best)):
            peak = np.maximum(best[i], sm.least_memory_from(r, int(i), modes))  # j = i .. n-1
            if rest:
                ends = slice(i + 1, n - rest + 1)  # next state j + 1, leaving a layer per rank
                nxt[ends] = np.minimum(nxt[ends], peak[: n - rest - i])
            else:
                nxt[n] = min(nxt[n], peak[-1])
        best = nxt
    return float(best[n])


def _space_rules(problem: Problem, options: SpaceOptions) -> list[str]:
    """The divisibility rules of :func:`nest.dp.space.families` that apply to this problem."""
    model, spec = problem.model, problem.model.spec
    rules = [*model.shard_rules(), "dp must divide the global batch"]
    if "interleaved" in options.schedules:
        rules.append(
            f"interleaved needs pp*v to divide the {spec.layers} blocks and pp the microbatches"
        )
    return rules


def empty_space_error(problem: Problem, options: SpaceOptions) -> UserError:
    given = {
        k: getattr(options, k)
        for k in ("tp", "cp", "ep", "pp", "virtual_stages")
        if getattr(options, k) is not None
    }
    given["schedules"] = options.schedules
    restriction = ", ".join(f"solver.{k}={list(v)}" for k, v in given.items())
    rules = "; ".join(_space_rules(problem, options))
    return UserError(
        f"the search space is empty for {problem.model.name} on "
        f"{problem.cluster.num_devices} devices with {restriction}: no (tp, cp, ep, dp, pp, "
        f"microbatch, schedule) passes the divisibility rules ({rules}); "
        "widen solver.tp/cp/ep/pp/schedules/virtual_stages or change training.microbatch_sizes"
    )


class NestPlanner(SpacePlanner):
    def __init__(self, *, name: str = "nest", seed_configs: int = 200, **space) -> None:
        super().__init__(name=name, **space)
        self.seed_configs = seed_configs
        """Configurations the heuristic first pass visits to seed the bound (up to ten times
        as many while none of them has a plan that fits)."""

    @staticmethod
    def _ranked(fams, floors: Floors, capacity_bytes: float):
        """(bound, index, family, schedule, zero) of the entries that may fit, in increasing
        bound (ties in space order), and (memory floor, ...) of those that cannot."""
        entries, over = [], []
        for family in fams:
            for schedule in family.schedules:
                for zero in family.zeros:
                    need = floors.memory_floor_bytes(family, zero, schedule)
                    if need > capacity_bytes:
                        over.append((need, len(over), family, schedule, zero))
                        continue
                    bound = floors.config_bound_s(family, zero, schedule)
                    entries.append((bound, len(entries), family, schedule, zero))
        entries.sort(key=lambda e: (e[0], e[1]))
        return entries, over

    def _smallest_need_bytes(self, problem, entries, over, floors, shared) -> float:
        """The least peak memory of any plan of the space, visiting configurations in
        increasing memory floor and stopping when the floor reaches the best found."""
        modes = self.options().recompute_modes
        ranked = sorted(
            (floors.memory_floor_bytes(f, z, s), k, f, s, z)
            for k, (_, _, f, s, z) in enumerate(entries + over)
        )
        best = float("inf")
        for need, _, family, schedule, zero in ranked:
            if need >= best:
                break
            for order in family.orders:
                config = family.config(schedule, zero, order)
                best = min(best, smallest_peak_bytes(StageModel(problem, config, shared), modes))
        return best

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        options = self.options()
        modes = options.recompute_modes
        floors = Floors(problem, modes)
        shared: dict = {("floors", modes): floors}
        fams = list(families(problem, options))
        if not fams:
            raise empty_space_error(problem, options)
        n_configs = sum(len(f) for f in fams)
        enumerated = time.perf_counter()
        entries, over = self._ranked(fams, floors, problem.cluster.device.hbm_bytes)
        bounded = time.perf_counter()
        stats = DPStats()

        def configs():
            for bound, _, family, schedule, zero in entries:
                for order in family.orders:
                    yield bound * (1 - BOUND_SLACK), family.config(schedule, zero, order)

        def solve_one(config, incumbent_s, exact):
            sm = StageModel(problem, config, shared)
            solver = solve_interleaved if config.interleaved else solve_config
            return solver(sm, modes, incumbent_s, stats, exact=exact)

        # Phase 1 (heuristic, one label per state) gives a real plan whose time bounds the
        # optimum from above; phase 2 (exact) then prunes everything that cannot beat it.
        best_s, best = float("inf"), None
        seeded = 0
        for bound, config in configs():
            # past seed_configs only while nothing fits yet (at most ten times as many)
            if bound > best_s or seeded >= self.seed_configs * (1 if best else 10):
                break
            seeded += 1
            found = solve_one(config, best_s, False)
            if found is not None and found[0] < best_s:
                best_s, best = found[0], (config, found[1])
        seed_s = best_s
        seeded_at = time.perf_counter()
        solved = 0
        for bound, config in configs():
            if bound > best_s:
                break
            solved += 1
            found = solve_one(config, best_s, True)
            if found is not None and found[0] < best_s:
                best_s, best = found[0], (config, found[1])
        searched = time.perf_counter()
        search = {
            "configurations": n_configs,
            "configuration_bounds": len(entries),
            "configuration_bounds_over_memory": len(over),
            "configurations_solved": solved,
            "configurations_pruned_by_bound": n_configs - solved,
            "stages_scored": stats.stages_scored,
            "labels_created": stats.labels_created,
            "labels_dominated": stats.labels_dominated,
            "labels_pruned_by_bound": stats.labels_bounded,
            "stages_over_memory": stats.memory_rejected,
            "time_enumerate_s": enumerated - started,
            "time_bounds_s": bounded - enumerated,
            "time_seed_s": seeded_at - bounded,
            "time_dp_s": searched - seeded_at,
            "configurations_seeded": seeded,
            "seed_objective_s": seed_s,
        }
        if best is None:
            need = self._smallest_need_bytes(problem, entries, over, floors, shared)
            raise infeasible_memory(
                problem,
                self.name,
                need,
                exact=True,
                zero_stages=options.zero_stages,
                recompute=options.recompute,
            )
        plan, report = finish(
            self.name,
            problem,
            plan_from_choices(problem, *best),
            started_s=started,
            status="optimal",
            n_evaluations=stats.stages_scored,
            search=search,
        )
        # The DP's stage model must agree with the evaluator (tested on random plans); a plan
        # it scored differently is a bug, never reported as optimal.
        if not report.feasible or abs(best_s - report.iteration_time_s) > 1e-9 * best_s:
            raise AssertionError(
                f"nest: the DP valued its plan at {best_s!r} s (fits) but evaluate() gives "
                f"{report.iteration_time_s!r} s (feasible={report.feasible}); please report"
            )
        return plan
