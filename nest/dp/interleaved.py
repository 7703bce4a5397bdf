"""Interleaved configurations: an exact DP over pipeline ranks whose chunks are fixed.

Space (:mod:`nest.dp.space`): ``pp * v`` chunks of equal blocks (Megatron-Core's partition), chunk
``k`` on rank ``k % pp``, and a recompute mode per chunk. The shared evaluator's objective is
``T = m M + (S - M) / v + E + O = S / v + (m - 1/v) M + E + O`` with ``t_r`` the sum of rank
``r``'s chunk times, ``E = max_r (max(0, sync_r - B_r [- b_r]) + g_r)`` where ``b_r`` is the
backward of rank ``r``'s first chunk (chunk ``r``, its last backward), ``B_r = sum_{q<r} b_q``,
``sync_r`` the gradient part of the rank's sync and ``g_r`` its exposed weight all-gather
(fixed by the partition, :func:`nest.cost.pipeline.gather_exposed_s`), and
``O = max_r opt_r`` (:mod:`nest.cost.pipeline`, :mod:`nest.cost.evaluate`).

**Per rank** the partition is fixed, so the rank's sync, optimizer step and parameter memory are
fixed too, and its recompute modes only change ``t_r``, ``b_r`` and whether it fits. Those two
numbers are all later ranks see, and a smaller ``t_r`` with a larger ``b_r`` is never worse (every
term of ``T`` is non-decreasing in ``t_r`` and non-increasing in ``B``), so a rank needs, for each
mode of its first chunk, only the fastest assignment of the other chunks that fits, and of those
(at most three) only the Pareto-best in ``(t_r, -b_r)`` (:func:`rank_options`). That fastest
assignment is found exhaustively but without repetition: chunks with the same layers and the same
neighbours cost the same, so only how many of each group take each mode matters; groups are merged
one by one keeping, per largest transient buffer, the Pareto set of (time, stored activations)
(memory is ``state + in-flight x activations + largest transient + reserve``, increasing in both,
so a dropped assignment is never the only one that fits or the fastest). When the other
chunks at their fastest modes fit beside every mode of the first chunk, that assignment is the
fastest for each and nothing is enumerated (:func:`rank_options`).

**Across ranks** the recurrence of :mod:`nest.dp.recurrence` runs with state ``r`` and the same
labels ``(S, M, B, E, O)``; the dominance test carries the coefficients ``1/v`` and ``m - 1/v``
(:func:`~nest.dp.recurrence.worse_by_at_most`) and the largest sync of the later ranks
(:func:`later_sync_caps_s`): a label with less backward ``B`` gives later ranks at most that
much more exposed sync, and none beyond ``sigma - B`` (without the cap, options that trade
``1/v`` of their time against their first chunk's backward all stay: llama3_70b over 512 H100
at pp 8 created 560,044 labels and took minutes; with it 21,667), and a label is dropped when
``(S + R) / v + (m - 1/v) max(M, R_max) + E + O`` exceeds the incumbent, ``R`` and ``R_max`` the
sum and maximum of the later ranks' floors (each rank takes at least the floors of its chunks'
layers, :mod:`nest.dp.bounds`). Before a rank's options are built, its own floor is raised to
the recomputation its memory forces (:func:`least_fitting_time_s`, a linear relaxation with its
proof), which drops a configuration whose first, most loaded rank must recompute too much
before any assignment is enumerated. Complexity: ``pp`` ranks x at most 3 options x the labels kept.
"""

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from nest.core.axes import Recompute, Schedule
from nest.cost.memory import rank_memory_bytes
from nest.cost.pipeline import pipeline_coefficients, rank_exposed_sync_s
from nest.dp.recurrence import DPStats, Front, GreedyFront, Label, backtrack, objective_s
from nest.dp.space import interleaved_chunks
from nest.dp.stages import StageModel


@dataclass(frozen=True, slots=True)
class RankOption:
    t_s: float
    first_bwd_s: float
    modes: tuple[Recompute, ...]
    """Recompute mode of each of the rank's chunks, in chunk order."""


def _group_front(rep: np.ndarray, size: int):
    """:func:`_group_front_of` of these costs (cached: a configuration's ranks and its
    neighbours share chunk costs)."""
    return _group_front_of(rep.tobytes(), rep.shape, size)


