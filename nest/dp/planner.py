"""``nest``: the exact structured dynamic program.

Search space (:mod:`nest.dp.space`): ``tp, cp, ep, dp, pp`` with product at most the devices
(idle devices allowed), microbatch size, ZeRO stage 0-3, every rank order with ``tp`` innermost,
a non-uniform contiguous partition of the whole chain (embedding and head are layers), and a
recompute mode per stage; 1F1B schedule (see the space module for why GPipe is dominated and
interleaving is not searched).

Two levels:
1. Configurations, best first by a lower bound. For a configuration with ``m`` microbatches and
   ``pp`` stages, every plan takes at least ``W (1 + (m-1)/pp)`` where ``W`` is the chain's
   cheapest compute per microbatch (``sum t_r >= W`` and ``max t_r >= W/pp``). Configurations are
   visited in increasing bound and the search stops at the first whose bound exceeds the best
   plan found: none after it can be better. (Proof: the bound is below the true optimum of its
   configuration.)
2. For each configuration, the recurrence of :mod:`nest.dp.recurrence` finds the optimal
   partition and recompute modes exactly, pruning only by dominance and by bound.

The returned plan is re-scored by the shared evaluator (``finish``), and that value is the
reported objective. Exactness is tested against ``solver=brute`` on random small problems.
"""

import time

from nest.axes import Schedule
from nest.dp.recurrence import DPStats, solve_config
from nest.dp.space import SearchConfig, SpacePlanner, configurations
from nest.dp.stages import StageModel, layer_floor_s, tp_group_splits
from nest.errors import UserError
from nest.layers import Shard
from nest.plan import Plan, make_structured_plan
from nest.planner import finish, infeasible_memory
from nest.problem import Problem


def plan_from_choices(problem: Problem, config: SearchConfig, choices) -> Plan:
    """The structured plan of a configuration and its (first, last, mode) stages."""
    training = problem.training
    return make_structured_plan(
        tp=config.tp,
        cp=config.cp,
        ep=config.ep,
        dp=config.dp,
        pp=config.pp,
        layer_counts=[j - i + 1 for i, j, _ in choices],
        recompute=[mode for _, _, mode in choices],
        microbatch_size=config.mbs,
        num_microbatches=training.global_batch // (config.mbs * config.dp),
        zero_stage=config.zero,
        schedule=Schedule.ONE_F_ONE_B,
        virtual_stages=1,
        sequence_parallel=training.sequence_parallel,
        rank_order=config.order,
    )


def compute_lower_bound_s(problem: Problem, config: SearchConfig, modes, cache: dict) -> float:
    """``W (1 + (m - 1) / pp)``: no plan of this configuration is faster (module docstring).

    ``W`` sums :func:`~nest.dp.stages.layer_floor_s` (compute, cheapest recompute, tensor
    collectives on the fastest tensor group) over the chain."""
    training, model = problem.training, problem.model
    shard = Shard(
        tp=config.tp,
        cp=config.cp,
        ep=config.ep,
        sp=training.sequence_parallel and config.tp > 1,
        mbs=config.mbs,
    )
    key = (shard, modes)
    work = cache.get(key)
    if work is None:
        cluster = problem.cluster
        splits = tp_group_splits(cluster, config.tp)
        work = sum(
            layer_floor_s(
                model.layer_cost(ref, shard, cluster.device),
                ref.kind.value == "block",
                modes,
                splits,
                cluster,
            )
            for ref in model.chain
        )
        cache[key] = work
    m = training.global_batch // (config.mbs * config.dp)
    return work * (1 + (m - 1) / config.pp)


def smallest_peak_bytes(sm: StageModel, modes) -> float:
    """The least per-device peak memory of any plan of this configuration (a min-max DP over
    the partition and recompute modes, ignoring time): what the device would need."""
    n, pp = sm.n_layers, sm.config.pp
    best = {0: 0.0}
    for r in range(pp):
        rest = pp - r - 1
        nxt: dict[int, float] = {}
        for i, peak in best.items():
            for j in range(i, n - rest) if rest else (n - 1,):
                mem = min(sm.memory_bytes(r, i, j, md) for md in sm.modes_for(i, j, modes))
                value = max(peak, mem)
                if value < nxt.get(j + 1, float("inf")):
                    nxt[j + 1] = value
        best = nxt
    return best.get(n, float("inf"))


class NestPlanner(SpacePlanner):
    def __init__(self, *, name: str = "nest", seed_configs: int = 200, **space) -> None:
        super().__init__(name=name, **space)
        self.seed_configs = seed_configs
        """Configurations the heuristic first pass visits to seed the bound."""

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        options = self.options()
        modes = options.recompute_modes
        configs = list(configurations(problem, options))
        if not configs:
            given = {
                k: v
                for k, v in (("tp", self.tp), ("cp", self.cp), ("ep", self.ep), ("pp", self.pp))
                if v is not None
            }
            restriction = ", ".join(f"solver.{k}={list(v)}" for k, v in given.items())
            raise UserError(
                f"the search space is empty for {problem.model.name} on "
                f"{problem.cluster.num_devices} devices"
                + (f" with {restriction}" if restriction else "")
                + ": no (tp, cp, ep, dp, pp, microbatch) passes the divisibility rules (tp must "
                f"divide heads={problem.model.spec.heads} and the FFN size, dp the global batch); "
                "widen solver.tp/cp/ep/pp or change training.microbatch_sizes"
            )
        enumerated = time.perf_counter()
        cache: dict = {}
        ranked = sorted(
            (
                (compute_lower_bound_s(problem, c, modes, cache), k, c)
                for k, c in enumerate(configs)
            ),
            key=lambda x: (x[0], x[1]),
        )
        bounded = time.perf_counter()
        best_s, best = float("inf"), None
        stats = DPStats()
        shared: dict = {}
        models: dict = {}

        def model_of(config):
            if config not in models:
                models[config] = StageModel(problem, config, shared)
            return models[config]

        # Phase 1 (heuristic, one label per state) gives a real plan whose time bounds the
        # optimum from above; phase 2 (exact) then prunes everything that cannot beat it.
        seeded = 0
        for bound, _, config in ranked[: self.seed_configs]:
            if bound > best_s:
                break
            seeded += 1
            found = solve_config(model_of(config), modes, best_s, stats, exact=False)
            if found is not None and found[0] < best_s:
                best_s, best = found[0], (config, found[1])
        seed_s = best_s
        models.clear()
        seeded_at = time.perf_counter()
        solved = 0
        for bound, _, config in ranked:
            if bound > best_s:
                break
            solved += 1
            found = solve_config(model_of(config), modes, best_s, stats)
            models.clear()
            if found is not None and found[0] < best_s:
                best_s, best = found[0], (config, found[1])
        searched = time.perf_counter()
        search = {
            "configurations": len(configs),
            "configurations_solved": solved,
            "configurations_pruned_by_bound": len(configs) - solved,
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
            need = min(smallest_peak_bytes(StageModel(problem, c, shared), modes) for c in configs)
            raise infeasible_memory(problem, self.name, need, exact=True)
        plan = plan_from_choices(problem, *best)
        plan, _ = finish(
            self.name,
            problem,
            plan,
            started_s=started,
            status="optimal",
            n_evaluations=stats.stages_scored,
            search=search,
        )
        return plan
