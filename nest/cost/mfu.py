"""MFU: what it counts, the causal-aware figure next to it, and how it compares with the best
published runs of its kind.

**The convention** (:data:`FLOP_CONVENTION`). Model FLOPs are the matmul FLOPs of one forward
pass, three times (forward and backward, no recompute), as Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC21, §5.1 count them
(``24 b s h^2 + 4 b s^2 h`` per block forward, ``2 b s h V`` for the logits), generalised as
Megatron-LM's ``num_floating_point_operations`` does (megatron/training/training.py): GQA, gated
MLPs, MoE (``top_k`` routed experts plus the shared ones, the router left out), multi-head
latent attention (query/key heads ``nope + rope`` wide, value heads ``v`` wide) and
multi-token-prediction modules (a block, the ``2h -> h`` projection and the logits again)
(:meth:`nest.core.layers.AnalyticModel.model_flops_per_sample`). The attention scores are
counted for every key a query may see (the sequence; the window or the chunk of a local block)
in full, also for a causal model: SC21's count, and Megatron-LM's before it halved the causal
term in 2025, which the published Megatron-Core runs validated here use. MFU = model FLOPs per
iteration / (iteration time x devices used x the device's BF16 peak), also for FP8 runs; FP8
runs give the FP8-peak figure next to it (``mfu_fp8_peak``: NVIDIA's dgxc-benchmarking reports
FP8 MFU against the FP8 peak).

**Causal-aware MFU.** A causal attention kernel computes only the unmasked part of the score
matrix (FlashAttention skips the masked blocks), and the cost model charges that part
(:func:`nest.core.kernels.attention_time_s`): half of a global block's scores, ``1 - w / (2 s)``
of a sliding window's. Counting the full scores as useful work inflates MFU as the sequence
grows. The causal figure counts only the computed part: ``mfu_causal = mfu x (F - S) / F`` with
``F`` the model FLOPs and ``S`` the skipped score FLOPs
(:meth:`~nest.core.layers.AnalyticModel.causal_skipped_flops_per_sample`). It is the convention
of Megatron-LM's current ``num_floating_point_operations``, of MaxText's
``calculate_tflops_training_per_device`` (which counts a sliding window as ``s w - w^2 / 2``) and
of DeepSeek's 250 GFLOP per token for DeepSeek-V3 at 4,096 tokens (Zhao et al., "Insights into
DeepSeek-V3", ISCA 2025, Table 2: Megatron's causal count without the MTP module gives 249.8).
Dubey et al., "The Llama 3 Herd of Models" (2024), §3.3 report 38 % MFU for their 128K-context,
CP16 run. A measured profile gives its FLOPs per layer without the split: its causal figure is
not known.

**Plausibility** (:func:`plausibility_note`). An exact planner optimises what the cost model
says; a figure above the best published run of the same kind of model on the same kind of
device says the model promises more than anyone has measured. :data:`PUBLISHED_BEST` holds those
runs (each with its source, in its own counting convention), and the run summary and
``report.json["plausibility"]`` say when a plan's MFU is above them, and why the cost model may
be optimistic there.
"""

from dataclasses import dataclass

from nest.core.layers import AnalyticModel
from nest.core.problem import Problem
from nest.core.report import Report

FLOP_CONVENTION = (
    "model FLOPs = 3 x forward matmul FLOPs (Narayanan et al. SC21 §5.1: 24bsh^2 + 4bs^2h per "
    "block, 2bshV logits; GQA/SwiGLU/MoE/MLA/MTP as Megatron-LM's num_floating_point_operations, "
    "router left out), attention scores counted in full over the keys each query may see (no "
    "causal discount), no recompute; MFU = model FLOPs / (iteration time x devices used x BF16 "
    "peak); mfu_causal counts only the unmasked scores (Megatron-LM since 2025, MaxText)"
)


def causal_mfu(problem: Problem, report: Report) -> float | None:
    """MFU counting half of a causal model's attention-score FLOPs (module docstring); the
    conventional MFU for an encoder; ``None`` when the split is not known (a profile)."""
    model = problem.model
    if not report.mfu or not isinstance(model, AnalyticModel):
        return None
    if not model.causal:
        return report.mfu
    flops = model.model_flops_per_sample()
    return report.mfu * (flops - model.causal_skipped_flops_per_sample()) / flops


def fp8_peak_mfu(problem: Problem, report: Report) -> float | None:
    """MFU against the device's FP8 peak, for an FP8 run (None otherwise)."""
    device = problem.cluster.device
    if not report.mfu or not problem.training.numerics.fp8 or not device.has_fp8:
        return None
    return report.mfu * device.peak_flops_per_s / device.fp8_peak_flops_per_s


