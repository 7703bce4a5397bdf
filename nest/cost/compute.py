"""What one layer adds to its stage's time per microbatch, under the stage's recompute mode.

The model (:class:`nest.core.layers.AnalyticModel`, or a measured
:class:`nest.profile.model.ProfileModel`) gives each layer's :class:`~nest.core.layers.LayerCost`
on one
device for one shard; a stage's terms
are sums over its layers of the functions here (collectives: summed per group split, then the
slowest split, :meth:`nest.cost.groups.RankGroups.axis_time_s`). Only transformer blocks are
recomputed: the embedding and the head always run in mode ``none`` and add no recompute.

- forward: ``fwd_s`` and the forward collectives;
- backward: ``bwd_s``, the mode's recompute seconds (full: the forward again; selective: the
  attention core, Korthikanti et al. 2022 §5; ``none`` may still recompute FlashAttention's
  scores) and the backward collectives plus those the recomputation repeats;
- the W pass of the zero-bubble schedules: the layers' ``wgrad_s``, the weight-gradient GEMMs'
  part of ``bwd_s`` (:attr:`~nest.core.layers.LayerCost.wgrad_s`), summed per chunk by the
  evaluator (``StageReport.wgrad_s``) and by the DP's prefix sums alike; the recompute and every
  collective belong to the B pass (:mod:`nest.cost.pipeline`);
- hardware FLOPs (what the devices execute, for MFU-with-recompute metrics): three forwards'
  matmuls plus the recomputed ones.
"""

import numpy as np

from nest.core.axes import Recompute
from nest.core.layers import Collective, LayerCost


def layer_mode(mode: Recompute, is_block: bool) -> Recompute:
    """The mode a layer of a stage in ``mode`` runs in (only blocks are recomputed)."""
    return mode if is_block else Recompute.NONE


def recompute_s(cost: LayerCost, mode: Recompute, is_block: bool) -> float:
    """Extra backward seconds of recomputing this layer."""
    return cost.recompute_s.get(mode, 0.0) if is_block else 0.0


def hiding_bwd_s(cost: LayerCost, mode: Recompute, is_block: bool) -> float:
    """Backward seconds of this layer under which ZeRO-3's re-gather of the next layer and
    reduce-scatter of the previous one run (:class:`nest.cost.fsdp.OverlapChain`): its backward
    plus its recomputation in ``mode`` (FlashAttention's ``S = QK^T`` in every mode; the whole
    forward again under full recompute). The recomputation belongs to the layer's backward:
    FSDP issues the next unit's gather from the layer's pre-backward hook and the previous
    unit's reduce-scatter after its post-backward hook, and the checkpointed forward runs
    between the two (Megatron-Core ``custom_fsdp/fully_sharded_data_parallel.py`` at
    1e057005, ``_pre_backward`` all-gathers with ``PrefetchOrder.BACKWARD_PASS_ORDER`` and
    ``_pre_forward_param_unshard`` only cancels the *forward* prefetch inside the
    recomputation). Each layer's hiding time is at least its ``none`` one, and a stage's
    exposed ZeRO-3 time falls by at most the recompute seconds it adds
    (:class:`nest.cost.fsdp.OverlapChain`: each layer hides in exactly one term), so more
    recomputation never shortens a stage."""
    return cost.bwd_s + recompute_s(cost, mode, is_block)


def hardware_flops(cost: LayerCost, mode: Recompute, is_block: bool) -> float:
    """FLOPs one device executes for this layer and one microbatch: forward, backward (twice
    the forward) and the recomputation."""
    return 3.0 * cost.fwd_flops + (cost.recompute_flops.get(mode, 0.0) if is_block else 0.0)


def fwd_collectives(cost: LayerCost) -> tuple[Collective, ...]:
    return cost.fwd_collectives


def bwd_collectives(cost: LayerCost, mode: Recompute, is_block: bool) -> tuple[Collective, ...]:
    """The backward's collectives and those its recomputation repeats."""
    if not is_block:
        return cost.bwd_collectives
    return tuple(cost.bwd_collectives) + tuple(cost.recompute_collectives.get(mode, ()))


def exposed_s(time_s, coll: Collective):
    """What a collective of ``time_s`` seconds (scalar or numpy array) adds to its stage when it
    overlaps compute (:class:`~nest.core.layers.Collective`): ``max(t - hidden_by_s, min_exposed
    t)``
    plus ``slowdown * min(t, hidden_by_s)`` (all of it without overlap). Non-decreasing in
    ``t``, which the search's floors rely on."""
    if coll.hidden_by_s <= 0.0:
        return time_s
    h = coll.hidden_by_s
    return np.maximum(time_s - h, coll.min_exposed * time_s) + coll.slowdown * np.minimum(time_s, h)
