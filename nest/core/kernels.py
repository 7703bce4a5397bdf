"""How long a device takes for one GEMM and one fused attention kernel: the compute model.

Two models, chosen per device preset (``compute_model``):

- ``flat`` (the first version, kept as a switch for comparison): every FLOP at
  ``peak x matmul_efficiency``, whatever its shape.
- ``shape``: the work's shape decides its speed.

  *GEMMs* (NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, §2.3 and §3):
  cuBLAS splits the ``m x n`` output into thread-block tiles (256x128, 128x256, 128x128, ...),
  one tile per SM at a time, so a GEMM takes ``waves = ceil(tiles / SMs)`` rounds of one tile's
  ``2 Tm Tn k`` FLOPs (tile and wave quantization: a GEMM a little larger than a full wave pays
  for a second one). The tile shape is the fastest of the listed ones for the GEMM (cuBLAS's
  heuristics choose among them). A GEMM also moves its operands through HBM at least once
  (roofline: the larger of the two times), and every kernel costs a fixed ``kernel_overhead_s``
  (launch, prologue and epilogue), which dominates tiny GEMMs: derived from the smallest GEMMs
  of a published H100 measurement table (OpenXLA
  ``xla/service/gpu/model/matmul_interpolator_data.h``, sm_90 bf16: 256x512x256 at
  12.5 TFLOP/s, i.e. 5.4 us for 67 MFLOP, of which a one-tile wave computes 1.4 us; the same
  table's sm_100_B200 rows give B200 and GB200 4.1 us). An FP8 GEMM runs the same tiles at the
  FP8 level (:attr:`Device.fp8_level`) with one-byte operands and its own fixed time where the
  table has usable FP8 rows (``fp8_kernel_overhead_s``: B200 and GB200 4.8 us, from the
  sm_100_B200 FP8 rows of the same three GEMMs; the sm_90 FP8 rows are above H100's FP8 peak,
  so H100 and H200 FP8 GEMMs pay the bf16 time).

  *The level* a tile runs at, as a fraction of peak (:attr:`Device.gemm_level`):
  ``min(matmul_efficiency, gemm_ceiling)``. ``gemm_ceiling`` is the fraction the best-shaped
  bf16 GEMMs reach in a published brute-force micro-benchmark (H100 SXM 794.5 of 989 TFLOP/s
  = 0.803, A100 SXM 271.2 of 312 = 0.869; S. Bekman, ml-engineering, "Maximum Achievable
  Matmul FLOPS", ``mamf-finder.py``): an upper bound. ``matmul_efficiency`` is the rate a
  large GEMM keeps *inside a training step* (clocks under sustained power, launch gaps, the
  kernels this model does not list); no published micro-benchmark isolates it, so it is
  *calibrated*, each of its two constants on a declared split only (:mod:`nest.app.calibrate`):

  - GPUs: the BF16 half of NVIDIA's dgxc-benchmarking H100 pairs, stored as
    :data:`CALIBRATED_MATMUL_EFFICIENCY` in the H100 and H200 presets; 0.778 of H100's ceiling
    (:data:`IN_STEP_SHARE_OF_CEILING`, the share of an isolated GEMM's best rate a training step
    keeps: the same share the FP8 level and the attention kernels already use,
    :attr:`Device.sustained_fraction`). Every other GPU preset with a published ceiling runs at
    that share of *its own* ceiling (:func:`derived_matmul_efficiency`: A100, B200, GB200,
    MI300X, MI355X, H100 96GB), a transfer of the fitted number through a micro-benchmark, not
    a further fit.
  - TPUs: MaxText's v5e README runs on 1, 4 and 16 slices, stored as
    :data:`CALIBRATED_TPU_MATMUL_EFFICIENCY` in the v5e preset; 0.898 of v5e's ceiling
    (:data:`TPU_IN_STEP_SHARE_OF_CEILING`). The GPU share does not carry over: MaxText's
    published whole-step MFUs are above 0.778 x the TPU ceilings, which no GEMM-bound step can
    be (a likely reason, not measured here: XLA runs the step as one compiled program, without
    the CUDA launch gaps and power-capped clocks the GPU share absorbs). The other
    TPU presets run at the TPU share of their ceilings: v6e (0.901, Google's tpu-recipes
    8192-cubed matmul, ``conf/device/tpu_v6e.yaml``) and v5p (no published v5p micro-benchmark:
    v5e's 0.923 ASSUMED, the two chips having the same TensorCore matrix units, four 128-wide
    MXUs each, in JAX's per-chip hardware table; ``conf/device/tpu_v5p.yaml``).

  Presets without a ceiling (TPU v4, the NEST paper's devices) keep the first cost model's
  stated assumption, 0.65. At the ceiling instead (``matmul_efficiency`` = ``gemm_ceiling``)
  the GPU model over-predicts every published GPU run it is
  validated against (docs/trust/fidelity.md). The shape model's job is the *relative*
  cost of shapes: small, ragged and grouped GEMMs lose against large ones as the tiles, waves
  and overheads say, at whatever level.

  *Attention* (fused FlashAttention kernels, Dao 2023; Shah et al. 2024): the kernel's achieved
  fraction of peak grows with the sequence length it runs on (``attention_efficiency``: a
  published table of (key length, fraction) per device, interpolated in log2 of the length and
  held constant outside it: cuDNN's causal forward on H200 for the H100 and H200 presets, the
  fused kernel Transformer Engine prefers on Hopper; FlashAttention-2 on A100; cuDNN's causal
  forward on GB200 for B200 and GB200), measured like the GEMM ceiling in isolation, so it is
  scaled by the same ``gemm_level / gemm_ceiling`` (:attr:`Device.sustained_fraction`); a causal
  kernel skips the masked half of the score matrix, so it does half of the counted FLOPs in the
  same time per FLOP. The *backward* kernel does 2.5 times the forward's FLOPs (five
  matrix products to two: ``dS``, ``dQ``, ``dK``, ``dV`` and the recomputed ``S = QK^T``; Dao
  2023 §3.1.2) at its own measured fraction of peak (``attention_bwd_efficiency``, published
  by the same benchmark as the forward where it prints one: cuDNN's backward on GB200 for B200
  and GB200, cuDNN's backward on H200 for the H100 and H200 presets), lower than the
  forward's: 2.9-3.3 times the forward's time at 4k-32k keys where the FLOP ratio alone says
  2.5 (:func:`attention_bwd_time_s`); 2.5 times where no backward is published (A100, the
  AMD presets, ``flat``).

Grouped expert GEMMs use :func:`gemm_time_s` with ``groups`` (each local expert's tokens are one
GEMM of the group, all of them filling the same waves).
"""

