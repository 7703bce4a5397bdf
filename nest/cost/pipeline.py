"""Pipeline-schedule formulas on per-rank times, shared by the evaluator and the planners.

``t_r = f_r + b_r`` is pipeline rank ``r``'s forward plus backward time for one microbatch, ``m``
the microbatches per replica, ``v`` the model chunks per device.

- 1F1B and GPipe (fill and drain with unequal stages): ``T = sum_r t_r + (m - 1) max_r t_r``.
  With equal stages this is the ``(m + p - 1) t`` of Narayanan et al. SC21 §2.2.1.
- Interleaved 1F1B: the bubble shrinks by ``v`` (SC21 §2.2.2, bubble ``(p-1)/v * t``):
  ``T = m max_r t_r + (sum_r t_r - max_r t_r) / v``, which is the 1F1B formula at ``v = 1``.
- In-flight microbatches (activations held) on rank ``r``: 1F1B ``min(p - r, m)`` (PipeDream-flush;
  Megatron-Core runs ``p - r - 1`` warm-up forwards); GPipe ``m``; interleaved: Megatron-Core's
  ``(p - r - 1) * 2 + (v - 1) * p`` warm-up chunk-forwards plus the one in steady state, capped
  at ``m v``, measured in whole-rank microbatches (divided by ``v``).
- Exposed DP synchronisation: under 1F1B rank ``r`` finishes its last backward ``sum_{j<r} b_j``
  before rank 0 does, and that much of its sync is hidden; with overlap enabled its own last
  backward ``b_r`` also hides it: ``exposed = max_r max(0, sync_r - sum_{j<r} b_j [- b_r])``.
  Under interleaving ``b_j`` is the backward of chunk ``j`` (rank ``j``'s first chunk), the last
  work left after rank ``r`` is done.
"""

from collections.abc import Sequence

from nest.core.axes import Schedule


def pipeline_coefficients(
    num_microbatches: int, schedule: Schedule, virtual_stages: int
) -> tuple[float, float]:
    """``(a, b)`` with ``T_pipe = a sum_r t_r + b max_r t_r``: 1F1B and GPipe ``(1, m - 1)``,
    interleaved ``(1/v, m - 1/v)`` (the module docstring's formulas, regrouped)."""
    if schedule is Schedule.INTERLEAVED:
        return 1.0 / virtual_stages, num_microbatches - 1.0 / virtual_stages
    return 1.0, float(num_microbatches - 1)


def pipeline_time_s(
    rank_times_s: Sequence[float], num_microbatches: int, schedule: Schedule, virtual_stages: int
) -> float:
    sum_coef, max_coef = pipeline_coefficients(num_microbatches, schedule, virtual_stages)
    return sum_coef * sum(rank_times_s) + max_coef * max(rank_times_s)


def in_flight_microbatches(
    rank: int, pp: int, num_microbatches: int, schedule: Schedule, virtual_stages: int
) -> float:
    if schedule is Schedule.GPIPE:
        return float(num_microbatches)
    if schedule is Schedule.INTERLEAVED:
        chunks = (pp - rank - 1) * 2 + (virtual_stages - 1) * pp + 1
        return min(chunks, num_microbatches * virtual_stages) / virtual_stages
    return float(min(pp - rank, num_microbatches))


def rank_exposed_sync_s(sync_s: float, hidden_s: float, own_bwd_s: float, overlap: bool) -> float:
    """The exposed part of one rank's DP synchronisation: ``max(0, sync - hidden [- own])``,
    ``hidden`` the backward left on the ranks before it, ``own`` its own last backward (with
    overlap)."""
    return max(0.0, sync_s - hidden_s - (own_bwd_s if overlap else 0.0))


def exposed_sync_s(sync_s: Sequence[float], bwd_s: Sequence[float], overlap: bool) -> list[float]:
    """Per-rank exposed part of the DP synchronisation (see the module docstring)."""
    out, hidden = [], 0.0
    for sync, bwd in zip(sync_s, bwd_s, strict=True):
        out.append(rank_exposed_sync_s(sync, hidden, bwd, overlap))
        hidden += bwd
    return out
