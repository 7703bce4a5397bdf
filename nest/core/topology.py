"""A hierarchical cluster: levels, device ids as mixed-radix coordinates, and how groups split.

A cluster is a tree of levels, innermost first: level 0 groups ``fanout[0]`` devices (e.g. the 8
GPUs of a node on NVLink), level 1 groups ``fanout[1]`` level-0 blocks (nodes under a leaf switch),
and so on. Device ``d`` has coordinate ``(d mod f0, (d // f0) mod f1, ...)``: the devices of one
level-``l`` block are the contiguous ids ``[k * P(l+1), (k+1) * P(l+1))`` with
``P(l) = f0 * ... * f(l-1)``.

Bandwidth semantics. ``bw_bytes_per_s`` of a level is the per-device, per-direction line rate of
the links at that level; collectives move data at ``bw_efficiency`` of it (NCCL's achieved bus
bandwidth, e.g. about 370 of 450 GB/s on H100 NVLink), divided by its oversubscription ratio.
Traffic between two devices whose lowest common level is ``l`` traverses links of every level
``<= l`` (device -> node switch -> leaf -> ...), so its rate is the bottleneck
``min_{j <= l} bw_j`` (:meth:`Cluster.path_bw_bytes_per_s`). This is also the NEST artifact's rule
(docs/nest_paper.md §2: a level-``l`` transfer runs at ``min(bw0..bwl)``) and makes "a group
placed lower in the tree is never slower" hold for any presets. Concurrent transfers of different
groups do not contend (one NIC per device, rail-optimised networks; a stated simplification of
the cost model).
What prices the traffic is the cluster's :attr:`Cluster.fabric` (:mod:`nest.core.fabric`): the
levels' own :class:`~nest.core.hierarchy.Hierarchy`, or, for a cluster given as a graph
(:mod:`nest.graph`), its network, which routes traffic and shares links instead; the levels are
then a hierarchy derived from the graph, which numbers the devices for structured placements.
"""

from dataclasses import dataclass, field, replace
from math import prod

import numpy as np

from nest.core.errors import UserError
from nest.core.fabric import Fabric
from nest.core.hardware import Device
from nest.core.hierarchy import Hierarchy, block_sizes, common_levels, row_splits, split_of

