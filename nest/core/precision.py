"""Training precision: BF16, or FP8 GEMMs with a scaling recipe.

What FP8 changes in the cost model (each term in :mod:`nest.core.layers` and
:mod:`nest.cost.state`), following Transformer Engine as Megatron-Core runs it
(docs/plan/precision.md gives the sources of every item):

- **Which GEMMs.** The linear layers of the transformer blocks (QKV or MLA's projections, the
  attention output projection, FC1/FC2, routed and shared experts, the MTP block) run their
  forward, data-gradient and weight-gradient GEMMs in FP8 (E4M3 forward, E5M2 gradients: the
  "hybrid" format). The attention core (FlashAttention/cuDNN), the LM head, the embedding and the
  router stay in BF16 (Transformer Engine's FP8 attention is off by default).
- **Speed.** An FP8 GEMM runs at the device's FP8 peak times its FP8 GEMM ceiling (a published
  micro-benchmark, :attr:`nest.core.hardware.Device.fp8_gemm_ceiling`), scaled by the same
  in-step fraction as BF16 GEMMs; its operands are one byte.
- **Casts.** Each FP8 GEMM input that no normalisation produced already in FP8 is quantised by
  a memory-bound kernel: read ``p`` bytes, write one FP8 byte and its transposed copy (the
  weight-gradient GEMM needs the transpose on Hopper), per element; the backward quantises every
  output gradient the same way. Per-tensor *current* scaling (``tensorwise``) first reads the
  tensor once more for its absolute maximum; ``delayed`` scaling uses the previous iterations'
  maxima and ``blockwise``/``mxfp8`` compute their block scales inside the cast.
- **Weights.** Transformer Engine casts each weight to FP8 once per iteration (cached across
  microbatches), keeping the FP8 weight and its transpose: two more bytes per FP8-GEMM parameter
  held all iteration, beside the BF16 weight. With FP8 parameters (Megatron's
  ``--fp8-param-gather``) the FP8 copy is the model weight: no extra resident bytes, and the
  distributed optimizer all-gathers one byte per parameter instead of two.
- **Activations.** The inputs of FP8 GEMMs are saved for the backward in FP8 (one byte); the
  rest (norm inputs, Q/K/V for the attention kernel, the MLP's pre-activation) stay BF16.
"""

from dataclasses import dataclass
from enum import StrEnum

from nest.core.errors import UserError


class Format(StrEnum):
    BF16 = "bf16"
    FP8 = "fp8"


class Fp8Recipe(StrEnum):
    """How FP8 tensors are scaled (Megatron-LM ``--fp8-recipe``)."""

    DELAYED = "delayed"  # per-tensor scale from an amax history (Transformer Engine default)
    TENSORWISE = "tensorwise"  # per-tensor current scaling: an extra amax pass per cast
    BLOCKWISE = "blockwise"  # 1x128 activation / 128x128 weight blocks (DeepSeek-V3 §3.3)
    MXFP8 = "mxfp8"  # 32-element blocks with E8M0 scales: Blackwell only


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision:
    """The precision of a run's GEMMs (module docstring)."""

    format: Format = Format.BF16
    recipe: Fp8Recipe = Fp8Recipe.DELAYED
    param_gather: bool = False
    """FP8 primary weights (Megatron ``--fp8-param-gather``): no cached FP8 copy, FP8 all-gather."""

    @classmethod
    def parse(cls, precision: str, recipe: str, param_gather: bool) -> "Precision":
        """From the training options, or a one-line error naming the value and the choices."""
        try:
            fmt = Format(precision)
        except ValueError:
            raise UserError(
                f"training.precision={precision!r}; use one of {[f.value for f in Format]}"
            ) from None
        try:
            rec = Fp8Recipe(recipe)
        except ValueError:
            raise UserError(
                f"training.fp8_recipe={recipe!r}; use one of {[r.value for r in Fp8Recipe]}"
            ) from None
        if param_gather and fmt is not Format.FP8:
            raise UserError(
                "training.fp8_param_gather=true needs training.precision=fp8; set one of them"
            )
        return cls(format=fmt, recipe=rec, param_gather=bool(param_gather))

    @property
    def fp8(self) -> bool:
        return self.format is Format.FP8

    @property
    def cast_bytes_per_element(self) -> float:
        """HBM bytes one cast of a BF16 tensor to FP8 moves per element (module docstring):
        read 2, write the FP8 value and its transpose, plus an amax read under current
        scaling; 0 in BF16."""
        if not self.fp8:
            return 0.0
        extra = 2.0 if self.recipe is Fp8Recipe.TENSORWISE else 0.0
        return 2.0 + 2.0 + extra

    @property
    def weight_cache_bytes_per_param(self) -> float:
        """Resident bytes per FP8-GEMM parameter beyond the BF16 weight (module docstring)."""
        return 2.0 if self.fp8 and not self.param_gather else 0.0

    @property
    def gathered_param_bytes(self) -> float | None:
        """Bytes per parameter the distributed optimizer all-gathers, when not the weight's."""
        return 1.0 if self.fp8 and self.param_gather else None

    @property
    def weight_cast_bytes_per_param(self) -> float:
        """Bytes the once-per-iteration weight cast moves per parameter (read BF16, write FP8
        and its transpose); 0 in BF16."""
        return 4.0 if self.fp8 else 0.0
