"""Alpha-beta costs of collectives on the hierarchy (DESIGN.md §5).

Every function takes a byte count, how the group splits over the levels (``k[l]`` peers per
level, from :meth:`nest.topology.Cluster.group_factors`) and the cluster, and returns seconds;
:func:`collective_time_s` takes an explicit group. Hierarchical algorithms:

- reduce-scatter of a buffer of ``S`` bytes: level 0 first, among ``k0`` peers, moving
  ``(k0-1)/k0 * S``; then level 1 on the remaining ``S/k0``, and so on up the tree. Each level
  costs ``(k-1)/k * S_l / bw_l + (k-1) * alpha_l`` (ring within the level).
- all-gather (output ``S`` bytes): the mirror image, the same cost.
- all-reduce: reduce-scatter up the levels + all-gather down = twice the reduce-scatter. Inside one
  level this is the ring's ``2 (n-1)/n * S / B + 2 (n-1) alpha`` (Thakur et al. 2005; Patarasuk and
  Yuan 2009).
- all-to-all, ``S`` bytes sent by each device (``S/n`` to each member): the share of the buffer
  whose destination first differs at level ``l`` crosses level ``l``; pairwise exchange costs one
  alpha per peer. Levels are charged one after another (no overlap between levels).
- p2p: ``S / bw + alpha`` at the lowest level the two devices share.

``bw_l`` is the bottleneck per-device bandwidth (:meth:`Cluster.path_bw_bytes_per_s`); a level
where the group has a single member costs nothing. Concurrent groups do not contend.
"""

from collections.abc import Sequence
from math import prod

from nest.topology import Cluster

Factors = tuple[int, ...]


def reduce_scatter_time_s(n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """Hierarchical reduce-scatter of an ``n_bytes`` buffer over a group split as ``factors``.

    ``factors`` is :meth:`Cluster.group_factors` of the group. Returns seconds.
    """
    if n_bytes <= 0:
        return 0.0
    time_s = 0.0
    remaining = float(n_bytes)
    for level, k in enumerate(factors):
        if k > 1:
            bw = cluster.path_bw_bytes_per_s(level)
            alpha = cluster.levels[level].latency_s
            time_s += (k - 1) / k * remaining / bw + (k - 1) * alpha
            remaining /= k
    return time_s


def all_gather_time_s(n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """Hierarchical all-gather producing ``n_bytes`` on every member, seconds."""
    return reduce_scatter_time_s(n_bytes, factors, cluster)


def all_reduce_time_s(n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """Hierarchical all-reduce of ``n_bytes`` (reduce-scatter up, all-gather down), seconds."""
    return 2.0 * reduce_scatter_time_s(n_bytes, factors, cluster)


def all_to_all_time_s(n_bytes: float, factors: Factors, cluster: Cluster) -> float:
    """All-to-all where each member sends ``n_bytes`` in total (``n_bytes/n`` to each member)."""
    n = prod(factors)
    if n_bytes <= 0 or n <= 1:
        return 0.0
    time_s = 0.0
    inside = 1  # members reachable below the current level (oneself included)
    for level, k in enumerate(factors):
        reach = inside * k
        crossing = reach - inside  # peers first reached at this level
        if crossing > 0:
            bw = cluster.path_bw_bytes_per_s(level)
            time_s += crossing / n * n_bytes / bw + crossing * cluster.levels[level].latency_s
        inside = reach
    return time_s


def p2p_time_s(n_bytes: float, level: int, cluster: Cluster) -> float:
    """Point-to-point transfer of ``n_bytes`` between devices whose common level is ``level``.

    ``level`` -1 (the same device) costs nothing.
    """
    if n_bytes <= 0 or level < 0:
        return 0.0
    return n_bytes / cluster.path_bw_bytes_per_s(level) + cluster.levels[level].latency_s


COLLECTIVE_TIME = {
    "all_reduce": all_reduce_time_s,
    "all_gather": all_gather_time_s,
    "reduce_scatter": reduce_scatter_time_s,
    "all_to_all": all_to_all_time_s,
}


def collective_time_s(op: str, n_bytes: float, group: Sequence[int], cluster: Cluster) -> float:
    """Time of collective ``op`` over an explicit group of device ids, seconds."""
    if len(group) <= 1:
        return 0.0
    return COLLECTIVE_TIME[op](n_bytes, cluster.group_factors(group), cluster)
