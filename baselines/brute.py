"""``brute``: enumerate the NEST space plan by plan and score each with the shared evaluator.

The oracle for the DP's exactness: every configuration of :mod:`nest.dp.space`; for 1F1B every
contiguous partition of the chain into ``pp`` stages, for the interleaved schedule and ZB-V its
one partition (:func:`~nest.dp.space.fixed_chunks`); and every recompute mode per stage or
chunk (only those holding blocks differ by mode), with ``block`` in ``solver.recompute`` also
every count of fully recomputed first blocks per 1F1B / ZB-H2 stage
(:func:`~nest.dp.space.block_options`), each turned into a plan and passed to
:func:`nest.cost.evaluate`. It shares the space definition with ``nest``, never its cost code.
Only for tiny problems: ``max_plans`` stops it with an error before it runs for hours.

``top_k = K``: the best plan of each configuration
(:meth:`~nest.core.plan.ParallelConfig.unordered`:
the configuration without its rank order, as ``nest`` counts them), sorted by iteration time
(ties: the first enumerated first), the first K returned: the oracle of ``nest``'s top K.
"""

import time
from itertools import combinations, product
from math import comb

from nest.core.axes import Recompute
from nest.core.errors import UserError
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.dp.planner import check_top_k, plan_from_choices
from nest.dp.space import (
    SpaceOptions,
    SpacePlanner,
    block_options,
    configurations,
    fixed_chunks,
)
from nest.planner import finish, infeasible_memory


def partitions(n_layers: int, parts: int):
    """Every split of ``0..n_layers-1`` into ``parts`` non-empty contiguous ranges."""
    for cuts in combinations(range(1, n_layers), parts - 1):
        bounds = (0, *cuts, n_layers)
        yield [(bounds[k], bounds[k + 1] - 1) for k in range(parts)]


def count_plans(problem: Problem, options: SpaceOptions) -> int:
    """How many plans :class:`BrutePlanner` would score (without scoring them)."""
    modes = len(options.recompute_modes)
    n = problem.num_layers
    blocks = [ref.kind.value == "block" for ref in problem.model.chain]
    total = 0
    for config in configurations(problem, options):
        if fixed_chunks(config, n) is not None:
            total += modes ** (config.pp * config.virtual_stages)
        elif config.pp == 1:
            total += modes if any(blocks) else 1
        else:
            total += comb(n - 1, config.pp - 1) * modes**config.pp  # an upper bound
    return total


def one_f_one_b_plans(n_layers: int, pp: int, modes: int) -> int:
    """Plans :class:`BrutePlanner` scores for one 1F1B configuration: the partitions of a chain
    (embedding, blocks, head) into ``pp`` stages, times a mode for each stage holding a block.

    A stage holds no block only when it is the embedding or the head alone; counting by which
    ends stand alone, the other ``k`` stages split the other layers with at least one layer each,
    and two (embedding or head with a block) at an end that does not stand alone.
    """
    if pp == 1:
        return modes
    total = 0
    for first_alone in (False, True):
        for last_alone in (False, True):
            k = pp - first_alone - last_alone
            layers = n_layers - first_alone - last_alone
            least = k + (not first_alone) + (not last_alone)
            if k >= 1 and layers >= least:
                total += comb(layers - least + k - 1, k - 1) * modes**k
    return total


def plans_to_score(problem: Problem, options: SpaceOptions, stop_above: int) -> int:
    """Exactly how many plans :class:`BrutePlanner` scores (:func:`count_plans` is an upper
    bound), counting until past ``stop_above``."""
    modes = len(options.recompute_modes)
    total = 0
    blocks = _blocks(problem)
    for config in configurations(problem, options):
        if fixed_chunks(config, problem.num_layers) is not None:
            total += modes ** (config.pp * config.virtual_stages)  # every chunk holds blocks
        elif options.block_bases(config):  # choices per stage depend on its blocks: counted
            for parts in partitions(problem.num_layers, config.pp):
                count = 1
                for choices in stage_choices(parts, blocks, options, config):
                    count *= len(choices)
                total += count
                if total > stop_above:
                    break
        else:
            total += one_f_one_b_plans(problem.num_layers, config.pp, modes)
        if total > stop_above:
            break
    return total


