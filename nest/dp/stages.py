"""Stage costs of one configuration, as interval queries over the layer chain.

For a fixed :class:`~nest.dp.space.SearchConfig`, the shared evaluator's time and memory of a
pipeline rank depend only on the rank ``r``, its first and last layer ``i..j`` and its recompute
mode. :class:`StageModel` precomputes per-layer terms and prefix sums so that
``stage(r, i, j, mode)`` returns the same forward, backward, DP-sync, optimizer and memory numbers
:func:`nest.cost.evaluate` computes for that stage (up to floating-point summation order; a test
checks the two against each other on random plans). Every formula is the evaluator's:

- a collective axis costs the slowest of its groups' level splits, summed over the interval's
  layers per split, then the maximum over splits (``prefix sums per split``);
- p2p is charged at the slowest level between the rank and its neighbour;
- ZeRO-3 gathers and scatters the interval's parameters every microbatch;
- memory is the evaluator's sum with ``transient = max`` over the interval's layers.
"""

from dataclasses import dataclass

import numpy as np

from nest.axes import LayerKind, Recompute
from nest.cost.collectives import COLLECTIVE_TIME, p2p_time_s
from nest.cost.evaluate import _Groups
from nest.cost.pipeline import in_flight_microbatches
from nest.dp.bounds import Floors
from nest.dp.space import SearchConfig
from nest.layers import Shard
from nest.plan import place
from nest.problem import Problem

MODES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


@dataclass(frozen=True, slots=True)
class StageTerms:
    fwd_s: float
    bwd_s: float
    sync_s: float
    optimizer_s: float
    memory_bytes: float
    fits: bool


def _prefix(values) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])


def _chain_terms(costs, is_block, p: int, c: SearchConfig):
    """Prefix sums and the range-maximum tables of the chain's layer terms for one shard; they
    depend on the shard and the ZeRO-3 sharding only, so searches share them."""
    p_fwd = _prefix([x.fwd_s for x in costs])
    p_bwd = _prefix([x.bwd_s for x in costs])
    p_dense = _prefix([x.dense_params for x in costs])
    p_expert = _prefix([x.expert_params for x in costs])
    pairs = list(zip(costs, is_block, strict=True))
    p_rec = {
        mode: _prefix([x.recompute_s.get(mode, 0.0) if blk else 0.0 for x, blk in pairs])
        for mode in MODES
    }
    p_act = {
        mode: _prefix([x.act_bytes[mode if blk else Recompute.NONE] for x, blk in pairs])
        for mode in MODES
    }
    boundary = [x.boundary_bytes for x in costs]
    n = len(costs)
    dense_shard, expert_shard = c.dp * c.cp, c.dp * c.cp // c.ep
    peak = {}
    for mode in MODES:
        vals = []
        for x, blk in pairs:
            lm = mode if blk else Recompute.NONE
            v = x.transient_bytes
            if lm is not Recompute.NONE:
                v += x.act_bytes[Recompute.NONE] - x.act_bytes[lm]
            if c.zero >= 3:
                full = x.dense_params + x.expert_params
                own = x.dense_params / dense_shard + x.expert_params / expert_shard
                v += p * (full - own)
            vals.append(v)
        # range maximum: table[i][j] = max(vals[i..j])
        table = np.full((n, n), -np.inf)
        arr = np.asarray(vals)
        for i in range(n):
            table[i, i:] = np.maximum.accumulate(arr[i:])
        peak[mode] = table
    return p_fwd, p_bwd, p_dense, p_expert, p_rec, p_act, boundary, peak