@lru_cache(maxsize=1024)
def _group_front_of(rep_bytes: bytes, shape: tuple, size: int):
    """The Pareto-kept (time, activations, transient, counts per mode) of ``size`` identical
    chunks whose per-mode costs are ``rep`` (rows ``(t, b, act, transient)``), built one chunk
    at a time: an assignment beaten at its transient value stays beaten after any further
    chunk is added (times and activations add, transients take a max), so pruning after each
    chunk keeps every assignment the enumeration of all ``C(size + modes - 1, size)`` count
    vectors would keep, at a cost linear in ``size``."""
    rep = np.frombuffer(rep_bytes).reshape(shape)
    n = len(rep)
    unit = np.eye(n)
    t, act, tr = np.zeros(1), np.zeros(1), np.full(1, -np.inf)
    counts = np.zeros((1, n))
    for _ in range(size):
        t = (t[:, None] + rep[None, :, 0]).ravel()
        act = (act[:, None] + rep[None, :, 2]).ravel()
        tr = np.maximum(tr[:, None], rep[None, :, 3]).ravel()
        counts = (counts[:, None, :] + unit[None, :, :]).reshape(-1, n)
        t, act, tr, counts = _pareto(t, act, tr, counts)
    for array in (t, act, tr, counts):
        array.flags.writeable = False
    return t, act, tr, counts


def _pareto(t, act, tr, picks):
    """Keep, per transient value, the assignments no other beats in both time and activations."""
    order = np.lexsort((act, t, tr))
    t, act, tr, picks = t[order], act[order], tr[order], picks[order]
    keep = np.ones(len(t), dtype=bool)
    for value in np.unique(tr):
        idx = np.flatnonzero(tr == value)
        best = np.minimum.accumulate(act[idx])
        keep[idx[1:]] = act[idx[1:]] < best[:-1]
    return t[keep], act[keep], tr[keep], picks[keep]


class RankChunks:
    """Per-mode costs of the chunks of one rank (first chunk apart, the others grouped)."""

    def __init__(self, sm: StageModel, r: int, modes: tuple[Recompute, ...]) -> None:
        pp = sm.config.pp
        chunks = sm.chunks
        last = len(chunks) - 1
        self.ks = list(range(r, len(chunks), pp))
        self.modes = modes
        # chunks with the same layers and the same neighbours cost the same: the first chunk
        # apart, group the others and price one of each group
        model = sm.problem.model
        signature = [model.cost_key(ref) for ref in model.chain]
        self.groups: dict[tuple, list[int]] = {}
        for k in self.ks[1:]:
            i, j = chunks[k]
            key = (tuple(signature[i - 1 : j + 1]), k == last)
            self.groups.setdefault(key, []).append(k)
        self.cost = {}  # chunk -> (t, b, act, transient) per mode
        for k in [self.ks[0]] + [ks[0] for ks in self.groups.values()]:
            self.cost[k] = sm.chunk_costs(k, modes)
        self.sync_s, self.opt_s, self.state_bytes, self.gathered_s = sm.interleaved_rank(r)
        self.in_flight = sm.in_flight[r]

    def assignments(self):
        """Pareto-kept (time, activations, transient, modes per chunk) of the non-first chunks."""
        t, act, tr = np.zeros(1), np.zeros(1), np.zeros(1)
        picks = np.zeros((1, 0), dtype=int)
        for ks in self.groups.values():
            g_t, g_act, g_tr, counts = _group_front(self.cost[ks[0]], len(ks))
            t = (t[:, None] + g_t[None, :]).ravel()
            act = (act[:, None] + g_act[None, :]).ravel()
            tr = np.maximum(tr[:, None], g_tr[None, :]).ravel()
            rows = np.arange(len(picks)).repeat(len(counts))
            cols = np.tile(np.arange(len(counts)), len(picks))
            picks = np.hstack([picks[rows], counts[cols].astype(int)])
            t, act, tr, picks = _pareto(t, act, tr, picks)
        return t, act, tr, picks

    def fastest_rest(self):
        """:meth:`assignments`' terms of the one assignment giving every non-first chunk its
        fastest mode (ties: the first of ``modes``)."""
        n = len(self.modes)
        t, act, tr, pick = 0.0, 0.0, 0.0, []
        for ks in self.groups.values():
            rep = self.cost[ks[0]]
            c = int(np.argmin(rep[:, 0]))
            t, act, tr = t + len(ks) * rep[c, 0], act + len(ks) * rep[c, 2], max(tr, rep[c, 3])
            pick += [len(ks) if m == c else 0 for m in range(n)]
        return np.array([t]), np.array([act]), np.array([tr]), np.array([pick], dtype=int)

    def modes_of(self, first: int, pick) -> tuple[Recompute, ...]:
        out = {self.ks[0]: self.modes[first]}
        n = len(self.modes)
        for g, ks in enumerate(self.groups.values()):
            expanded = [self.modes[c] for c in range(n) for _ in range(int(pick[g * n + c]))]
            out.update(zip(ks, expanded, strict=True))
        return tuple(out[k] for k in self.ks)


