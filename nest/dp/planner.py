"""``nest``: the exact structured dynamic program.

Search space (:mod:`nest.dp.space`, its single definition): ``tp, cp, ep, dp, pp`` with product
at most the devices (idle devices allowed), microbatch size, ZeRO stage 0-3, every rank order with
``tp`` innermost, and either 1F1B with a non-uniform contiguous partition of the whole chain
(embedding and head are layers) and a recompute mode per stage, or Megatron's interleaved schedule
with ``v`` virtual stages, its even chunks (:func:`nest.dp.space.interleaved_chunks`) and a
recompute mode per chunk.

Two levels:
1. Configurations, best first by a lower bound (:mod:`nest.dp.bounds`: compute, cheapest
   recompute, the cheapest possible tensor / context / expert / ZeRO-3 / p2p traffic, the exposed
   sync of rank 0 and the optimizer step, each proven a floor there). The bound does not depend
   on the rank order, so it is computed once per (family, ZeRO stage, schedule) and the orders
   are expanded only when visited. Entries are visited in increasing bound and the search stops
   at the first whose bound exceeds the best plan found: none after it can be better. A
   family's entries are bounded only when the search reaches its floor (:class:`LazyRanking`,
   the same order as bounding them all), so most families are never bounded.
2. For each configuration, the recurrence of :mod:`nest.dp.recurrence` (1F1B) or
   :mod:`nest.dp.interleaved` finds the optimal partition and recompute modes exactly, pruning
   only by dominance and by bound.

A heuristic first pass (one label per state) over the best-bounded configurations seeds the
incumbent. The returned plan is re-scored by the shared evaluator (``finish``), and that value is
the reported objective. Exactness is tested against ``solver=brute`` on random small problems.

**The K best configurations** (``top_k``, :class:`TopK`). Two plans belong to the same
*configuration* when their :meth:`~nest.core.plan.ParallelConfig.unordered` configurations are
equal:
the same ``tp, cp, ep, dp, pp``, microbatch size, ZeRO stage, schedule and virtual stages; the
rank order, partition and recompute modes are what the search chooses *for* a configuration (its
best placement). One bound entry of level 1 is exactly one configuration. With ``top_k = K`` the
search returns the best plan of each of the K configurations whose best plans are fastest, best
first. The threshold that replaces the incumbent is ``theta``, the K-th smallest value among the
configurations with a plan found so far (infinite while fewer than K have one), and a
configuration's own solves use ``min(theta, its best so far)``. Why nothing of the top K is lost:
every value found is that of a real plan, so it is at least its configuration's optimum ``v_c``,
and ``theta`` is at least ``theta*``, the K-th smallest ``v_c`` of the whole space (the K-th
smallest of upper bounds of K distinct configurations' optima is at least the K-th smallest
optimum). A configuration of the top K has ``bound_c <= v_c <= theta* <= theta`` at every moment:
the search does not stop before it (it stops at the first bound above ``theta``), and its optimal
rank order is solved with an incumbent ``min(theta, best_c) >= v_c``, which the per-configuration
DPs (exact below their incumbent, ties kept) return. Configurations whose bound exceeds ``theta``
have ``v_c >= bound_c > theta >= theta*`` and cannot enter the top K. Heuristic (seed) values are
real plans' values, so they may set ``theta``; a configuration that the seed found is solved again
exactly when its bound is reached. With ``K = 1``, ``theta`` is the best value found and every
incumbent is the one the single-best search used, so the search does the same work.
"""

import gc
import heapq
import time
from bisect import bisect_right
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from nest.core.axes import Axis, Recompute, Schedule, parse_rank_order
from nest.core.errors import Infeasible, UserError
from nest.core.plan import ParallelConfig, Plan, make_structured_plan, uniform_partition
from nest.core.problem import Problem
from nest.core.segment import on_cluster, segment_view
from nest.cost import evaluate
from nest.dp.bounds import Floors
from nest.dp.dualpipe_v import solve_dualpipe_v
from nest.dp.interleaved import smallest_peak_interleaved, solve_interleaved
from nest.dp.recurrence import DPStats, solve_config
from nest.dp.space import SpaceOptions, SpacePlanner, families
from nest.dp.stages import StageModel
from nest.dp.zb_v import smallest_peak_zb_v, solve_zb_v
from nest.planner import finish, infeasible_memory, memory_fix

