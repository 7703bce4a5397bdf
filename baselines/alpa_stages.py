"""Alpa's stage costs and its inter-operator DP (Zheng et al., OSDI 2022, §5; ``dp_impl``).

Stage costs. Alpa profiles every (layer range, sub-mesh, intra-op configuration) and records its
per-microbatch latency ``t_intra`` and whether its memory fits (as the largest number of stages
that may follow it, ``max_n_succ_stages``). Here the "profiler" is the shared cost model's per-layer
terms on the two-level network view (:func:`baselines.networks.two_level_cluster`):
:class:`StageCosts` returns, for a stage that is the ``s``-th from the end of the pipeline and
runs on the last-but-``d`` devices, an ``L x L`` table of ``f + b`` seconds per microbatch for every
layer range ``i..k`` (compute, recompute, TP/EP collectives of its groups, p2p to its neighbours;
the evaluator's formulas, checked against :func:`nest.cost.evaluate` in the tests) and ``inf``
where the range does not fit in memory with ``min(s, B)`` microbatches in flight (1F1B).
Each stage takes the cheapest recompute mode (of ``modes``) that fits.

The DP (:func:`inter_op_dp`) is Alpa's ``F(s, k, d; t_max)``: the least sum of stage latencies of
``s`` stages covering layers ``i..L-1`` on exactly the last ``d`` devices, each stage latency at
most ``t_max``, over a list of stage *choices* (sub-mesh and intra-op configuration). The planner
calls it with one choice at a time (the shared plan gives every stage the same mesh and split);
passing several choices is what per-stage meshes would need.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from nest.axes import Axis, LayerKind, Recompute, Schedule
from nest.cost.collectives import COLLECTIVE_TIME, p2p_time_s
from nest.cost.pipeline import in_flight_microbatches
from nest.layers import Shard
from nest.plan import place
from nest.problem import Problem

INF = float("inf")
MEGATRON_ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)


@dataclass(frozen=True, slots=True)
class IntraOp:
    """One intra-operator configuration of a stage's sub-mesh (Alpa's logical mesh + sharding):
    ``tp x dp`` devices, expert degree, ZeRO stage (weight-update sharding), microbatch size."""

    tp: int
    dp: int
    ep: int
    zero: int
    mbs: int


def _prefix(values) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])


def _range_sum(prefix: np.ndarray) -> np.ndarray:
    """``out[i, k] = sum of values[i..k]`` (``-inf``-free; entries with ``k < i`` are junk)."""
    return prefix[None, 1:] - prefix[:-1, None]


def _range_max(values) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    n = len(arr)
    out = np.full((n, n), -INF)
    for i in range(n):
        out[i, i:] = np.maximum.accumulate(arr[i:])
    return out


class StageCosts:
    """Stage latency tables of one (sub-mesh size, intra-op configuration) on ``problem``'s
    cluster (the two-level view), for a pipeline of ``n_stages`` such stages."""

    def __init__(
        self, problem: Problem, intra: IntraOp, n_stages: int, modes: Sequence[Recompute]
    ) -> None:
        self.problem, self.intra, self.n_stages = problem, intra, n_stages
        self.modes = tuple(modes)
        training, model, cluster = problem.training, problem.model, problem.cluster
        self.m = training.global_batch // (intra.mbs * intra.dp)
        shard = Shard(
            tp=intra.tp,
            ep=intra.ep,
            sp=training.sequence_parallel and intra.tp > 1,
            mbs=intra.mbs,
        )
        chain = model.chain
        self.n_layers = n = len(chain)
        costs = [model.layer_cost(ref, shard, cluster.device) for ref in chain]
        is_block = [ref.kind is LayerKind.BLOCK for ref in chain]
        grid = place(tp=intra.tp, cp=1, dp=intra.dp, pp=n_stages, rank_order=MEGATRON_ORDER)
        self.factors = self._factors(grid[0])
        self.time = {}
        self.act = {}
        self.transient = {}
        for mode in self.modes:
            self.time[mode] = _range_sum(_prefix(self._layer_times(costs, is_block, mode)))
            lm = [mode if blk else Recompute.NONE for blk in is_block]
            self.act[mode] = _range_sum(
                _prefix([c.act_bytes[x] for c, x in zip(costs, lm, strict=True)])
            )
            peaks = [
                c.transient_bytes
                + (c.act_bytes[Recompute.NONE] - c.act_bytes[x] if x is not Recompute.NONE else 0)
                for c, x in zip(costs, lm, strict=True)
            ]
            self.transient[mode] = _range_max(peaks)
        dense = _range_sum(_prefix([c.dense_params for c in costs]))
        expert = _range_sum(_prefix([c.expert_params for c in costs]))
        self.static_bytes = self._model_state_bytes(dense, expert, tied=0.0)
        # Megatron's copy of a tied embedding sits with the head when the head's stage does not
        # hold the embedding: ranges ending at the head on any stage but the first
        tied = self._model_state_bytes(dense, expert, tied=costs[-1].tied_copy_params)
        self.static_head_bytes = self.static_bytes.copy()
        self.static_head_bytes[:, -1] = tied[:, -1]
        self.boundary = np.array([c.boundary_bytes for c in costs])
        self.levels = [
            int(np.max(cluster.common_levels(grid[r], grid[r + 1]))) for r in range(n_stages - 1)
        ]
        i, k = np.indices((n, n))
        self.valid = k >= i

    def _coll_s(self, colls) -> float:
        """Seconds of a layer's collectives on the stage's groups (the slowest group each)."""
        cluster = self.problem.cluster
        return sum(
            max(
                (COLLECTIVE_TIME[c.op](c.n_bytes, f, cluster) for f in self.factors[c.axis]),
                default=0.0,
            )
            for c in colls
        )

    def _layer_times(self, costs, is_block, mode: Recompute) -> list[float]:
        """``f + b`` of each layer per microbatch: compute, recompute (blocks) and collectives."""
        out = []
        for c, blk in zip(costs, is_block, strict=True):
            t = c.fwd_s + c.bwd_s + self._coll_s(c.fwd_collectives + c.bwd_collectives)
            if blk:
                redo = c.recompute_collectives.get(mode, ())
                t += c.recompute_s.get(mode, 0.0) + self._coll_s(redo)
            out.append(t)
        return out

    def _factors(self, devices: np.ndarray) -> dict[str, set]:
        """Level splits of the stage's TP and EP groups (the evaluator's grouping)."""
        dp, cp, tp = devices.shape
        flat = devices.reshape(dp * cp, tp)
        ep = self.intra.ep
        blocks = flat.reshape(dp * cp // ep, ep, tp).transpose(0, 2, 1).reshape(-1, ep)
        cluster = self.problem.cluster
        out: dict[str, set] = {"cp": set()}
        out["tp"] = cluster.distinct_group_factors(flat) if tp > 1 else set()
        out["ep"] = cluster.distinct_group_factors(blocks) if ep > 1 else set()
        return out

    def _model_state_bytes(self, dense, expert, *, tied: float) -> np.ndarray:
        """Weights, gradients and optimizer state per device (ZeRO shards them over the data
        ranks: dense over ``dp``, experts over ``dp / ep``), plus the reserve."""
        training = self.problem.training
        p = self.problem.model.spec.dtype_bytes
        d, e = dense + tied, expert
        full = d + e
        shard = d / self.intra.dp + e / (self.intra.dp // self.intra.ep)
        z = self.intra.zero
        per_param = [p, training.grad_bytes, training.optimizer_state_bytes_per_param]
        sharded_from = [3, 2, 1]  # ZeRO stage from which weights / grads / optimizer are sharded
        total = sum(
            b * (shard if z >= s else full) for b, s in zip(per_param, sharded_from, strict=True)
        )
        return total + self.problem.cluster.device.memory_reserve_bytes

    def stage(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, mode index) of every layer range for the ``s``-th stage from the end.

        ``inf`` where the range is empty or does not fit in memory in any allowed mode."""
        r = self.n_stages - s
        n = self.n_layers
        in_flight = in_flight_microbatches(r, self.n_stages, self.m, Schedule.ONE_F_ONE_B, 1)
        static = self.static_head_bytes if r > 0 else self.static_bytes
        hbm = self.problem.cluster.device.hbm_bytes
        p2p = np.zeros((n, n))
        cluster = self.problem.cluster
        if r + 1 < self.n_stages:  # forward send of the last layer's output
            p2p += np.array([p2p_time_s(b, self.levels[r], cluster) for b in self.boundary])[None]
        if r > 0:  # backward send of the gradient of the previous layer's output
            prev = np.concatenate([[0.0], self.boundary[:-1]])
            p2p += np.array([p2p_time_s(b, self.levels[r - 1], cluster) for b in prev])[:, None]
        best = np.full((n, n), INF)
        which = np.full((n, n), -1, dtype=np.int64)
        for idx, mode in enumerate(self.modes):
            fits = static + self.act[mode] * in_flight + self.transient[mode] <= hbm
            t = np.where(fits & self.valid, self.time[mode] + p2p, INF)
            better = t < best
            best = np.where(better, t, best)
            which = np.where(better, idx, which)
        return best, which


