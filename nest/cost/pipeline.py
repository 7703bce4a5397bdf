"""Pipeline-schedule formulas on per-rank times, shared by the evaluator and the planners.

``t_r = f_r + b_r`` is pipeline rank ``r``'s forward plus backward time for one microbatch, ``m``
the microbatches per replica, ``v`` the model chunks per device, ``w_r`` the weight-gradient part
of ``b_r`` (:attr:`nest.core.layers.LayerCost.wgrad_s`) and ``b'_r = b_r - w_r`` the rest.

- 1F1B and GPipe (fill and drain with unequal stages): ``T = sum_r t_r + (m - 1) max_r t_r``.
  With equal stages this is the ``(m + p - 1) t`` of Narayanan et al. SC21 §2.2.1.
- Interleaved 1F1B: the bubble shrinks by ``v`` (SC21 §2.2.2, bubble ``(p-1)/v * t``):
  ``T = m max_r t_r + (sum_r t_r - max_r t_r) / v``, which is the 1F1B formula at ``v = 1``.
- ZB-H1 (Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1, Figure 3
  top, Table 2): the backward runs as B (input gradient, ``b'``) and W (weight gradient,
  ``w``); B of a stage waits only for the next stage's B, and each rank postpones the W passes
  of its first ``r`` microbatches into the cool-down. With equal stages and
  ``T_W <= min(T_F, T_B)`` its bubble is ``(p - 1)(T_F + T_B - T_W)`` against 1F1B's
  ``(p - 1)(T_F + T_B + T_W)`` (Table 2; the authors' README: a third of 1F1B's bubble when
  ``T_F = T_B = T_W``). The schedule run event by event (:mod:`nest.analysis.simulate`) takes,
  with equal stages and any ``T_F, T_B, T_W``, ``m (T_F + T_B + T_W) + (p - 1)(T_F + T_B - c)``
  with ``c = min(T_W, T_F, T_B)`` (the W passes fill the bubble only as far as a forward or a
  B pass leaves room), which is the paper's formula when ``T_W <= min(T_F, T_B)``. For unequal
  stages the cost model charges, per rank, ``c_r = min(w_r, f_r, b'_r)``,
  ``u_r = t_r - w_r - c_r`` and ``e_r = w_r + c_r``:

      ``T = sum_r u_r + (m - 1) max_r t_r + max_r e_r``,

  which is the equal-stage time above, lies between the slowest rank's work ``m max_r t_r``
  (``u_r + e_r = t_r``) and the 1F1B formula (``max_r e_r <= sum_r e_r``), and is, as the 1F1B
  formula is for 1F1B, an approximation of the schedule on unequal stages: the simulated time
  lies between ``m max_r t_r`` and the equal-stage time with every pass padded to its slowest
  rank's (the list schedule is monotone in each task's length), so the formula's error is at
  most ``max(padded, 1F1B formula) / (m max_r t_r) - 1`` (``tests/test_zero_bubble.py`` checks
  this on random stages; measured at most 13 % there, the 1F1B formula's on 1F1B 16 %).
  ZB-H1 needs ``m >= p`` and ``p >= 2`` (with one stage it is 1F1B).
- ZB-H2 (Qi et al. ICLR 2024 §2.2, Figure 3 bottom, Table 2): rank ``r`` runs ``2(p - r) - 1``
  warm-up forwards (enough to fill the wait for its first B when ``T_B <= T_F``), then B, W and
  F in turn, and postpones the W passes of its first ``2 r`` microbatches into the cool-down
  (ZB-H1 postpones ``r``); every rank holds ``2p - 1`` microbatches, the paper's peak
  ``(2p - 1) M_B``. The paper's bubble ``(p - 1)(T_F + T_B - 2 T_W)`` (zero at
  ``T_F = T_B = T_W``) is that of the parallelogram of consecutive iterations, which needs the
  optimizer step's global synchronisation replaced by post-validation (§4). The iteration here
  synchronises before the step (:mod:`nest.analysis.simulate`), and the schedule run event by
  event takes, with equal stages, ``m >= 2p - 1`` and any ``T_F, T_B, T_W``,
  ``m (T_F + T_B + T_W) + (p - 1) g`` with ``g = max(T_F, h)``,
  ``h = max(0, T_B - T_F, T_F + T_B - 2 T_W)``: rank ``r`` ends at
  ``m (T_F + T_B + T_W) + r T_F + (p - 1 - r) h`` (it starts after ``r T_F``; the last B
  reaches it ``(p - 1 - r)`` stages after the last rank's, with ``h`` per stage of what its
  postponed W passes and warm-up forwards do not cover: the paper's ``T_F + T_B - 2 T_W``
  at the tail, ``T_B - T_F`` when the warm-up forwards are shorter than the B passes they wait
  for), so ZB-H2 takes the paper's time ``m (T_F + T_B + T_W) + (p - 1)(T_F + T_B - 2 T_W)``
  where that bubble is at least ``(p - 1) max(T_F, T_B - T_F)``, else that floor; no
  schedule beats ``m (T_F + T_B + T_W) + (p - 1) T_F`` under the synchronised step (the last
  stage gets its first microbatch after ``(p - 1) T_F``). ``g <= T_F + T_B - min(T_W, T_F,
  T_B)``, so ZB-H2 is never slower than ZB-H1 on equal stages. For unequal stages, per rank
  ``h_r = max(0, b'_r - f_r, f_r + b'_r - 2 w_r)``, ``u_r = g_r = max(f_r, h_r)`` and
  ``e_r = t_r - g_r >= 0``, in the ZB-H1 formula above: the equal-stage time, between
  ``m max_r t_r`` and the 1F1B formula (``g_r <= t_r``); the simulated time lies between
  ``m max_r t_r`` and the padded equal-stage time, as for ZB-H1 (``tests/test_zero_bubble.py``
  checks this on random stages; measured from 5.5 % below to 13 % above there). ZB-H2 needs
  ``m >= 2p - 1`` and ``p >= 2``.
- ZB-V (Qi, Wan, Huang, Lin, "Pipeline Parallelism with Controllable Memory", NeurIPS 2024,
  arXiv 2405.15362 §3 and §4, the V-ZB schedule; the order of PyTorch's
  ``ScheduleZBVZeroBubble._calculate_single_rank_operations``,
  pytorch/pytorch@1fd7abc2f521:torch/distributed/pipelining/schedules.py): ``2p`` chunks, rank
  ``r`` holds chunk ``r`` and chunk ``2p - 1 - r`` (:func:`nest.core.plan.chunk_rank`), and runs
  ``2(p - r) - 1`` forwards of its first chunk, ``r`` pairs of forwards (second chunk, first),
  ``p - r`` triples F, B, W of its second chunk, then F, B, W of the first chunk and F, B, W of
  the second in turn, and a cool-down of ``r`` B pairs, ``p - r`` (B, W) of the first chunk and
  the postponed W passes. With equal chunks (per chunk ``f``, B pass ``b``, W pass ``w``) and
  ``m >= 2p - 1`` the schedule run event by event (:mod:`nest.analysis.simulate`) ends rank
  ``r`` at ``2m (f + b + w) + l_r``, the lag ``l_r`` (:func:`zb_v_lags_s`) the largest of a few
  paths of its task graph, each linear in ``f, b, w`` with coefficients in ``q = p - 1`` and
  ``r`` (read off the simulator's critical paths on random ``f, b, w`` and checked against it to
  1e-12 by ``tests/test_zb_v.py``); at ``f = b = w`` the pipeline takes ``2m (f + b + w) +
  (p - 1) f``, the synchronised floor (the last rank gets its first microbatch after ``(p - 1)
  f``; the paper's zero bubble is that of consecutive iterations without the step's global
  synchronisation). For unequal chunks the cost model charges ``T = m max_r t_r + max_r
  l_r(F, B, W)``, ``F, B, W`` each chunk's largest pass, ``t_r`` rank ``r``'s two chunks'
  forward and backward: exact on equal chunks, between ``m max_r t_r`` and the equal-chunk time
  with every pass padded to its largest (the list schedule is monotone in each task's length),
  as the simulated time is. ZB-V needs ``m >= 2p - 1`` and ``p >= 2``. The V keeps the
  hand-off between chunks ``p - 1`` and ``p`` on the last rank (no point-to-point transfer,
  :mod:`nest.cost.evaluate`), and rank 0 holds both the embedding and the loss
  (sail-sg/zero-bubble-pipeline-parallelism issue #36), so no rank holds a tied copy of the
  word embedding.
- In-flight microbatches (activations held) on rank ``r``: 1F1B ``min(p - r, m)`` (PipeDream-flush;
  Megatron-Core runs ``p - r - 1`` warm-up forwards); GPipe ``m``; interleaved: Megatron-Core's
  ``(p - r - 1) * 2 + (v - 1) * p`` warm-up chunk-forwards plus the one in steady state, capped
  at ``m v``, measured in whole-rank microbatches (divided by ``v``); ZB-H2 ``2p - 1`` on every
  rank (``2(p - r) - 1`` warm-up forwards and ``2 r`` postponed W passes; §2.2, Table 2's
  ``(2p - 1) M_B``, charged as for ZB-H1 below); ZB-H1 ``min(p, m)`` on
  every rank: ``p - r`` microbatches between their F and their B, and the ``r`` postponed ones
  between B and W (§2.1: "all pipeline stages have the same number of in-flight
  microbatches"). A microbatch waiting for its W keeps what W reads (each linear layer's input
  and its output gradient), less than its B needs (Table 1); the model charges it a whole
  microbatch's activations, an upper bound, so every ZB-H1 rank holds the ``p M_B`` of the
  paper's Table 2, 1F1B's rank 0.
  ZB-V: every rank holds ``2p`` chunk-microbatches between a chunk's F and its W at its peak
  (counted on the order above; :mod:`nest.analysis.simulate` measures it), ``p`` whole-rank
  microbatches: 1F1B's rank 0, the V-ZB peak of arXiv 2405.15362 §4 ("the same peak memory
  as 1F1B"). DualPipeV: ``2p + 1`` chunk-microbatches, ``p + 1/2`` whole-rank ones
  (:mod:`nest.cost.dualpipe`, which also gives its pipeline time and exposed sync).
- Exposed DP synchronisation under ZB-V: rank ``r`` ends ``max_s l_s - l_r`` before the pipeline
  (exact on equal chunks), which hides that much of its sync; with overlap its last task, a W
  pass (of chunk ``2p - 1`` on rank 0, of chunk ``r`` elsewhere), hides it too.
- Exposed DP synchronisation: under 1F1B rank ``r`` finishes its last backward ``sum_{j<r} b_j``
  before rank 0 does, and that much of its sync is hidden; with overlap enabled its own last
  backward ``b_r`` also hides it: ``exposed = max_r max(0, sync_r - sum_{j<r} b_j [- b_r])``.
  Under interleaving ``b_j`` is the backward of chunk ``j`` (rank ``j``'s first chunk), the last
  work left after rank ``r`` is done. Under ZB-H1 every rank ends with its postponed W passes:
  its last B ends ``sum_{j<r} b'_j`` before rank 0's, then it runs ``r`` more W passes than
  rank 0 does, so it finishes ``max(0, sum_{j<r} b'_j - r w_r)`` before rank 0 (exact for
  equal stages with ``T_W <= T_B``), and with overlap its own last W (``w_r``) hides the sync.
  Under ZB-H2 rank ``r`` ends ``r (h - T_F)`` before rank 0 when ``h >= T_F`` (rank 0 ends
  last) and ``(p - 1 - r)(T_F - h)`` before the last rank otherwise (ZB-H2's end times above),
  so, with ``d_j = h_j - f_j``, its sync is hidden by ``sum_{j<r} max(0, d_j) + (p - 1 - r)
  max(0, -d_r)`` (exact on equal stages: one of the two terms is 0; on unequal stages an
  approximation like the others), and with overlap by its own last W too; as under 1F1B the
  hidden time is non-decreasing and 1-Lipschitz in the prefix sum (the DP's dominance rule,
  :mod:`nest.dp.recurrence`, needs that). The positive parts keep the prefix sum at 0 while
  ``h < f``, the usual case (``T_B`` near ``T_F`` and ``T_W``), so the DP's labels do not
  multiply on a sum that hides nothing.
- The ``sync`` above is the gradient part of the synchronisation (ZeRO-0's all-reduce,
  ZeRO-1/2's reduce-scatter: :meth:`nest.cost.state.ModelState.reduce_s`), which must end
  before the optimizer step. ZeRO-1/2's all-gather of the updated weights
  (:meth:`nest.cost.state.ModelState.gather_s`, ``a_r``) follows the step, so no backward hides
  it; with overlap it runs under the rank's first forward of the next iteration (Megatron-Core
  ``--overlap-param-gather``: NVIDIA/Megatron-LM@baf94af3c667 (core_r0.8.0),
  ``megatron/core/optimizer/distrib_optimizer.py``, the all-gather launched in ``zero_grad``
  "before forward compute is initiated" and waited on bucket by bucket in the forward pre-hook).
  Each rank adds ``g_r = max(0, a_r [- f_r])`` (:func:`gather_exposed_s`; ``f_r`` the forward
  of its first chunk, one microbatch: the first work it runs) to its exposed sync:
  ``max(0, sync_r - hidden_r [- own_r]) + g_r``. ``g_r`` depends on the rank's own stage only,
  so the DP's dominance rule is unchanged.
"""

