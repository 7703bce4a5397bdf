"""DualPipeV (``schedule=dualpipe_v``): DeepSeek's V-shaped DualPipe, run task by task.

**Definition.** DeepSeek-V3 technical report (arXiv 2412.19437 §3.2.1, Figures 4 and 5) and its
code, deepseek-ai/DualPipe@3da1bbe:dualpipe/dualpipev.py (``DualPipeV.step``; the same order is
PyTorch's ``ScheduleDualPipeV._calculate_single_rank_operations``,
pytorch/pytorch@1fd7abc2f521:torch/distributed/pipelining/schedules.py). ``2 pp`` chunks in a V
as ZB-V's (:func:`nest.core.plan.chunk_rank`): rank ``r``'s ``module[0]`` is chunk ``r`` (phase
0), its ``module[1]`` chunk ``2 pp - 1 - r`` (phase 1), one copy of the parameters per rank.
With ``F0/F1`` a forward of phase 0/1, ``B`` an input-gradient pass whose W (weight gradient)
goes to a FIFO queue, ``BW`` a full backward (input and weight gradients together) and
``F&B`` a forward of one microbatch overlapped with the full backward of another, rank ``r``
runs (``q = pp - r - 1``):

1. ``2 q`` F0; 2. ``r + 1`` times F0, F1; 3. ``q`` times B1, W (the oldest queued), F1;
4. ``m - 2 pp + r + 1`` times F0&BW1, F1&BW0 (the last rank runs its first F0 and BW1 apart);
5. ``q`` times BW1, F1&BW0; 6. ``r + 1`` times a backward of phase 1 then of phase 0, full
   until the middle pair, B passes after (``enable_zb``); 7. ``q`` times W, B0; 8. ``r + 1`` W.

It needs ``m >= 2 pp`` (``step`` asserts ``num_chunks >= num_ranks * 2``) and ``pp >= 2``.

**The overlapped step.** §3.2.1: "the key idea of DualPipe is to overlap the computation and
communication within a pair of individual forward and backward chunks"; Figure 4 runs one
chunk's all-to-all dispatch and combine and its PP transfer while the other chunk computes, and
the report states both "can be fully hidden" given enough SMs for communication. The cost
model's rule (:func:`overlapped_s`): an ``F&B`` of a forward with compute ``c_f`` and exposed
transfers ``x_f`` (its pass time less its compute: collectives, ZeRO-3 gathers, the
point-to-point send, activation offload) and a full backward with compute ``c_b`` (backward
and recomputation) and transfers ``x_b`` takes

    ``c_f + c_b + max(0, x_f - c_b) + max(0, x_b - c_f)``:

both computations, plus only what of each one's transfers the other's compute cannot cover.
It is the report's full hiding when each side's transfers fit under the other's compute, and
no saving factor enters: the SMs DeepSeek reserves for communication (20 of 132, §3.2.2) are
not charged to compute either.

**Pipeline time.** No closed form is derived here for unequal chunks: the cost model's pipeline
time is the list schedule of the order above on the chunks' passes (:func:`run_dualpipe_v`,
each task starting when its rank is free and its inputs are done), which
:mod:`nest.analysis.simulate` draws and the evaluator charges: exact for the task graph on any
chunk times. On equal chunks (forward ``F``, full backward ``B``, W pass ``W``, overlapped
``F&B``) it is the README's bubble ``(PP/2 - 1)(F&B + B - 3W)`` over the ``pp = PP/2`` ranks
where its assumptions hold (``tests/test_dualpipe_v.py``).

**Memory.** A microbatch's chunk activations are held from its forward until its W (or its full
backward) ends; :func:`in_flight_chunks` counts the most held on rank ``r`` on the order (an
``F&B`` counts its forward before the backward frees), ``2 pp + 1`` chunk-microbatches on every
rank: the README's "Activation per device ``PP + 1``" in units of one of its ``PP = 2 pp`` stages.
"""

from collections.abc import Sequence

Op = tuple  # ("F" | "B" | "W" | "BW", chunk, microbatch) or ("FB", kf, jf, kb, jb)


def dualpipe_v_order(pp: int, m: int, rank: int) -> list[Op]:
    """Rank ``rank``'s tasks in DualPipeV's order (module docstring, steps 1 to 8;
    deepseek-ai/DualPipe@3da1bbe:dualpipe/dualpipev.py ``DualPipeV.step``)."""
    chunk = (rank, 2 * pp - 1 - rank)  # phase 0, phase 1
    f_count, b_count = [0, 0], [0, 0]
    queue: list[tuple[int, int]] = []  # the WeightGradStore's FIFO of pending W passes
    order: list[Op] = []

    def forward(phase: int) -> Op:
        j = f_count[phase]
        f_count[phase] += 1
        return ("F", chunk[phase], j)

    def backward(phase: int, zb: bool) -> Op:
        j = b_count[phase]
        b_count[phase] += 1
        if zb:
            queue.append((chunk[phase], j))
            return ("B", chunk[phase], j)
        return ("BW", chunk[phase], j)

    def weight() -> Op:
        k, j = queue.pop(0)
        return ("W", k, j)

    def overlapped(f_phase: int, b_phase: int) -> Op:
        return ("FB", *forward(f_phase)[1:], *backward(b_phase, False)[1:])

    q = pp - rank - 1
    order += [forward(0) for _ in range(2 * q)]
    for _ in range(rank + 1):
        order += [forward(0), forward(1)]
    for _ in range(q):
        order.append(backward(1, True))
        order += [weight(), forward(1)]
    for i in range(m - 2 * pp + rank + 1):
        if i == 0 and rank == pp - 1:  # "we don't overlap these two chunks"
            order += [forward(0), backward(1, False)]
        else:
            order.append(overlapped(0, 1))
        order.append(overlapped(1, 0))
    for _ in range(q):
        order.append(backward(1, False))
        order.append(overlapped(1, 0))
    zb = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            zb = True
        order.append(backward(1, zb))
        if i == (rank + 1) // 2 and rank % 2 == 0:
            zb = True
        order.append(backward(0, zb))
    for _ in range(q):
        order.append(weight())
        order.append(backward(0, zb))
    order += [weight() for _ in range(rank + 1)]
    return order