from math import ceil, log2

from nest.core.hardware import Device

CALIBRATED_MATMUL_EFFICIENCY = 0.625
"""The in-step GEMM rate fitted by ``python -m nest.calibrate`` on its declared split (module
docstring; :data:`nest.app.calibrate.CALIBRATION_SPLIT`); ``conf/device/h100_sxm.yaml`` and
``h200_sxm.yaml`` carry the same value and ``tests/test_calibrate.py`` checks both against a
fresh fit."""

H100_GEMM_CEILING = 0.803
"""H100 SXM's best bf16 GEMM, 794.5 of 989 TFLOP/s (S. Bekman, ml-engineering, "Maximum
Achievable Matmul FLOPS", ``mamf-finder.py``): ``gemm_ceiling`` of the presets the calibrated rate
was fitted on (``conf/device/h100_sxm.yaml``; ``tests/test_calibrate.py`` checks they agree)."""

IN_STEP_SHARE_OF_CEILING = CALIBRATED_MATMUL_EFFICIENCY / H100_GEMM_CEILING
"""The share of its micro-benchmark ceiling a GEMM keeps inside a training step, as fitted on
H100 (0.625 / 0.803 = 0.778): what sustained clocks, launch gaps and the unlisted kernels leave of
an isolated GEMM's best rate. Derived from the one calibrated constant, not fitted again."""


