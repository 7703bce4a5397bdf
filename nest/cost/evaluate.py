"""``evaluate(problem, plan) -> Report``: the one scoring path for every planner.

A short composition of the cost model's public terms, which the planners call too:

- per chunk (pipeline stage) and microbatch, seconds (:func:`_stage_report`):
  ``f = compute_fwd + TP/CP/EP collectives + exposed ZeRO-3 weight gathers + p2p send of the
  output``; ``b = compute_bwd + recompute (+ its collectives) + TP/CP/EP collectives + exposed
  ZeRO-3 gathers and gradient reduce-scatters + p2p send of the input gradient + activation
  offload's copies the compute does not hide`` (:mod:`nest.cost.offload`). Layer terms:
  :mod:`nest.cost.compute`; collectives on the rank's groups, each costing its slowest group:
  :mod:`nest.cost.groups` over :mod:`nest.cost.collectives`; ZeRO-3 traffic, layer by
  layer with FSDP's prefetch overlap: :mod:`nest.cost.fsdp`; p2p at the slowest device pair of
  the two chunks: :func:`nest.cost.collectives.pair_p2p_time_s`. Synchronous data parallelism makes
  every stage run at the pace of its slowest replica, so these maxima are what a replica sees.
- per pipeline rank (:func:`_rank_report`): ``t_r`` sums its chunks; its DP sync and optimizer
  step (:class:`nest.cost.state.ModelState`); its memory (:mod:`nest.cost.memory`).
- the iteration: ``T_iter = T_pipe + exposed DP sync + optimizer step`` with the pipeline,
  exposed-sync and in-flight formulas of :mod:`nest.cost.pipeline`. A zero-bubble schedule
  splits each chunk's backward into its weight-gradient GEMMs (``wgrad_s``, the W pass) and
  the rest (the B pass: recompute, collectives, ZeRO-3 traffic and p2p stay there; TP
  collectives that ``--tp-comm-overlap`` hides under weight-gradient GEMMs keep that overlap,
  a simplification).

Not modelled (documented simplifications): the all-reduce of tied-embedding gradients between the
first and last stage; contention between concurrent groups (one NIC per device) on a hierarchy
(a graph cluster shares links between the groups of a kind: :mod:`nest.graph.network`). TP/CP/EP
communication overlapping compute is modelled: each collective is charged its exposed part
(:func:`nest.cost.compute.exposed_s`), on a hierarchy and a graph alike, and the stage reports
its total as well.
"""

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from nest.core.axes import LayerKind, Recompute, Schedule
from nest.core.errors import UserError
from nest.core.layers import Collective, LayerCost, Shard
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.report import RankReport, Report, StageReport
from nest.cost.collectives import p2p_classes, pair_p2p_time_s
from nest.cost.compute import (
    bwd_collectives,
    fwd_collectives,
    hardware_flops,
    hiding_bwd_s,
    recompute_s,
)
from nest.cost.dualpipe import dualpipe_v_pipeline_s
from nest.cost.groups import AXES, RankGroups, rank_groups
from nest.cost.memory import host_bytes, offloaded_layers, rank_memory
from nest.cost.offload import offload_exposed_s
from nest.cost.pipeline import (
    exposed_sync_s,
    gather_exposed_s,
    in_flight_microbatches,
    pipeline_time_s,
    rank_pipeline_terms,
    zb_v_exposed_sync_s,
    zb_v_pipeline_s,
)
from nest.cost.state import ModelState


