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
  in-step fraction as BF16 GEMMs; its operands are one byte, and under the shape model its
  kernel pays the FP8 kernel time where a published FP8 GEMM table gives one
  (:attr:`nest.core.hardware.Device.fp8_gemm_overhead_s`: B200 and GB200).
- **Casts.** Each FP8 GEMM input that no normalisation produced already in FP8 is quantised by
  a memory-bound kernel: read ``p`` bytes, write one FP8 byte and, where FP8 GEMMs take only
  the TN layout (Hopper), its transposed copy for the other GEMM that reads it; MXFP8 and
  blockwise write a row-wise and a column-wise copy on every device, each with its block scales
  (:meth:`Precision.quantized_bytes_per_element`); the backward quantises every output gradient
  the same way. Per-tensor *current* scaling (``tensorwise``) first reads the
  tensor once more for its absolute maximum; ``delayed`` scaling uses the previous iterations'
  maxima and ``blockwise``/``mxfp8`` compute their block scales inside the cast.
- **Weights.** Transformer Engine casts each weight to FP8 once per iteration (cached across
  microbatches), keeping its FP8 copies (the weight and, on Hopper, its transpose: two more
  bytes per FP8-GEMM parameter held all iteration, one on Blackwell, beside the BF16 weight).
  With FP8 parameters (Megatron's ``--fp8-param-gather``) the FP8 copy is the model weight: no
  extra resident bytes, and the distributed optimizer all-gathers one byte per parameter
  instead of two.
- **Activations.** The inputs of FP8 GEMMs are saved for the backward in FP8 (one byte); the
  rest (norm inputs, Q/K/V for the attention kernel, the MLP's pre-activation) stay BF16.
"""

from dataclasses import dataclass
from enum import StrEnum

from nest.core.errors import UserError

MXFP8_SCALE_BYTES_PER_ELEMENT = 1.0 / 32.0
"""MXFP8's scale: one E8M0 byte per 32-element block (Transformer Engine
github:NVIDIA/TransformerEngine@c55e425ac5751c72bfa656560fc7c65ab7d895e9 (v2.2):
``pytorch/constants.py`` ``MXFP8_BLOCK_SCALING_SIZE = 32``, ``pytorch/tensor/mxfp8_tensor.py``
uint8 ``scale_inv``)."""

BLOCKWISE_SCALE_BYTES_PER_ELEMENT = 4.0 / 128.0
"""Blockwise FP8's scale: one fp32 per 128-element block (Transformer Engine
github:NVIDIA/TransformerEngine@5de3e1481cc1f5d6f7da6ac8938870b791b796db (v2.3):
``pytorch/tensor/float8_blockwise_tensor.py`` ``Float8BlockQuantizer``, ``block_len = 128``,
fp32 ``scale_inv``; the 1x128 activation tiles of DeepSeek-V3 §3.3)."""


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

    def quantized_bytes_per_element(self, any_layout: bool = False) -> float:
        """Bytes one quantisation of a tensor writes per element: its FP8 copies and their
        scales (module docstring); 0 in BF16.

        - ``delayed`` / ``tensorwise`` (one scale per tensor): the FP8 value, and its transposed
          copy where FP8 GEMMs take only the TN layout (Hopper); a device whose FP8 GEMMs take
          any layout (``any_layout``, Blackwell) writes no transpose: Transformer Engine's
          quantizer creates it only ``if columnwise_usage && !non_tn_fp8_gemm_supported()``,
          true from compute capability 10.0
          (github:NVIDIA/TransformerEngine@c55e425ac5751c72bfa656560fc7c65ab7d895e9 (v2.2):
          ``pytorch/csrc/extensions/quantizer.cpp`` l. 106 and 217, ``pytorch/utils.py``
          ``non_tn_fp8_gemm_supported``): 1 or 2;
        - ``mxfp8``: a row-wise and a column-wise copy on every device ("Row-wise and column-wise
          data are scaled along different dimensions", v2.3 ``common/gemm/cublaslt_gemm.cu``),
          each with one E8M0 byte per 32 elements (v2.2 ``pytorch/tensor/mxfp8_tensor.py``
          ``make_empty``: uint8 ``scale_inv`` and ``columnwise_scale_inv``): 2 + 2/32;
        - ``blockwise``: a row-wise and a transposed copy on every device (v2.3
          ``cublaslt_gemm.cu``: block-scaled GEMMs run TN only, "Column-wise data is transpose
          of data"), each with one fp32 scale per 128-element block
          (github:NVIDIA/TransformerEngine@5de3e1481cc1f5d6f7da6ac8938870b791b796db (v2.3):
          ``pytorch/tensor/float8_blockwise_tensor.py``, ``block_len = 128``, fp32
          ``scale_inv``): 2 + 2 x 4/128."""
        if not self.fp8:
            return 0.0
        if self.recipe is Fp8Recipe.MXFP8:
            return 2.0 + 2.0 * MXFP8_SCALE_BYTES_PER_ELEMENT
        if self.recipe is Fp8Recipe.BLOCKWISE:
            return 2.0 + 2.0 * BLOCKWISE_SCALE_BYTES_PER_ELEMENT
        return 1.0 if any_layout else 2.0

    def cast_bytes_per_element(self, any_layout: bool = False) -> float:
        """HBM bytes one cast of a BF16 tensor to FP8 moves per element (module docstring):
        read 2, write :meth:`quantized_bytes_per_element`, plus an amax read (2) under current
        scaling; 0 in BF16."""
        if not self.fp8:
            return 0.0
        extra = 2.0 if self.recipe is Fp8Recipe.TENSORWISE else 0.0
        return 2.0 + self.quantized_bytes_per_element(any_layout) + extra

    def weight_cache_bytes_per_param(self, any_layout: bool = False) -> float:
        """Resident bytes per FP8-GEMM parameter beyond the BF16 weight (module docstring): the
        cached FP8 copies (:meth:`quantized_bytes_per_element`); none with FP8 primary weights."""
        if self.param_gather:
            return 0.0
        return self.quantized_bytes_per_element(any_layout)

    @property
    def gathered_param_bytes(self) -> float | None:
        """Bytes per parameter the distributed optimizer all-gathers, when not the weight's: one
        with FP8 primary weights, except under ``mxfp8``, whose weights Megatron-Core gathers in
        BF16 and quantises after the gather: with the distributed optimizer and MXFP8
        parameters the parameter buffer is a bf16 view of the gradient buffer ("For FP32 weight
        grads, only half of the buffer is used to store params in bf16"), and after the
        all-gather ``param.data.copy_`` quantises each weight
        (github:NVIDIA/Megatron-LM@0d8e0714cd29c01e164fe6de9f532182bdffa942, the Megatron-LM of
        Megatron-Bridge v0.2.0 / 25.11: ``megatron/core/distributed/param_and_grad_buffer.py``
        l. 303-318 and 695-712; Megatron-Bridge's ``bf16_with_mxfp8_mixed`` sets
        ``reuse_grad_buf_for_mxfp8_param_ag=True``). None: the weight's own bytes."""
        if not (self.fp8 and self.param_gather) or self.recipe is Fp8Recipe.MXFP8:
            return None
        return 1.0

    def weight_cast_bytes_per_param(self, any_layout: bool = False) -> float:
        """Bytes the once-per-iteration weight cast moves per parameter: a cast like any other
        (:meth:`cast_bytes_per_element`: read BF16, write :meth:`quantized_bytes_per_element`,
        and under current scaling the amax read first: Transformer Engine's current-scaling
        quantiser computes the amax before every quantisation,
        github:NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b
        ``transformer_engine/pytorch/csrc/quantizer.cpp`` l. 1009-1028); 0 in BF16."""
        return self.cast_bytes_per_element(any_layout)
