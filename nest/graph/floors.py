"""Provable floors of the graph collectives, for the NEST search's pruning bounds.

:mod:`nest.dp.bounds` needs, for a group of ``n`` devices, a time no placement of it can beat,
whatever else shares its links. On a hierarchy that is the least of the hierarchical formula over
every split ``k`` a group of ``n`` devices can have (``T(n)``); on a graph the same minimum over
``T(n)`` works once each level's bandwidth and latency are replaced by bounds that hold for
*every* device pair of that level:

- ``R_l`` (:func:`pair_bounds`): no pair whose lowest common derived level is ``l`` moves data
  faster than ``R_l`` bytes/s, even alone on the network. A pair's traffic leaves its source
  over the source's out-links on least-cost paths (equal-cost multipath) and enters its
  destination over in-links on least-cost paths, so its share on those links sums to 1 at
  each end; the busiest of them carries at least ``1 / sum of their bandwidths`` of it. So the
  pair's ``max over links (share / bandwidth)`` is at least ``1 / min(out-capacity,
  in-capacity)`` and ``R_l`` is the largest such capacity over the level's pairs. (Under
  dimension-order routing the routes are computed exactly instead: from every device, or, when
  the graph is ``symmetric`` (an automorphism keeping routes maps any device to device 0), from
  device 0, the largest rate and least latency of any level then standing for every level.)
- ``L_l``: the least latency of any path between two devices of that level (a least-latency
  search over all paths: every route's latency is at least it).

**Reduce-scatter / all-gather / all-reduce.** Take a group with split ``k`` (any placement:
:meth:`~nest.core.topology.Cluster.group_factors` on the derived hierarchy, ``prod k >= n``). At
level
``l`` some level-``l`` block holds members in ``k_l`` sub-blocks; the members at position 0 of
those sub-blocks form one ring of exactly ``k_l`` members, whose edges join pairs of lowest
common level ``l``. Each edge carries ``A_l = (k_l - 1) / k_l / prod_{j<l} k_j S`` bytes, so the
busiest link on its route (loads of other groups only add) needs at least ``A_l / R_l``
seconds, and the ring's ``k_l - 1`` steps at least ``(k_l - 1) L_l``. Summing the levels, the
group costs at least ``sum_l A_l / R_l + sum_l (k_l - 1) L_l``: the hierarchical formula with
``bw_l = R_l``, ``alpha_l = L_l`` (all-reduce twice that).

**All-to-all.** Every member sends ``S / n`` to each of the other ``n - 1`` members; pick any
member ``u``: at level ``l`` it sends to ``c_l(u)`` peers of that level, each at rate at most
``R_l``, so the level costs at least ``c_l(u) S / n / R_l``; summed, at least
``(n - 1) / n S / R_max`` plus ``(n - 1) L_min`` latency. A group of split ``k`` has at least
``m(k) = 1 + sum_l (k_l - 1)`` members (one more for each further block it touches), and the
floor grows with ``n``, so ``(m - 1) / m S / R_max + (m - 1) L_min`` bounds it for every such
group. This is weaker than the hierarchy's per-level form; weaker bounds only cost speed.

**Point-to-point.** A boundary's transfer costs its slowest pair, each pair at least
``S / R_l + L_l`` for its level ``l``; the least over the levels bounds any boundary.
"""

import numpy as np

from nest.core.alphabeta import ring_forms
from nest.core.axes import CollectiveOp
from nest.core.hierarchy import block_sizes, common_levels
from nest.graph.network import Network, least_costs


def _level_of_pairs(net: Network, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Lowest common derived level of each pair (-1 for a device with itself)."""
    return common_levels(src, dst, block_sizes(net.fanouts))


def pair_bounds(net: Network) -> tuple[np.ndarray, np.ndarray]:
    """``(R, L)`` per derived level (module docstring)."""
    n, n_levels = net.num_devices, len(net.fanouts)
    rate = np.zeros(n_levels)
    latency = np.full(n_levels, np.inf)
    if net.routing == "dimension_order":
        sources = [0] if net.symmetric else range(n)
        dst = np.arange(n)
        for u in sources:
            levels = _level_of_pairs(net, np.full(n, u), dst)
            for v in range(n):
                if v == u:
                    continue
                r = net.route(u, v)
                lv = levels[v]
                rate[lv] = max(rate[lv], 1.0 / float((r.fracs / net.link_bw[r.links]).max()))
                latency[lv] = min(latency[lv], r.latency_s)
        if net.symmetric:  # device 0 stands for every device, but not level by level
            rate[:] = rate.max()
            latency[:] = latency.min()
    else:
        dist = net._distances()
        weight = net.weight
        cap = np.zeros((n, n))  # cap[u, v]: out-capacity of u's least-cost first hops to v
        for u in range(n):
            links = net._out[u]
            here = dist[u]
            nxt = net.link_dst[links]
            ahead = dist[nxt]
            if not net.relay:  # the destination itself, else no device on the way
                ahead = np.where((nxt < n)[:, None], np.inf, ahead)
                ahead[nxt < n, nxt[nxt < n]] = 0.0
            ahead = weight[links][:, None] + ahead
            tight = np.abs(ahead - here[None, :]) <= 1e-9 * here[None, :]
            cap[u] = (tight * net.link_bw[links][:, None]).sum(axis=0)
        pair_rate = np.minimum(cap, cap.T)  # a pair's in-links are the reverse pair's out-links
        least_lat = least_costs(net, net.link_lat)[:n]
        src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        levels = _level_of_pairs(net, src, dst)
        for lv in range(n_levels):
            mask = levels == lv
            if mask.any():
                rate[lv] = pair_rate[mask].max()
                latency[lv] = least_lat[mask].min()
    # a level without pairs (fan-out 1) never carries traffic: any finite values do
    present = rate > 0
    fill_rate = rate[present].max() if present.any() else 1.0
    rate = np.where(present, rate, fill_rate)
    latency = np.where(np.isfinite(latency), latency, 0.0)
    return rate, latency


def floor_forms(net: Network, op: str, splits) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` per row of ``splits`` (module docstring)."""
    rate, latency = net.pair_bounds()
    k = np.asarray(splits, dtype=float).reshape(-1, len(net.fanouts))
    if op == CollectiveOp.ALL_TO_ALL:
        m = 1.0 + (k - 1).sum(axis=1)
        return (1.0 - 1.0 / m) / rate.max(), (m - 1.0) * latency.min()
    return ring_forms(op, k, rate, latency)  # the hierarchy's formula at the floor figures