def overlapped_s(fwd_compute_s: float, fwd_s: float, bwd_compute_s: float, bwd_s: float) -> float:
    """One ``F&B``: ``c_f + c_b + max(0, x_f - c_b) + max(0, x_b - c_f)`` with ``x = pass -
    compute`` each side's exposed transfers (module docstring; arXiv 2412.19437 §3.2.1)."""
    fwd_comm, bwd_comm = fwd_s - fwd_compute_s, bwd_s - bwd_compute_s
    return (
        fwd_compute_s
        + bwd_compute_s
        + max(0.0, fwd_comm - bwd_compute_s)
        + max(0.0, bwd_comm - fwd_compute_s)
    )


def run_dualpipe_v(
    pp: int,
    m: int,
    fwd_s: Sequence[float],
    fwd_compute_s: Sequence[float],
    bwd_s: Sequence[float],
    bwd_compute_s: Sequence[float],
    wgrad_s: Sequence[float],
) -> tuple[list[tuple[int, Op, float, float]], list[float]]:
    """The list schedule of DualPipeV on per-chunk forward, full backward and W seconds (and
    each pass's compute, for :func:`overlapped_s`): ``(rank, op, start, end)`` of every task and
    each rank's end. ``F(k, j)`` needs ``F(k - 1, j)``; a B, BW or the backward of an F&B on
    ``(k, j)`` needs ``F(k, j)`` and the backward of ``(k + 1, j)`` (of the loss for the last
    chunk); a W follows its B on its rank; an F&B hands both outputs on at its end."""
    n = 2 * pp
    f_end: list[list[float | None]] = [[None] * m for _ in range(n)]
    b_end: list[list[float | None]] = [[None] * m for _ in range(n)] + [[0.0] * m]
    orders = [dualpipe_v_order(pp, m, r) for r in range(pp)]
    total = sum(len(o) for o in orders)
    nxt, free = [0] * pp, [0.0] * pp
    raw: list[tuple[int, Op, float, float]] = []
    while len(raw) < total:
        before = len(raw)
        for r in range(pp):
            order, i, at = orders[r], nxt[r], free[r]
            while i < len(order):
                op = order[i]
                kind = op[0]
                if kind == "W":
                    start, end = at, at + wgrad_s[op[1]]
                elif kind == "F":
                    k, j = op[1], op[2]
                    dep = f_end[k - 1][j] if k else 0.0
                    if dep is None:
                        break
                    start = max(at, dep)
                    end = f_end[k][j] = start + fwd_s[k]
                elif kind in ("B", "BW"):
                    k, j = op[1], op[2]
                    dep, later = f_end[k][j], b_end[k + 1][j]
                    if dep is None or later is None:
                        break
                    start = max(at, dep, later)
                    end = start + (bwd_s[k] - wgrad_s[k] if kind == "B" else bwd_s[k])
                    b_end[k][j] = end
                else:  # "FB"
                    kf, jf, kb, jb = op[1:]
                    deps = (f_end[kf - 1][jf] if kf else 0.0, f_end[kb][jb], b_end[kb + 1][jb])
                    if any(d is None for d in deps):
                        break
                    start = max(at, *deps)
                    end = start + overlapped_s(
                        fwd_compute_s[kf], fwd_s[kf], bwd_compute_s[kb], bwd_s[kb]
                    )
                    f_end[kf][jf] = b_end[kb][jb] = end
                raw.append((r, op, start, end))
                at = end
                i += 1
            nxt[r], free[r] = i, at
        if len(raw) == before:
            raise AssertionError("DualPipeV's order deadlocked; this is a bug")
    return raw, free


def in_flight_chunks(pp: int, m: int, rank: int) -> int:
    """The most chunk-microbatches whose activations rank ``rank`` holds at once under
    DualPipeV: +1 at each forward, -1 at each W or full backward, an F&B's forward before its
    backward (module docstring)."""
    held = peak = 0
    for op in dualpipe_v_order(pp, m, rank):
        if op[0] in ("F", "FB"):
            held += 1
            peak = max(peak, held)
        if op[0] in ("W", "BW", "FB"):
            held -= 1
    return peak


def dualpipe_v_pipeline_s(
    pp: int,
    m: int,
    fwd_s: Sequence[float],
    fwd_compute_s: Sequence[float],
    bwd_s: Sequence[float],
    bwd_compute_s: Sequence[float],
    wgrad_s: Sequence[float],
) -> tuple[float, list[float], list[float]]:
    """DualPipeV's pipeline time (the last rank's end in :func:`run_dualpipe_v`), each rank's
    hidden sync (how long before that end it finishes) and its last task's length (a W pass on
    every rank, which hides the sync with overlap)."""
    raw, ends = run_dualpipe_v(pp, m, fwd_s, fwd_compute_s, bwd_s, bwd_compute_s, wgrad_s)
    t_pipe = max(ends)
    last = {}
    for r, _, start, end in raw:
        last[r] = end - start
    return t_pipe, [t_pipe - e for e in ends], [last[r] for r in range(pp)]
