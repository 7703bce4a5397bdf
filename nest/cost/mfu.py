"""MFU: what it counts, and the causal-aware figure next to it.

**The convention** (:data:`FLOP_CONVENTION`). Model FLOPs are the matmul FLOPs of one forward
pass, three times (forward and backward, no recompute), as Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC21, §5.1 count them
(``24 b s h^2 + 4 b s^2 h`` per block forward, ``2 b s h V`` for the logits), generalised to GQA,
SwiGLU and MoE as Megatron-LM's ``num_floating_point_operations`` does
(:meth:`nest.core.layers.AnalyticModel.model_flops_per_sample`). The attention scores
(``4 b s^2 h``) are counted in full, also for a causal model: that is the published convention, so
the figure compares with Megatron-LM's and the SC21 paper's. MFU = model FLOPs per iteration /
(iteration time x devices used x peak FLOP/s).

**Causal-aware MFU.** A causal attention kernel computes only the unmasked half of the score
matrix (FlashAttention skips the masked blocks), and the cost model charges it that half
(:func:`nest.core.kernels.attention_time_s`). Counting the full scores as useful work then
inflates MFU as the sequence grows: at 128K tokens the scores are most of the FLOPs. The causal
figure counts half of the score FLOPs of a causal model (an encoder's are all useful):
``mfu_causal = mfu x (F - A/2) / F`` with ``F`` the model FLOPs and ``A`` the score FLOPs
(:meth:`~nest.core.layers.AnalyticModel.attention_score_flops_per_sample`). Dubey et al., "The
Llama 3 Herd of Models" (2024), §3.3 report 38 % MFU for their 128K-context, CP16 run. A
measured profile gives its FLOPs per layer without the split: its causal figure is not known.
"""

from nest.core.layers import AnalyticModel
from nest.core.problem import Problem
from nest.core.report import Report

FLOP_CONVENTION = (
    "model FLOPs = 3 x forward matmul FLOPs (Narayanan et al. SC21 §5.1: 24bsh^2 + 4bs^2h per "
    "block, 2bshV logits; GQA/SwiGLU/MoE as Megatron-LM's num_floating_point_operations), "
    "attention scores counted in full (no causal discount), no recompute; MFU = model FLOPs / "
    "(iteration time x devices used x peak)"
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
    return report.mfu * (flops - 0.5 * model.attention_score_flops_per_sample()) / flops


def mfu_figures(problem: Problem, report: Report) -> dict:
    """The ``report.json`` keys: ``mfu_causal`` and ``flop_convention``."""
    return {"mfu_causal": causal_mfu(problem, report), "flop_convention": FLOP_CONVENTION}
