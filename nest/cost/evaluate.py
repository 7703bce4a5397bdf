"""``evaluate(problem, plan) -> Report``: the one scoring path for every planner.

Per chunk (pipeline stage) and microbatch, seconds:
``f = compute_fwd + TP/CP/EP collectives + ZeRO-3 weight gather + p2p send of the output``;
``b = compute_bwd + recompute (+ its collectives) + TP/CP/EP collectives + ZeRO-3 gather and
gradient reduce-scatter + p2p send of the input gradient``. A collective's time is that of its
slowest group (all groups of a stage run at once); a p2p transfer is charged at the slowest pair of
the two stages' devices. Synchronous data parallelism makes every stage run at the pace of its
slowest replica, so these maxima are what a replica sees. A pipeline rank's ``t_r`` sums its
chunks; the pipeline, exposed-sync and in-flight formulas are in :mod:`nest.cost.pipeline`.

``T_iter = T_pipe + exposed DP sync + optimizer step``; the optimizer step is memory-bound (bytes
of state, gradients and weights touched / HBM bandwidth). Memory per device is in
:mod:`nest.cost.memory`.

Not modelled (documented simplifications): the all-reduce of tied-embedding gradients between the
first and last stage; overlap of TP/CP/EP communication with compute; contention between
concurrent groups (one NIC per device).
"""

from collections import Counter
from dataclasses import dataclass

import numpy as np

from nest.axes import LayerKind, Schedule
from nest.cost.collectives import COLLECTIVE_TIME, p2p_time_s
from nest.cost.memory import local_params, rank_memory
from nest.cost.pipeline import exposed_sync_s, in_flight_microbatches, pipeline_time_s
from nest.errors import UserError
from nest.layers import LayerCost, Shard
from nest.plan import Plan
from nest.problem import Problem
from nest.report import RankReport, Report, StageReport


@dataclass(slots=True)
class ChunkSum:
    """Per-device totals of one chunk's layers, per microbatch."""

    layer_costs: list[LayerCost]
    dense_params: float
    expert_params: float
    fwd_s: float
    bwd_s: float
    recompute_s: float
    hardware_flops: float
    """FLOPs one device executes for one microbatch: 3 x forward + recompute."""
    fwd_coll: Counter
    bwd_coll: Counter


def shard_of(plan: Plan) -> Shard:
    return Shard(
        tp=plan.tp, cp=plan.cp, ep=plan.ep, sp=plan.sequence_parallel, mbs=plan.microbatch_size
    )


def check_plan(problem: Problem, plan: Plan) -> None:
    """Raise :class:`UserError` if the plan is malformed for this problem."""
    n_layers = problem.num_layers
    cluster = problem.cluster
    if plan.devices_used > cluster.num_devices:
        raise UserError(
            f"plan uses tp*cp*dp*pp = {plan.tp}*{plan.cp}*{plan.dp}*{plan.pp} = "
            f"{plan.devices_used} devices but cluster {cluster.name} has {cluster.num_devices}; "
            "lower a degree"
        )
    expected = 0
    for k, stage in enumerate(plan.stages):
        if stage.first_layer != expected:
            raise UserError(
                f"stage {k} starts at layer {stage.first_layer}, expected {expected}: stages must "
                "be contiguous and cover the chain in order"
            )
        expected = stage.last_layer + 1
    if expected != n_layers:
        raise UserError(
            f"stages cover layers 0..{expected - 1} but the chain has {n_layers} layers "
            f"(embedding, {n_layers - 2} blocks, head)"
        )
    for k in range(plan.pp, len(plan.stages)):
        if plan.stages[k].devices != plan.stages[k % plan.pp].devices:
            raise UserError(f"chunk {k} must run on pipeline rank {k % plan.pp}'s devices")
    ids = np.concatenate([np.asarray(plan.stages[r].devices).ravel() for r in range(plan.pp)])
    bad = ids[(ids < 0) | (ids >= cluster.num_devices)]
    if bad.size:
        cluster.check_device(int(bad[0]))  # raises with the id and the valid range
    values, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        d = int(values[counts > 1][0])
        ranks = [r for r in range(plan.pp) if d in plan.stages[r].device_ids]
        where = f"pipeline ranks {ranks}" if len(ranks) > 1 else f"pipeline rank {ranks[0]}"
        raise UserError(f"device {d} is used twice ({where}); every device runs one rank")
    reason = problem.model.shard_problem(shard_of(plan))
    if reason:
        raise UserError(reason)
    if (plan.dp * plan.cp) % plan.ep:
        raise UserError(f"ep={plan.ep} must divide dp*cp = {plan.dp * plan.cp}")
    global_batch = problem.training.global_batch
    if plan.num_microbatches * plan.microbatch_size * plan.dp != global_batch:
        raise UserError(
            f"num_microbatches({plan.num_microbatches}) x microbatch_size({plan.microbatch_size}) "
            f"x dp({plan.dp}) != global_batch({global_batch}); global_batch must be divisible by "
            "microbatch_size * dp"
        )
    if plan.schedule is Schedule.INTERLEAVED:
        if plan.virtual_stages < 2 or plan.pp < 2:
            raise UserError("schedule=interleaved needs pp >= 2 and virtual_stages >= 2")
        if plan.num_microbatches % plan.pp:
            raise UserError(
                f"interleaved schedule needs num_microbatches({plan.num_microbatches}) divisible "
                f"by pp({plan.pp}) (Megatron-LM's requirement)"
            )