IN_NETWORK = (None, "nvls", "sharp")
"""The in-network reductions a level may offer (:attr:`Level.in_network`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """One level of the network hierarchy."""

    name: str
    fanout: int
    """Number of level-(l-1) blocks (devices for level 0) in one block of this level."""
    bw_bytes_per_s: float
    """Per-device bandwidth per direction on this level's links, bytes/s."""
    latency_s: float
    """Latency of one message crossing this level, seconds (the alpha of alpha-beta)."""
    oversubscription: float = 1.0
    """Ratio of offered to provisioned bandwidth (>= 1); bandwidth is divided by it."""
    bw_efficiency: float = 1.0
    """Fraction of the line rate collectives achieve on this level's links (NCCL's bus bandwidth
    over the line rate, from published nccl-tests results; 1: nameplate), in (0, 1]."""
    in_network: str | None = None
    """An in-network reduction this level's switches perform for an all-reduce, when the
    cluster turns it on: ``"nvls"`` (NVLink SHARP on an NVSwitch) or ``"sharp"`` (InfiniBand
    SHARP); None: rings only (:mod:`nest.core.alphabeta`)."""
    in_network_bw_bytes_per_s: float = 0.0
    """The achieved algorithm bandwidth (bytes / all-reduce time, per device) of an all-reduce
    by ``in_network``, bytes/s: nccl-tests' busbw of the published run divided by its
    ``2 (n-1) / n``. 0 where ``in_network`` is None."""

    def __post_init__(self) -> None:
        if self.fanout < 1:
            raise UserError(f"level {self.name}: fanout={self.fanout} must be >= 1")
        if not self.bw_bytes_per_s > 0:
            raise UserError(f"level {self.name}: bandwidth={self.bw_bytes_per_s} must be > 0")
        if self.latency_s < 0:
            raise UserError(f"level {self.name}: latency={self.latency_s} must be >= 0")
        if self.oversubscription < 1:
            raise UserError(
                f"level {self.name}: oversubscription={self.oversubscription} must be >= 1"
            )
        if not 0 < self.bw_efficiency <= 1:
            raise UserError(
                f"level {self.name}: bw_efficiency={self.bw_efficiency} must be in (0, 1]"
            )
        if self.in_network not in IN_NETWORK:
            raise UserError(
                f"level {self.name}: in_network={self.in_network!r}; use one of "
                f"{[k for k in IN_NETWORK if k]} or leave it unset"
            )
        if (self.in_network is None) != (self.in_network_bw_bytes_per_s == 0):
            raise UserError(
                f"level {self.name}: in_network={self.in_network!r} with in-network bandwidth "
                f"{self.in_network_bw_bytes_per_s:g} B/s; give both (bandwidth > 0) or neither"
            )
        if self.in_network_bw_bytes_per_s < 0:
            raise UserError(
                f"level {self.name}: in-network bandwidth={self.in_network_bw_bytes_per_s:g} "
                "must be > 0"
            )

    @property
    def effective_bw_bytes_per_s(self) -> float:
        """What a collective moves per device per direction: the line rate at the achieved
        efficiency, divided by the oversubscription."""
        return self.bw_bytes_per_s * self.bw_efficiency / self.oversubscription


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Devices of one kind on a hierarchy of 1 to 5 (or more) levels."""

    name: str
    device: Device
    levels: tuple[Level, ...]
    network: Fabric | None = None
    """A graph cluster's network (:mod:`nest.graph`), given when the cluster is built from a
    graph; ``levels`` is then the hierarchy derived from it (:mod:`nest.graph.derive`). None on
    a hierarchy. Ask :attr:`fabric`, never this."""
    fabric: Fabric = field(init=False, repr=False, compare=False)
    """What prices every collective and transfer (:mod:`nest.core.fabric`): ``network`` when
    given, else the levels' :class:`~nest.core.hierarchy.Hierarchy`. Always set."""
    _path_bw: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _block: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.levels:
            raise UserError(f"cluster {self.name}: needs at least one level")
        bws, lowest = [], float("inf")
        for level in self.levels:
            lowest = min(lowest, level.effective_bw_bytes_per_s)
            bws.append(lowest)
        object.__setattr__(self, "_path_bw", tuple(bws))
        object.__setattr__(self, "_block", block_sizes([lv.fanout for lv in self.levels]))
        fabric = self.network if self.network is not None else Hierarchy(self.levels)
        object.__setattr__(self, "fabric", fabric)

    @property
    def num_devices(self) -> int:
        return prod(level.fanout for level in self.levels)

    def with_domain_fanout(self, fanout: int) -> "Cluster | None":
        """The same cluster with only ``fanout`` devices of each scale-up domain (level 0), the
        devices scaled (:func:`nest.core.segment.segment_view`); None for a graph cluster, whose
        network routes traffic by device, not by block, so a share of a domain is not a
        cluster of the same kind."""
        if self.network is not None:
            return None
        domain = self.levels[0]
        return Cluster(
            name=f"{self.name} ({fanout} of {domain.fanout} per {domain.name})",
            device=self.device,
            levels=(replace(domain, fanout=fanout), *self.levels[1:]),
        )

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    def block_size(self, level: int) -> int:
        """Devices in one block of ``level`` (``P(level+1)``); level -1 is a single device."""
        return prod(lv.fanout for lv in self.levels[: level + 1])

    def coords(self, device: int) -> tuple[int, ...]:
        """Mixed-radix coordinate of a device id, innermost level first."""
        self.check_device(device)
        out = []
        for level in self.levels:
            out.append(device % level.fanout)
            device //= level.fanout
        return tuple(out)

    def check_device(self, device: int) -> None:
        if not 0 <= device < self.num_devices:
            raise UserError(
                f"device id {device} is outside cluster {self.name} (0..{self.num_devices - 1})"
            )

    def common_level(self, a: int, b: int) -> int:
        """Lowest level whose block contains both devices; -1 when ``a == b``."""
        if a == b:
            return -1
        for level in range(self.num_levels):
            size = self.block_size(level)
            if a // size == b // size:
                return level
        raise AssertionError("devices of one cluster always share the top level")

    def common_levels(self, a, b) -> np.ndarray:
        """Vectorised :meth:`common_level` over two equal-shaped arrays of device ids."""
        return common_levels(a, b, self._block)

    def path_bw_bytes_per_s(self, level: int) -> float:
        """Per-device bandwidth of traffic whose lowest common level is ``level`` (bottleneck)."""
        return self._path_bw[level]

    def group_factors(self, devices) -> tuple[int, ...]:
        """How a group of devices splits across the levels.

        Returns ``k`` with one entry per level: ``k[l]`` is the largest number of distinct
        level-(l-1) blocks (devices, for l = 0) that the group touches inside one level-``l``
        block. For a regular group (the same count in every block) ``prod(k) == len(group)``;
        e.g. 16 devices spread as 2 per node over 8 nodes give ``(2, 8)``.
        """
        return split_of(np.asarray(devices, dtype=np.int64).ravel().tolist(), self._block)

    def distinct_group_factors(self, groups) -> set[tuple[int, ...]]:
        """:meth:`group_factors` of every row of a 2-D array of groups, as a set (vectorised)."""
        ids = np.sort(np.asarray(groups, dtype=np.int64), axis=1)
        if ids.shape[1] == 1:
            return {(1,) * self.num_levels}
        rows = np.unique(row_splits(ids, self._block), axis=0)
        return set(map(tuple, rows.tolist()))

    def describe(self) -> str:
        network = self.fabric.describe(self.levels)
        return f"{self.name}: {self.num_devices} x {self.device.name}; {network}"