def _blocks(problem: Problem) -> set[int]:
    return {i for i, ref in enumerate(problem.model.chain) if ref.kind.value == "block"}


def stage_choices(parts, blocks: set[int], options: SpaceOptions, config) -> list:
    """Per stage ``(i, j)`` of a partition, its recompute choices: the listed modes when it
    holds a block (``none`` otherwise), and with ``block`` the every-n-blocks options
    (:func:`~nest.dp.space.block_options`)."""
    modes, bases = options.recompute_modes, options.block_bases(config)
    out = []
    for i, j in parts:
        held = len(blocks.intersection(range(i, j + 1)))
        out.append([*modes, *block_options(bases, held)] if held else [Recompute.NONE])
    return out


class BrutePlanner(SpacePlanner):
    def __init__(
        self, *, name: str = "brute", max_plans: int = 200_000, top_k: int = 1, **space
    ) -> None:
        super().__init__(name=name, **space)
        self.max_plans = max_plans
        self.top_k = top_k
        """How many configurations :meth:`solve_ranked` returns (module docstring)."""

    def solve(self, problem: Problem):
        """The optimal plan (the first of :meth:`solve_ranked`)."""
        return self.solve_ranked(problem)[0]

    def solve_ranked(self, problem: Problem) -> list:
        """The best plan of each of the ``top_k`` best configurations, best first."""
        started = time.perf_counter()
        top_k = check_top_k(self.top_k, self.name, limit=None)  # max_plans bounds the time
        options = self.options()
        # refused up front, not after scoring max_plans of them (minutes on a long chain)
        if plans_to_score(problem, options, self.max_plans) > self.max_plans:
            raise UserError(
                f"solver=brute: more than max_plans={self.max_plans} plans; use "
                "solver=nest, a smaller problem, or raise solver.max_plans"
            )
        blocks = _blocks(problem)
        best: dict = {}  # configuration without rank order -> (time, enumeration index, plan)
        best_peak, scored = None, 0
        for config in configurations(problem, options):
            chunks = fixed_chunks(config, problem.num_layers)
            splits = [chunks] if chunks is not None else partitions(problem.num_layers, config.pp)
            for parts in splits:
                for combo in product(*stage_choices(parts, blocks, options, config)):
                    scored += 1
                    if scored > self.max_plans:
                        raise UserError(
                            f"solver=brute: more than max_plans={self.max_plans} plans; use "
                            "solver=nest, a smaller problem, or raise solver.max_plans"
                        )
                    choices = [(i, j, mode) for (i, j), mode in zip(parts, combo, strict=True)]
                    plan = plan_from_choices(problem, config, choices)
                    report = evaluate(problem, plan)
                    if not report.feasible:
                        peak = report.peak_memory_bytes
                        best_peak = peak if best_peak is None else min(best_peak, peak)
                        continue
                    key = config.unordered()
                    if key not in best or report.iteration_time_s < best[key][0]:
                        best[key] = (report.iteration_time_s, scored, plan)
        if not best:
            raise infeasible_memory(problem, self.name, best_peak)
        ranked = sorted(best.values(), key=lambda e: e[:2])[:top_k]
        search = {"plans_scored": scored, "configurations_with_a_plan": len(best)}
        return [
            finish(
                self.name,
                problem,
                plan,
                started_s=started,
                status="optimal" if rank == 1 else "alternative",
                n_evaluations=scored,
                search=search if rank == 1 else {"rank": rank},
            )[0]
            for rank, (_, _, plan) in enumerate(ranked, start=1)
        ]
