"""DualPipeV configurations: an exact search over the recompute modes of the fixed V chunks.

Space (:mod:`nest.dp.space`): ZB-V's ``2 pp`` chunks and V placement under DeepSeek's order
(:mod:`nest.cost.dualpipe`), a recompute mode per chunk. The shared evaluator charges

    ``I = T + max_r (max(0, sync_r - (T - e_r) [- w_r]) + g_r) + O``

with ``T = max_r e_r`` and ``e_r`` rank ``r``'s end in the list schedule of the order on the
chunks' passes, ``w_r`` its last task (a W pass), ``sync_r`` (the gradient part), ``g_r`` its
exposed weight all-gather (under its first chunk's forward, which no mode changes: a constant
that keeps every argument below non-decreasing) and ``O`` the optimizer step. A
chunk's forward, its compute and its W pass, the syncs and ``O`` depend on no mode; its full
backward's compute ``c_b`` (backward and recomputation) and transfers ``x_b`` (collectives,
ZeRO-3, the PP send, offload) on its own mode only (its hops go to fixed ranks); a rank's
memory on its two chunks' modes only.

**Monotonicity.** Every task's duration is non-decreasing in each chunk's ``(c_b, x_b)``: a B
pass ``c_b + x_b - w``, a full backward ``c_b + x_b``, an F&B ``c_f + max(c_b, x_f) + max(0,
x_b - c_f)`` (:func:`nest.cost.dualpipe.overlapped_s`). In a list schedule with fixed orders each
task ends at ``max(its rank's previous end, its inputs' ends) + its duration``, a max-plus
expression, so every ``e_r`` and ``T`` are non-decreasing in every duration; and ``I - O =
max(T, max_r (e_r + sync_r [- w_r]))`` (``T + max(0, s - T + e) = max(T, e + s)``), with
``w_r`` a W pass (no mode changes it), is non-decreasing in them too.

**Exactness.** Call a rank's fitting pair of modes (first chunk, second) dominated when another
fitting pair has every one of the four ``c_b, x_b`` at most its own. Replacing a dominated pair
by one that dominates it keeps the plan fitting (memory is per rank) and, by monotonicity, no
slower; so some optimum uses only undominated pairs. :func:`solve_dualpipe_v` searches the
product of the ranks' undominated pairs depth first, rank by rank; a partial assignment is
bounded below by the schedule with every unassigned chunk at the least ``c_b`` and the least
``x_b`` of its rank's undominated pairs (each at most any real choice's, so by monotonicity at
most any completion's value), and pruned when that bound is not below the best found or the
incumbent. Before any schedule runs, ``m`` times the largest rank's least compute (each of its
tasks takes at least its compute, an F&B both computes) plus ``O`` bounds the configuration
from below. Where every rank has one undominated pair (everything fits without recomputation,
the usual case) the search is one schedule. It stops with a one-line error past
:data:`MAX_SCHEDULES` schedules rather than return a plan it has not proved best
(``tests/test_dualpipe_v.py``: ``nest == brute`` on random small problems).
"""

from itertools import product

from nest.core.errors import UserError
from nest.cost.dualpipe import dualpipe_v_pipeline_s
from nest.cost.memory import rank_memory_bytes
from nest.cost.pipeline import zb_v_exposed_sync_s
from nest.dp.recurrence import DPStats
from nest.dp.stages import StageModel

MAX_SCHEDULES = 20_000
"""The most list schedules one configuration's exact search runs before it refuses."""


def chunk_terms(sm: StageModel, k: int, mode) -> tuple:
    """Chunk ``k`` in ``mode``: ``(fwd, fwd compute, bwd, bwd compute, W, stored bytes,
    largest transient bytes)``, the evaluator's terms (:meth:`StageModel.v_chunk_terms`; the
    compute parts are the chain's forward, and backward plus recomputation, of its layers)."""
    fwd, bwd, wgrad, stored, transient = sm.v_chunk_terms(k, mode)
    i, j = sm.chunks[k]
    ch = sm.chain
    fwd_compute = float(ch.fwd_s[j + 1] - ch.fwd_s[i])
    bwd_compute = float(
        (ch.bwd_s[j + 1] - ch.bwd_s[i]) + (ch.recompute_s[mode][j + 1] - ch.recompute_s[mode][i])
    )
    return fwd, fwd_compute, bwd, bwd_compute, wgrad, stored, transient


def _undominated(options: list[tuple]) -> list[tuple]:
    """The options ``(key, ...)`` whose ``key`` no other option's is at most in every entry."""
    out = []
    for a in options:
        dominated = any(
            b[0] != a[0] and all(x <= y for x, y in zip(b[0], a[0], strict=True)) for b in options
        )
        if not dominated and all(b[0] != a[0] for b in out):  # equal keys: keep one
            out.append(a)
    return out


