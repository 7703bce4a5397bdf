"""The recurrence: optimal partition and per-stage recompute for one configuration.

Objective (the shared evaluator's, :mod:`nest.cost.pipeline`, 1F1B; ZB-H1 below):
``T = sum_r t_r + (m - 1) max_r t_r + max_r max(0, sync_r - B_r [- b_r]) + max_r opt_r`` with
``t_r = f_r + b_r`` and ``B_r = sum_{q<r} b_q``. It is not additive over stages, so the DP keeps,
per state, a Pareto set of labels instead of one value.

State ``(r, i)``: ranks ``0..r-1`` are placed and hold layers ``0..i-1``.
Label: ``(S, M, B, E, O)`` = (sum of stage times, largest stage time, sum of backward times,
largest exposed sync, largest optimizer step) of the ranks placed so far.
Transition: rank ``r`` takes layers ``i..j`` with recompute mode ``c`` if that stage fits in memory
at position ``r``: ``(S + t, max(M, t), B + b, max(E, max(0, sync - B [- b]) + g), max(O, opt))``
into state ``(r+1, j+1)``; ``sync`` is the gradient part of the stage's DP sync and ``g`` its
exposed weight all-gather (:func:`nest.cost.pipeline.gather_exposed_s`), which depends on the
stage alone, so the exposed sync stays non-increasing and 1-Lipschitz in ``B``.
Answer: the label at ``(pp, L)`` minimising ``S + (m-1) M + E + O``.

Why it is exact: every later rank's contribution depends on the past only through the label
and the state, and for two labels ``a, b`` of one state and any completion ``c``,
``F(a + c) - F(b + c) <= dS + (m-1) max(0, dM) + max(dE, max(0, -dB)) + max(0, dO)``
(:func:`worse_by_at_most`: the sum adds ``dS``; a maximum grows by at most the positive part of
its argument's change; later exposed syncs are non-increasing and 1-Lipschitz in the backward
prefix ``B``). A label ``b`` for which some kept ``a`` makes this <= 0 can never do better than
``a`` and is dropped; this contains Pareto dominance and is much stronger when the exposed-sync
and optimizer terms are small. The kept set therefore always contains an optimal completion.
The only other pruning is by bound: a label is dropped when
``S + R + (m-1) max(M, R / k) + E + O`` exceeds the best complete plan found so far, where
``R`` is the sum over the remaining layers of their floors (:mod:`nest.dp.bounds`: compute,
cheapest recompute, the cheapest possible tensor / context / expert / ZeRO-3 traffic) and ``k``
the ranks left. Every remaining stage takes at least its layers' floors, so ``R`` bounds the
remaining stage times' sum and ``R / k`` their maximum from below, and no completion of a
dropped label can beat the incumbent. Before any label is extended, the same bound with the
least ``S``, ``M``, ``E`` and ``O`` of the state's labels skips a whole stage end ``j`` at once;
past the ``j`` where the stage's own floor exceeds ``R / k`` it only grows, so the scan stops.
Only the fastest recompute mode that fits extends a stage: for one rank ``r`` and layers
``i..j`` the modes change nothing but the recomputation in the backward (and whether the stage
fits; under activation offload also the exposed part of the copies, which the cost model charges
to the backward too: :mod:`nest.cost.offload`), so two fitting modes ``c, c'`` give ``t_c - t_c'
= b_c - b_c' = d`` with the same sync and optimizer step. Taking ``c'`` with ``d >= 0`` instead
of ``c`` lowers ``S`` by ``d``, does not raise ``M``, and lowers ``B`` (and the rank's own
``b``) by ``d``, which raises every later exposed sync by at most ``d``; so ``F`` does not grow
for any completion, and the slower mode's label is never needed (ties keep the first mode of
``SpaceOptions.recompute``). The modes other than the fastest fitting one (e.g. ``selective``,
which with FlashAttention saves only the log-sum-exp but recomputes the whole attention core)
thus cost one row each and no labels.
**Every-n-blocks options** (``block`` in ``SpaceOptions.recompute``; 1F1B and ZB-H2 without
activation offload, :func:`nest.dp.space.block_options`): stage ``i..j`` holding ``nb`` blocks
may also fully recompute its first ``k`` blocks (``1 <= k < nb``) and run the rest in a base
mode ``c``. Like a mode, such an option changes only the backward (the recompute seconds and
the recompute's collectives) and whether the stage fits, so the argument above covers the
options and the modes together: only the fastest fitting one extends the stage. For one ``c``
the backward is non-decreasing in ``k`` when every block's full recompute costs at least its
``c`` recompute, in seconds and in each group split's collectives
(:meth:`~nest.dp.stages.StageModel.block_monotone`): the stage's recompute is ``c``'s sum plus
the first ``k`` blocks' non-negative differences, and per axis the slowest split of sums that
are each non-decreasing in ``k`` is non-decreasing. So the fastest fitting ``(c, k)`` is the
smallest ``k`` that fits (memory is scanned for every ``k``, not assumed monotone); it is
needed only where ``(c, 0)`` does not fit and is faster than every fitting option (else
``(c, 0)`` or that option is at least as fast): :func:`block_fitting`. Where
``block_monotone`` fails every fitting ``k`` is offered instead (exact, slower; no preset or
random test case has hit it). The floors take ``full`` with the listed modes, so every option
costs at least them. Memory itself is non-increasing in ``k`` too (with ``f >= 1``
microbatches in flight, as 1F1B and ZB-H2 have): switching block ``b`` from ``c`` to full
lowers the stored bytes by ``d_b = act_c - act_full >= 0`` per microbatch and raises the
largest transient by at most ``d_b`` (its own grows by ``(act_none - act_full) - (act_none -
act_c) = d_b``), a change of at most ``(1 - f) d_b <= 0``; so no option stores less than
``full``, and the memory floors of the modes with ``full`` bound them.
Memory is checked first, for every ``j`` of a state at once (:meth:`StageModel.fits_from`), and
a stage's terms come from one numpy row per (rank, first layer, mode)
(:func:`nest.dp.rows.stage_row`).

**ZB-H1** (:mod:`nest.cost.pipeline`) runs the same recurrence with three changes. The sum
term adds the stage's ``u = t - w - c`` instead of ``t`` and a sixth label entry ``X`` keeps the
largest tail term ``e = w + c`` (``w`` the stage's W pass, ``c = min(w, f, b')``), so
``T = S + (m - 1) M + X + E + O``; ``X`` is a maximum like ``O``, and dominance adds
``max(0, dX)``. ``B`` sums the B passes ``b' = b - w`` and rank ``r``'s sync is hidden by
``max(0, B - r w)`` (own work with overlap: ``w``), still non-increasing and 1-Lipschitz in ``B``.
The bounds use ``u >= t - 2 w`` (``c <= w``): the sum term's floor over layers ``i..j`` is their
floors less twice their W passes (the same in every plan), and ``X >= 0``. Fastest mode only:
a slower mode adds ``d`` to ``b'`` and ``t``; when the fastest mode's ``c`` is ``min(w, f)``
(its ``b'`` at least that) every slower mode has the same ``c``, so ``u`` grows by ``d``, ``e`` and
``X`` do not change, and the 1F1B argument holds; otherwise ``c`` may grow with ``b'`` (``u`` then
grows by less than ``d``, ``e`` by the rest) and every fitting mode extends the stage.

**ZB-H2** (:mod:`nest.cost.pipeline`) is ZB-H1's recurrence with ``u = g = max(f, h)``,
``e = t - g`` (``h = max(0, b' - f, f + b' - 2 w)``), ``B`` the prefix sum of
``max(0, h - f)`` and rank ``r``'s sync hidden by ``B + (pp - 1 - r) max(0, f - h)``: the
second term is the rank's own, so the hidden time is still non-decreasing and 1-Lipschitz in
``B`` and the dominance rule holds unchanged. The bounds use ``u >= f + b' - 2 w = t - 3 w`` and
``u >= f``: the sum term's floor over layers ``i..`` is the larger of their floors less three
times their W passes and their forward compute (a stage's forward adds collectives and p2p to
its layers' forward compute, never less), since a sum of maxima is at least the maximum of the
sums. Fastest mode only:
a slower mode adds ``d >= 0`` to ``b'`` and ``t``, so ``h`` grows by some ``d' <= d``; ``g`` and
``B`` then both grow by ``max(0, h + d' - f) - max(0, h - f)`` (``g - f = max(0, h - f)``), ``M``
and ``e = t - g`` do not fall and the own hidden term does not grow: the later ranks' sync is
hidden by at most what ``S`` gained, which is the 1F1B argument.

Complexity per configuration: ``O(pp * L^2 * modes)`` stage evaluations (each O(1) from prefix
sums) times the kept-set sizes, which stay small because identical blocks give identical labels.
"""