@dataclass(frozen=True, slots=True)
class PublishedBest:
    """The best published MFU of a kind of model on a kind of device and precision."""

    kind: str
    """``dense``, ``fine-grained MoE`` or ``coarse MoE`` (:func:`model_kind`)."""
    devices: frozenset[str]
    """Device presets of that kind."""
    precision: str
    mfu: float
    causal: bool
    """Its FLOPs count only the unmasked attention scores (compare with ``mfu_causal``)."""
    source: str
    why: str | None = None
    """Why the cost model may promise more on these devices; None: the kind's
    :data:`WHY_OPTIMISTIC`."""


HOPPER = frozenset({"h100_sxm", "h200_sxm"})

TPU_WHY = (
    "the TPU in-step GEMM rate is calibrated on MaxText's v5e runs, every one of which "
    "recomputes (full or minimal remat), and v5p's GEMM ceiling is v5e's, assumed; a plan without "
    "recompute keeps the large matmuls at that rate while XLA's whole-step memory traffic, "
    "fusion limits and collective scheduling are not modelled"
)

BLACKWELL_WHY = (
    "Blackwell's in-step GEMM rate is derived from H100's calibrated share of its GEMM ceiling, "
    "not measured on Blackwell runs; the model over-predicts the FP8 speed-up of NVIDIA's GB200 "
    "runs (dgxc-benchmarking pairs, docs/trust/fidelity.md), and host-side launch gaps, which "
    "bound small microbatches and fine-grained MoE layers on these faster chips, are not modelled"
)

MEGATRON_BRIDGE_ARCHIVE = (
    "Megatron-Bridge docs/performance-summary-archive.md at "
    "NVIDIA-NeMo/Megatron-Bridge@4ab94dfad36641cabdeb96452b21bf676aac4772"
)
"""The Blackwell references' source: Megatron-Bridge's per-release performance tables, model
TFLOP/s per GPU by Megatron-LM's formula (causal scores halved). GB300 and B300 rows are left
out: no preset has their peaks."""

PUBLISHED_BEST = (
    PublishedBest(
        "dense",
        HOPPER,
        "bf16",
        0.625,
        False,
        "Llama 3.1 8B on 8 H100, 12.27 s per step of 128 x 8,192 tokens (TP1 CP2 DP4), 618 "
        "TFLOP/s per GPU in this module's count: NVIDIA dgxc-benchmarking v25.04.02 "
        "llama3.1/README.md",
    ),
    PublishedBest(
        "fine-grained MoE",
        HOPPER,
        "bf16",
        276 / 989.4,
        True,
        "Qwen3-235B-A22B on 256 H100, 276 TFLOP/s per GPU: Megatron-MoE-ModelZoo "
        "best_practice/qwen3 @e8650517; DeepSeek-V3 on 1,024 H100 reaches 235 (dgxc-benchmarking "
        "v25.08.02)",
    ),
    PublishedBest(
        "coarse MoE",
        HOPPER,
        "bf16",
        438 / 989.4,
        False,
        "Mixtral 8x7B on H100, 438 TFLOP/s per GPU: Megatron-Core MoE README "
        "(megatron/core/transformer/moe/README.md, MCore v0.8); Grok-1 on 512-2,048 H100 reaches "
        "41-45 % in NVIDIA's dgxc-benchmarking recipes",
    ),
    PublishedBest(
        "dense",
        HOPPER,
        "fp8",
        827 / 989.4,
        True,
        "Llama 3.1 405B on 1,024 H100, 827 TFLOP/s per GPU: Megatron-Bridge performance "
        "summary 26.04.01",
    ),
    PublishedBest(
        "fine-grained MoE",
        HOPPER,
        "fp8",
        253 / 989.4,
        True,
        "Qwen3-235B-A22B on 256 H100, 253 TFLOP/s per GPU: Megatron-Bridge performance summary "
        "26.04.01",
    ),
    PublishedBest(
        "dense",
        frozenset({"tpu_v5p"}),
        "bf16",
        0.7147,
        True,
        "MaxText's 32B on 64 TPU v5p chips, 328 TFLOP/s per chip, MFU 71.47 % with "
        "remat_policy=minimal and MaxText's causal attention count: "
        "AI-Hypercomputer/maxtext@76bd53b MaxText/configs/v5p/README.md",
        TPU_WHY,
    ),
    PublishedBest(
        "dense",
        frozenset({"tpu_v5e"}),
        "bf16",
        0.6686,
        True,
        "MaxText's 32B on one v5e-256 slice, 132 TFLOP/s per chip, MFU 66.86 % with "
        "remat_policy=full and MaxText's causal attention count: "
        "AI-Hypercomputer/maxtext@76bd53b MaxText/configs/v5e/README.md",
        TPU_WHY,
    ),
    PublishedBest(
        "dense",
        frozenset({"gb200"}),
        "fp8",
        2144 / 2500,
        True,
        "Llama 3.1 405B on 256 GB200, FP8 current scaling, 2,144 TFLOP/s per GPU: "
        f"release 26.04.01, line 216 of {MEGATRON_BRIDGE_ARCHIVE}",
        BLACKWELL_WHY,
    ),
    PublishedBest(
        "dense",
        frozenset({"b200"}),
        "fp8",
        1667 / 2250,
        True,
        "Llama 3.1 405B on 128 B200, FP8 current scaling, 1,667 TFLOP/s per GPU: "
        f"release 25.11, line 579 of {MEGATRON_BRIDGE_ARCHIVE}",
        BLACKWELL_WHY,
    ),
    PublishedBest(
        "fine-grained MoE",
        frozenset({"gb200"}),
        "fp8",
        1292 / 2500,
        True,
        "DeepSeek-V3 on 256 GB200, MXFP8, 1,292 TFLOP/s per GPU: release 26.06, line 114 of "
        f"{MEGATRON_BRIDGE_ARCHIVE}",
        BLACKWELL_WHY,
    ),
    PublishedBest(
        "fine-grained MoE",
        frozenset({"gb200"}),
        "bf16",
        782 / 2500,
        True,
        "DeepSeek-V3 without MTP on 256 GB200, BF16, 782 TFLOP/s per GPU: release 25.11, line "
        f"568 of {MEGATRON_BRIDGE_ARCHIVE}",
        BLACKWELL_WHY,
    ),
    PublishedBest(
        "fine-grained MoE",
        frozenset({"b200"}),
        "fp8",
        864 / 2250,
        True,
        "DeepSeek-V3 on 256 B200, MXFP8, 864 TFLOP/s per GPU: release 26.04.01, line 228 of "
        f"{MEGATRON_BRIDGE_ARCHIVE}",
        BLACKWELL_WHY,
    ),
    PublishedBest(
        "fine-grained MoE",
        frozenset({"b200"}),
        "bf16",
        373 / 2250,
        True,
        "GPT-OSS 120B on 64 B200, BF16, 373 TFLOP/s per GPU: release 26.02.01, line 434 of "
        f"{MEGATRON_BRIDGE_ARCHIVE}",
        BLACKWELL_WHY,
    ),
)
"""The best published runs the summary compares with (module docstring). Fine-grained MoE runs
are counted by Megatron-LM's current formula, which halves the causal scores."""

