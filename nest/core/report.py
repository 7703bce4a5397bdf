"""What the evaluator returns: every term of the iteration time and of each stage's memory."""

from dataclasses import asdict, dataclass, field

from nest.core.units import GiB


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryReport:
    """Per-device memory of one pipeline rank, bytes. ``total_bytes`` is the sum of the terms
    (:meth:`terms`)."""

    weights_bytes: float
    """The device's weights, FP8 copies included (``fp8_copies_bytes`` of them)."""
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    """Stored activations of the in-flight microbatches."""
    transient_bytes: float
    """Peak short-lived buffers (recomputed layer, logits, ZeRO-3 gathered weights:
    ``comm_buffers_bytes`` of them)."""
    reserve_bytes: float
    total_bytes: float
    capacity_bytes: float
    in_flight_microbatches: float
    activations_per_microbatch_bytes: float = 0.0
    """Stored activations of one microbatch (``activations_bytes / in_flight_microbatches``)."""
    fp8_copies_bytes: float = 0.0
    """The part of ``weights_bytes`` that is FP8 weight copies and their transposes."""
    comm_buffers_bytes: float = 0.0
    """The part of ``transient_bytes`` that is communication buffers: under ZeRO-3 the weights
    gathered beyond the device's shard for the layer at the peak."""
    host_optimizer_bytes: float = 0.0
    """Optimizer state of the device's shard kept in host memory (optimizer offload:
    :meth:`nest.cost.state.ModelState.host_optimizer_bytes`); not on the device, so not in
    ``total_bytes`` (:meth:`host_terms`)."""
    host_activations_bytes: float = 0.0
    """Stored activations of the in-flight microbatches kept in host memory (activation
    offload: :func:`nest.cost.memory.host_bytes`); not in ``total_bytes``."""

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def terms(self) -> dict[str, float]:
        """The disjoint terms a user acts on, bytes, in the order a summary prints them; they sum
        to ``total_bytes``."""
        return {
            "weights": self.weights_bytes - self.fp8_copies_bytes,
            "fp8_copies": self.fp8_copies_bytes,
            "gradients": self.grads_bytes,
            "optimizer_state": self.optimizer_bytes,
            "activations": self.activations_bytes,
            "comm_buffers": self.comm_buffers_bytes,
            "transient": self.transient_bytes - self.comm_buffers_bytes,
            "reserve": self.reserve_bytes,
        }

    def host_terms(self) -> dict[str, float]:
        """What the device keeps in its host's memory instead, bytes (outside ``total_bytes``
        and the capacity check): the offloaded optimizer state and activations."""
        return {
            "optimizer_state": self.host_optimizer_bytes,
            "activations": self.host_activations_bytes,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StageReport:
    """One model chunk (= one pipeline stage unless interleaved); times per microbatch, seconds."""

    index: int
    pp_rank: int
    first_layer: int
    last_layer: int
    recompute: str
    compute_fwd_s: float
    compute_bwd_s: float
    recompute_s: float
    tp_comm_s: float
    """Tensor-parallel collectives per microbatch, all of their time (both directions)."""
    cp_comm_s: float
    ep_comm_s: float
    tp_exposed_s: float
    """The part of ``tp_comm_s`` that no overlap hides: what the stage time is charged."""
    cp_exposed_s: float
    ep_exposed_s: float
    zero3_comm_s: float
    """ZeRO-3 weight gathers and gradient reduce-scatters per microbatch, all of their time."""
    zero3_exposed_s: float
    """The part of ``zero3_comm_s`` that prefetching does not hide (:mod:`nest.cost.fsdp`)."""
    p2p_fwd_s: float
    p2p_bwd_s: float
    fwd_s: float
    """Forward time of this chunk per microbatch, communication included."""
    bwd_s: float
    """Backward time (recompute included) per microbatch."""
    wgrad_s: float = 0.0
    """The weight-gradient GEMMs' part of ``bwd_s`` (the W pass of the zero-bubble schedules,
    :func:`nest.cost.compute.wgrad_s`); the rest of ``bwd_s`` is the B pass."""
    offload_exposed_s: float = 0.0
    """Activation offload: the part of the chunk's copies to and from host memory its compute
    does not hide (:mod:`nest.cost.offload`), in ``bwd_s``."""

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def comm_total_s(self) -> float:
        """All communication of the chunk per microbatch (TP, CP, EP, ZeRO-3, p2p)."""
        return (
            self.tp_comm_s
            + self.cp_comm_s
            + self.ep_comm_s
            + self.zero3_comm_s
            + self.p2p_fwd_s
            + self.p2p_bwd_s
        )

    @property
    def comm_exposed_s(self) -> float:
        """The communication the chunk's time is charged: what overlap does not hide."""
        return (
            self.tp_exposed_s
            + self.cp_exposed_s
            + self.ep_exposed_s
            + self.zero3_exposed_s
            + self.p2p_fwd_s
            + self.p2p_bwd_s
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RankReport:
    """One pipeline rank: its chunks' times summed, its DP sync, its memory."""

    pp_rank: int
    fwd_s: float
    bwd_s: float
    wgrad_s: float = 0.0
    """The weight-gradient part of ``bwd_s`` (its chunks' ``wgrad_s``)."""
    dp_sync_s: float
    """Gradient synchronisation of this rank's parameters over its data-parallel group."""
    dp_sync_exposed_s: float
    """The part of ``dp_sync_s`` not hidden: its gradient part behind the backward left (other
    ranks' and, with overlap, its own last), its weight all-gather behind its first forward of
    the next iteration (with overlap; :func:`nest.cost.pipeline.rank_exposed_sync_s`)."""
    optimizer_s: float
    memory: MemoryReport
    dp_gather_s: float = 0.0
    """The ZeRO-1/2 weight all-gather part of ``dp_sync_s`` (after the optimizer step; the rest is
    the gradient reduction, :meth:`nest.cost.state.ModelState.gather_s`)."""

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def dp_reduce_s(self) -> float:
        """The gradient part of ``dp_sync_s`` (all of it but the weight all-gather): what must
        end before the optimizer step, so only the backward hides it."""
        return self.dp_sync_s - self.dp_gather_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """The shared evaluation of one plan on one problem."""

    feasible: bool
    violation: str | None
    """Why the plan does not fit (None when it does)."""
    iteration_time_s: float
    pipeline_time_s: float
    """``sum_i t_i + (m - 1) max_i t_i`` (1F1B / GPipe) or its interleaved form."""
    bubble_s: float
    """``pipeline_time_s - m * max_i t_i``: idle time of the slowest rank."""
    dp_sync_exposed_s: float
    optimizer_s: float
    throughput_samples_per_s: float
    tokens_per_s: float
    mfu: float
    """Model FLOPs (no recompute) per second over the devices used, divided by their peak."""
    model_flops_per_iteration: float
    """Useful FLOPs of an iteration: 3 x forward, no recompute, unpadded vocabulary."""
    hardware_flops_per_iteration: float
    """FLOPs the devices execute: forward, backward and every recompute, padded vocabulary
    (what SC21 Table 1 reports as achieved TFLOP/s)."""
    devices_used: int
    devices_idle: int
    peak_memory_bytes: float
    stages: tuple[StageReport, ...]
    ranks: tuple[RankReport, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        out = asdict(self)
        for rank_dict, rank in zip(out["ranks"], self.ranks, strict=True):
            rank_dict["memory"]["fits"] = rank.memory.fits
            rank_dict["memory"]["terms"] = rank.memory.terms()
            rank_dict["memory"]["host_terms"] = rank.memory.host_terms()
        return out

    def memory_summary(self) -> str:
        worst = max(self.ranks, key=lambda r: r.memory.total_bytes - r.memory.capacity_bytes)
        m = worst.memory
        return (
            f"pipeline rank {worst.pp_rank} needs {m.total_bytes / GiB:.2f} GiB of "
            f"{m.capacity_bytes / GiB:.2f} GiB (weights {m.weights_bytes / GiB:.2f}, grads "
            f"{m.grads_bytes / GiB:.2f}, optimizer {m.optimizer_bytes / GiB:.2f}, activations "
            f"{m.activations_bytes / GiB:.2f}, transient {m.transient_bytes / GiB:.2f}, reserve "
            f"{m.reserve_bytes / GiB:.2f})"
        )
