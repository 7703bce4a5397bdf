"""How the communication groups of one pipeline rank split over the network.

A pipeline rank's devices form an array ``[dp][cp][tp]`` (a stage of the plan). Its groups, by
kind (the collectives each kind carries):

- ``tp``: the ``tp`` devices of one (replica, context rank): tensor-parallel collectives;
- ``cp``: the ``cp`` devices of one (replica, tensor rank): context-parallel K/V exchange;
- ``ep``: ``ep`` consecutive data x context ranks of one tensor rank (expert ranks are carved out
  of the ``dp x cp`` ranks, Megatron-Core's convention); with ``etp = 1`` (MoE parallel folding)
  ``ep`` consecutive devices of the ``dp x cp x tp`` ones, tensor rank innermost
  (:func:`nest.core.plan.group_arrays`): the MoE all-to-all;
- ``dense_dp``: all ``dp x cp`` ranks of one tensor rank: gradient sync of dense weights
  (Megatron-Core reduces over data x context ranks);
- ``expert_dp``: the ``dp x cp x (tp / etp) / ep`` ranks holding the same experts: expert
  gradient sync;
- hybrid sharding only (``zero_shard``, :func:`nest.core.plan.hsdp_arrays`): ``zero_shard``, the
  ``zero_shard x cp`` ranks of one ZeRO shard group (reduce-scatters and all-gathers), and
  ``zero_replicate``, the ``dp / zero_shard`` ranks holding the same shard (the all-reduce of the
  reduced gradient shard; :class:`nest.cost.state.ModelState`).

All groups of a kind run the same collective at once, so a collective costs its *slowest* group
(synchronous parallelism: every rank waits for it). The cost model sees a group only through its
level split (:meth:`nest.core.topology.Cluster.group_factors`), so :class:`RankGroups` keeps, per
kind,
the distinct splits and their affine forms (:func:`nest.cost.collectives.linear_forms`), and
prices any byte count, scalar or numpy array, as the maximum over the splits. The splits are
what the cluster's fabric answers (:meth:`nest.core.fabric.Fabric.group_classes`): level splits
on a hierarchy; on a graph, cost classes computed for all groups of the kind together so that the
links they share are shared in one place.
"""

from collections.abc import Iterable

import numpy as np

from nest.core.alphabeta import is_priced
from nest.core.axes import GroupKind
from nest.core.layers import Collective
from nest.core.plan import group_arrays
from nest.core.topology import Cluster
from nest.cost.collectives import linear_forms
from nest.cost.compute import exposed_s

AXES = (GroupKind.TP, GroupKind.CP, GroupKind.EP)
"""The kinds that carry a layer's own collectives (:attr:`nest.core.layers.Collective.axis`)."""


def translated(devices, cluster: Cluster) -> np.ndarray:
    """The same devices moved down by a whole number of the top level's child blocks, as far as
    possible, where the fabric promises the move changes no cost
    (:meth:`nest.core.fabric.Fabric.translated`): on a hierarchy the level splits of every
    group are unchanged (a group split counts blocks touched per level, and such a move maps
    every block of every level below the top onto a block of the same level); a graph makes the
    move only where it is :attr:`~nest.graph.network.Network.symmetric`. Placements whose ranks
    differ only by such a move (e.g. pipeline ranks in different scalable units) share one
    :class:`RankGroups`."""
    return cluster.fabric.translated(devices)


def distinct_splits(groups, cluster: Cluster) -> tuple[tuple[int, ...], ...]:
    """The distinct level splits of a 2-D array of groups (one per row), sorted; empty for
    groups of one (:meth:`nest.core.hierarchy.Hierarchy.group_classes`). Only where the levels
    price the traffic: on a graph a group's cost depends on where it lies and on the groups it
    runs with, so a rank's groups are priced together as cost classes
    (:meth:`RankGroups.splits`) and no row may be moved on its own."""
    if not cluster.fabric.priced_by_levels:
        raise AssertionError("distinct_splits on a graph cluster: use RankGroups.splits per rank")
    return cluster.fabric.group_classes(groups)