BOUND_SLACK = 1e-12
"""Relative slack before a bound prunes: floors are sums of the same floating-point terms as
the evaluator's, in another order, so an exactly tight floor may exceed the value by rounding."""


def _floor_modes(options) -> tuple[Recompute, ...]:
    """The modes the floors take: the listed ones, and ``full`` with every-n-blocks options,
    which fully recompute some blocks (per layer the floors are the least over the modes, so
    they stay floors of every option)."""
    modes = options.recompute_modes
    if options.block_recompute and Recompute.FULL not in modes:
        return (*modes, Recompute.FULL)
    return modes


def plan_from_choices(problem: Problem, config: ParallelConfig, choices) -> Plan:
    """The structured plan of a configuration and its (first, last, mode) stages or chunks."""
    training = problem.training
    return make_structured_plan(
        config,
        layer_counts=[j - i + 1 for i, j, _ in choices],
        recompute=[mode for _, _, mode in choices],
        num_microbatches=training.global_batch // (config.microbatch_size * config.dp),
        sequence_parallel=training.sequence_parallel,
    )


LEAST_STORING_FIRST = (
    Recompute.FULL,
    Recompute.NOTHING_SAVEABLE,
    Recompute.QKV_PROJ,
    Recompute.QKV_OUT_PROJ,
    Recompute.MLA_UP_MLP_MOE,
    Recompute.MLP_MOE,
    Recompute.SELECTIVE_MLP,
    Recompute.MLP,
    Recompute.OP,
    Recompute.DOTS,
    Recompute.SELECTIVE,
    Recompute.MLA_UP,
    Recompute.NONE,
)
"""Recompute modes from the one that stores the least activations (``op`` as it ranks on a
gated-MLP block like Llama's: below ``selective``, above ``mlp``; ``mlp_moe`` as it ranks on a
MoE block, where it keeps nothing of the experts; the memory fix only starts from it)."""


def least_memory_plan(problem: Problem, config: ParallelConfig, n_layers: int, modes) -> Plan:
    """A plan of ``config`` the memory fix starts from when nothing fits: the chain split evenly
    over the chunks, each in the searched mode that stores the least. Near the configuration's
    least peak (:func:`smallest_peak_bytes` gives that number exactly), not the same plan."""
    mode = next(m for m in LEAST_STORING_FIRST if m in set(modes))
    chunks = config.pp * config.virtual_stages
    counts = uniform_partition(n_layers, chunks)
    first, choices = 0, []
    for count in counts:
        choices.append((first, first + count - 1, mode))
        first += count
    return plan_from_choices(problem, config, choices)


def _solver_of(config: ParallelConfig):
    """The exact solver of a configuration's plans: DualPipeV's (:mod:`nest.dp.dualpipe_v`),
    ZB-V's (:mod:`nest.dp.zb_v`), the interleaved DP (:mod:`nest.dp.interleaved`) or the stage
    DP (:mod:`nest.dp.recurrence`)."""
    if config.schedule is Schedule.DUALPIPE_V:
        return solve_dualpipe_v
    if config.schedule.v_shaped:
        return solve_zb_v
    return solve_interleaved if config.interleaved else solve_config


def smallest_peak_bytes(sm: StageModel, modes) -> float:
    """The least per-device peak memory of any plan of this configuration (a min-max DP over
    the partition and recompute modes, ignoring time): what the device would need."""
    if sm.config.interleaved:
        return smallest_peak_interleaved(sm, modes)
    n, pp = sm.n_layers, sm.config.pp
    best = np.full(n + 1, np.inf)  # best[i]: least peak of ranks so far holding layers < i
    best[0] = 0.0
    for r in range(pp):
        rest = pp - r - 1
        nxt = np.full(n + 1, np.inf)
        for i in np.flatnonzero(np.isfinite(best)):
            peak = np.maximum(best[i], sm.least_memory_from(r, int(i), modes))  # j = i .. n-1
            if rest:
                ends = slice(i + 1, n - rest + 1)  # next state j + 1, leaving a layer per rank
                nxt[ends] = np.minimum(nxt[ends], peak[: n - rest - i])
            else:
                nxt[n] = min(nxt[n], peak[-1])
        best = nxt
    return float(best[n])