def rank_options(
    sm: StageModel, rc: RankChunks, *, shortcut: bool = True
) -> tuple[list[RankOption], float]:
    """The rank's Pareto-best feasible options and the least memory any assignment needs.

    ``shortcut``: when the other chunks, each at its fastest mode, fit beside the first chunk
    in every mode, that assignment is the fastest that fits for every first mode (the other
    chunks change only ``t_r``, module docstring), so nothing is enumerated; the least memory
    returned is then that assignment's, not the least of all."""
    first = rc.cost[rc.ks[0]]
    t, act, tr, picks = rc.fastest_rest()
    memory = rank_memory_bytes(
        rc.state_bytes, act + first[:, 2], rc.in_flight, np.maximum(tr, first[:, 3]),
        sm.reserve_bytes,
    )  # fmt: skip
    if not (shortcut and (memory <= sm.capacity_bytes).all()):
        t, act, tr, picks = rc.assignments()
    found, least = [], np.inf
    for c in range(len(rc.modes)):
        memory = rank_memory_bytes(
            rc.state_bytes,
            act + first[c, 2],
            rc.in_flight,
            np.maximum(tr, first[c, 3]),
            sm.reserve_bytes,
        )
        least = min(least, float(memory.min()))
        fits = np.flatnonzero(memory <= sm.capacity_bytes)
        if fits.size:
            best = fits[np.argmin(t[fits])]
            found.append((float(t[best] + first[c, 0]), float(first[c, 1]), c, picks[best]))
    kept = []
    for a, (t_a, b_a, c, pick) in enumerate(found):
        # dropped: another option is as fast and hides as much (ties keep the first)
        if not any(
            t_o <= t_a and b_o >= b_a and ((t_o, b_o) != (t_a, b_a) or o < a)
            for o, (t_o, b_o, *_) in enumerate(found)
            if o != a
        ):
            kept.append(RankOption(t_a, b_a, rc.modes_of(c, pick)))
    return kept, least


