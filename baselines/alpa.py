"""``alpa``: Alpa's inter-operator stage DP over two-level sub-meshes, scored on the real network.

What is taken from Alpa (Zheng et al., "Alpa: Automating Inter- and Intra-Operator Parallelism
for Distributed Deep Learning", OSDI 2022, §5 "inter-operator parallelism"), each point checked
against the authors' code, ``alpa/pipeline_parallel/stage_construction.py`` (names in quotes):

- The cluster is a 2-D device mesh of ``N`` hosts x ``M`` devices per host and the network has two
  levels, inside a host and across hosts. Here: the real level 0 is the host; every other level is
  collapsed into one "across" level at the slowest pair's bandwidth and latency
  (:func:`baselines.networks.two_level_cluster`). The search sees only that view.
- Stage sub-meshes have shapes ``(1, 2^k)`` with ``2^k <= M`` (part of one host) or ``(n, M)``
  (``n`` whole hosts), ``n = 2..N`` (``get_submesh_choices`` with its ``"all"`` space; its default
  ``"power_of_two"`` keeps ``n`` a power of two), and the stages' sub-meshes cover the cluster
  mesh exactly (the DP ends at ``d = N M`` devices).
- Each stage takes the best intra-op configuration of its sub-mesh from the logical-mesh space
  ``"single_node_model_parallel"``: a model-parallel (tensor) degree ``tp <= M`` dividing the
  sub-mesh, data parallelism over the rest, ``dp`` dividing the batch
  (``get_one_submesh_autosharding_config_choices``). Alpa's intra-op pass also shards weight
  updates and, for MoE layers, experts; here those are ZeRO 1/2 (``zero_stages``) and ``ep``.
  Rematerialisation: each stage takes the cheapest mode in ``recompute`` that fits its memory.
- The inter-op DP (``dp_impl``): ``F(s, i, d)`` is the least sum of stage latencies of ``s``
  stages covering layers ``i..L-1`` on ``d`` devices, each stage latency at most ``t_max`` and
  each stage within memory for the stages after it (``max_n_succ_stages``: a stage ``s``-th from
  the end holds ``min(s, B)`` microbatches under 1F1B); the pipeline objective is
  ``sum_i t_i + (B - 1) max_i t_i``. The outer loop (``dp``) enumerates ``t_max`` over the
  distinct stage latencies in increasing order, skips values within ``t_max_gap_s`` of the last
  one tried (its ``gap``) and stops once ``B t_max`` reaches the best objective.
  Two further stops, both proven safe: start at the smallest ``t_max`` for which any partition
  exists (binary search; feasibility is monotone in ``t_max``), and stop once
  ``sum_LB + (B - 1) t_max`` reaches the best, where ``sum_LB`` is the least sum with no ``t_max``
  (every plan first found at a larger ``t_max`` has its largest stage equal to it and a sum at
  least ``sum_LB``). Configurations are visited best lower bound first and skipped when
  ``sum_LB + (B - 1) sum_LB / S`` (the largest stage is at least the mean) reaches the best.

The restriction (the lead's decision): the shared plan contract gives every stage the same
``(dp, cp, tp)`` (:class:`nest.core.plan.Plan` enforces it), so this search only considers plans
whose
stages all use **the same sub-mesh shape and the same intra-op configuration**; Alpa proper may give
each stage its own. The stage DP is written over a list of stage choices and device counts
(:func:`baselines.alpa_stages.inter_op_dp`) and is called with one choice at a time; if the
contract is ever extended to per-stage meshes, passing every choice to one DP call is the change.

Placement: stage ``r`` runs on the contiguous devices ``[r S_m, (r+1) S_m)`` (``S_m`` the
sub-mesh size), ``tp`` innermost (inside a host), then the data ranks: Megatron's rank order
``tp, cp, dp, pp``. The schedule is 1F1B. The returned plan is scored by the shared evaluator on
the real hierarchy; ``report.json["search"]`` holds Alpa's own objective on the two-level view.
"""

import time
from collections.abc import Sequence

import numpy as np

