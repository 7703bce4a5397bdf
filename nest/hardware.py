"""An accelerator: what the cost model needs to know about one device."""

from dataclasses import dataclass

from nest.errors import UserError


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
    """HBM bandwidth, bytes/s (the optimizer step is bound by it)."""
    matmul_efficiency: float = 1.0
    """Achieved fraction of ``peak_flops_per_s`` on the model's matmuls, in (0, 1]."""
    memory_reserve_bytes: float = 0.0
    """Bytes unavailable to the model (CUDA context, allocator fragmentation, framework)."""

    def __post_init__(self) -> None:
        for field_name in ("peak_flops_per_s", "hbm_bytes", "hbm_bw_bytes_per_s"):
            value = getattr(self, field_name)
            if not value > 0:
                raise UserError(f"device {self.name}: {field_name}={value} must be > 0")
        if not 0 < self.matmul_efficiency <= 1:
            raise UserError(
                f"device {self.name}: matmul_efficiency={self.matmul_efficiency} must be in (0, 1]"
            )
        if not 0 <= self.memory_reserve_bytes < self.hbm_bytes:
            raise UserError(
                f"device {self.name}: memory_reserve_bytes={self.memory_reserve_bytes} must be in "
                f"[0, hbm_bytes={self.hbm_bytes})"
            )

    @property
    def achieved_flops_per_s(self) -> float:
        return self.peak_flops_per_s * self.matmul_efficiency

    @property
    def usable_bytes(self) -> float:
        """HBM the model may use: capacity minus the reserve."""
        return self.hbm_bytes - self.memory_reserve_bytes
