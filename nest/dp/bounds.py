"""Placement-independent lower bounds on stage and iteration times (the NEST search's pruning).

Every number here is a *floor*: no plan of the space takes less. The search visits
configurations in increasing :meth:`Floors.config_bound_s` and stops at the first whose bound
exceeds the best plan found; the recurrence drops a partial plan whose completion floor exceeds
it. Both are exact as long as each floor is a true lower bound, which this docstring proves term
by term against the shared evaluator (:mod:`nest.cost.evaluate` and the terms it composes).

**Group splits.** A communication group of ``n`` distinct devices has level split ``k``
(:meth:`~nest.core.topology.Cluster.group_factors`) with ``1 <= k_l <= fanout_l`` and
``prod(k) >= n`` (``k_l`` counts the level-``(l-1)`` blocks touched in one level-``l`` block).
``T(n)`` is the set of all such tuples, so the minimum of any collective's time over ``T(n)``
bounds from below its time on every group of ``n`` devices, whatever the rank order. Every
collective of :mod:`nest.cost.collectives` costs ``a(k) S + c(k)`` for ``S > 0`` bytes with
``a, c >= 0`` (reduce-scatter / all-gather: ``a = sum_l (k_l-1)/k_l / prod_{j<l} k_j / bw_l``,
``c = sum_l (k_l - 1) alpha_l``; all-reduce twice that; all-to-all the analogous sums), which is
what :class:`Floors` evaluates on all of ``T(n)`` at once
(:func:`nest.cost.collectives.linear_forms`). Tensor groups are exact instead: ``tp`` is innermost
in every rank order, so every tensor group is an aligned block of ``tp`` ids
(:func:`tp_group_splits`); and for the same reason a group of any other dense axis (data, context,
hybrid shard and replicate) holds one device per such block, so its split lies in the subset
``T(n, tp)`` of ``T(n)`` (:meth:`Floors.splits`, proved there), over which those groups are
priced.

**Graph clusters.** On a cluster given as a graph the splits are those of the derived hierarchy,
and the forms minimised over ``T(n)`` are the graph's proven floors instead of the hierarchy's
formulas (:func:`nest.cost.collectives.floor_forms`, proved in :mod:`nest.graph.floors`: per
level the fastest rate and least latency any device pair of that level can have, with every
other group's traffic only adding load); a tensor group is priced at the least cost of an
aligned block alone on the network (sharing links only adds to it), and a transfer at its
level's floor (:func:`nest.cost.collectives.p2p_floor_s`). Every argument below holds with these
in place of the hierarchy's numbers. The stage model's placement-aware floors
(:meth:`nest.dp.stages.StageModel.placed_floor_s`) take per layer the least over every rank's
own cost classes (each rank's groups priced together, as the evaluator prices them), never level
splits moved and pooled across ranks, which on a graph are neither a rank's costs nor a floor of
them. Overlap changes nothing here: a collective's exposed part
(:func:`nest.cost.compute.exposed_s`) is non-decreasing in its time, so the exposed part of a
floor is a floor of the exposed part.

**The cost model's own terms on floor groups.** The data-parallel terms (ZeRO-3 traffic, DP
sync) are those of :class:`nest.cost.state.ModelState`, evaluated on :class:`FloorGroups`, which
prices each collective on a kind of group at its least over ``T(n)``. Every term is a sum of
group times with non-negative coefficients and each real group time is at least that minimum, so
the term on the floor groups is a floor of the term on any placement. Hybrid sharding
(:attr:`~nest.core.plan.ParallelConfig.zero_shard`, a :class:`~nest.dp.space.Family` field) changes
nothing in this argument: its terms are :class:`ModelState`'s too, over four more kinds of group
whose sizes the configuration fixes (``zero_shard x cp`` ranks per shard group, ``zero_shard x cp
x (tp / etp) / ep`` per expert shard group, ``dp / zero_shard`` per replicate group of either;
:meth:`Floors.groups`), so every floor below is computed with
the configuration's own state and group sizes, never with sharding over all ``dp`` ranks (whose
ZeRO-3 gathers span more devices than a shard group's, a time that may exceed the hybrid
configuration's, and whose state is smaller than a shard group's, a memory the hybrid
configuration would not need to fit). ``tests/test_hsdp.py`` checks on random problems that no
hybrid configuration's bound exceeds its optimum. Without latency
(``with_latency=False``, ``a_min S``) the floor is also linear in the bytes, hence additive over
a stage's layers.

**Per layer** (:meth:`Floors.layer_floors_s`): a stage's forward plus backward is the sum over
its layers of compute (and the recompute of its mode), plus per axis the slowest group's
collectives summed over the layers, plus ZeRO-3 traffic, plus p2p. For each axis
``max_f sum_layers >= sum_layers min_f`` (over the rank's splits, all in ``T(n)``), so a layer's
floor is its compute, plus the cheapest allowed recompute with its collectives, plus the
minimum over ``T(n)`` of each direction's collectives. ZeRO-3's traffic adds nothing to a
layer's floor: prefetching can hide each layer's gathers and reduce-scatter under its
neighbours' compute (:mod:`nest.cost.fsdp`), and the exposed part is ``>= 0``. Hence every
stage takes at least the sum of its layers' floors.

**Per configuration** (:meth:`Floors.config_bound_s`), with ``F`` the sum of the layer floors:

- p2p: a stage boundary sends the boundary activation forward and its gradient backward between
  distinct devices, so at some level ``l >= 0``: each transfer takes at least
  ``min_l p2p_l(bytes)`` (:func:`~nest.cost.collectives.p2p_time_s`); with ``b_min`` the smallest
  boundary of the chain, the ``pp - 1`` boundaries (``pp v - 1`` interleaved) add
  ``2 (pp - 1) p2p(b_min)`` to ``sum_r t_r``;
- ``S = sum_r t_r >= F + p2p`` and ``M = max_r t_r >= max(S / pp, largest single-layer floor)``
  (1F1B: the stage holding that layer); interleaved: ``M >= max_r`` of rank ``r``'s own floor,
  since its chunks are fixed;
- exposed sync ``E >= sync_0`` without overlap: rank 0 finishes its backward last
  (``B_0 = 0``), and it holds at least the embedding (all of the model when ``pp = 1``; its exact
  chunks when interleaved); the sync is monotone in bytes, so :meth:`ModelState.sync_s` of
  those parameters on the floor groups bounds it (the whole sync is exposed there: its
  gradient part and, after the step, its weight all-gather). With overlap, ``E >= 0``;
- interleaved, ZeRO below 3, sync overlapped: rank 0's exposed sync, at least
  ``max(0, sync_0 - b_0)`` with ``sync_0`` its gradient part (:meth:`Floors._sync_raw_s`)
  (``b_0`` the backward of chunk 0) traded against the time ``b_0`` adds to rank 0, the least
  of a convex piecewise-linear function over ``b_0`` at or above its floor
  (:meth:`Floors._overlap_sync_bound_s`, proved there); the bound is the larger of the two;
  1F1B on one pipeline rank: ``max(0, sync - bf)``, ``bf`` the floor of its backward
  (:meth:`Floors._one_stage_exposed_s`);
- ZeRO-3: each stage (each chunk, interleaved) pays per microbatch at least its first
  layer's gather and its last layer's re-gather and first layer's reduce-scatter, which
  prefetching cannot hide (:meth:`Floors._z3_chunk_floor_s`, proved there): a constant added to
  every stage's floor (``v`` of them to an interleaved rank's);
- optimizer ``O = max_r opt_r >= sum_r opt_r / pp`` (:meth:`ModelState.optimizer_step_s` is
  linear in the parameters held);
- ``T = S + (m-1) M + E + O`` (1F1B) or ``S / v + (m - 1/v) M + E + O`` (interleaved), every
  coefficient positive, so the bound is the same expression on the floors.
- ZB-H1: ``T = sum_r u_r + (m-1) M + max_r e_r + E + O`` (:mod:`nest.cost.pipeline`) with
  ``u_r = t_r - w_r - c_r >= t_r - 2 w_r`` (``c_r <= w_r``) and ``u_r + e_r = t_r``, so
  ``sum_r u_r + max_r e_r >= max(S - 2 W, M)`` where ``W`` is the chain's weight-gradient time
  (the same in every plan of the shard): the bound is ``max(S_floor - 2 W, M_floor) + (m-1)
  M_floor + E + O``. Rank 0's exposed sync is at least 1F1B's: nothing hides it but, with
  overlap, its own W pass, shorter than its backward.
- ZB-H2: the same with ``u_r = max(f_r, h_r) >= f_r + b'_r - 2 w_r = t_r - 3 w_r`` and
  ``u_r >= f_r`` (:mod:`nest.cost.pipeline`), so ``max(S_floor - 3 W, F_floor - bf, M_floor) +
  (m-1) M_floor + O`` (``F_floor - bf`` the layers' forward floors, as in
  :meth:`Floors._one_stage_exposed_s`: each stage's forward takes at least them); its
  exposed sync is bounded by 0 only (rank 0 ends before the last rank when ``h_0 < f_0``, and
  that hides its sync).
- ZB-V: ``T = m M + max_r l_r + E + O`` (:func:`nest.cost.pipeline.zb_v_pipeline_s`) with
  ``max_r l_r >= (pp - 1) F`` (``F`` the largest chunk forward, at least the layers' forward
  floors over ``2 pp``) and ``E >= 0``; its ranks' chunks hold every layer once and at least
  ``2 (pp - 1)`` hops, so ``M_floor`` is 1F1B's, and its ``O`` has no tied copy of the word
  embedding (rank 0 holds the embedding and the head; the memory floor likewise).
- DualPipeV: ``m C / pp + O`` (``O`` as ZB-V's, without the tied copy; ``E >= 0``), ``C`` the
  chain's compute alone (every layer's forward and backward and its cheapest allowed
  recomputation, no collective): its overlapped steps hide transfers the other floors count,
  but each rank runs its chunks' ``m`` forwards and backwards, every task at least its compute
  (an F&B at least both, :func:`nest.cost.dualpipe.overlapped_s`), so its busy time, and ``T``,
  is at least ``m`` times its chunks' compute, at least the average ``m C / pp``;
  :mod:`nest.dp.dualpipe_v` bounds each configuration again, and branches.

**Memory floor** (:meth:`Floors.memory_floor_bytes`; configurations above the device's memory are
skipped, as no plan of theirs fits). A rank needs ``state(D_r, X_r) + f_r A_r + T_r + reserve``
(:mod:`nest.cost.memory`): ``state`` linear in its parameters
(:meth:`ModelState.state_bytes`, with per-parameter coefficients
:meth:`ModelState.state_bytes_per_param`), ``f_r >= 1`` in-flight
microbatches, ``A_r`` its stored activations, ``T_r >= 0`` its largest transient buffer. Each
layer stores at least its least-storing allowed mode's activations and holds at least its
least transient. So the peak rank needs at least the average over ranks,
``reserve + (state(all parameters) + sum of least activations) / pp``; at least what the rank
holding any one layer needs for that layer alone (its state, least activations, least
transient, ZeRO-3's gathered weights); and, interleaved, at least each rank's fixed chunks with
their least activations times the rank's in-flight count plus their least transient.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from nest.core.alphabeta import is_priced
from nest.core.axes import GroupKind, LayerKind, Recompute, Schedule
from nest.core.hierarchy import block_sizes
from nest.core.layers import Collective, Shard
from nest.core.plan import NO_OFFLOAD, Offload
from nest.core.problem import Problem
from nest.cost.collectives import floor_forms, p2p_floor_s
from nest.cost.compute import bwd_collectives, exposed_s, fwd_collectives, recompute_s
from nest.cost.groups import collectives_time_s, split_forms
from nest.cost.memory import peak_bytes, stored_bytes
from nest.cost.pipeline import in_flight_microbatches
from nest.cost.state import ModelState, per_param
from nest.dp.space import Family, interleaved_chunks


def tp_group_splits(cluster, tp: int) -> set:
    """Cost classes of every aligned block of ``tp`` devices (tp is innermost in every rank
    order of the space, so each tensor group is one of them): its level split on a hierarchy;
    on a graph each block's class alone, a floor under link sharing
    (:meth:`nest.core.fabric.Fabric.aligned_classes`)."""
    if tp <= 1:
        return set()
    return set(cluster.fabric.aligned_classes(tp))


class _FloorForms(dict):
    """``{op: floor_forms(op, tuples)}`` over every level tuple, filled on first lookup."""

    def __init__(self, tuples: np.ndarray, cluster) -> None:
        super().__init__()
        self.tuples, self.cluster = tuples, cluster

    def __missing__(self, op: str):
        if not is_priced(op):
            raise KeyError(op)
        got = self[op] = floor_forms(op, self.tuples, self.cluster)
        return got


class FloorGroups:
    """A stand-in for :class:`nest.cost.groups.RankGroups` that prices a collective at its least
    over every split a group of that kind's size can have (``T(n)``, or ``T(n, tp)`` for the
    kinds in ``strides``: groups with one device per aligned tensor block, :meth:`Floors.splits`),
    so the cost model's own terms (:class:`nest.cost.state.ModelState`) evaluated on it are
    floors. ``with_latency`` False drops the ``c`` of ``a S + c``: then the floor is additive
    over a stage's layers."""

    def __init__(
        self,
        floors: "Floors",
        sizes: dict[str, int],
        *,
        with_latency: bool,
        strides: dict[str, int] | None = None,
    ) -> None:
        self.floors, self.sizes, self.with_latency = floors, sizes, with_latency
        self.strides = strides or {}

    def time_s(self, op: str, n_bytes: float, kind: str) -> float:
        n = self.sizes[kind]
        if n <= 1 or n_bytes <= 0:
            return 0.0
        tp = self.strides.get(kind, 1)
        if self.with_latency:
            return self.floors.min_time_s(((op, n_bytes),), n, tp)
        return self.floors.min_per_byte_s(op, n, tp) * n_bytes


