"""ZeRO-3 / FSDP as the frameworks run it: per-layer weight gathers prefetched under the previous
layer's compute, gradient reduce-scatters under the next layer's backward.

FSDP2 (PyTorch ``fully_shard``, the default of torchtitan; Zhao et al., "PyTorch FSDP:
Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023, §3.3 "Communication
optimizations": forward prefetching and backward prefetching) and DeepSpeed ZeRO-3
(``stage3_prefetch_bucket_size``; Rajbhandari et al., SC20, §7 "communication overlap") wrap
each layer as one unit: the unit's parameters are all-gathered as one collective, on a separate
stream, while the previous unit computes. With per-layer all-gather ``g_l``, reduce-scatter
``s_l`` (seconds on the rank's groups, :meth:`nest.cost.state.ModelState.zero3_layer_s`),
forward compute ``f_l`` and backward compute ``b_l`` of a stage holding layers ``i..j``:

- **forward** (layers ``i, i+1, ..., j``): layer ``i``'s gather has nothing to hide under (a
  stage's first unit waits for it); layer ``l``'s gather is prefetched while layer ``l - 1``
  computes, so only ``max(0, g_l - f_{l-1})`` shows::

      fwd = g_i + sum_{l=i+1..j} max(0, g_l - f_{l-1})

- **backward** (layers ``j, j-1, ..., i``): with ``reshard_after_forward`` (FSDP2's default,
  ZeRO-3) each layer is gathered again, ``gb_l = g_l``; without it the forward's gathered weights
  stay until the backward, ``gb_l = 0``. Layer ``j``'s re-gather is exposed, layer ``i``'s
  reduce-scatter too (nothing of this stage runs after it); while layer ``l`` computes its
  backward, the next layer's gather ``gb_{l-1}`` and the previous layer's reduce-scatter
  ``s_{l+1}`` run (one network, one after the other)::

      bwd = gb_j + s_i + sum_{l=i..j} max(0, [l > i] gb_{l-1} + [l < j] s_{l+1} - b_l)

**Prefetch depth.** FSDP2 prefetches a whole unit. DeepSpeed ZeRO-3 fetches ahead at most
``stage3_prefetch_bucket_size`` parameter elements ("Maximum number of parameter elements to
fetch ahead of use", default ``5e7``: ``deepspeed/runtime/zero/config.py``), so of a unit of
``P_l`` parameters only the share ``q_l = min(1, bucket / P_l)`` of its gather can run ahead and
``u_l = (1 - q_l) g_l`` waits in the open (a GPT-3 175B block: ``q = 5e7 / 1.8e9 = 2.8 %``).
Each hiding term above becomes ``max(u, comm - compute)`` with ``u`` the unhideable part of the
gathers in it (reduce-scatters stay fully hideable: DeepSpeed's ``overlap_comm``); ``q = 1``
gives the formulas above.

**Synchronous runtime** (:attr:`nest.core.problem.Training.zero3_runtime` ``synchronous``).
DeepSpeed's first ZeRO-3 releases (v0.3.13, 2021-03-16, to v0.5.x; the version SC21 Table 2,
arXiv 2104.04473 §5.4, compared against) issue one all-gather per parameter tensor and call
``torch.cuda.synchronize()`` before each (``_allgather_param`` in
``deepspeed/runtime/zero/partition_parameters.py`` at v0.3.15, 2c2a7f31); every submodule's
fetch ends in ``_synchronize_communication``, which calls ``torch.cuda.synchronize()`` again
(``deepspeed/runtime/zero/stage3.py``, same commit). A device-wide synchronise waits for every
stream, so no gather runs under compute, and a reduce-scatter issued in the backward is drained
by the next fetch's synchronise before the next layer's backward starts. DeepSpeed PR #1453
(commit 4912e0ad, 2022-01-20, in v0.6.0) replaced this with "more fine grained synchronization
for communication that allows blocking on less work" and batched gathers. Here the chain then
sees no compute (``f = b = 0``: :meth:`nest.cost.state.ModelState.zero3_chain`), so every term
above equals its communication and ``exposed = sum of all gathers and reduce-scatters``.

Only compute hides communication here (``f_l``, ``b_l``: the layers' GEMM and attention
kernels; ``b_l`` with the layer's recomputation in the stage's mode, which runs between the
hooks that issue the gather and the reduce-scatter: :func:`nest.cost.compute.hiding_bwd_s`).
Each hiding term is at most the communication it hides, so
``0 <= exposed <= sum of all gathers and reduce-scatters`` (a property test checks both).

:class:`OverlapChain` tabulates the sums as prefix sums over a chain, so that the evaluator (one
chunk: ``exposed_s(0, n - 1)``) and the DP (every stage ``i..j``: rows over ``j``) evaluate the
same expression.
"""

