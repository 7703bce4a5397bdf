"""The exact planners' model data: configurations x placements, and per pipeline rank the
choices it can take, each with the terms the shared objective needs.

A *group* is one configuration (degrees, microbatch size, ZeRO stage, schedule) on one placement
(a rank order's grid in the restricted mode; any placement class of
:mod:`nest.exact.placements` in the general mode). For a group the evaluator's objective is

``T = a * sum_r t_r + b * max_r t_r + max_r (max(0, sync_r - sum_{q<r} f_q [- f_r]) + g_r)
+ max_r opt_r``

with ``a = 1, b = m - 1`` for 1F1B and ``a = 1/v, b = m - 1/v`` interleaved
(:mod:`nest.cost.pipeline`), ``t_r`` rank ``r``'s forward plus backward, ``f_r`` the backward of
its first chunk, ``sync_r`` the gradient part of its DP synchronisation, ``g_r`` its exposed
weight all-gather and ``opt_r`` its optimizer step. Each term of a
rank depends on that rank's choice only:

- 1F1B: a choice is ``(i, j, mode)``, the rank holds layers ``i..j`` with one recompute mode; the
  choices of consecutive ranks must chain (rank ``r + 1`` starts at ``j + 1``);
- interleaved: the partition is fixed (the space's chunks, :func:`interleaved_chunks`), a choice
  is a recompute mode per chunk of the rank. Where a rank's modes multiply past
  :data:`FULL_PRODUCT_LIMIT` assignments (5 modes over 16 chunks is 1.5e11), its choices are the
  dominance-reduced options of :func:`nest.dp.interleaved.rank_options` instead: per mode of its
  first chunk the fastest fitting assignment of the others, Pareto-best in ``(t_r, -f_r)``. The
  objective is non-decreasing in ``t_r`` and non-increasing in ``f_r`` and memory is per rank, so
  for every dropped assignment a kept one fits and is no worse: the optimum is unchanged (the
  proof is that module's). Below the limit every fitting assignment is listed, as before.

Memory depends on the rank's choice only too, so a choice that does not fit is left out.

**Pruning** (optional, with an upper bound ``U``: the value of any feasible plan). The sync and
optimizer terms are non-negative, so ``T >= a * sum_r t_r + b * max_r t_r``; hence a choice
``k`` of rank ``r`` with ``a * (t_k + sum_{q != r} min_q) + b * t_k > U`` is in no plan better
than ``U`` (``min_q``: the least ``t`` of rank ``q``'s choices), and a group with
``a * sum_r min_r + b * max_r min_r > U`` has no such plan at all. Both are dropped; the
optimum (``<= U``) is kept, with a relative slack for rounding.
"""

from dataclasses import dataclass, field
from itertools import product
from math import prod

import numpy as np

from nest.core.axes import Recompute, Schedule
from nest.core.plan import ParallelConfig, Plan, make_structured_plan
from nest.core.problem import Problem
from nest.cost.memory import rank_memory_bytes
from nest.cost.pipeline import pipeline_coefficients
from nest.dp.interleaved import RankChunks, rank_options
from nest.dp.space import SpaceOptions, configurations, interleaved_chunks
from nest.dp.stages import StageModel
from nest.exact.placements import placement_classes

SLACK = 1e-9
"""Relative slack of the pruning bound: the group sums the evaluator's terms in another order."""

FULL_PRODUCT_LIMIT = 4096
"""An interleaved rank whose per-chunk recompute modes combine to more assignments than this
takes the dominance-reduced options (module docstring), not every assignment: listing 5 modes
over 16 chunks (Llama-2 7B on 2 pipeline ranks at 16 chunks each) would not end."""


@dataclass(frozen=True, slots=True)
class Choice:
    t_s: float
    first_bwd_s: float
    sync_s: float
    opt_s: float
    span: tuple[int, int] | None
    """1F1B: the rank's layers ``(i, j)``; interleaved: None (fixed chunks)."""
    modes: tuple[Recompute, ...]
    """Recompute mode of each chunk of the rank, in chunk order."""
    gather_s: float = 0.0
    """Its exposed ZeRO-1/2 weight all-gather (:func:`nest.cost.pipeline.gather_exposed_s`),
    added to its exposed sync; ``sync_s`` is the sync's gradient part."""


