"""``fixed``: a user-given configuration, scored by the shared evaluator.

The paper's "Manual", "MCMC" and "Phaze" tables are such configurations (data, not code). The
planner only turns degrees into a placed plan; the evaluator decides whether it fits.
"""

import time
from collections.abc import Sequence

from nest.axes import Recompute, Schedule, parse_rank_order
from nest.errors import UserError
from nest.layers import Shard
from nest.plan import Plan, make_structured_plan, uniform_partition
from nest.planner import finish
from nest.problem import Problem


def _as_list(value) -> list | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def chunk_layer_counts(
    num_blocks: int, n_chunks: int, partition: Sequence[int] | None
) -> list[int]:
    """Layer counts per chunk over the whole chain (embedding + blocks + head).

    ``partition`` may count chain layers (sums to ``num_blocks + 2``) or transformer blocks (sums
    to ``num_blocks``; the embedding joins the first chunk and the head the last). ``None`` splits
    the blocks uniformly.
    """
    if partition is None:
        if n_chunks > num_blocks:
            raise UserError(
                f"{n_chunks} pipeline chunks for {num_blocks} transformer blocks; lower pp or "
                "virtual_stages, or give solver.layer_partition over the whole chain"
            )
        counts = uniform_partition(num_blocks, n_chunks)
    else:
        counts = [int(c) for c in partition]
        if len(counts) != n_chunks:
            raise UserError(
                f"solver.layer_partition has {len(counts)} entries; pp x virtual_stages = "
                f"{n_chunks}"
            )
        if sum(counts) == num_blocks + 2:
            return counts
        if sum(counts) != num_blocks:
            raise UserError(
                f"solver.layer_partition {counts} sums to {sum(counts)}; it must count the "
                f"{num_blocks} blocks or all {num_blocks + 2} chain layers"
            )
    counts = list(counts)
    counts[0] += 1  # embedding
    counts[-1] += 1  # head
    return counts


class FixedPlanner:
    """A plan from given degrees; ``dp`` defaults to what the remaining devices allow."""

    def __init__(
        self,
        *,
        name: str = "fixed",
        tp: int = 1,
        pp: int = 1,
        dp: int | None = None,
        cp: int = 1,
        ep: int = 1,
        microbatch_size: int | None = None,
        recompute: str | Sequence[str] = "none",
        zero_stage: int = 0,
        schedule: str = "1f1b",
        virtual_stages: int = 1,
        layer_partition: Sequence[int] | None = None,
        rank_order: str | Sequence[str] = "tp,cp,dp,pp",
        sequence_parallel: bool | None = None,
    ) -> None:
        self.name = name
        self.tp, self.pp, self.dp, self.cp, self.ep = tp, pp, dp, cp, ep
        self.microbatch_size = microbatch_size
        self.recompute = recompute
        self.zero_stage = zero_stage
        self.schedule = schedule
        self.virtual_stages = virtual_stages
        self.layer_partition = layer_partition
        self.rank_order = rank_order
        self.sequence_parallel = sequence_parallel

    def build(self, problem: Problem) -> Plan:
        """The plan these hyper-parameters describe (unscored)."""
        for key in ("tp", "pp", "cp", "ep", "virtual_stages"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"solver.{key}={value!r} must be a positive integer")
        if self.dp is not None and (not isinstance(self.dp, int) or self.dp < 1):
            raise UserError(
                f"solver.dp={self.dp!r} must be a positive integer (or null for the remaining "
                "devices)"
            )
        if self.microbatch_size is not None and (
            not isinstance(self.microbatch_size, int) or self.microbatch_size < 1
        ):
            raise UserError(
                f"solver.microbatch_size={self.microbatch_size!r} must be a positive integer (or "
                "null for the first of training.microbatch_sizes)"
            )
        n = problem.cluster.num_devices
        width = self.tp * self.cp * self.pp
        if width > n:
            raise UserError(
                f"tp*cp*pp = {self.tp}*{self.cp}*{self.pp} = {width} exceeds the cluster's {n} "
                "devices; lower a degree or raise cluster.devices"
            )
        training = problem.training
        sp = (
            training.sequence_parallel if self.sequence_parallel is None else self.sequence_parallel
        )
        reason = problem.model.shard_problem(
            Shard(tp=self.tp, cp=self.cp, ep=self.ep, sp=bool(sp) and self.tp > 1)
        )
        if reason:
            raise UserError(f"solver: {reason}")
        dp = self.dp if self.dp is not None else n // width
        if (dp * self.cp) % self.ep:
            raise UserError(
                f"solver.ep={self.ep} must divide dp*cp = {dp}*{self.cp}; expert ranks are carved "
                "out of the data x context ranks"
            )
        mbs = training.microbatch_sizes[0] if self.microbatch_size is None else self.microbatch_size
        if training.global_batch % (mbs * dp):
            raise UserError(
                f"training.global_batch={training.global_batch} is not divisible by "
                f"microbatch_size({mbs}) x dp({dp}) = {mbs * dp}; change one of them"
            )
        try:
            schedule = Schedule(self.schedule)
        except ValueError:
            raise UserError(
                f"solver.schedule={self.schedule!r}; use one of {[s.value for s in Schedule]}"
            ) from None
        n_chunks = self.pp * self.virtual_stages
        counts = chunk_layer_counts(
            problem.model.spec.layers, n_chunks, _as_list(self.layer_partition)
        )
        modes = _as_list(self.recompute) or ["none"]
        if len(modes) == 1:
            modes = modes * n_chunks
        if len(modes) != n_chunks:
            raise UserError(
                f"solver.recompute has {len(modes)} entries; give one, or one per chunk "
                f"({n_chunks})"
            )
        try:
            recompute = [Recompute(m) for m in modes]
        except ValueError:
            raise UserError(
                f"solver.recompute={self.recompute!r}; use {[r.value for r in Recompute]}"
            ) from None
        sp = (
            training.sequence_parallel if self.sequence_parallel is None else self.sequence_parallel
        )
        return make_structured_plan(
            tp=self.tp,
            cp=self.cp,
            ep=self.ep,
            dp=dp,
            pp=self.pp,
            layer_counts=counts,
            recompute=recompute,
            microbatch_size=mbs,
            num_microbatches=training.global_batch // (mbs * dp),
            zero_stage=self.zero_stage,
            schedule=schedule,
            virtual_stages=self.virtual_stages,
            sequence_parallel=sp,
            rank_order=parse_rank_order(self.rank_order),
        )

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        plan = self.build(problem)
        plan, _ = finish(self.name, problem, plan, started_s=started, n_evaluations=1)
        return plan
