"""An accelerator: what the cost model needs to know about one device."""

from dataclasses import dataclass, field

from nest.core.errors import UserError


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator. SI units.

    Values come from datasheets; the presets under ``conf/device/`` cite them.
    """

    name: str
    peak_flops_per_s: float
    """Peak dense matmul throughput for the training dtype (bf16), FLOP/s."""
    hbm_bytes: float
    """HBM capacity, bytes."""
    hbm_bw_bytes_per_s: float
    """HBM bandwidth, bytes/s: the datasheet's (nameplate) figure."""
    hbm_efficiency: float = 1.0
    """Fraction of ``hbm_bw_bytes_per_s`` a streaming kernel achieves, in (0, 1]: from a
    published STREAM-style micro-benchmark (copy / triad) where the preset cites one, 1.0
    (nameplate) otherwise. Every memory-bound term (elementwise operators, the optimizer step,
    gradient clipping) runs at :attr:`achieved_hbm_bw_bytes_per_s`."""
    matmul_efficiency: float = 1.0
    """Achieved fraction of ``peak_flops_per_s`` a large matmul keeps inside a training step, in
    (0, 1]: every FLOP's rate (``flat``), the large-GEMM level (``shape``, capped by
    ``gemm_ceiling``; :mod:`nest.core.kernels`)."""
    memory_reserve_bytes: float = 0.0
    """Bytes unavailable to the model (CUDA context, allocator fragmentation, framework)."""
    allocator_margin_bytes: float = 0.0
    """The part of ``memory_reserve_bytes`` kept for the caching allocator's fragmentation (the
    preset's ``memory_margin`` of the HBM); the rest is outside the allocator (CUDA context, NCCL
    buffers). :mod:`nest.app.validate` uses the split to predict ``max_memory_allocated``,
    ``max_memory_reserved`` and nvidia-smi separately."""
    compute_model: str = "flat"
    """``flat`` (every FLOP at ``matmul_efficiency``) or ``shape`` (:mod:`nest.core.kernels`)."""
    sm_count: int = 0
    """Streaming multiprocessors (``shape``: the waves of GEMM tiles)."""
    gemm_ceiling: float = 1.0
    """``shape``: fraction of peak the best-shaped large GEMMs reach in a published
    micro-benchmark: the upper bound of ``matmul_efficiency``."""
    kernel_overhead_s: float = 0.0
    """``shape``: fixed seconds of every kernel (GEMM, attention and the block's memory-bound
    elementwise kernels: launch, prologue, epilogue)."""
    tile_shapes: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128))
    """``shape``: the GEMM thread-block tiles cuBLAS chooses among (``m x n`` per tile)."""
    attention_efficiency: tuple[tuple[float, float], ...] = ()
    """``shape``: (key length, fraction of peak) of the fused attention kernel, increasing
    lengths; empty: attention at ``matmul_efficiency``."""
    attention_bwd_efficiency: tuple[tuple[float, float], ...] = ()
    """``shape``: (key length, fraction of peak) of the fused attention *backward* kernel
    (its FLOPs counted as 2.5 times the forward's, :func:`nest.core.kernels.attention_bwd_time_s`),
    increasing lengths; empty: the backward at the forward's fraction."""
    fp8_peak_flops_per_s: float = 0.0
    """Peak dense FP8 matmul throughput, FLOP/s; 0: the device has no FP8 tensor cores."""
    fp8_gemm_ceiling: float = 0.0
    """Fraction of ``fp8_peak_flops_per_s`` the best-shaped large FP8 GEMMs reach in a published
    micro-benchmark (the FP8 counterpart of ``gemm_ceiling``)."""
    fp8_kernel_overhead_s: float | None = None
    """``shape``: fixed seconds of an FP8 GEMM kernel (launch, prologue, the scales' loads and
    epilogue), derived from a published FP8 GEMM table the way ``kernel_overhead_s`` is from its
    bf16 rows; None: ``kernel_overhead_s`` (no FP8 table for this chip)."""
    mxfp8: bool = False
    """The tensor cores take MXFP8 (32-element blocks with shared scales): Blackwell."""
    fp8_any_layout: bool = False
    """Per-tensor-scaled FP8 GEMMs take any operand layout, so no transposed FP8 copy is written
    (Transformer Engine ``non_tn_fp8_gemm_supported``: compute capability 10.0 and up,
    Blackwell); False: TN only (Hopper). See
    :meth:`nest.core.precision.Precision.quantized_bytes_per_element`."""
    host_link_bw_bytes_per_s: float | None = None
    """Bandwidth of the link between the device and its host's memory, bytes/s per direction
    (PCIe Gen5 x16: 64e9; GB200: 225e9, its share of the NVLink-C2C that one Grace shares with
    two B200s); the presets cite the datasheet.
    None: no host link the cost model may use (TPU presets), so nothing is offloaded to host
    memory (:mod:`nest.cost.state`, optimizer offload)."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """One-line notices about how the device was built (e.g. the compute model it fell back to),
    printed after the summary."""

    def __post_init__(self) -> None:
        for field_name in ("peak_flops_per_s", "hbm_bytes", "hbm_bw_bytes_per_s"):
            value = getattr(self, field_name)
            if not value > 0:
                raise UserError(f"device {self.name}: {field_name}={value} must be > 0")
        if not 0 < self.hbm_efficiency <= 1:
            raise UserError(
                f"device {self.name}: hbm_efficiency={self.hbm_efficiency} must be in (0, 1]"
            )
        if not 0 < self.matmul_efficiency <= 1:
            raise UserError(
                f"device {self.name}: matmul_efficiency={self.matmul_efficiency} must be in (0, 1]"
            )
        if self.compute_model not in ("flat", "shape"):
            raise UserError(
                f"device {self.name}: compute_model={self.compute_model!r}; use flat or shape"
            )
        if self.compute_model == "shape":
            if self.sm_count < 1:
                raise UserError(
                    f"device {self.name}: compute_model=shape needs sm_count >= 1 (got "
                    f"{self.sm_count}); set it or use compute_model=flat"
                )
            if not 0 < self.gemm_ceiling <= 1:
                raise UserError(
                    f"device {self.name}: gemm_ceiling={self.gemm_ceiling} must be in (0, 1]"
                )
            if self.kernel_overhead_s < 0:
                raise UserError(
                    f"device {self.name}: kernel_overhead={self.kernel_overhead_s} must be >= 0"
                )
        for table_name in ("attention_efficiency", "attention_bwd_efficiency"):
            table = getattr(self, table_name)
            lengths = [s for s, _ in table]
            if lengths != sorted(set(lengths)) or any(
                not 0 < e <= 1 or not s > 0 for s, e in table
            ):
                raise UserError(
                    f"device {self.name}: {table_name}={list(table)} must be [sequence length, "
                    "fraction in (0, 1]] pairs with increasing lengths"
                )
        if self.fp8_peak_flops_per_s < 0 or (
            self.fp8_peak_flops_per_s > 0 and not 0 < self.fp8_gemm_ceiling <= 1
        ):
            raise UserError(
                f"device {self.name}: fp8_peak_flops_per_s={self.fp8_peak_flops_per_s} needs "
                f"fp8_gemm_ceiling in (0, 1] (got {self.fp8_gemm_ceiling})"
            )
        if self.fp8_kernel_overhead_s is not None and self.fp8_kernel_overhead_s < 0:
            raise UserError(
                f"device {self.name}: fp8_kernel_overhead_s={self.fp8_kernel_overhead_s} must be "
                ">= 0, or None (the BF16 kernel overhead)"
            )
        if self.host_link_bw_bytes_per_s is not None and not self.host_link_bw_bytes_per_s > 0:
            raise UserError(
                f"device {self.name}: host_link_bw_bytes_per_s={self.host_link_bw_bytes_per_s} "
                "must be > 0, or None (no host link: no offload)"
            )
        if not 0 <= self.memory_reserve_bytes < self.hbm_bytes:
            raise UserError(
                f"device {self.name}: memory_reserve_bytes={self.memory_reserve_bytes} must be in "
                f"[0, hbm_bytes={self.hbm_bytes})"
            )
        if not 0 <= self.allocator_margin_bytes <= self.memory_reserve_bytes:
            raise UserError(
                f"device {self.name}: allocator_margin_bytes={self.allocator_margin_bytes} must "
                f"be in [0, memory_reserve_bytes={self.memory_reserve_bytes}]"
            )

    @property
    def gemm_level(self) -> float:
        """``shape``: the fraction of peak a GEMM tile runs at (:mod:`nest.core.kernels`)."""
        return min(self.matmul_efficiency, self.gemm_ceiling)

    @property
    def sustained_fraction(self) -> float:
        """``shape``: the share of an isolated kernel's measured rate kept inside a training step
        (``gemm_level / gemm_ceiling``), applied to the measured attention efficiencies."""
        return self.gemm_level / self.gemm_ceiling

    @property
    def achieved_hbm_bw_bytes_per_s(self) -> float:
        """HBM bytes/s a memory-bound kernel streams at: nameplate x ``hbm_efficiency``."""
        return self.hbm_bw_bytes_per_s * self.hbm_efficiency

    @property
    def achieved_flops_per_s(self) -> float:
        return self.peak_flops_per_s * self.matmul_efficiency

    @property
    def has_fp8(self) -> bool:
        return self.fp8_peak_flops_per_s > 0

    @property
    def fp8_level(self) -> float:
        """Fraction of the FP8 peak an FP8 GEMM tile keeps inside a training step: the FP8
        micro-benchmark ceiling times the in-step share BF16 GEMMs keep of theirs
        (``min(matmul_efficiency, gemm_ceiling) / gemm_ceiling``)."""
        return self.fp8_gemm_ceiling * self.gemm_level / self.gemm_ceiling

    @property
    def fp8_gemm_overhead_s(self) -> float:
        """``shape``: the fixed seconds of one FP8 GEMM kernel: ``fp8_kernel_overhead_s``, or the
        BF16 ``kernel_overhead_s`` where the chip has no published FP8 figure."""
        if self.fp8_kernel_overhead_s is None:
            return self.kernel_overhead_s
        return self.fp8_kernel_overhead_s

    @property
    def usable_bytes(self) -> float:
        """HBM the model may use: capacity minus the reserve."""
        return self.hbm_bytes - self.memory_reserve_bytes
