"""ZB-V configurations: an exact search over the recompute modes of the fixed V chunks.

Space (:mod:`nest.dp.space`): the ``2 pp`` chunks of :func:`~nest.dp.space.fixed_chunks`, rank
``r`` holding chunk ``r`` (its first) and chunk ``2 pp - 1 - r`` (its second), and a recompute
mode per chunk. The shared evaluator charges (:func:`nest.cost.pipeline.zb_v_pipeline_s`)

    ``T = m max_r t_r + max_r l_r(F, B, W) + max_r max(0, sync_r - (max_s l_s - l_r) [- w_r]) + O``

with ``t_r`` the forward and backward of rank ``r``'s two chunks, ``F``, ``B``, ``W`` the
chunks' largest forward, B pass (backward less W) and W pass, ``sync_r``, ``w_r`` (its last W)
and ``O`` the optimizer step. A chunk's forward, backward and W pass depend on its own layers
and mode only (its hops go to fixed ranks, the neighbours' boundary bytes do not depend on
their modes), a rank's memory on its two chunks' modes only, and ``F``, ``W``, the syncs and
``O`` on no mode at all (recomputation and activation offload add to the backward's B part).

**Exactness.** Write ``G(beta)`` for the terms after ``m max_r t_r`` with ``B = beta``. Every
assignment has ``B`` equal to one of the chunks' B passes under one of the modes, so ``min T =
min_beta (G(beta) + m min { max_r t_r : assignments that fit with B = beta })``. An assignment
has ``B = beta`` when every chunk's B pass is at most ``beta`` and one equals it; the ranks'
times and memory are independent given their own pairs of modes, so with ``A_r(beta)`` the
least ``t_r`` over rank ``r``'s fitting pairs with both B passes at most ``beta`` and
``H_r(beta)`` the least with the larger equal to ``beta``, that minimum is ``min_rho
max(H_rho(beta), max_{r != rho} A_r(beta))`` (the rank ``rho`` that reaches ``beta``; the
others at their least). :func:`solve_zb_v` takes it over every ``beta``: the same optimum
``brute`` finds (``tests/test_zb_v.py``). The per-chunk terms and the per-rank memory are
read from :func:`nest.cost.evaluate` on plans that give every first chunk one mode and every
second chunk one mode (``modes^2`` plans), never re-derived.

**Pruning.** ``l_r`` has the path ``r F`` for ``r >= 1`` (the last rank waits ``(pp - 1) F``
for its first microbatch), the exposed sync is non-negative and each ``t_r`` is at least its
chunks' fastest modes', so ``m max_r (fastest t_r) + (pp - 1) F + O`` bounds every plan of the
configuration from below: above the incumbent, the configuration is dropped after the ``modes``
uniform plans.
"""

from itertools import product

from nest.core.axes import Recompute
from nest.core.plan import ParallelConfig
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.cost.pipeline import zb_v_exposed_sync_s, zb_v_lags_s
from nest.dp.recurrence import DPStats
from nest.dp.space import fixed_chunks


def _choices(chunks, pp: int, first: Recompute, second: Recompute):
    """``(first, last, mode)`` per chunk: ``first`` on every rank's first chunk (``k < pp``),
    ``second`` on every second chunk."""
    return [(i, j, first if k < pp else second) for k, (i, j) in enumerate(chunks)]


class ZbvTables:
    """The evaluator's terms of one ZB-V configuration per mode (module docstring)."""

    def __init__(self, problem: Problem, config: ParallelConfig, modes) -> None:
        from nest.dp.planner import plan_from_choices

        self.problem, self.config, self.modes = problem, config, tuple(modes)
        self.chunks = fixed_chunks(config, problem.num_layers)
        self.pp = config.pp
        self._plan = plan_from_choices
        self._reports: dict = {}

    def report(self, first: Recompute, second: Recompute):
        got = self._reports.get((first, second))
        if got is None:
            plan = self._plan(
                self.problem, self.config, _choices(self.chunks, self.pp, first, second)
            )
            got = self._reports[first, second] = evaluate(self.problem, plan)
        return got

    def chunk_terms(self, k: int, mode: Recompute) -> tuple[float, float]:
        """Chunk ``k``'s ``(fwd + bwd, B pass)`` under ``mode`` (chunk-local terms)."""
        st = self.report(mode, mode).stages[k]
        return st.fwd_s + st.bwd_s, st.bwd_s - st.wgrad_s

    def rank_pairs(self, r: int) -> list[tuple[float, float, Recompute, Recompute]]:
        """Rank ``r``'s fitting pairs of modes: ``(t_r, larger B pass, first mode, second)``."""
        out = []
        first, second = r, 2 * self.pp - 1 - r
        for a, b in product(self.modes, repeat=2):
            if not self.report(a, b).ranks[r].memory.fits:
                continue
            ta, ba = self.chunk_terms(first, a)
            tb, bb = self.chunk_terms(second, b)
            out.append((ta + tb, max(ba, bb), a, b))
        return out


