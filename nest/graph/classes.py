"""Cost classes: what the shared cost model sees of a group or a device pair on a graph network.

On a hierarchy a group is priced through its level split (a tuple of ints); on a graph it is
priced through a *cost class*: the affine forms ``a S + c`` of its collectives once routing and
link sharing are accounted for (:mod:`nest.graph.network`). The classes are plain hashable,
ordered values, so every cache and signature keyed by a split works on them unchanged, and
:func:`nest.cost.collectives.linear_forms` reads their forms directly.

This module depends on nothing else in the package (the cost model imports it).
"""

from dataclasses import dataclass

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


def pareto(values: list[tuple]) -> list[tuple]:
    """The tuples no other tuple dominates (at least as large in every entry), sorted: the maximum
    of ``a S + c`` over them equals the maximum over all of them for every ``S >= 0``."""
    unique = sorted(set(values))
    return [
        v
        for v in unique
        if not any(w != v and all(x >= y for x, y in zip(w, v, strict=True)) for w in unique)
    ]
