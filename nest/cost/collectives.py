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
  level this is the ring's ``2 (n-1)/n * S / B + 2 (n-1) alpha``.
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
priced through its cost class instead of its split (:func:`linear_forms`, :func:`p2p_time_s`).

The affine form is what lets the DP cost a whole row of stage ends at once
(:class:`nest.cost.groups.RankGroups` evaluates it on numpy arrays of bytes) and what the
search's floors minimise over every possible split (:mod:`nest.dp.bounds`).
"""

from collections.abc import Sequence

import numpy as np

from nest.core.alphabeta import affine_time_s, ring_forms
from nest.core.axes import CollectiveOp
from nest.core.fabric import GroupClass, LinkClass, class_forms
from nest.core.topology import Cluster

Factors = tuple[int, ...]


def linear_forms(op: str, splits, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` for every row of ``splits`` (shape ``[n, levels]``): a collective ``op`` of
    ``S > 0`` bytes on a group split so costs ``a S + c`` seconds (module docstring). On a graph
    cluster the "splits" are cost classes that carry their own forms (:mod:`nest.core.fabric`);
    the ring collectives' forms are :func:`nest.core.alphabeta.ring_forms`."""
    if len(splits) and isinstance(splits[0], GroupClass):
        return class_forms(op, splits)
    k = np.asarray(splits, dtype=float).reshape(-1, cluster.num_levels)
    bw = np.array([cluster.path_bw_bytes_per_s(lv) for lv in range(cluster.num_levels)])
    alpha = np.array([lv.latency_s for lv in cluster.levels])
    if op == CollectiveOp.ALL_TO_ALL:
        below = np.cumprod(np.hstack([np.ones((len(k), 1)), k[:, :-1]]), axis=1)
        crossing = below * (k - 1)  # peers first reached at each level
        return (crossing / k.prod(axis=1)[:, None] / bw).sum(axis=1), (crossing * alpha).sum(axis=1)
    return ring_forms(op, k, bw, alpha)


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
    """Time of collective ``op`` over an explicit group of device ids, seconds."""
    if len(group) <= 1:
        return 0.0
    if cluster.network is not None:  # one group alone on a graph
        (cls,) = cluster.network.group_classes([group], all_to_all=op == CollectiveOp.ALL_TO_ALL)
        return split_time_s(op, n_bytes, cls, cluster)
    return split_time_s(op, n_bytes, cluster.group_factors(group), cluster)


def p2p_time_s(n_bytes, level, cluster: Cluster):
    """Point-to-point transfer of ``n_bytes`` (scalar or array) between devices whose common
    level is ``level``: ``S / bw + alpha``; level -1 (the same device) costs nothing. On a graph
    cluster ``level`` is a pair's cost class (:class:`nest.core.fabric.LinkClass`)."""
    if isinstance(level, LinkClass):
        return affine_time_s(level.a, level.c, n_bytes)
    if level < 0:
        return 0.0 if np.ndim(n_bytes) == 0 else np.zeros(np.shape(n_bytes))
    return affine_time_s(
        1.0 / cluster.path_bw_bytes_per_s(level), cluster.levels[level].latency_s, n_bytes
    )


def pair_p2p_time_s(n_bytes, levels: Sequence[int], cluster: Cluster):
    """A stage boundary: every device pair of two pipeline ranks sends ``n_bytes`` (scalar or
    array) at once, and the slowest pair sets the time (``levels``: the common levels of the
    pairs)."""
    times = [p2p_time_s(n_bytes, lv, cluster) for lv in levels]
    if np.ndim(n_bytes) == 0:
        return max(times, default=0.0)
    return np.maximum.reduce(times) if times else np.zeros(np.shape(n_bytes))


def p2p_classes(cluster: Cluster, a_devices, b_devices) -> list:
    """What a stage boundary's cost depends on, for :func:`pair_p2p_time_s`: the levels the
    device pairs ``(a[i], b[i])`` share on a hierarchy, the pairs' cost classes on a graph (every
    pair sends at once and shares links: :meth:`nest.graph.network.Network.p2p_classes`)."""
    if cluster.network is not None:
        return list(cluster.network.p2p_classes(a_devices, b_devices))
    return np.unique(cluster.common_levels(a_devices, b_devices)).tolist()


def floor_forms(op: str, splits, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` per row of level splits that no group of that split can beat: the forms
    themselves on a hierarchy, the graph's proven floors on a graph
    (:mod:`nest.graph.floors`)."""
    if cluster.network is not None:
        return cluster.network.floor_forms(op, splits)
    return linear_forms(op, splits, cluster)


def p2p_floor_s(n_bytes, level: int, cluster: Cluster):
    """A floor on a transfer between devices whose lowest common level is ``level``: exactly
    :func:`p2p_time_s` on a hierarchy, the graph's proven floor on a graph."""
    if cluster.network is not None:
        return cluster.network.p2p_floor_s(n_bytes, level)
    return p2p_time_s(n_bytes, level, cluster)
