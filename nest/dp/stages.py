"""Stage costs of one configuration, as interval queries over the layer chain.

For a fixed :class:`~nest.core.plan.ParallelConfig`, the shared evaluator's time and memory of a
pipeline rank depend only on the rank ``r``, its first and last layer ``i..j`` and its recompute
mode. :class:`StageModel` tabulates the cost model's per-layer terms as prefix sums (and range
maxima) so that ``stage(r, i, j, mode)`` returns the forward, backward, DP-sync, optimizer and
memory numbers :func:`nest.cost.evaluate` computes for that stage, with the same term functions
(only the summation order differs; a test checks the two on random plans):

- compute, recompute and hardware terms per layer: :mod:`nest.cost.compute`;
- a collective axis: per group split of the rank, the layers' :func:`collectives_time_s` summed
  over the interval (prefix sums per split), then the slowest split
  (:meth:`~nest.cost.groups.RankGroups.axis_time_s` reordered);
- ZeRO-3 traffic with FSDP's prefetch overlap: :class:`nest.cost.fsdp.OverlapChain` of the
  rank's layers (:meth:`StageModel.zero3_chain`), read on the interval;
- DP sync, optimizer step and model-state bytes: :class:`nest.cost.state.ModelState` on the
  rank's :class:`~nest.cost.groups.RankGroups`;
- p2p at the slowest device pair of the neighbouring ranks:
  :func:`nest.cost.collectives.pair_p2p_time_s`;
- memory: :func:`nest.cost.memory.rank_memory_bytes` of the interval's stored bytes and the range
  maximum of its layers' :func:`~nest.cost.memory.peak_bytes`.
"""

import functools
from dataclasses import dataclass, fields

import numpy as np

from nest.core.axes import Axis, GroupKind, LayerKind, Recompute
from nest.core.errors import UserError
from nest.core.plan import ParallelConfig, chunk_rank, group_arrays, place
from nest.core.problem import Problem
from nest.cost.collectives import p2p_classes, pair_p2p_time_s
from nest.cost.compute import bwd_collectives, fwd_collectives, hiding_bwd_s, recompute_s
from nest.cost.groups import (
    AXES,
    RankGroups,
    collectives_time_s,
    split_forms,
    translated,
)
from nest.cost.memory import (
    host_bytes,
    peak_bytes,
    rank_memory_bytes,
    resident_bytes,
    stored_bytes,
)
from nest.cost.offload import offload_exposed_s
from nest.cost.pipeline import gather_exposed_s, in_flight_microbatches
from nest.cost.state import ModelState
from nest.dp.bounds import Floors
from nest.dp.space import interleaved_chunks

MODES = tuple(Recompute)

PLACED_FLOOR_IGNORES = frozenset(
    {"zero_stage", "schedule", "virtual_stages", "optimizer_offload", "activation_offload"}
)
"""The :class:`~nest.core.plan.ParallelConfig` fields :meth:`StageModel.placed_floor_s` does
not read (its key keeps ``zero_stage >= 3``, which decides the ZeRO-3 floor)."""

CHUNK_IGNORES = frozenset({"zero_stage", "optimizer_offload"})  # activation offload: read
"""The fields :meth:`StageModel.chunk_costs` does not read (its key keeps ``zero_stage >= 3``:
ZeRO-3's traffic and gathered weights; stages 0-2 differ only in state bytes and sync; the
optimizer offload changes only the state bytes and the optimizer step)."""

POOLED_KNOWN = frozenset(
    {
        "tp",
        "cp",
        "ep",
        "dp",
        "pp",
        "microbatch_size",
        "zero_stage",
        "schedule",
        "virtual_stages",
        "rank_order",
        "optimizer_offload",
        "activation_offload",
        "zero_shard",
    }
)
"""The :class:`~nest.core.plan.ParallelConfig` fields :meth:`StageModel._pooled_key` accounts
for (through the degrees and strides, or as irrelevant to the groups: ``zero_shard`` changes only
the data-parallel groups); any other field enters its key as it is."""


def config_key(config: ParallelConfig, ignored: frozenset) -> tuple:
    """``(name, value)`` of every field of ``config`` but ``ignored``: a cache key that takes in
    any field added to the configuration unless it is declared irrelevant."""
    return tuple((f.name, getattr(config, f.name)) for f in fields(config) if f.name not in ignored)


@dataclass(frozen=True, slots=True)
class StageTerms:
    fwd_s: float
    bwd_s: float
    sync_s: float
    optimizer_s: float
    memory_bytes: float
    fits: bool
    gather_exposed_s: float = 0.0
    """The rank's exposed ZeRO-1/2 weight all-gather (:func:`nest.cost.pipeline.gather_exposed_s`
    under this stage's forward); ``sync_s`` is the gradient part."""