from collections.abc import Sequence

import numpy as np

from nest.core.axes import Schedule
from nest.cost.dualpipe import in_flight_chunks


def pipeline_coefficients(
    num_microbatches: int, schedule: Schedule, virtual_stages: int
) -> tuple[float, float]:
    """``(a, b)`` with ``T_pipe = a sum_r u_r + b max_r t_r + max_r e_r``: 1F1B, GPipe and
    ZB-H1 ``(1, m - 1)``, interleaved ``(1/v, m - 1/v)`` (the module docstring's formulas,
    regrouped; ``u = t`` and ``e = 0`` but under ZB-H1, :func:`rank_pipeline_terms`)."""
    if schedule is Schedule.INTERLEAVED:
        return 1.0 / virtual_stages, num_microbatches - 1.0 / virtual_stages
    return 1.0, float(num_microbatches - 1)


def rank_pipeline_terms(fwd_s, bwd_s, wgrad_s, schedule: Schedule):
    """``(u_r, t_r, e_r)`` of one rank (scalars or numpy rows): its share of the pipeline's sum
    term, of its max term and of its tail term (module docstring). ``t = f + b``; ZB-H1
    ``u = t - w - c``, ``e = w + c`` with ``c = min(w, f, b - w)``; ZB-H2 ``u = max(f, h)``,
    ``e = t - u`` (:func:`zb_h2_lag_s`); otherwise ``u = t``, ``e = 0``."""
    t = fwd_s + bwd_s
    if not schedule.splits_backward:
        return t, t, 0.0 * t
    if schedule is Schedule.ZB_H2:
        u = np.maximum(fwd_s, zb_h2_lag_s(fwd_s, bwd_s, wgrad_s))
        return u, t, t - u
    credit = np.minimum(np.minimum(wgrad_s, fwd_s), bwd_s - wgrad_s)
    return t - wgrad_s - credit, t, wgrad_s + credit