from baselines.alpa_stages import INF, MEGATRON_ORDER, StageChoice, StageCosts, inter_op_dp
from baselines.networks import two_level_cluster, with_cluster
from nest.core.axes import Recompute, divisors, parse_recompute_modes
from nest.core.errors import UserError
from nest.core.layers import Shard
from nest.core.plan import ParallelConfig, Plan, make_structured_plan, uniform_partition
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.planner import finish, infeasible_memory


def submesh_shapes(hosts: int, per_host: int) -> list[tuple[int, int]]:
    """Alpa's sub-mesh shapes: ``(1, 2^k)`` inside one host, ``(n, M)`` for ``n = 2..N``."""
    shapes, k = [], 1
    while k <= per_host:
        if per_host % k == 0:
            shapes.append((1, k))
        k *= 2
    if shapes[-1] != (1, per_host):
        shapes.append((1, per_host))
    return shapes + [(n, per_host) for n in range(2, hosts + 1)]


class AlpaPlanner:
    def __init__(
        self,
        *,
        name: str = "alpa",
        zero_stages: Sequence[int] = (0, 1, 2),
        recompute: Sequence[str] = ("none", "full"),
        t_max_gap_s: float = 1e-6,
    ) -> None:
        self.name = name
        self.zero_stages = zero_stages
        """Weight-update sharding the intra-op pass may choose (ZeRO stages, 0-2)."""
        self.recompute = recompute
        """Rematerialisation modes a stage may take (the cheapest that fits)."""
        self.t_max_gap_s = t_max_gap_s
        """Skip ``t_max`` values closer than this to the last one tried (Alpa's ``gap``)."""

    def _check(self) -> tuple[Recompute, ...]:
        if not self.zero_stages or any(z not in (0, 1, 2) for z in self.zero_stages):
            raise UserError(
                f"solver.zero_stages={list(self.zero_stages)}; alpa's weight-update sharding "
                "covers ZeRO 0, 1 and 2"
            )
        if not isinstance(self.t_max_gap_s, int | float) or self.t_max_gap_s < 0:
            raise UserError(f"solver.t_max_gap_s={self.t_max_gap_s!r} must be >= 0")
        modes = parse_recompute_modes(self.recompute)
        if not modes:
            raise UserError("solver.recompute is empty; give at least one mode, e.g. [none]")
        return modes

    def configurations(self, problem: Problem):
        """(sub-mesh shape, intra-op configuration with its pipeline stages as ``pp``) with
        uniform full cover."""
        cluster, model, training = problem.cluster, problem.model, problem.training
        per_host = cluster.levels[0].fanout
        n = cluster.num_devices
        for shape in submesh_shapes(n // per_host, per_host):
            size = shape[0] * shape[1]
            stages = n // size
            if n % size or stages > problem.num_layers:
                continue
            for tp in divisors(min(per_host, size)):
                if per_host % tp or size % tp:
                    continue
                dp = size // tp
                eps = (
                    [e for e in divisors(model.spec.num_experts) if dp % e == 0]
                    if model.spec.is_moe
                    else [1]
                )
                for ep in eps:
                    shard = Shard(tp=tp, ep=ep, sp=training.sequence_parallel and tp > 1)
                    if model.shard_problem(shard) is not None:
                        continue
                    for mbs in training.microbatch_sizes:
                        if training.global_batch % (mbs * dp):
                            continue
                        for zero in sorted({z if dp > 1 else 0 for z in self.zero_stages}):
                            yield (
                                shape,
                                ParallelConfig(
                                    tp=tp,
                                    dp=dp,
                                    ep=ep,
                                    pp=stages,
                                    zero_stage=zero,
                                    microbatch_size=mbs,
                                    rank_order=MEGATRON_ORDER,
                                ),
                            )

    def _plan(self, problem: Problem, config: ParallelConfig, result, modes) -> Plan:
        training = problem.training
        return make_structured_plan(
            config,
            layer_counts=[k - i + 1 for i, k, _, _ in result.stages],
            recompute=[modes[m] for _, _, _, m in result.stages],
            num_microbatches=config.num_microbatches(training.global_batch),
            sequence_parallel=training.sequence_parallel,
        )

    def _smallest_tried_peak(self, problem: Problem, configs, modes) -> float | None:
        """Peak memory of the uniform, most-saving plan of each configuration (for the error)."""
        best = None
        for _, config in configs:
            counts = uniform_partition(problem.num_layers, config.pp)
            fake = type("R", (), {"stages": tuple((0, c - 1, 0, len(modes) - 1) for c in counts)})
            plan = self._plan(problem, config, fake, modes)
            peak = evaluate(problem, plan).peak_memory_bytes
            best = peak if best is None else min(best, peak)
        return best

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        modes = self._check()
        view = with_cluster(problem, two_level_cluster(problem.cluster))
        n_layers, n_dev = problem.num_layers, problem.cluster.num_devices
        configs = list(self.configurations(problem))
        if not configs:
            raise UserError(
                f"alpa: no sub-mesh and intra-op configuration for {problem.model.name} on "
                f"{n_dev} devices (the stages must cover the cluster, at most one layer each, and "
                "dp must divide the global batch); add devices or change training.global_batch"
            )
        # visit configurations by a lower bound computed from the unconstrained least sum
        ranked, stats = [], {"t_max_tried": 0, "configurations": len(configs)}
        for k, (shape, config) in enumerate(configs):
            costs = StageCosts(view, config, modes)
            size = shape[0] * shape[1]
            choice = StageChoice(size=size, cost=lambda s, d, c=costs: c.stage(s))
            tables: dict = {}
            free = inter_op_dp(n_layers, n_dev, [choice], tables, INF)
            if free is None:
                continue
            bound = free.sum_s + (costs.m - 1) * free.sum_s / config.pp
            ranked.append((bound, k, shape, config, costs.m, choice, tables, free))
        if not ranked:
            raise infeasible_memory(
                problem, self.name, self._smallest_tried_peak(problem, configs, modes)
            )
        ranked.sort(key=lambda x: (x[0], x[1]))
        best = (INF, None)
        solved = 0
        for bound, _, shape, config, m, choice, tables, free in ranked:
            if bound >= best[0]:
                break
            solved += 1
            found = self._t_max_loop(n_layers, n_dev, choice, tables, free, m, best[0], stats)
            if found is not None and found[0] < best[0]:
                best = (found[0], (shape, config, found[1]))
        objective, (shape, config, result) = best
        plan = self._plan(problem, config, result, modes)
        search = {
            **stats,
            "configurations_solved": solved,
            "submesh": list(shape),
            "intra_op": {
                "tp": config.tp,
                "dp": config.dp,
                "ep": config.ep,
                "zero": config.zero_stage,
            },
            "alpa_objective_s": objective,
            "network_view": view.cluster.describe(),
        }
        plan, _ = finish(
            self.name, problem, plan, started_s=started, n_evaluations=solved, search=search
        )
        return plan

    def _t_max_loop(self, n_layers, n_dev, choice, tables, free, m, best_s, stats):
        """Alpa's outer loop over ``t_max`` for one stage choice (module docstring)."""
        values = np.unique(
            np.concatenate([t[np.isfinite(t)] for t, _ in tables.values()])
        )  # every table of this choice was built by the unconstrained run

        def run(t_max):
            stats["t_max_tried"] += 1
            return inter_op_dp(n_layers, n_dev, [choice], tables, t_max)

        lo, hi = 0, len(values) - 1  # the largest value is feasible (the free run used it)
        while lo < hi:
            mid = (lo + hi) // 2
            if run(values[mid]) is None:
                lo = mid + 1
            else:
                hi = mid
        found, last = None, -INF
        for t_max in values[lo:]:
            if m * t_max >= best_s or free.sum_s + (m - 1) * t_max >= best_s:
                break
            if t_max - last < self.t_max_gap_s:
                continue
            last = t_max
            result = run(t_max)
            value = result.sum_s + (m - 1) * result.max_s
            if value < best_s:
                best_s, found = value, (value, result)
        return found