from dataclasses import dataclass, field

import numpy as np

from nest.core.axes import Recompute, Schedule
from nest.core.plan import BlockRecompute
from nest.cost.pipeline import pipeline_coefficients
from nest.dp.rows import stage_common, stage_row
from nest.dp.stages import StageModel


@dataclass(slots=True)
class Label:
    total_s: float
    max_s: float
    bwd_sum_s: float
    exposed_s: float
    opt_s: float
    parent: "Label | None" = None
    choice: object = None
    """What the last rank chose: ``(first, last, mode)`` (1F1B) or a rank option."""
    tail_s: float = 0.0
    """Largest tail term ``e_r`` of the ranks placed (ZB-H1; 0 for the other schedules)."""

    def dominates(self, other: "Label") -> bool:
        return (
            self.total_s <= other.total_s
            and self.max_s <= other.max_s
            and self.bwd_sum_s >= other.bwd_sum_s
            and self.exposed_s <= other.exposed_s
            and self.opt_s <= other.opt_s
            and self.tail_s <= other.tail_s
        )


@dataclass(slots=True)
class DPStats:
    stages_scored: int = 0
    labels_created: int = 0
    labels_dominated: int = 0
    labels_bounded: int = 0
    memory_rejected: int = 0
    extra: dict = field(default_factory=dict)

    def record(self) -> dict:
        """The counts as the search record names them (``report.json["search"]``)."""
        return {
            "stages_scored": self.stages_scored,
            "labels_created": self.labels_created,
            "labels_dominated": self.labels_dominated,
            "labels_pruned_by_bound": self.labels_bounded,
            "stages_over_memory": self.memory_rejected,
        }


