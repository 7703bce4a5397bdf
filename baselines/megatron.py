"""``megatron``: the published rules of thumb for Megatron-LM, scored by the shared evaluator.

Rules and their sources:
1. Tensor parallelism inside a node, as wide as the model allows: "use tensor model parallelism up
   to degree g (GPUs per server)" — Narayanan et al., SC21, §3.3 Takeaway #1. ``tp`` must divide
   the node's fan-out, the heads, the KV heads and the FFN size (Megatron-LM's checks).
2. Pipeline parallelism across nodes, only as much as needed to fit: "then pipeline parallelism to
   scale up to larger models across servers" (same takeaway); the smallest ``pp`` that divides the
   layers (Megatron's uniform split: ``num_layers % pp == 0``) and fits memory.
3. Data parallelism for the rest of the devices (SC21 §3.3 Takeaway #2): the largest ``dp`` that
   fits the remaining devices and divides the global batch; any devices left over stay idle.
4. Megatron's rank order ``tp, cp, (ep,) dp, pp`` (innermost first); embedding with the first stage,
   head with the last.
5. Activation recomputation only if needed: none, then selective (Korthikanti et al. 2022 recommend
   it over full), then full.
6. The largest microbatch that fits (SC21 §3.4: larger microbatches raise arithmetic intensity,
   at a bubble cost the rules ignore).
7. MoE: the largest expert degree dividing both the experts and ``dp`` (Megatron-Core carves expert
   ranks out of data-parallel ranks).
Sequence parallelism whenever ``tp > 1`` and the distributed optimizer (ZeRO-1) by default,
as Megatron-LM's large-model recipes use.

Order of preference among the candidates: the smallest ``pp`` first, then the lightest recompute,
then the largest microbatch (rules 2, 5, 6: pipeline stages cost a bubble, recomputation a third
more compute, a smaller microbatch only arithmetic intensity).

``tensor=as_needed`` reads rule 1 together with SC21 §3.3 Takeaway #2 ("a total model-parallel
size M = t * p should be used so that the model's parameters and intermediate metadata fit in GPU
memory"): the smallest ``t * p`` that fits, with ``t`` grown inside the node before any ``p``.
The default ``fill_node`` always takes the widest ``t`` the node and the heads allow (rule 1 as
stated), which costs TP traffic on models that would fit with less.
"""

import time
from math import gcd

from nest.core.axes import Recompute, Schedule, divisors, parse_rank_order
from nest.core.errors import Infeasible, UserError
from nest.core.layers import Shard
from nest.core.plan import ParallelConfig, Plan, make_structured_plan, uniform_partition
from nest.core.problem import Problem
from nest.planner import finish, infeasible_memory, memory_fix

RECOMPUTE_ORDER = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


class MegatronPlanner:
    def __init__(
        self,
        *,
        name: str = "megatron",
        zero_stage: int = 1,
        max_tp: int | None = None,
        rank_order: str = "tp,cp,dp,pp",
        tensor: str = "fill_node",
    ) -> None:
        self.name = name
        self.tensor = tensor
        """``fill_node`` (widest TP the node allows) or ``as_needed`` (smallest t*p that fits)."""
        self.zero_stage = zero_stage
        self.max_tp = max_tp
        self.rank_order = rank_order

    def tensor_degrees(self, problem: Problem) -> list[int]:
        """TP degrees inside a node that the heads, KV heads and FFN allow, widest first."""
        node = problem.cluster.levels[0].fanout
        limit = min(node, self.max_tp or node, problem.cluster.num_devices)
        sp = problem.training.sequence_parallel
        return [
            tp
            for tp in sorted(divisors(node), reverse=True)
            if tp <= limit and problem.model.shard_problem(Shard(tp=tp, sp=sp and tp > 1)) is None
        ] or [1]

    def tensor_degree(self, problem: Problem) -> int:
        return self.tensor_degrees(problem)[0]

    def _model_parallel(self, problem: Problem) -> list[tuple[int, int]]:
        """(tp, pp) pairs in the order the rules try them."""
        n = problem.cluster.num_devices
        pps = divisors(problem.model.spec.layers)  # uniform split: pp divides the layers
        if self.tensor == "fill_node":
            tp = self.tensor_degree(problem)
            return [(tp, pp) for pp in pps if tp * pp <= n]
        pairs = [(tp, pp) for tp in self.tensor_degrees(problem) for pp in pps if tp * pp <= n]
        return sorted(pairs, key=lambda x: (x[0] * x[1], x[1]))

    def candidates(self, problem: Problem):
        """Plans in the order the rules prefer them."""
        model, training = problem.model, problem.training
        n = problem.cluster.num_devices
        blocks = model.spec.layers
        order = parse_rank_order(self.rank_order)
        for tp, pp in self._model_parallel(problem):
            # DP for the rest: the most replicas that fit and divide the batch (others stay idle)
            dp = max(d for d in divisors(training.global_batch) if d <= n // (tp * pp))
            ep = gcd(model.spec.num_experts, dp) if model.spec.is_moe else 1
            counts = uniform_partition(blocks, pp)
            counts[0] += 1
            counts[-1] += 1
            for mode in RECOMPUTE_ORDER:
                for mbs in sorted(training.microbatch_sizes, reverse=True):
                    if training.global_batch % (mbs * dp):
                        continue
                    config = ParallelConfig(
                        tp=tp,
                        ep=ep,
                        dp=dp,
                        pp=pp,
                        microbatch_size=mbs,
                        zero_stage=self.zero_stage,
                        schedule=Schedule.ONE_F_ONE_B,
                        rank_order=tuple(order),
                    )
                    yield make_structured_plan(
                        config,
                        layer_counts=counts,
                        recompute=[mode] * pp,
                        num_microbatches=training.global_batch // (mbs * dp),
                        sequence_parallel=training.sequence_parallel,
                    )

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        if self.max_tp is not None and (not isinstance(self.max_tp, int) or self.max_tp < 1):
            raise UserError(
                f"solver.max_tp={self.max_tp!r} must be a positive integer (or null for the node "
                "size)"
            )
        if self.tensor not in ("fill_node", "as_needed"):
            raise UserError(f"solver.tensor={self.tensor!r}; use fill_node or as_needed")
        if self.zero_stage not in (0, 1, 2, 3):
            raise UserError(f"solver.zero_stage={self.zero_stage!r}; use 0, 1, 2 or 3")
        best_peak = None
        least = None  # the least-memory plan tried, for the error's memory fix
        tried = 0
        for plan in self.candidates(problem):
            tried += 1
            scored, report = finish(
                self.name, problem, plan, started_s=started, n_evaluations=tried
            )
            if report.feasible:
                return scored.with_record(search={"configurations_considered": tried})
            if best_peak is None or report.peak_memory_bytes < best_peak:
                best_peak, least = report.peak_memory_bytes, (scored, report)
        if tried == 0:
            raise UserError(
                f"no Megatron-rule configuration for training.global_batch="
                f"{problem.training.global_batch} with training.microbatch_sizes="
                f"{list(problem.training.microbatch_sizes)} on cluster.devices="
                f"{problem.cluster.num_devices}; choose a batch divisible by the microbatch sizes"
            )
        error = infeasible_memory(problem, self.name, best_peak)
        fix = memory_fix(problem, *least)
        raise Infeasible(f"{error}; {fix}", min_memory_bytes=error.min_memory_bytes)