def shard_of(plan: Plan) -> Shard:
    return plan.config.shard(plan.sequence_parallel)


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
        if plan.stages[k].devices != plan.stages[plan.chunk_rank(k)].devices:
            raise UserError(f"chunk {k} must run on pipeline rank {plan.chunk_rank(k)}'s devices")
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
    for k, stage in enumerate(plan.stages):
        blocks = sum(problem.model.chain[i].kind is LayerKind.BLOCK for i in stage.layers)
        if stage.full_blocks > blocks:
            raise UserError(
                f"stage {k} full_blocks={stage.full_blocks} but it holds {blocks} blocks; use "
                f"at most {blocks} (or recompute=full for all of them)"
            )
    n_off, blocks = plan.activation_offload_blocks, problem.model.spec.layers
    if n_off is not None and n_off > blocks:
        raise UserError(
            f"plan activation_offload_blocks={n_off} but the model has {blocks} blocks; use at "
            f"most {blocks} (all of them: every block offloaded)"
        )
    reason = problem.model.shard_problem(shard_of(plan))
    if reason:
        raise UserError(reason)
    fold = plan.config.expert_fold
    if (plan.dp * plan.cp * fold) % plan.ep:
        raise UserError(
            f"ep={plan.ep} must divide dp*cp*tp/etp = {plan.dp * plan.cp * fold}; "
            "expert ranks are carved out of the data x context (x tensor, with etp=1) ranks"
        )
    global_batch = problem.training.global_batch
    if plan.num_microbatches * plan.microbatch_size * plan.dp != global_batch:
        raise UserError(
            f"num_microbatches({plan.num_microbatches}) x microbatch_size({plan.microbatch_size}) "
            f"x dp({plan.dp}) != global_batch({global_batch}); global_batch must be divisible by "
            "microbatch_size * dp"
        )
    for name in ("optimizer_offload", "activation_offload"):
        device = cluster.device
        if getattr(plan, name) and device.host_link_bw_bytes_per_s is None:
            raise UserError(
                f"plan {name}=true but device {device.name} has no host link "
                "(host_link_gbps); set it in the device preset or plan without offload"
            )
    if plan.optimizer_offload and problem.training.optimizer_state_bytes_per_param == 0:
        raise UserError(
            f"plan optimizer_offload=true but training.optimizer="
            f"{problem.training.optimizer} keeps no state to offload; plan without offload"
        )
    _check_schedule(plan)


def _check_schedule(plan: Plan) -> None:
    """The schedule's own rules: interleaving's degrees and microbatch divisibility (Megatron-LM),
    ZB-V's two chunks per rank, the zero-bubble schedules' microbatch counts."""
    if plan.schedule is Schedule.INTERLEAVED:
        if plan.virtual_stages < 2 or plan.pp < 2:
            raise UserError("schedule=interleaved needs pp >= 2 and virtual_stages >= 2")
        if plan.num_microbatches % plan.pp:
            raise UserError(
                f"interleaved schedule needs num_microbatches({plan.num_microbatches}) divisible "
                f"by pp({plan.pp}) (Megatron-LM's requirement)"
            )
    if plan.schedule.v_shaped and plan.pp < 2:
        raise UserError(f"schedule={plan.schedule} needs pp >= 2 (its V spans two chunks per rank)")
    _check_zero_bubble_microbatches(plan)


def _check_zero_bubble_microbatches(plan: Plan) -> None:
    """ZB-H1 needs ``m >= pp`` (Qi et al. 2024 §2.1), ZB-H2 ``m >= 2 pp - 1`` (§2.2), ZB-V
    ``m >= 2 pp - 1``, DualPipeV ``m >= 2 pp`` (:meth:`Schedule.min_microbatches`)."""
    need, m = plan.schedule.min_microbatches(plan.pp), plan.num_microbatches
    if m >= need:
        return
    rule, where, other = {
        Schedule.ZB_H1: ("pp", "Qi et al. 2024 §2.1", "1f1b"),
        Schedule.ZB_H2: ("2*pp-1", "Qi et al. 2024 §2.2", "zb_h1"),
        Schedule.ZB_V: ("2*pp-1", "PyTorch's ScheduleZBVZeroBubble", "zb_h1"),
        Schedule.DUALPIPE_V: ("2*pp", "DeepSeek's DualPipeV.step", "zb_v"),
    }[plan.schedule]
    raise UserError(
        f"schedule={plan.schedule} needs num_microbatches({m}) >= {rule}({need}) "
        f"({where}); lower the microbatch size or use schedule={other}"
    )


