"""nest's FP8 cast term against Transformer Engine's published GEMM micro-benchmark.

Source: Transformer Engine's GEMM profiling tutorial and its tool
(github:NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b:
``docs/examples/gemm_profiling/gemm_profiling.rst``, ``benchmarks/gemm/benchmark_gemm.py``).
A 5B layer (hidden 4096, FFN 16384, M = 31 x 512 = 15,872 tokens), 12 GEMM shapes M x K x N
(``compute_gemm_shapes``: 4 fprop, 4 dgrad, 4 wgrad), each timed with CUDA events as
``te.Linear(K, N)(x)``, ``x`` M x K, under ``te.autocast`` (quantisation inside the loop) and
"pre-quantised" (``tex.generic_gemm`` on operands quantised before the loop). Per-layer sums, ms:

====================  ========  ===============  ======================================
Device, recipe        autocast  pre-quantised    overhead (difference)
====================  ========  ===============  ======================================
B300, current         9.147     6.812            2.335
B300, MXFP8           8.984     7.161            1.823
B300, delayed         7.802     (current 6.812)  0.990; 1.311 with the second run's 8.123
H200 NVL, current     20.285    16.785           3.500
H200 NVL, delayed     18.978    (current 16.785) 2.193; 2.314 with the second run's 19.099
====================  ========  ===============  ======================================

Delayed scaling has no pre-quantised path (it "always runs in autocast mode", the doc's note): its
overhead is taken against current scaling's pre-quantised GEMM (the same per-tensor FP8 kernel),
and its autocast time was printed twice, once in each run, both used.

What each timed call quantises (benchmark_gemm.py ``benchmark_fp8_current`` etc.: no
``torch.no_grad``, no ``is_first_microbatch``, ``x`` without ``requires_grad``; TE
``pytorch/module/linear.py`` at the same commit):

- ``x`` (M x K), row-wise and column-wise: ``backward_needs_input = is_grad_enabled and
  weight.requires_grad`` (l. 303), so ``columnwise=backward_needs_input and not
  save_original_input`` (l. 428-435): nest's activation cast,
  :meth:`Precision.cast_bytes_per_element`;
- the weight (N x K), row-wise only: ``columnwise_usage = is_grad_enabled and inp.requires_grad``
  (l. 467), false here; re-quantised on every call: no ``is_first_microbatch`` means no cache
  (``cache_name = None``, l. 1958; ``quantize_weight``'s cache miss, ``module/base.py`` l. 792 on);
- current scaling reads each tensor once more for its amax (``csrc/quantizer.cpp`` l. 1009-1028:
  ``nvte_compute_amax_with_config``, then ``nvte_quantize_v2``); delayed casts in one pass
  (l. 632-643);
- per-tensor FP8 writes a transposed copy only ``columnwise_usage &&
  !is_non_tn_fp8_gemm_supported`` (l. 689); that is true for compute capability 10.0 up to
  12.0 (``common/transformer_engine.cpp`` l. 1200), B300's Blackwell included; MXFP8 writes
  separate row-wise and column-wise data, each with its E8M0 scales (l. 1522-1533).

So a call moves ``cast_bytes_per_element`` x M K for ``x`` and, for the row-wise weight, the same
read side (the BF16 read and, under current scaling, the amax read: ``cast_bytes_per_element -
quantized_bytes_per_element``) plus one written copy (:func:`_one_copy_bytes`) x K N.

Devices: H200 NVL has the same 4.8 TB/s HBM3e as the ``h200_sxm`` preset (NVIDIA H200 datasheet).
No B300 preset exists; B300 is taken as ``b200``'s 8 TB/s HBM3e at GB200's measured 87.2 % (the
``b200`` and ``gb200`` presets are equal in both): B300's "up to 8 TB/s" per GPU is a third-party
table (Rillor Research, "HBM3e capacity and bandwidth across the Blackwell line", 2026), not an
NVIDIA datasheet: ASSUMED.

Tolerance: 20 % on the modelled / published overhead. The published overhead is a difference of
two separate runs, and the doc's one quantity printed twice, delayed scaling's autocast time,
differs between its runs by 0.321 ms on B300 (14 % of the current overhead, 18 % of MXFP8's) and
0.121 ms on H200 (3.5 % of current's); the subtraction also swaps ``te.Linear``'s TN GEMM for the
pre-quantised ``generic_gemm`` layout, so not all of the difference is casts.

Ratios (modelled / published): H200 current 0.955, delayed 0.980 / 0.929; B300 delayed 1.079 /
0.815; B300 current 0.762 and MXFP8 0.713 fall outside and are marked xfail (strict).
"""

import pytest

from nest.app.config import build_device, load_preset
from nest.core.precision import Format, Fp8Recipe, Precision

HIDDEN, FFN, TOKENS = 4096, 16384, 31 * 512
TOLERANCE = 0.20