class StageModel:
    """Interval costs of one configuration (see the module docstring)."""

    def __init__(
        self,
        problem: Problem,
        config: SearchConfig,
        shared: dict | None = None,
        grid: np.ndarray | None = None,
    ) -> None:
        """``grid``: an explicit placement ``[pp][dp][cp][tp] -> device`` (the general mode of
        the exact planners); None places the ranks by ``config.order``."""
        self.problem, self.config = problem, config
        cluster, training, model = problem.cluster, problem.training, problem.model
        c = config
        self.m = training.global_batch // (c.mbs * c.dp)
        shard = Shard(
            tp=c.tp, cp=c.cp, ep=c.ep, sp=training.sequence_parallel and c.tp > 1, mbs=c.mbs
        )
        device = cluster.device
        chain = model.chain
        self.n_layers = n = len(chain)
        self._shared = shared if shared is not None else {}
        costs = self._shared.get(("costs", shard))
        if costs is None:
            costs = [model.layer_cost(ref, shard, device) for ref in chain]
            self._shared[("costs", shard)] = costs
        self.costs = costs
        is_block = [ref.kind is LayerKind.BLOCK for ref in chain]
        self.head_index = n - 1
        self.tied_copy = costs[-1].tied_copy_params
        key = ("chain", shard, c.zero >= 3, c.dp * c.cp, c.ep)
        terms = self._shared.get(key)
        if terms is None:
            terms = _chain_terms(costs, is_block, model.spec.dtype_bytes, c)
            self._shared[key] = terms
        (
            self.p_fwd,
            self.p_bwd,
            self.p_dense,
            self.p_expert,
            self.p_rec,
            self.p_act,
            self.boundary,
            self.peak,
        ) = terms
        p = model.spec.dtype_bytes
        self.is_block = is_block
        # groups and p2p levels depend on the placement only: shared across microbatch sizes,
        # ZeRO stages and schedules
        if grid is None:
            placement = ("placement", c.tp, c.cp, c.dp, c.pp, c.ep, c.order)
        else:
            grid = np.asarray(grid, dtype=np.int64)
            placement = ("grid", c.ep, grid.shape, grid.tobytes())
        if placement not in self._shared:
            if grid is None:
                grid = place(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp, rank_order=c.order)
            groups = [self._rank_groups(grid[r], c.ep) for r in range(c.pp)]
            self._shared[placement] = (grid, groups, {})
        self.grid, self.groups, self._levels = self._shared[placement]
        self._rank_cache: dict = {}
        self.shard = shard
        self.in_flight = [
            in_flight_microbatches(r, c.pp, self.m, c.schedule, c.v) for r in range(c.pp)
        ]
        self.capacity = device.hbm_bytes
        self.reserve = device.memory_reserve_bytes
        self.p_bytes = p
        self.g_bytes = training.grad_bytes
        self.state_bytes = training.optimizer_state_bytes_per_param
        self.hbm_bw = device.hbm_bw_bytes_per_s
        self.overlap = training.overlap_grad_sync

    def _rank_groups(self, devices: np.ndarray, ep: int) -> _Groups:
        """The groups of one rank's devices, shared by every placement that gives a rank the
        same devices (their level splits are computed once)."""
        devices = np.asarray(devices, dtype=np.int64)
        key = ("rank_groups", ep, devices.shape, devices.tobytes())
        if key not in self._shared:
            self._shared[key] = _Groups(devices, ep, self.problem.cluster)
        return self._shared[key]

    # ------------------------------------------------------------ collectives per split
    def _axis_prefix(self, axis: str, factors, direction: str, mode: Recompute) -> np.ndarray:
        """Prefix sums over the chain of one axis' collective seconds for one level split; they
        depend on the shard only, so all stage models of a search share them."""
        key = (self.shard, axis, factors, direction, mode)
        got = self._shared.get(key)
        if got is None:
            cluster = self.problem.cluster
            per_cost: dict = {}
            vals = []
            for x, blk in zip(self.costs, self.is_block, strict=True):
                v = per_cost.get((id(x), blk))
                if v is None:
                    colls = list(x.fwd_collectives if direction == "f" else x.bwd_collectives)
                    if direction == "b" and blk:
                        colls += list(x.recompute_collectives.get(mode, ()))
                    v = sum(
                        COLLECTIVE_TIME[cl.op](cl.n_bytes, factors, cluster)
                        for cl in colls
                        if cl.axis == axis
                    )
                    per_cost[(id(x), blk)] = v
                vals.append(v)
            got = _prefix(vals)
            self._shared[key] = got
        return got

    def _comm_prefixes(self, r: int, direction: str, mode: Recompute) -> list[list[np.ndarray]]:
        """Per axis with groups, the prefix arrays of each level split of rank ``r``'s groups."""
        key = (r, direction, mode)
        got = self._rank_cache.get(key)
        if got is None:
            g = self.groups[r]
            got = [
                [self._axis_prefix(axis, f, direction, mode) for f in g.factors(axis)]
                for axis in ("tp", "cp", "ep")
                if g.factors(axis)
            ]
            self._rank_cache[key] = got
        return got

    def _comm_s(self, r: int, i: int, j: int, direction: str, mode: Recompute) -> float:
        total = 0.0
        for splits in self._comm_prefixes(r, direction, mode):
            total += max(pre[j + 1] - pre[i] for pre in splits)
        return total

    # ------------------------------------------------------------ the stage
    def params(self, r: int, i: int, j: int) -> tuple[float, float, float]:
        """(dense, expert, dense with the tied-embedding copy) parameters of a stage."""
        dense = self.p_dense[j + 1] - self.p_dense[i]
        expert = self.p_expert[j + 1] - self.p_expert[i]
        with_tied = dense + (self.tied_copy if j == self.head_index and r != 0 else 0.0)
        return dense, expert, with_tied

    def _local(self, dense: float, expert: float, sharded: bool) -> float:
        c = self.config
        if not sharded:
            return dense + expert
        return dense / (c.dp * c.cp) + expert / (c.dp * c.cp // c.ep)

    def memory_bytes(self, r: int, i: int, j: int, mode: Recompute) -> float:
        """Per-device memory of 1F1B stage ``r`` holding layers ``i..j``."""
        _, expert, dense = self.params(r, i, j)
        act = (self.p_act[mode][j + 1] - self.p_act[mode][i]) * self.in_flight[r]
        return self.state_bytes_of(dense, expert) + act + self.peak[mode][i, j] + self.reserve

    def memory_from(self, r: int, i: int, mode: Recompute) -> np.ndarray:
        """Memory of 1F1B stage ``r`` holding layers ``i..j``, for every ``j >= i`` at once
        (the arithmetic of :meth:`memory_bytes` on arrays)."""
        n = self.n_layers
        dense = self.p_dense[i + 1 :] - self.p_dense[i]
        if r != 0:
            dense = dense.copy()
            dense[-1] += self.tied_copy  # the head (last layer) brings the tied copy
        expert = self.p_expert[i + 1 :] - self.p_expert[i]
        act = (self.p_act[mode][i + 1 :] - self.p_act[mode][i]) * self.in_flight[r]
        return self.state_bytes_of(dense, expert) + act + self.peak[mode][i, i:n] + self.reserve

    def fits_from(self, r: int, i: int, mode: Recompute) -> np.ndarray:
        """Whether stage ``r`` holding ``i..j`` fits, for every ``j >= i``."""
        return self.memory_from(r, i, mode) <= self.capacity

    def least_memory_from(self, r: int, i: int, allowed) -> np.ndarray:
        """The least memory over the allowed modes (``none`` where ``i..j`` has no block) of
        stage ``r`` holding ``i..j``, for every ``j >= i``."""
        has_block = np.cumsum(self.is_block[i:]) > 0
        least = np.min([self.memory_from(r, i, mode) for mode in allowed], axis=0)
        return np.where(has_block, least, self.memory_from(r, i, Recompute.NONE))

    def p2p_levels(self, a: int, b: int) -> list[int]:
        """Levels the devices of pipeline ranks ``a`` and ``b`` share, pair by pair."""
        key = (a, b) if a < b else (b, a)
        got = self._levels.get(key)
        if got is None:
            levels = self.problem.cluster.common_levels(self.grid[a], self.grid[b])
            got = sorted({int(x) for x in np.unique(levels)})
            self._levels[key] = got
        return got

    def chunk_times(
        self, r: int, i: int, j: int, mode: Recompute, prev: int | None, nxt: int | None
    ) -> tuple[float, float]:
        """Forward and backward seconds of layers ``i..j`` on rank ``r`` (one stage or chunk)
        whose neighbours run on ranks ``prev`` and ``nxt`` (None: no neighbour)."""
        c, g = self.config, self.groups[r]
        cluster = self.problem.cluster
        dense_c = self.p_dense[j + 1] - self.p_dense[i]
        expert = self.p_expert[j + 1] - self.p_expert[i]
        fwd = (self.p_fwd[j + 1] - self.p_fwd[i]) + self._comm_s(r, i, j, "f", mode)
        bwd = (
            (self.p_bwd[j + 1] - self.p_bwd[i])
            + (self.p_rec[mode][j + 1] - self.p_rec[mode][i])
            + self._comm_s(r, i, j, "b", mode)
        )
        if c.zero == 3:
            gather = g.time_s("all_gather", self.p_bytes * dense_c, "dense_dp")
            gather += g.time_s("all_gather", self.p_bytes * expert, "expert_dp")
            scatter = g.time_s("reduce_scatter", self.g_bytes * dense_c, "dense_dp")
            scatter += g.time_s("reduce_scatter", self.g_bytes * expert, "expert_dp")
            fwd += gather
            bwd += gather + scatter
        if nxt is not None:
            fwd += max(p2p_time_s(self.boundary[j], lv, cluster) for lv in self.p2p_levels(r, nxt))
        if prev is not None:
            bwd += max(
                p2p_time_s(self.boundary[i - 1], lv, cluster) for lv in self.p2p_levels(r, prev)
            )
        return fwd, bwd

    def rank_sync_opt(self, r: int, dense: float, expert: float) -> tuple[float, float]:
        """DP sync and optimizer-step seconds of a rank holding these parameters (dense with
        the tied copy)."""
        c, g = self.config, self.groups[r]
        if c.zero == 0:
            sync = g.time_s("all_reduce", self.g_bytes * dense, "dense_dp")
            sync += g.time_s("all_reduce", self.g_bytes * expert, "expert_dp")
        elif c.zero in (1, 2):
            sync = g.time_s("reduce_scatter", self.g_bytes * dense, "dense_dp")
            sync += g.time_s("all_gather", self.p_bytes * dense, "dense_dp")
            sync += g.time_s("reduce_scatter", self.g_bytes * expert, "expert_dp")
            sync += g.time_s("all_gather", self.p_bytes * expert, "expert_dp")
        else:
            sync = 0.0
        touched = 2 * self.state_bytes + self.g_bytes + self.p_bytes
        if self.state_bytes == 0:
            touched = self.g_bytes + 2 * self.p_bytes
        opt = self._local(dense, expert, c.zero >= 1) * touched / self.hbm_bw
        return sync, opt

    def state_bytes_of(self, dense: float, expert: float) -> float:
        """Weights, gradients and optimizer state a device of a rank keeps for these
        parameters (dense with the tied copy)."""
        zero = self.config.zero
        weights = self.p_bytes * self._local(dense, expert, zero >= 3)
        grads = self.g_bytes * self._local(dense, expert, zero >= 2)
        return weights + grads + self.state_bytes * self._local(dense, expert, zero >= 1)

    def stage(self, r: int, i: int, j: int, mode: Recompute) -> StageTerms:
        """Terms of 1F1B stage ``r`` holding layers ``i..j``."""
        pp = self.config.pp
        fwd, bwd = self.chunk_times(
            r, i, j, mode, r - 1 if r > 0 else None, r + 1 if r + 1 < pp else None
        )
        _, expert, dense = self.params(r, i, j)
        sync, opt = self.rank_sync_opt(r, dense, expert)
        mem = self.memory_bytes(r, i, j, mode)
        return StageTerms(fwd, bwd, sync, opt, mem, mem <= self.capacity)

    def modes_for(self, i: int, j: int, allowed) -> tuple[Recompute, ...]:
        """Recompute modes that differ on this interval (only blocks are recomputed)."""
        if any(self.is_block[i : j + 1]):
            return tuple(allowed)
        return (Recompute.NONE,)

    def min_compute_s(self, allowed, *, aligned_tp: bool = True) -> np.ndarray:
        """Prefix sums of the layers' floors (:meth:`nest.dp.bounds.Floors.layer_floors_s`): a
        lower bound on the time of any stage holding those layers (``aligned_tp=False``: under
        any placement, not only the space's rank orders)."""
        c = self.config
        key = ("floor", self.shard, tuple(allowed), c.zero >= 3, c.dp, c.ep, aligned_tp)
        got = self._shared.get(key)
        if got is None:
            floors_key = ("floors", tuple(allowed), aligned_tp)
            floors = self._shared.get(floors_key)
            if floors is None:
                floors = Floors(self.problem, allowed, aligned_tp=aligned_tp)
                self._shared[floors_key] = floors
            got = _prefix(floors.layer_floors_s(self.shard, c.dp, c.ep, c.zero))
            self._shared[key] = got
        return got