def zb_h2_lag_s(fwd_s, bwd_s, wgrad_s):
    """ZB-H2's ``h = max(0, b' - f, f + b' - 2 w)`` of one rank (``b' = b - w`` its B pass;
    scalars or numpy rows): how much later than its work alone the last B lets each stage end
    (module docstring)."""
    b_pass = bwd_s - wgrad_s
    return np.maximum(np.maximum(b_pass - fwd_s, fwd_s + b_pass - 2.0 * wgrad_s), 0.0)


def rank_drain_s(fwd_s, bwd_s, wgrad_s, schedule: Schedule):
    """What one rank adds to the prefix sum that hides the later ranks' sync (module
    docstring): its backward ``b`` (1F1B, interleaved), its B pass ``b - w`` (ZB-H1); under
    ZB-H2 ``d = h - f``, signed: the prefix sum adds ``max(0, d)`` and the rank's own hidden
    time is ``(p - 1 - r) max(0, -d)`` (:func:`sync_hidden_s`)."""
    if schedule is Schedule.ZB_H2:
        return zb_h2_lag_s(fwd_s, bwd_s, wgrad_s) - fwd_s
    if schedule.splits_backward:
        return bwd_s - wgrad_s
    return bwd_s


def pipeline_time_s(
    rank_times_s: Sequence[float],
    num_microbatches: int,
    schedule: Schedule,
    virtual_stages: int,
    *,
    sum_terms_s: Sequence[float] | None = None,
    tail_terms_s: Sequence[float] | None = None,
) -> float:
    """``a sum_r u_r + b max_r t_r + max_r e_r`` (:func:`pipeline_coefficients`); ``u`` and ``e``
    default to ``t`` and 0 (every schedule but ZB-H1, :func:`rank_pipeline_terms`)."""
    sum_coef, max_coef = pipeline_coefficients(num_microbatches, schedule, virtual_stages)
    sums = rank_times_s if sum_terms_s is None else sum_terms_s
    tail = 0.0 if tail_terms_s is None else max(tail_terms_s)
    return sum_coef * sum(sums) + max_coef * max(rank_times_s) + tail