WHY_OPTIMISTIC = {
    "dense": "the in-step GEMM rate is calibrated on one source's BF16 H100 runs (the H100 "
    "preset's matmul_efficiency, python -m nest.calibrate), and host-side launch gaps, "
    "stragglers and data loading are not modelled",
    "fine-grained MoE": "the in-step GEMM rate is calibrated on dense BF16 H100 runs, dropless "
    "routing's wait is one calibrated factor, the dispatcher is one all-to-all, and the host "
    "time of the dropless MoE layer, which bounds small microbatches in some releases, is not "
    "modelled",
    "coarse MoE": "the in-step GEMM rate is calibrated on dense BF16 H100 runs, and with ep = 1 "
    "every rank runs all experts on its own tokens, so routing imbalance costs nothing there; "
    "launch gaps and the grouped GEMMs' ragged token counts are not modelled",
}


def model_kind(problem: Problem) -> str | None:
    """``dense``, ``fine-grained MoE`` (experts no wider than the hidden size, as DeepSeekMoE,
    Qwen3-MoE, GPT-OSS), ``coarse MoE`` (wider experts, as Mixtral and Grok-1) or None (a
    measured profile)."""
    model = problem.model
    if not isinstance(model, AnalyticModel):
        return None
    spec = model.spec
    if not spec.is_moe:
        return "dense"
    return "fine-grained MoE" if spec.expert_ffn <= spec.hidden else "coarse MoE"


def plausibility_note(problem: Problem, report: Report) -> str | None:
    """A one-line note when the plan's MFU is above the best published run of its kind
    (:data:`PUBLISHED_BEST`), with the reason the cost model may be optimistic; None otherwise."""
    kind = model_kind(problem)
    precision = problem.training.numerics.format.value
    device = problem.cluster.device.name
    for best in PUBLISHED_BEST:
        if (best.kind, best.precision) != (kind, precision) or device not in best.devices:
            continue
        mfu = causal_mfu(problem, report) if best.causal else report.mfu
        if mfu is None or mfu <= best.mfu:
            return None
        counted = "causal-aware " if best.causal else ""
        return (
            f"{counted}MFU {100 * mfu:.1f} % is above the best published {kind} run on "
            f"{device} in {precision.upper()}, {100 * best.mfu:.1f} % ({best.source}); read it "
            f"as an upper bound: {best.why or WHY_OPTIMISTIC[kind]} (docs/plan/models.md)"
        )
    return None


def mfu_figures(problem: Problem, report: Report) -> dict:
    """The ``report.json`` keys: ``mfu_causal``, ``mfu_fp8_peak``, ``flop_convention`` and
    ``plausibility``."""
    return {
        "mfu_causal": causal_mfu(problem, report),
        "mfu_fp8_peak": fp8_peak_mfu(problem, report),
        "flop_convention": FLOP_CONVENTION,
        "plausibility": plausibility_note(problem, report),
    }