B300_WHY = (
    "B300 {recipe}: modelled {ratio:.3f} of the published overhead; either the casts streamed "
    "{eff:.1f} TB/s, not b200's 87.2 % of 8 TB/s, or the autocast path pays more than its casts "
    "(per-call launches, scale swizzles, another GEMM layout): no B300 cast measurement to tell"
)


def benchmark_shapes() -> list[tuple[int, int, int]]:
    """``compute_gemm_shapes`` of benchmark_gemm.py: (M, K, N) of fprop, dgrad, wgrad."""
    h, i, m = HIDDEN, FFN, TOKENS
    fprop = [(m, h, 3 * h), (m, h, h), (m, h, i), (m, i, h)]
    dgrad = [(m, 3 * h, h), (m, h, h), (m, i, h), (m, h, i)]
    wgrad = [(h, m, 3 * h), (h, m, h), (h, m, i), (i, m, h)]
    return fprop + dgrad + wgrad


def _one_copy_bytes(precision: Precision, any_layout: bool) -> float:
    """Bytes written per element by a row-wise-only quantisation: one of the copies
    :meth:`Precision.quantized_bytes_per_element` counts (two equal copies, except per-tensor
    FP8 on an any-layout device, which writes one)."""
    copies = 1 if (any_layout and precision.recipe is not Fp8Recipe.MXFP8) else 2
    return precision.quantized_bytes_per_element(any_layout) / copies


def modelled_overhead_s(preset: str, recipe: Fp8Recipe) -> float:
    """Seconds of the casts of the 12 timed ``te.Linear`` calls, at the preset's achieved HBM
    bandwidth (module docstring)."""
    device = build_device(load_preset("device", preset))
    precision = Precision(format=Format.FP8, recipe=recipe)
    layout = device.fp8_any_layout
    x_bytes = precision.cast_bytes_per_element(layout)
    read_bytes = x_bytes - precision.quantized_bytes_per_element(layout)
    w_bytes = read_bytes + _one_copy_bytes(precision, layout)
    total = sum(x_bytes * m * k + w_bytes * k * n for m, k, n in benchmark_shapes())
    return total / device.achieved_hbm_bw_bytes_per_s


def _ratio(preset, recipe, autocast_ms, prequantised_ms):
    return modelled_overhead_s(preset, recipe) / ((autocast_ms - prequantised_ms) * 1e-3)


def _b300_xfail(recipe, autocast_ms, prequantised_ms):
    ratio = _ratio("b200", recipe, autocast_ms, prequantised_ms)
    achieved = build_device(load_preset("device", "b200")).achieved_hbm_bw_bytes_per_s
    reason = B300_WHY.format(recipe=recipe, ratio=ratio, eff=ratio * achieved / 1e12)
    return pytest.mark.xfail(strict=True, reason=reason)


CASES = [
    pytest.param("h200_sxm", Fp8Recipe.TENSORWISE, 20.285, 16.785, id="h200-current"),
    pytest.param("h200_sxm", Fp8Recipe.DELAYED, 18.978, 16.785, id="h200-delayed-run1"),
    pytest.param("h200_sxm", Fp8Recipe.DELAYED, 19.099, 16.785, id="h200-delayed-run2"),
    pytest.param("b200", Fp8Recipe.DELAYED, 7.802, 6.812, id="b300-delayed-run1"),
    pytest.param("b200", Fp8Recipe.DELAYED, 8.123, 6.812, id="b300-delayed-run2"),
    pytest.param(
        "b200",
        Fp8Recipe.TENSORWISE,
        9.147,
        6.812,
        id="b300-current",
        marks=_b300_xfail(Fp8Recipe.TENSORWISE, 9.147, 6.812),
    ),
    pytest.param(
        "b200",
        Fp8Recipe.MXFP8,
        8.984,
        7.161,
        id="b300-mxfp8",
        marks=_b300_xfail(Fp8Recipe.MXFP8, 8.984, 7.161),
    ),
]


@pytest.mark.parametrize("preset,recipe,autocast_ms,prequantised_ms", CASES)
def test_cast_overhead_matches_te_gemm_benchmark(preset, recipe, autocast_ms, prequantised_ms):
    """Modelled cast seconds of the 12 calls within 20 % of autocast minus pre-quantised."""
    ratio = _ratio(preset, recipe, autocast_ms, prequantised_ms)
    assert abs(ratio - 1.0) <= TOLERANCE, f"modelled / published = {ratio:.3f}"


def test_benchmark_shapes_reproduce_the_published_flops():
    """The tutorial's forward table: ~6.39 TFLOP per layer forward (2 M K N summed)."""
    fprop = benchmark_shapes()[:4]
    assert sum(2 * m * k * n for m, k, n in fprop) / 1e12 == pytest.approx(6.39, abs=0.005)
