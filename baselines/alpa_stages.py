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

from nest.core.axes import Axis, LayerKind, Recompute, Schedule
from nest.core.plan import ParallelConfig, place
from nest.core.problem import Problem
from nest.cost.collectives import p2p_classes, pair_p2p_time_s
from nest.cost.compute import bwd_collectives, fwd_collectives, recompute_s
from nest.cost.groups import AXES, RankGroups
from nest.cost.memory import peak_bytes, rank_memory_bytes, resident_bytes, stored_bytes
from nest.cost.pipeline import in_flight_microbatches
from nest.cost.state import ModelState
from nest.dp.stages import prefix, range_max

INF = float("inf")
MEGATRON_ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)


def _range_sum(pre: np.ndarray) -> np.ndarray:
    """``out[i, k] = sum of values[i..k]`` from prefix sums (entries with ``k < i`` are junk)."""
    return pre[None, 1:] - pre[:-1, None]


class StageCosts:
    """Stage latency tables of one (sub-mesh size, intra-op configuration) on ``problem``'s
    cluster (the two-level view), for a pipeline of ``config.pp`` such stages.

    ``config`` is the stage's intra-op configuration as a :class:`~nest.core.plan.ParallelConfig`
    (``tp x dp`` devices per stage, expert degree, ZeRO stage for weight-update sharding,
    microbatch size; ``cp`` 1; ``pp`` the number of stages)."""

    def __init__(
        self, problem: Problem, config: ParallelConfig, modes: Sequence[Recompute]
    ) -> None:
        self.problem, self.config, self.n_stages = problem, config, config.pp
        self.modes = tuple(modes)
        training, model, cluster = problem.training, problem.model, problem.cluster
        self.m = config.num_microbatches(training.global_batch)
        shard = config.shard(training.sequence_parallel)
        chain = model.chain
        self.n_layers = n = len(chain)
        costs = [model.layer_cost(ref, shard, cluster.device) for ref in chain]
        is_block = [ref.kind is LayerKind.BLOCK for ref in chain]
        pairs = list(zip(costs, is_block, strict=True))
        grid = place(tp=config.tp, cp=1, dp=config.dp, pp=self.n_stages, rank_order=MEGATRON_ORDER)
        self.groups = RankGroups(grid[0], config.ep, cluster)
        self.state = ModelState.of(
            problem,
            zero_stage=config.zero_stage,
            dp=config.dp,
            cp=1,
            ep=config.ep,
            optimizer_offload=config.optimizer_offload,
        )
        self.time, self.act, self.transient = {}, {}, {}
        for mode in self.modes:
            self.time[mode] = _range_sum(prefix([self._layer_time_s(c, mode, b) for c, b in pairs]))
            self.act[mode] = _range_sum(prefix([stored_bytes(c, mode, b) for c, b in pairs]))
            self.transient[mode] = range_max([peak_bytes(c, mode, b, self.state) for c, b in pairs])
        dense = _range_sum(prefix([c.dense_params for c in costs]))
        expert = _range_sum(prefix([c.expert_params for c in costs]))
        resident = _range_sum(prefix([resident_bytes(c, self.state) for c in costs]))
        self.state_bytes = self.state.state_bytes(dense, expert) + resident
        # Megatron's copy of a tied embedding sits with the head when the head's stage does not
        # hold the embedding: ranges ending at the head on any stage but the first
        self.state_head_bytes = self.state_bytes.copy()
        tied = costs[-1].tied_copy_params
        self.state_head_bytes[:, -1] = (
            self.state.state_bytes(dense[:, -1] + tied, expert[:, -1]) + resident[:, -1]
        )
        self.boundary = np.array([c.boundary_bytes for c in costs])
        # what each stage boundary's cost depends on (the evaluator's term: the slowest pair)
        self.boundary_classes = [
            p2p_classes(cluster, grid[r], grid[r + 1]) for r in range(self.n_stages - 1)
        ]
        i, k = np.indices((n, n))
        self.valid = k >= i

    def _layer_time_s(self, cost, mode: Recompute, is_block: bool) -> float:
        """``f + b`` of one layer per microbatch: compute, recompute (blocks) and the
        collectives of both directions on the stage's groups (the evaluator's terms)."""
        fwd = [(c, 1) for c in fwd_collectives(cost)]
        bwd = [(c, 1) for c in bwd_collectives(cost, mode, is_block)]
        comm = sum(
            self.groups.axis_time_s(fwd, axis) + self.groups.axis_time_s(bwd, axis) for axis in AXES
        )
        return cost.fwd_s + cost.bwd_s + recompute_s(cost, mode, is_block) + comm

    def stage(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, mode index) of every layer range for the ``s``-th stage from the end.

        ``inf`` where the range is empty or does not fit in memory in any allowed mode."""
        r = self.n_stages - s
        n = self.n_layers
        in_flight = in_flight_microbatches(r, self.n_stages, self.m, Schedule.ONE_F_ONE_B, 1)
        state_bytes = self.state_head_bytes if r > 0 else self.state_bytes
        device = self.problem.cluster.device
        p2p = np.zeros((n, n))
        cluster = self.problem.cluster
        if r + 1 < self.n_stages:  # forward send of the last layer's output
            p2p += pair_p2p_time_s(self.boundary, self.boundary_classes[r], cluster)[None]
        if r > 0:  # backward send of the gradient of the previous layer's output
            prev = np.concatenate([[0.0], self.boundary[:-1]])
            p2p += pair_p2p_time_s(prev, self.boundary_classes[r - 1], cluster)[:, None]
        best = np.full((n, n), INF)
        which = np.full((n, n), -1, dtype=np.int64)
        for idx, mode in enumerate(self.modes):
            memory = rank_memory_bytes(
                state_bytes,
                self.act[mode],
                in_flight,
                self.transient[mode],
                device.memory_reserve_bytes,
            )
            fits = memory <= device.hbm_bytes
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