def worse_by_at_most(
    a: Label,
    b: Label,
    m_coef: float,
    s_coef: float = 1.0,
    sync_cap_s: float = float("inf"),
    gather_cap_s: float = 0.0,
) -> float:
    """An upper bound on ``F(a + c) - F(b + c)`` over every completion ``c`` of the same state,
    for ``F = s_coef S + m_coef M + X + E + O`` (1F1B and ZB-H1: ``1, m - 1``; interleaved:
    ``1/v, m - 1/v``): ``s_coef dS + m_coef max(0, dM) + max(dE, g) + max(0, dO)
    + max(0, dX)`` with ``d = a - b`` and ``g = max(0, -dB)``, or, given ``sync_cap_s =
    sigma`` and ``gather_cap_s = gamma``, ``g = min(max(0, -dB), max(0, sigma - B_a) + gamma -
    E_b)``.

    Each term bounds its part of the objective: the sum adds ``dS``; ``max(x, .)`` grows by at
    most ``max(0, d)``; later ranks' exposed sync is non-increasing and 1-Lipschitz in the
    backward prefix ``B``. When it is <= 0, ``a`` is at least as good as ``b`` whatever follows.

    **The cap** (interleaved, :func:`nest.dp.interleaved.later_sync_cap_s`): ``sigma`` is a
    number and ``gamma`` one such that every later rank's exposed sync after a label of prefix
    ``B`` is at most ``max(0, sigma - B) + gamma`` whatever the completion (``gamma`` the largest
    exposed weight all-gather of the later ranks, which no ``B`` hides). Write ``G_x`` for the
    largest later exposed sync after label ``x``, so the final term is ``max(E_x, G_x)``.
    Either ``a``'s is ``E_a``, and the difference is at most ``dE``; or it is ``G_a``, and the
    difference is at most ``G_a - max(E_b, G_b) <= min(G_a - G_b, G_a - E_b) <= min(max(0,
    -dB), max(0, sigma - B_a) + gamma - E_b)`` (the first by the Lipschitz property, the second
    by the cap). So the difference is at most ``max(dE, g)``, which is never above the plain
    rule's.
    """
    gap = max(0.0, b.bwd_sum_s - a.bwd_sum_s)
    if gap > 0.0:
        gap = min(gap, max(0.0, sync_cap_s - a.bwd_sum_s) + gather_cap_s - b.exposed_s)
    return (
        s_coef * (a.total_s - b.total_s)
        + m_coef * max(0.0, a.max_s - b.max_s)
        + max(a.exposed_s - b.exposed_s, gap)
        + max(0.0, a.opt_s - b.opt_s)
        + max(0.0, a.tail_s - b.tail_s)
    )