def prefix(values) -> np.ndarray:
    """``out[i] = sum(values[:i])`` (so a range ``i..j`` sums to ``out[j + 1] - out[i]``)."""
    return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])


def range_max(values) -> np.ndarray:
    """``out[i, j] = max(values[i..j])`` (``-inf`` for ``j < i``)."""
    arr = np.asarray(values, dtype=float)
    n = len(arr)
    table = np.full((n, n), -np.inf)
    for i in range(n):
        table[i, i:] = np.maximum.accumulate(arr[i:])
    return table


@dataclass(frozen=True, slots=True)
class ChainTerms:
    """The chain's per-layer terms for one shard and one state sharding, as prefix sums (times
    in seconds, parameters as counts, activations in bytes) and per-mode range maxima of the
    layers' peak bytes; every search of the shard shares them."""

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    wgrad_s: np.ndarray
    """The weight-gradient part of ``bwd_s`` (:attr:`~nest.core.layers.LayerCost.wgrad_s`)."""
    dense_params: np.ndarray
    expert_params: np.ndarray
    recompute_s: dict
    stored_bytes: dict
    peak_bytes: dict
    boundary_bytes: np.ndarray
    resident_bytes: np.ndarray
    host_bytes: dict
    """Per mode, prefix sums of the bytes activation offload copies to host memory per
    microbatch (zeros without it)."""

    @classmethod
    def build(cls, costs, is_block, state: ModelState, offload: bool = False) -> "ChainTerms":
        """``offload``: activation offload (:mod:`nest.cost.memory`)."""
        pairs = list(zip(costs, is_block, strict=True))
        return cls(
            fwd_s=prefix([x.fwd_s for x in costs]),
            bwd_s=prefix([x.bwd_s for x in costs]),
            wgrad_s=prefix([x.wgrad_s for x in costs]),
            dense_params=prefix([x.dense_params for x in costs]),
            expert_params=prefix([x.expert_params for x in costs]),
            recompute_s={md: prefix([recompute_s(x, md, b) for x, b in pairs]) for md in MODES},
            stored_bytes={
                md: prefix([stored_bytes(x, md, b, offload) for x, b in pairs]) for md in MODES
            },
            peak_bytes={
                md: range_max([peak_bytes(x, md, b, state, offload) for x, b in pairs])
                for md in MODES
            },
            boundary_bytes=np.array([x.boundary_bytes for x in costs], dtype=float),
            resident_bytes=prefix([resident_bytes(x, state) for x in costs]),
            host_bytes={
                md: prefix([host_bytes(x, md, b, offload) for x, b in pairs]) for md in MODES
            },
        )


def _refuse_partial_offload(config: ParallelConfig) -> None:
    """The DP's stage model offloads every block's activations or none: a partial count is a
    one-line error (it is scored by :func:`nest.cost.evaluate`, not searched)."""
    if config.activation_offload_blocks is not None:
        raise UserError(
            "the DP's stage model offloads every block's activations or none "
            f"(activation_offload_blocks={config.activation_offload_blocks}); score a "
            "partial offload with nest.cost.evaluate"
        )