@dataclass(slots=True)
class Chunk:
    """One chunk's layers on one device: (cost, the chunk's mode, is a block) per layer."""

    layers: list[tuple[LayerCost, Recompute, bool]]

    @property
    def dense_params(self) -> float:
        return sum(cost.dense_params for cost, _, _ in self.layers)

    @property
    def expert_params(self) -> float:
        return sum(cost.expert_params for cost, _, _ in self.layers)

    @property
    def boundary_bytes(self) -> float:
        """Bytes each device sends to the next chunk's devices (its last layer's output)."""
        return self.layers[-1][0].boundary_bytes

    def collectives(self, direction: str) -> list[tuple[Collective, int]]:
        """The chunk's collectives of one direction (``f`` or ``b``), with multiplicities, in
        the order they first occur. Layers that share one cost (a chunk's identical blocks) are
        counted together, so each distinct layer's collectives are counted once."""
        same: Counter = Counter((id(cost), mode, blk) for cost, mode, blk in self.layers)
        counter: Counter = Counter()
        for cost, mode, blk in self.layers:
            n = same.pop((id(cost), mode, blk), 0)
            if n:
                colls = (
                    fwd_collectives(cost) if direction == "f" else bwd_collectives(cost, mode, blk)
                )
                for coll in colls:
                    counter[coll] += n
        return list(counter.items())


def _chunks(problem: Problem, plan: Plan) -> list[Chunk]:
    model, device = problem.model, problem.cluster.device
    shard = shard_of(plan)
    chain = model.chain
    return [
        Chunk(
            [
                (
                    model.layer_cost(chain[i], shard, device),
                    stage.layer_recompute(i),
                    chain[i].kind is LayerKind.BLOCK,
                )
                for i in stage.layers
            ]
        )
        for stage in plan.stages
    ]


def zero3_chunk_s(state: ModelState, groups: RankGroups, chunk: Chunk) -> tuple:
    """``(forward exposed, backward exposed, all)`` ZeRO-3 seconds per microbatch of a chunk:
    its layers' gathers and reduce-scatters with FSDP's prefetch overlap
    (:class:`nest.cost.fsdp.OverlapChain`); zeros below ZeRO-3."""
    if state.zero_stage < 3:
        return 0.0, 0.0, 0.0
    layers = [cost for cost, _, _ in chunk.layers]
    chain = state.zero3_chain(
        groups,
        [c.dense_params for c in layers],
        [c.expert_params for c in layers],
        [c.fwd_s for c in layers],
        [hiding_bwd_s(c, mode, blk) for c, mode, blk in chunk.layers],
    )
    last = len(layers) - 1
    return float(chain.fwd_s(0, last)), float(chain.bwd_s(0, last)), float(chain.total_s(0, last))


