"""Model state: where a device's weights, gradients and optimizer state live, and what keeping,
synchronising and updating them costs.

Mixed-precision Adam keeps ``p + g + 12`` bytes per parameter (bf16 weights, bf16 gradients, fp32
master weights, m and v: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC20, §3.1); SGD keeps no optimizer state. Dense weights are replicated over
the ``dp x cp`` ranks (Megatron-Core shards its distributed optimizer over data x context
ranks), expert weights over the ``dp x cp / ep`` expert-data-parallel ranks. ZeRO (SC20, §5)
shards over those groups: stage 1 the optimizer state, stage 2 also the gradients, stage 3 also
the weights.

- **Synchronisation** per iteration (:meth:`ModelState.sync_s`): ZeRO-0 all-reduces the
  gradients; ZeRO-1/2 reduce-scatter the gradients and all-gather the updated weights
  (Megatron-Core's distributed optimizer); ZeRO-3 reduce-scatters every microbatch instead
  (:meth:`ModelState.zero3_traffic_s`), so its end-of-iteration sync is 0. Dense and expert
  weights sync over their own groups (:class:`nest.cost.groups.RankGroups`), the two one after
  the other. The sync is two parts that hide under different compute: the gradient part
  (:meth:`ModelState.reduce_s`) ends before the optimizer step, so only the backward can hide
  it; the weight all-gather (:meth:`ModelState.gather_s`) follows the step and hides only under
  the next iteration's forward (:func:`nest.cost.pipeline.rank_exposed_sync_s`).
- **ZeRO-3 traffic** per microbatch: each layer's weights all-gathered before its forward and
  again before its backward (not again with ``reshard_after_forward`` off), its gradients
  reduce-scattered after it (:meth:`ModelState.zero3_layer_s`); what the stage time is charged
  is what prefetching does not hide (:mod:`nest.cost.fsdp`). With ``reshard_after_forward`` off
  the stage's gathered weights stay in memory (:meth:`ModelState.unsharded_bytes`, counted with
  the weights).
- **Optimizer step** (:meth:`ModelState.optimizer_step_s`): memory-bound, the bytes the update
  touches per parameter of the device's shard over HBM bandwidth: Adam reads and writes the fp32
  state (``2 x 12``), reads the gradient and writes the bf16 weight (``g + p``); SGD reads the
  gradient and reads and writes the weight (``g + 2 p``). FP8 training adds the weight's cast
  to FP8 and its transpose (:attr:`ModelState.cast_bytes_per_param`, :mod:`nest.core.precision`).
  Gradient clipping by the global norm runs before it on the same shard
  (:data:`CLIP_GRAD_READS`: Megatron-Core ``clip_grad_norm_fp32`` reads every gradient of the
  shard once for the norm, a multi-tensor L2-norm kernel; its scale pass runs only when the norm
  exceeds the threshold and is not charged). Both are memory-bound kernels at the device's
  *achieved* HBM bandwidth (:attr:`nest.core.hardware.Device.achieved_hbm_bw_bytes_per_s`).
- **Optimizer offload** (:attr:`nest.core.plan.ParallelConfig.optimizer_offload`; Megatron-Core
  ``--optimizer-cpu-offload`` with its ``HybridDeviceOptimizer``, DeepSpeed ZeRO-Offload: Ren
  et al., USENIX ATC 2021, §4): the optimizer state of the device's shard (its ZeRO-1+ shard,
  or every parameter at ZeRO-0) lives in host memory, so the device holds none of it
  (:meth:`ModelState.optimizer_bytes` 0, :meth:`ModelState.host_optimizer_bytes` the bytes
  moved); its step copies the shard's gradients to the host (``g`` bytes per parameter), runs
  Adam on the host CPU (:attr:`nest.core.problem.Training.cpu_adam_params_per_s`) and copies
  the updated weights back (``p`` bytes per parameter), each copy over the device's host link
  (:attr:`nest.core.hardware.Device.host_link_bw_bytes_per_s`, one direction each). The three
  run one after the other, after the backward, in place of the HBM step
  (:meth:`ModelState.offload_step_s`): Megatron's ``--overlap-cpu-optimizer-d2h-h2d`` and
  ZeRO-Offload's overlap of the gradient copy with the backward are not modelled (the exports
  leave the overlap off). Gradient clipping and the FP8 cast stay on the device's HBM.

**Hybrid sharding** (HSDP, :attr:`nest.core.plan.ParallelConfig.zero_shard`): the state is
sharded over the ``zero_shard x cp`` ranks of a shard group (:attr:`ModelState.dense_replicas`
is that group's size; experts over the ``zero_shard x cp x (tp / etp) / ep`` ranks of the group
holding the same experts, :attr:`ModelState.expert_replicas`) and replicated over the
``dp / zero_shard`` groups (:attr:`ModelState.zero_replicas`). Gradients are reduce-scattered in
the shard group and the reduced shard, ``1 / (zero_shard x cp)`` of them, is all-reduced over
the replicate group; the updated weights are all-gathered in the shard group. Sources: PyTorch
FSDP2 ``fully_shard`` with a 2-D ``(replicate, shard)`` mesh (torchtitan
``data_parallel_replicate_degree`` x ``data_parallel_shard_degree``, ``docs/fsdp.md``: "HSDP",
the FSDP1 ``HYBRID_SHARD`` strategy: reduce-scatter within the shard group, all-reduce across
replicas; FSDP2 ``set_requires_all_reduce`` defers the all-reduce to the last microbatch of a
gradient-accumulation step, what is charged here: once per iteration); Megatron-Core
``--num-distributed-optimizer-instances`` (``megatron/core/distributed/
param_and_grad_buffer.py``: the gradient buffer is reduce-scattered inside an instance, then
all-reduced across instances, ``intra_distributed_optimizer_instance_group`` and
``inter_distributed_optimizer_instance_group``). ZeRO-3's per-microbatch gathers and
reduce-scatters run in the shard group; its replicate all-reduce is the end-of-iteration sync.

Every method is linear in the parameter counts and works on scalars and numpy arrays alike: the
evaluator calls it on one stage, the DP on a row of candidate stages, the bounds on one
parameter.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nest.core.axes import CollectiveOp, GroupKind, ZeroStage
from nest.cost.fsdp import OverlapChain
from nest.cost.groups import RankGroups

CLIP_GRAD_READS = 1
"""Passes over the gradient shard gradient clipping makes every iteration: one, the global L2
norm (Megatron-Core ``megatron/core/optimizer/clip_grads.py``, ``get_grad_norm_fp32``:
``multi_tensor_l2norm`` over the gradients; ``clip_grad_by_total_norm_fp32`` scales them only
when ``max_norm / total_norm < 1``). Megatron-LM and NeMo clip by default (``--clip-grad 1.0``,
``gradient_clip_val: 1.0``)."""


def can_offload_optimizer(problem) -> bool:
    """Whether a plan may offload the optimizer state: the device has a host link and the
    optimizer keeps state (Adam; SGD has none to move)."""
    return (
        problem.cluster.device.host_link_bw_bytes_per_s is not None
        and problem.training.optimizer_state_bytes_per_param > 0
    )


def per_param(term: Callable, *args) -> tuple[float, float]:
    """``term(dense, expert, *args)``'s coefficients per dense and per expert parameter: every
    :class:`ModelState` term below is linear in the two counts, so searches that price many
    stages multiply these instead of calling the term."""
    return term(1.0, 0.0, *args), term(0.0, 1.0, *args)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelState:
    """The state terms of one configuration (module docstring)."""

    zero_stage: ZeroStage
    dense_replicas: int
    """Ranks holding the same dense weights: ``dp x cp``."""
    expert_replicas: int
    """Ranks holding the same experts: ``dp x cp x fold / ep`` (``fold = tp / etp``)."""
    param_bytes: int
    grad_bytes: int
    optimizer_bytes_per_param: int
    """Optimizer state per parameter (12 for mixed-precision Adam, 0 for SGD)."""
    gather_bytes: float | None = None
    """Bytes per parameter the weights are all-gathered in when not ``param_bytes`` (FP8
    primary weights: 1; :mod:`nest.core.precision`)."""
    cast_bytes_per_param: float = 0.0
    """HBM bytes per parameter of the once-per-iteration FP8 weight cast, charged with the
    optimizer step (exact for FP8 primary weights, cast on the shard after the update;
    otherwise the cast of the whole weight at the first microbatch, approximated on the shard)."""
    reshard_after_forward: bool = True
    """ZeRO-3 re-gathers the weights for the backward (:attr:`nest.core.problem.Training.
    reshard_after_forward`)."""
    prefetch_params: float | None = None
    """ZeRO-3: parameter elements fetched ahead of use (DeepSpeed ``stage3_prefetch_bucket_size``;
    None: a whole unit, FSDP2); :mod:`nest.cost.fsdp`."""
    zero3_overlap: bool = True
    """ZeRO-3's collectives may run under compute (:attr:`nest.core.problem.Training.
    zero3_runtime` ``prefetch``); False: none does (``synchronous``, :mod:`nest.cost.fsdp`)."""
    zero_replicas: int = 1
    """Hybrid sharding: the copies of each shard, ``dp / zero_shard`` (1: the state is sharded
    over all ``dp x cp`` ranks). Above 1, :attr:`dense_replicas` and :attr:`expert_replicas`
    are the shard group's ``zero_shard x cp`` ranks (module docstring)."""
    optimizer_offload: bool = False
    """The optimizer state and step live on the host (module docstring)."""
    host_link_bw_bytes_per_s: float | None = None
    """The device's host link, bytes/s per direction (needed when ``optimizer_offload``)."""
    cpu_adam_params_per_s: float = 0.0
    """Parameters per second the host CPU updates for this device (``optimizer_offload``)."""

    def __post_init__(self) -> None:
        if self.optimizer_offload and not (
            self.host_link_bw_bytes_per_s and self.cpu_adam_params_per_s > 0
        ):
            raise ValueError("optimizer offload needs a host link and a CPU-Adam rate")

    @classmethod
    def of(
        cls,
        problem,
        *,
        zero_stage: int,
        dp: int,
        cp: int,
        ep: int,
        fold: int = 1,
        optimizer_offload: bool = False,
        zero_shard: int | None = None,
    ) -> "ModelState":
        """``fold``: :attr:`nest.core.plan.ParallelConfig.expert_fold` (``tp / etp``);
        ``optimizer_offload``: :attr:`nest.core.plan.ParallelConfig.optimizer_offload`;
        ``zero_shard``: :attr:`nest.core.plan.ParallelConfig.zero_shard` (None: all ``dp``)."""
        training = problem.training
        numerics = training.numerics
        shard = dp if zero_shard is None else zero_shard
        return cls(
            optimizer_offload=optimizer_offload,
            host_link_bw_bytes_per_s=problem.cluster.device.host_link_bw_bytes_per_s,
            cpu_adam_params_per_s=training.cpu_adam_params_per_s,
            zero_stage=zero_stage,
            dense_replicas=shard * cp,
            expert_replicas=shard * cp * fold // ep,
            zero_replicas=dp // shard,
            param_bytes=problem.model.spec.dtype_bytes,
            grad_bytes=training.grad_bytes,
            optimizer_bytes_per_param=training.optimizer_state_bytes_per_param,
            gather_bytes=numerics.gathered_param_bytes,
            cast_bytes_per_param=numerics.weight_cast_bytes_per_param(
                problem.cluster.device.fp8_any_layout
            ),
            reshard_after_forward=training.reshard_after_forward,
            prefetch_params=training.zero3_prefetch_params,
            zero3_overlap=training.zero3_runtime != "synchronous",
        )

    @property
    def all_gather_bytes(self) -> float:
        """Bytes per parameter the weights are all-gathered in."""
        return self.param_bytes if self.gather_bytes is None else self.gather_bytes

    def local_params(self, dense, expert, sharded: bool):
        """Parameters of some state one device keeps: all of them, or its shard when ZeRO
        shards that state."""
        if not sharded:
            return dense + expert
        return dense / self.dense_replicas + expert / self.expert_replicas

    def weights_bytes(self, dense, expert):
        """The device's weights: its shard under ZeRO-3, plus what stays gathered from the
        forward to the backward (:meth:`unsharded_bytes`)."""
        return self.param_bytes * self.local_params(
            dense, expert, self.zero_stage >= 3
        ) + self.unsharded_bytes(dense, expert)

    def unsharded_bytes(self, dense, expert):
        """ZeRO-3 without ``reshard_after_forward``: the stage's weights beyond the device's
        shard, gathered in the forward and kept until the backward (FSDP2
        ``reshard_after_forward=False``); 0 otherwise."""
        if self.zero_stage < 3 or self.reshard_after_forward:
            return 0.0 * (dense + expert)
        own = self.local_params(dense, expert, True)
        return self.param_bytes * (self.local_params(dense, expert, False) - own)

    def grads_bytes(self, dense, expert):
        return self.grad_bytes * self.local_params(dense, expert, self.zero_stage >= 2)

    def optimizer_bytes(self, dense, expert):
        """The optimizer state on the device: its shard's, or none when offloaded."""
        if self.optimizer_offload:
            return 0.0 * (dense + expert)
        return self.optimizer_bytes_per_param * self.local_params(
            dense, expert, self.zero_stage >= 1
        )

    def host_optimizer_bytes(self, dense, expert):
        """The optimizer state the device's shard keeps in host memory (0 unless offloaded)."""
        if not self.optimizer_offload:
            return 0.0 * (dense + expert)
        return self.optimizer_bytes_per_param * self.local_params(
            dense, expert, self.zero_stage >= 1
        )

    def state_bytes(self, dense, expert):
        """Weights + gradients + optimizer state one device keeps for these parameters."""
        return (
            self.weights_bytes(dense, expert)
            + self.grads_bytes(dense, expert)
            + self.optimizer_bytes(dense, expert)
        )

    def state_bytes_per_param(self) -> tuple[float, float]:
        """Bytes one device keeps per dense and per expert parameter: :meth:`state_bytes`'s
        coefficients under this ZeRO stage and these replica counts."""
        return per_param(self.state_bytes)

    def gathered_bytes(self, dense, expert):
        """ZeRO-3: a layer's weights gathered beyond the device's own shard while it runs
        (0 below stage 3, and without ``reshard_after_forward``, where they are counted with the
        weights: :meth:`unsharded_bytes`)."""
        if self.zero_stage < 3 or not self.reshard_after_forward:
            return 0.0 * (dense + expert)
        own = self.local_params(dense, expert, True)
        return self.param_bytes * (self.local_params(dense, expert, False) - own)

    def bytes_touched_per_param(self) -> int:
        """HBM bytes the optimizer step and gradient clipping read and write per parameter of
        the shard (module docstring)."""
        clip = CLIP_GRAD_READS * self.grad_bytes
        if self.optimizer_bytes_per_param == 0:
            # SGD: read g, read and write w
            return self.grad_bytes + 2 * self.param_bytes + self.cast_bytes_per_param + clip
        return (
            2 * self.optimizer_bytes_per_param
            + self.grad_bytes
            + self.param_bytes
            + self.cast_bytes_per_param
            + clip
        )

    def optimizer_step_s(self, dense, expert, hbm_bw_bytes_per_s: float):
        """Seconds of the optimizer step (with gradient clipping) of a device holding these
        parameters, at ``hbm_bw_bytes_per_s`` (the device's achieved HBM bandwidth); offloaded:
        the clipping and the FP8 cast on the device plus :meth:`offload_step_s`."""
        local = self.local_params(dense, expert, self.zero_stage >= 1)
        if not self.optimizer_offload:
            return local * self.bytes_touched_per_param() / hbm_bw_bytes_per_s
        on_device = CLIP_GRAD_READS * self.grad_bytes + self.cast_bytes_per_param
        return local * on_device / hbm_bw_bytes_per_s + self.offload_step_s(dense, expert)

    def offload_step_s(self, dense, expert):
        """Offloaded optimizer step of a device holding these parameters, seconds: its shard's
        gradients to the host, Adam on the host CPU, the updated weights back (module
        docstring); 0 when not offloaded."""
        if not self.optimizer_offload:
            return 0.0 * (dense + expert)
        local = self.local_params(dense, expert, self.zero_stage >= 1)
        copies = local * (self.grad_bytes + self.param_bytes) / self.host_link_bw_bytes_per_s
        return copies + local / self.cpu_adam_params_per_s

    @property
    def hybrid(self) -> bool:
        """Hybrid sharding: the shard is replicated over ``zero_replicas > 1`` groups."""
        return self.zero_replicas > 1

    def sync_s(self, groups: RankGroups, dense, expert):
        """End-of-iteration data-parallel synchronisation of a rank holding these parameters
        (dense including a tied-embedding copy), seconds: :meth:`reduce_s` then
        :meth:`gather_s`."""
        return self.reduce_s(groups, dense, expert) + self.gather_s(groups, dense, expert)

    def reduce_s(self, groups: RankGroups, dense, expert):
        """The gradient part of :meth:`sync_s`, seconds: ZeRO-0's all-reduce, ZeRO-1/2's
        reduce-scatter (hybrid: and the replicate all-reduce of the shard; ZeRO-3 hybrid: that
        all-reduce alone); 0 under plain ZeRO-3. It must end before the optimizer step, so it
        hides only under the backward (:func:`nest.cost.pipeline.rank_exposed_sync_s`)."""
        g = self.grad_bytes
        if self.hybrid:
            return self._hybrid_reduce_s(
                groups, dense, self.dense_replicas, GroupKind.ZERO_SHARD, GroupKind.ZERO_REPLICATE
            ) + self._hybrid_reduce_s(
                groups,
                expert,
                self.expert_replicas,
                GroupKind.EXPERT_ZERO_SHARD,
                GroupKind.EXPERT_ZERO_REPLICATE,
            )
        if self.zero_stage == 0:
            return groups.time_s(
                CollectiveOp.ALL_REDUCE, g * dense, GroupKind.DENSE_DP
            ) + groups.time_s(CollectiveOp.ALL_REDUCE, g * expert, GroupKind.EXPERT_DP)
        if self.zero_stage in (1, 2):
            return groups.time_s(
                CollectiveOp.REDUCE_SCATTER, g * dense, GroupKind.DENSE_DP
            ) + groups.time_s(CollectiveOp.REDUCE_SCATTER, g * expert, GroupKind.EXPERT_DP)
        return 0.0 * (dense + expert)  # ZeRO-3 reduce-scatters every microbatch

    def gather_s(self, groups: RankGroups, dense, expert):
        """The weight part of :meth:`sync_s`, seconds: ZeRO-1/2's all-gather of the updated
        weights (in the shard group when hybrid), after the optimizer step; 0 for ZeRO-0 and
        ZeRO-3. Megatron-Core's distributed optimizer launches it after the step and, with
        ``--overlap-param-gather``, hides it under the next iteration's forward
        (NVIDIA/Megatron-LM@baf94af3c667 (core_r0.8.0):
        ``megatron/core/optimizer/distrib_optimizer.py``: ``zero_grad`` dispatches the first
        bucket's all-gather "before forward compute is initiated", the forward pre-hook waits
        for each bucket and launches the next; :func:`nest.cost.pipeline.rank_exposed_sync_s`)."""
        if self.zero_stage not in (1, 2):
            return 0.0 * (dense + expert)
        p = self.all_gather_bytes
        if self.hybrid:
            return groups.time_s(
                CollectiveOp.ALL_GATHER, p * dense, GroupKind.ZERO_SHARD
            ) + groups.time_s(CollectiveOp.ALL_GATHER, p * expert, GroupKind.EXPERT_ZERO_SHARD)
        return groups.time_s(
            CollectiveOp.ALL_GATHER, p * dense, GroupKind.DENSE_DP
        ) + groups.time_s(CollectiveOp.ALL_GATHER, p * expert, GroupKind.EXPERT_DP)

    def _hybrid_reduce_s(self, groups: RankGroups, params, shards: int, shard, replicate):
        """:meth:`reduce_s` of one kind of hybrid-sharded parameters (dense or expert), their
        shard count and their two group kinds."""
        g = self.grad_bytes
        across = groups.time_s(CollectiveOp.ALL_REDUCE, g * params / shards, replicate)
        if self.zero_stage >= 3:
            return across
        return groups.time_s(CollectiveOp.REDUCE_SCATTER, g * params, shard) + across

    def zero3_layer_s(self, groups: RankGroups, dense, expert):
        """``(all-gather, reduce-scatter)`` seconds of ZeRO-3's per-microbatch traffic of one
        unit of these parameters (a layer; FSDP gathers each wrapped unit as one collective);
        ``(0, 0)`` below stage 3."""
        if self.zero_stage < 3:
            zero = 0.0 * (dense + expert)
            return zero, zero
        p, g = self.all_gather_bytes, self.grad_bytes
        dense_kind, expert_kind = GroupKind.DENSE_DP, GroupKind.EXPERT_DP
        if self.hybrid:  # within the shard groups (module docstring)
            dense_kind, expert_kind = GroupKind.ZERO_SHARD, GroupKind.EXPERT_ZERO_SHARD
        gather = groups.time_s(CollectiveOp.ALL_GATHER, p * dense, dense_kind) + groups.time_s(
            CollectiveOp.ALL_GATHER, p * expert, expert_kind
        )
        scatter = groups.time_s(CollectiveOp.REDUCE_SCATTER, g * dense, dense_kind) + groups.time_s(
            CollectiveOp.REDUCE_SCATTER, g * expert, expert_kind
        )
        return gather, scatter

    def zero3_traffic_s(self, groups: RankGroups, dense, expert):
        """``(forward, backward)`` seconds of ZeRO-3's per-microbatch traffic of a unit of
        these parameters, nothing hidden: the gather, then the backward's re-gather (unless
        ``reshard_after_forward`` is off) and the reduce-scatter; ``(0, 0)`` below stage 3."""
        gather, scatter = self.zero3_layer_s(groups, dense, expert)
        return gather, (gather if self.reshard_after_forward else 0.0 * gather) + scatter

    def zero3_chain(
        self, groups: RankGroups, dense, expert, fwd_compute_s, bwd_compute_s
    ) -> OverlapChain:
        """The per-layer ZeRO-3 overlap terms of a chain of layers (arrays of their parameters
        and compute seconds, one entry per layer): :class:`nest.cost.fsdp.OverlapChain`. Without
        :attr:`zero3_overlap` no compute hides them: the chain sees zero compute, so every
        gather and reduce-scatter is exposed (:mod:`nest.cost.fsdp`, synchronous runtime)."""
        dense, expert = np.asarray(dense, dtype=float), np.asarray(expert, dtype=float)
        if not self.zero3_overlap:
            fwd_compute_s = bwd_compute_s = np.zeros(len(fwd_compute_s))
        gather, scatter = self.zero3_layer_s(groups, dense, expert)
        n = len(fwd_compute_s)
        share = 1.0
        if self.prefetch_params is not None:
            params = dense + expert
            share = np.minimum(1.0, self.prefetch_params / np.maximum(params, 1.0))
        return OverlapChain.build(
            np.broadcast_to(gather, (n,)),
            np.broadcast_to(scatter, (n,)),
            fwd_compute_s,
            bwd_compute_s,
            reshard_after_forward=self.reshard_after_forward,
            prefetch_share=share,
        )