from dataclasses import dataclass

import numpy as np


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


@dataclass(frozen=True, slots=True)
class OverlapChain:
    """Per-layer ZeRO-3 terms of a chain of layers and their hiding sums (module docstring).

    ``gather_s[l]``/``scatter_s[l]``: layer ``l``'s all-gather / reduce-scatter seconds;
    ``bwd_gather_s[l]``: its backward re-gather (``gather_s`` or 0), ``bwd_late_s[l]`` the part
    of it that cannot be fetched ahead; ``fwd_hidden[k]`` sums ``max(u_l, g_l - f_{l-1})`` over
    ``1 <= l < k``; ``bwd_inner[k]`` sums the backward's two-sided terms
    ``max(ub_{l-1}, gb_{l-1} + s_{l+1} - b_l)`` over ``1 <= l < k``."""

    gather_s: np.ndarray
    scatter_s: np.ndarray
    bwd_gather_s: np.ndarray
    bwd_late_s: np.ndarray
    bwd_compute_s: np.ndarray
    fwd_hidden: np.ndarray
    bwd_inner: np.ndarray

    @classmethod
    def build(
        cls,
        gather_s,
        scatter_s,
        fwd_compute_s,
        bwd_compute_s,
        *,
        reshard_after_forward: bool,
        prefetch_share=1.0,
    ) -> "OverlapChain":
        """``prefetch_share``: per layer (or one for all) the share ``q_l`` of its gather that
        can be fetched ahead (module docstring, prefetch depth)."""
        g = np.asarray(gather_s, dtype=float)
        s = np.asarray(scatter_s, dtype=float)
        f = np.asarray(fwd_compute_s, dtype=float)
        b = np.asarray(bwd_compute_s, dtype=float)
        gb = g if reshard_after_forward else np.zeros_like(g)
        q = np.broadcast_to(np.asarray(prefetch_share, dtype=float), g.shape)
        late, late_b = (1.0 - q) * g, (1.0 - q) * gb  # what cannot be fetched ahead
        fwd_terms = np.zeros_like(g)
        fwd_terms[1:] = np.maximum(late[1:], g[1:] - f[:-1])
        inner = np.zeros_like(g)
        inner[1:-1] = np.maximum(late_b[:-2], gb[:-2] + s[2:] - b[1:-1])
        return cls(g, s, gb, late_b, b, _prefix(fwd_terms), _prefix(inner))

    def fwd_s(self, i: int, j):
        """Exposed forward ZeRO-3 seconds of a stage ``i..j`` (``j`` an int or an array of last
        layers ``>= i``)."""
        return self.gather_s[i] + self.fwd_hidden[np.asarray(j) + 1] - self.fwd_hidden[i + 1]

    def bwd_s(self, i: int, j):
        """Exposed backward ZeRO-3 seconds of a stage ``i..j`` (``j`` an int or an array)."""
        j = np.asarray(j)
        gb, s, b = self.bwd_gather_s, self.scatter_s, self.bwd_compute_s
        many = j > i
        jm = np.maximum(j - 1, i)  # j - 1 where j > i (masked otherwise)
        i1 = min(i + 1, len(s) - 1)
        ends = (
            np.maximum(0.0, s[i1] - b[i])  # layer i hides layer i+1's reduce-scatter
            + np.maximum(self.bwd_late_s[jm], gb[jm] - b[j])  # layer j hides j-1's gather
            + self.bwd_inner[np.maximum(j, i + 1)]
            - self.bwd_inner[i + 1]
        )
        return gb[j] + s[i] + np.where(many, ends, 0.0)

    def total_s(self, i: int, j):
        """All ZeRO-3 seconds of the stage, hidden or not (both directions)."""
        j = np.asarray(j)
        g, s, gb = _prefix(self.gather_s), _prefix(self.scatter_s), _prefix(self.bwd_gather_s)
        return (g[j + 1] - g[i]) + (s[j + 1] - s[i]) + (gb[j + 1] - gb[i])
