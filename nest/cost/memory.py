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

**Partial activation offload** (:attr:`nest.core.plan.ParallelConfig.activation_offload_blocks`
``= N``, Megatron-Core's ``--cpu-offloading-num-layers N``, one pipeline rank): only the first
``N`` of the chunk's ``L`` blocks copy their stored tensors out (:func:`offloaded_layers`); the
others keep theirs on the device. Transformer Engine offloads block ``i`` on a side stream after
its forward and frees it once the copy is awaited a few blocks later, so at the end of the
forward the device holds the ``L - N`` kept blocks and at most one offloaded block in transit:
TE v2.7 (github:NVIDIA/TransformerEngine@v2.7:transformer_engine/pytorch/cpu_offload.py;
Megatron-Bridge v0.1.0rc3, the 25.09 rows', needs TE >= 2.6, < 2.8, whose
``AsyncDoubleBufferGroupOffloadHandler`` windows are the same) awaits block ``i``'s copy at
block ``layer_window_map[i]``, the last one's at block ``L - 1``, when the kept blocks are all
stored, and reloads symmetrically in the backward, block ``i`` ahead of its backward. That block,
:data:`OFFLOAD_TRANSIT_BLOCKS`, is counted in the offloaded blocks' transient. TE v2.14
(github:NVIDIA/TransformerEngine@366798ef, the 26.04.01 container's; ``DefaultOffloadSynchronizer``)
frees block ``i`` before block ``L - N + i`` runs, a peak of ``L - N`` blocks by its docstring,
one block under this count. Weights stay on the device (the recipes set
``cpu_offloading_weights = False``, and both TE versions ignore weight offload). ``N`` equal to
the chunk's blocks is the all-blocks case above.
"""

from nest.core.axes import Recompute
from nest.core.layers import LayerCost
from nest.core.report import MemoryReport
from nest.cost.compute import layer_mode
from nest.cost.state import ModelState

OFFLOAD_BUFFER_BLOCKS = 2
"""Blocks' stored tensors on the device while an offloaded block runs: its own and the
neighbour's in transit (module docstring)."""


OFFLOAD_TRANSIT_BLOCKS = 1
"""Offloaded blocks' stored tensors on the device beyond the kept blocks under a partial offload:
the one in transit (module docstring)."""


def offloaded_layers(
    layers: list[tuple[LayerCost, Recompute, bool]], offload: bool, offload_blocks: int | None
) -> tuple[list[bool], int]:
    """Per layer of a chunk, whether it copies its stored tensors to the host (the first
    ``offload_blocks`` blocks, every block when None), and the blocks' worth of those tensors the
    device holds while one runs (:data:`OFFLOAD_BUFFER_BLOCKS` when every block offloads,
    :data:`OFFLOAD_TRANSIT_BLOCKS` when some stay; module docstring)."""
    flags, seen = [], 0
    for _, _, blk in layers:
        flags.append(offload and blk and (offload_blocks is None or seen < offload_blocks))
        seen += blk
    every = offload_blocks is None or offload_blocks >= seen
    return flags, OFFLOAD_BUFFER_BLOCKS if every else OFFLOAD_TRANSIT_BLOCKS


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
    cost: LayerCost,
    mode: Recompute,
    is_block: bool,
    state: ModelState,
    offload: bool = False,
    buffer_blocks: int = OFFLOAD_BUFFER_BLOCKS,
) -> float:
    """Bytes alive only while this layer runs, beyond the stored activations (module
    docstring): with activation offload, also the offloaded blocks' buffer (``buffer_blocks``
    blocks' worth: :func:`offloaded_layers`)."""
    lm = layer_mode(mode, is_block)
    peak = cost.transient_bytes
    if lm is not Recompute.NONE:
        peak += cost.act_bytes[Recompute.NONE] - cost.act_bytes[lm]
    peak += buffer_blocks * host_bytes(cost, mode, is_block, offload)
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
    offload_blocks: int | None = None,
) -> MemoryReport:
    """Memory of one device of a pipeline rank holding ``layers`` ((cost, stage mode, is block)
    per layer of all its chunks) and these parameters (dense with a tied-embedding copy);
    ``offload``: activation offload, of the first ``offload_blocks`` blocks (None: all; a count
    is defined for a rank of one chunk: module docstring)."""
    flags, buffer = offloaded_layers(layers, offload, offload_blocks)
    stored = sum(
        stored_bytes(cost, mode, blk, off)
        for (cost, mode, blk), off in zip(layers, flags, strict=True)
    )
    host = sum(
        host_bytes(cost, mode, blk, off)
        for (cost, mode, blk), off in zip(layers, flags, strict=True)
    )
    transient, comm = max(
        (
            peak_bytes(cost, mode, blk, state, off, buffer),
            state.gathered_bytes(cost.dense_params, cost.expert_params),
        )
        for (cost, mode, blk), off in zip(layers, flags, strict=True)
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
