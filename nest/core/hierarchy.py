"""A hierarchy of levels as a :class:`~nest.core.fabric.Fabric`: groups priced by their level split.

A hierarchical cluster (:mod:`nest.core.topology`) numbers its devices as mixed-radix
coordinates, innermost level first; block ``l`` holds ``P(l+1) = f0 * ... * fl`` consecutive ids
(:func:`block_sizes`: ``block[l + 1]``, with ``block[0] = 1`` a single device). What the
cost model sees of a group there is its *level split* ``k`` (``k[l]``: the most level-``(l-1)``
blocks the group touches inside one level-``l`` block), a tuple of ints; :class:`Hierarchy`
answers the fabric's questions with those tuples as its cost classes:

- a group's collective costs ``a S + c`` on its split (:func:`nest.core.alphabeta.level_forms`
  at the levels' bottleneck bandwidth and latency: the hierarchical algorithms, documented in
  :mod:`nest.cost.collectives`); groups do not share links (one NIC per device,
  rail-optimised networks), so every group of a kind has the cost of its own split, and the
  kind's classes are its distinct splits; a level with an in-network reduction turned on
  (:attr:`nest.core.topology.Level.in_network`) prices an all-reduce's share there at the
  faster of the ring and the switch (:mod:`nest.core.alphabeta`);
- a stage boundary's class is the lowest common level of each device pair
  (:func:`common_levels`), priced ``S / bw + alpha`` there;
- the floors are the forms themselves (a group of split ``k`` costs exactly that anywhere);
- moving a rank by whole top-level child blocks maps every block of every level below the top
  onto a block of the same level, so it changes no split (:attr:`Hierarchy.symmetric`), and
  every automorphism of the tree keeps every cost (:attr:`Hierarchy.level_symmetric`: the exact
  planners enumerate placements up to it).

:func:`row_splits` and :func:`common_levels` are arithmetic on device ids and block sizes only:
a graph's network (:mod:`nest.graph.network`) numbers its devices by its derived hierarchy with
the same functions.
"""

from collections.abc import Sequence
from math import prod

import numpy as np

from nest.core.alphabeta import affine_time_s, level_forms

SMALL_GROUPS = 64
"""Group arrays (and stage boundaries) of at most this many ids are split in plain Python, with a
cache per group (the exact planners' enumeration asks for thousands of tiny ones, where numpy's
overhead dominates); larger ones with numpy, all rows at once."""


def block_sizes(fanouts: Sequence[int]) -> tuple[int, ...]:
    """``(1, f0, f0 f1, ...)``: entry ``l + 1`` is the number of devices in one block of level
    ``l``; entry 0 is a single device."""
    return tuple(prod(fanouts[:i]) for i in range(len(fanouts) + 1))