@dataclass(frozen=True, slots=True)
class StatePerParam:
    """:class:`ModelState`'s terms are linear in the parameters: their coefficients per dense and
    per expert parameter, for the bounds' many configurations."""

    state_bytes: tuple[float, float]
    gathered_bytes: tuple[float, float]
    optimizer_s: tuple[float, float]


@dataclass(frozen=True, slots=True)
class ShardFloors:
    """Per-chain-layer floors of one shard (see the module docstring)."""

    base_s: np.ndarray
    """Compute + cheapest recompute + tensor/context/expert collectives, per layer."""
    dense: np.ndarray
    """Dense parameters per device, per layer (ZeRO-3 traffic and sync floors)."""
    expert: np.ndarray
    p2p_s: float
    """Floor of one p2p transfer of the chain's smallest boundary."""
    tied_copy: float
    base_sum_s: float
    dense_sum: float
    expert_sum: float
    kinds: tuple[tuple[float, float, float], ...]
    """The distinct (base, dense, expert) rows: the largest layer floor is one of them."""
    base_max_s: float
    act_min: np.ndarray
    """Stored activation bytes per layer under its smallest-storing allowed mode."""
    transient_min: np.ndarray
    """Transient bytes per layer under its smallest allowed mode (before ZeRO-3 gathers)."""
    mem_kinds: tuple[tuple[float, float, float, float], ...]
    """The distinct (dense, expert, act_min, transient_min) rows."""
    bwd_s: np.ndarray
    """The backward part of ``base_s`` per layer: backward compute plus the cheapest allowed
    recompute with its backward collectives (``base_s`` less the forward compute and the
    cheapest forward collectives)."""
    wgrad_sum_s: float = 0.0
    """The chain's weight-gradient seconds (W passes), the same in every plan of the shard."""
    compute_sum_s: float = 0.0
    """The chain's compute alone: every layer's forward and backward and its cheapest allowed
    recomputation, without any collective (DualPipeV's floor, module docstring)."""