@dataclass(frozen=True, slots=True)
class StageChoice:
    """A sub-mesh and intra-op configuration a stage may take: its device count and its cost
    tables, ``cost(s, d) -> (seconds[i, k], mode index[i, k])``."""

    size: int
    cost: Callable[[int, int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True, slots=True)
class DPResult:
    sum_s: float
    max_s: float
    stages: tuple[tuple[int, int, int, int], ...]
    """(first layer, last layer, choice index, mode index) front to back."""


def inter_op_dp(
    n_layers: int, n_devices: int, choices: Sequence[StageChoice], tables: dict, t_max: float
) -> DPResult | None:
    """Alpa's stage DP for one ``t_max`` (module docstring); ``tables`` caches ``cost(s, d)``.

    ``G[s, d][i]``: least sum of latencies of ``s`` stages covering layers ``i..L-1`` on the last
    ``d`` devices, every stage latency ``<= t_max``; ``G[0, 0][L] = 0``;
    ``G[s, d][i] = min_{c, k >= i} cost_c(s, d)[i, k] + G[s-1, d - size_c][k+1]``.
    Returns the plan with the least sum over every ``s`` that covers all ``n_devices``."""
    base = np.full(n_layers + 1, INF)
    base[n_layers] = 0.0
    g = {(0, 0): base}
    arg: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    layer = [(0, 0)]
    rows = np.arange(n_layers)
    for s in range(1, n_layers + 1):
        nxt: list[tuple[int, int]] = []
        for s0, d0 in layer:
            for c_idx, choice in enumerate(choices):
                d = d0 + choice.size
                if d > n_devices:
                    continue
                key = (c_idx, s, d)
                if key not in tables:
                    tables[key] = choice.cost(s, d)
                t, _ = tables[key]
                total = np.where(t <= t_max, t, INF) + g[(s0, d0)][None, 1:]
                k = np.argmin(total, axis=1)
                val = np.append(total[rows, k], INF)
                if (s, d) not in g:
                    g[(s, d)] = np.full(n_layers + 1, INF)
                    arg[(s, d)] = (np.zeros(n_layers, np.int64), np.zeros(n_layers, np.int64))
                    nxt.append((s, d))
                better = val < g[(s, d)]
                g[(s, d)] = np.where(better, val, g[(s, d)])
                cs, ks = arg[(s, d)]
                arg[(s, d)] = (np.where(better[:-1], c_idx, cs), np.where(better[:-1], k, ks))
        layer = [key for key in nxt if np.isfinite(g[key]).any()]
        if not layer:
            break
    ends = [(g[(s, n_devices)][0], s) for s in range(1, n_layers + 1) if (s, n_devices) in g]
    finite = [e for e in ends if np.isfinite(e[0])]
    if not finite:
        return None
    total, s = min(finite)
    stages, i, d, worst = [], 0, n_devices, 0.0
    while s > 0:
        c_idx, k = int(arg[(s, d)][0][i]), int(arg[(s, d)][1][i])
        t, modes = tables[(c_idx, s, d)]
        worst = max(worst, float(t[i, k]))
        stages.append((i, k, c_idx, int(modes[i, k])))
        i, d, s = k + 1, d - choices[c_idx].size, s - 1
    return DPResult(sum_s=float(total), max_s=worst, stages=tuple(stages))