def row_splits(groups: np.ndarray, block: Sequence[int]) -> np.ndarray:
    """The level split of every row of ``groups`` (``[rows, n]`` device ids, each row sorted):
    ``[rows, levels]``. At level ``l`` the ids of one level-``l`` block are contiguous in a sorted
    row, so counting where the level-``(l-1)`` block changes counts the blocks touched."""
    rows, n = groups.shape
    n_levels = len(block) - 1
    out = np.ones((rows, n_levels), dtype=np.int64)
    row_ids = np.repeat(np.arange(rows), n)
    for lv in range(n_levels):
        outer = groups // block[lv + 1]
        inner = groups // block[lv]
        starts = np.ones_like(inner, dtype=bool)
        starts[:, 1:] = inner[:, 1:] != inner[:, :-1]
        width = int(outer.max()) + 1
        key = row_ids * width + outer.ravel()
        uniq, inverse = np.unique(key, return_inverse=True)
        counts = np.bincount(inverse, weights=starts.ravel())
        best = np.zeros(rows)
        np.maximum.at(best, uniq // width, counts)
        out[:, lv] = best.astype(np.int64)
    return out


def split_of(group: Sequence[int], block: Sequence[int]) -> tuple[int, ...]:
    """The level split of one group, in plain Python (:func:`row_splits` of one row)."""
    out = []
    for lv in range(len(block) - 1):
        outer_size, inner_size = block[lv + 1], block[lv]
        inner_per_outer: dict[int, set[int]] = {}
        for d in group:
            inner_per_outer.setdefault(d // outer_size, set()).add(d // inner_size)
        out.append(max(len(v) for v in inner_per_outer.values()))
    return tuple(out)


def common_levels(a, b, block: Sequence[int]) -> np.ndarray:
    """Lowest level whose block holds both devices, per pair of two equal-shaped arrays of ids
    (-1 for a device with itself)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    out = np.full(np.broadcast(a, b).shape, -1, dtype=np.int64)
    for lv in reversed(range(len(block) - 1)):
        out = np.where((a // block[lv]) != (b // block[lv]), np.maximum(out, lv), out)
    return out


def translate_down(devices: np.ndarray, child: int) -> np.ndarray:
    """The devices moved down by a whole number of blocks of ``child`` devices, as far as
    possible (the lowest one lands in the first block)."""
    devices = np.asarray(devices, dtype=np.int64)
    return devices - (int(devices.min()) // child) * child


class Hierarchy:
    """The :class:`~nest.core.fabric.Fabric` of a hierarchical cluster (module docstring): its
    cost classes are level splits, tuples of ints."""

    kind = "hierarchy"
    symmetric = True
    level_symmetric = True
    priced_by_levels = True
    offers_deepep = True

    def __init__(self, levels: Sequence) -> None:
        """``levels``: the cluster's :class:`~nest.core.topology.Level` s, innermost first."""
        self.levels = tuple(levels)
        self.block = block_sizes([lv.fanout for lv in self.levels])
        self.bw = np.minimum.accumulate([lv.effective_bw_bytes_per_s for lv in self.levels])
        self.alpha = np.array([lv.latency_s for lv in self.levels])
        in_bw = np.array([lv.in_network_bw_bytes_per_s for lv in self.levels])
        self.in_network_bw = in_bw if in_bw.any() else None
        self._bw_list = self.bw.tolist()
        self._split: dict[tuple, tuple[int, ...]] = {}
        self._forms: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    def describe(self, levels=None) -> str:
        """The levels, innermost first, with their bandwidth (and oversubscription, and the
        in-network reduction where on)."""
        return ", ".join(
            f"{lv.name} x{lv.fanout} @ {lv.bw_bytes_per_s / 1e9:g} GB/s"
            + (f"/{lv.oversubscription:g}" if lv.oversubscription != 1 else "")
            + (
                f" +{lv.in_network.upper()} {lv.in_network_bw_bytes_per_s / 1e9:g} GB/s"
                if lv.in_network
                else ""
            )
            for lv in self.levels
        )

    def translated(self, devices) -> np.ndarray:
        """The devices moved down by whole top-level child blocks (no split changes)."""
        return translate_down(devices, self.block[-2])

    # ------------------------------------------------------------------ groups
    def group_classes(self, groups, *, all_to_all: bool = False) -> tuple[tuple[int, ...], ...]:
        """The distinct level splits of the groups (rows of ``groups``), sorted; empty for
        groups of one. ``all_to_all`` changes nothing: a split prices every collective."""
        groups = np.asarray(groups, dtype=np.int64)
        if groups.shape[1] <= 1:
            return ()
        if groups.size <= SMALL_GROUPS:
            return tuple(sorted({self._split_of_row(row) for row in groups.tolist()}))
        return self._distinct_splits(groups)

    def _split_of_row(self, row: list[int]) -> tuple[int, ...]:
        key = tuple(sorted(row))
        got = self._split.get(key)
        if got is None:
            got = self._split[key] = split_of(key, self.block)
        return got

    def _distinct_splits(self, groups: np.ndarray) -> tuple[tuple[int, ...], ...]:
        """Rows first moved as :meth:`translated` moves a rank (the splits do not change) and
        deduplicated, which leaves few rows for the periodic groups of a structured
        placement."""
        child = self.block[-2]
        moved = np.ascontiguousarray(groups - (groups.min(axis=1, keepdims=True) // child) * child)
        moved.sort(axis=1)
        # one opaque item per row: deduplicating bytes is much faster than np.unique(axis=0)
        as_bytes = moved.view(np.dtype((np.void, moved.dtype.itemsize * moved.shape[1])))
        _, first = np.unique(as_bytes.ravel(), return_index=True)
        rows = np.unique(row_splits(moved[first], self.block), axis=0)
        return tuple(sorted(map(tuple, rows.tolist())))

    def forms(self, op: str, classes) -> tuple[np.ndarray, np.ndarray]:
        """``(a, c)`` of ``op`` per level split (rows of ``classes``), read-only arrays kept
        per ``(op, splits)``: they depend on nothing else (the levels are fixed), and the
        search asks again for the splits of every new placement's ranks."""
        k = np.asarray(classes, dtype=float).reshape(-1, self.num_levels)
        key = (op, k.shape, k.tobytes())
        got = self._forms.get(key)
        if got is None:
            got = level_forms(op, k, self.bw, self.alpha, self.in_network_bw)
            for arr in got:
                arr.flags.writeable = False
            self._forms[key] = got
        return got

    # ------------------------------------------------------------------ pipeline boundaries
    def p2p_classes(self, a_devices, b_devices) -> tuple[int, ...]:
        """The distinct lowest common levels of the pairs ``(a[i], b[i])``, sorted."""
        a = np.asarray(a_devices, dtype=np.int64).ravel()
        b = np.asarray(b_devices, dtype=np.int64).ravel()
        if a.size > SMALL_GROUPS:
            return tuple(np.unique(common_levels(a, b, self.block)).tolist())
        pairs = zip(a.tolist(), b.tolist(), strict=True)
        return tuple(sorted({self._common_level(x, y) for x, y in pairs}))

    def _common_level(self, x: int, y: int) -> int:
        """:func:`common_levels` of one pair, in plain Python."""
        for lv in range(len(self.levels) - 1, -1, -1):
            if x // self.block[lv] != y // self.block[lv]:
                return lv
        return -1

    def p2p_time_s(self, n_bytes, level: int):
        """``S / bw + alpha`` at ``level``; level -1 (the same device) costs nothing."""
        if level < 0:
            return 0.0 if np.ndim(n_bytes) == 0 else np.zeros(np.shape(n_bytes))
        return affine_time_s(1.0 / self._bw_list[level], self.levels[level].latency_s, n_bytes)

    # ------------------------------------------------------------------ floors
    def aligned_classes(self, tp: int) -> tuple[tuple[int, ...], ...]:
        """The splits of the aligned blocks of ``tp`` consecutive devices."""
        n = self.block[-1] - self.block[-1] % tp
        return self.group_classes(np.arange(n).reshape(-1, tp))

    def floor_forms(self, op: str, splits) -> tuple[np.ndarray, np.ndarray]:
        """The forms themselves: a group of split ``k`` costs exactly them wherever it lies."""
        return self.forms(op, splits)

    def p2p_floor_s(self, n_bytes, level: int):
        """Exactly :meth:`p2p_time_s`."""
        return self.p2p_time_s(n_bytes, level)