class Floors:
    """Lower bounds shared by every configuration of one search (module docstring)."""

    def __init__(
        self, problem: Problem, modes: Sequence[Recompute], *, aligned_tp: bool = True
    ) -> None:
        """``aligned_tp``: tensor groups are aligned blocks of ``tp`` consecutive ids (every
        rank order of the NEST space); False prices them like any group of ``tp`` devices
        (the minimum over ``T(tp)``), as any placement needs (the exact planners' general
        mode)."""
        self.problem, self.modes = problem, tuple(modes)
        self.aligned_tp = aligned_tp
        cluster = problem.cluster
        self.cluster = cluster
        tuples = np.array(list(product(*[range(1, lv.fanout + 1) for lv in cluster.levels])))
        self._tuples = tuples
        self._prod = tuples.prod(axis=1)
        self._block = block_sizes([lv.fanout for lv in cluster.levels])
        self._masks: dict = {}
        self._coef = _FloorForms(tuples, cluster)
        self._min_cache: dict = {}
        self._shards: dict = {}
        self._tp_splits: dict = {}
        # no sharding and no gathers: the shard-independent parts of the memory floors
        self._unsharded = ModelState.of(problem, zero_stage=0, dp=1, cp=1, ep=1)

    def state(self, f: Family, zero: int, offload: bool = False) -> ModelState:
        """The :class:`ModelState` of family ``f``'s configurations with ZeRO stage ``zero``
        (and the optimizer offloaded): it depends on ``dp x cp``, ``ep``, the expert fold
        ``tp / etp`` and the hybrid shard degree."""
        return ModelState.of(
            self.problem,
            zero_stage=zero,
            dp=f.dp,
            cp=f.cp,
            ep=f.ep,
            fold=f.fold,
            optimizer_offload=offload,
            zero_shard=f.zero_shard,
        )

    def per_param(self, f: Family, zero: int, offload: bool = False) -> StatePerParam:
        """:meth:`state`'s linear terms per dense and per expert parameter (the offloaded
        optimizer's step and state are linear in the parameters too)."""
        shard = None if f.zero_shard is None else f.zero_shard * f.cp
        key = ("per param", zero, f.dp * f.cp, f.ep, f.fold, offload, shard)
        got = self._min_cache.get(key)
        if got is None:
            state = self.state(f, zero, offload)
            hbm = self.cluster.device.achieved_hbm_bw_bytes_per_s
            got = self._min_cache[key] = StatePerParam(
                state_bytes=state.state_bytes_per_param(),
                gathered_bytes=per_param(state.gathered_bytes),
                optimizer_s=per_param(state.optimizer_step_s, hbm),
            )
        return got

    def splits(self, n: int, tp: int = 1) -> np.ndarray:
        """Which level tuples a group of ``n`` distinct devices may split as (a mask over the
        tuples): ``T(n)``, and with ``tp > 1`` ``T(n, tp)``, its subset for a group that holds at
        most one device of each aligned block of ``tp`` ids (``[a tp, (a + 1) tp)``).

        **Proof** (``T(n, tp)``). Every rank order of the space has ``tp`` innermost, so a
        device's id is its tensor index plus ``tp`` times the rest (:func:`nest.core.plan.place`),
        and a group of any axis but the tensor one (data, context, their ZeRO shard and
        replicate groups) keeps the tensor index fixed: one device per aligned block. A level-``l``
        block holds ``D_l`` consecutive ids from a multiple of ``D_l``
        (:func:`nest.core.hierarchy.block_sizes`). If ``tp`` divides ``D_l`` the block is
        ``D_l / tp`` whole aligned blocks, so it holds at most ``D_l / tp`` of the group's
        devices; if ``D_l`` divides ``tp`` it lies inside one aligned block and holds at most
        one. ``k_l`` counts level-``(l-1)`` blocks touched inside one level-``l`` block, each
        holding a device of the group, so ``k_l <= max(1, D_l / tp)`` at every such level (no
        limit beyond ``fanout_l`` at the others), and ``prod(k) >= n`` as for any group. The
        group's split is therefore in ``T(n, tp)``, the least over it of a collective's time is
        at most the group's, and every floor of the module docstring holds with ``T(n, tp)``
        in place of ``T(n)`` for these groups. (An empty subset, which no real group meets,
        falls back to ``T(n)``.)"""
        key = (n, tp)
        got = self._masks.get(key)
        if got is None:
            got = self._prod >= n
            if tp > 1:
                narrow = got.copy()
                for lv, size in enumerate(self._block[1:]):
                    if size % tp == 0 or tp % size == 0:
                        narrow &= self._tuples[:, lv] <= max(1, size // tp)
                if narrow.any():
                    got = narrow
            self._masks[key] = got
        return got

    def min_time_s(self, ops: tuple, n: int, tp: int = 1) -> float:
        """Least time of the collectives run one after another on one group of ``n`` devices:
        :func:`nest.cost.groups.collectives_time_s` minimised over ``T(n)`` (``T(n, tp)``:
        :meth:`splits`). ``ops`` holds ``(op, bytes)`` pairs (charged whole) or
        :class:`~nest.core.layers.Collective` objects (charged their exposed part,
        :func:`~nest.cost.compute.exposed_s`, which is non-decreasing in the collective's time,
        so its minimum is at the least time)."""
        if n <= 1 or not ops:
            return 0.0
        key = (ops, n, tp)
        got = self._min_cache.get(key)
        if got is None:
            mask = self.splits(n, tp)
            total = np.zeros(int(mask.sum()))
            for item in ops:
                coll = item if isinstance(item, Collective) else Collective(item[0], "", item[1])
                if coll.n_bytes > 0:
                    a, c = self._coef[coll.op]
                    total += exposed_s(a[mask] * coll.n_bytes + c[mask], coll)
            got = float(total.min())
            self._min_cache[key] = got
        return got

    def min_per_byte_s(self, op: str, n: int, tp: int = 1) -> float:
        """Least seconds per byte (the ``a`` of ``a S + c``) of ``op`` over ``n`` devices
        (``tp``: :meth:`splits`)."""
        if n <= 1:
            return 0.0
        key = ("per byte", op, n, tp)
        if key not in self._min_cache:
            self._min_cache[key] = float(self._coef[op][0][self.splits(n, tp)].min())
        return self._min_cache[key]

    def groups(
        self,
        dp: int,
        cp: int,
        ep: int,
        *,
        with_latency: bool,
        fold: int = 1,
        zero_shard: int | None = None,
        tp: int = 1,
    ) -> FloorGroups:
        """Floor groups of the data-parallel kinds (the sizes the configuration gives them;
        with hybrid sharding also its shard and replicate groups). ``tp``: the configurations'
        tensor degree; with aligned tensor groups the dense kinds, which keep the tensor index
        fixed, are priced over ``T(n, tp)`` (:meth:`splits`; the expert kinds may run across
        the tensor digit when experts fold it, so they keep ``T(n)``)."""
        sizes = {GroupKind.DENSE_DP: dp * cp, GroupKind.EXPERT_DP: dp * cp * fold // ep}
        if zero_shard is not None:
            sizes[GroupKind.ZERO_SHARD] = zero_shard * cp
            sizes[GroupKind.ZERO_REPLICATE] = dp // zero_shard
            sizes[GroupKind.EXPERT_ZERO_SHARD] = zero_shard * cp * fold // ep
            sizes[GroupKind.EXPERT_ZERO_REPLICATE] = dp // zero_shard
        strides = {}
        if self.aligned_tp and tp > 1:
            dense = (GroupKind.DENSE_DP, GroupKind.ZERO_SHARD, GroupKind.ZERO_REPLICATE)
            strides = {kind: tp for kind in dense}
        return FloorGroups(self, sizes, with_latency=with_latency, strides=strides)

    def family_groups(self, f: Family, *, with_latency: bool) -> FloorGroups:
        """:meth:`groups` of a family's configurations."""
        return self.groups(
            f.dp,
            f.cp,
            f.ep,
            with_latency=with_latency,
            fold=f.fold,
            zero_shard=f.zero_shard,
            tp=f.tp,
        )

    def _axis_s(self, colls, shard: Shard, tp_splits) -> float:
        """Floor of a layer's collectives, per axis the cheapest group split."""
        total = 0.0
        pairs = [(c, 1) for c in colls]
        for axis, n in (
            (GroupKind.TP, shard.tp),
            (GroupKind.CP, shard.cp),
            (GroupKind.EP, shard.ep),
        ):
            ops = tuple(c for c in colls if c.axis == axis)
            if not ops or n <= 1:
                continue
            if axis == GroupKind.TP and tp_splits is not None:
                total += min(
                    collectives_time_s(pairs, axis, split_forms(f, self.cluster)) for f in tp_splits
                )
            elif axis == GroupKind.CP and self.aligned_tp:
                # a context group keeps the tensor index fixed (:meth:`splits`)
                total += self.min_time_s(ops, n, shard.tp)
            else:
                total += self.min_time_s(ops, n)
        return total

    def _layer_floor_s(self, x, is_block: bool, shard: Shard, splits) -> tuple[float, float]:
        """``(base, bwd)`` of one layer: compute, the cheapest allowed recompute with its
        collectives, and the cheapest collectives of both directions; and the backward part of
        that (a floor of the layer's backward: its compute and the same cheapest recompute with
        its backward collectives)."""
        modes = self.modes if is_block else (Recompute.NONE,)
        redo = min(
            recompute_s(x, md, is_block)
            + self._axis_s(bwd_collectives(x, md, is_block), shard, splits)
            for md in modes
        )
        base = x.fwd_s + x.bwd_s + self._axis_s(fwd_collectives(x), shard, splits) + redo
        return base, x.bwd_s + redo

    def shard(self, shard: Shard) -> ShardFloors:
        got = self._shards.get(shard)
        if got is not None:
            return got
        model, cluster = self.problem.model, self.cluster
        if shard.tp not in self._tp_splits:
            self._tp_splits[shard.tp] = (
                tp_group_splits(cluster, shard.tp) if self.aligned_tp else None
            )
        splits = self._tp_splits[shard.tp]
        per_cost: dict = {}
        base, dense, expert, boundary, act, transient, bwd = [], [], [], [], [], [], []
        wgrad = compute = 0.0
        for ref in model.chain:
            x = model.layer_cost(ref, shard, cluster.device)
            wgrad += x.wgrad_s
            is_block = ref.kind is LayerKind.BLOCK
            compute += (
                x.fwd_s
                + x.bwd_s
                + min(
                    recompute_s(x, md, is_block)
                    for md in (self.modes if is_block else (Recompute.NONE,))
                )
            )
            key = (id(x), is_block)  # layers of one cost object share their floors
            got_layer = per_cost.get(key)
            if got_layer is None:
                modes = self.modes if is_block else (Recompute.NONE,)
                base_s, bwd_s = self._layer_floor_s(x, is_block, shard, splits)
                got_layer = per_cost[key] = (
                    base_s,
                    min(stored_bytes(x, md, is_block) for md in modes),
                    min(peak_bytes(x, md, is_block, self._unsharded) for md in modes),
                    bwd_s,
                )
            base.append(got_layer[0])
            dense.append(x.dense_params)
            expert.append(x.expert_params)
            if ref.kind is not LayerKind.HEAD:
                boundary.append(x.boundary_bytes)
            act.append(got_layer[1])
            transient.append(got_layer[2])
            bwd.append(got_layer[3])
        small = min(boundary)
        p2p = min(p2p_floor_s(small, lv, cluster) for lv in range(cluster.num_levels))
        tied = model.layer_cost(model.chain[-1], shard, cluster.device).tied_copy_params
        got = ShardFloors(
            np.array(base),
            np.array(dense),
            np.array(expert),
            p2p,
            tied,
            float(sum(base)),
            float(sum(dense)),
            float(sum(expert)),
            tuple(sorted(set(zip(base, dense, expert, strict=True)))),
            float(max(base)),
            np.array(act),
            np.array(transient),
            tuple(sorted(set(zip(dense, expert, act, transient, strict=True)))),
            np.array(bwd),
            wgrad,
            compute,
        )
        self._shards[shard] = got
        return got

    def layer_floors_s(self, shard: Shard, dp: int, ep: int, zero: int) -> np.ndarray:
        """Per chain layer, the least share of any stage time holding it (module docstring)."""
        return self.shard(shard).base_s + self.zero3_floors_s(shard, dp, ep, zero)

    def zero3_floors_s(self, shard: Shard, dp: int, ep: int, zero: int) -> np.ndarray:
        """Per chain layer, the latency-free floor of its ZeRO-3 traffic (0 below stage 3)."""
        sf = self.shard(shard)
        zd, zx = self._z3_coefs(dp, shard.cp, ep, zero, shard.tp // shard.expert_tp)
        return zd * sf.dense + zx * sf.expert

    def _z3_coefs(self, dp: int, cp: int, ep: int, zero: int, fold: int = 1) -> tuple[float, float]:
        """Seconds per dense and per expert parameter of ZeRO-3's exposed per-microbatch
        traffic that every stage pays at least: 0. Prefetching hides a layer's gather and
        reduce-scatter under its neighbours' compute (:mod:`nest.cost.fsdp`), so the exposed
        part can be 0 for any layer but a stage's first; ``0 <= exposed`` is the only floor
        that holds per layer. It holds under the synchronous runtime too, whose exposed part is
        all of the traffic (:attr:`nest.core.problem.Training.zero3_runtime`)."""
        return 0.0, 0.0

    def _z3_chunk_floor_s(self, f: Family, sf: ShardFloors, zero: int) -> float:
        """Least exposed ZeRO-3 seconds per microbatch of any stage (chunk) of this family: 0
        below stage 3.

        Proof. :class:`nest.cost.fsdp.OverlapChain` charges a chunk ``i..j`` at least
        ``g_i`` in its forward (its first gather waits: ``fwd_s = g_i + sum of max(.) >= g_i``)
        and ``gb_j + s_i`` in its backward (the last layer's re-gather and the first layer's
        reduce-scatter; ``bwd_s = gb_j + s_i + non-negative terms``), whatever the prefetch
        depth. Each is one collective over the rank's dense (and expert) data-parallel group,
        non-decreasing in its bytes, so each is at least the same collective of the chain's
        fewest dense (and fewest expert) parameters on the floor groups (latency included: one
        collective per term, nothing summed). The chunk's compute floors do not count ZeRO-3
        (:meth:`_z3_coefs` is 0), so this constant adds to each chunk's floor."""
        if zero < 3:
            return 0.0
        key = ("zero3 chunk", id(sf), f.dp * f.cp, f.ep, f.fold, f.zero_shard, f.tp)
        got = self._min_cache.get(key)
        if got is None:
            groups = self.family_groups(f, with_latency=True)
            state = self.state(f, zero)
            dense, expert = float(np.min(sf.dense)), float(np.min(sf.expert))
            gather, scatter = state.zero3_layer_s(groups, dense, expert)
            regather = gather if state.reshard_after_forward else 0.0
            got = self._min_cache[key] = float(gather + regather + scatter)
        return got

    def _sync_floor_s(self, family: Family, dense: float, expert: float, zero: int) -> float:
        """Least DP sync time of a rank holding at least these parameters (monotone in bytes):
        :meth:`ModelState.sync_s` on the floor groups."""
        if zero >= 3 or self.problem.training.overlap_grad_sync:
            return 0.0
        nd, f = family.dp * family.cp, family
        key = ("sync", dense, expert, nd, nd * f.fold // f.ep, zero > 0, f.cp, f.zero_shard, f.tp)
        got = self._min_cache.get(key)
        if got is None:
            groups = self.family_groups(f, with_latency=True)
            state = self.state(f, zero)
            got = self._min_cache[key] = float(state.sync_s(groups, dense, expert))
        return got

    def _shard_of(self, family: Family) -> ShardFloors:
        key = (family.tp, family.cp, family.ep, family.etp, family.microbatch_size)
        got = self._shards.get(key)
        if got is None:
            sp = self.problem.training.sequence_parallel and family.tp > 1
            shard = Shard(
                tp=family.tp,
                cp=family.cp,
                ep=family.ep,
                sp=sp,
                mbs=family.microbatch_size,
                etp=family.etp,
            )
            got = self._shards[key] = self.shard(shard)
        return got

    def config_bound_s(
        self,
        family: Family,
        zero: int,
        schedule: tuple[Schedule, int],
        offload: Offload = NO_OFFLOAD,
    ) -> float:
        """No plan of these configurations (any rank order) is faster (module docstring)."""
        return self.family_bounds_s(family, ((schedule, zero, offload),))[0]

    def family_floor_s(self, family: Family) -> float:
        """A floor of :meth:`family_bounds_s` of every entry of the family, from its shard's
        floors alone (the search computes the entries' bounds only for the families whose floor
        it reaches: :class:`nest.dp.planner.LazyRanking`).

        **Proof.** Every term :meth:`family_bounds_s` adds to the pipeline term (the ZeRO-3
        terms ``zd, zx, z3``, the sync, the optimizer step, rank 0's exposed sync) is
        non-negative, and the pipeline term is non-decreasing in each rank's floor. 1F1B: its
        ``total`` is at least ``F0 = sum of the layer floors + 2 (pp - 1) p2p`` and its ``top``
        at least ``max(F0 / pp, largest layer floor)`` (with ZeRO-3 the largest is taken over
        the same layers' floors plus non-negative terms), so the bound is at least
        ``F0 + (m - 1) top0``; ZB-H1's ``max(total - 2 W, top) + (m - 1) top`` is at least the
        same expression on ``F0, top0``. Interleaved: the ranks' floors sum over all chunks,
        i.e. every layer once plus non-negative p2p and ZeRO terms, so their sum ``S`` is at
        least the layer floors' sum ``F`` and their largest at least ``S / pp``; with
        ``m - 1/v >= 0`` the bound is at least ``F / v + (m - 1/v) F / pp``. DualPipeV's bound is
        ``m C / pp`` plus a non-negative optimizer term. The least of these
        over the family's schedules is a floor of every entry's bound; a schedule not named here
        (one added later, whose bound may be lower) gets the floor 0, which is always one."""
        sf = self._shard_of(family)
        pp, m = family.pp, family.m
        total = sf.base_sum_s + 2 * (pp - 1) * sf.p2p_s
        top = max(total / pp, sf.base_max_s)
        least = float("inf")
        for kind, v in family.schedules:
            if kind is Schedule.INTERLEAVED:
                got = sf.base_sum_s / v + (m - 1 / v) * sf.base_sum_s / pp
            elif kind is Schedule.ZB_H1:
                got = max(total - 2.0 * sf.wgrad_sum_s, top) + (m - 1) * top
            elif kind is Schedule.ONE_F_ONE_B:
                got = total + (m - 1) * top
            elif kind is Schedule.DUALPIPE_V:
                got = m * sf.compute_sum_s / pp
            else:  # a schedule this floor was not proved for: no floor (bounded at once)
                got = 0.0
            least = min(least, got)
        return least

    def family_bounds_s(self, family: Family, entries=None) -> list[float]:
        """:meth:`config_bound_s` of each ``(schedule, zero, offload)`` of ``entries``
        (default: all of the family's, :meth:`Family.entries`), with what they share computed
        once (the shard's floors, and per ZeRO stage and offload its coefficients): the search
        bounds every entry."""
        if entries is None:
            entries = family.entries()
        sf = self._shard_of(family)
        pp, m = family.pp, family.m
        f = family
        tied = sf.tied_copy if pp > 1 else 0.0
        if pp == 1:
            sync_dense, sync_expert = sf.dense_sum, sf.expert_sum
        else:
            sync_dense, sync_expert = float(sf.dense[0]), float(sf.expert[0])
        overlap = self.problem.training.overlap_grad_sync
        per_zero: dict = {}
        out = []
        for schedule, zero, offload in entries:
            got = per_zero.get((zero, offload))
            if got is None:
                zd, zx = self._z3_coefs(f.dp, f.cp, f.ep, zero, f.fold)
                opt_d, opt_x = self.per_param(f, zero, offload.optimizer).optimizer_s
                optimizer = (opt_d * (sf.dense_sum + tied) + opt_x * sf.expert_sum) / pp
                z3 = self._z3_chunk_floor_s(f, sf, zero)
                got = per_zero[zero, offload] = (zd, zx, optimizer, z3)
            zd, zx, optimizer, z3 = got
            kind, v = schedule
            if kind is Schedule.INTERLEAVED:
                # ZeRO 0-2 share the ranks' floors (no ZeRO-3 traffic): computed once, and
                # the ranks' sum and largest once per shard, partition and ZeRO-3 floor
                got = per_zero.get((schedule, zd, zx, z3))
                if got is None:
                    ranks, total, top, dense0, expert0 = self._interleaved_rank_floors(
                        sf, pp, v, zd, zx, z3
                    )
                    pipeline = total / v + (m - 1 / v) * top
                    got = per_zero[schedule, zd, zx, z3] = (ranks, pipeline, dense0, expert0)
                ranks, pipeline, dense0, expert0 = got
                if zero >= 3 or overlap:  # _sync_floor_s's own zero, without the call
                    sync = 0.0
                else:
                    sync = self._sync_floor_s(family, dense0, expert0, zero)
                bound = pipeline + sync + optimizer
                if zero < 3 and overlap:
                    exposed = per_zero.get((schedule, "exposed", zero > 0))
                    if exposed is None:
                        exposed = self._overlap_sync_bound_s(family, sf, ranks, zero, v)
                        per_zero[schedule, "exposed", zero > 0] = exposed
                    bound = max(bound, exposed + optimizer)
                out.append(bound)
                continue
            got = per_zero.get(("stages", zd, zx, z3, zero < 3))
            if got is None:
                got = per_zero["stages", zd, zx, z3, zero < 3] = self._stage_floors(
                    sf, pp, zd, zx, z3, zero
                )
            total, top = got
            if pp == 1 and zero < 3 and overlap:
                sync = self._one_stage_exposed_s(family, sf, zero)
            elif zero >= 3 or overlap:  # _sync_floor_s's own zero, without the call
                sync = 0.0
            else:
                sync = self._sync_floor_s(family, sync_dense, sync_expert, zero)
            pipeline = total + (m - 1) * top
            if kind.v_shaped:  # its own optimizer term, without the tied copy
                pipeline, sync, optimizer = self._v_bound_s(f, sf, zero, offload, top, kind)
            elif kind is Schedule.ZB_H2:
                # ZB-H2: sum_r u_r >= sum_r max(t_r - 3 w_r, f_r) and sum_r u_r + max_r e_r >=
                # max_r t_r (nest.cost.pipeline); any rank's sync may be hidden: E >= 0
                forwards = sf.base_sum_s - self._backward_floor_s(sf)
                low = max(total - 3.0 * sf.wgrad_sum_s, forwards, top)
                pipeline = low + (m - 1) * top
                sync = 0.0
            elif kind.splits_backward:
                # ZB-H1: sum_r u_r >= sum_r (t_r - 2 w_r) and sum_r u_r + max_r e_r >= max_r t_r
                # (nest.cost.pipeline); rank 0's exposed sync is 1F1B's or more (own W <= b)
                pipeline = max(total - 2.0 * sf.wgrad_sum_s, top) + (m - 1) * top
            out.append(pipeline + sync + optimizer)
        return out

    def _v_bound_s(
        self, f: Family, sf: ShardFloors, zero: int, offload, top: float, kind: Schedule
    ) -> tuple[float, float, float]:
        """``(bound, 0, 0)``: ZB-V (module docstring): ``m M_floor + (pp - 1) F_chunk + O`` with
        ``F_chunk`` the layers' forward floors over ``2 pp`` (the largest chunk forward is at
        least the average; the last rank's lag has the path ``(pp - 1) F``,
        :func:`nest.cost.pipeline.zb_v_lag_coefficients`), ``E >= 0``, and ``O`` without the
        tied copy (rank 0 holds the embedding and the head); DualPipeV ``m C / pp + O`` (module
        docstring)."""
        pp = f.pp
        forwards = sf.base_sum_s - self._backward_floor_s(sf)
        opt_d, opt_x = self.per_param(f, zero, offload.optimizer).optimizer_s
        optimizer = (opt_d * sf.dense_sum + opt_x * sf.expert_sum) / pp
        if kind is Schedule.DUALPIPE_V:  # the average rank's compute, m times
            return f.m * sf.compute_sum_s / pp + optimizer, 0.0, 0.0
        return f.m * top + (pp - 1) * forwards / (2 * pp) + optimizer, 0.0, 0.0

    def _backward_floor_s(self, sf: ShardFloors) -> float:
        """The sum of the layers' backward floors (``ShardFloors.bwd_s``), cached per shard;
        the rest of the layer floors, ``base_sum_s`` less this, floors the forwards."""
        key = ("one stage backward", id(sf))
        bf = self._min_cache.get(key)
        if bf is None:
            bf = self._min_cache[key] = float(sf.bwd_s.sum())
        return bf

    @staticmethod
    def _stage_floors(sf: ShardFloors, pp: int, zd, zx, z3: float, zero: int):
        """1F1B: the floors of the stages' sum (``S``) and of the largest stage (``M``) with the
        ZeRO terms (``zd, zx`` per parameter, ``z3`` per stage; module docstring)."""
        total = sf.base_sum_s + zd * sf.dense_sum + zx * sf.expert_sum
        total += 2 * (pp - 1) * sf.p2p_s
        total += pp * z3
        if zero < 3:
            largest = sf.base_max_s
        else:
            largest = max(b + zd * d + zx * x for b, d, x in sf.kinds) + z3
        return total, max(total / pp, largest)

    def _interleaved_rank_floors(self, sf: ShardFloors, pp: int, v: int, zd, zx, z3: float):
        """Per rank of the interleaved partition its floor with the ZeRO terms (``zd, zx`` per
        parameter, ``z3`` per chunk), their sum and largest, and rank 0's dense and expert
        parameters (shared by the families of one shard and partition)."""
        key = ("interleaved floors", id(sf), pp, v, zd, zx, z3)
        got = self._min_cache.get(key)
        if got is None:
            base, dense, expert = self._interleaved_ranks(sf, pp, v)
            ranks = [
                b + zd * d + zx * x + v * z3 for b, d, x in zip(base, dense, expert, strict=True)
            ]
            got = self._min_cache[key] = (ranks, sum(ranks), max(ranks), dense[0], expert[0])
        return got

    def _one_stage_exposed_s(self, f: Family, sf: ShardFloors, zero: int) -> float:
        """1F1B with one pipeline rank, ZeRO below 3, gradient sync overlapped: a floor of the
        exposed sync that may be added to ``m F + O``.

        Proof. With ``pp = 1``, ``T = m t + E + O`` (``S = M = t``) and ``E = max(0, s' - b)``
        with ``s' >= s`` the rank's sync (all parameters, floor groups: the module docstring)
        and ``b`` its own backward (:func:`nest.cost.pipeline.rank_exposed_sync_s`). Its
        forward ``t - b`` takes at least ``F - bf`` (``F`` the sum of the layer floors, ``bf``
        the sum of their backward parts ``ShardFloors.bwd_s``; the rest of each layer floor is
        its forward's) and ``b >= bf``, so ``T - O >= m (F - bf) + h(b)`` with
        ``h(b) = m b + max(0, s - b)``, non-decreasing (slope ``m - 1 >= 0`` below ``s``):
        ``h(b) >= h(bf)``, i.e. ``T >= m F + max(0, s - bf) + O``."""
        bf = self._backward_floor_s(sf)
        return max(0.0, self._sync_raw_s(f, [sf.dense_sum], [sf.expert_sum], zero) - bf)

    def _overlap_sync_bound_s(self, f: Family, sf: ShardFloors, ranks, zero: int, v: int):
        """Interleaved, ZeRO below 3, gradient sync overlapped: a floor of ``T - O`` that
        counts rank 0's exposed sync (the optimizer floor is added by the caller).

        Proof. Rank 0 holds fixed chunks, so its parameters are fixed and its sync takes at
        least ``s0`` (:meth:`ModelState.sync_s` on the floor groups, monotone in bytes, as in
        the module docstring). Its exposed sync is ``max(0, s0' - b_0)`` with ``s0' >= s0`` its
        sync and ``b_0`` the backward of its first chunk (chunk 0: nothing before it hides it,
        :func:`nest.cost.pipeline.rank_exposed_sync_s`), so ``E >= max(0, s0 - b_0)``. Its
        time is ``t_0 = (t_0 - b_0) + b_0`` with ``t_0 - b_0 >= F0m = F_0 - b0f`` (``F_0`` its
        rank floor, the sum of per-layer and p2p floors; ``b0f`` the sum of chunk 0's per-layer
        backward floors ``ShardFloors.bwd_s``, which are the backward part of each layer's
        floor, so ``F_0 - b0f`` is the floor of the rest of rank 0's work) and ``b_0 >= b0f``.
        The other ranks take at least their floors (sum ``Fo``, largest ``Mo``). Every term of
        ``T = S / v + (m - 1/v) M + E + O`` is non-decreasing in each rank's time, so for the
        plan's ``b = b_0``: ``T - O >= g(b) = (Fo + F0m + b) / v + (m - 1/v) max(Mo, F0m + b)
        + max(0, s0 - b)``. ``g`` is convex and piecewise linear in ``b``, so its least value
        over ``b >= b0f`` is at ``b0f`` or at a breakpoint above it (``s0``, ``Mo - F0m``):
        the minimum of ``g`` over those is a floor of ``T - O``. (ZeRO below 3: the floors
        hold no ZeRO-3 traffic, which would not split by direction this way.)"""
        pp, m = f.pp, f.m
        # what depends on the shard and the partition only (ZeRO 0-2: no ZeRO-3 floor in ranks)
        key = ("rank 0 exposure", id(sf), pp, v)
        got = self._min_cache.get(key)
        if got is None:
            i, j = interleaved_chunks(len(sf.base_s), pp, v)[0]
            b0f = float(sf.bwd_s[i : j + 1].sum())
            others = ranks[1:]
            _, dense, expert = self._interleaved_ranks(sf, pp, v)
            got = self._min_cache[key] = (
                b0f,
                ranks[0] - b0f,
                sum(others),
                max(others, default=0.0),
                dense,
                expert,
            )
        b0f, f0m, fo, mo, dense, expert = got
        s0 = self._sync_raw_s(f, dense, expert, zero)
        best = float("inf")
        for b in (b0f, s0, mo - f0m):
            if b >= b0f:
                g = (fo + f0m + b) / v + (m - 1 / v) * max(mo, f0m + b) + max(0.0, s0 - b)
                best = min(best, g)
        return best

    def _sync_raw_s(self, f: Family, dense, expert, zero: int) -> float:
        """Least gradient part of the DP sync of a rank holding ``dense[0]`` dense and
        ``expert[0]`` expert parameters, overlap or not: :meth:`ModelState.reduce_s` on the
        floor groups. The exposed sync is ``max(0, reduce - hidden [- own]) + g`` with ``g >= 0``
        the exposed weight all-gather (:func:`nest.cost.pipeline.rank_exposed_sync_s`), so
        ``max(0, reduce - hidden [- own])`` bounds it from below, as the proofs that use this
        need."""
        nd = f.dp * f.cp
        key = ("sync raw", dense[0], expert[0], nd, nd * f.fold // f.ep, zero > 0, f.cp)
        key += (f.zero_shard, f.tp)
        got = self._min_cache.get(key)
        if got is None:
            groups = self.family_groups(f, with_latency=True)
            state = self.state(f, zero)
            got = self._min_cache[key] = float(state.reduce_s(groups, dense[0], expert[0]))
        return got

    def _interleaved_ranks(self, sf: ShardFloors, pp: int, v: int):
        """Per rank of the fixed interleaved partition: base floor (p2p included), dense and
        expert parameters."""
        key = ("interleaved", id(sf), pp, v)
        got = self._min_cache.get(key)
        if got is None:
            n = len(sf.base_s)
            prefix = self._min_cache.get(("prefix", id(sf)))
            if prefix is None:
                prefix = tuple(
                    np.concatenate([[0.0], np.cumsum(a)]).tolist()
                    for a in (sf.base_s, sf.dense, sf.expert)
                )
                self._min_cache[("prefix", id(sf))] = prefix
            base, dense, expert = [0.0] * pp, [0.0] * pp, [0.0] * pp
            n_chunks = pp * v
            for k, (i, j) in enumerate(interleaved_chunks(n, pp, v)):
                r = k % pp
                base[r] += prefix[0][j + 1] - prefix[0][i]
                base[r] += sf.p2p_s * ((k + 1 < n_chunks) + (k > 0))
                dense[r] += prefix[1][j + 1] - prefix[1][i]
                expert[r] += prefix[2][j + 1] - prefix[2][i]
            got = self._min_cache[key] = (base, dense, expert)
        return got

    def memory_floor_bytes(
        self,
        family: Family,
        zero: int,
        schedule: tuple[Schedule, int],
        offload: Offload = NO_OFFLOAD,
    ) -> float:
        """No plan of these configurations needs less per-device memory at its peak rank
        (module docstring: the average over ranks, the rank holding the worst single layer, and
        the fixed ranks of an interleaved partition). With activation offload the stored
        activations are counted as 0 (the blocks keep none on the device; the embedding's and
        the head's are left out, which only lowers the floor) and the transients without the
        offload buffer (which only adds to them)."""
        sf = self._shard_of(family)
        pp = family.pp
        f = family
        per_param = self.per_param(f, zero, offload.optimizer)
        kept = 0.0 if offload.activations else 1.0  # stored activations on the device
        per_d, per_x = per_param.state_bytes
        gathered_d, gathered_x = per_param.gathered_bytes
        reserve_bytes = self.cluster.device.memory_reserve_bytes
        kind, v = schedule
        if kind is Schedule.INTERLEAVED:
            dense, expert, act, transient = self._interleaved_memory(sf, pp, v)
            worst = 0.0
            for r in range(pp):
                flight = in_flight_microbatches(r, pp, family.m, kind, v)
                need = per_d * dense[r] + per_x * expert[r] + kept * flight * act[r] + transient[r]
                worst = max(worst, need)
            return worst + reserve_bytes
        # ZB-V's rank 0 holds the embedding and the head: no tied copy
        tied = sf.tied_copy if pp > 1 and not kind.v_shaped else 0.0
        total = per_d * (sf.dense_sum + tied) + per_x * sf.expert_sum
        total += kept * float(sf.act_min.sum())
        single = max(
            per_d * d + per_x * x + kept * a + t + gathered_d * d + gathered_x * x
            for d, x, a, t in sf.mem_kinds
        )
        return max(total / pp, single) + reserve_bytes

    def _interleaved_memory(self, sf: ShardFloors, pp: int, v: int):
        """Per rank of the interleaved partition: dense (with the tied copy), expert, least
        stored activations, least largest transient."""
        key = ("interleaved memory", id(sf), pp, v)
        got = self._min_cache.get(key)
        if got is None:
            dense, expert, act, transient = [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
            chunks = interleaved_chunks(len(sf.base_s), pp, v)
            for k, (i, j) in enumerate(chunks):
                r = k % pp
                dense[r] += float(sf.dense[i : j + 1].sum())
                expert[r] += float(sf.expert[i : j + 1].sum())
                act[r] += float(sf.act_min[i : j + 1].sum())
                transient[r] = max(transient[r], float(sf.transient_min[i : j + 1].max()))
            dense[pp - 1] += sf.tied_copy  # the head's chunk is on the last rank
            got = self._min_cache[key] = (dense, expert, act, transient)
        return got