def _stage_report(
    problem: Problem,
    plan: Plan,
    k: int,
    chunks: list[Chunk],
    groups: RankGroups,
    state: ModelState,
    rank_devices: list[np.ndarray],
) -> StageReport:
    """Chunk ``k``'s forward and backward per microbatch, term by term (``rank_devices``: each
    pipeline rank's devices as an array, converted once)."""
    cluster = problem.cluster
    stage, chunk = plan.stages[k], chunks[k]
    rank = plan.chunk_rank(k)
    devices = rank_devices[rank]
    fwd_colls, bwd_colls = chunk.collectives("f"), chunk.collectives("b")
    # per axis, (exposed, total) of the forward's and of the backward's collectives
    fwd_comm = {axis: groups.axis_times_s(fwd_colls, axis) for axis in AXES}
    bwd_comm = {axis: groups.axis_times_s(bwd_colls, axis) for axis in AXES}
    comm = {axis: (fwd_comm[axis][0], bwd_comm[axis][0]) for axis in AXES}  # exposed: charged
    total = {axis: fwd_comm[axis][1] + bwd_comm[axis][1] for axis in AXES}  # hidden or not
    zero3_fwd, zero3_bwd, zero3_total = zero3_chunk_s(state, groups, chunk)
    p2p_fwd = p2p_bwd = 0.0
    # the output to the next chunk's devices, the gradient of the input back to the previous
    # chunk's; none where both chunks sit on this rank (the bottom of ZB-V's V)
    if k + 1 < len(chunks) and plan.chunk_rank(k + 1) != rank:
        # the device pairs' shared levels (a graph: their cost classes)
        classes = p2p_classes(cluster, devices, rank_devices[plan.chunk_rank(k + 1)])
        p2p_fwd = pair_p2p_time_s(chunk.boundary_bytes, classes, cluster)
    if k > 0 and plan.chunk_rank(k - 1) != rank:
        classes = p2p_classes(cluster, devices, rank_devices[plan.chunk_rank(k - 1)])
        p2p_bwd = pair_p2p_time_s(chunks[k - 1].boundary_bytes, classes, cluster)
    compute_fwd = sum(cost.fwd_s for cost, _, _ in chunk.layers)
    compute_bwd = sum(cost.bwd_s for cost, _, _ in chunk.layers)
    wgrad = sum(cost.wgrad_s for cost, _, _ in chunk.layers)
    redo = sum(recompute_s(cost, mode, blk) for cost, mode, blk in chunk.layers)
    offload = 0.0
    if plan.activation_offload:
        flags, _ = offloaded_layers(chunk.layers, True, plan.activation_offload_blocks)
        moved = sum(
            host_bytes(cost, mode, blk, off)
            for (cost, mode, blk), off in zip(chunk.layers, flags, strict=True)
        )
        bw = cluster.device.host_link_bw_bytes_per_s
        offload = offload_exposed_s(moved, compute_fwd, compute_bwd + redo, bw)
    fwd = compute_fwd + sum(f for f, _ in comm.values()) + zero3_fwd + p2p_fwd
    bwd = compute_bwd + redo + sum(b for _, b in comm.values()) + zero3_bwd + p2p_bwd + offload
    return StageReport(
        index=k,
        pp_rank=rank,
        first_layer=stage.first_layer,
        last_layer=stage.last_layer,
        recompute=stage.recompute_label,
        compute_fwd_s=compute_fwd,
        compute_bwd_s=compute_bwd,
        recompute_s=redo,
        tp_comm_s=total["tp"],
        cp_comm_s=total["cp"],
        ep_comm_s=total["ep"],
        tp_exposed_s=sum(comm["tp"]),
        cp_exposed_s=sum(comm["cp"]),
        ep_exposed_s=sum(comm["ep"]),
        zero3_comm_s=zero3_total,
        zero3_exposed_s=zero3_fwd + zero3_bwd,
        p2p_fwd_s=p2p_fwd,
        p2p_bwd_s=p2p_bwd,
        fwd_s=fwd,
        bwd_s=bwd,
        wgrad_s=wgrad,
        offload_exposed_s=offload,
    )


def rank_params(plan: Plan, r: int, chunks: list[Chunk]) -> tuple[float, float]:
    """Dense (with Megatron's copy of a tied word embedding when the head's rank does not hold
    the embedding) and expert parameters of pipeline rank ``r``, per device."""
    ks = plan.pp_rank_chunks[r]
    dense = sum(chunks[k].dense_params for k in ks)
    expert = sum(chunks[k].expert_params for k in ks)
    head_rank = plan.chunk_rank(len(plan.stages) - 1)
    if r == head_rank and r != 0:
        dense += chunks[-1].layers[-1][0].tied_copy_params
    return dense, expert


def _rank_report(
    problem: Problem, plan: Plan, r: int, chunks, stages, groups: RankGroups, state: ModelState
) -> RankReport:
    """Rank ``r``'s times, its DP sync and optimizer step, and its memory (exposed sync is
    filled in by the caller, which needs every rank's sync)."""
    device = problem.cluster.device
    dense, expert = rank_params(plan, r, chunks)
    ks = plan.pp_rank_chunks[r]
    in_flight = in_flight_microbatches(
        r, plan.pp, plan.num_microbatches, plan.schedule, plan.virtual_stages
    )
    memory = rank_memory(
        state,
        [layer for k in ks for layer in chunks[k].layers],
        dense_params=dense,
        expert_params=expert,
        in_flight=in_flight,
        reserve_bytes=device.memory_reserve_bytes,
        capacity_bytes=device.hbm_bytes,
        offload=plan.activation_offload,
        offload_blocks=plan.activation_offload_blocks,
    )
    return RankReport(
        pp_rank=r,
        fwd_s=sum(stages[k].fwd_s for k in ks),
        bwd_s=sum(stages[k].bwd_s for k in ks),
        wgrad_s=sum(stages[k].wgrad_s for k in ks),
        dp_sync_s=state.sync_s(groups, dense, expert),
        dp_gather_s=state.gather_s(groups, dense, expert),
        dp_sync_exposed_s=0.0,
        optimizer_s=state.optimizer_step_s(dense, expert, device.achieved_hbm_bw_bytes_per_s),
        memory=memory,
    )


