"""``cpsat`` and ``milp``: exact planners on the shared cost model, for small instances.

``mode=restricted`` solves exactly the ``nest`` planner's space on the cluster as given
(:mod:`nest.dp.space`: the same configurations, rank orders, partitions, recompute modes and
interleaved chunks), so its optimum must equal the DP's with ``segments=False``; on a cluster whose
scale-up domain is not a power of two ``solver=nest`` also searches the segment view
(:mod:`nest.core.segment`), which restricted mode does not, so nest may then be faster;
``mode=general`` lets every configuration take any placement of its ranks on the cluster
(:mod:`nest.exact.placements`), so its optimum is the best plan of the plan contract (the plan
contract of :mod:`nest.core.plan`: uniform ``dp x cp x tp`` stages) over all placements, and
``general <= restricted`` shows what the structured space leaves on the table.

Both build the same linear model (:mod:`nest.exact.model`) from the same tables
(:mod:`nest.exact.tables`) and differ in the solver: OR-Tools CP-SAT on integer ticks, or PuLP
with HiGHS on floats. Before the model is built, the ``nest`` DP's plan gives an upper bound
``U`` (its value under the shared evaluator: a feasible plan of both modes) that prunes choices
and groups no better plan can use (``prune: true``; the bound is proven in
:mod:`nest.exact.tables`); with ``hint: true`` the same plan is handed to the solver as a warm
start. With both off the DP is not run at all and the model is the whole space. The returned plan is
re-scored by :func:`nest.cost.evaluate` like every planner's, and the report's ``search`` carries
the solver's status, proven bound, gap, time and model size.
"""

import time

import numpy as np

from nest.core.axes import Schedule
from nest.core.errors import Infeasible, SolverTimeout, UserError
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.dp.planner import NestPlanner
from nest.dp.space import SpacePlanner
from nest.exact.model import build, solve_cpsat, solve_milp
from nest.exact.placements import signature
from nest.exact.tables import Group, build_groups
from nest.planner import finish, infeasible_memory

BACKENDS = {"cpsat": solve_cpsat, "milp": solve_milp}
MODES = ("restricted", "general")


def _find_hint(problem: Problem, groups: list[Group], plan: Plan) -> tuple[int, list[int]] | None:
    """The group and choices of ``plan`` (a plan of the restricted space) in the model."""
    grid = np.asarray([plan.stages[r].devices for r in range(plan.pp)], dtype=np.int64)
    wanted = plan.config.unordered()
    key, cache = None, {}
    for g, group in enumerate(groups):
        c = group.config
        if c.unordered() != wanted:
            continue
        if group.general:
            key = key or signature(problem.cluster, grid, plan.ep, cache, plan.etp)
            if signature(problem.cluster, group.grid, c.ep, cache, c.etp) != key:
                continue
        elif not np.array_equal(group.grid, grid):
            continue
        picks = []
        for r, choices in enumerate(group.ranks):
            ks = plan.pp_rank_chunks[r]
            want_modes = tuple(plan.stages[k].recompute for k in ks)
            want_span = (plan.stages[r].first_layer, plan.stages[r].last_layer)
            found = [
                k
                for k, ch in enumerate(choices)
                if ch.modes == want_modes and (ch.span is None or ch.span == want_span)
            ]
            if not found:
                break
            picks.append(found[0])
        else:
            return g, picks
    return None


ZERO_BUBBLE = frozenset(s.value for s in Schedule if s.splits_backward)
"""Schedules the exact models do not express (their pipeline term has no W-pass tail)."""