@dataclass(slots=True)
class Group:
    config: ParallelConfig
    grid: np.ndarray
    """``[pp][dp][cp][tp] -> device``."""
    general: bool
    m: int
    sum_coef: float
    """``a``: the coefficient of ``sum_r t_r`` in ``T``."""
    max_coef: float
    """``b``: the coefficient of ``max_r t_r`` in ``T``."""
    overlap: bool
    ranks: list[list[Choice]] = field(default_factory=list)

    def plan(self, problem: Problem, picks: list[Choice]) -> Plan:
        """The plan of one choice per rank."""
        c = self.config
        if c.schedule is Schedule.INTERLEAVED:
            chunks = interleaved_chunks(problem.num_layers, c.pp, c.virtual_stages)
            modes = [picks[k % c.pp].modes[k // c.pp] for k in range(len(chunks))]
        else:
            chunks = [pick.span for pick in picks]
            modes = [pick.modes[0] for pick in picks]
        return make_structured_plan(
            c.unordered() if self.general else c,
            layer_counts=[j - i + 1 for i, j in chunks],
            recompute=modes,
            num_microbatches=self.m,
            sequence_parallel=problem.training.sequence_parallel,
            grid=self.grid,
        )

    def lower_bound_s(self) -> float:
        mins = [min(ch.t_s for ch in choices) for choices in self.ranks]
        return self.sum_coef * sum(mins) + self.max_coef * max(mins)


def _one_f_one_b(sm: StageModel, modes) -> list[list[Choice]]:
    pp, n = sm.config.pp, sm.n_layers
    ranks = []
    for r in range(pp):
        first_i = range(r, n - (pp - r) + 1) if r > 0 else (0,)
        out = []
        for i in first_i:
            last_j = range(i, n - (pp - r) + 1) if r < pp - 1 else (n - 1,)
            for j in last_j:
                for mode in sm.modes_for(i, j, modes):
                    terms = sm.stage(r, i, j, mode)
                    if terms.fits:
                        t = terms.fwd_s + terms.bwd_s
                        out.append(
                            Choice(
                                t,
                                terms.bwd_s,
                                terms.sync_s,
                                terms.optimizer_s,
                                (i, j),
                                (mode,),
                                terms.gather_exposed_s,
                            )
                        )
        ranks.append(out)
    return ranks


def _reduced_rank(sm: StageModel, r: int, modes) -> list[Choice]:
    """Rank ``r``'s dominance-reduced choices (module docstring)."""
    rc = RankChunks(sm, r, tuple(modes))
    options, _ = rank_options(sm, rc)
    return [
        Choice(o.t_s, o.first_bwd_s, rc.sync_s, rc.opt_s, None, o.modes, rc.gathered_s)
        for o in options
    ]


def _interleaved(sm: StageModel, modes) -> list[list[Choice]]:
    pp, chunks = sm.config.pp, sm.chunks
    ranks = []
    for r in range(pp):
        sync, opt, state_bytes, gathered = sm.interleaved_rank(r)
        per_chunk = [
            {mode: sm.chunk_terms(k, mode) for mode in sm.modes_for(*chunks[k], modes)}
            for k in range(r, len(chunks), pp)
        ]
        if prod(len(rows) for rows in per_chunk) > FULL_PRODUCT_LIMIT:
            ranks.append(_reduced_rank(sm, r, modes))
            continue
        out = []
        for combo in product(*(list(rows) for rows in per_chunk)):
            terms = [rows[mode] for rows, mode in zip(per_chunk, combo, strict=True)]
            memory = rank_memory_bytes(
                state_bytes,
                sum(x[2] for x in terms),
                sm.in_flight[r],
                max(x[3] for x in terms),
                sm.reserve_bytes,
            )
            if memory <= sm.capacity_bytes:
                t = sum(x[0] for x in terms)
                out.append(Choice(t, terms[0][1], sync, opt, None, combo, gathered))
        ranks.append(out)
    return ranks


def _config_floor_s(
    problem: Problem, config: ParallelConfig, shared: dict, modes, general: bool
) -> float:
    """A lower bound on ``T`` of every plan of ``config``, whatever its partition (and, with
    ``general``, its placement).

    Each layer takes at least its floor (:meth:`nest.dp.bounds.Floors.layer_floors_s`: the
    least compute and communication over every recompute mode and every way a group of its size
    can split over the levels; tensor groups as aligned blocks in the restricted space, as any
    group of ``tp`` devices in the general one), hence ``sum_r t_r >= F``, the floors' sum, and
    ``max_r t_r >= F / pp``: ``T >= a F + b F / pp``."""
    sm = StageModel(problem, config, shared)
    floor_s = float(sm.min_compute_s(modes, aligned_tp=not general)[-1])
    a, b = pipeline_coefficients(sm.m, config.schedule, config.virtual_stages)
    return a * floor_s + b * floor_s / config.pp


def _prune(group: Group, upper_s: float) -> bool:
    """Drop the choices no plan better than ``upper_s`` takes; False if the group has none."""
    limit = upper_s * (1 + SLACK)
    mins = [min(ch.t_s for ch in choices) for choices in group.ranks]
    total = sum(mins)
    for r, choices in enumerate(group.ranks):
        rest = total - mins[r]
        a, b = group.sum_coef, group.max_coef
        group.ranks[r] = [ch for ch in choices if a * (ch.t_s + rest) + b * ch.t_s <= limit]
    return all(group.ranks) and group.lower_bound_s() <= limit


def build_groups(
    problem: Problem,
    options: SpaceOptions,
    *,
    general: bool,
    upper_s: float | None = None,
    max_placements: int = 100_000,
) -> tuple[list[Group], dict]:
    """Every group of the space with its feasible choices (pruned against ``upper_s``), and
    counts for the report."""
    modes = options.recompute_modes
    shared: dict = {}
    classes: dict[tuple, list[np.ndarray]] = {}
    seen_configs: set = set()
    stats = {
        "configurations": 0,
        "configurations_pruned": 0,
        "groups": 0,
        "groups_pruned": 0,
        "choices": 0,
    }
    groups = []
    overlap = problem.training.overlap_grad_sync
    for config in configurations(problem, options):
        if general:
            # the rank order is part of the placement here
            key = (config.tp, config.cp, config.ep, config.etp, config.dp, config.pp)
            key += (config.microbatch_size,)
            key += (config.zero_stage, config.schedule, config.virtual_stages)
            key += (config.optimizer_offload, config.activation_offload, config.zero_shard)
            if key in seen_configs:
                continue
            seen_configs.add(key)
        stats["configurations"] += 1
        if upper_s is not None:
            floor_s = _config_floor_s(problem, config, shared, modes, general)
            if floor_s > upper_s * (1 + SLACK):
                # before its placements are enumerated: the floor holds for all of them
                stats["configurations_pruned"] += 1
                continue
        grids = [None]
        if general:
            shape = (config.tp, config.cp, config.dp, config.pp, config.ep, config.etp)
            if shape not in classes:
                classes[shape] = placement_classes(
                    problem.cluster,
                    tp=config.tp,
                    cp=config.cp,
                    dp=config.dp,
                    pp=config.pp,
                    ep=config.ep,
                    max_visits=max_placements,
                    etp=config.etp,
                )
            grids = classes[shape]
        for grid in grids:
            sm = StageModel(problem, config, shared, grid=grid)
            if config.schedule is Schedule.INTERLEAVED:
                ranks = _interleaved(sm, modes)
            else:
                ranks = _one_f_one_b(sm, modes)
            stats["groups"] += 1
            if not all(ranks):
                stats["groups_pruned"] += 1
                continue
            a, b = pipeline_coefficients(sm.m, config.schedule, config.virtual_stages)
            group = Group(config, sm.grid, general, sm.m, a, b, overlap, ranks)
            if upper_s is not None and not _prune(group, upper_s):
                stats["groups_pruned"] += 1
                continue
            groups.append(group)
            stats["choices"] += sum(len(choices) for choices in group.ranks)
    stats["placement_classes"] = sum(len(v) for v in classes.values()) if general else None
    return groups, stats