def evaluate(problem: Problem, plan: Plan) -> Report:
    """Score ``plan`` on ``problem`` with the shared cost model (module docstring)."""
    check_plan(problem, plan)
    cluster, training = problem.cluster, problem.training
    state = ModelState.of(
        problem,
        zero_stage=plan.zero_stage,
        dp=plan.dp,
        cp=plan.cp,
        ep=plan.ep,
        fold=plan.config.expert_fold,
        optimizer_offload=plan.optimizer_offload,
        zero_shard=plan.zero_shard,
    )
    groups = rank_groups(plan, cluster)
    chunks = _chunks(problem, plan)
    rank_devices = [np.asarray(plan.stages[r].devices, dtype=np.int64) for r in range(plan.pp)]
    stages = [
        _stage_report(problem, plan, k, chunks, groups[plan.chunk_rank(k)], state, rank_devices)
        for k in range(len(chunks))
    ]
    ranks = [
        _rank_report(problem, plan, r, chunks, stages, groups[r], state) for r in range(plan.pp)
    ]
    if plan.schedule is Schedule.DUALPIPE_V:
        return _report(
            problem, plan, chunks, stages, *_dualpipe_v_times(problem, plan, stages, ranks)
        )
    if plan.schedule.v_shaped:
        return _report(problem, plan, chunks, stages, *_zb_v_times(problem, plan, stages, ranks))
    # Rank r's last backward is on chunk r (its first chunk, also under interleaving); after it
    # only chunks r-1 .. 0 still run, and their backward hides rank r's synchronisation.
    exposed = exposed_sync_s(
        _reduce_s(ranks),
        [stages[r].bwd_s for r in range(plan.pp)],
        training.overlap_grad_sync,
        wgrad_s=[stages[r].wgrad_s for r in range(plan.pp)],
        fwd_s=[stages[r].fwd_s for r in range(plan.pp)],
        schedule=plan.schedule,
        gather_exposed=_gather_exposed(problem, stages, ranks),
    )
    ranks = [replace(rk, dp_sync_exposed_s=e) for rk, e in zip(ranks, exposed, strict=True)]
    m = plan.num_microbatches
    terms = [rank_pipeline_terms(rk.fwd_s, rk.bwd_s, rk.wgrad_s, plan.schedule) for rk in ranks]
    rank_times = [float(t) for _, t, _ in terms]
    t_pipe = pipeline_time_s(
        rank_times,
        m,
        plan.schedule,
        plan.virtual_stages,
        sum_terms_s=[float(u) for u, _, _ in terms],
        tail_terms_s=[float(e) for _, _, e in terms],
    )
    return _report(problem, plan, chunks, stages, ranks, t_pipe, exposed)


def _reduce_s(ranks) -> list[float]:
    """Each rank's gradient part of its DP sync (:attr:`RankReport.dp_reduce_s`)."""
    return [rk.dp_reduce_s for rk in ranks]


def _gather_exposed(problem: Problem, stages, ranks) -> list[float]:
    """Each rank's exposed weight all-gather: under the forward of its first chunk, chunk ``r``
    under every schedule (:func:`nest.cost.pipeline.gather_exposed_s`)."""
    overlap = problem.training.overlap_grad_sync
    return [
        float(gather_exposed_s(rk.dp_gather_s, stages[r].fwd_s, overlap))
        for r, rk in enumerate(ranks)
    ]