CALIBRATED_TPU_MATMUL_EFFICIENCY = 0.829
"""The TPU in-step GEMM rate, TPU v5e's, fitted by ``python -m nest.calibrate`` on its own
declared split (:data:`nest.app.validate.TPU_CALIBRATION_SPLIT`: MaxText's v5e README runs on 1, 4
and 16 slices), by the same procedure as :data:`CALIBRATED_MATMUL_EFFICIENCY`;
``conf/device/tpu_v5e.yaml`` carries it and ``tests/test_calibrate.py`` checks it against a fresh
fit. A second calibrated constant because the GPU share does not transfer to XLA's TPU programs:
MaxText's published whole-step MFUs (v5p 32B 71.5 %, v5e 16B 61.1 %) are above 0.778 x the TPU
ceilings (v5e 0.709), impossible for GEMM-bound steps (module docstring)."""

TPU_V5E_GEMM_CEILING = 0.923
"""TPU v5e's best bf16 GEMM, XLA's 8192-cubed ``jnp.matmul`` at 92.3 % of peak (JAX Pallas TPU
guide, ``conf/device/tpu_v5e.yaml``): the ceiling of the preset the TPU rate is fitted on."""

TPU_IN_STEP_SHARE_OF_CEILING = CALIBRATED_TPU_MATMUL_EFFICIENCY / TPU_V5E_GEMM_CEILING
"""The share of its micro-benchmark ceiling a GEMM keeps inside an XLA TPU training step, as
fitted on v5e (0.829 / 0.923 = 0.898, against the GPUs' 0.778). The other TPU presets with a
ceiling run at this share of theirs (:func:`derived_matmul_efficiency` with ``tpu=True``: v5p,
v6e)."""


def derived_matmul_efficiency(
    gemm_ceiling: float, share: float | None = None, tpu: bool = False
) -> float:
    """The in-step GEMM rate of a preset whose ``gemm_ceiling`` is measured but whose in-step
    rate no calibration split covers: :data:`IN_STEP_SHARE_OF_CEILING` of its own ceiling
    (:data:`TPU_IN_STEP_SHARE_OF_CEILING` for a TPU, ``tpu``), rounded to the presets' three
    decimals (module docstring). The device presets store the result (``conf/device/*.yaml``),
    ``tests/test_calibrate.py`` checks each against this. ``share``: another share than the
    stored one (a fresh fit's, ``python -m nest.calibrate``)."""
    if share is None:
        share = TPU_IN_STEP_SHARE_OF_CEILING if tpu else IN_STEP_SHARE_OF_CEILING
    return round(share * gemm_ceiling, 3)


def gemm_time_s(
    device: Device,
    m: float,
    n: float,
    k: float,
    groups: int = 1,
    dtype_bytes: int = 2,
    fp8: bool = False,
) -> float:
    """Seconds of ``groups`` GEMMs ``[m x k] @ [k x n]`` of ``dtype_bytes`` elements run as one
    grouped kernel on one device (module docstring). ``m, n, k`` may be fractional for averages
    (rounded up for the tiles). ``fp8``: one-byte operands at the device's FP8 rate
    (:attr:`nest.core.hardware.Device.fp8_level`; :mod:`nest.core.precision`) and its FP8
    kernel time (:attr:`nest.core.hardware.Device.fp8_gemm_overhead_s`)."""
    if m <= 0 or n <= 0 or k <= 0 or groups <= 0:
        return 0.0
    flops = 2.0 * m * n * k * groups
    if fp8:
        peak, level, dtype_bytes = device.fp8_peak_flops_per_s, device.fp8_level, 1
        overhead_s = device.fp8_gemm_overhead_s
    else:
        peak, level = device.peak_flops_per_s, device.gemm_level
        overhead_s = device.kernel_overhead_s
    if device.compute_model == "flat":
        return flops / (peak * level if fp8 else device.achieved_flops_per_s)
    per_sm_flops_per_s = peak * level / device.sm_count
    m_i, n_i, k_i = ceil(m), ceil(n), ceil(k)
    best = float("inf")
    for tm, tn in device.tile_shapes:
        tiles = ceil(m_i / tm) * ceil(n_i / tn) * groups
        waves = ceil(tiles / device.sm_count)
        best = min(best, waves * 2.0 * tm * tn * k_i / per_sm_flops_per_s)
    operand_bytes = dtype_bytes * (m * k + k * n + m * n) * groups
    return max(best, operand_bytes / device.achieved_hbm_bw_bytes_per_s) + overhead_s