class StageModel:
    """Interval costs of one configuration (see the module docstring)."""

    def __init__(
        self,
        problem: Problem,
        config: ParallelConfig,
        shared: dict | None = None,
        grid: np.ndarray | None = None,
    ) -> None:
        """``grid``: an explicit placement ``[pp][dp][cp][tp] -> device`` (the general mode of
        the exact planners); None places the ranks by ``config.rank_order``. ``shared``: a
        dict that searches over one problem pass to every stage model, to share what does not
        depend on the whole configuration."""
        _refuse_partial_offload(config)
        self.problem, self.config = problem, config
        cluster, training, model = problem.cluster, problem.training, problem.model
        c = config
        self.m = c.num_microbatches(training.global_batch)
        self.shard = shard = c.shard(training.sequence_parallel)
        self._shared = shared if shared is not None else {}
        costs = self._shared.get(("costs", shard))
        if costs is None:
            costs = [model.layer_cost(ref, shard, cluster.device) for ref in model.chain]
            self._shared[("costs", shard)] = costs
        self.costs = costs
        self.n_layers = n = len(costs)
        is_block = self._shared.get("is_block")
        if is_block is None:
            is_block = self._shared["is_block"] = [
                ref.kind is LayerKind.BLOCK for ref in model.chain
            ]
        self.is_block = is_block
        self.head_index = n - 1
        self.tied_copy_params = costs[-1].tied_copy_params
        self.state = ModelState.of(
            problem,
            zero_stage=c.zero_stage,
            dp=c.dp,
            cp=c.cp,
            ep=c.ep,
            fold=c.expert_fold,
            optimizer_offload=c.optimizer_offload,
            zero_shard=c.zero_shard,
        )
        # the state bytes are linear in the parameters (ModelState): their two coefficients
        self._state_per_param = self.state.state_bytes_per_param()
        # the shard holds etp; the ZeRO-3 shard group's size decides the gathered bytes
        key = ("chain", shard, c.zero_stage >= 3, c.dp * c.cp, c.ep)
        key += (c.activation_offload, c.zero_shard)
        if key not in self._shared:
            self._shared[key] = ChainTerms.build(
                costs, self.is_block, self.state, c.activation_offload
            )
        self.chain: ChainTerms = self._shared[key]
        # groups and p2p levels depend on the placement only: shared across microbatch sizes,
        # ZeRO stages and schedules
        if grid is None:
            placement = (
                "placement", c.tp, c.cp, c.dp, c.pp, c.ep, c.etp, c.rank_order, c.zero_shard
            )  # fmt: skip
        else:
            grid = np.asarray(grid, dtype=np.int64)
            placement = ("grid", c.ep, c.etp, c.zero_shard, grid.shape, grid.tobytes())
        if placement not in self._shared:
            if grid is None:
                grid = place(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp, rank_order=c.rank_order)
            groups = [self._rank_groups(grid[r], c.ep, c.etp, c.zero_shard) for r in range(c.pp)]
            self._shared[placement] = (grid, groups, {})
        self.grid, self.groups, self._levels = self._shared[placement]
        self._placement = placement
        self._rank_cache: dict = {}
        self.in_flight = [
            in_flight_microbatches(r, c.pp, self.m, c.schedule, c.virtual_stages)
            for r in range(c.pp)
        ]
        device = cluster.device
        self.capacity_bytes = device.hbm_bytes
        self.reserve_bytes = device.memory_reserve_bytes
        self.hbm_bw_bytes_per_s = device.achieved_hbm_bw_bytes_per_s
        self.overlap = training.overlap_grad_sync

    def _rank_groups(
        self, devices: np.ndarray, ep: int, etp: int | None, zero_shard: int | None = None
    ) -> RankGroups:
        """The groups of one rank's devices, shared by every rank (of any placement) whose
        devices are the same up to a move the cost model cannot see
        (:func:`nest.cost.groups.translated`), so their level splits are computed once."""
        devices = translated(devices, self.problem.cluster)
        key = ("rank_groups", ep, etp, zero_shard, devices.shape, devices.tobytes())
        if key not in self._shared:
            self._shared[key] = RankGroups(devices, ep, self.problem.cluster, etp, zero_shard)
        return self._shared[key]

    # ------------------------------------------------------------ collectives per split
    def _axis_prefix(self, axis: str, split, direction: str, mode: Recompute) -> np.ndarray:
        """Prefix sums over the chain of one axis' collective seconds on one group split; they
        depend on the shard only, so all stage models of a search share them."""
        key = (self.shard, axis, split, direction, mode)
        got = self._shared.get(key)
        if got is None:
            forms = split_forms(split, self.problem.cluster)
            per_cost: dict = {}
            vals = []
            for x, blk in zip(self.costs, self.is_block, strict=True):
                v = per_cost.get((id(x), blk))
                if v is None:
                    colls = (
                        fwd_collectives(x) if direction == "f" else bwd_collectives(x, mode, blk)
                    )
                    v = collectives_time_s([(cl, 1) for cl in colls], axis, forms)
                    per_cost[(id(x), blk)] = v
                vals.append(v)
            got = prefix(vals)
            self._shared[key] = got
        return got

    def comm_prefixes(self, r: int, direction: str, mode: Recompute) -> list[list[np.ndarray]]:
        """Per axis with groups, the prefix arrays of each level split of rank ``r``'s groups."""
        key = (r, direction, mode)
        got = self._rank_cache.get(key)
        if got is None:
            g = self.groups[r]
            got = [
                [self._axis_prefix(axis, f, direction, mode) for f in g.splits(axis)]
                for axis in AXES
                if g.splits(axis)
            ]
            self._rank_cache[key] = got
        return got

    def _comm_s(self, r: int, i: int, j: int, direction: str, mode: Recompute) -> float:
        total = 0.0
        for splits in self.comm_prefixes(r, direction, mode):
            total += max(pre[j + 1] - pre[i] for pre in splits)
        return total

    # ------------------------------------------------------------ the stage
    def params(self, r: int, i: int, j: int) -> tuple[float, float, float]:
        """(dense, expert, dense with the tied-embedding copy) parameters of a stage."""
        ch = self.chain
        dense = ch.dense_params[j + 1] - ch.dense_params[i]
        expert = ch.expert_params[j + 1] - ch.expert_params[i]
        tied = self.tied_copy_params if j == self.head_index and r != 0 else 0.0
        return dense, expert, dense + tied

    def state_bytes(self, dense, expert):
        """:meth:`ModelState.state_bytes` through its per-parameter coefficients (scalars or
        rows; the search's hot path)."""
        per_dense, per_expert = self._state_per_param
        return dense * per_dense + expert * per_expert

    def stored_bytes(self, i: int, j: int, mode: Recompute) -> float:
        """Activation bytes layers ``i..j`` keep per microbatch in ``mode``."""
        pre = self.chain.stored_bytes[mode]
        return pre[j + 1] - pre[i]

    def memory_bytes(self, r: int, i: int, j: int, mode: Recompute) -> float:
        """Per-device memory of 1F1B stage ``r`` holding layers ``i..j``."""
        _, expert, dense = self.params(r, i, j)
        resident = self.chain.resident_bytes[j + 1] - self.chain.resident_bytes[i]
        return rank_memory_bytes(
            self.state_bytes(dense, expert) + resident,
            self.stored_bytes(i, j, mode),
            self.in_flight[r],
            self.chain.peak_bytes[mode][i, j],
            self.reserve_bytes,
        )

    def memory_from(self, r: int, i: int, mode: Recompute) -> np.ndarray:
        """Memory of 1F1B stage ``r`` holding layers ``i..j``, for every ``j >= i`` at once
        (the terms of :meth:`memory_bytes` on arrays)."""
        ch, n = self.chain, self.n_layers
        dense = ch.dense_params[i + 1 :] - ch.dense_params[i]
        if r != 0:
            dense = dense.copy()
            dense[-1] += self.tied_copy_params  # the head (last layer) brings the tied copy
        expert = ch.expert_params[i + 1 :] - ch.expert_params[i]
        resident = ch.resident_bytes[i + 1 :] - ch.resident_bytes[i]
        return rank_memory_bytes(
            self.state_bytes(dense, expert) + resident,
            ch.stored_bytes[mode][i + 1 :] - ch.stored_bytes[mode][i],
            self.in_flight[r],
            ch.peak_bytes[mode][i, i:n],
            self.reserve_bytes,
        )

    def block_span(self, i: int, j: int) -> tuple[int, int]:
        """``(b0, nb)``: the first block of layers ``i..j`` and how many blocks they hold (the
        chain's blocks are contiguous: embedding, blocks, head)."""
        first = self._shared.get("first_block")
        if first is None:
            blocks = np.flatnonzero(self.is_block)
            first = self._shared["first_block"] = (int(blocks[0]), int(blocks[-1]))
        b0 = max(i, first[0])
        return b0, max(0, min(j, first[1]) - b0 + 1)

    def block_memory(self, r: int, i: int, j: int, base: Recompute) -> np.ndarray:
        """Memory of 1F1B stage ``r`` holding ``i..j`` with its first ``k`` blocks fully
        recomputed and the rest in ``base``, for ``k = 1 .. nb - 1`` (index ``k - 1``): the
        terms of :meth:`memory_bytes` with the stored bytes of the mix and the largest of
        the full blocks' and the other layers' transients."""
        ch, full = self.chain, Recompute.FULL
        b0, nb = self.block_span(i, j)
        ks = np.arange(1, nb)
        cut = b0 + ks  # first layer past the fully recomputed blocks
        stored_c, stored_f = ch.stored_bytes[base], ch.stored_bytes[full]
        stored = (stored_c[j + 1] - stored_c[cut]) + (stored_f[cut] - stored_f[b0])
        if b0 > i:
            stored = stored + (stored_c[b0] - stored_c[i])
        peak = np.maximum(ch.peak_bytes[full][b0, b0 : b0 + nb - 1], ch.peak_bytes[base][cut, j])
        if b0 > i:
            peak = np.maximum(peak, ch.peak_bytes[base][i, b0 - 1])
        _, expert, dense = self.params(r, i, j)
        resident = ch.resident_bytes[j + 1] - ch.resident_bytes[i]
        return rank_memory_bytes(
            self.state_bytes(dense, expert) + resident,
            stored,
            self.in_flight[r],
            peak,
            self.reserve_bytes,
        )

    def block_monotone(self, r: int, base: Recompute) -> bool:
        """Whether every block's full recompute costs at least its ``base`` recompute, in
        seconds and in each split's backward collectives on rank ``r``: then a stage's time is
        non-decreasing in its fully recomputed blocks ``k`` (:mod:`nest.dp.recurrence`)."""
        key = ("block monotone", r, base)
        got = self._rank_cache.get(key)
        if got is None:
            ch, full, tol = self.chain, Recompute.FULL, 1e-15
            diffs = [np.diff(ch.recompute_s[full]) - np.diff(ch.recompute_s[base])]
            for sf, sc in zip(
                self.comm_prefixes(r, "b", full), self.comm_prefixes(r, "b", base), strict=True
            ):
                diffs += [np.diff(pf) - np.diff(pc) for pf, pc in zip(sf, sc, strict=True)]
            got = self._rank_cache[key] = all(bool((d >= -tol).all()) for d in diffs)
        return got

    def fits_from(self, r: int, i: int, mode: Recompute) -> np.ndarray:
        """Whether stage ``r`` holding ``i..j`` fits, for every ``j >= i``."""
        return self.memory_from(r, i, mode) <= self.capacity_bytes

    def least_memory_from(self, r: int, i: int, allowed) -> np.ndarray:
        """The least memory over the allowed modes (``none`` where ``i..j`` has no block) of
        stage ``r`` holding ``i..j``, for every ``j >= i``."""
        has_block = np.cumsum(self.is_block[i:]) > 0
        least = np.min([self.memory_from(r, i, mode) for mode in allowed], axis=0)
        return np.where(has_block, least, self.memory_from(r, i, Recompute.NONE))

    def p2p_levels(self, a: int, b: int) -> list:
        """Levels the devices of pipeline ranks ``a`` and ``b`` share, pair by pair (cost
        classes on a graph: :func:`nest.cost.collectives.p2p_classes`, the same either way)."""
        key = (a, b) if a < b else (b, a)
        got = self._levels.get(key)
        if got is None:
            got = p2p_classes(self.problem.cluster, self.grid[a], self.grid[b])
            self._levels[key] = got
        return got

    def chunk_times(
        self, r: int, i: int, j: int, mode: Recompute, prev: int | None, nxt: int | None
    ) -> tuple[float, float]:
        """Forward and backward seconds of layers ``i..j`` on rank ``r`` (one stage or chunk)
        whose neighbours run on ranks ``prev`` and ``nxt`` (None: no neighbour)."""
        ch, cluster = self.chain, self.problem.cluster
        fwd = (ch.fwd_s[j + 1] - ch.fwd_s[i]) + self._comm_s(r, i, j, "f", mode)
        bwd = (
            (ch.bwd_s[j + 1] - ch.bwd_s[i])
            + (ch.recompute_s[mode][j + 1] - ch.recompute_s[mode][i])
            + self._comm_s(r, i, j, "b", mode)
        )
        if self.state.zero_stage >= 3:
            z3 = self.zero3_chain(r, mode)
            fwd += float(z3.fwd_s(i, j))
            bwd += float(z3.bwd_s(i, j))
        bwd += self.offload_exposed_s(i, j, mode)
        if nxt is not None:
            fwd += pair_p2p_time_s(ch.boundary_bytes[j], self.p2p_levels(r, nxt), cluster)
        if prev is not None:
            bwd += pair_p2p_time_s(ch.boundary_bytes[i - 1], self.p2p_levels(r, prev), cluster)
        return fwd, bwd

    def offload_exposed_s(self, i: int, j, mode: Recompute):
        """Activation offload: the copies of layers ``i..j`` (``j`` a scalar or an array of last
        layers) their compute does not hide (:func:`nest.cost.offload.offload_exposed_s`); 0
        without offload."""
        if not self.config.activation_offload:
            return 0.0 * np.asarray(j)
        ch = self.chain
        moved = ch.host_bytes[mode][np.asarray(j) + 1] - ch.host_bytes[mode][i]
        fwd = ch.fwd_s[np.asarray(j) + 1] - ch.fwd_s[i]
        bwd = (ch.bwd_s[np.asarray(j) + 1] - ch.bwd_s[i]) + (
            ch.recompute_s[mode][np.asarray(j) + 1] - ch.recompute_s[mode][i]
        )
        return offload_exposed_s(
            moved, fwd, bwd, self.problem.cluster.device.host_link_bw_bytes_per_s
        )

    def zero3_chain(self, r: int, mode: Recompute, first: int = 0, full_blocks: int = 0):
        """Rank ``r``'s per-layer ZeRO-3 overlap terms over the whole chain with its blocks in
        ``mode`` (:meth:`ModelState.zero3_chain`; a stage ``i..j`` reads its interval); with
        ``full_blocks``, the first that many blocks from layer ``first`` fully recomputed (each
        layer's backward hides under its own recomputation:
        :func:`nest.cost.compute.hiding_bwd_s`)."""
        key = ("zero3", r, mode)
        got = self._rank_cache.get(key)
        if got is None:
            hiding = [
                hiding_bwd_s(x, mode, b) for x, b in zip(self.costs, self.is_block, strict=True)
            ]
            got = self._rank_cache[key] = self.state.zero3_chain(
                self.groups[r],
                [x.dense_params for x in self.costs],
                [x.expert_params for x in self.costs],
                [x.fwd_s for x in self.costs],
                hiding,
            )
        if not full_blocks:
            return got
        b0 = self.block_span(first, self.n_layers - 1)[0]
        full = range(b0, b0 + full_blocks)
        hiding = got.bwd_compute_s.copy()
        hiding[b0 : b0 + full_blocks] = [
            hiding_bwd_s(self.costs[k], Recompute.FULL, bool(self.is_block[k])) for k in full
        ]
        return self.state.zero3_chain(
            self.groups[r],
            [x.dense_params for x in self.costs],
            [x.expert_params for x in self.costs],
            [x.fwd_s for x in self.costs],
            hiding,
        )

    def rank_sync_opt(self, r: int, dense, expert) -> tuple:
        """The DP sync's gradient part, the optimizer step and the sync's weight all-gather,
        seconds, of a rank holding these parameters (dense with the tied copy; scalars or
        arrays): :meth:`ModelState.reduce_s`, :meth:`ModelState.optimizer_step_s`,
        :meth:`ModelState.gather_s`."""
        g = self.groups[r]
        return (
            self.state.reduce_s(g, dense, expert),
            self.state.optimizer_step_s(dense, expert, self.hbm_bw_bytes_per_s),
            self.state.gather_s(g, dense, expert),
        )

    def first_chunk_gather_exposed_s(self, r: int, gather) -> float:
        """Interleaved and V-shaped ranks: the exposed part of rank ``r``'s weight all-gather
        under the forward of its first chunk, chunk ``r``
        (:func:`nest.cost.pipeline.gather_exposed_s`); a forward depends on no recompute mode
        below ZeRO-3, and ZeRO-0 and ZeRO-3 have no such gather (0)."""
        if self.state.zero_stage not in (1, 2):
            return 0.0
        c = self.config
        mode = next(iter(self.chain.recompute_s))
        if c.schedule.v_shaped:
            fwd = self.v_chunk_terms(r, mode)[0]
        else:
            i, j = self.chunks[r]
            pp = c.pp
            prev = (r - 1) % pp if r > 0 else None
            nxt = (r + 1) % pp if r < len(self.chunks) - 1 else None
            fwd = self.chunk_times(r, i, j, mode, prev, nxt)[0]
        return float(gather_exposed_s(gather, fwd, self.overlap))

    @functools.cached_property
    def chunks(self) -> list[tuple[int, int]]:
        """Interleaved configurations: the space's fixed chunks (:func:`interleaved_chunks`),
        chunk ``k`` on rank ``k % pp``."""
        return interleaved_chunks(self.n_layers, self.config.pp, self.config.virtual_stages)

    def chunk_terms(self, k: int, mode: Recompute) -> tuple[float, float, float, float]:
        """Interleaved chunk ``k`` in ``mode``: ``(fwd + bwd, bwd, stored activation bytes,
        largest transient bytes)`` on its rank, its neighbours the ranks of chunks ``k - 1``
        and ``k + 1`` (the terms the interleaved DP and the exact tables price per chunk)."""
        pp, chunks = self.config.pp, self.chunks
        i, j = chunks[k]
        prev = (k - 1) % pp if k > 0 else None
        nxt = (k + 1) % pp if k < len(chunks) - 1 else None
        fwd, bwd = self.chunk_times(k % pp, i, j, mode, prev, nxt)
        return fwd + bwd, bwd, self.stored_bytes(i, j, mode), self.chain.peak_bytes[mode][i, j]

    def chunk_costs(self, k: int, modes) -> np.ndarray:
        """:meth:`chunk_terms` of chunk ``k`` in each of ``modes``, one row per mode. Shared by
        the configurations that differ only in a ZeRO stage below 3 (those stages change the
        state's sharding, never a chunk's times, stored bytes or transients); the key is the
        placement, the shard, the modes and every configuration field but those
        (:data:`CHUNK_IGNORES`)."""
        c = self.config
        key = (
            "chunk costs",
            self._placement,
            self.shard,
            tuple(modes),
            k,
            config_key(c, CHUNK_IGNORES),
            c.zero_stage >= 3,
        )
        got = self._shared.get(key)
        if got is None:
            got = self._shared[key] = np.array([self.chunk_terms(k, mode) for mode in modes])
            got.flags.writeable = False
        return got

    def v_chunk_terms(self, k: int, mode: Recompute) -> tuple[float, float, float, float, float]:
        """ZB-V chunk ``k`` in ``mode`` on its rank of the V (:func:`nest.core.plan.chunk_rank`):
        ``(fwd, bwd, W pass, stored activation bytes, largest transient bytes)``; no hop to a
        neighbour chunk on the same rank (the V's bottom)."""
        c, chunks = self.config, self.chunks
        i, j = chunks[k]
        r = chunk_rank(k, c.pp, c.schedule)
        prev = chunk_rank(k - 1, c.pp, c.schedule) if k > 0 else None
        nxt = chunk_rank(k + 1, c.pp, c.schedule) if k < len(chunks) - 1 else None
        fwd, bwd = self.chunk_times(
            r, i, j, mode, None if prev == r else prev, None if nxt == r else nxt
        )
        wgrad = float(self.chain.wgrad_s[j + 1] - self.chain.wgrad_s[i])
        return fwd, bwd, wgrad, self.stored_bytes(i, j, mode), self.chain.peak_bytes[mode][i, j]

    def interleaved_rank(self, r: int) -> tuple[float, float, float, float]:
        """Interleaved rank ``r`` holding its chunks ``r, r + pp, ...`` (ZB-V: ``r`` and
        ``2 pp - 1 - r``): ``(DP sync's gradient part, optimizer step, model-state bytes, exposed
        weight all-gather)``, seconds and bytes, fixed by the partition."""
        pp = self.config.pp
        ks = (
            (r, 2 * pp - 1 - r) if self.config.schedule.v_shaped else range(r, len(self.chunks), pp)
        )
        dense = sum(self.params(r, *self.chunks[k])[2] for k in ks)
        expert = sum(self.params(r, *self.chunks[k])[1] for k in ks)
        sync, opt, gather = self.rank_sync_opt(r, dense, expert)
        res = self.chain.resident_bytes
        resident = sum(res[self.chunks[k][1] + 1] - res[self.chunks[k][0]] for k in ks)
        state = self.state_bytes(dense, expert) + resident
        return sync, opt, state, self.first_chunk_gather_exposed_s(r, gather)

    def stage(self, r: int, i: int, j: int, mode: Recompute) -> StageTerms:
        """Terms of 1F1B stage ``r`` holding layers ``i..j``."""
        pp = self.config.pp
        fwd, bwd = self.chunk_times(
            r, i, j, mode, r - 1 if r > 0 else None, r + 1 if r + 1 < pp else None
        )
        _, expert, dense = self.params(r, i, j)
        sync, opt, gather = self.rank_sync_opt(r, dense, expert)
        mem = self.memory_bytes(r, i, j, mode)
        exposed = float(gather_exposed_s(gather, fwd, self.overlap))
        return StageTerms(fwd, bwd, sync, opt, mem, mem <= self.capacity_bytes, exposed)

    def modes_for(self, i: int, j: int, allowed) -> tuple[Recompute, ...]:
        """Recompute modes that differ on this interval (only blocks are recomputed)."""
        if any(self.is_block[i : j + 1]):
            return tuple(allowed)
        return (Recompute.NONE,)

    def placed_floor_s(self, allowed) -> np.ndarray:
        """Prefix sums of per-layer floors that also know this configuration's placement: a
        stage's collectives on an axis cost the slowest of its rank's splits summed over its
        layers, ``max_f sum_l c_fl >= sum_l min_f c_fl``, and every rank's splits are among the
        placement's, so the minimum over all of them per layer is a floor for every rank (with
        the cheapest allowed recompute mode per layer, as :meth:`min_compute_s`). Element-wise
        at least the placement-independent floors (the larger of two floors is a floor)."""
        c = self.config
        # what determines it: the placement (its groups' splits), the shard (the layers' terms),
        # the modes, and the configuration's fields but those it does not read (the schedule,
        # and the ZeRO stage beyond whether it is 3: the ZeRO-3 floor); a field added to
        # ParallelConfig enters the key unless it is listed in PLACED_FLOOR_IGNORES
        key = (
            "placed floor",
            self._placement,
            self.shard,
            tuple(allowed),
            config_key(c, PLACED_FLOOR_IGNORES),
            c.zero_stage >= 3,
        )
        got = self._shared.get(key)
        if got is None:
            base = np.diff(self.min_compute_s(allowed))
            ch, n = self.chain, self.n_layers
            layer = ch.fwd_s[1:] - ch.fwd_s[:-1] + ch.bwd_s[1:] - ch.bwd_s[:-1]
            layer = layer + self._placed_comm_s("f", Recompute.NONE)
            has_block = np.asarray(self.is_block)
            redo = np.full(n, np.inf)
            for mode in allowed:
                rec = ch.recompute_s[mode][1:] - ch.recompute_s[mode][:-1]
                redo = np.minimum(redo, rec + self._placed_comm_s("b", mode))
            none_b = self._placed_comm_s("b", Recompute.NONE)
            layer = layer + np.where(has_block, redo, none_b)
            z3 = self._floors(allowed, True).zero3_floors_s(self.shard, c.dp, c.ep, c.zero_stage)
            got = self._shared[key] = prefix(np.maximum(base, layer + z3))
        return got

    def _placed_comm_s(self, direction: str, mode: Recompute) -> np.ndarray:
        """Per layer, per axis the least over every split of the placement of its collectives
        of one direction, summed over the axes."""
        total = np.zeros(self.n_layers)
        for axis in AXES:
            splits = self._placement_splits(axis)
            if not splits:
                continue
            per = [np.diff(self._axis_prefix(axis, f, direction, mode)) for f in splits]
            total += np.min(per, axis=0)
        return total

    def _placement_splits(self, axis: str) -> tuple:
        """Every split of the groups of ``axis`` over all ranks of the placement (one pass over
        all ranks' groups; shared by the configurations of this placement). On a graph, every
        rank's own cost classes (:meth:`RankGroups.splits`: its groups priced together, sharing
        links only with each other); the level splits of the ranks' groups pooled and moved
        one by one would be neither their costs nor a floor of them."""
        key = ("splits", axis)
        got = self._levels.get(key)
        if got is None:
            pooled = self._pooled_key(axis)
            if pooled is None:
                # the ranks' own splits (cached on their groups): on a hierarchy the same set as
                # pooling all ranks' groups (a split does not change under translation)
                got = tuple(sorted({s for g in self.groups for s in g.splits(axis)}))
            else:
                got = self._shared.get(pooled)
                if got is None:
                    rows = np.concatenate(
                        [
                            group_arrays(self.grid[r], self.config.ep, self.config.etp)[axis]
                            for r in range(len(self.grid))
                        ]
                    )
                    fabric = self.problem.cluster.fabric
                    got = tuple(
                        sorted(set(fabric.group_classes(rows, all_to_all=axis == GroupKind.EP)))
                    )
                    self._shared[pooled] = got
            self._levels[key] = got
        return got

    def _pooled_key(self, axis: str):
        """What the pooled splits of ``axis`` over every rank depend on, on a hierarchy (its
        splits are those of the union of the ranks' groups, and a group's split depends on its
        devices only) with a structured placement (None otherwise: each rank's own splits). The
        placement :func:`~nest.core.plan.place` lays out ``0 .. N - 1`` as mixed-radix digits,
        so the union of the groups of an axis is fixed by ``N``, the degrees of the digits the
        groups run along and their strides: tensor groups are the aligned blocks of ``tp``;
        context groups ``x + s_cp [0, cp)`` over the ``x`` whose context digit is 0; expert
        groups ``ep`` consecutive ``dp x cp`` ranks (context innermost) over the ``x`` whose
        data and context digits are 0. Shared by placements that differ elsewhere (the other
        axes' order, ``pp`` against ``dp`` at the same ``N``)."""
        c = self.config
        if self._placement[0] != "placement" or not self.problem.cluster.fabric.priced_by_levels:
            return None
        degrees = {Axis.TP: c.tp, Axis.CP: c.cp, Axis.DP: c.dp, Axis.PP: c.pp}
        stride, strides = 1, {}
        for a in c.rank_order:
            strides[a] = stride
            stride *= degrees[a]
        if axis == GroupKind.TP:
            shape = (c.tp, strides[Axis.TP])
        elif axis == GroupKind.CP:
            shape = (c.cp, strides[Axis.CP])
        elif axis == GroupKind.EP:
            if c.etp is not None:
                # folded experts (etp 1) run across the tensor digit too: each rank's own splits
                return None
            shape = (c.ep, c.cp, strides[Axis.CP], c.dp, strides[Axis.DP])
        else:
            raise AssertionError(f"pooled splits of {axis}: only the layers' axes {AXES}")
        # any configuration field added later (e.g. an expert tensor degree) enters the key
        return ("pooled splits", axis, stride, shape, config_key(c, POOLED_KNOWN))

    def _floors(self, allowed, aligned_tp: bool) -> Floors:
        key = ("floors", tuple(allowed), aligned_tp)
        floors = self._shared.get(key)
        if floors is None:
            floors = self._shared[key] = Floors(self.problem, allowed, aligned_tp=aligned_tp)
        return floors

    def min_compute_s(self, allowed, *, aligned_tp: bool = True) -> np.ndarray:
        """Prefix sums of the layers' floors (:meth:`nest.dp.bounds.Floors.layer_floors_s`): a
        lower bound on the time of any stage holding those layers (``aligned_tp=False``: under
        any placement, not only the space's rank orders)."""
        c = self.config
        key = ("floor", self.shard, tuple(allowed), c.zero_stage >= 3, c.dp, c.ep, aligned_tp)
        got = self._shared.get(key)
        if got is None:
            floors = self._floors(allowed, aligned_tp)
            got = prefix(floors.layer_floors_s(self.shard, c.dp, c.ep, c.zero_stage))
            self._shared[key] = got
        return got