def _fixed_terms(tables: ZbvTables):
    """``F``, ``W``, the syncs, each rank's last W, ``O`` (no mode changes them)."""
    rep = tables.report(tables.modes[0], tables.modes[0])
    st = rep.stages
    last_w = [st[len(st) - 1 if r == 0 else r].wgrad_s for r in range(tables.pp)]
    return (
        max(s.fwd_s for s in st),
        max(s.wgrad_s for s in st),
        [rk.dp_sync_s for rk in rep.ranks],
        last_w,
        max(rk.optimizer_s for rk in rep.ranks),
    )


def solve_zb_v(
    problem: Problem,
    config: ParallelConfig,
    modes,
    incumbent_s: float,
    stats: DPStats,
    *,
    exact: bool = True,
):
    """Best (objective, [(first, last, mode) per chunk]) of a ZB-V configuration, or None when
    nothing fits or nothing beats ``incumbent_s`` (module docstring; ``exact`` is accepted for
    the planner's interface: the search is exact either way)."""
    del exact
    tables = ZbvTables(problem, config, modes)
    pp, m = config.pp, problem.training.global_batch // (config.microbatch_size * config.dp)
    f_max, w_max, sync, last_w, opt = _fixed_terms(tables)
    overlap = problem.training.overlap_grad_sync
    fastest = [
        min(tables.chunk_terms(r, c)[0] for c in tables.modes)
        + min(tables.chunk_terms(2 * pp - 1 - r, c)[0] for c in tables.modes)
        for r in range(pp)
    ]
    stats.stages_scored += len(tables.modes) * 2 * pp
    if m * max(fastest) + (pp - 1) * f_max + opt > incumbent_s:
        stats.labels_bounded += 1
        return None
    pairs = [tables.rank_pairs(r) for r in range(pp)]
    if not all(pairs):
        return None
    best = None
    for beta in sorted({b for rank in pairs for _, b, _, _ in rank}):
        low = [min((p for p in rank if p[1] <= beta), default=None) for rank in pairs]
        hit = [min((p for p in rank if p[1] == beta), default=None) for rank in pairs]
        if any(x is None for x in low):
            continue
        lags = zb_v_lags_s(pp, f_max, beta, w_max)
        hidden = [max(lags) - lag for lag in lags]
        tail = max(lags) + max(zb_v_exposed_sync_s(sync, hidden, last_w, overlap)) + opt
        for rho, reach in enumerate(hit):
            if reach is None:
                continue
            picks = [reach if r == rho else low[r] for r in range(pp)]
            value = m * max(p[0] for p in picks) + tail
            if best is None or value < best[0]:
                best = (value, picks)
    if best is None or best[0] > incumbent_s:
        return None
    per_chunk = {}
    for r, (_, _, a, b) in enumerate(best[1]):
        per_chunk[r], per_chunk[2 * pp - 1 - r] = a, b
    return best[0], [(i, j, per_chunk[k]) for k, (i, j) in enumerate(tables.chunks)]


def smallest_peak_zb_v(problem: Problem, config: ParallelConfig, modes):
    """The least per-device peak memory of any plan of a ZB-V configuration (each rank at its
    least-memory pair of modes; ranks are independent) and such a plan."""
    from nest.dp.planner import plan_from_choices

    tables = ZbvTables(problem, config, modes)
    pp = config.pp
    least = []
    for r in range(pp):
        least.append(
            min(
                (tables.report(a, b).ranks[r].memory.total_bytes, a, b)
                for a, b in product(tables.modes, repeat=2)
            )
        )
    per_chunk = {}
    for r, (_, a, b) in enumerate(least):
        per_chunk[r], per_chunk[2 * pp - 1 - r] = a, b
    choices = [(i, j, per_chunk[k]) for k, (i, j) in enumerate(tables.chunks)]
    return max(x[0] for x in least), plan_from_choices(problem, config, choices)