def _zb_v_times(problem: Problem, plan: Plan, stages, ranks) -> tuple[list, float, list[float]]:
    """ZB-V's ranks (their exposed sync filled in), pipeline time and exposed syncs
    (:func:`nest.cost.pipeline.zb_v_pipeline_s`): rank 0's last task is the W pass of chunk
    ``2 pp - 1``, any other rank's that of its first chunk."""
    t_pipe, hidden = zb_v_pipeline_s(
        [rk.fwd_s + rk.bwd_s for rk in ranks],
        plan.num_microbatches,
        [st.fwd_s for st in stages],
        [st.bwd_s for st in stages],
        [st.wgrad_s for st in stages],
    )
    last_w = [stages[len(stages) - 1 if r == 0 else r].wgrad_s for r in range(plan.pp)]
    exposed = zb_v_exposed_sync_s(
        _reduce_s(ranks),
        hidden,
        last_w,
        problem.training.overlap_grad_sync,
        _gather_exposed(problem, stages, ranks),
    )
    ranks = [replace(rk, dp_sync_exposed_s=e) for rk, e in zip(ranks, exposed, strict=True)]
    return ranks, t_pipe, exposed


def _dualpipe_v_times(
    problem: Problem, plan: Plan, stages, ranks
) -> tuple[list, float, list[float]]:
    """DualPipeV's ranks (their exposed sync filled in), pipeline time and exposed syncs: the
    list schedule of its order on the chunks' passes
    (:func:`nest.cost.dualpipe.dualpipe_v_pipeline_s`); each rank's sync is hidden by how long
    before the pipeline's end it finishes and, with overlap, by its last task (a W pass), as
    under ZB-V."""
    t_pipe, hidden, last_w = dualpipe_v_pipeline_s(
        plan.pp,
        plan.num_microbatches,
        [st.fwd_s for st in stages],
        [st.compute_fwd_s for st in stages],
        [st.bwd_s for st in stages],
        [st.compute_bwd_s + st.recompute_s for st in stages],
        [st.wgrad_s for st in stages],
    )
    exposed = zb_v_exposed_sync_s(
        _reduce_s(ranks),
        hidden,
        last_w,
        problem.training.overlap_grad_sync,
        _gather_exposed(problem, stages, ranks),
    )
    ranks = [replace(rk, dp_sync_exposed_s=e) for rk, e in zip(ranks, exposed, strict=True)]
    return ranks, t_pipe, exposed


def _report(problem: Problem, plan: Plan, chunks, stages, ranks, t_pipe: float, exposed) -> Report:
    """The report of a plan from its stages, ranks, pipeline time and exposed syncs."""
    cluster, training, model = problem.cluster, problem.training, problem.model
    m = plan.num_microbatches
    rank_times = [rk.fwd_s + rk.bwd_s for rk in ranks]
    t_exposed, t_opt = max(exposed), max(rk.optimizer_s for rk in ranks)
    t_iter = t_pipe + t_exposed + t_opt
    flops = model.model_flops_per_sample() * training.global_batch
    # per-device FLOPs of a microbatch, x the devices of a stage, x the microbatches
    per_device = sum(hardware_flops(*layer) for chunk in chunks for layer in chunk.layers)
    used = plan.devices_used
    report = Report(
        feasible=True,
        violation=None,
        iteration_time_s=t_iter,
        pipeline_time_s=t_pipe,
        bubble_s=t_pipe - m * max(rank_times),
        dp_sync_exposed_s=t_exposed,
        optimizer_s=t_opt,
        throughput_samples_per_s=training.global_batch / t_iter,
        tokens_per_s=training.global_batch * model.seq_len / t_iter,
        mfu=flops / (t_iter * used * cluster.device.peak_flops_per_s),
        model_flops_per_iteration=flops,
        hardware_flops_per_iteration=per_device * plan.tp * plan.cp * plan.dp * m,
        devices_used=used,
        devices_idle=cluster.num_devices - used,
        peak_memory_bytes=max(rk.memory.total_bytes for rk in ranks),
        stages=tuple(stages),
        ranks=tuple(ranks),
    )
    if any(not rk.memory.fits for rk in ranks):
        report = replace(
            report, feasible=False, violation="out of memory: " + report.memory_summary()
        )
    return report
