"""Per-device memory of one pipeline rank (DESIGN.md §5).

``weights + gradients + optimizer state + activations x in-flight microbatches + transient +
reserve``. Mixed-precision Adam keeps ``2 + 2 + 12 = 16`` bytes per parameter (Rajbhandari et al.,
"ZeRO", SC20, §3.1); ZeRO stage 1 shards the 12 optimizer bytes over the data-parallel group,
stage 2 also the gradients, stage 3 also the weights (§5). Dense weights are replicated over the
``dp x cp`` ranks (Megatron-Core shards the distributed optimizer over data x context ranks);
expert weights over the ``dp x cp / ep`` expert-data-parallel ranks.

Transient: the largest single-layer buffer alive at the rank's peak: a recomputed block's full
activations during its backward (``act_none - act_mode``), the bf16 logits of the head, and, under
ZeRO-3, the largest layer's gathered weights.
"""

from nest.axes import LayerKind, Recompute
from nest.layers import LayerCost
from nest.plan import Plan, StagePlan
from nest.problem import Problem
from nest.report import MemoryReport


def local_params(plan: Plan, dense_params: float, expert_params: float, sharded: bool) -> float:
    """Parameters a device keeps of some state: all of them, or its shard when ZeRO shards that
    state (dense over the ``dp x cp`` ranks, experts over the ``dp x cp / ep`` ranks)."""
    if not sharded:
        return dense_params + expert_params
    return dense_params / (plan.dp * plan.cp) + expert_params / (plan.dp * plan.cp // plan.ep)


def rank_memory(
    problem: Problem,
    plan: Plan,
    chunks: list[StagePlan],
    chunk_costs: list[list[LayerCost]],
    *,
    dense_params: float,
    expert_params: float,
    in_flight: float,
) -> MemoryReport:
    """Memory of one device of a pipeline rank holding ``chunks``."""
    training, device = problem.training, problem.cluster.device
    p = problem.model.spec.dtype_bytes

    weights = p * local_params(plan, dense_params, expert_params, plan.zero_stage >= 3)
    grads = training.grad_bytes * local_params(
        plan, dense_params, expert_params, plan.zero_stage >= 2
    )
    optimizer = training.optimizer_state_bytes_per_param * local_params(
        plan, dense_params, expert_params, plan.zero_stage >= 1
    )
    stored = 0.0
    transient = 0.0
    chain = problem.model.chain
    for stage, costs in zip(chunks, chunk_costs, strict=True):
        mode = stage.recompute
        for index, cost in zip(stage.layers, costs, strict=True):
            is_block = chain[index].kind is LayerKind.BLOCK
            layer_mode = mode if is_block else Recompute.NONE
            stored += cost.act_bytes[layer_mode]
            peak = cost.transient_bytes
            if layer_mode is not Recompute.NONE:
                peak += cost.act_bytes[Recompute.NONE] - cost.act_bytes[layer_mode]
            if plan.zero_stage >= 3:
                # the layer's weights gathered beyond this device's own shard
                full = local_params(plan, cost.dense_params, cost.expert_params, False)
                own = local_params(plan, cost.dense_params, cost.expert_params, True)
                peak += p * (full - own)
            transient = max(transient, peak)
    # in_flight counts whole-rank microbatches (interleaved: chunk-microbatches / v)
    activations = stored * in_flight
    reserve = device.memory_reserve_bytes
    total = weights + grads + optimizer + activations + transient + reserve
    return MemoryReport(
        weights_bytes=weights,
        grads_bytes=grads,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        transient_bytes=transient,
        reserve_bytes=reserve,
        total_bytes=total,
        capacity_bytes=device.hbm_bytes,
        in_flight_microbatches=in_flight,
    )
