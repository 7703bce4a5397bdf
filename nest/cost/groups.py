"""How the communication groups of one pipeline rank split over the network.

A pipeline rank's devices form an array ``[dp][cp][tp]`` (a stage of the plan). Its groups, by
kind (the collectives each kind carries):

- ``tp``: the ``tp`` devices of one (replica, context rank): tensor-parallel collectives;
- ``cp``: the ``cp`` devices of one (replica, tensor rank): context-parallel K/V exchange;
- ``ep``: ``ep`` consecutive data x context ranks of one tensor rank (expert ranks are carved out
  of the ``dp x cp`` ranks, Megatron-Core's convention): the MoE all-to-all;
- ``dense_dp``: all ``dp x cp`` ranks of one tensor rank: gradient sync of dense weights
  (Megatron-Core reduces over data x context ranks);
- ``expert_dp``: the ``dp x cp / ep`` ranks holding the same experts: expert gradient sync.

All groups of a kind run the same collective at once, so a collective costs its *slowest* group
(synchronous parallelism: every rank waits for it). The cost model sees a group only through its
level split (:meth:`nest.topology.Cluster.group_factors`), so :class:`RankGroups` keeps, per kind,
the distinct splits and their affine forms (:func:`nest.cost.collectives.linear_forms`), and
prices any byte count, scalar or numpy array, as the maximum over the splits. On a graph cluster
a "split" is a cost class, computed for all groups of the kind together so that the links they
share are shared in one place (:meth:`nest.graph.network.Network.group_classes`).
"""

from collections.abc import Iterable

import numpy as np

from nest.cost.collectives import OPS, linear_form, linear_forms
from nest.layers import Collective
from nest.topology import Cluster

GROUP_KINDS = ("tp", "cp", "ep", "dense_dp", "expert_dp")
AXES = ("tp", "cp", "ep")
"""The kinds that carry a layer's own collectives (:attr:`nest.layers.Collective.axis`)."""


def group_arrays(devices, ep: int) -> dict[str, np.ndarray]:
    """The groups of each kind of one rank's ``[dp][cp][tp]`` devices, one group per row."""
    devices = np.asarray(devices, dtype=np.int64)
    dp, cp, tp = devices.shape
    flat = devices.reshape(dp * cp, tp)  # row j = replica * cp + context rank
    blocks = flat.reshape(dp * cp // ep, ep, tp)
    return {
        "tp": flat,
        "cp": devices.transpose(0, 2, 1).reshape(-1, cp),
        "ep": blocks.transpose(0, 2, 1).reshape(-1, ep),
        "dense_dp": flat.T,
        "expert_dp": blocks.transpose(1, 2, 0).reshape(-1, dp * cp // ep),
    }


def translated(devices, cluster: Cluster) -> np.ndarray:
    """The same devices moved down by a whole number of the top level's child blocks, as far as
    possible: the level splits of every group, hence every collective's cost, are unchanged
    (a group split counts blocks touched per level, and such a move maps every block of every
    level below the top onto a block of the same level). Placements whose ranks differ only by
    such a move (e.g. pipeline ranks in different scalable units) share one :class:`RankGroups`.
    On a graph the move is made only where the graph promises it changes no cost
    (:attr:`nest.graph.network.Network.symmetric`)."""
    devices = np.asarray(devices, dtype=np.int64)
    if cluster.network is not None and not cluster.network.symmetric:
        return devices  # a graph need not look the same from every block
    child = cluster.block_size(cluster.num_levels - 2)  # 1 for a single level
    return devices - (int(devices.min()) // child) * child


class RankGroups:
    """The groups of one pipeline rank, their level splits and collective costs (module
    docstring). Splits and forms are computed on first use and kept."""

    def __init__(self, devices, ep: int, cluster: Cluster) -> None:
        self.cluster = cluster
        self.arrays = group_arrays(devices, ep)
        self._splits: dict[str, tuple] = {}
        self._forms: dict[str, dict] = {}

    def splits(self, kind: str) -> tuple[tuple[int, ...], ...]:
        """The distinct level splits of the groups of ``kind``, sorted (empty for groups of
        one member: they never communicate)."""
        got = self._splits.get(kind)
        if got is None:
            arr = self.arrays[kind]
            if arr.shape[1] <= 1:
                got = ()
            elif self.cluster.network is not None:  # cost classes, links shared by the groups
                got = self.cluster.network.group_classes(arr, all_to_all=kind == "ep")
            else:
                got = tuple(sorted(self.cluster.distinct_group_factors(arr)))
            self._splits[kind] = got
        return got

    def forms(self, kind: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per collective op, the ``(a, c)`` arrays over :meth:`splits` (same order)."""
        got = self._forms.get(kind)
        if got is None:
            splits = self.splits(kind)
            got = {op: linear_forms(op, splits, self.cluster) if splits else None for op in OPS}
            self._forms[kind] = got
        return got

    def time_s(self, op: str, n_bytes, kind: str):
        """One collective ``op`` of ``n_bytes`` (scalar or numpy array) over every group of
        ``kind`` at once: its slowest group, seconds."""
        ac = self.forms(kind)[op]
        if np.ndim(n_bytes) == 0:
            if ac is None or n_bytes <= 0:
                return 0.0
            return float((ac[0] * n_bytes + ac[1]).max())
        n_bytes = np.asarray(n_bytes, dtype=float)
        if ac is None or not n_bytes.any():
            return np.zeros(n_bytes.shape)
        a, c = ac
        out = a[0] * n_bytes + c[0]
        for a_k, c_k in zip(a[1:], c[1:], strict=True):
            np.maximum(out, a_k * n_bytes + c_k, out=out)
        return np.where(n_bytes > 0, out, 0.0)

    def axis_time_s(self, collectives: Iterable[tuple[Collective, int]], axis: str) -> float:
        """The collectives of ``axis`` among ``(collective, count)`` pairs (a stage's, over
        all its layers), run one after another on every group of ``axis`` at once: the slowest
        group's total, seconds."""
        collectives = list(collectives)
        return max(
            (
                collectives_time_s(collectives, axis, split, self.cluster)
                for split in self.splits(axis)
            ),
            default=0.0,
        )


def collectives_time_s(
    collectives: Iterable[tuple[Collective, int]], axis: str, split, cluster: Cluster
) -> float:
    """Seconds of the collectives of ``axis`` among ``(collective, count)`` pairs, one after
    another, on one group split as ``split``. A stage sums this over its layers per split and
    takes the slowest split (:meth:`RankGroups.axis_time_s`)."""
    total = 0.0
    for coll, count in collectives:
        if coll.axis == axis and coll.n_bytes > 0:
            a, c = linear_form(coll.op, split, cluster)
            total += count * (a * coll.n_bytes + c)
    return total