class RankGroups:
    """The groups of one pipeline rank, their level splits and collective costs (module
    docstring). Splits and forms are computed on first use and kept."""

    def __init__(
        self,
        devices,
        ep: int,
        cluster: Cluster,
        etp: int | None = None,
        zero_shard: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.arrays = group_arrays(devices, ep, etp, zero_shard)
        self._splits: dict[str, tuple] = {}
        self._forms: dict[str, dict] = {}

    def splits(self, kind: str) -> tuple:
        """The distinct level splits of the groups of ``kind``, sorted (empty for groups of
        one member: they never communicate); on a graph, their cost classes
        (:class:`nest.core.fabric.GroupClass`)."""
        got = self._splits.get(kind)
        if got is None:
            # all the kind's groups at once (on a graph they share links)
            fabric = self.cluster.fabric
            got = fabric.group_classes(self.arrays[kind], all_to_all=kind == GroupKind.EP)
            self._splits[kind] = got
        return got

    def forms(self, kind: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per collective op, the ``(a, c)`` arrays over :meth:`splits` (same order), each
        computed when first looked up (a rank's kinds use one or two of the ops)."""
        got = self._forms.get(kind)
        if got is None:
            got = self._forms[kind] = _Forms(self.splits(kind), self.cluster)
        return got

    def time_s(self, op: str, n_bytes, kind: str):
        """One collective ``op`` of ``n_bytes`` (scalar or numpy array) over every group of
        ``kind`` at once: its slowest group, seconds."""
        if np.ndim(n_bytes) == 0:
            if n_bytes <= 0:
                return 0.0
            ac = self.forms(kind)[op]
            return 0.0 if ac is None else float((ac[0] * n_bytes + ac[1]).max())
        n_bytes = np.asarray(n_bytes, dtype=float)
        if not n_bytes.any():
            return np.zeros(n_bytes.shape)
        ac = self.forms(kind)[op]
        if ac is None:
            return np.zeros(n_bytes.shape)
        a, c = ac
        out = a[0] * n_bytes + c[0]
        for a_k, c_k in zip(a[1:], c[1:], strict=True):
            np.maximum(out, a_k * n_bytes + c_k, out=out)
        return np.where(n_bytes > 0, out, 0.0)

    def axis_time_s(
        self, collectives: Iterable[tuple[Collective, int]], axis: str, *, exposed: bool = True
    ) -> float:
        """The collectives of ``axis`` among ``(collective, count)`` pairs (a stage's, over
        all its layers), run one after another on every group of ``axis`` at once: the slowest
        group's total, seconds; only the part their overlap does not hide (``exposed``) or all
        of it (:meth:`axis_times_s`)."""
        return self.axis_times_s(collectives, axis)[0 if exposed else 1]

    def axis_times_s(
        self, collectives: Iterable[tuple[Collective, int]], axis: str
    ) -> tuple[float, float]:
        """``(exposed, total)``: :meth:`axis_time_s` both ways, each collective priced once per
        split (:func:`collectives_times_s`); each is its own slowest group's."""
        collectives = [pair for pair in collectives if pair[0].axis == axis]
        if not collectives:
            return 0.0, 0.0
        forms = self.forms(axis)
        per_split = [
            collectives_times_s(collectives, axis, forms, k) for k in range(len(self.splits(axis)))
        ]
        exposed = max((e for e, _ in per_split), default=0.0)
        total = max((t for _, t in per_split), default=0.0)
        return exposed, total


def rank_groups(plan, cluster: Cluster) -> list[RankGroups]:
    """One :class:`RankGroups` per pipeline rank of ``plan``; ranks whose devices are a
    :func:`translated` copy of another's share it (the same splits, computed once): wherever the
    fabric promises the move changes no cost (it leaves the devices of any other graph where
    they are), the rule the DP's :class:`~nest.dp.stages.StageModel` shares ranks by."""
    shared: dict[tuple, RankGroups] = {}
    out = []
    for stage in plan.stages[: plan.pp]:
        moved = translated(stage.devices, cluster)
        key = (moved.shape, moved.tobytes())
        if key not in shared:
            shared[key] = RankGroups(moved, plan.ep, cluster, plan.etp, plan.zero_shard)
        out.append(shared[key])
    return out


class _Forms(dict):
    """``{op: (a, c)}`` over some splits (None without splits), filled on first lookup."""

    def __init__(self, splits, cluster: Cluster) -> None:
        super().__init__()
        self.splits, self.cluster = splits, cluster

    def __missing__(self, op: str):
        if not is_priced(op):
            raise KeyError(op)
        got = self[op] = linear_forms(op, self.splits, self.cluster) if self.splits else None
        return got


def split_forms(split, cluster: Cluster) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per collective op, the ``(a, c)`` of one split (as length-1 arrays, the layout of
    :meth:`RankGroups.forms`), each computed when first looked up."""
    return _Forms([split], cluster)


def collectives_time_s(
    collectives: Iterable[tuple[Collective, int]],
    axis: str,
    forms: dict,
    k: int = 0,
    *,
    exposed: bool = True,
) -> float:
    """Seconds of the collectives of ``axis`` among ``(collective, count)`` pairs, one after
    another, on one group whose split has the forms ``forms[op][0][k], forms[op][1][k]``
    (:meth:`RankGroups.forms` or :func:`split_forms`): each collective's exposed part
    (:func:`nest.cost.compute.exposed_s`), or its whole time (:func:`collectives_times_s`)."""
    return collectives_times_s(collectives, axis, forms, k)[0 if exposed else 1]


def collectives_times_s(
    collectives: Iterable[tuple[Collective, int]], axis: str, forms: dict, k: int = 0
) -> tuple[float, float]:
    """``(exposed, total)`` seconds of :func:`collectives_time_s`, each collective priced once.
    A stage sums this over its layers per split and takes the slowest split
    (:meth:`RankGroups.axis_times_s`)."""
    exposed = total = 0.0
    for coll, count in collectives:
        if coll.axis == axis and coll.n_bytes > 0 and forms[coll.op] is not None:
            a, c = forms[coll.op]
            t = float(a[k]) * coll.n_bytes + float(c[k])
            exposed += count * exposed_s(t, coll)
            total += count * t
    return exposed, total
