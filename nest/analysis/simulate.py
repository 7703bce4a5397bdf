"""Discrete-event simulation of one training iteration of a plan.

The analytic pipeline formula of the cost model (``sum_r t_r + (m-1) max_r t_r``,
:mod:`nest.cost.pipeline`) is exact for equal stages and an approximation otherwise. This module
runs the schedule itself to measure that approximation. The tasks and their durations come from
the shared evaluator's report (so both see the same per-chunk forward and backward times, each
including the blocking send of its output):

- ``F(k, j)``: forward of chunk ``k`` on microbatch ``j``; needs ``F(k-1, j)``.
- ``B(k, j)``: backward of chunk ``k`` on microbatch ``j``; needs ``F(k, j)`` and ``B(k+1, j)``.
  Under a zero-bubble schedule it is the input-gradient pass only (``bwd_s - wgrad_s``), and
- ``W(k, j)``: the weight-gradient pass (``wgrad_s``) of chunk ``k`` on microbatch ``j``; needs
  ``B(k, j)`` (earlier on the same rank).
- Each pipeline rank executes its tasks in the order its schedule prescribes:
  GPipe (all forwards, then all backwards), 1F1B (``pp - r - 1`` warm-up forwards, then one
  forward / one backward, then the cool-down backwards; Narayanan et al. SC21 §2.2.1) or
  Megatron-Core's interleaved 1F1B (``(pp - r - 1) * 2 + (v - 1) * pp`` warm-up chunk-forwards,
  chunks visited in groups of ``pp`` microbatches; SC21 §2.2.2 and Megatron-Core's schedules)
  or ZB-H1 (Qi et al. ICLR 2024 §2.1, Figure 3 top: 1F1B's warm-up, then one F, one B and,
  once rank ``r`` has ``r`` W passes pending, one W; the ``r`` postponed W passes run after its
  last B, filling the cool-down bubble) or ZB-H2 (§2.2, Figure 3 bottom: ``2 (pp - r) - 1``
  warm-up forwards, then B, W and F in turn with the W passes of the first ``2 r``
  microbatches postponed past the last B) or ZB-V (two chunks per rank in a V,
  :func:`zb_v_order`) or DualPipeV (the same V; DeepSeek's order with full backwards and
  overlapped forward-and-backward tasks, :func:`nest.cost.dualpipe.dualpipe_v_order`, run by
  the cost model's :func:`~nest.cost.dualpipe.run_dualpipe_v`: a full backward is drawn as its
  B then its W, an overlapped one as its forward, B and W in proportion to their lone times,
  and hands its outputs on at its end).
  A task starts when its rank is free and its dependencies are done (list scheduling).
- After its last backward a rank synchronises its gradients (the gradient part of
  ``dp_sync_s`` of the report); with ``overlap_grad_sync`` the sync may start when that last
  backward starts. ZeRO-1/2's weight all-gather (``dp_gather_s``) runs after the step, under
  the next iteration's first forward with overlap; its exposed part
  (:func:`nest.cost.pipeline.gather_exposed_s`) is drawn, as the evaluator charges it, after
  the rank's own sync or the pipeline's end, whichever is later. The optimizer step starts when
  every rank's sync is done (Megatron's global gradient-norm clipping) and lasts the slowest
  rank's step.

Returns the makespan, each rank's busy and idle time, the task timeline and the peak number of
in-flight microbatches per rank; :func:`plot_timeline` draws the timeline as in the 1F1B papers.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

from nest.core.axes import Schedule
from nest.core.files import atomic_path
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.progress import Progress
from nest.core.report import Report
from nest.cost import evaluate
from nest.cost.dualpipe import run_dualpipe_v
from nest.cost.pipeline import gather_exposed_s


class Task(NamedTuple):
    """One piece of work on one pipeline rank; times in seconds from the iteration start."""

    rank: int
    kind: str
    """``F`` forward, ``B`` backward (zero-bubble: input gradient), ``W`` weight gradient
    (zero-bubble), ``sync`` DP gradient sync, ``opt`` optimizer step."""
    chunk: int
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    makespan_s: float
    """Simulated iteration time."""
    pipeline_s: float
    """End of the last backward (the simulated counterpart of ``pipeline_time_s``)."""
    analytic_s: float
    """``evaluate(problem, plan).iteration_time_s`` for the same plan."""
    busy_s: tuple[float, ...]
    """Per rank: time spent in forward and backward (B and W) tasks."""
    idle_s: tuple[float, ...]
    """Per rank: ``pipeline_s`` minus busy time (bubbles and waits)."""
    peak_in_flight: tuple[float, ...]
    """Per rank: most microbatches whose activations were held at once (whole-rank units)."""
    tasks: tuple[Task, ...]

    @property
    def relative_error(self) -> float:
        """How far the analytic formula is from the simulation: ``analytic / simulated - 1``."""
        return self.analytic_s / self.makespan_s - 1.0


def rank_order(plan: Plan, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, chunk, microbatch) sequence pipeline rank ``rank`` executes."""
    pp, m, v = plan.pp, plan.num_microbatches, plan.virtual_stages
    if plan.schedule is Schedule.GPIPE:
        return [("F", rank, j) for j in range(m)] + [("B", rank, j) for j in range(m)]
    if plan.schedule is Schedule.ZB_H1:
        return zb_h1_order(pp, m, rank)
    if plan.schedule is Schedule.ZB_H2:
        return zb_h2_order(pp, m, rank)
    if plan.schedule is Schedule.ZB_V:
        return zb_v_order(pp, m, rank)
    if plan.schedule is Schedule.ONE_F_ONE_B:
        warm = min(pp - rank - 1, m)
        order = [("F", rank, j) for j in range(warm)]
        for i in range(m - warm):
            order += [("F", rank, warm + i), ("B", rank, i)]
        return order + [("B", rank, j) for j in range(m - warm, m)]
    total = m * v

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        group = (k % (pp * v)) // pp
        local = group if forward else v - 1 - group
        return local * pp + rank, (k // (pp * v)) * pp + k % pp

    warm = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    order = [("F", *virtual(k, True)) for k in range(warm)]
    for i in range(total - warm):
        order += [("F", *virtual(warm + i, True)), ("B", *virtual(i, False))]
    return order + [("B", *virtual(k, False)) for k in range(total - warm, total)]


def zb_h1_order(pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """ZB-H1's order on rank ``rank`` (Qi et al. ICLR 2024 §2.1, Figure 3 top): 1F1B's
    ``pp - rank - 1`` warm-up forwards, then F and B alternately, each B followed by the
    oldest pending W once more than ``rank`` are pending; after the last B the pending W passes.
    Every rank thus holds ``pp`` microbatches between F and W (``min(pp, m)``)."""
    return _split_backward_order(m, rank, min(pp - rank - 1, m), rank, backward_first=False)


def zb_h2_order(pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """ZB-H2's order on rank ``rank`` (Qi et al. ICLR 2024 §2.2, Figure 3 bottom): ``2 (pp -
    rank) - 1`` warm-up forwards (they fill rank 0's wait for its first B when ``T_B <= T_F``),
    then a B, the oldest pending W once more than ``2 rank`` are pending, and the next F; after
    the last B the pending W passes. Every rank thus holds ``2 pp - 1`` microbatches between F
    and W (needs ``m >= 2 pp - 1``; with fewer, as many as there are)."""
    return _split_backward_order(m, rank, min(2 * (pp - rank) - 1, m), 2 * rank, True)


def zb_v_order(pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """ZB-V's order on rank ``rank``, whose chunks are ``rank`` and ``2 pp - 1 - rank``: PyTorch's
    ``ScheduleZBVZeroBubble._calculate_single_rank_operations``
    (pytorch/pytorch@1fd7abc2f521:torch/distributed/pipelining/schedules.py; Qi et al. arXiv
    2405.15362 §3): ``2 (pp - rank) - 1`` forwards of the first chunk, ``rank`` pairs (F of the
    second chunk, F of the first), ``pp - rank`` triples F, B, W of the second chunk, then until
    every forward ran F, B, W of the first chunk (its F while any is left) and F, B, W of the
    second; the cool-down runs ``rank`` pairs of B passes (first chunk, second), ``pp - rank``
    (B, W) of the first chunk, then the second chunk's and the first's postponed W passes. As
    PyTorch does, the order is built for ``max(m, 2 pp - 1)`` microbatches and the tasks of
    microbatches ``>= m`` are dropped (the evaluator asks ``m >= 2 pp - 1``)."""
    n = max(m, 2 * pp - 1)
    first, second = rank, 2 * pp - 1 - rank
    order: list[tuple[str, int, int]] = []
    count = {("F", first): 0, ("F", second): 0, ("B", first): 0, ("B", second): 0}
    done_w = {first: 0, second: 0}

    def put(kind: str, chunk: int, weight: bool = False) -> None:
        j = count[(kind, chunk)]
        order.append((kind, chunk, j))
        count[(kind, chunk)] = j + 1
        if weight:  # the W pass right after its B
            order.append(("W", chunk, j))
            done_w[chunk] = j + 1

    for _ in range(2 * (pp - rank) - 1):
        put("F", first)
    for _ in range(rank):
        put("F", second)
        put("F", first)
    for _ in range(pp - rank):
        put("F", second)
        put("B", second, weight=True)
    while count[("F", second)] < count[("F", first)] or count[("F", first)] < n:
        if count[("F", first)] < n:
            put("F", first)
        put("B", first, weight=True)
        put("F", second)
        put("B", second, weight=True)
    for _ in range(rank):
        put("B", first)
        put("B", second)
    for _ in range(pp - rank):  # each B with the oldest pending W of the first chunk
        put("B", first)
        order.append(("W", first, done_w[first]))
        done_w[first] += 1
    for chunk in (second, first):
        order += [("W", chunk, j) for j in range(done_w[chunk], count[("B", chunk)])]
    return [task for task in order if task[2] < m]


def _split_backward_order(
    m: int, rank: int, warm: int, pending: int, backward_first: bool
) -> list[tuple[str, int, int]]:
    """The zero-bubble schedules' common order: ``warm`` forwards, then per remaining microbatch
    an F and a B (the B first when ``backward_first``), each B followed by the oldest pending W
    once more than ``pending`` are pending; then the remaining B and W passes."""
    order = [("F", rank, j) for j in range(warm)]
    done_b = done_w = 0

    def backward() -> None:
        nonlocal done_b, done_w
        order.append(("B", rank, done_b))
        done_b += 1
        if done_b - done_w > pending:
            order.append(("W", rank, done_w))
            done_w += 1

    for j in range(warm, m):
        if backward_first:
            backward()
        order.append(("F", rank, j))
        if not backward_first:
            backward()
    while done_b < m:
        backward()
    order += [("W", rank, j) for j in range(done_w, m)]
    return order


def simulate(problem: Problem, plan: Plan, report: Report | None = None) -> SimResult:
    """Run one iteration of ``plan`` event by event (see the module docstring)."""
    report = report or evaluate(problem, plan)
    overlap = problem.training.overlap_grad_sync
    return simulate_schedule(
        plan,
        fwd_s=[s.fwd_s for s in report.stages],
        bwd_s=[s.bwd_s for s in report.stages],
        wgrad_s=[s.wgrad_s for s in report.stages],
        sync_s=[rk.dp_reduce_s for rk in report.ranks],
        optimizer_s=[rk.optimizer_s for rk in report.ranks],
        overlap_grad_sync=problem.training.overlap_grad_sync,
        gather_s=[
            float(gather_exposed_s(rk.dp_gather_s, report.stages[r].fwd_s, overlap))
            for r, rk in enumerate(report.ranks)
        ],
        analytic_s=report.iteration_time_s,
        fwd_compute_s=[s.compute_fwd_s for s in report.stages],
        bwd_compute_s=[s.compute_bwd_s + s.recompute_s for s in report.stages],
    )


def _list_schedule(plan: Plan, orders, fwd: list[float], bwd: list[float], wgrad: list[float]):
    """Run every rank's forwards and backwards (B and W) in its order
    (:func:`simulate_schedule`; ``bwd`` the B passes, ``wgrad`` the W passes):
    ``(rank, kind, chunk, microbatch, start, end)`` of each task, and each rank's free time."""
    n_chunks, m, pp = len(plan.stages), plan.num_microbatches, plan.pp
    total = sum(len(o) for o in orders)
    # end time of F(k, j) / B(k, j), None until it ran; B of chunk n_chunks counts as done at 0
    f_end: list[list[float | None]] = [[None] * m for _ in range(n_chunks)]
    b_end: list[list[float | None]] = [[None] * m for _ in range(n_chunks)] + [[0.0] * m]
    next_task = [0] * pp
    free_at = [0.0] * pp
    raw: list[tuple[int, str, int, int, float, float]] = []
    record = raw.append
    with Progress(f"simulating {total:,} tasks on {pp} pipeline ranks", total=total) as progress:
        while len(raw) < total:
            before = len(raw)
            for r in range(pp):
                order, i, free = orders[r], next_task[r], free_at[r]
                n = len(order)
                while i < n:
                    kind, k, j = order[i]
                    if kind == "F":
                        dep = f_end[k - 1][j] if k else free
                        if dep is None:
                            break
                        start = free if free >= dep else dep
                        end = start + fwd[k]
                        f_end[k][j] = end
                    elif kind == "W":  # its B ran earlier on this rank
                        start, end = free, free + wgrad[k]
                    else:
                        dep, later = f_end[k][j], b_end[k + 1][j]
                        if dep is None or later is None:
                            break
                        start = max(free, dep, later)
                        end = start + bwd[k]
                        b_end[k][j] = end
                    record((r, kind, k, j, start, end))
                    free = end
                    i += 1
                next_task[r], free_at[r] = i, free
            if len(raw) == before:
                raise AssertionError(f"schedule {plan.schedule} deadlocked; this is a bug")
            progress.done = len(raw)
    return raw, free_at


def _dualpipe_v_tasks(plan: Plan, fwd, bwd, wgrad, fwd_compute, bwd_compute):
    """DualPipeV's tasks as ``(rank, kind, chunk, microbatch, start, end)`` and each rank's end
    (module docstring): the cost model's list schedule, a full backward split into its B and
    W, an overlapped task into its forward, B and W in proportion to their lone times."""
    fwd_compute = fwd if fwd_compute is None else [float(x) for x in fwd_compute]
    bwd_compute = bwd if bwd_compute is None else [float(x) for x in bwd_compute]
    ops, free_at = run_dualpipe_v(
        plan.pp, plan.num_microbatches, fwd, fwd_compute, bwd, bwd_compute, wgrad
    )
    raw = []
    for r, op, start, end in ops:
        if op[0] in ("F", "B", "W"):
            raw.append((r, op[0], op[1], op[2], start, end))
            continue
        parts = [
            ("B", op[-2], op[-1], bwd[op[-2]] - wgrad[op[-2]]),
            ("W", op[-2], op[-1], wgrad[op[-2]]),
        ]
        if op[0] == "FB":
            parts.insert(0, ("F", op[1], op[2], fwd[op[1]]))
        scale, at = (end - start) / (sum(p[3] for p in parts) or 1.0), start
        for i, (kind, k, j, length) in enumerate(parts):
            stop = end if i == len(parts) - 1 else at + length * scale
            raw.append((r, kind, k, j, at, stop))
            at = stop
    return raw, free_at


def _busy_and_peak(raw, pp: int, zero_bubble: bool) -> tuple[list[float], list[int]]:
    """Per rank: seconds busy computing, and the most microbatches' activations held at once."""
    busy = [0.0] * pp
    events: list[list[tuple[float, int]]] = [[] for _ in range(pp)]
    for r, kind, _, _, start, end in raw:
        busy[r] += end - start
        # a forward holds its activations from its start until its backward (zero-bubble: its
        # W pass) ends
        if kind == "F":
            events[r].append((start, 1))
        elif kind == ("W" if zero_bubble else "B"):
            events[r].append((end, -1))
    peak = []
    for rank_events in events:
        held = best = 0
        for _, delta in sorted(rank_events):  # at equal times a release (-1) comes first
            held += delta
            best = max(best, held)
        peak.append(best)
    return busy, peak


def simulate_schedule(
    plan: Plan,
    *,
    fwd_s,
    bwd_s,
    sync_s,
    optimizer_s,
    wgrad_s=None,
    overlap_grad_sync: bool = False,
    analytic_s: float = float("nan"),
    fwd_compute_s=None,
    bwd_compute_s=None,
    gather_s=None,
) -> SimResult:
    """The simulation on given per-chunk forward/backward and per-rank sync/step seconds
    (``gather_s``: each rank's exposed weight all-gather, module docstring; default none)
    (``wgrad_s``: the weight-gradient part of each chunk's backward, run as its own W task
    under a zero-bubble schedule; ignored otherwise; ``fwd_compute_s``, ``bwd_compute_s``: the
    compute in each chunk's passes, which DualPipeV's overlapped tasks need,
    :func:`nest.cost.dualpipe.overlapped_s`; default the whole pass, nothing to hide).

    List scheduling, round by round: each rank runs its next tasks in order until one waits for
    a task of another rank. A task's start is the latest of its rank's free time and its
    dependencies' ends; the loop only decides the order in which these are computed.
    """
    pp = plan.pp
    fwd, bwd = [float(x) for x in fwd_s], [float(x) for x in bwd_s]
    zero_bubble = plan.schedule.splits_backward
    wgrad = [float(x) for x in wgrad_s] if wgrad_s is not None else [0.0] * len(fwd)
    if plan.schedule is Schedule.DUALPIPE_V:
        raw, free_at = _dualpipe_v_tasks(plan, fwd, bwd, wgrad, fwd_compute_s, bwd_compute_s)
    else:
        if zero_bubble:
            bwd = [b - w for b, w in zip(bwd, wgrad, strict=True)]  # the B passes
        orders = [rank_order(plan, r) for r in range(pp)]
        raw, free_at = _list_schedule(plan, orders, fwd, bwd, wgrad)
    tasks = list(map(Task._make, raw))
    pipeline_s = max(free_at)
    last = {}
    for t in tasks:
        last[t.rank] = t
    sync_end = []
    gathers = [0.0] * pp if gather_s is None else [float(x) for x in gather_s]
    for r in range(pp):
        start = last[r].start_s if overlap_grad_sync else last[r].end_s
        end = max(last[r].end_s, start + sync_s[r])
        tasks.append(Task(r, "sync", -1, -1, start, start + sync_s[r]))
        if gathers[r] > 0.0:
            end = max(end, pipeline_s)
            tasks.append(Task(r, "sync", -1, -1, end, end + gathers[r]))
            end += gathers[r]
        sync_end.append(end)
    step_start = max(sync_end)
    for r in range(pp):
        tasks.append(Task(r, "opt", -1, -1, step_start, step_start + optimizer_s[r]))
    makespan = step_start + max(optimizer_s)
    busy, peak = _busy_and_peak(raw, pp, zero_bubble)
    return SimResult(
        makespan_s=makespan,
        pipeline_s=pipeline_s,
        analytic_s=analytic_s,
        busy_s=tuple(busy),
        idle_s=tuple(pipeline_s - b for b in busy),
        peak_in_flight=tuple(p / plan.virtual_stages for p in peak),
        tasks=tuple(tasks),
    )


AXES_WIDTH_IN = 12 * 0.9
"""Inches of time axis in the 12-inch-wide figure (both panels together)."""
CHAR_IN = 0.045
"""Inches a digit of the bars' 5.5 pt labels takes."""
BARS_PER_ROW = 40
"""About how many forward / backward bars a row of one window of the timeline shows: more and
they become stripes too thin to tell apart at the figure's width."""


@dataclass(frozen=True, slots=True)
class TimelineView:
    """What :func:`plot_timeline` drew."""

    windows: tuple[tuple[float, float], ...]
    """The time windows shown, in seconds: the whole iteration, or its start and its end."""
    microbatches: int
    """Microbatches in the iteration."""
    shown_microbatches: int
    """Microbatches whose first forward starts within the first window (all when one window)."""
    bars: int
    """Forward and backward bars drawn (whole or clipped by a window)."""
    unit: str
    """``s`` or ``ms``: the unit of the time axis."""
    title: str


def format_duration(seconds: float) -> str:
    """``63.09 s``, ``6,275 s`` or ``88.31 ms``: never an exponent."""
    if seconds >= 1000:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.4g} s"
    return f"{seconds * 1e3:.4g} ms"


def timeline_windows(sim: SimResult) -> tuple[tuple[float, float], ...]:
    """The time windows the timeline shows: the whole iteration, or its start and its end.

    Rank 0 has the longest warm-up (1F1B ``p - 1`` forwards, interleaved ``2 (p - 1) + (v - 1) p``
    chunk forwards). The first window runs to the end of rank 0's ``N``-th task: its warm-up and
    ``K`` forward-backward pairs of the steady state, ``K`` the most (at least 2) that keep ``N``
    near :data:`BARS_PER_ROW`; so it shows the fill of every rank and the first backwards. The
    last window starts at rank 0's ``N``-th task from the end and runs to the end of the
    optimizer step: the last steady pairs, the drain, the DP sync and the step. GPipe's warm-up
    is every forward, so there ``N = BARS_PER_ROW``. Each window is widened, if needed and up to
    twice its width, to hold every rank's first (last) task. When the two windows would cover
    most of rank 0's tasks, or meet, the whole iteration is shown.
    """
    rank0 = [t for t in sim.tasks if t.rank == 0 and t.kind in COMPUTE_KINDS]
    whole = ((0.0, sim.makespan_s),)
    warm = next((i for i, t in enumerate(rank0) if t.kind == "B"), len(rank0))
    steady = warm + 2 * max(2, (BARS_PER_ROW - warm) // 2)
    n = BARS_PER_ROW if 2 * warm >= len(rank0) else steady  # GPipe: every forward first
    if len(rank0) <= BARS_PER_ROW or 2 * n >= 0.8 * len(rank0):
        return whole
    by_rank: dict[int, list[Task]] = {}
    for t in sim.tasks:
        if t.kind in COMPUTE_KINDS:
            by_rank.setdefault(t.rank, []).append(t)
    # every rank's first and last task (unequal stages end at different times), up to twice
    # rank 0's width (GPipe's fast ranks end long before the slow ones)
    first_end = min(
        2 * rank0[n - 1].end_s,
        max([rank0[n - 1].end_s] + [ts[0].end_s for ts in by_rank.values()]),
    )
    last_start = max(
        sim.makespan_s - 2 * (sim.makespan_s - rank0[-n].start_s),
        min([rank0[-n].start_s] + [ts[-1].start_s for ts in by_rank.values()]),
    )
    if first_end >= last_start:
        return whole
    return ((0.0, first_end), (last_start, sim.makespan_s))


COMPUTE_KINDS = ("F", "B", "W")
"""Task kinds that are a chunk's compute on one microbatch (drawn with its number)."""

TIMELINE_COLORS = {
    "F": "#4c72b0",
    "B": "#dd8452",
    "W": "#8172b3",
    "sync": "#8c8c8c",
    "opt": "#55a868",
}
"""Bar colour of each task kind: forward blue, backward orange, weight gradient (zero-bubble
W pass) purple, DP sync grey, step green."""
TIMELINE_LABELS = {
    "F": "forward",
    "B": "backward",
    "W": "weight gradient (W)",
    "sync": "DP gradient sync",
    "opt": "optimizer step",
}


def _number_bars(ax, r: int, s, e, microbatch, window, scale, inch_s, bar_in) -> None:
    """Write each bar's microbatch number on it: across when it fits, upright when only that
    fits, not at all on a bar too narrow (widths in inches of the figure)."""
    import numpy as np

    lo, hi = window
    digits = np.floor(np.log10(np.maximum(microbatch, 1))) + 1
    text_in = 0.02 + CHAR_IN * digits
    width_in = (np.minimum(e, hi) - np.maximum(s, lo)) / inch_s
    across = width_in > text_in  # the number fits across the bar
    upright = ~across & (width_in > 1.6 * CHAR_IN) & (text_in < bar_in)
    shown = across | upright
    for a, b, j, turn in zip(s[shown], e[shown], microbatch[shown], upright[shown], strict=True):
        ax.text(
            (max(a, lo) + min(b, hi)) / 2 * scale,
            r,
            str(j),
            ha="center",
            va="center",
            rotation=90 if turn else 0,
            fontsize=5.5,
            color="white",
            clip_on=True,
        )


def _break_marks(axes) -> None:
    """The broken-axis marks between the two panels of a long iteration."""
    axes[0].spines["right"].set_visible(False)
    axes[1].spines["left"].set_visible(False)
    axes[1].tick_params(left=False)
    marks = {"marker": [(-1, -2.5), (1, 2.5)], "markersize": 10, "linestyle": "none"}
    marks |= {"color": "k", "mec": "k", "mew": 1, "clip_on": False}
    axes[0].plot([1, 1], [0, 1], transform=axes[0].transAxes, **marks)
    axes[1].plot([0, 0], [0, 1], transform=axes[1].transAxes, **marks)


def _draw_window(ax, window, cols, ranks: int, scale, inch_s, bar_in) -> int:
    """Draw the tasks inside one time window (one collection per rank and kind); returns the
    forward and backward bars drawn."""
    import numpy as np

    kinds, rank_of, start, end, microbatch = cols
    lo, hi = window
    bars = 0
    ax.set_xlim(lo * scale, hi * scale)
    ax.set_autoscale_on(False)
    inside = (end > lo) & (start < hi) | ((start == end) & (start >= lo) & (start <= hi))
    visible = np.flatnonzero(inside)
    for kind, color in TIMELINE_COLORS.items():
        of_kind = visible[kinds[visible] == kind]
        for r in np.unique(rank_of[of_kind]).tolist():
            sel = of_kind[rank_of[of_kind] == r]
            s, e = start[sel], end[sel]
            ax.broken_barh(
                list(zip(s * scale, (e - s) * scale, strict=True)),
                (r - 0.4, 0.8),
                facecolors=color,
                edgecolors="white",
                linewidth=0.3,
            )
            if kind not in COMPUTE_KINDS:
                continue
            bars += len(sel)
            if ranks <= 32:  # else rows too thin for numbers
                _number_bars(ax, r, s, e, microbatch[sel], (lo, hi), scale, inch_s, bar_in)
    return bars


def _timeline_title(sim: SimResult, n_windows: int, microbatches: int) -> str:
    """The simulated time, the analytic formula's and their gap, and what part is shown."""
    return (
        f"simulated iteration {format_duration(sim.makespan_s)}"
        + (
            f"; analytic formula {format_duration(sim.analytic_s)} "
            f"({100 * sim.relative_error:+.2f} %)"
            if math.isfinite(sim.analytic_s)
            else ""
        )
        + ("" if n_windows == 1 else f"; {microbatches:,} microbatches, start and end shown")
    )


def plot_timeline(sim: SimResult, path, *, title: str = "") -> TimelineView:
    """Draw the iteration as one row per pipeline rank (forward blue, backward orange, W pass
    purple, DP sync grey, optimizer step green), microbatch numbers on the bars wide enough to
    hold them.

    A long iteration (more bars than a row can show) is drawn as two panels, its first and its
    last seconds (:func:`timeline_windows`): the pipeline's fill, a few steady-state
    microbatches, and its drain, sync and optimizer step; the title says how much is shown.
    Bars are drawn as one collection per rank and kind, so the cost grows with the tasks shown.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch

    ranks = 1 + max(t.rank for t in sim.tasks)
    windows = timeline_windows(sim)
    scale, unit = (1.0, "s") if sim.makespan_s >= 1 else (1e3, "ms")
    n = len(sim.tasks)
    kinds = np.array([t.kind for t in sim.tasks])
    rank_of = np.fromiter((t.rank for t in sim.tasks), int, n)
    start = np.fromiter((t.start_s for t in sim.tasks), float, n)
    end = np.fromiter((t.end_s for t in sim.tasks), float, n)
    microbatch = np.fromiter((t.microbatch for t in sim.tasks), int, n)
    height = min(0.5 * ranks, 24.0) + 1.6
    bar_in = 0.8 * (height - 1.6) / ranks
    fig, axes = plt.subplots(
        1,
        len(windows),
        figsize=(12, height),
        sharey=True,
        squeeze=False,
        gridspec_kw={"wspace": 0.04, "width_ratios": [hi - lo for lo, hi in windows]},
    )
    axes = axes[0]
    bars = 0
    inch_s = sum(b - a for a, b in windows) / AXES_WIDTH_IN  # seconds per inch of axis
    cols = (kinds, rank_of, start, end, microbatch)
    for ax, window in zip(axes, windows, strict=True):
        bars += _draw_window(ax, window, cols, ranks, scale, inch_s, bar_in)
    first = axes[0]
    step = max(1, ranks // 32)
    first.set_yticks(range(0, ranks, step), [f"rank {r}" for r in range(0, ranks, step)])
    first.set_ylim(ranks - 0.5, -0.5)
    compute = np.isin(kinds, COMPUTE_KINDS)
    m = 1 + int(microbatch[compute].max())
    shown = m
    if len(windows) == 2:
        _break_marks(axes)
        started = compute & (kinds == "F") & (start < windows[0][1])
        shown = len(set(microbatch[started].tolist()))
        (_, first_s), (last_from, _) = windows
        axes[0].set_xlabel(f"the first {format_duration(first_s)} of the iteration ({unit})")
        axes[1].set_xlabel(f"its last {format_duration(sim.makespan_s - last_from)} ({unit})")
    else:
        first.set_xlabel(f"time within the iteration ({unit})")
    title = title or _timeline_title(sim, len(windows), m)
    fig.suptitle(title, fontsize=11)
    present = set(kinds.tolist())
    legend = [
        Patch(color=TIMELINE_COLORS[k], label=label)
        for k, label in TIMELINE_LABELS.items()
        if k != "W" or k in present  # the W pass only where a zero-bubble schedule ran it
    ]
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), frameon=False, fontsize=9)
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.6 / height, bottom=0.95 / height)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130)
    plt.close(fig)
    return TimelineView(
        windows=windows,
        microbatches=m,
        shown_microbatches=shown,
        bars=bars,
        unit=unit,
        title=title,
    )