def least_fitting_time_s(rc: RankChunks, capacity_bytes: float, reserve_bytes: float) -> float:
    """A lower bound on the rank's time ``t_r`` over every assignment of modes to its chunks that
    fits in ``capacity_bytes`` (``inf`` when none can fit): the linear relaxation of "choose a
    mode per chunk, least total time, stored activations within budget".

    **Proof.** An assignment fits when ``state + in_flight x sum act + max transient + reserve
    <= capacity`` (:func:`rank_options`). Its largest transient is at least ``T0``, the largest
    over chunks of each chunk's least transient, so every fitting assignment has ``sum act <= A =
    (capacity - state - reserve - T0) / in_flight``. Relaxing "one mode per chunk" to a convex
    combination of each chunk's modes can only lower the least time subject to that budget, and
    the relaxed problem is a fractional knapsack: start every chunk at its fastest mode (least
    activations among the fastest) and buy the missing ``sum act - A`` along each chunk's lower
    convex hull of ``(act, t)``, cheapest seconds per byte first (greedy is optimal for a
    fractional knapsack whose items are the hulls' segments, taken in increasing slope). Its
    value is therefore at most the time of any fitting assignment, and when even every chunk at
    its least-storing mode exceeds ``A`` nothing fits."""
    chunks = [(rc.cost[rc.ks[0]], 1)] + [(rc.cost[ks[0]], len(ks)) for ks in rc.groups.values()]
    floor_tr = max(float(rep[:, 3].min()) for rep, _ in chunks)
    if rc.in_flight <= 0:
        return sum(n * float(rep[:, 0].min()) for rep, n in chunks)
    # the memory rule is linear in the stored bytes: what the rest leaves for them
    rest = rank_memory_bytes(rc.state_bytes, 0.0, rc.in_flight, floor_tr, reserve_bytes)
    budget = (capacity_bytes - rest) / rc.in_flight
    total_t, total_act, segments = 0.0, 0.0, []
    for rep, n in chunks:
        t, act = rep[:, 0], rep[:, 2]
        start = int(np.lexsort((act, t))[0])  # fastest, then least storing
        total_t += n * float(t[start])
        total_act += n * float(act[start])
        # lower convex hull from the fastest point towards less storage
        here_t, here_a = float(t[start]), float(act[start])
        while True:
            cands = [
                ((float(t[i]) - here_t) / (here_a - float(act[i])), i)
                for i in range(len(t))
                if act[i] < here_a
            ]
            if not cands:
                break
            slope, i = min(cands)
            segments.append((slope, n * (here_a - float(act[i]))))
            here_t, here_a = float(t[i]), float(act[i])
    need = total_act - budget
    if need <= 0:
        return total_t
    for slope, width in sorted(segments):
        take = min(width, need)
        total_t += max(slope, 0.0) * take
        need -= take
        if need <= 0:
            return total_t
    return float("inf")


def first_mode_floors(rc: RankChunks, floor_s: float) -> list[tuple[float, float]]:
    """Per mode ``c`` of the rank's first chunk: ``(t, b)`` with ``t`` a floor of the time
    ``t_r`` of every option of :func:`rank_options` whose first chunk takes ``c``, and ``b`` that
    option's ``first_bwd_s`` (exactly).

    **Proof.** Such an option's time is ``cost[first][c, 0]`` plus the times of the other
    chunks' modes, each at least that chunk's fastest mode, and its ``first_bwd_s`` is
    ``cost[first][c, 1]`` (:func:`rank_options`). Every option fits, so its time is also at
    least ``floor_s`` when that is a floor of the rank's time over its fitting assignments
    (:func:`least_fitting_time_s`, or the placed floors). The label a rank option extends is
    non-decreasing in ``t_r`` in every term and its exposed sync is fixed by ``b``, so the
    label bound at ``(t, b)`` is at most the bound of every label that option creates:
    when it exceeds the incumbent for every mode and label, :func:`solve_interleaved` would
    drop every label of this rank, and it may stop before enumerating the options."""
    first = rc.cost[rc.ks[0]]
    rest = sum(len(ks) * float(rc.cost[ks[0]][:, 0].min()) for ks in rc.groups.values())
    return [
        (max(floor_s, float(first[c, 0]) + rest), float(first[c, 1])) for c in range(len(first))
    ]


def _rank_floors(sm: StageModel, modes) -> list[float]:
    prefix = sm.placed_floor_s(modes)
    out = [0.0] * sm.config.pp
    for k, (i, j) in enumerate(
        interleaved_chunks(sm.n_layers, sm.config.pp, sm.config.virtual_stages)
    ):
        out[k % sm.config.pp] += prefix[j + 1] - prefix[i]
    return out


def later_sync_caps_s(sm: StageModel) -> list[tuple[float, float]]:
    """Per rank ``r``: ``(sigma_r, gamma_r)``, the largest DP sync (gradient part) and the
    largest exposed weight all-gather of the ranks after ``r`` (0 for the last), the caps of
    :func:`~nest.dp.recurrence.worse_by_at_most` for the labels of ranks ``0..r``.

    **Proof.** A later rank ``q`` exposes ``max(0, sync_q - B_q [- b_q]) + g_q``
    (:func:`~nest.cost.pipeline.rank_exposed_sync_s`) with ``B_q`` the label's prefix ``B``
    plus the backward of the ranks between, each ``b >= 0``, and ``g_q`` fixed by its
    partition, so it is at most ``max(0, sync_q - B) + g_q <= max(0, sigma_r - B) + gamma_r``
    whatever the completion."""
    ranks = [sm.interleaved_rank(r) for r in range(sm.config.pp)]
    syncs, gathers = [x[0] for x in ranks], [x[3] for x in ranks]
    return [
        (max(syncs[r + 1 :], default=0.0), max(gathers[r + 1 :], default=0.0))
        for r in range(len(syncs))
    ]