def _chunk_sum(problem: Problem, plan: Plan, k: int, shard: Shard) -> ChunkSum:
    stage = plan.stages[k]
    model, device = problem.model, problem.cluster.device
    costs = [model.layer_cost(model.chain[i], shard, device) for i in stage.layers]
    mode = stage.recompute
    fwd_coll: Counter = Counter()
    bwd_coll: Counter = Counter()
    recompute_s = 0.0
    hardware_flops = 0.0
    for ref_index, cost in zip(stage.layers, costs, strict=True):
        fwd_coll.update(cost.fwd_collectives)
        bwd_coll.update(cost.bwd_collectives)
        hardware_flops += 3.0 * cost.fwd_flops
        if model.chain[ref_index].kind is LayerKind.BLOCK:
            recompute_s += cost.recompute_s.get(mode, 0.0)
            hardware_flops += cost.recompute_flops.get(mode, 0.0)
            bwd_coll.update(cost.recompute_collectives.get(mode, ()))
    return ChunkSum(
        layer_costs=costs,
        dense_params=sum(c.dense_params for c in costs),
        expert_params=sum(c.expert_params for c in costs),
        fwd_s=sum(c.fwd_s for c in costs),
        bwd_s=sum(c.bwd_s for c in costs),
        recompute_s=recompute_s,
        hardware_flops=hardware_flops,
        fwd_coll=fwd_coll,
        bwd_coll=bwd_coll,
    )


