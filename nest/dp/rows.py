"""A 1F1B stage's terms for every last layer at once (numpy), the recurrence's inner loop.

For rank ``r``, first layer ``i`` and recompute mode ``c``, :func:`stage_row` returns the
forward + backward time, backward time, DP sync and optimizer step of the stage ``i..j`` for every
``j >= i``: the arithmetic of :meth:`nest.dp.stages.StageModel.stage` on arrays (a test checks the
two agree). Collective times are affine in the bytes for a fixed group split
(:func:`linear_form`), so "the slowest group" is a maximum of a few affine functions of the
interval's parameter bytes.
"""

from dataclasses import dataclass
from math import prod

import numpy as np

from nest.axes import Recompute


def linear_form(op: str, factors: tuple[int, ...], cluster) -> tuple[float, float]:
    """``(a, c)`` with ``time(S) = a S + c`` for ``S > 0`` bytes: the formulas of
    :mod:`nest.cost.collectives` for a group split ``factors``."""
    a = c = 0.0
    if op == "all_to_all":
        n = prod(factors)
        if n <= 1:
            return 0.0, 0.0
        inside = 1
        for level, k in enumerate(factors):
            crossing = inside * k - inside
            if crossing > 0:
                a += crossing / n / cluster.path_bw_bytes_per_s(level)
                c += crossing * cluster.levels[level].latency_s
            inside *= k
        return a, c
    remaining = 1.0
    for level, k in enumerate(factors):
        if k > 1:
            a += (k - 1) / k * remaining / cluster.path_bw_bytes_per_s(level)
            c += (k - 1) * cluster.levels[level].latency_s
            remaining /= k
    return (2 * a, 2 * c) if op == "all_reduce" else (a, c)


@dataclass(frozen=True, slots=True)
class StageRow:
    """Per last layer ``j = i, i+1, ...`` (index ``j - i``), as Python lists."""

    time_s: list
    bwd_s: list
    sync_s: list
    optimizer_s: list


def group_time_s(sm, r: int, kind: str, op: str, n_bytes: np.ndarray) -> np.ndarray:
    """:meth:`nest.cost.evaluate._Groups.time_s` on an array of byte counts."""
    key = ("forms", r, kind, op)
    forms = sm._rank_cache.get(key)
    if forms is None:
        cluster = sm.problem.cluster
        forms = [linear_form(op, f, cluster) for f in sm.groups[r].factors(kind)]
        sm._rank_cache[key] = forms
    if not forms:
        return np.zeros_like(n_bytes)
    out = forms[0][0] * n_bytes + forms[0][1]
    for a, c in forms[1:]:
        out = np.maximum(out, a * n_bytes + c)
    return np.where(n_bytes > 0, out, 0.0)


def _comm(sm, r: int, i: int, direction: str, mode: Recompute) -> np.ndarray:
    total = np.zeros(sm.n_layers - i)
    for splits in sm._comm_prefixes(r, direction, mode):
        axis = splits[0][i + 1 :] - splits[0][i]
        for pre in splits[1:]:
            axis = np.maximum(axis, pre[i + 1 :] - pre[i])
        total += axis
    return total


def _p2p(sm, n_bytes, levels) -> np.ndarray | float:
    cluster = sm.problem.cluster
    out = None
    for lv in levels:
        if lv < 0:
            t = n_bytes * 0.0
        else:
            bw = cluster.path_bw_bytes_per_s(lv)
            t = np.where(n_bytes > 0, n_bytes / bw + cluster.levels[lv].latency_s, 0.0)
        out = t if out is None else np.maximum(out, t)
    return out


def stage_common(sm, r: int, i: int) -> tuple:
    """The mode-independent terms of 1F1B stage ``r`` from layer ``i``, for every last layer:
    forward, backward without recompute and backward collectives, DP sync, optimizer step."""
    c, n = sm.config, sm.n_layers
    fwd = (sm.p_fwd[i + 1 :] - sm.p_fwd[i]) + _comm(sm, r, i, "f", Recompute.NONE)
    bwd = sm.p_bwd[i + 1 :] - sm.p_bwd[i]
    dense_c = sm.p_dense[i + 1 :] - sm.p_dense[i]
    expert = sm.p_expert[i + 1 :] - sm.p_expert[i]
    if c.zero == 3:
        gather = group_time_s(sm, r, "dense_dp", "all_gather", sm.p_bytes * dense_c)
        gather = gather + group_time_s(sm, r, "expert_dp", "all_gather", sm.p_bytes * expert)
        scatter = group_time_s(sm, r, "dense_dp", "reduce_scatter", sm.g_bytes * dense_c)
        scatter = scatter + group_time_s(sm, r, "expert_dp", "reduce_scatter", sm.g_bytes * expert)
        fwd = fwd + gather
        bwd = bwd + gather + scatter
    if r + 1 < c.pp:
        fwd = fwd + _p2p(sm, np.asarray(sm.boundary[i:n], dtype=float), sm.p2p_levels(r, r + 1))
    if r > 0:
        bwd = bwd + _p2p(sm, np.asarray(sm.boundary[i - 1], dtype=float), sm.p2p_levels(r, r - 1))
    dense = dense_c
    if r != 0:
        dense = dense_c.copy()
        dense[-1] += sm.tied_copy  # the head is the last layer
    g_b, p_b = sm.g_bytes, sm.p_bytes
    if c.zero == 0:
        sync = group_time_s(sm, r, "dense_dp", "all_reduce", g_b * dense)
        sync = sync + group_time_s(sm, r, "expert_dp", "all_reduce", g_b * expert)
    elif c.zero in (1, 2):
        sync = group_time_s(sm, r, "dense_dp", "reduce_scatter", g_b * dense)
        sync = sync + group_time_s(sm, r, "dense_dp", "all_gather", p_b * dense)
        sync = sync + group_time_s(sm, r, "expert_dp", "reduce_scatter", g_b * expert)
        sync = sync + group_time_s(sm, r, "expert_dp", "all_gather", p_b * expert)
    else:
        sync = np.zeros_like(dense)
    touched = 2 * sm.state_bytes + g_b + p_b
    if sm.state_bytes == 0:
        touched = g_b + 2 * p_b
    opt = sm._local(dense, expert, c.zero >= 1) * touched / sm.hbm_bw
    return fwd, bwd, sync.tolist(), opt.tolist()


def stage_row(sm, r: int, i: int, mode: Recompute, common: tuple | None = None) -> StageRow:
    """The terms of 1F1B stage ``r`` holding ``i..j`` for every ``j >= i`` (module docstring);
    ``common`` is :func:`stage_common` of ``(r, i)`` when the caller already has it."""
    fwd, bwd, sync, opt = common if common is not None else stage_common(sm, r, i)
    bwd = bwd + (sm.p_rec[mode][i + 1 :] - sm.p_rec[mode][i]) + _comm(sm, r, i, "b", mode)
    return StageRow((fwd + bwd).tolist(), bwd.tolist(), sync, opt)
