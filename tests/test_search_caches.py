"""The search's caches return what the uncached computation returns (property tests on random
problems): placed floors and interleaved chunk costs shared through the search's ``shared`` dict
(keyed by the placement, the shard and the configuration's fields that matter), the pooled group
splits of a structured placement (keyed by the digits the groups run along), the bounds computed
per family, and the memory floors checked only where the search visits."""

import random

import numpy as np
import pytest

from nest.core.axes import Schedule
from nest.cost.groups import AXES
from nest.dp.bounds import Floors
from nest.dp.interleaved import solve_interleaved
from nest.dp.planner import NestPlanner
from nest.dp.recurrence import DPStats, solve_config
from nest.dp.space import SpaceOptions, families
from nest.dp.stages import StageModel

from .randomcase import random_problem

SEEDS = range(12)


def _configs(problem, rng: random.Random, count: int):
    """Up to ``count`` configurations of the full space, drawn at random, in random order."""
    configs = [c for f in families(problem, SpaceOptions()) for c in f.configs()]
    rng.shuffle(configs)
    return configs[:count]


@pytest.mark.parametrize("seed", SEEDS)
def test_shared_stage_terms_equal_a_fresh_stage_model(seed):
    """Placed floors, chunk costs and the placement's splits of a stage model built on a dict
    that many other configurations filled equal those of one built on an empty dict: a cache
    key that missed a dimension would hand one configuration another's value."""
    rng = random.Random(seed)
    problem = random_problem(rng, hbm_gib=4)
    modes = SpaceOptions().recompute_modes
    shared: dict = {}
    configs = _configs(problem, rng, 60)
    for config in configs:  # fill the caches in a random order
        sm = StageModel(problem, config, shared)
        sm.placed_floor_s(modes)
        if config.interleaved:
            for k in range(len(sm.chunks)):
                sm.chunk_costs(k, modes)
    for config in configs:
        cached, fresh = StageModel(problem, config, shared), StageModel(problem, config, {})
        np.testing.assert_array_equal(cached.placed_floor_s(modes), fresh.placed_floor_s(modes))
        for axis in AXES:
            assert cached._placement_splits(axis) == tuple(
                sorted({s for g in fresh.groups for s in g.splits(axis)})
            ), (config, axis)
        if config.interleaved:
            for k in range(len(fresh.chunks)):
                want = np.array([fresh.chunk_terms(k, mode) for mode in modes])
                np.testing.assert_array_equal(cached.chunk_costs(k, modes), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_family_bounds_equal_each_entry_alone(seed):
    """The bounds of a family's entries computed together equal each computed alone on fresh
    floors (nothing computed for one ZeRO stage or schedule leaks into another)."""
    rng = random.Random(seed)
    problem = random_problem(rng, hbm_gib=4)
    modes = SpaceOptions().recompute_modes
    floors = Floors(problem, modes)
    for family in families(problem, SpaceOptions()):
        pairs = [(s, z) for s in family.schedules for z in family.zeros]
        together = floors.family_bounds_s(family)
        alone = [Floors(problem, modes).config_bound_s(family, z, s) for s, z in pairs]
        assert together == alone, family


@pytest.mark.parametrize("seed", SEEDS)
def test_ranking_is_every_entry_by_bound_then_space_order(seed):
    """Every entry of the space is ranked (memory floors are checked later, where the search
    visits), by increasing bound, ties in space order, each with its own bound."""
    rng = random.Random(seed)
    problem = random_problem(rng)
    modes = SpaceOptions().recompute_modes
    floors = Floors(problem, modes)
    fams = list(families(problem, SpaceOptions()))
    entries = NestPlanner._ranked(fams, floors)
    space = [(f, s, z, o) for f in fams for s, z, o in f.entries()]
    assert sorted(e[1] for e in entries) == list(range(len(space)))
    assert [(e[0], e[1]) for e in entries] == sorted((e[0], e[1]) for e in entries)
    for bound, k, family, schedule, zero, offload in entries:
        assert (family, schedule, zero, offload) == space[k]
        assert bound == Floors(problem, modes).config_bound_s(family, zero, schedule, offload)


@pytest.mark.parametrize("seed", range(40))
def test_interleaved_bound_never_exceeds_a_configurations_optimum(seed):
    """The bound with rank 0's exposed sync (:meth:`Floors._overlap_sync_bound_s`) is at most
    the optimum of every interleaved configuration it bounds, any rank order (the optimum of
    one configuration: the exact interleaved DP with no incumbent), on random problems with
    the gradient sync overlapped; and it is the larger of the two floors."""
    rng = random.Random(1000 + seed)
    problem = random_problem(rng, hbm_gib=rng.choice([0.05, 4]))
    modes = SpaceOptions().recompute_modes
    floors = Floors(problem, modes)
    shared: dict = {}
    checked = 0
    for family in families(problem, SpaceOptions()):
        for schedule in family.schedules:
            if schedule[0] is not Schedule.INTERLEAVED:
                continue
            for zero in family.zeros:
                bound = floors.config_bound_s(family, zero, schedule)
                for order in family.orders:
                    config = family.config(schedule, zero, order)
                    optimum = configuration_optimum_s(StageModel(problem, config, shared), modes)
                    if optimum is not None:
                        assert bound <= optimum * (1 + 1e-12), (config, bound, optimum)
                        checked += 1
    if problem.training.overlap_grad_sync and checked == 0:
        pytest.skip("no interleaved configuration fits on this draw")


@pytest.mark.parametrize("seed", range(40))
def test_one_stage_bound_never_exceeds_a_configurations_optimum(seed):
    """The bound of 1F1B configurations on one pipeline rank, with the exposed sync when the
    gradient sync is overlapped (:meth:`Floors._one_stage_exposed_s`), is at most each such
    configuration's optimum (the exact DP with no incumbent), any rank order."""
    rng = random.Random(2000 + seed)
    problem = random_problem(rng, hbm_gib=rng.choice([0.05, 4]))
    modes = SpaceOptions().recompute_modes
    floors = Floors(problem, modes)
    shared: dict = {}
    for family in families(problem, SpaceOptions(pp=[1])):
        for zero in family.zeros:
            schedule = (Schedule.ONE_F_ONE_B, 1)
            bound = floors.config_bound_s(family, zero, schedule)
            for order in family.orders:
                config = family.config(schedule, zero, order)
                optimum = configuration_optimum_s(StageModel(problem, config, shared), modes)
                if optimum is not None:
                    assert bound <= optimum * (1 + 1e-12), (config, bound, optimum)


def configuration_optimum_s(sm: StageModel, modes) -> float | None:
    """One configuration's own optimum by its exact DP (no incumbent), None when nothing fits."""
    if sm.config.schedule is Schedule.INTERLEAVED:
        found = solve_interleaved(sm, modes, float("inf"), DPStats())
    else:
        found = solve_config(sm, modes, np.inf, DPStats())
    return None if found is None else found[0]


@pytest.mark.parametrize("seed", range(30))
def test_zero3_bound_never_exceeds_a_configurations_optimum(seed):
    """With ZeRO-3, every stage's first gather, last re-gather and first reduce-scatter stay
    exposed (:meth:`Floors._z3_chunk_floor_s`): the bound of every ZeRO-3 configuration, 1F1B or
    interleaved, with and without ``reshard_after_forward``, is at most its optimum (the exact
    DP with no incumbent), any rank order, on random problems."""
    import dataclasses

    rng = random.Random(3000 + seed)
    problem = random_problem(rng, hbm_gib=rng.choice([0.05, 4]))
    training = dataclasses.replace(problem.training, reshard_after_forward=rng.random() < 0.5)
    problem = dataclasses.replace(problem, training=training)
    modes = SpaceOptions().recompute_modes
    floors = Floors(problem, modes)
    shared: dict = {}
    checked = 0
    for family in families(problem, SpaceOptions()):
        if 3 not in family.zeros:
            continue
        for schedule in family.schedules:
            bound = floors.config_bound_s(family, 3, schedule)
            for order in family.orders:
                config = family.config(schedule, 3, order)
                optimum = configuration_optimum_s(StageModel(problem, config, shared), modes)
                if optimum is not None:
                    assert bound <= optimum * (1 + 1e-12), (config, bound, optimum)
                    checked += 1
    if checked == 0:
        pytest.skip("no ZeRO-3 configuration fits on this draw")


@pytest.mark.parametrize("seed", SEEDS)
def test_lazy_ranking_is_the_full_ranking(seed):
    """The search's lazy ranking (each family's bounds computed when its floor is reached)
    returns exactly :meth:`NestPlanner._ranked`'s entries in the same order, replays them when
    iterated again, and every family's floor is at most each of its entries' bounds; on the
    default space and on one with every schedule the space takes, offload and hybrid sharding
    searched too (a schedule added later is checked here as soon as the space takes it)."""
    from nest.dp.planner import LazyRanking

    every = [s.value for s in Schedule if s is not Schedule.GPIPE]

    rng = random.Random(seed)
    problem = random_problem(rng)
    spaces = [
        SpaceOptions(),
        SpaceOptions(schedules=every, offload=True, zero_shards=("all",)),
    ]
    for options in spaces:
        modes = options.recompute_modes
        fams = list(families(problem, options))
        full = NestPlanner._ranked(fams, Floors(problem, modes))
        floors = Floors(problem, modes)
        lazy = LazyRanking(fams, floors)
        prefix = [e for _, e in zip(range(len(full) // 3), lazy, strict=False)]
        assert prefix == full[: len(prefix)]
        assert list(lazy) == full
        assert lazy.total == len(full) == lazy.computed
        for family in fams:
            floor = floors.family_floor_s(family)
            for bound in floors.family_bounds_s(family):
                assert floor <= bound * (1 + 1e-12), family