def objective_s(lab: Label, m_coef: float, s_coef: float = 1.0) -> float:
    return s_coef * lab.total_s + m_coef * lab.max_s + lab.tail_s + lab.exposed_s + lab.opt_s


class Front:
    """The labels of one state no other label of the state is sure to beat (dominance by
    :func:`worse_by_at_most` <= 0, which contains Pareto dominance)."""

    __slots__ = ("labels", "k", "s", "sync_cap_s", "gather_cap_s")

    def __init__(
        self,
        m_coef: float,
        s_coef: float = 1.0,
        later_sync_cap_s: float | None = None,
        later_gather_cap_s: float = 0.0,
    ) -> None:
        self.labels: list[Label] = []
        self.k, self.s = m_coef, s_coef
        self.sync_cap_s = float("inf") if later_sync_cap_s is None else later_sync_cap_s
        """``sigma`` of :func:`worse_by_at_most` (inf: no cap, the plain rule)."""
        self.gather_cap_s = later_gather_cap_s
        """``gamma`` of :func:`worse_by_at_most`."""

    def insert(self, label: Label, stats: DPStats) -> None:
        # worse_by_at_most inlined (the search's hottest loop); same arithmetic
        k, w, cap, gam = self.k, self.s, self.sync_cap_s, self.gather_cap_s
        s, mx, b, e, o = label.total_s, label.max_s, label.bwd_sum_s, label.exposed_s, label.opt_s
        x = label.tail_s
        for other in self.labels:
            d_m = other.max_s - mx
            d_b = b - other.bwd_sum_s
            if d_b > 0.0:  # the later exposed sync other may add: at most its own cap less e
                room = cap - other.bwd_sum_s
                room = (room if room > 0.0 else 0.0) + gam - e
                if room < d_b:
                    d_b = room
            else:
                d_b = 0.0
            d_e = other.exposed_s - e
            d_o = other.opt_s - o
            d_x = other.tail_s - x
            if (
                w * (other.total_s - s)
                + (k * d_m if d_m > 0.0 else 0.0)
                + (d_e if d_e > d_b else d_b)
                + (d_o if d_o > 0.0 else 0.0)
                + (d_x if d_x > 0.0 else 0.0)
            ) <= 0.0:
                stats.labels_dominated += 1
                return
        room_new = cap - b
        room_new = (room_new if room_new > 0.0 else 0.0) + gam
        kept = []
        for other in self.labels:
            d_m = mx - other.max_s
            d_b = other.bwd_sum_s - b
            if d_b > 0.0:
                room = room_new - other.exposed_s
                if room < d_b:
                    d_b = room
            else:
                d_b = 0.0
            d_e = e - other.exposed_s
            d_o = o - other.opt_s
            d_x = x - other.tail_s
            if (
                w * (s - other.total_s)
                + (k * d_m if d_m > 0.0 else 0.0)
                + (d_e if d_e > d_b else d_b)
                + (d_o if d_o > 0.0 else 0.0)
                + (d_x if d_x > 0.0 else 0.0)
            ) > 0.0:
                kept.append(other)
        stats.labels_dominated += len(self.labels) - len(kept)
        kept.append(label)
        self.labels = kept


