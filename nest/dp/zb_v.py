"""ZB-V configurations: an exact search over the recompute modes of the fixed V chunks.

Space (:mod:`nest.dp.space`): the ``2 pp`` chunks of :func:`~nest.dp.space.fixed_chunks`, rank
``r`` holding chunk ``r`` (its first) and chunk ``2 pp - 1 - r`` (its second), and a recompute
mode per chunk. The shared evaluator charges (:func:`nest.cost.pipeline.zb_v_pipeline_s`)

    ``T = m max_r t_r + max_r l_r(F, B, W) + max_r (max(0, sync_r - (max_s l_s - l_r) [- w_r])
    + g_r) + O``

with ``t_r`` the forward and backward of rank ``r``'s two chunks, ``F``, ``B``, ``W`` the
chunks' largest forward, B pass (backward less W) and W pass, ``sync_r`` (the gradient part),
``w_r`` (its last W), ``g_r`` its exposed weight all-gather (under its first chunk's forward,
which no mode changes) and ``O`` the optimizer step. A chunk's forward, backward and W pass
depend on its own layers and mode only (its hops go to fixed ranks, the neighbours' boundary
bytes do not depend on their modes), a rank's memory on its two chunks' modes only, and
``F``, ``W``, the syncs and ``O`` on no mode at all (recomputation and activation offload add to
the backward's B part).

**Exactness.** Write ``G(beta)`` for the terms after ``m max_r t_r`` with ``B = beta``. Every
assignment has ``B`` equal to one of the chunks' B passes under one of the modes, so ``min T =
min_beta (G(beta) + m min { max_r t_r : assignments that fit with B = beta })``. An assignment
has ``B = beta`` when every chunk's B pass is at most ``beta`` and one equals it; the ranks'
times and memory are independent given their own pairs of modes, so with ``A_r(beta)`` the
least ``t_r`` over rank ``r``'s fitting pairs with both B passes at most ``beta`` and
``H_r(beta)`` the least with the larger equal to ``beta``, that minimum is ``min_rho
max(H_rho(beta), max_{r != rho} A_r(beta))`` (the rank ``rho`` that reaches ``beta``; the
others at their least). :func:`solve_zb_v` takes it over every ``beta``: the same optimum
``brute`` finds (``tests/test_zb_v.py``). The per-chunk terms and the per-rank memory are the
DP's stage model's (:meth:`nest.dp.stages.StageModel.v_chunk_terms`, the evaluator's terms on
arrays; the planner checks its optimum against :func:`nest.cost.evaluate`).

**Pruning.** ``l_r`` has the path ``r F`` for ``r >= 1`` (the last rank waits ``(pp - 1) F``
for its first microbatch), the exposed sync is non-negative and each ``t_r`` is at least its
chunks' fastest modes', so ``m max_r (fastest t_r) + (pp - 1) F + O`` bounds every plan of the
configuration from below: above the incumbent, the configuration is dropped before any pair of
modes is priced.
"""

from itertools import product

from nest.core.axes import Recompute
from nest.cost.memory import rank_memory_bytes
from nest.cost.pipeline import zb_v_exposed_sync_s, zb_v_lags_s
from nest.dp.recurrence import DPStats
from nest.dp.stages import StageModel


