"""Every placement of a plan's ranks on a graph cluster, up to what the cost model can tell apart.

The general mode of the exact planners (:mod:`nest.exact.placements`) enumerates injective maps
of the ranks ``[pp][dp][cp][tp]`` onto devices and keeps one per *signature*. On a graph the
signature is what the evaluator prices (:func:`nest.exact.placements.signature`): per pipeline
rank and group kind the cost classes of its groups
(:meth:`nest.graph.network.Network.group_classes`, links shared by the kind's groups), and per
pair of neighbouring ranks the cost classes of their device pairs
(:meth:`~nest.graph.network.Network.p2p_classes`).

The enumeration may not use the derived tree's symmetry (a graph need not have it), nor a graph
automorphism in general: the hierarchical collectives order each ring by device id, so an
automorphism that reorders ids can change a cost. It uses only symmetries *of the plan* that
leave every signature unchanged on any network, applied to all pipeline ranks at once:

- renumbering the tensor ranks (a tensor group keeps its devices; context, data and expert
  groups are the same sets; every boundary pair keeps its two devices), unless whole experts
  (``etp = 1``) with ``ep > 1`` fold tensor ranks into expert groups;
- without expert parallelism (``ep = 1``), renumbering the data-parallel replicas, and the
  context ranks (each context group, data group and tensor group maps onto one of its kind).

Each orbit keeps a representative whose first pipeline rank has the first replica's tensor ranks
increasing and, without ``ep``, its smallest device at replica 0, context rank 0, tensor rank 0
and the replicas' and the context ranks' first devices increasing (a product of independent
permutations can always bring the rank's smallest device to that corner and then sort each of
the three lines through it, each sort leaving the other two lines alone). What remains is
deduplicated by signature; ``max_visits`` refuses sizes the enumeration cannot cover (tested
against brute force over every injective map).
"""

from collections.abc import Iterator

import numpy as np

from nest.core.errors import UserError


def _constraints(shape: tuple, ep: int, etp: int | None = None) -> dict[int, int]:
    """Flat position -> the earlier position whose device it must exceed (module docstring)."""
    pp, dp, cp, tp = shape
    flat = np.arange(pp * dp * cp * tp).reshape(shape)
    after: dict[int, int] = {}
    if ep == 1 or etp is None:
        for t in range(1, tp):
            after[int(flat[0, 0, 0, t])] = int(flat[0, 0, 0, t - 1])
    if ep == 1:
        for d in range(1, dp):
            after[int(flat[0, d, 0, 0])] = int(flat[0, d - 1, 0, 0])
        for c in range(1, cp):
            after[int(flat[0, 0, c, 0])] = int(flat[0, 0, c - 1, 0])
    return after


def graph_assignments(
    cluster, shape: tuple, ep: int, *, max_visits: int, etp: int | None = None
) -> Iterator[tuple[int, ...]]:
    """Injective maps of the flat ``[pp][dp][cp][tp]`` positions onto the devices, one or more
    per orbit of the plan's symmetries (module docstring)."""
    pp, dp, cp, tp = shape
    n_ranks, n_devices = pp * dp * cp * tp, cluster.num_devices
    if n_ranks > n_devices:
        return
    after = _constraints(shape, ep, etp)
    # without ep every position of rank 0 can be moved to the corner, which holds its smallest
    # device; with ep only the tensor ranks can (the sorted first row says as much)
    corner_last = dp * cp * tp if ep == 1 else 0
    chosen: list[int] = []
    used = [False] * n_devices
    visits = 0

    def extend():
        nonlocal visits
        i = len(chosen)
        if i == n_ranks:
            yield tuple(chosen)
            return
        floor = chosen[after[i]] if i in after else -1
        for d in range(floor + 1, n_devices):
            if used[d] or (0 < i < corner_last and d < chosen[0]):
                continue
            visits += 1
            if visits > max_visits:
                raise UserError(
                    f"general placement search over {n_ranks} ranks on {n_devices} devices "
                    f"visits more than max_placements={max_visits} partial placements; use "
                    "mode=restricted, a smaller problem or raise solver.max_placements"
                )
            chosen.append(d)
            used[d] = True
            yield from extend()
            used[d] = False
            chosen.pop()

    yield from extend()