def _space_rules(problem: Problem, options: SpaceOptions) -> list[str]:
    """The divisibility rules of :func:`nest.dp.space.families` that apply to this problem."""
    model, spec = problem.model, problem.model.spec
    n = problem.cluster.num_devices
    rules = [
        *model.shard_rules(),
        "dp must divide the global batch",
        f"tp must divide the {n} devices and cp the devices / tp",
    ]
    if "interleaved" in options.schedules:
        rules.append(
            f"interleaved needs pp*v to divide the {spec.layers} blocks (or the {spec.layers} + 2 "
            "with the embedding and the head counted as layers) and pp the microbatches"
        )
    return rules


def empty_space_error(problem: Problem, options: SpaceOptions) -> UserError:
    given = {
        k: getattr(options, k)
        for k in ("tp", "cp", "ep", "pp", "virtual_stages")
        if getattr(options, k) is not None
    }
    given["schedules"] = options.schedules
    restriction = ", ".join(f"solver.{k}={list(v)}" for k, v in given.items())
    rules = "; ".join(_space_rules(problem, options))
    return UserError(
        f"the search space is empty for {problem.model.name} on "
        f"{problem.cluster.num_devices} devices with {restriction}: no (tp, cp, ep, dp, pp, "
        f"microbatch, schedule) passes the divisibility rules ({rules}); "
        "widen solver.tp/cp/ep/pp/schedules/virtual_stages or change training.microbatch_sizes"
    )


MAX_TOP_K = 100
"""The most configurations ``solver.top_k`` asks for. The search for the K best grows with K
(the threshold that prunes configurations is the K-th best): llama2_7b on dgx_8x8 takes 9 s with
K = 100, 199 s with K = 1,000 and 736 s with K = 100,000 (2 shared cores, 2026-12), and a table
of more than 100 alternatives is not read."""


def check_top_k(top_k, solver: str, limit: int | None = MAX_TOP_K) -> int:
    """``solver.top_k`` as an integer in 1..``limit`` (:data:`MAX_TOP_K`; None: no limit, for a
    planner whose time K does not change, e.g. ``brute``), or a one-line error naming the
    value."""
    if isinstance(top_k, bool) or not isinstance(top_k, int | np.integer) or top_k < 1:
        raise UserError(
            f"solver.top_k={top_k!r} must be a positive integer: how many configurations "
            f"{solver} returns, best first (1: the optimum only)"
        )
    if limit is not None and top_k > limit:
        raise UserError(
            f"solver.top_k={top_k} is beyond the limit of {limit} configurations "
            f"(nest/dp/planner.py MAX_TOP_K): the search grows with K (K = 1,000 takes minutes); "
            f"use at most solver.top_k={limit}"
        )
    return int(top_k)


@dataclass(slots=True)
class TopK:
    """The best plan found per configuration, for the K configurations whose are fastest (module
    docstring, "The K best configurations"), and the threshold ``theta`` they set."""

    k: int
    best: list = field(default_factory=list)
    """``[value, key, config, choices]`` of at most ``k`` configurations, by increasing value
    (ties: the first found first)."""
    threshold: float = float("inf")
    """The k-th best value (``theta``), infinite while fewer than ``k`` configurations have one."""
    kept: dict = field(default_factory=dict)
    """key -> its value, for the configurations in ``best``."""

    def incumbent(self, key) -> float:
        """What a solve of configuration ``key`` must not exceed to matter."""
        return self.kept.get(key, self.threshold)

    def offer(self, key, value: float, config, choices) -> None:
        """A plan of ``key`` worth ``value`` (kept if it improves the key's entry or enters)."""
        if key in self.kept:
            if value >= self.kept[key]:
                return
            del self.best[next(i for i, e in enumerate(self.best) if e[1] == key)]
        elif len(self.best) == self.k and value >= self.threshold:
            return
        at = bisect_right(self.best, value, key=itemgetter(0))  # after equal values
        self.best.insert(at, [value, key, config, choices])
        self.kept[key] = value
        for _, dropped, _, _ in self.best[self.k :]:
            del self.kept[dropped]
        del self.best[self.k :]
        if len(self.best) == self.k:
            self.threshold = self.best[-1][0]


