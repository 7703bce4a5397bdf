"""Alpha-beta costs of collectives on the hierarchy: the one definition every planner uses.

A group's placement enters only through its *level split* ``k`` (``k[l]`` peers per level, from
:meth:`nest.core.topology.Cluster.group_factors`). For a fixed split every collective of ``S > 0``
bytes costs ``a S + c`` seconds (:func:`linear_forms`), and nothing for ``S = 0`` or a group of
one. Hierarchical algorithms (Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005; Patarasuk and Yuan, "Bandwidth Optimal
All-reduce Algorithms for Clusters of Workstations", JPDC 2009):

- reduce-scatter of a buffer of ``S`` bytes: level 0 first, among ``k0`` peers, moving
  ``(k0-1)/k0 * S``; then level 1 on the remaining ``S/k0``, and so on up the tree. Each level
  costs ``(k-1)/k * S_l / bw_l + (k-1) * alpha_l`` (ring within the level), so
  ``a = sum_l (k_l - 1) / k_l / prod_{j<l} k_j / bw_l`` and ``c = sum_l (k_l - 1) alpha_l``.
- all-gather (output ``S`` bytes): the mirror image, the same cost.
- all-reduce: reduce-scatter up the levels + all-gather down = twice the reduce-scatter. Inside one
  level this is the ring's ``2 (n-1)/n * S / B + 2 (n-1) alpha``. Where a level's switches reduce
  in the network and the cluster turns it on (NVLink SHARP, InfiniBand SHARP:
  :attr:`nest.core.topology.Level.in_network`), that level's share takes the faster of the ring
  and the switch's ``S_l / B_in``, latency unchanged (:mod:`nest.core.alphabeta`): still
  ``a S + c`` with ``a, c >= 0``, never above the ring, so every floor built on these forms holds.
- all-to-all, ``S`` bytes sent by each device (``S/n`` to each member): the share of the buffer
  whose destination first differs at level ``l`` crosses level ``l``; pairwise exchange costs one
  alpha per peer: ``a = sum_l crossing_l / n / bw_l``, ``c = sum_l crossing_l alpha_l`` with
  ``crossing_l = (k_l - 1) prod_{j<l} k_j`` the peers first reached at level ``l``. Levels are
  charged one after another (no overlap between levels).
- p2p: ``S / bw + alpha`` at the lowest level the two devices share (:func:`p2p_time_s`).

``bw_l`` is the bottleneck per-device bandwidth (:meth:`Cluster.path_bw_bytes_per_s`); a level
where the group has a single member costs nothing. Concurrent groups do not contend (one NIC per
device, rail-optimised networks: a stated simplification). On a cluster given as a graph the same
algorithms run on routed paths with shared links (:mod:`nest.graph.network`), and a group is
priced through its cost class instead of its split.

Every function here asks the cluster's fabric (:attr:`nest.core.topology.Cluster.fabric`,
:mod:`nest.core.fabric`) and never which one it is: a hierarchy's classes are the level splits
above (:class:`nest.core.hierarchy.Hierarchy`, the forms in :mod:`nest.core.alphabeta`), a
graph's the cost classes of :mod:`nest.graph.network`; "split" below means either.

The affine form is what lets the DP cost a whole row of stage ends at once
(:class:`nest.cost.groups.RankGroups` evaluates it on numpy arrays of bytes) and what the
search's floors minimise over every possible split (:mod:`nest.dp.bounds`).
"""

from collections.abc import Sequence

import numpy as np

from nest.core.alphabeta import affine_time_s as affine_time_s  # the cost model's public terms
from nest.core.alphabeta import ring_forms as ring_forms
from nest.core.axes import CollectiveOp
from nest.core.topology import Cluster

Factors = tuple[int, ...]