def in_flight_microbatches(
    rank: int, pp: int, num_microbatches: int, schedule: Schedule, virtual_stages: int
) -> float:
    if schedule is Schedule.GPIPE:
        return float(num_microbatches)
    if schedule is Schedule.INTERLEAVED:
        chunks = (pp - rank - 1) * 2 + (virtual_stages - 1) * pp + 1
        return min(chunks, num_microbatches * virtual_stages) / virtual_stages
    if schedule is Schedule.ZB_H1:
        return float(min(pp, num_microbatches))
    if schedule is Schedule.ZB_H2:
        return float(min(2 * pp - 1, num_microbatches))
    if schedule is Schedule.ZB_V:
        return float(min(pp, num_microbatches))
    if schedule is Schedule.DUALPIPE_V:  # 2 pp + 1 chunk-microbatches (nest.cost.dualpipe)
        return in_flight_chunks(pp, num_microbatches, rank) / 2.0
    return float(min(pp - rank, num_microbatches))


def rank_exposed_sync_s(
    sync_s: float, hidden_s: float, own_bwd_s: float, overlap: bool, gather_exposed: float = 0.0
) -> float:
    """The exposed part of one rank's DP synchronisation: ``max(0, sync - hidden [- own]) + g``,
    ``sync`` its gradient part, ``hidden`` the backward left on the ranks before it, ``own`` its
    own last backward (with overlap), ``g`` its weight all-gather's exposed part
    (:func:`gather_exposed_s`; module docstring)."""
    return max(0.0, sync_s - hidden_s - (own_bwd_s if overlap else 0.0)) + gather_exposed