def _visit(entries, floors: Floors, capacity_bytes: float, fits: dict, over: list):
    """(bound less the slack, key, configuration) of the ranked entries' configurations, every
    rank order of an entry, skipping the entries whose memory floor exceeds the capacity (no
    plan of theirs fits): floors checked on the first visit only and kept in ``fits`` (key ->
    fits), the keys over it in ``over``. The key is the entry, i.e. the configuration without
    its rank order (module docstring)."""
    for bound, key, family, schedule, zero, offload in entries:
        ok = fits.get(key)
        if ok is None:
            need = floors.memory_floor_bytes(family, zero, schedule, offload)
            ok = fits[key] = need <= capacity_bytes
            if not ok:
                over.append(key)
        if not ok:
            continue
        for order in family.orders:
            yield bound * (1 - BOUND_SLACK), key, family.config(schedule, zero, order, offload)


FLOOR_SLACK = 1e-9
"""Relative slack below a family's floor (:meth:`Floors.family_floor_s`) where the lazy ranking
keys it: the floor and the entries' bounds sum the same terms in other orders, so a floor that
is tight in exact arithmetic may exceed a bound by rounding."""


class LazyRanking:
    """The entries of :meth:`NestPlanner._ranked`, in the same order (increasing bound, ties in
    space order), with each family's bounds computed only when the search reaches its floor.

    Why the order is the same: a family enters a heap keyed ``(floor, 0, family index)`` with
    its floor (:meth:`Floors.family_floor_s`, lowered by :data:`FLOOR_SLACK`) at most every
    bound of its entries; when it leaves the heap its entries enter keyed ``(bound, 1, space
    index)``. An entry that precedes ``(b, 1, k)`` in the full order has a bound ``<= b``, so
    its family's key is below ``(b, 1, k)`` and left the heap first: every entry that precedes
    it is in the heap (or out of it) when it leaves, and the heap returns entries by bound, then
    space index. Iterating again replays the entries returned so far and goes on from there
    (the search's seed and exact passes each walk a prefix)."""

    def __init__(self, fams, floors: Floors) -> None:
        self.floors = floors
        self.fams = fams
        self.starts, total = [], 0
        for family in fams:
            self.starts.append(total)
            total += len(family.schedules) * len(family.zeros) * len(family.offloads)
        self.total = total
        """Entries of the space (bounded or not)."""
        self.computed = 0
        """Entries whose bound has been computed."""
        self.spent_s = 0.0
        """Seconds spent computing entries' bounds (after the families' floors)."""
        self._heap = [
            (floors.family_floor_s(f) * (1 - FLOOR_SLACK), 0, i) for i, f in enumerate(fams)
        ]
        heapq.heapify(self._heap)
        self._done: list = []

    def __iter__(self):
        i = 0
        while i < len(self._done) or self._advance():
            yield self._done[i]
            i += 1

    def _advance(self) -> bool:
        """Move the next entry in order to ``_done``; False when none is left."""
        heap = self._heap
        while heap:
            item = heapq.heappop(heap)
            if item[1] == 1:
                self._done.append((item[0], item[2], *item[3:]))
                return True
            started = time.perf_counter()
            family, start = self.fams[item[2]], self.starts[item[2]]
            triples = family.entries()
            bounds = self.floors.family_bounds_s(family, triples)
            for j, (b, (sc, z, o)) in enumerate(zip(bounds, triples, strict=True)):
                heapq.heappush(heap, (b, 1, start + j, family, sc, z, o))
            self.computed += len(triples)
            self.spent_s += time.perf_counter() - started
        return False


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused for the search, as it was before afterwards:
    the search builds hundreds of thousands of long-lived tuples (bounds, labels, cached
    arrays) that hold no reference cycles, and each full collection rescans all of them (about
    a third of the ranking's time for llama3_405b on 16,384 GPUs); reference counting still
    frees everything that is dropped."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


RUNNABLE_ORDERS = {
    # Megatron-LM lays ranks out tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping
    # (megatron/core/parallel_state.py, as nest/export/megatron.py maps them)
    "megatron": ((Axis.TP, Axis.CP, Axis.DP, Axis.PP), (Axis.TP, Axis.CP, Axis.PP, Axis.DP)),
}
"""``solver.export_runnable``: the rank orders each export target runs. Every target also applies
one recompute mode to every stage that holds blocks (Megatron's ``--recompute-granularity`` and
``--recompute-method uniform``) and leaves out ZB-H1 (no upstream Megatron-LM schedule); GPipe
is outside the NEST space already. With FP8 parameter
gather Megatron also needs the distributed optimizer: ZeRO >= 1 wherever there is data
parallelism."""


def check_export_runnable(value) -> str | None:
    """``solver.export_runnable`` as a target name, or a one-line error naming the value."""
    if value is None or str(value).lower() in ("none", "null", ""):
        return None
    if str(value).lower() not in RUNNABLE_ORDERS:
        raise UserError(
            f"solver.export_runnable={value!r}; use one of {sorted(RUNNABLE_ORDERS)} (search only "
            "plans that target runs as planned) or null (the whole space)"
        )
    return str(value).lower()


def _need(error: Infeasible) -> float:
    """The least memory an infeasible search says any plan needs (infinite when unknown)."""
    need = error.min_memory_bytes
    return float("inf") if need is None else need


class NestPlanner(SpacePlanner):
    def __init__(
        self,
        *,
        name: str = "nest",
        seed_configs: int = 200,
        top_k: int = 1,
        export_runnable: str | None = None,
        segments: bool = True,
        **space,
    ) -> None:
        super().__init__(name=name, **space)
        if not isinstance(segments, bool):
            raise UserError(
                f"solver.segments={segments!r} must be true or false (also search a power-of-two "
                "share of every scale-up domain: docs/plan/presets.md, GB200 NVL72)"
            )
        self.segments = segments
        """Also search the cluster's segment view (:mod:`nest.core.segment`) and return the
        faster (:meth:`solve_ranked`)."""
        self.export_runnable = export_runnable
        """Keep the search inside what an export target runs (:data:`RUNNABLE_ORDERS`)."""
        self.seed_configs = seed_configs
        """Configurations the heuristic first pass visits to seed the bound (up to ten times
        as many while none of them has a plan that fits)."""
        self.top_k = top_k
        """How many configurations :meth:`solve_ranked` returns (module docstring)."""

    @staticmethod
    def _ranked(fams, floors: Floors):
        """(bound, index, family, schedule, zero, offload) of every entry, in increasing bound
        (ties in space order). Memory floors are not computed here: the search checks them only
        for the entries it visits (:meth:`_search`), a few thousand of the hundreds of
        thousands."""
        entries = []
        for family in fams:
            triples = family.entries()
            bounds = floors.family_bounds_s(family, triples)
            k = len(entries)
            entries += [
                (b, k + i, family, sc, z, o)
                for i, (b, (sc, z, o)) in enumerate(zip(bounds, triples, strict=True))
            ]
        entries.sort(key=itemgetter(0))  # stable: ties stay in space order
        return entries

    def _smallest_need_bytes(self, problem, entries, floors, shared) -> tuple[float, object]:
        """The least peak memory of any plan of the space, visiting configurations in
        increasing memory floor and stopping when the floor reaches the best found."""
        modes = self.options().recompute_modes
        ranked = sorted(
            (floors.memory_floor_bytes(f, z, s, o), k, f, s, z, o) for _, k, f, s, z, o in entries
        )
        best, least = float("inf"), None
        for need, _, family, schedule, zero, offload in ranked:
            if need >= best:
                break
            for order in family.orders:
                config = family.config(schedule, zero, order, offload)
                sm = StageModel(problem, config, shared)
                if config.schedule.v_shaped:
                    peak, choices = smallest_peak_zb_v(sm, modes)
                    if peak < best:
                        best, least = peak, plan_from_choices(problem, config, choices)
                    continue
                peak = smallest_peak_bytes(sm, modes)
                if peak < best:
                    best, least = peak, least_memory_plan(problem, config, sm.n_layers, modes)
        return best, least

    def solve(self, problem: Problem) -> Plan:
        """The optimal plan (the first of :meth:`solve_ranked`)."""
        return self.solve_ranked(problem)[0]

    def _solve_runnable(self, problem: Problem) -> list[Plan]:
        """The space restricted to what ``export_runnable`` runs: its rank orders and one
        recompute mode for every stage. Solved exactly as one search per mode (each exact on
        its sub-space), merged by configuration: a configuration of the restricted top K is in
        the top K of the mode its best plan uses (fewer than K configurations beat it there,
        as each value there is at least that configuration's restricted optimum)."""
        target = check_export_runnable(self.export_runnable)
        options = self.options()
        if options.offload:
            raise UserError(
                f"solver.export_runnable={target} with solver.offload=true: the runnable search "
                "does not cover offload (Megatron's CPU offloading refuses pipelines, "
                "recomputation and ZeRO-0 with data parallelism); drop one of the two"
            )
        allowed = RUNNABLE_ORDERS[target]
        given = [parse_rank_order(o) for o in options.rank_orders or ()] or list(allowed)
        orders = ["-".join(str(a) for a in o) for o in given if o in allowed]
        if not orders:
            raise UserError(
                f"solver.rank_orders={list(options.rank_orders)} has no order {target} runs "
                f"(solver.export_runnable={target}); use "
                f"{['-'.join(str(a) for a in o) for o in allowed]} or drop one of the two"
            )
        # upstream Megatron-LM has no zero-bubble schedule (nest/export/megatron.py)
        schedules = [k.value for k in options.schedule_kinds if not k.splits_backward]
        if not schedules:
            raise UserError(
                f"solver.schedules={list(options.schedules)} has no schedule {target} runs "
                f"(solver.export_runnable={target}); add 1f1b or interleaved"
            )
        zeros = list(options.zero_stages)
        if target == "megatron" and problem.training.numerics.param_gather:
            # --fp8-param-gather needs the distributed optimizer (megatron/training/arguments.py);
            # without data parallelism the space has ZeRO-0 only, which the export runs with it
            zeros = [z for z in zeros if z >= 1]
            if not zeros:
                raise UserError(
                    f"solver.zero_stages={list(options.zero_stages)} has no stage Megatron runs "
                    "with training.fp8_param_gather (it needs the distributed optimizer: ZeRO >= "
                    "1); add 1, 2 or 3, or set training.fp8_param_gather=false"
                )
        found, last_error = [], None
        # one mode for every stage: every-n-blocks options differ per stage (left out)
        for mode in (str(m) for m in options.recompute_modes):
            sub = NestPlanner(
                name=self.name,
                seed_configs=self.seed_configs,
                top_k=self.top_k,
                segments=False,
                **{
                    **self.space_kwargs(),
                    "recompute": [mode],
                    "rank_orders": orders,
                    "zero_stages": zeros,
                    "schedules": schedules,
                },
            )
            try:
                found += sub.solve_ranked(problem)
            except (UserError, Infeasible) as error:  # nothing fits with this mode everywhere
                last_error = error
        if not found:
            raise last_error
        best: dict = {}
        for plan in sorted(found, key=lambda p: p.objective_s):  # stable: first mode on ties
            best.setdefault(plan.config.unordered(), plan)
        plans = list(best.values())[: self.top_k]
        return [
            plan.with_record(
                status="optimal" if rank == 0 else "alternative",
                search={**plan.search, "export_runnable": target} if rank == 0 else plan.search,
            )
            for rank, plan in enumerate(plans)
        ]

    def solve_ranked(self, problem: Problem) -> list[Plan]:
        """The best plan of each of the ``top_k`` best configurations, best first, each scored
        by the shared evaluator; fewer when fewer configurations have a plan that fits. With
        :attr:`segments`, over the union of the space on the cluster and on its segment view
        (:meth:`_solve_segmented`)."""
        view = segment_view(problem.cluster) if self.segments else None
        if view is not None:
            return self._solve_segmented(problem, view)
        return self._solve_given(problem)

    def _solve_given(self, problem: Problem, cutoff_s: float = float("inf")) -> list[Plan]:
        """:meth:`solve_ranked` on the cluster as given; ``cutoff_s``: only plans faster than
        it matter (an empty list when none is)."""
        if check_export_runnable(self.export_runnable) is not None:
            return self._solve_runnable(problem)
        with _collector_paused():
            return self._search(problem, cutoff_s)

    def _solve_segmented(self, problem: Problem, view) -> list[Plan]:
        """The union of two spaces: the structured plans on the cluster as given, and those on
        its segment view (:func:`nest.core.segment.segment_view`: a power-of-two share of every
        scale-up domain, the rest idle) renamed to the cluster's devices. A view plan costs on
        the cluster exactly what it costs on the view (:mod:`nest.core.segment`); each is
        re-scored there by the evaluator, and a value it does not confirm is a bug.

        Exact: each search is exact on its space, so the better of the two optima is the
        union's. With ``top_k = 1`` the view's search only looks for plans faster than the
        given cluster's optimum (a cutoff that prunes as the incumbent does; ties keep the
        plan on the given cluster). With ``top_k = K > 1`` both searches return their K best
        configurations and they are merged by configuration, each keeping its faster plan: a
        configuration of the union's top K is in the top K of the space its best plan lies in,
        as fewer than K configurations beat it there (each of their values is at least their
        union value). A view with no plan (an empty space or nothing fits there) leaves the
        given cluster's answer; when neither has a plan, the error with the smaller memory
        need is raised."""
        started = time.perf_counter()
        given, error = [], None
        try:
            given = self._solve_given(problem)
        except Infeasible as exc:
            error = exc
        single = self.top_k == 1 and given
        cutoff_s = given[0].objective_s if single else float("inf")
        sub = Problem(model=problem.model, cluster=view, training=problem.training)
        try:
            segmented = self._solve_given(sub, cutoff_s)
        except (Infeasible, UserError) as exc:
            if error is None:
                segmented = []
            elif isinstance(exc, Infeasible) and _need(exc) < _need(error):
                raise exc from None
            else:
                raise error from None
        renamed = []
        for plan in segmented:
            moved = on_cluster(plan, view, problem.cluster)
            report = evaluate(problem, moved)
            value_s = plan.objective_s
            if not report.feasible or abs(report.iteration_time_s - value_s) > 1e-9 * value_s:
                raise AssertionError(
                    f"nest: a plan of the segment view {view.name} costs {value_s!r} s there "
                    f"but {report.iteration_time_s!r} s on {problem.cluster.name} "
                    f"(feasible={report.feasible}); please report"
                )
            renamed.append(moved.with_record(objective_s=report.iteration_time_s))
        best: dict = {}
        for plan in sorted(given + renamed, key=lambda p: p.objective_s):  # stable: given first
            best.setdefault(plan.config.unordered(), plan)
        plans = list(best.values())[: self.top_k]
        domain = problem.cluster.levels[0]
        record = {
            "segment_devices_per_domain": view.levels[0].fanout,
            "segment_domain": f"{domain.name} x{domain.fanout}",
            "segment_chosen": bool(renamed) and plans[0] is renamed[0],
            "segment_given_objective_s": given[0].objective_s if given else None,
            "segment_view_objective_s": renamed[0].objective_s if renamed else None,
        }
        elapsed_s = time.perf_counter() - started
        return [
            plan.with_record(
                status="optimal" if rank == 0 else "alternative",
                solve_time_s=elapsed_s,
                search={**plan.search, **record} if rank == 0 else plan.search,
            )
            for rank, plan in enumerate(plans)
        ]

    def _search(self, problem: Problem, cutoff_s: float = float("inf")) -> list[Plan]:
        """:meth:`solve_ranked` of the whole space (module docstring); ``cutoff_s`` (with
        ``top_k = 1``): start the threshold there, so only plans at most that fast are solved
        for, and return an empty list when none is. Long: its two phases and the search record
        share a dozen locals (the timers, the ranking, the memory-floor bookkeeping) that a split
        would pass around."""
        started, started_cpu = time.perf_counter(), time.process_time()
        top = TopK(check_top_k(self.top_k, self.name), threshold=cutoff_s)
        options = self.options()
        modes = options.recompute_modes
        floors = Floors(problem, _floor_modes(options))
        shared: dict = {("floors", floors.modes): floors}
        fams = list(families(problem, options))
        if not fams:
            raise empty_space_error(problem, options)
        n_configs = sum(len(f) for f in fams)
        enumerated = time.perf_counter()
        entries = LazyRanking(fams, floors)
        bounded = time.perf_counter()
        stats = DPStats()
        capacity_bytes = problem.cluster.device.hbm_bytes
        fits: dict[int, bool] = {}  # entry key -> its memory floor is within the capacity
        over: list = []  # the visited entries whose memory floor exceeds it

        def configs():
            return _visit(entries, floors, capacity_bytes, fits, over)

        def solve_one(config, incumbent_s, exact):
            sm = StageModel(problem, config, shared)
            solver = _solver_of(config)
            extra = {"block_bases": options.block_bases(config)} if solver is solve_config else {}
            return solver(sm, modes, incumbent_s, stats, exact=exact, **extra)

        # Phase 1 (heuristic, one label per state) gives real plans whose times bound the
        # optima from above; phase 2 (exact) then prunes everything that cannot beat them.
        seeded = 0
        for bound, key, config in configs():
            # past seed_configs only while nothing fits yet (at most ten times as many)
            if bound > top.threshold or seeded >= self.seed_configs * (1 if top.best else 10):
                break
            seeded += 1
            found = solve_one(config, top.incumbent(key), False)
            if found is not None:
                top.offer(key, found[0], config, found[1])
        seed_s, seeded_at = top.best[0][0] if top.best else float("inf"), time.perf_counter()
        seed_bounds_s = entries.spent_s  # the bounds computed while seeding
        solved, worst_s = 0, 0.0
        for bound, key, config in configs():
            if bound > top.threshold:
                break
            solved += 1
            one_started = time.perf_counter()
            found = solve_one(config, top.incumbent(key), True)
            worst_s = max(worst_s, time.perf_counter() - one_started)
            if found is not None:
                top.offer(key, found[0], config, found[1])
        searched = time.perf_counter()
        search = {
            "configurations": n_configs,
            "configuration_bounds": entries.total,
            # the entries whose bound was computed (the rest lie beyond a family floor reached)
            "configuration_bounds_computed": entries.computed,
            "configuration_bounds_visited": len(fits),
            "configuration_bounds_over_memory": len(over),
            "configurations_solved": solved,
            # pruned by bound, by the memory floor, or after the last bound visited
            "configurations_not_solved": n_configs - solved,
            **stats.record(),
            "time_enumerate_s": enumerated - started,
            # the families' floors and every entry's bound computed, in whichever pass
            "time_bounds_s": bounded - enumerated + entries.spent_s,
            "time_seed_s": seeded_at - bounded - seed_bounds_s,
            "time_dp_s": searched - seeded_at - (entries.spent_s - seed_bounds_s),
            # the slowest exact solve of one configuration (a poor incumbent shows here first)
            "time_worst_configuration_s": worst_s,
            # CPU seconds of the whole search (the wall times above include other processes')
            "time_search_cpu_s": time.process_time() - started_cpu,
            "configurations_seeded": seeded,
            "seed_objective_s": seed_s,
            **({"top_k": top.k} if top.k > 1 else {}),
        }
        if not top.best:
            if cutoff_s < float("inf"):
                return []
            raise self._nothing_fits(problem, options, entries, floors, shared)
        return self._finished(problem, top.best, search, started, stats.stages_scored)

    def _nothing_fits(self, problem, options, entries, floors, shared):
        """The error of a search that found no plan: the least memory any plan would need
        (over every entry: the lazy ranking is expanded to the end)."""
        need, least = self._smallest_need_bytes(problem, list(entries), floors, shared)
        error = infeasible_memory(
            problem,
            self.name,
            need,
            exact=True,
            zero_stages=options.zero_stages,
            recompute=options.recompute,
            offload=options.offload,
        )
        if least is None:
            return error
        fix = memory_fix(problem, least, evaluate(problem, least))
        return Infeasible(f"{error}; {fix}", min_memory_bytes=error.min_memory_bytes)

    def _finished(self, problem, best, search, started: float, n_evaluations: int) -> list[Plan]:
        """The ranked (value, key, config, choices) as plans scored by the evaluator, the first
        with the search record; a value the evaluator does not confirm is a bug."""
        plans = []
        for rank, (value_s, _, config, choices) in enumerate(best, start=1):
            plan, report = finish(
                self.name,
                problem,
                plan_from_choices(problem, config, choices),
                started_s=started,
                status="optimal" if rank == 1 else "alternative",
                n_evaluations=n_evaluations,
                search=search if rank == 1 else {"rank": rank},
            )
            # The DP's stage model must agree with the evaluator (tested on random plans); a
            # plan it scored differently is a bug, never reported as optimal.
            if not report.feasible or abs(value_s - report.iteration_time_s) > 1e-9 * value_s:
                raise AssertionError(
                    f"nest: the DP valued its plan (rank {rank}) at {value_s!r} s (fits) but "
                    f"evaluate() gives {report.iteration_time_s!r} s "
                    f"(feasible={report.feasible}); please report"
                )
            plans.append(plan)
        return plans