def attention_efficiency(device: Device, key_length: float, backward: bool = False) -> float:
    """The fused attention kernel's fraction of peak at this key length (module docstring):
    the forward's, or with ``backward`` the backward kernel's (``attention_bwd_efficiency``;
    the forward's where the preset publishes no backward)."""
    table = (backward and device.attention_bwd_efficiency) or device.attention_efficiency
    if key_length <= table[0][0]:
        return table[0][1]
    if key_length >= table[-1][0]:
        return table[-1][1]
    x = log2(key_length)
    for (s0, e0), (s1, e1) in zip(table, table[1:], strict=False):
        if s0 <= key_length <= s1:
            w = (x - log2(s0)) / (log2(s1) - log2(s0))
            return e0 + w * (e1 - e0)
    raise AssertionError("key length inside the table was not bracketed")


def attention_time_s(
    device: Device, flops: float, key_length: float, causal: bool, done_fraction: float = 0.5
) -> float:
    """Seconds of a fused attention forward of ``flops`` counted FLOPs (every query against all
    the keys it may see, as FLOP counts count it) on keys of ``key_length`` tokens (module
    docstring); a causal kernel computes ``done_fraction`` of them (a half for global
    attention; :meth:`nest.core.layers.AnalyticModel` gives it for windows)."""
    if flops <= 0:
        return 0.0
    if device.compute_model == "flat" or not device.attention_efficiency:
        return flops / device.achieved_flops_per_s
    return _fused_kernel_s(device, flops, key_length, causal, done_fraction, backward=False)


def _fused_kernel_s(
    device: Device,
    flops: float,
    key_length: float,
    causal: bool,
    done_fraction: float,
    backward: bool,
) -> float:
    """One fused attention kernel of ``flops`` counted FLOPs at its table's fraction of peak
    (the forward's or the backward's), scaled to the in-step level, plus the fixed kernel
    time; a causal kernel computes ``done_fraction`` of the counted FLOPs."""
    done = done_fraction * flops if causal else flops
    rate = (
        device.peak_flops_per_s
        * attention_efficiency(device, key_length, backward=backward)
        * device.sustained_fraction
    )
    return done / rate + device.kernel_overhead_s


ATTENTION_BWD_FLOPS_PER_FWD = 2.5
"""The fused attention backward's matrix-product FLOPs over the forward's: five products
(``S = QK^T`` again, ``dP = dO V^T``, ``dV = P^T dO``, ``dQ = dS K``, ``dK = dS^T Q``) to the
forward's two (Dao 2023, FlashAttention-2 §3.1.2; cudnn-frontend's benchmark counts the same,
``benchmark_single_sdpa.py`` ``flops``: ``3 d_qk + 2 d_vo`` to ``d_qk + d_vo``)."""

SCORE_RECOMPUTE_PER_FWD = 0.5
"""The part of that backward that recomputes the scores ``S = QK^T``: one of the forward's two
products, half its FLOPs and (at the forward's rate) half its seconds. The cost model books it
as recomputation in every mode (:meth:`nest.core.layers.AnalyticModel._block_cost`) and the
rest of the backward as the backward (``_attention_bwd_s``)."""


def attention_bwd_time_s(
    device: Device, flops: float, key_length: float, causal: bool, done_fraction: float = 0.5
) -> float:
    """Seconds of the fused attention *backward* of a forward of ``flops`` counted FLOPs (as
    :func:`attention_time_s`), the recomputation of the scores included:
    :data:`ATTENTION_BWD_FLOPS_PER_FWD` times the forward's work at the backward kernel's
    published fraction of peak (``attention_bwd_efficiency``). Where a device publishes no
    backward (or runs ``flat``) it is 2.5 times :func:`attention_time_s`, the FLOP ratio at
    the forward's rate."""
    if flops <= 0:
        return 0.0
    if device.compute_model == "flat" or not device.attention_bwd_efficiency:
        fwd_s = attention_time_s(device, flops, key_length, causal, done_fraction)
        return ATTENTION_BWD_FLOPS_PER_FWD * fwd_s
    work = ATTENTION_BWD_FLOPS_PER_FWD * flops
    return _fused_kernel_s(device, work, key_length, causal, done_fraction, backward=True)