def gather_exposed_s(gather_s, first_fwd_s, overlap: bool):
    """The part of a rank's ZeRO-1/2 weight all-gather (``gather_s``, after the optimizer step)
    that the next iteration's first forward does not hide: ``max(0, gather - first_fwd)`` with
    overlap, all of it without (module docstring). Scalars or numpy rows."""
    if not overlap:
        return gather_s + 0.0 * first_fwd_s
    return np.maximum(0.0, gather_s - first_fwd_s)


def sync_hidden_s(
    rank: int,
    drain_s: float,
    wgrad_s: float,
    schedule: Schedule,
    *,
    pp: int = 0,
    own_drain_s: float = 0.0,
) -> float:
    """How long before the pipeline's end rank ``rank`` finishes its work: ``drain_s`` (the
    prefix sum of :func:`rank_drain_s` over the ranks before it: ``sum_{j<r} b_j``, ZB-H1
    ``sum_{j<r} b'_j``) less, under ZB-H1, the ``r`` W passes it postpones more than rank 0,
    never below 0; under ZB-H2 ``drain_s + (pp - 1 - r) max(0, -own_drain_s)`` (``drain_s``
    then the sum of the earlier ranks' ``max(0, h - f)``, ``own_drain_s`` its own ``h - f``;
    module docstring)."""
    if schedule is Schedule.ZB_H2:
        return drain_s + (pp - 1 - rank) * max(0.0, -own_drain_s)
    if schedule.splits_backward:
        return max(0.0, drain_s - rank * wgrad_s)
    return drain_s


def exposed_sync_s(
    sync_s: Sequence[float],
    bwd_s: Sequence[float],
    overlap: bool,
    *,
    wgrad_s: Sequence[float] | None = None,
    fwd_s: Sequence[float] | None = None,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    gather_exposed: Sequence[float] | None = None,
) -> list[float]:
    """Per-rank exposed part of the DP synchronisation (see the module docstring). ``sync_s``:
    each rank's gradient part; ``bwd_s``: its last backward (its first chunk's); ``wgrad_s``: its
    W part (zero-bubble), which is then the own work that overlaps the sync, the rest what drains
    past later ranks; ``fwd_s``: its forward (ZB-H2's drain, :func:`rank_drain_s`; needed there);
    ``gather_exposed``: its weight all-gather's exposed part (:func:`gather_exposed_s`), added."""
    pp = len(sync_s)
    w = [0.0] * pp if wgrad_s is None or not schedule.splits_backward else wgrad_s
    f = [0.0] * pp if fwd_s is None else fwd_s
    if schedule is Schedule.ZB_H2 and fwd_s is None:
        raise ValueError("exposed_sync_s needs fwd_s under zb_h2")
    g = [0.0] * pp if gather_exposed is None else gather_exposed
    out, drain = [], 0.0
    for r, (sync, bwd, wr, fr, gr) in enumerate(zip(sync_s, bwd_s, w, f, g, strict=True)):
        own_drain = float(rank_drain_s(fr, bwd, wr, schedule))
        hidden = sync_hidden_s(r, drain, wr, schedule, pp=pp, own_drain_s=own_drain)
        own = wr if schedule.splits_backward else bwd
        out.append(rank_exposed_sync_s(sync, hidden, own, overlap, float(gr)))
        drain += max(0.0, own_drain) if schedule is Schedule.ZB_H2 else own_drain
    return out