class GreedyFront:
    """Keeps one label per state, the one with the smallest objective so far: a fast heuristic
    whose result is a real plan, used only to seed the exact search's bound."""

    __slots__ = ("labels", "k", "s")

    def __init__(self, m_coef: float, s_coef: float = 1.0) -> None:
        self.labels: list[Label] = []
        self.k, self.s = m_coef, s_coef

    def insert(self, label: Label, stats: DPStats) -> None:
        if not self.labels or objective_s(label, self.k, self.s) < objective_s(
            self.labels[0], self.k, self.s
        ):
            self.labels = [label]


def backtrack(best: Label) -> list:
    choices = []
    lab: Label | None = best
    while lab is not None and lab.choice is not None:
        choices.append(lab.choice)
        lab = lab.parent
    return choices[::-1]


def extending_modes(fitting: list, k: int, zero_bubble: bool, zb_h2: bool = False) -> list:
    """The fitting modes ``(t, mode, row)`` that extend a stage (module docstring): the fastest
    (ties: the first), or under ZB-H1, when the fastest one's B pass is shorter than its
    forward and its W pass (so its credit ``c = min(w, f, b')`` is ``b'`` and a slower mode's
    larger ``b'`` may raise it), every one; under ZB-H2 (``zb_h2``) the fastest."""
    if not fitting:
        return []
    fastest = min(fitting, key=lambda x: x[0])  # min keeps the first of equal times
    if zero_bubble and not zb_h2:
        row = fastest[2]
        f = row.time_s[k] - row.bwd_s[k]
        if row.drain_s[k] < min(row.wgrad_s[k], f):
            return fitting
    return [fastest]


def block_fitting(sm, r, i, j, bases, fitting, fits, rows, common, stats) -> list:
    """The every-n-blocks options of stage ``r`` holding ``i..j`` (two blocks or more) that may
    extend it (module docstring), as ``(t, BlockRecompute, row)``: per base mode that does not
    fit and is faster than every fitting option, the fewest fully recomputed blocks that fit,
    or every fitting count where :meth:`~nest.dp.stages.StageModel.block_monotone` fails.
    ``fits`` and ``rows`` are the caller's per-mode caches (block rows are cached by
    ``(mode, k)``)."""
    best = min((t for t, _, _ in fitting), default=float("inf"))
    out = []
    for base in bases:
        monotone = sm.block_monotone(r, base)
        fit = fits.get(base)
        if fit is None:
            fit = fits[base] = sm.fits_from(r, i, base)
        if fit[j - i] and monotone:
            continue  # k = 0 fits and is at least as fast as every k
        row = rows.get(base)
        if row is None:
            row = rows[base] = stage_row(sm, r, i, base, common)
        if row.time_s[j - i] >= best and monotone:
            continue  # every k costs at least k = 0, which is no faster than a fitting option
        stats.stages_scored += 1
        ok = np.flatnonzero(sm.block_memory(r, i, j, base) <= sm.capacity_bytes) + 1
        if not len(ok):
            stats.memory_rejected += 1
            continue
        for k in ok[:1] if monotone else ok:
            choice = BlockRecompute(base, int(k))
            brow = rows.get(choice)
            if brow is None:
                brow = rows[choice] = stage_row(sm, r, i, base, common, int(k))
            out.append((brow.time_s[j - i], choice, brow))
    return out


