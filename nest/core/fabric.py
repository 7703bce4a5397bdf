"""What the cost model asks of a network given as a graph, and the cost classes it gets back.

On a hierarchy a group is priced through its level split (a tuple of ints,
:meth:`nest.core.topology.Cluster.group_factors`); on a graph the cluster carries a network
(:attr:`nest.core.topology.Cluster.network`) that answers the questions of :class:`Fabric`
instead, with *cost classes*: the affine forms ``a S + c`` of a group's collectives
(:class:`GroupClass`) or of a device pair's transfer (:class:`LinkClass`) once routing and link
sharing are accounted for. The classes are plain hashable, ordered values, so every cache and
signature keyed by a split works on them unchanged, and
:func:`nest.cost.collectives.linear_forms` reads their forms directly.

:class:`nest.graph.network.Network` implements :class:`Fabric`; the cost model and the search's
floors call only these methods, so neither imports :mod:`nest.graph`, and the graph does not
import the cost model (the formulas both evaluate are in :mod:`nest.core.alphabeta`).
"""

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from nest.core.axes import CollectiveOp

UNPRICED = -1.0
"""Marks a form a class does not carry (the all-to-all of a kind that never runs one)."""


@dataclass(frozen=True, slots=True, order=True)
class GroupClass:
    """One group's collective costs on a graph: ``rs_a S + rs_c`` seconds for a reduce-scatter
    (and an all-gather) of ``S > 0`` bytes, twice that for an all-reduce, ``a2a_a S + a2a_c`` for
    an all-to-all of ``S`` bytes per member (:data:`UNPRICED` where the group kind carries
    none)."""

    rs_a: float
    rs_c: float
    a2a_a: float = UNPRICED
    a2a_c: float = UNPRICED

    def form(self, op: str) -> tuple[float, float]:
        """``(a, c)`` of collective ``op`` on this group."""
        if op == CollectiveOp.ALL_TO_ALL:
            if self.a2a_a == UNPRICED:
                raise AssertionError("all-to-all priced on a group kind that carries none")
            return self.a2a_a, self.a2a_c
        if op == CollectiveOp.ALL_REDUCE:
            return 2.0 * self.rs_a, 2.0 * self.rs_c
        if op in (CollectiveOp.ALL_GATHER, CollectiveOp.REDUCE_SCATTER):
            return self.rs_a, self.rs_c
        raise ValueError(f"unknown collective {op!r}")


@dataclass(frozen=True, slots=True, order=True)
class LinkClass:
    """One device pair of a pipeline boundary on a graph: ``a S + c`` seconds to send ``S > 0``
    bytes while every pair of the boundary sends at once."""

    a: float
    c: float


def class_forms(op: str, classes) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` arrays of ``op`` over a sequence of :class:`GroupClass` (the graph's
    counterpart of :func:`nest.cost.collectives.linear_forms`)."""
    if op == CollectiveOp.ALL_TO_ALL and any(cls.a2a_a == UNPRICED for cls in classes):
        # the group kind carries no all-to-all (RankGroups tabulates every op up front): NaN, so
        # a stray use cannot pass for a cost
        nan = np.full(len(classes), np.nan)
        return nan, nan.copy()
    pairs = [cls.form(op) for cls in classes]
    a = np.array([a for a, _ in pairs], dtype=float)
    return a, np.array([c for _, c in pairs], dtype=float)


class Fabric(Protocol):
    """The questions the cost model (:mod:`nest.cost`) and the search's floors
    (:mod:`nest.dp.bounds`) ask of a graph cluster's network (:class:`nest.graph.network.Network`
    answers them; :mod:`nest.graph.network` and :mod:`nest.graph.floors` say how)."""

    symmetric: bool
    """Moving a rank's devices by whole top-level blocks changes no cost (as on a tree)."""

    def describe(self) -> str:
        """One line naming the network (devices, switches, links, routing)."""
        ...

    def group_classes(self, groups, *, all_to_all: bool = False) -> tuple[GroupClass, ...]:
        """The cost classes of the groups (one per row of ``groups``) running one collective at
        once, sharing links; dominated classes dropped."""
        ...

    def p2p_classes(self, a_devices, b_devices) -> tuple[LinkClass, ...]:
        """The cost classes of the device pairs ``(a[i], b[i])`` of a stage boundary, every pair
        sending at once."""
        ...

    def aligned_classes(self, tp: int) -> tuple[GroupClass, ...]:
        """The cost classes of the aligned blocks of ``tp`` consecutive devices, each alone."""
        ...

    def floor_forms(self, op: str, splits) -> tuple[np.ndarray, np.ndarray]:
        """``(a, c)`` per row of level splits that no group of that split can beat."""
        ...

    def p2p_floor_s(self, n_bytes, level: int):
        """A floor on a boundary's transfer between pairs whose lowest common level is
        ``level``."""
        ...