def solve_interleaved(
    sm: StageModel,
    modes: tuple[Recompute, ...],
    incumbent_s: float,
    stats: DPStats,
    *,
    exact: bool = True,
):
    """Best (objective, [(first, last, mode) per chunk]) of an interleaved configuration, or
    None when nothing fits or nothing beats ``incumbent_s``."""
    pp, v, m = sm.config.pp, sm.config.virtual_stages, sm.m
    s_coef, m_coef = pipeline_coefficients(m, Schedule.INTERLEAVED, v)
    floors = _rank_floors(sm, modes)
    caps = None  # built on the first front (most configurations stop at rank 0's bound)
    labels = [Label(0.0, 0.0, 0.0, 0.0, 0.0)]
    for r in range(pp):
        rc = RankChunks(sm, r, modes)
        # the rank's own floor also pays the recomputation its memory forces
        floors[r] = max(floors[r], least_fitting_time_s(rc, sm.capacity_bytes, sm.reserve_bytes))
        rest_sum, rest_max = sum(floors[r + 1 :]), max(floors[r + 1 :], default=0.0)
        low = min(lab.total_s for lab in labels) + floors[r] + rest_sum
        top = max(min(lab.max_s for lab in labels), floors[r], rest_max)
        if s_coef * low + m_coef * top > incumbent_s:
            stats.labels_bounded += len(labels)
            return None
        # every option's labels: a floor per mode of the first chunk (first_mode_floors)
        if all(
            s_coef * (lab.total_s + t + rest_sum)
            + m_coef * max(lab.max_s, t, rest_max)
            + max(
                lab.exposed_s,
                rank_exposed_sync_s(rc.sync_s, lab.bwd_sum_s, b, sm.overlap, rc.gathered_s),
            )
            + max(lab.opt_s, rc.opt_s)
            > incumbent_s
            for t, b in first_mode_floors(rc, floors[r])
            for lab in labels
        ):
            stats.labels_bounded += len(labels)
            return None
        options, _ = rank_options(sm, rc)
        stats.stages_scored += len(modes) * len(rc.cost)
        if exact:
            caps = later_sync_caps_s(sm) if caps is None else caps
            front = Front(m_coef, s_coef, *caps[r])
        else:
            front = GreedyFront(m_coef, s_coef)
        for opt in options:
            for lab in labels:
                total = lab.total_s + opt.t_s
                mx = max(lab.max_s, opt.t_s)
                own = rank_exposed_sync_s(
                    rc.sync_s, lab.bwd_sum_s, opt.first_bwd_s, sm.overlap, rc.gathered_s
                )
                exposed = max(lab.exposed_s, own)
                step = max(lab.opt_s, rc.opt_s)
                stats.labels_created += 1
                bound = s_coef * (total + rest_sum) + m_coef * max(mx, rest_max) + exposed + step
                if bound > incumbent_s:
                    stats.labels_bounded += 1
                    continue
                front.insert(
                    Label(total, mx, lab.bwd_sum_s + opt.first_bwd_s, exposed, step, lab, opt),
                    stats,
                )
        labels = front.labels
        if not labels:
            return None
    best = min(labels, key=lambda lab: objective_s(lab, m_coef, s_coef))
    value = objective_s(best, m_coef, s_coef)
    if value > incumbent_s:
        return None
    chunks = interleaved_chunks(sm.n_layers, pp, v)
    per_chunk: dict[int, Recompute] = {}
    for r, opt in enumerate(backtrack(best)):
        per_chunk.update(zip(range(r, pp * v, pp), opt.modes, strict=True))
    return value, [(i, j, per_chunk[k]) for k, (i, j) in enumerate(chunks)]


def smallest_peak_interleaved(sm: StageModel, modes) -> float:
    """The least per-device peak memory of any plan of an interleaved configuration."""
    return max(
        rank_options(sm, RankChunks(sm, r, modes), shortcut=False)[1] for r in range(sm.config.pp)
    )
