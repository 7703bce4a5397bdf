"""Every placement of a plan's ranks on the cluster, up to what the cost model can tell apart.

The general mode of the exact planners lets each pipeline rank's ``dp x cp x tp`` devices be any
devices of the cluster (non-contiguous sets, any rank order, idle devices anywhere). The shared
evaluator sees a placement only through

- for each pipeline rank and each group kind (tp, cp, ep, dense and expert DP), the set of level
  splits of its groups (:meth:`nest.core.topology.Cluster.distinct_group_factors`; a collective
  costs
  its slowest group), and
- for each pair of neighbouring pipeline ranks, the set of levels its device pairs share (p2p is
  charged at the slowest pair);

memory does not depend on the placement at all. Two placements with the same *signature* (those
sets) have the same cost for every partition, recompute and ZeRO choice, so the exact planners
need one placement per signature.

Enumeration: ranks are placed one at a time, flat in ``[pp][dp][cp][tp]`` order, on distinct
devices. Subtrees of the hierarchy that hold no placed rank yet are interchangeable (an
automorphism of the tree maps one onto the other and fixes every placed rank), so a rank only
enters the lowest-numbered empty child of a node: every placement is equivalent to one that
follows this rule, and the rule cuts the ``N! / (N - n)!`` assignments by the tree's symmetry
(e.g. 8 ranks on 8 devices ``[2, 2, 2]``: 40,320 assignments, 2,520 visited). What remains is
deduplicated by signature. The count still grows factorially with the ranks, so ``max_visits``
stops it with an error naming the size.

On a cluster given as a graph the signature is made of the graph's cost classes instead (per rank
and kind the classes of its groups, per boundary those of its pairs: exactly what the evaluator
prices there), and the symmetry used is the graph's, never the derived tree's
(:mod:`nest.graph.placements`).
"""

from collections.abc import Iterator

import numpy as np

from nest.core.errors import UserError
from nest.core.plan import GROUP_KINDS, group_arrays
from nest.core.topology import Cluster
from nest.graph.placements import graph_assignments, graph_signature


def orderly_assignments(
    cluster: Cluster, n_ranks: int, *, max_visits: int
) -> Iterator[tuple[int, ...]]:
    """Injective rank -> device maps, one or more per orbit of the hierarchy's symmetry."""
    fanouts = [level.fanout for level in cluster.levels]
    n_levels = len(fanouts)
    digits = [cluster.coords(d) for d in range(cluster.num_devices)]
    # suffixes[d][k] = the subtree of level k that holds device d (its digits k.. outwards)
    suffixes = [[tuple(dig[k:]) for k in range(n_levels + 1)] for dig in digits]
    if n_ranks > cluster.num_devices:
        return
    opened: dict[tuple, int] = {}
    chosen: list[int] = []
    visits = 0

    def allowed(d: int) -> bool:
        dig, suf = digits[d], suffixes[d]
        for k in range(n_levels - 1, -1, -1):
            if suf[k] in opened:
                continue
            parent = suf[k + 1]
            first_empty = next(x for x in range(fanouts[k]) if (x, *parent) not in opened)
            if dig[k] != first_empty:
                return False
        return True

    def visit(d: int, step: int) -> None:
        for suf in suffixes[d]:
            opened[suf] = opened.get(suf, 0) + step
            if opened[suf] == 0:
                del opened[suf]

    def extend():
        nonlocal visits
        if len(chosen) == n_ranks:
            yield tuple(chosen)
            return
        used = set(chosen)
        for d in range(cluster.num_devices):
            if d in used or not allowed(d):
                continue
            visits += 1
            if visits > max_visits:
                raise UserError(
                    f"general placement search over {n_ranks} ranks on {cluster.num_devices} "
                    f"devices visits more than max_placements={max_visits} partial placements; "
                    "use mode=restricted, a smaller problem or raise solver.max_placements"
                )
            chosen.append(d)
            visit(d, +1)
            yield from extend()
            visit(d, -1)
            chosen.pop()

    yield from extend()


def group_factors(cluster: Cluster, group: tuple[int, ...]) -> tuple[int, ...]:
    """:meth:`nest.core.topology.Cluster.group_factors` of one group, in plain Python (the
    enumeration calls it for thousands of tiny groups, where numpy's overhead dominates)."""
    out = []
    for level in range(cluster.num_levels):
        outer_size = cluster.block_size(level)
        inner_size = cluster.block_size(level - 1) if level > 0 else 1
        inner_per_outer: dict[int, set[int]] = {}
        for d in group:
            inner_per_outer.setdefault(d // outer_size, set()).add(d // inner_size)
        out.append(max(len(v) for v in inner_per_outer.values()))
    return tuple(out)


def _kind_factors(cluster: Cluster, rows: list[list[int]], cache: dict) -> frozenset:
    """The distinct level splits of a list of groups (empty for single-device groups, as the
    evaluator has it)."""
    if len(rows[0]) <= 1:
        return frozenset()
    out = set()
    for row in rows:
        key = tuple(sorted(row))
        if key not in cache:
            cache[key] = group_factors(cluster, key)
        out.add(cache[key])
    return frozenset(out)


def signature(cluster: Cluster, grid: np.ndarray, ep: int, cache: dict | None = None) -> tuple:
    """What the cost model sees of a placement ``[pp][dp][cp][tp] -> device`` (module doc);
    ``cache`` keeps each rank's part and each group's split across placements."""
    pp = grid.shape[0]
    cache = {} if cache is None else cache
    if cluster.network is not None:
        return graph_signature(cluster.network, grid, ep, cache)
    groups_cache = cache.setdefault("groups", {})
    ranks = []
    for r in range(pp):
        key = grid[r].tobytes()
        if key not in cache:
            arrays = group_arrays(grid[r], ep)
            cache[key] = tuple(
                _kind_factors(cluster, arrays[kind].tolist(), groups_cache) for kind in GROUP_KINDS
            )
        ranks.append(cache[key])
    links = []
    flat = grid.reshape(pp, -1).tolist()
    for a in range(pp):
        b = (a + 1) % pp
        if pp > 1 and (a + 1 < pp or pp > 2):
            links.append(
                frozenset(cluster.common_level(x, y) for x, y in zip(flat[a], flat[b], strict=True))
            )
    return tuple(ranks), tuple(links)


def placement_classes(
    cluster: Cluster, *, tp: int, cp: int, dp: int, pp: int, ep: int, max_visits: int
) -> list[np.ndarray]:
    """One grid ``[pp][dp][cp][tp]`` per distinct signature, in enumeration order."""
    shape = (pp, dp, cp, tp)
    n = pp * dp * cp * tp
    seen: dict[tuple, np.ndarray] = {}
    cache: dict = {}
    if cluster.network is None:
        assignments = orderly_assignments(cluster, n, max_visits=max_visits)
    else:
        assignments = graph_assignments(cluster, shape, ep, max_visits=max_visits)
    for assignment in assignments:
        grid = np.asarray(assignment, dtype=np.int64).reshape(shape)
        key = signature(cluster, grid, ep, cache)
        if key not in seen:
            seen[key] = grid
    return list(seen.values())
