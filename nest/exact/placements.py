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

The signature is what the cluster's fabric answers (:mod:`nest.core.fabric`): level splits and
common levels on a hierarchy, the graph's cost classes on a graph (per rank and kind the classes
of its groups, per boundary those of its pairs: exactly what the evaluator prices there). The
tree's symmetry is used only where the fabric says its automorphisms keep every cost
(:attr:`~nest.core.fabric.Fabric.level_symmetric`); otherwise only the plan's own symmetries
(:mod:`nest.graph.placements`).
"""

from collections.abc import Iterator

import numpy as np

from nest.core.axes import GroupKind
from nest.core.errors import UserError
from nest.core.plan import GROUP_KINDS, group_arrays
from nest.core.topology import Cluster
from nest.graph.placements import graph_assignments


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


def signature(
    cluster: Cluster,
    grid: np.ndarray,
    ep: int,
    cache: dict | None = None,
    etp: int | None = None,
) -> tuple:
    """What the cost model sees of a placement ``[pp][dp][cp][tp] -> device`` (module doc):
    per pipeline rank and group kind the cost classes of its groups, per boundary those of its
    device pairs, as the cluster's fabric answers them; ``cache`` keeps each rank's part across
    placements."""
    pp = grid.shape[0]
    cache = {} if cache is None else cache
    fabric = cluster.fabric
    ranks = []
    for r in range(pp):
        key = ("rank", ep, etp, grid[r].shape, grid[r].tobytes())
        got = cache.get(key)
        if got is None:
            arrays = group_arrays(grid[r], ep, etp)
            got = cache[key] = tuple(
                fabric.group_classes(arrays[kind], all_to_all=kind == GroupKind.EP)
                for kind in GROUP_KINDS
            )
        ranks.append(got)
    links = []
    flat = grid.reshape(pp, -1)
    for a in range(pp):
        b = (a + 1) % pp
        if pp > 1 and (a + 1 < pp or pp > 2):
            links.append(fabric.p2p_classes(flat[a], flat[b]))
    return tuple(ranks), tuple(links)


def placement_classes(
    cluster: Cluster,
    *,
    tp: int,
    cp: int,
    dp: int,
    pp: int,
    ep: int,
    max_visits: int,
    etp: int | None = None,
) -> list[np.ndarray]:
    """One grid ``[pp][dp][cp][tp]`` per distinct signature, in enumeration order."""
    shape = (pp, dp, cp, tp)
    n = pp * dp * cp * tp
    seen: dict[tuple, np.ndarray] = {}
    cache: dict = {}
    if cluster.fabric.level_symmetric:  # the tree's automorphisms keep every cost
        assignments = orderly_assignments(cluster, n, max_visits=max_visits)
    else:  # only the plan's own symmetries
        assignments = graph_assignments(cluster, shape, ep, max_visits=max_visits, etp=etp)
    for assignment in assignments:
        grid = np.asarray(assignment, dtype=np.int64).reshape(shape)
        key = signature(cluster, grid, ep, cache, etp)
        if key not in seen:
            seen[key] = grid
    return list(seen.values())