def solve_config(
    sm: StageModel,
    modes: tuple[Recompute, ...],
    incumbent_s: float,
    stats: DPStats,
    *,
    exact: bool = True,
    block_bases: tuple[Recompute, ...] = (),
) -> tuple[float, list[tuple[int, int, Recompute]]] | None:
    """Best (objective, [(first, last, mode) per rank]) of this configuration, or None when
    nothing fits or nothing beats ``incumbent_s``; ``block_bases``: the base modes of the
    every-n-blocks options (module docstring), whose choices are
    :class:`~nest.core.plan.BlockRecompute`.

    Long: the search's hot loop (rank, start, end, mode, label), kept in one frame so its
    bounds and lazily built rows stay locals; split, each level would pass them on per call.
    """
    pp, n, m = sm.config.pp, sm.n_layers, sm.m
    schedule = sm.config.schedule
    zero_bubble = schedule.splits_backward
    zb_h2 = schedule is Schedule.ZB_H2
    # T = S + (m - 1) M + X + E + O (X = 0 but under ZB-H1 and ZB-H2)
    _, m_coef = pipeline_coefficients(m, schedule, 1)
    # block options run blocks in full: its floors too (the least of each layer's modes)
    floor_modes = (*modes, Recompute.FULL) if block_bases else modes
    min_compute = sm.placed_floor_s(tuple(dict.fromkeys(floor_modes)))
    # a stage's share of S is u >= t - 2 w (ZB-H1; ZB-H2 t - 3 w; u = t otherwise): the floor
    # of the sum term is the layers' floors less that many W passes (w is the same for every
    # rank and mode)
    credit_w = 3.0 if zb_h2 else 2.0 if zero_bubble else 0.0
    credit = (credit_w * sm.chain.wgrad_s).tolist()
    # ZB-H2 also has u >= f >= the layers' forward compute (prefix sums, every rank and mode)
    forwards = sm.chain.fwd_s.tolist() if zb_h2 else None
    start = Front(m_coef)
    start.insert(Label(0.0, 0.0, 0.0, 0.0, 0.0), stats)
    fronts: dict[int, Front] = {0: start}
    for r in range(pp):
        rest = pp - r - 1
        new_fronts: dict[int, Front] = {}
        for i, front in sorted(fronts.items()):
            labels = front.labels
            last = n - 1 - rest
            # the cheap test below bounds every label of the state at once: each has
            # S >= low_s, M >= low_m, E >= low_e and O >= low_o (and X >= 0); low_s adds the
            # floor of the sum term of layers i.. (their floors less the credit; ZB-H2: at
            # least their forwards)
            sum_low = min_compute[n] - min_compute[i] - (credit[n] - credit[i])
            if forwards is not None:
                sum_low = max(sum_low, forwards[n] - forwards[i])
            low_s = min(lab.total_s for lab in labels) + sum_low
            low_m = min(lab.max_s for lab in labels)
            low_eo = min(lab.exposed_s for lab in labels) + min(lab.opt_s for lab in labels)
            fits: dict = {}  # mode -> whether layers i..j fit, for every j (on first use)
            rows: dict = {}  # mode -> the stage's terms for every j (on first use)
            common = None  # their mode-independent part
            for j in range(i, last + 1) if rest else (n - 1,):
                remaining = min_compute[n] - min_compute[j + 1]
                # the stage takes at least its layers' floors, the later ones theirs
                t_low = min_compute[j + 1] - min_compute[i]
                spread = remaining / rest if rest else 0.0
                low = low_s + low_eo + m_coef * max(low_m, t_low, spread)
                if low > incumbent_s:
                    stats.labels_bounded += len(labels)
                    if t_low >= spread:
                        break  # later j: t_low grows, spread shrinks, so low never falls
                    continue
                per_rank = remaining / rest if rest else 0.0
                rest_sum = remaining - (credit[n] - credit[j + 1])
                if forwards is not None:
                    rest_sum = max(rest_sum, forwards[n] - forwards[j + 1])
                fitting = []  # (t, mode, row) of the modes that fit
                for mode in sm.modes_for(i, j, modes):
                    stats.stages_scored += 1
                    fit = fits.get(mode)
                    if fit is None:
                        fit = fits[mode] = sm.fits_from(r, i, mode)
                    if not fit[j - i]:  # memory first: cheaper than the times
                        stats.memory_rejected += 1
                        continue
                    row = rows.get(mode)
                    if row is None:
                        if common is None:
                            common = stage_common(sm, r, i)
                        row = rows[mode] = stage_row(sm, r, i, mode, common)
                    fitting.append((row.time_s[j - i], mode, row))
                if block_bases and sm.block_span(i, j)[1] > 1:
                    if common is None:
                        common = stage_common(sm, r, i)
                    fitting += block_fitting(
                        sm, r, i, j, block_bases, fitting, fits, rows, common, stats
                    )
                for _, mode, row in extending_modes(fitting, j - i, zero_bubble, zb_h2):
                    k = j - i
                    t, b = row.time_s[k], row.bwd_s[k]
                    u, e, drain, w = row.sum_s[k], row.tail_s[k], row.drain_s[k], row.wgrad_s[k]
                    sync, opt = row.sync_s[k], row.optimizer_s[k]
                    gathered = row.gather_exposed_s[k]
                    own = (w if zero_bubble else b) if sm.overlap else 0.0
                    # ZB-H1: the W passes it runs after rank 0 (0 otherwise); ZB-H2: its own
                    # share of the hidden time, (pp - 1 - r) max(0, -d_r), added after the max
                    claw = 0.0 if zb_h2 else r * w
                    own_hidden = rest * -drain if zb_h2 and drain < 0.0 else 0.0
                    front = None
                    for lab in labels:
                        total = lab.total_s + u
                        top = lab.max_s if lab.max_s > t else t
                        tail = lab.tail_s if lab.tail_s > e else e
                        # rank_exposed_sync_s and sync_hidden_s (nest.cost.pipeline) inlined
                        hidden = lab.bwd_sum_s - claw
                        exposed = sync - (hidden if hidden > 0.0 else 0.0) - own_hidden - own
                        exposed = (exposed if exposed > 0.0 else 0.0) + gathered
                        exposed = lab.exposed_s if lab.exposed_s > exposed else exposed
                        step = lab.opt_s if lab.opt_s > opt else opt
                        stats.labels_created += 1
                        bound = (
                            total
                            + rest_sum
                            + m_coef * (top if top > per_rank else per_rank)
                            + tail
                            + exposed
                            + step
                        )
                        if bound > incumbent_s:
                            stats.labels_bounded += 1
                            continue
                        if front is None:
                            front = new_fronts.get(j + 1)
                            if front is None:
                                front = Front(m_coef) if exact else GreedyFront(m_coef)
                                new_fronts[j + 1] = front
                        front.insert(
                            Label(
                                total,
                                top,
                                lab.bwd_sum_s + (drain if drain > 0.0 or not zb_h2 else 0.0),
                                exposed,
                                step,
                                lab,
                                (i, j, mode),
                                tail,
                            ),
                            stats,
                        )
        fronts = new_fronts
        if not fronts:
            return None
    finals = fronts[n].labels if n in fronts else []
    if not finals:
        return None
    best = min(finals, key=lambda lab: objective_s(lab, m_coef))
    value = objective_s(best, m_coef)
    if value > incumbent_s:
        return None
    return value, backtrack(best)
