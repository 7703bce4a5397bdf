"""Per-device memory of one pipeline rank.

``state + stored activations x in-flight microbatches + transient + reserve``
(:func:`rank_memory_bytes`):

- state: weights, gradients and optimizer state of the rank's parameters as ZeRO shards them
  (:meth:`nest.cost.state.ModelState.state_bytes`), plus what its layers keep resident beside
  them (:func:`resident_bytes`: the FP8 weight copies), counted with the weights;
- stored activations: per layer, what its mode keeps for the backward (Korthikanti et al.,
  "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023, §4-5), times the
  microbatches in flight (:func:`nest.cost.pipeline.in_flight_microbatches`);
- transient: the largest single-layer buffer alive at the rank's peak (:func:`peak_bytes`): a
  recomputed block's full activations during its backward (``act_none - act_mode``), the bf16
  logits of the head, and, under ZeRO-3, the layer's weights gathered beyond the device's shard;
- reserve: the framework's and allocator's overhead (the device preset's ``memory_reserve``).

An offloaded optimizer (:attr:`nest.core.plan.ParallelConfig.optimizer_offload`) keeps its
state in host memory: the device's optimizer term is 0 and the report carries the host's bytes
apart (:meth:`nest.core.report.MemoryReport.host_terms`).
"""

from nest.core.axes import Recompute
from nest.core.layers import LayerCost
from nest.core.report import MemoryReport
from nest.cost.compute import layer_mode
from nest.cost.state import ModelState


def stored_bytes(cost: LayerCost, mode: Recompute, is_block: bool) -> float:
    """Activation bytes this layer keeps per microbatch until its backward."""
    return cost.act_bytes[layer_mode(mode, is_block)]


def resident_bytes(cost: LayerCost, state: ModelState) -> float:
    """Bytes this layer keeps all iteration beside its parameters' state (the FP8 weight and
    its transpose, :mod:`nest.core.precision`); none under ZeRO-3, which gathers the weights
    for each use and frees them after."""
    return cost.resident_bytes if state.zero_stage < 3 else 0.0


def peak_bytes(cost: LayerCost, mode: Recompute, is_block: bool, state: ModelState) -> float:
    """Bytes alive only while this layer runs, beyond the stored activations (module
    docstring)."""
    lm = layer_mode(mode, is_block)
    peak = cost.transient_bytes
    if lm is not Recompute.NONE:
        peak += cost.act_bytes[Recompute.NONE] - cost.act_bytes[lm]
    return peak + state.gathered_bytes(cost.dense_params, cost.expert_params)


def rank_memory_bytes(state_bytes, stored, in_flight, peak, reserve_bytes):
    """Per-device total (scalars or numpy arrays): state + stored x in-flight + peak + reserve."""
    return state_bytes + stored * in_flight + peak + reserve_bytes


def rank_memory(
    state: ModelState,
    layers: list[tuple[LayerCost, Recompute, bool]],
    *,
    dense_params: float,
    expert_params: float,
    in_flight: float,
    reserve_bytes: float,
    capacity_bytes: float,
) -> MemoryReport:
    """Memory of one device of a pipeline rank holding ``layers`` ((cost, stage mode, is block)
    per layer of all its chunks) and these parameters (dense with a tied-embedding copy)."""
    stored = sum(stored_bytes(cost, mode, blk) for cost, mode, blk in layers)
    transient, comm = max(
        (
            peak_bytes(cost, mode, blk, state),
            state.gathered_bytes(cost.dense_params, cost.expert_params),
        )
        for cost, mode, blk in layers
    )
    resident = sum(resident_bytes(cost, state) for cost, _, _ in layers)
    return MemoryReport(
        weights_bytes=state.weights_bytes(dense_params, expert_params) + resident,
        grads_bytes=state.grads_bytes(dense_params, expert_params),
        optimizer_bytes=state.optimizer_bytes(dense_params, expert_params),
        activations_bytes=stored * in_flight,
        transient_bytes=transient,
        reserve_bytes=reserve_bytes,
        total_bytes=rank_memory_bytes(
            state.state_bytes(dense_params, expert_params) + resident,
            stored,
            in_flight,
            transient,
            reserve_bytes,
        ),
        capacity_bytes=capacity_bytes,
        in_flight_microbatches=in_flight,
        activations_per_microbatch_bytes=stored,
        fp8_copies_bytes=resident,
        comm_buffers_bytes=comm,
        host_optimizer_bytes=state.host_optimizer_bytes(dense_params, expert_params),
    )
