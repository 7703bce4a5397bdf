"""The interleaved DP's memory-forced floor (nest/dp/interleaved.py ``least_fitting_time_s``).

A rank whose fastest modes do not fit must recompute; the floor is the linear relaxation of the
least time that fits, so it may never exceed the least time of any assignment that fits (the
bound's proof is in its docstring). Checked here against every assignment of modes to a rank's
chunks on random interleaved configurations, including the tight-memory ones where it binds.
"""

import itertools
import random

import pytest

from nest.core.axes import Recompute
from nest.cost.memory import rank_memory_bytes
from nest.dp.interleaved import (
    RankChunks,
    first_mode_floors,
    least_fitting_time_s,
    rank_options,
)
from nest.dp.space import SpaceOptions, configurations
from nest.dp.stages import StageModel

from .test_nest_interleaved import interleaved_case


def least_fitting_by_enumeration(sm: StageModel, rc: RankChunks) -> float:
    """The least ``t_r`` over every assignment of a mode to each of the rank's chunks that fits,
    by enumeration (``inf`` when none fits): :func:`nest.dp.interleaved.rank_options`'s memory
    rule, each chunk priced by its group's representative."""
    rep = {rc.ks[0]: rc.ks[0]}
    for ks in rc.groups.values():
        rep.update({k: ks[0] for k in ks})
    best = float("inf")
    n = len(rc.modes)
    for picks in itertools.product(range(n), repeat=len(rc.ks)):
        rows = [rc.cost[rep[k]][c] for k, c in zip(rc.ks, picks, strict=True)]
        t = sum(row[0] for row in rows)
        act = sum(row[2] for row in rows)
        peak = max(0.0, *(row[3] for row in rows))
        memory = rank_memory_bytes(rc.state_bytes, act, rc.in_flight, peak, sm.reserve_bytes)
        if memory <= sm.capacity_bytes:
            best = min(best, t)
    return best


def test_forced_recompute_floor_never_exceeds_the_least_fitting_time():
    """On 60 random interleaved problems, for every rank of a few configurations each: the floor
    is at most the enumerated least fitting time (1e-12 relative), infinite exactly when nothing
    fits, and above the fastest modes' time on some ranks (memory binds: the floor is not just
    the old one)."""
    checked = binding = infeasible = 0
    for seed in range(60):
        problem, options = interleaved_case(5000 + seed)
        rng = random.Random(seed)
        space = SpaceOptions(**{**options, "schedules": ["interleaved"]})
        configs = [c for c in configurations(problem, space) if c.interleaved]
        modes = tuple(Recompute)
        for config in rng.sample(configs, min(3, len(configs))):
            sm = StageModel(problem, config)
            for r in range(config.pp):
                rc = RankChunks(sm, r, modes)
                if len(rc.ks) > 6:
                    continue
                floor = least_fitting_time_s(rc, sm.capacity_bytes, sm.reserve_bytes)
                exact = least_fitting_by_enumeration(sm, rc)
                checked += 1
                if exact == float("inf"):
                    infeasible += 1
                    assert floor <= exact  # may stay finite: the relaxation is weaker
                    continue
                assert floor <= exact * (1 + 1e-12), (seed, config, r)
                fastest = sum(
                    float(rc.cost[ks[0]][:, 0].min()) * len(ks) for ks in rc.groups.values()
                ) + float(rc.cost[rc.ks[0]][:, 0].min())
                binding += floor > fastest * (1 + 1e-9)
    assert checked >= 200, checked
    assert binding >= 10, binding
    assert infeasible >= 5, infeasible


def test_floor_is_infinite_when_even_the_least_storing_modes_do_not_fit():
    """With no memory at all nothing fits, and the floor says so (the configuration is dropped
    before any enumeration)."""
    problem, options = interleaved_case(5001)
    space = SpaceOptions(**{**options, "schedules": ["interleaved"]})
    config = next(c for c in configurations(problem, space) if c.interleaved)
    sm = StageModel(problem, config)
    rc = RankChunks(sm, 0, tuple(Recompute))
    assert least_fitting_time_s(rc, 0.0, sm.reserve_bytes) == float("inf")
    assert least_fitting_time_s(rc, float("inf"), sm.reserve_bytes) == pytest.approx(
        sum(float(rc.cost[ks[0]][:, 0].min()) * len(ks) for ks in rc.groups.values())
        + float(rc.cost[rc.ks[0]][:, 0].min())
    )


def test_forced_recompute_floor_holds_with_the_activations_offloaded():
    """With activation offload (each chunk's blocks store nothing on the device, the transient
    holds the two-block buffer) the floor still never exceeds the least fitting time."""
    from .test_offload import _with_offload_hardware

    checked = 0
    for seed in range(30):
        problem, options = interleaved_case(6000 + seed)
        problem = _with_offload_hardware(problem, random.Random(seed))
        space = SpaceOptions(**{**options, "schedules": ["interleaved"], "offload": True})
        configs = [c for c in configurations(problem, space) if c.activation_offload]
        for config in random.Random(seed).sample(configs, min(2, len(configs))):
            sm = StageModel(problem, config)
            for r in range(config.pp):
                rc = RankChunks(sm, r, tuple(Recompute))
                if len(rc.ks) > 6:
                    continue
                floor = least_fitting_time_s(rc, sm.capacity_bytes, sm.reserve_bytes)
                exact = least_fitting_by_enumeration(sm, rc)
                assert floor <= exact * (1 + 1e-12), (seed, config, r)
                checked += 1
    assert checked >= 50, checked


def test_first_mode_floors_never_exceed_an_option():
    """Every option :func:`rank_options` returns (enumerated, no shortcut, and with it) is at
    least as slow as the floor of its first chunk's mode, memory-forced floor included, and
    hides exactly that mode's backward (the pre-check of ``solve_interleaved`` may then drop a
    rank only when every option's labels would be dropped)."""
    checked = 0
    for seed in range(40):
        problem, options = interleaved_case(7000 + seed)
        space = SpaceOptions(**{**options, "schedules": ["interleaved"]})
        configs = [c for c in configurations(problem, space) if c.interleaved]
        modes = tuple(Recompute)
        for config in random.Random(seed).sample(configs, min(3, len(configs))):
            sm = StageModel(problem, config)
            for r in range(config.pp):
                rc = RankChunks(sm, r, modes)
                forced = least_fitting_time_s(rc, sm.capacity_bytes, sm.reserve_bytes)
                floors = first_mode_floors(rc, forced)
                for shortcut in (True, False):
                    for opt in rank_options(sm, rc, shortcut=shortcut)[0]:
                        t, b = floors[modes.index(opt.modes[0])]
                        assert opt.t_s >= t * (1 - 1e-12), (seed, config, r)
                        assert opt.first_bwd_s == b
                        checked += 1
    assert checked >= 200, checked