def linear_forms(op: str, splits, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` for every split (rows of ``splits``, shape ``[n, levels]`` on a hierarchy): a
    collective ``op`` of ``S > 0`` bytes on a group split so costs ``a S + c`` seconds (module
    docstring; :meth:`nest.core.fabric.Fabric.forms`)."""
    return cluster.fabric.forms(op, splits)


def linear_form(op: str, factors: Factors, cluster: Cluster) -> tuple[float, float]:
    """``(a, c)`` of one level split: ``time(S) = a S + c`` seconds for ``S > 0`` bytes."""
    a, c = linear_forms(op, [factors], cluster)
    return float(a[0]), float(c[0])


def split_time_s(op: str, n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """Collective ``op`` of ``n_bytes`` on a group split as ``factors``, seconds."""
    if n_bytes <= 0:
        return 0.0
    a, c = linear_form(op, factors, cluster)
    return a * n_bytes + c


def reduce_scatter_time_s(n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """Hierarchical reduce-scatter of an ``n_bytes`` buffer over a group split as ``factors``.

    ``factors`` is :meth:`Cluster.group_factors` of the group. Returns seconds.
    """
    return split_time_s(CollectiveOp.REDUCE_SCATTER, n_bytes, factors, cluster)


def all_gather_time_s(n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """Hierarchical all-gather producing ``n_bytes`` on every member, seconds."""
    return split_time_s(CollectiveOp.ALL_GATHER, n_bytes, factors, cluster)


def all_reduce_time_s(n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """Hierarchical all-reduce of ``n_bytes`` (reduce-scatter up, all-gather down), seconds."""
    return split_time_s(CollectiveOp.ALL_REDUCE, n_bytes, factors, cluster)


def all_to_all_time_s(n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """All-to-all where each member sends ``n_bytes`` in total (``n_bytes/n`` to each member)."""
    return split_time_s(CollectiveOp.ALL_TO_ALL, n_bytes, factors, cluster)


COLLECTIVE_TIME = {
    CollectiveOp.ALL_REDUCE: all_reduce_time_s,
    CollectiveOp.ALL_GATHER: all_gather_time_s,
    CollectiveOp.REDUCE_SCATTER: reduce_scatter_time_s,
    CollectiveOp.ALL_TO_ALL: all_to_all_time_s,
}


def collective_time_s(op: str, n_bytes: float, group: Sequence[int], cluster: Cluster) -> float:
    """Time of collective ``op`` over an explicit group of device ids (alone), seconds."""
    if len(group) <= 1:
        return 0.0
    (cls,) = cluster.fabric.group_classes([group], all_to_all=op == CollectiveOp.ALL_TO_ALL)
    return split_time_s(op, n_bytes, cls, cluster)


def p2p_time_s(n_bytes, level, cluster: Cluster):
    """Point-to-point transfer of ``n_bytes`` (scalar or array) between devices of the class
    ``level``: on a hierarchy their common level, ``S / bw + alpha`` there, level -1 (the same
    device) costing nothing; on a graph a pair's cost class
    (:class:`nest.core.fabric.LinkClass`)."""
    return cluster.fabric.p2p_time_s(n_bytes, level)


def pair_p2p_time_s(n_bytes, levels: Sequence[int], cluster: Cluster):
    """A stage boundary: every device pair of two pipeline ranks sends ``n_bytes`` (scalar or
    array) at once, and the slowest pair sets the time (``levels``: the classes of the pairs,
    :func:`p2p_classes`)."""
    times = [cluster.fabric.p2p_time_s(n_bytes, lv) for lv in levels]
    if np.ndim(n_bytes) == 0:
        return max(times, default=0.0)
    return np.maximum.reduce(times) if times else np.zeros(np.shape(n_bytes))


def p2p_classes(cluster: Cluster, a_devices, b_devices) -> list:
    """What a stage boundary's cost depends on, for :func:`pair_p2p_time_s`: the levels the
    device pairs ``(a[i], b[i])`` share on a hierarchy, the pairs' cost classes on a graph (every
    pair sends at once and shares links: :meth:`nest.core.fabric.Fabric.p2p_classes`)."""
    return list(cluster.fabric.p2p_classes(a_devices, b_devices))


def floor_forms(op: str, splits, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` per row of level splits that no group of that split can beat: the forms
    themselves on a hierarchy, the graph's proven floors on a graph
    (:meth:`nest.core.fabric.Fabric.floor_forms`)."""
    return cluster.fabric.floor_forms(op, splits)


def p2p_floor_s(n_bytes, level: int, cluster: Cluster):
    """A floor on a transfer between devices whose lowest common level is ``level``: exactly
    :func:`p2p_time_s` on a hierarchy, the graph's proven floor on a graph."""
    return cluster.fabric.p2p_floor_s(n_bytes, level)
