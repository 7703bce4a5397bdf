"""The alpha-beta formulas the cost model and a graph's floors both evaluate.

The arithmetic shared by both fabrics (:mod:`nest.core.fabric`): a hierarchy's levels
(:class:`nest.core.hierarchy.Hierarchy`) and a graph's proven floor figures
(:mod:`nest.graph.floors`) evaluate the same formulas, so they live below both:

- :func:`ring_forms`: the hierarchical ring collectives (Thakur, Rabenseifner and Gropp,
  "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005; Patarasuk and
  Yuan, "Bandwidth Optimal All-reduce Algorithms for Clusters of Workstations", JPDC 2009) on a
  group split ``k[l]`` peers per level: a reduce-scatter of ``S`` bytes runs level 0 first among
  ``k0`` peers, then level 1 on the remaining ``S / k0``, and so on up the tree, each level a
  ring costing ``(k-1)/k * S_l / bw_l + (k-1) * alpha_l``; so ``a = sum_l (k_l - 1) / k_l /
  prod_{j<l} k_j / bw_l`` and ``c = sum_l (k_l - 1) alpha_l``. An all-gather is its mirror image
  (the same cost), an all-reduce twice it (reduce-scatter up, all-gather down).
- :func:`all_to_all_forms`: the hierarchical all-to-all on the same splits (a hierarchy's
  :class:`nest.core.hierarchy.Hierarchy` prices with it; a graph's floor uses a weaker form);
  :func:`level_forms` picks one of the two by collective.
- :func:`affine_time_s`: ``a S + c`` where ``S > 0`` bytes, else nothing.
"""

import numpy as np

from nest.core.axes import CollectiveOp

OPS = tuple(CollectiveOp)
"""The collectives the cost model prices."""


def ring_forms(op: str, k: np.ndarray, bw, alpha) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` per row of the level splits ``k`` (``[n, levels]``) of the hierarchical ring
    collectives (module docstring) with per-level bandwidth ``bw`` (bytes/s) and latency
    ``alpha`` (s): the cost model's levels in :func:`nest.cost.collectives.linear_forms`, a
    graph's floor figures in :func:`nest.graph.floors.floor_forms`."""
    if op not in OPS or op == CollectiveOp.ALL_TO_ALL:
        rings = tuple(o.value for o in OPS[:3])
        raise ValueError(f"unknown ring collective {op!r}; one of {rings}")
    below = np.cumprod(np.hstack([np.ones((len(k), 1)), k[:, :-1]]), axis=1)  # prod_{j<l} k_j
    a = ((k - 1) / k / below / bw).sum(axis=1)
    c = ((k - 1) * alpha).sum(axis=1)
    return (2 * a, 2 * c) if op == CollectiveOp.ALL_REDUCE else (a, c)


def affine_time_s(a, c, n_bytes):
    """``a S + c`` where ``S > 0`` bytes, else 0 (scalars or numpy arrays alike)."""
    if np.ndim(n_bytes) == 0:
        return a * n_bytes + c if n_bytes > 0 else 0.0
    n_bytes = np.asarray(n_bytes, dtype=float)
    return np.where(n_bytes > 0, a * n_bytes + c, 0.0)


def all_to_all_forms(k: np.ndarray, bw, alpha) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` per row of the level splits ``k`` (``[n, levels]``) of an all-to-all of ``S``
    bytes sent by each member (``S / n`` to each) with per-level bandwidth ``bw`` and latency
    ``alpha``: the share of the buffer whose destination first differs at level ``l`` crosses
    level ``l``, and pairwise exchange pays one alpha per peer, so ``a = sum_l crossing_l / n /
    bw_l`` and ``c = sum_l crossing_l alpha_l`` with ``crossing_l = (k_l - 1) prod_{j<l} k_j``
    the peers first reached at level ``l`` (levels one after another, no overlap)."""
    below = np.cumprod(np.hstack([np.ones((len(k), 1)), k[:, :-1]]), axis=1)
    crossing = below * (k - 1)  # peers first reached at each level
    return (crossing / k.prod(axis=1)[:, None] / bw).sum(axis=1), (crossing * alpha).sum(axis=1)


def level_forms(op: str, k: np.ndarray, bw, alpha) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` of collective ``op`` per row of the level splits ``k`` on levels of bandwidth
    ``bw`` and latency ``alpha``: :func:`all_to_all_forms` or :func:`ring_forms`."""
    if op == CollectiveOp.ALL_TO_ALL:
        return all_to_all_forms(k, bw, alpha)
    return ring_forms(op, k, bw, alpha)