class ZbvTables:
    """One ZB-V configuration's terms per chunk and mode, and per rank its fitting pairs of
    modes (module docstring), from the DP's stage model."""

    def __init__(self, sm: StageModel, modes) -> None:
        self.sm, self.modes, self.pp = sm, tuple(modes), sm.config.pp
        self.chunks = sm.chunks
        n = len(self.chunks)
        # per chunk, per mode: (fwd, bwd, W, stored bytes, transient bytes)
        self.terms = [[sm.v_chunk_terms(k, c) for c in self.modes] for k in range(n)]
        # (sync, opt, state, gathered)
        self.ranks = [sm.interleaved_rank(r) for r in range(self.pp)]

    def fastest_s(self, k: int) -> float:
        return min(f + b for f, b, *_ in self.terms[k])

    def rank_pairs(self, r: int) -> list[tuple[float, float, Recompute, Recompute]]:
        """Rank ``r``'s fitting pairs of modes: ``(t_r, larger B pass, first mode, second)``."""
        sm, out = self.sm, []
        first, second = self.terms[r], self.terms[2 * self.pp - 1 - r]
        state = self.ranks[r][2]
        for (a, ta), (b, tb) in product(enumerate(first), enumerate(second)):
            memory = rank_memory_bytes(
                state, ta[3] + tb[3], sm.in_flight[r], max(ta[4], tb[4]), sm.reserve_bytes
            )
            if memory > sm.capacity_bytes:
                continue
            t = ta[0] + ta[1] + tb[0] + tb[1]
            out.append((t, max(ta[1] - ta[2], tb[1] - tb[2]), self.modes[a], self.modes[b]))
        return out

    def least_memory(self, r: int) -> tuple[float, Recompute, Recompute]:
        """Rank ``r``'s least memory over its pairs of modes, and that pair."""
        sm = self.sm
        first, second = self.terms[r], self.terms[2 * self.pp - 1 - r]
        return min(
            (
                rank_memory_bytes(
                    self.ranks[r][2], ta[3] + tb[3], sm.in_flight[r], max(ta[4], tb[4]),
                    sm.reserve_bytes,
                ),
                self.modes[a],
                self.modes[b],
            )
            for (a, ta), (b, tb) in product(enumerate(first), enumerate(second))
        )  # fmt: skip

    def choices(self, per_rank) -> list[tuple[int, int, Recompute]]:
        """``(first, last, mode)`` per chunk from each rank's (first mode, second mode)."""
        per_chunk = {}
        for r, (a, b) in enumerate(per_rank):
            per_chunk[r], per_chunk[2 * self.pp - 1 - r] = a, b
        return [(i, j, per_chunk[k]) for k, (i, j) in enumerate(self.chunks)]


def solve_zb_v(sm: StageModel, modes, incumbent_s: float, stats: DPStats, *, exact: bool = True):
    """Best (objective, [(first, last, mode) per chunk]) of a ZB-V configuration, or None when
    nothing fits or nothing beats ``incumbent_s`` (module docstring; ``exact`` is accepted for
    the planner's interface: the search is exact either way)."""
    del exact
    tables = ZbvTables(sm, modes)
    pp, m, n = sm.config.pp, sm.m, len(tables.chunks)
    stats.stages_scored += len(tables.modes) * n
    f_max = max(t[0][0] for t in tables.terms)  # no mode changes a forward or a W pass
    w_max = max(t[0][2] for t in tables.terms)
    sync = [rank[0] for rank in tables.ranks]
    gathered = [rank[3] for rank in tables.ranks]
    opt = max(rank[1] for rank in tables.ranks)
    last_w = [tables.terms[n - 1 if r == 0 else r][0][2] for r in range(pp)]
    fastest = [tables.fastest_s(r) + tables.fastest_s(n - 1 - r) for r in range(pp)]
    if m * max(fastest) + (pp - 1) * f_max + opt > incumbent_s:
        stats.labels_bounded += 1
        return None
    pairs = [tables.rank_pairs(r) for r in range(pp)]
    if not all(pairs):
        return None
    best = None
    for beta in sorted({b for rank in pairs for _, b, _, _ in rank}):
        low = [min((p for p in rank if p[1] <= beta), default=None) for rank in pairs]
        if any(x is None for x in low):
            continue
        lags = zb_v_lags_s(pp, f_max, beta, w_max)
        hidden = [max(lags) - lag for lag in lags]
        tail = max(zb_v_exposed_sync_s(sync, hidden, last_w, sm.overlap, gathered)) + opt
        for rho, rank in enumerate(pairs):
            reach = min((p for p in rank if p[1] == beta), default=None)
            if reach is None:
                continue
            top = max(reach[0], *(low[r][0] for r in range(pp) if r != rho))
            value = m * top + max(lags) + tail
            stats.labels_created += 1
            if best is None or value < best[0]:
                best = (value, [reach if r == rho else low[r] for r in range(pp)])
    if best is None or best[0] > incumbent_s:
        return None
    return best[0], tables.choices([(a, b) for _, _, a, b in best[1]])


def smallest_peak_zb_v(sm: StageModel, modes) -> tuple[float, list]:
    """The least per-device peak memory of any plan of a ZB-V configuration (each rank at its
    least-memory pair of modes; ranks are independent) and that plan's chunk choices."""
    tables = ZbvTables(sm, modes)
    least = [tables.least_memory(r) for r in range(tables.pp)]
    return max(x[0] for x in least), tables.choices([(a, b) for _, a, b in least])
