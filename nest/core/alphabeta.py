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
- :func:`deepep_forms`: the same exchange as DeepEP runs a MoE dispatch or combine (below).
- :func:`affine_time_s`: ``a S + c`` where ``S > 0`` bytes, else nothing.

**DeepEP dispatch and combine** (:func:`deepep_forms`, the op :func:`deepep_op`). DeepEP's
"normal" kernels (github:deepseek-ai/DeepEP, ``docs/legacy.md``; DeepSeek-V3 technical report
§3.2.2) send a token that goes to several experts in another NVLink domain over the network
*once*, to the device of the same local rank there, which forwards it over NVLink to the
devices holding its experts (the combine mirrors it, reducing in the domain before the one
network transfer back). The network carries one copy per *distinct remote domain* a token
reaches, not one per expert: with its ``K`` experts uniformly over the ``n`` group members and
``k_0`` members per innermost domain, a remote domain is reached with probability
``1 - (1 - k_0/n)^K``, against ``K k_0 / n`` copies sent there by a plain all-to-all, so every
level above the innermost carries ``f = (1 - (1 - k_0/n)^K) / (K k_0/n) <= 1`` (Bernoulli's
inequality) of the all-to-all's share. The forwarded copies add ``(n - k_0)/n (k_0 - 1)/k_0``
of ``S`` to the innermost level, and DeepEP runs its network and NVLink channels concurrently
(dedicated SMs for the RDMA sender, the NVLink forwarder and receiver; its published figure is
the *bottleneck* bandwidth of the two domains: 43-58 GB/s over a ~50 GB/s CX7 NIC and 153-158
GB/s over H800's ~160 GB/s NVLink), so the bandwidth term is the larger of the two domains'
and the latency terms add: ``a = max(a_0', f sum_{l>0} a_l)`` with ``a_l`` the all-to-all's
per-level terms. Within one domain (``n = k_0``) it is the all-to-all itself. Uniform routing
is the assumption (DeepSeek-V3's node-limited routing, at most 4 nodes per token, sends less;
not modelled). The figure never exceeds the all-to-all's where the innermost level is at
least as fast as every level above it (then ``(k_0 - 1)/k_0 / bw_0 <= 1 / bw_l``), as on every
preset.

**In-network reductions** (:func:`ring_forms` with ``in_network_bw``). An NVSwitch with NVLink
SHARP (NVLS) or an InfiniBand fabric with SHARP reduces in the switch: each member sends its
buffer up once and receives the result once, so an all-reduce's time is ``S / B_in`` with
``B_in`` the achieved *algorithm* bandwidth (bytes over time), whatever the member count
(nccl-tests' busbw of such a run is ``B_in * 2 (n-1)/n`` by definition, nccl-tests
doc/PERFORMANCE.md; NCCL's maintainer on NVIDIA/nccl-tests issue #212: "with NVLink SHARP
neither the algbw nor busbw correspond to the bandwidth on the wire"). The hierarchical
all-reduce is, level by level, an all-reduce of ``S_l = S / prod_{j<l} k_j`` bytes among
``k_l`` peers (the reduce-scatter up and the all-gather down of that level), so a level that
offers one does it at ``min(2 (k_l-1)/k_l / bw_l, 1 / B_in_l) S_l``: the faster of the ring and
the switch, as NCCL's tuner picks by its model (with NVLS, 2 to 4 H100s reach the ring's busbw
and 8 beat it: NVIDIA/nccl issue #1455). The latency term stays the ring's ``2 (k_l-1)
alpha_l`` (not modelled apart; an upper figure for the switch's fewer steps), so the choice is
by bandwidth alone and the time is the least of the two for every ``S``: the form stays affine
and never exceeds the ring's. Reduce-scatter and all-gather stay rings (the report's
simplification: the published in-network figures are all-reduce runs).
"""

import numpy as np

from nest.core.axes import CollectiveOp

OPS = tuple(CollectiveOp)
"""The collectives the cost model prices (and :func:`deepep_op`'s dispatch and combine)."""

DEEPEP_PREFIX = "deepep_top"


def deepep_op(top_k: int) -> str:
    """The op name of a DeepEP dispatch or combine of tokens routed to ``top_k`` experts
    (module docstring): an all-to-all whose network share is deduplicated per domain."""
    return f"{DEEPEP_PREFIX}{int(top_k)}"


def deepep_top_k(op: str) -> int | None:
    """``top_k`` of a :func:`deepep_op` name, None for any other op."""
    if isinstance(op, str) and op.startswith(DEEPEP_PREFIX):
        return int(op[len(DEEPEP_PREFIX) :])
    return None


def is_priced(op: str) -> bool:
    """Whether ``op`` is a collective the cost model prices."""
    return op in OPS or deepep_top_k(op) is not None


def ring_forms(
    op: str, k: np.ndarray, bw, alpha, in_network_bw=None
) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` per row of the level splits ``k`` (``[n, levels]``) of the hierarchical ring
    collectives (module docstring) with per-level bandwidth ``bw`` (bytes/s) and latency
    ``alpha`` (s): the cost model's levels in :func:`nest.cost.collectives.linear_forms`, a
    graph's floor figures in :func:`nest.graph.floors.floor_forms`. ``in_network_bw``: per level
    the algorithm bandwidth of an in-network all-reduce (0: none), which an all-reduce takes
    per level where faster (module docstring)."""
    if op not in OPS or op == CollectiveOp.ALL_TO_ALL:
        rings = tuple(o.value for o in OPS[:3])
        raise ValueError(f"unknown ring collective {op!r}; one of {rings}")
    below = np.cumprod(np.hstack([np.ones((len(k), 1)), k[:, :-1]]), axis=1)  # prod_{j<l} k_j
    per_level = (k - 1) / k / below / bw
    c = ((k - 1) * alpha).sum(axis=1)
    if op != CollectiveOp.ALL_REDUCE:
        return per_level.sum(axis=1), c
    if in_network_bw is not None and np.any(np.asarray(in_network_bw) > 0):
        return np.minimum(2 * per_level, in_network_a(k, below, in_network_bw)).sum(axis=1), 2 * c
    return 2 * per_level.sum(axis=1), 2 * c


def in_network_a(k: np.ndarray, below: np.ndarray, in_network_bw) -> np.ndarray:
    """Seconds per byte of ``S`` of an in-network all-reduce per level (``[n, levels]``): the
    level's ``S_l / B_in = S / prod_{j<l} k_j / B_in`` where the group has peers there, 0 where
    it has none, infinite where the level offers none (``B_in = 0``)."""
    bw_in = np.asarray(in_network_bw, dtype=float)
    inv = np.divide(1.0, bw_in, out=np.full(bw_in.shape, np.inf), where=bw_in > 0)
    return np.where(k > 1, inv / below, 0.0)


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


def dedup_factor(k: np.ndarray, top_k: int) -> np.ndarray:
    """Per row of the level splits ``k``: the share ``f`` of the all-to-all's traffic above the
    innermost level that DeepEP sends, one copy per distinct remote domain (module docstring):
    ``(1 - (1 - k_0/n)^K) / (K k_0/n)``; 1 for a group inside one domain."""
    n = k.prod(axis=1)
    local = k[:, 0] / n
    f = (1.0 - (1.0 - local) ** top_k) / (top_k * local)
    return np.where(n > k[:, 0], f, 1.0)


def deepep_forms(k: np.ndarray, bw, alpha, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` per row of the level splits ``k`` of a DeepEP dispatch or combine of ``S``
    bytes per member (``K = top_k`` copies of each token, as the all-to-all counts them): the
    innermost level carries the all-to-all's share plus the forwarded copies, the levels above
    ``f`` (:func:`dedup_factor`) of theirs, the two domains run concurrently (the larger
    bandwidth term) and the latencies add (module docstring)."""
    below = np.cumprod(np.hstack([np.ones((len(k), 1)), k[:, :-1]]), axis=1)
    crossing = below * (k - 1)
    n = k.prod(axis=1)
    share = crossing / n[:, None]  # the all-to-all's share of S crossing each level
    remote = 1.0 - k[:, 0] / n  # of S, the copies bound for other domains
    inner = (share[:, 0] + remote * (k[:, 0] - 1) / k[:, 0]) / bw[0]
    outer = dedup_factor(k, top_k) * (share[:, 1:] / bw[1:]).sum(axis=1)
    return np.maximum(inner, outer), (crossing * alpha).sum(axis=1)


def level_forms(
    op: str, k: np.ndarray, bw, alpha, in_network_bw=None
) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` of collective ``op`` per row of the level splits ``k`` on levels of bandwidth
    ``bw`` and latency ``alpha`` (and in-network all-reduce bandwidth ``in_network_bw``):
    :func:`all_to_all_forms` or :func:`ring_forms`."""
    if op == CollectiveOp.ALL_TO_ALL:
        return all_to_all_forms(k, bw, alpha)
    top_k = deepep_top_k(op)
    if top_k is not None:
        return deepep_forms(k, bw, alpha, top_k)
    return ring_forms(op, k, bw, alpha, in_network_bw)
