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

**Activation offload** (:attr:`nest.core.plan.ParallelConfig.activation_offload`; the layer-level
offload of Megatron-Core's ``--cpu-offloading`` / Transformer Engine's CPU offload context):
every transformer block copies what its mode stores to host memory after its forward and back
before its backward (:func:`host_bytes`), so the device stores nothing of its blocks between
the two (:func:`stored_bytes` 0; the embedding and the head keep theirs). While a block runs it
holds its own stored tensors and those of the neighbour in transit (the previous block's going
out in the forward, the next one's coming in for the backward): :data:`OFFLOAD_BUFFER_BLOCKS`
blocks' worth, counted as this block's, in its transient (:func:`peak_bytes`); exact for
identical blocks. The copies' time: :mod:`nest.cost.offload`.
"""

from nest.core.axes import Recompute
from nest.core.layers import LayerCost
from nest.core.report import MemoryReport
from nest.cost.compute import layer_mode
from nest.cost.state import ModelState

OFFLOAD_BUFFER_BLOCKS = 2
"""Blocks' stored tensors on the device while an offloaded block runs: its own and the
neighbour's in transit (module docstring)."""


def host_bytes(cost: LayerCost, mode: Recompute, is_block: bool, offload: bool = True) -> float:
    """Activation bytes this layer copies to host memory and back per microbatch under
    activation offload (a block's stored tensors; 0 for the embedding and the head, and 0 without
    ``offload``)."""
    if not (offload and is_block):
        return 0.0
    return cost.act_bytes[layer_mode(mode, is_block)]


def stored_bytes(cost: LayerCost, mode: Recompute, is_block: bool, offload: bool = False) -> float:
    """Activation bytes this layer keeps on the device per microbatch until its backward (none
    of an offloaded block's: they wait in host memory)."""
    return cost.act_bytes[layer_mode(mode, is_block)] - host_bytes(cost, mode, is_block, offload)


def resident_bytes(cost: LayerCost, state: ModelState) -> float:
    """Bytes this layer keeps all iteration beside its parameters' state (the FP8 weight and
    its transpose, :mod:`nest.core.precision`); none under ZeRO-3, which gathers the weights
    for each use and frees them after."""
    return cost.resident_bytes if state.zero_stage < 3 else 0.0


def peak_bytes(
    cost: LayerCost, mode: Recompute, is_block: bool, state: ModelState, offload: bool = False
) -> float:
    """Bytes alive only while this layer runs, beyond the stored activations (module
    docstring): with activation offload, also the offloaded blocks' buffer."""
    lm = layer_mode(mode, is_block)
    peak = cost.transient_bytes
    if lm is not Recompute.NONE:
        peak += cost.act_bytes[Recompute.NONE] - cost.act_bytes[lm]
    peak += OFFLOAD_BUFFER_BLOCKS * host_bytes(cost, mode, is_block, offload)
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
    offload: bool = False,
) -> MemoryReport:
    """Memory of one device of a pipeline rank holding ``layers`` ((cost, stage mode, is block)
    per layer of all its chunks) and these parameters (dense with a tied-embedding copy);
    ``offload``: activation offload (module docstring)."""
    stored = sum(stored_bytes(cost, mode, blk, offload) for cost, mode, blk in layers)
    host = sum(host_bytes(cost, mode, blk, offload) for cost, mode, blk in layers)
    transient, comm = max(
        (
            peak_bytes(cost, mode, blk, state, offload),
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
        host_activations_bytes=host * in_flight,
    )
