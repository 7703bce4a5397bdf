"""A 1F1B stage's terms for every last layer at once (numpy), the recurrence's inner loop.

For rank ``r``, first layer ``i`` and recompute mode ``c``, :func:`stage_row` returns the
forward + backward time, backward time, DP sync and optimizer step of the stage ``i..j`` for every
``j >= i`` (and, for ZB-H1 and ZB-H2, its pipeline terms ``u, e`` and its B and W passes):
:meth:`nest.dp.stages.StageModel.stage` on arrays. The cost model's terms take numpy
rows as they take scalars (collectives are affine in the bytes for a fixed group split, so "the
slowest group" of a row is a maximum of a few affine functions,
:meth:`nest.cost.groups.RankGroups.time_s`); nothing here re-derives a formula.
"""

from dataclasses import dataclass

import numpy as np

from nest.core.axes import Recompute
from nest.cost.collectives import pair_p2p_time_s
from nest.cost.pipeline import gather_exposed_s, rank_drain_s, rank_pipeline_terms
from nest.dp.stages import StageModel


@dataclass(frozen=True, slots=True)
class StageRow:
    """Per last layer ``j = i, i+1, ...`` (index ``j - i``), as Python lists."""

    time_s: list
    bwd_s: list
    sync_s: list
    optimizer_s: list
    sum_s: list
    """The stage's share of the pipeline's sum term (``u``; ``time_s`` but under ZB-H1 and ZB-H2,
    :func:`nest.cost.pipeline.rank_pipeline_terms`)."""
    tail_s: list
    """Its tail term ``e`` (0 but under ZB-H1 and ZB-H2)."""
    drain_s: list
    """What the stage adds to the prefix sum that hides later ranks' sync
    (:func:`nest.cost.pipeline.rank_drain_s`: ``bwd_s``; ZB-H1 its B pass; ZB-H2 ``h - f``,
    signed: the prefix adds its positive part, the rank's own hidden time uses the rest)."""
    wgrad_s: list
    """Its W pass (zero-bubble; 0 otherwise): what overlaps its own sync, and ``r`` of which it runs
    after rank 0 (:func:`nest.cost.pipeline.sync_hidden_s`)."""
    gather_exposed_s: list
    """Its exposed ZeRO-1/2 weight all-gather (:func:`nest.cost.pipeline.gather_exposed_s`
    under the stage's forward), added to its exposed sync; ``sync_s`` is the gradient part."""


def _comm(sm: StageModel, r: int, i: int, direction: str, mode: Recompute) -> np.ndarray:
    """Per axis the slowest split of the interval's summed collectives, summed over axes."""
    total = np.zeros(sm.n_layers - i)
    for splits in sm.comm_prefixes(r, direction, mode):
        axis = splits[0][i + 1 :] - splits[0][i]
        for pre in splits[1:]:
            axis = np.maximum(axis, pre[i + 1 :] - pre[i])
        total += axis
    return total


def stage_common(sm: StageModel, r: int, i: int) -> tuple:
    """The mode-independent terms of 1F1B stage ``r`` from layer ``i``, for every last layer:
    forward (with ZeRO-3's exposed gathers), backward without recompute, backward collectives
    and ZeRO-3's backward traffic (which hides under the mode's recomputation:
    :func:`stage_row`), DP sync's gradient part, optimizer step, exposed weight all-gather."""
    c, n, ch = sm.config, sm.n_layers, sm.chain
    cluster = sm.problem.cluster
    fwd = (ch.fwd_s[i + 1 :] - ch.fwd_s[i]) + _comm(sm, r, i, "f", Recompute.NONE)
    bwd = ch.bwd_s[i + 1 :] - ch.bwd_s[i]
    dense_c = ch.dense_params[i + 1 :] - ch.dense_params[i]
    expert = ch.expert_params[i + 1 :] - ch.expert_params[i]
    if sm.state.zero_stage >= 3:  # the forward's gathers hide under no recomputation
        fwd = fwd + sm.zero3_chain(r, Recompute.NONE).fwd_s(i, np.arange(i, n))
    if r + 1 < c.pp:
        fwd = fwd + pair_p2p_time_s(ch.boundary_bytes[i:n], sm.p2p_levels(r, r + 1), cluster)
    if r > 0:
        bwd = bwd + pair_p2p_time_s(ch.boundary_bytes[i - 1], sm.p2p_levels(r, r - 1), cluster)
    dense = dense_c
    if r != 0:
        dense = dense_c.copy()
        dense[-1] += sm.tied_copy_params  # the head is the last layer
    sync, opt, gather = sm.rank_sync_opt(r, dense, expert)
    gathered = gather_exposed_s(gather, fwd, sm.overlap)
    return (
        fwd,
        bwd,
        np.asarray(sync).tolist(),
        np.asarray(opt).tolist(),
        np.asarray(gathered).tolist(),
    )