class ExactPlanner(SpacePlanner):
    """An exact planner (module docstring); ``backend`` is ``cpsat`` or ``milp``."""

    def __init__(
        self,
        *,
        name: str,
        backend: str,
        mode: str = "restricted",
        time_limit_s: float = 60.0,
        workers: int = 1,
        seed: int = 0,
        hint: bool = True,
        prune: bool = True,
        max_placements: int = 100_000,
        deterministic_time: float | None = None,
        **space,
    ) -> None:
        super().__init__(name=name, **space)
        schedules = [self.schedules] if isinstance(self.schedules, str) else self.schedules
        for schedule in schedules or ():
            if str(schedule) in ZERO_BUBBLE:
                raise UserError(
                    f"solver.schedules lists {schedule}, which solver={name} does not model "
                    "(no W-pass term); drop it or use solver=nest or solver=brute"
                )
        if backend not in BACKENDS:
            raise UserError(f"solver.backend={backend!r}; use one of {sorted(BACKENDS)}")
        if mode not in MODES:
            raise UserError(f"solver.mode={mode!r}; use restricted or general")
        for key, value in (
            ("time_limit_s", time_limit_s),
            ("deterministic_time", deterministic_time),
        ):
            if value is None and key == "deterministic_time":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise UserError(f"solver.{key}={value!r} must be a positive number of seconds")
        for key, value in (("workers", workers), ("max_placements", max_placements)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"solver.{key}={value!r} must be a positive integer")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise UserError(f"solver.seed={seed!r} must be an integer")
        for key, value in (("hint", hint), ("prune", prune)):
            if not isinstance(value, bool):
                raise UserError(f"solver.{key}={value!r} must be true or false")
        self.backend, self.mode = backend, mode
        self.time_limit_s, self.workers, self.seed = time_limit_s, workers, seed
        self.hint, self.prune, self.max_placements = hint, prune, max_placements
        self.deterministic_time = deterministic_time

    def _incumbent(self, problem: Problem) -> Plan | None:
        """The DP's plan over the restricted space (an upper bound for both modes)."""
        try:
            return NestPlanner(segments=False, **self.space_kwargs()).solve(problem)
        except Infeasible:
            return None

    def _unsolved(self, problem, status: str, incumbent, started: float, stats, search) -> Plan:
        """The solver proved no plan fits, or stopped at its time limit without one: an error,
        or the DP's plan (the hint) marked ``timeout``."""
        if status == "infeasible":
            if incumbent is not None:  # the solver contradicts a plan that fits (a solver bug)
                raise AssertionError(f"{self.name}: infeasible, but the DP's plan fits")
            raise infeasible_memory(problem, self.name, None)
        if incumbent is None:
            raise SolverTimeout(
                f"{self.name} found no plan within solver.time_limit_s={self.time_limit_s}; "
                "raise it or use a smaller problem"
            )
        # the limit passed before the solver returned a plan: the DP's, unproven here
        plan, _ = finish(
            self.name,
            problem,
            incumbent,
            started_s=started,
            status="timeout",
            n_evaluations=stats["choices"],
            search={**search, "gap": None, "returned": "the DP's plan (the hint)"},
        )
        return plan

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        options = self.options()
        if options.zero_shards:
            raise UserError(
                f"solver={self.name} does not cover hybrid sharding (solver.zero_shards="
                f"{list(options.zero_shards)}); leave it null or use solver=nest or solver=brute"
            )
        if options.block_recompute:
            raise UserError(
                f"solver={self.name} does not cover every-n-blocks recompute (solver.recompute="
                f"{list(options.recompute)}); drop 'block' or use solver=nest or solver=brute"
            )
        incumbent = self._incumbent(problem) if (self.hint or self.prune) else None
        upper_s = None if incumbent is None or not self.prune else incumbent.objective_s
        dp_time_s = time.perf_counter() - started
        groups, stats = build_groups(
            problem,
            options,
            general=self.mode == "general",
            upper_s=upper_s,
            max_placements=self.max_placements,
        )
        tables_time_s = time.perf_counter() - started - dp_time_s
        if not groups:
            # without an incumbent nothing was pruned by the bound: no choice fits anywhere
            raise infeasible_memory(problem, self.name, None)
        lm = build(groups, problem.num_layers)
        hint = None
        if self.hint and incumbent is not None:
            hint = _find_hint(problem, groups, incumbent)
        solution = BACKENDS[self.backend](
            lm,
            groups,
            upper_s=upper_s,
            time_limit_s=self.time_limit_s,
            workers=self.workers,
            seed=self.seed,
            hint=hint,
            deterministic_time=self.deterministic_time,
        )
        search = {
            "mode": self.mode,
            "backend": self.backend,
            "solver_status": solution.status,
            **stats,
            **solution.info,
            "hint": hint is not None,
            "upper_bound_s": upper_s,
            "time_dp_s": dp_time_s,
            "time_tables_s": tables_time_s,
            "time_solver_s": solution.solve_time_s,
        }
        if solution.status in ("infeasible", "timeout"):
            return self._unsolved(problem, solution.status, incumbent, started, stats, search)
        group = groups[solution.group]
        picks = [group.ranks[r][k] for r, k in enumerate(solution.picks)]
        plan = group.plan(problem, picks)
        value_s = evaluate(problem, plan).iteration_time_s
        # a solver's bound can sit above the plan's value by its tolerance (HiGHS: ~1e-7)
        bound_s = None if solution.bound_s is None else min(solution.bound_s, value_s)
        plan, report = finish(
            self.name,
            problem,
            plan,
            started_s=started,
            status=solution.status,
            bound_s=bound_s,
            n_evaluations=stats["choices"],
            search=search,
        )
        if not report.feasible:
            raise AssertionError(f"{self.name}: the solver's plan does not fit: {report.violation}")
        gap = None
        if bound_s is not None:
            gap = (report.iteration_time_s - bound_s) / report.iteration_time_s
        return plan.with_record(search={**plan.search, "gap": gap})