def _rank_pairs(sm: StageModel, terms, state_bytes: float, r: int, modes) -> list[tuple]:
    """Rank ``r``'s undominated fitting pairs of modes: ``((c_b, x_b) of its first chunk and
    of its second, first mode, second mode)`` (module docstring)."""
    n = len(terms)
    fits = []
    for (a, ta), (b, tb) in product(enumerate(terms[r]), enumerate(terms[n - 1 - r])):
        memory = rank_memory_bytes(
            state_bytes, ta[5] + tb[5], sm.in_flight[r], max(ta[6], tb[6]), sm.reserve_bytes
        )
        if memory <= sm.capacity_bytes:
            fits.append(((ta[3], ta[2] - ta[3], tb[3], tb[2] - tb[3]), modes[a], modes[b]))
    return _undominated(fits)


class _Search:
    """The branch and bound of one configuration (module docstring): :meth:`value` prices the
    ranks' ``(c_b, x_b)`` keys, :meth:`visit` branches rank by rank."""

    def __init__(self, sm: StageModel, terms, ranks, pairs, incumbent_s: float, stats) -> None:
        self.sm, self.pairs, self.stats = sm, pairs, stats
        self.pp, self.n = sm.config.pp, len(terms)
        self.fwd = [t[0][0] for t in terms]
        self.fwd_compute = [t[0][1] for t in terms]
        self.wgrad = [t[0][4] for t in terms]
        self.sync, self.opt = [x[0] for x in ranks], max(x[1] for x in ranks)
        self.gathered = [x[3] for x in ranks]
        self.least = [tuple(min(p[0][i] for p in rank) for i in range(4)) for rank in pairs]
        self.best: list = [incumbent_s, None]
        self.runs = 0
        # ranks with one undominated pair are fixed; branch on the widest of the others first
        self.fixed = {r: pairs[r][0] for r in range(self.pp) if len(pairs[r]) == 1}
        self.branch = sorted(
            (r for r in range(self.pp) if r not in self.fixed), key=lambda r: -len(pairs[r])
        )

    def value(self, keys) -> float:
        self.runs += 1
        if self.runs > MAX_SCHEDULES:
            raise UserError(
                f"solver=nest: DualPipeV's exact search on pp={self.pp} ran past {MAX_SCHEDULES} "
                "schedules for one configuration; drop dualpipe_v, or narrow solver.recompute"
            )
        n = self.n
        bwd, bwd_compute = [0.0] * n, [0.0] * n
        for r, key in enumerate(keys):
            for k, (cb, xb) in ((r, key[:2]), (n - 1 - r, key[2:])):
                bwd[k], bwd_compute[k] = cb + xb, cb
        t_pipe, hidden, last_w = dualpipe_v_pipeline_s(
            self.pp, self.sm.m, self.fwd, self.fwd_compute, bwd, bwd_compute, self.wgrad
        )
        exposed = zb_v_exposed_sync_s(self.sync, hidden, last_w, self.sm.overlap, self.gathered)
        return t_pipe + max(exposed) + self.opt

    def visit(self, depth: int, chosen: dict) -> None:
        best = self.best
        keys = [chosen[r][0] if r in chosen else self.least[r] for r in range(self.pp)]
        bound = self.value(keys)  # exact once every rank is chosen
        self.stats.labels_created += 1
        if depth == len(self.branch):
            if bound < best[0] or (best[1] is None and bound <= best[0]):
                best[0], best[1] = bound, dict(chosen)
            return
        if bound > best[0] or (best[1] is not None and bound >= best[0]):
            self.stats.labels_bounded += 1
            return
        r = self.branch[depth]
        for pair in sorted(self.pairs[r], key=lambda p: sum(p[0])):
            chosen[r] = pair
            self.visit(depth + 1, chosen)
            del chosen[r]


def solve_dualpipe_v(
    sm: StageModel, modes, incumbent_s: float, stats: DPStats, *, exact: bool = True
):
    """Best (objective, [(first, last, mode) per chunk]) of a DualPipeV configuration, or None
    when nothing fits or nothing beats ``incumbent_s`` (module docstring; ``exact`` is accepted
    for the planner's interface: the search is exact either way)."""
    del exact
    modes = tuple(modes)
    pp, m, n = sm.config.pp, sm.m, len(sm.chunks)
    terms = [[chunk_terms(sm, k, c) for c in modes] for k in range(n)]
    stats.stages_scored += len(modes) * n
    ranks = [sm.interleaved_rank(r) for r in range(pp)]
    # each rank runs m forwards and m full backwards of both chunks, an F&B at least the two
    # computes: T >= m sum of its chunks' least compute (module docstring), and I >= T + O
    least_compute = [t[0][1] + min(x[3] for x in t) for t in terms]
    busy = max(least_compute[r] + least_compute[n - 1 - r] for r in range(pp))
    if m * busy + max(x[1] for x in ranks) > incumbent_s:
        stats.labels_bounded += 1
        return None
    pairs = [_rank_pairs(sm, terms, ranks[r][2], r, modes) for r in range(pp)]
    if not all(pairs):
        return None
    search = _Search(sm, terms, ranks, pairs, incumbent_s, stats)
    search.visit(0, dict(search.fixed))
    if search.best[1] is None:
        return None
    per_chunk = {}
    for r, (_, a, b) in search.best[1].items():
        per_chunk[r], per_chunk[n - 1 - r] = a, b
    return search.best[0], [(i, j, per_chunk[k]) for k, (i, j) in enumerate(sm.chunks)]