class _Groups:
    """The communication groups of one pipeline rank and how each group kind splits over the
    levels (computed once per rank, on first use)."""

    def __init__(self, devices: np.ndarray, ep: int, cluster) -> None:
        dp, cp, tp = devices.shape
        flat = devices.reshape(dp * cp, tp)  # row j = replica * cp + context rank
        blocks = flat.reshape(dp * cp // ep, ep, tp)
        self.cluster = cluster
        self.arrays = {
            "tp": flat,
            "cp": devices.transpose(0, 2, 1).reshape(-1, cp),
            "ep": blocks.transpose(0, 2, 1).reshape(-1, ep),
            "dense_dp": flat.T,  # gradient sync of dense weights: all dp x cp ranks
            "expert_dp": blocks.transpose(1, 2, 0).reshape(-1, dp * cp // ep),
        }
        self._factors: dict[str, set] = {}

    def factors(self, kind: str) -> set[tuple[int, ...]]:
        """Distinct level splits of the groups of ``kind`` (empty for single-member groups)."""
        if kind not in self._factors:
            arr = self.arrays[kind]
            self._factors[kind] = (
                set() if arr.shape[1] <= 1 else self.cluster.distinct_group_factors(arr)
            )
        return self._factors[kind]

    def time_s(self, op: str, n_bytes: float, kind: str) -> float:
        """One collective over every group of ``kind`` at once: its slowest group, seconds."""
        if n_bytes <= 0:
            return 0.0
        return max(
            (COLLECTIVE_TIME[op](n_bytes, f, self.cluster) for f in self.factors(kind)),
            default=0.0,
        )


def _collectives_time_s(counter: Counter, groups: _Groups) -> dict:
    """Seconds per axis for a multiset of collectives (slowest group of each axis)."""
    out = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    by_axis: dict[str, list] = {}
    for coll, count in counter.items():
        by_axis.setdefault(coll.axis, []).append((coll, count))
    for axis, items in by_axis.items():
        out[axis] = max(
            (
                sum(
                    count * COLLECTIVE_TIME[c.op](c.n_bytes, f, groups.cluster)
                    for c, count in items
                )
                for f in groups.factors(axis)
            ),
            default=0.0,
        )
    return out


def _p2p_s(n_bytes: float, src: np.ndarray, dst: np.ndarray, cluster) -> float:
    if n_bytes <= 0:
        return 0.0
    levels = np.unique(cluster.common_levels(src, dst))
    return max(p2p_time_s(n_bytes, int(level), cluster) for level in levels)


def evaluate(problem: Problem, plan: Plan) -> Report:
    """Score ``plan`` on ``problem`` with the shared cost model (DESIGN.md §5)."""
    check_plan(problem, plan)
    cluster, training = problem.cluster, problem.training
    model = problem.model
    shard = shard_of(plan)
    p_bytes = model.spec.dtype_bytes
    g_bytes = training.grad_bytes
    n_chunks = len(plan.stages)
    arrays = [np.asarray(stage.devices, dtype=np.int64) for stage in plan.stages]
    groups = [_Groups(arrays[r], plan.ep, cluster) for r in range(plan.pp)]
    sums = [_chunk_sum(problem, plan, k, shard) for k in range(n_chunks)]

    stage_reports = []
    for k, (stage, cs) in enumerate(zip(plan.stages, sums, strict=True)):
        g = groups[k % plan.pp]
        fwd_comm = _collectives_time_s(cs.fwd_coll, g)
        bwd_comm = _collectives_time_s(cs.bwd_coll, g)
        zero3_fwd = zero3_bwd = 0.0
        if plan.zero_stage == 3:
            gather = g.time_s("all_gather", p_bytes * cs.dense_params, "dense_dp")
            gather += g.time_s("all_gather", p_bytes * cs.expert_params, "expert_dp")
            scatter = g.time_s("reduce_scatter", g_bytes * cs.dense_params, "dense_dp")
            scatter += g.time_s("reduce_scatter", g_bytes * cs.expert_params, "expert_dp")
            zero3_fwd, zero3_bwd = gather, gather + scatter
        out_bytes = cs.layer_costs[-1].boundary_bytes
        p2p_fwd = _p2p_s(out_bytes, arrays[k], arrays[k + 1], cluster) if k + 1 < n_chunks else 0.0
        p2p_bwd = 0.0
        if k > 0:
            in_bytes = sums[k - 1].layer_costs[-1].boundary_bytes
            p2p_bwd = _p2p_s(in_bytes, arrays[k], arrays[k - 1], cluster)
        fwd = cs.fwd_s + sum(fwd_comm.values()) + zero3_fwd + p2p_fwd
        bwd = cs.bwd_s + cs.recompute_s + sum(bwd_comm.values()) + zero3_bwd + p2p_bwd
        stage_reports.append(
            StageReport(
                index=k,
                pp_rank=k % plan.pp,
                first_layer=stage.first_layer,
                last_layer=stage.last_layer,
                recompute=str(stage.recompute),
                compute_fwd_s=cs.fwd_s,
                compute_bwd_s=cs.bwd_s,
                recompute_s=cs.recompute_s,
                tp_comm_s=fwd_comm["tp"] + bwd_comm["tp"],
                cp_comm_s=fwd_comm["cp"] + bwd_comm["cp"],
                ep_comm_s=fwd_comm["ep"] + bwd_comm["ep"],
                zero3_comm_s=zero3_fwd + zero3_bwd,
                p2p_fwd_s=p2p_fwd,
                p2p_bwd_s=p2p_bwd,
                fwd_s=fwd,
                bwd_s=bwd,
            )
        )

    m, v = plan.num_microbatches, plan.virtual_stages
    chunks_of = plan.pp_rank_chunks
    embedding_rank = 0
    head_rank = (n_chunks - 1) % plan.pp
    rank_fwd = [sum(stage_reports[k].fwd_s for k in chunks_of[r]) for r in range(plan.pp)]
    rank_bwd = [sum(stage_reports[k].bwd_s for k in chunks_of[r]) for r in range(plan.pp)]
    sync, opt, memories = [], [], []
    for r in range(plan.pp):
        dense = sum(sums[k].dense_params for k in chunks_of[r])
        expert = sum(sums[k].expert_params for k in chunks_of[r])
        if r == head_rank and r != embedding_rank:
            dense += sums[-1].layer_costs[-1].tied_copy_params
        g = groups[r]
        if plan.zero_stage == 0:
            s = g.time_s("all_reduce", g_bytes * dense, "dense_dp")
            s += g.time_s("all_reduce", g_bytes * expert, "expert_dp")
        elif plan.zero_stage in (1, 2):
            s = g.time_s("reduce_scatter", g_bytes * dense, "dense_dp")
            s += g.time_s("all_gather", p_bytes * dense, "dense_dp")
            s += g.time_s("reduce_scatter", g_bytes * expert, "expert_dp")
            s += g.time_s("all_gather", p_bytes * expert, "expert_dp")
        else:
            s = 0.0  # ZeRO-3 reduce-scatters every microbatch (charged in the backward)
        sync.append(s)
        local = local_params(plan, dense, expert, plan.zero_stage >= 1)  # optimizer state shard
        touched = 2 * training.optimizer_state_bytes_per_param + g_bytes + p_bytes
        if training.optimizer_state_bytes_per_param == 0:
            touched = g_bytes + 2 * p_bytes  # SGD: read gradient, read and write weight
        opt.append(local * touched / cluster.device.hbm_bw_bytes_per_s)
        in_flight = in_flight_microbatches(r, plan.pp, m, plan.schedule, v)
        memories.append(
            rank_memory(
                problem,
                plan,
                [plan.stages[k] for k in chunks_of[r]],
                [sums[k].layer_costs for k in chunks_of[r]],
                dense_params=dense,
                expert_params=expert,
                in_flight=in_flight,
            )
        )
    # Rank r's last backward is on chunk r (its first chunk, also under interleaving); after it
    # only chunks r-1 .. 0 still run, and their backward hides rank r's synchronisation.
    last_bwd = [stage_reports[r].bwd_s for r in range(plan.pp)]
    exposed = exposed_sync_s(sync, last_bwd, training.overlap_grad_sync)
    rank_times = [f + b for f, b in zip(rank_fwd, rank_bwd, strict=True)]
    t_pipe = pipeline_time_s(rank_times, m, plan.schedule, v)
    t_exposed = max(exposed)
    t_opt = max(opt)
    t_iter = t_pipe + t_exposed + t_opt
    ranks = tuple(
        RankReport(
            pp_rank=r,
            fwd_s=rank_fwd[r],
            bwd_s=rank_bwd[r],
            dp_sync_s=sync[r],
            dp_sync_exposed_s=exposed[r],
            optimizer_s=opt[r],
            memory=memories[r],
        )
        for r in range(plan.pp)
    )
    over = [rk for rk in ranks if not rk.memory.fits]
    flops = model.model_flops_per_sample() * training.global_batch
    # per-device FLOPs of a microbatch, x the devices of a stage, x the microbatches
    hardware_flops = sum(cs.hardware_flops for cs in sums) * plan.tp * plan.cp * plan.dp * m
    used = plan.devices_used
    report_kwargs = dict(
        iteration_time_s=t_iter,
        pipeline_time_s=t_pipe,
        bubble_s=t_pipe - m * max(rank_times),
        dp_sync_exposed_s=t_exposed,
        optimizer_s=t_opt,
        throughput_samples_per_s=training.global_batch / t_iter,
        tokens_per_s=training.global_batch * model.seq_len / t_iter,
        mfu=flops / (t_iter * used * cluster.device.peak_flops_per_s),
        model_flops_per_iteration=flops,
        hardware_flops_per_iteration=hardware_flops,
        devices_used=used,
        devices_idle=cluster.num_devices - used,
        peak_memory_bytes=max(rk.memory.total_bytes for rk in ranks),
        stages=tuple(stage_reports),
        ranks=ranks,
    )
    report = Report(feasible=not over, violation=None, **report_kwargs)
    if over:
        report = Report(
            feasible=False, violation="out of memory: " + report.memory_summary(), **report_kwargs
        )
    return report