def _block_extra(sm: StageModel, r: int, i: int, mode: Recompute, full_blocks: int):
    """What fully recomputing the first ``full_blocks`` blocks from layer ``i`` instead of
    running them in ``mode`` adds to the backward, for every last layer holding them: their
    recompute seconds, and per axis the slowest split of the mixed collectives less the
    slowest split of ``mode``'s (each split's collectives are per-layer sums, so the mix is
    ``mode``'s sum plus the blocks' differences)."""
    ch, full = sm.chain, Recompute.FULL
    b0 = sm.block_span(i, sm.n_layers - 1)[0]
    end = b0 + full_blocks

    def delta(pf, pc):
        return (pf[end] - pf[b0]) - (pc[end] - pc[b0])

    extra = delta(ch.recompute_s[full], ch.recompute_s[mode]) + 0.0 * np.arange(i, sm.n_layers)
    for sf, sc in zip(sm.comm_prefixes(r, "b", full), sm.comm_prefixes(r, "b", mode), strict=True):
        mixed = np.max(
            [pc[i + 1 :] - pc[i] + delta(pf, pc) for pf, pc in zip(sf, sc, strict=True)], axis=0
        )
        plain = np.max([pc[i + 1 :] - pc[i] for pc in sc], axis=0)
        extra = extra + (mixed - plain)
    return extra


def stage_row(
    sm: StageModel,
    r: int,
    i: int,
    mode: Recompute,
    common: tuple | None = None,
    full_blocks: int = 0,
):
    """The terms of 1F1B stage ``r`` holding ``i..j`` for every ``j >= i`` (module docstring);
    ``common`` is :func:`stage_common` of ``(r, i)`` when the caller already has it;
    ``full_blocks``: its first that many blocks fully recomputed, the rest in ``mode``
    (meaningful for the ``j`` that hold more blocks; not with activation offload)."""
    fwd, bwd, sync, opt, gathered = common if common is not None else stage_common(sm, r, i)
    ch = sm.chain
    redo = ch.recompute_s[mode][i + 1 :] - ch.recompute_s[mode][i]
    bwd = bwd + redo + _comm(sm, r, i, "b", mode)
    if sm.state.zero_stage >= 3:  # the backward's hide under the mode's recomputation too
        bwd = bwd + sm.zero3_chain(r, mode, i, full_blocks).bwd_s(i, np.arange(i, sm.n_layers))
    if full_blocks:
        bwd = bwd + _block_extra(sm, r, i, mode, full_blocks)
    if sm.config.activation_offload:
        bwd = bwd + sm.offload_exposed_s(i, np.arange(i, sm.n_layers), mode)
    schedule = sm.config.schedule
    time = (fwd + bwd).tolist()
    if not schedule.splits_backward:
        zeros = [0.0] * len(time)
        return StageRow(time, bwd.tolist(), sync, opt, time, zeros, bwd.tolist(), zeros, gathered)
    wgrad = ch.wgrad_s[i + 1 :] - ch.wgrad_s[i]
    u, _, e = rank_pipeline_terms(fwd, bwd, wgrad, schedule)
    drain = rank_drain_s(fwd, bwd, wgrad, schedule).tolist()
    return StageRow(
        time, bwd.tolist(), sync, opt, u.tolist(), e.tolist(), drain, wgrad.tolist(), gathered
    )