def zb_v_lag_coefficients(pp: int, rank: int) -> list[tuple[int, int, int]]:
    """The paths whose largest sets ZB-V's lag ``l_r`` (module docstring): ``(a, c, d)`` with the
    path ``2m (f + b + w) + a f + c b + d w`` long, ``q = pp - 1``. Rank 0's last tasks are its
    postponed W passes (the ``0`` path and the ``j`` B passes of the other ranks'
    cool-down less their W), a later rank's its first chunk's cool-down; the ``2q`` forwards
    are the V's walk down and up to the last chunk before its first B. Read off the simulator's
    critical paths; ``tests/test_zb_v.py`` checks their largest against it on random equal
    chunks."""
    q, r = pp - 1, rank
    rows = [
        (0, q, r - q),
        (0, 2 * q - r, -2 * (q - r)),
        (q, q - r, -2 * (q - r)),
        (2 * q - 1, 1 - r, -2 * (q - r)),
        (2 * q, -r, -2 * (q - r) - 1),
    ]
    if r == 0:
        return rows + [(0, 0, 0), (2 * q, -q, -q)]
    return rows + [
        (0, 1, r - 1),
        (1, 0, r - 1),
        (r, 0, 0),
        (2 * q - 1, 1 - q, r - q),
        (2 * q, -q, r - q - 1),
    ]


def zb_v_lags_s(pp: int, fwd_s: float, b_pass_s: float, wgrad_s: float) -> list[float]:
    """Per rank, how long after ``2m (f + b + w)`` ZB-V ends it on equal chunks of forward
    ``f``, B pass ``b`` and W pass ``w`` (:func:`zb_v_lag_coefficients`; ``m >= 2 pp - 1``)."""
    return [
        max(a * fwd_s + c * b_pass_s + d * wgrad_s for a, c, d in zb_v_lag_coefficients(pp, r))
        for r in range(pp)
    ]


def zb_v_pipeline_s(
    rank_times_s: Sequence[float],
    num_microbatches: int,
    chunk_fwd_s: Sequence[float],
    chunk_bwd_s: Sequence[float],
    chunk_wgrad_s: Sequence[float],
) -> tuple[float, list[float]]:
    """ZB-V's pipeline time ``m max_r t_r + max_r l_r(F, B, W)`` and each rank's hidden sync
    ``max_s l_s - l_r`` (module docstring), from the ranks' ``t_r`` and the chunks' forward,
    backward (B and W) and W seconds; ``F, B, W`` the chunks' largest passes."""
    pp = len(rank_times_s)
    b_pass = max(b - w for b, w in zip(chunk_bwd_s, chunk_wgrad_s, strict=True))
    lags = zb_v_lags_s(pp, max(chunk_fwd_s), b_pass, max(chunk_wgrad_s))
    top = max(lags)
    return num_microbatches * max(rank_times_s) + top, [top - lag for lag in lags]


def zb_v_exposed_sync_s(
    sync_s: Sequence[float],
    hidden_s: Sequence[float],
    last_wgrad_s: Sequence[float],
    overlap: bool,
    gather_exposed: Sequence[float] | None = None,
) -> list[float]:
    """ZB-V's exposed sync per rank: ``max(0, sync - hidden [- last W]) + g`` (module
    docstring; ``g`` the weight all-gather's exposed part, :func:`gather_exposed_s`)."""
    g = [0.0] * len(sync_s) if gather_exposed is None else gather_exposed
    return [
        rank_exposed_sync_s(s, h, w, overlap, float(a))
        for s, h, w, a in zip(sync_s, hidden_s, last_wgrad_s, g, strict=True)
    ]
