"""The network as the cost model sees it: one interface, a hierarchy and a graph behind it.

A cluster's network is priced by one of two *fabrics*, and every caller (the evaluator
:mod:`nest.cost`, the search's stage models and floors :mod:`nest.dp`, the exact planners'
placement signatures :mod:`nest.exact`) asks :attr:`nest.core.topology.Cluster.fabric`, which is
always set, the questions of :class:`Fabric`; none of them tests which fabric it got:

- :class:`nest.core.hierarchy.Hierarchy` (a tree of levels: ``conf/cluster/*.yaml`` with
  ``levels``) prices a group by its *level split*, a tuple of ints; groups never share links;
- :class:`nest.graph.network.Network` (a graph: a file, a generator, a measured table) routes
  traffic over links that the groups of a kind share, and prices a group by its *cost class*
  (:class:`GroupClass`, :class:`LinkClass`: the affine forms ``a S + c`` once routing and
  sharing are accounted for).

**What a fabric answers.** For a 2-D array of groups (one per row, every group of one kind in
one pipeline rank, running at once) its *cost classes* (:meth:`Fabric.group_classes`): plain,
hashable, ordered values, so a class is a cache key and a placement signature as a split was;
the ``(a, c)`` arrays of a collective over a sequence of classes (:meth:`Fabric.forms`: a
collective of ``S > 0`` bytes costs ``a S + c``, the slowest class sets a kind's time); for a
stage boundary the classes of its device pairs (:meth:`Fabric.p2p_classes`) and one class's
transfer time (:meth:`Fabric.p2p_time_s`); for the search's bounds the *proven floors*: forms
no group of a level split can beat wherever it lies and whatever shares its links
(:meth:`Fabric.floor_forms`), a floor on a transfer between pairs of a level
(:meth:`Fabric.p2p_floor_s`) and the classes of the aligned tensor blocks
(:meth:`Fabric.aligned_classes`); and which moves of a placement change no cost
(:meth:`Fabric.translated`, :attr:`Fabric.level_symmetric`).

**Fast paths stay.** The hierarchy's classes are its level splits themselves, tuples of ints, so
the DP's caches and vectorised rows keyed by splits work unchanged; the forms of a sequence of
classes are numpy arrays, evaluated on a whole row of stage ends at once
(:class:`nest.cost.groups.RankGroups`) whatever the fabric.

**Layering.** The formulas both fabrics evaluate (the hierarchical ring and all-to-all forms,
the affine time) are in :mod:`nest.core.alphabeta`, and the id arithmetic of a hierarchy's
blocks (:func:`nest.core.hierarchy.row_splits`, :func:`~nest.core.hierarchy.common_levels`),
which a graph's derived hierarchy uses too, in :mod:`nest.core.hierarchy`: both below the cost
model and the graph, which never import each other (``tests/test_layering.py``). A new network
term (in-network reduction, another fabric) is one more implementation of this protocol, its
floors proven once, next to it; the cost model does not change.
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
    """The questions the cost model (:mod:`nest.cost`), the search's stage models and floors
    (:mod:`nest.dp`) and the exact planners (:mod:`nest.exact`) ask of a cluster's network
    (module docstring). :class:`nest.core.hierarchy.Hierarchy` and
    :class:`nest.graph.network.Network` answer them."""

    kind: str
    """``"hierarchy"`` or ``"graph"``: for reports only, never to choose a formula."""
    symmetric: bool
    """Moving a rank's devices by whole top-level blocks changes no cost (as on a tree)."""
    level_symmetric: bool
    """Every automorphism of the (derived) level tree keeps every cost, so placements may be
    enumerated up to it (:func:`nest.exact.placements.orderly_assignments`)."""
    priced_by_levels: bool
    """The cluster's levels' figures are what prices its traffic (perturbing them perturbs the
    network: :mod:`nest.analysis.robust`); a graph's derived levels only number its devices."""
    offers_deepep: bool
    """The fabric prices DeepEP's dispatch and combine (:func:`nest.core.alphabeta.deepep_op`):
    a hierarchy does, by the level split; a graph does not (its routed all-to-all has no
    per-domain forwarding)."""

    def describe(self, levels=None) -> str:
        """The network part of the cluster's one-line description (``levels``: the cluster's,
        derived ones on a graph)."""
        ...

    def translated(self, devices):
        """The devices moved as far down as a move that changes no cost allows (themselves
        where none is promised): ranks equal after the move share their groups' classes."""
        ...

    def group_classes(self, groups, *, all_to_all: bool = False) -> tuple:
        """The cost classes of the groups (one per row of ``groups``) running one collective at
        once, sorted, dominated ones allowed to drop; empty for groups of one member.
        ``all_to_all``: the kind runs an all-to-all (a graph prices it only then)."""
        ...

    def forms(self, op: str, classes) -> tuple[np.ndarray, np.ndarray]:
        """``(a, c)`` arrays of collective ``op`` over a sequence of classes: ``a S + c``
        seconds for ``S > 0`` bytes."""
        ...

    def p2p_classes(self, a_devices, b_devices) -> tuple:
        """The cost classes of the device pairs ``(a[i], b[i])`` of a stage boundary, every pair
        sending at once."""
        ...

    def p2p_time_s(self, n_bytes, cls):
        """One pair of class ``cls`` sending ``n_bytes`` (scalar or numpy array), seconds."""
        ...

    def aligned_classes(self, tp: int) -> tuple:
        """The cost classes of the aligned blocks of ``tp`` consecutive devices, each alone (a
        floor of a tensor group's cost in any rank)."""
        ...

    def floor_forms(self, op: str, splits) -> tuple[np.ndarray, np.ndarray]:
        """``(a, c)`` per row of level splits that no group of that split can beat."""
        ...

    def p2p_floor_s(self, n_bytes, level: int):
        """A floor on a boundary's transfer between pairs whose lowest common level is
        ``level``."""
        ...
