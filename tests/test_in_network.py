"""In-network all-reduces (NVLink SHARP, InfiniBand SHARP) on a hierarchy's levels.

The published figures are nccl-tests' all-reduce bus bandwidths; nccl-tests doc/PERFORMANCE.md
defines ``algbw = S / t`` and, for an all-reduce, ``busbw = algbw * 2 (n-1) / n``. A level's
``in_network_bw`` is the run's algbw, so the model's in-network all-reduce of ``S`` bytes over
the run's ``n`` devices must take the published run's time ``S * 2 (n-1)/n / busbw`` (plus the
level's latency term, the ring's). The choice is per level the faster of the ring and the
switch (:mod:`nest.core.alphabeta`), which the property tests check against the definition,
and the search stays exact (nest equals brute force) with its floors below every plan.
"""

import random
from dataclasses import replace

import hydra
import numpy as np
import pytest

from nest.app.cli import CONF_DIR
from nest.app.config import build_cluster, build_problem
from nest.core.alphabeta import ring_forms
from nest.core.errors import UserError
from nest.core.topology import Cluster, Level
from nest.core.units import GB, US, GiB
from nest.cost import evaluate
from nest.cost.collectives import all_reduce_time_s, linear_forms
from nest.dp.bounds import Floors
from nest.dp.planner import plan_from_choices
from nest.dp.space import SpaceOptions, families, interleaved_chunks

from .conftest import make_device
from .randomcase import assert_nest_equals_brute
from .test_nest_dp import tiny_case


def compose(*overrides: str):
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra.compose(config_name="config", overrides=list(overrides))


def one_level(n: int, bw_gbps: float, eff: float, in_gbps: float, lat_us: float) -> Cluster:
    level = Level(
        name="nvswitch",
        fanout=n,
        bw_bytes_per_s=bw_gbps * GB,
        latency_s=lat_us * US,
        bw_efficiency=eff,
        in_network="nvls",
        in_network_bw_bytes_per_s=in_gbps * GB,
    )
    return Cluster(name="x", device=make_device(), levels=(level,))


def test_nvls_all_reduce_takes_the_published_runs_time():
    """GB200 NVL72: all-reduce busbw 834.6 GB/s over 72 GPUs at 8 GiB (coreweave/nccl-tests
    PR #43). By nccl-tests' definition the run took ``S * 2 * 71/72 / 834.6 GB/s``; a level whose
    in-network bandwidth is that run's algbw prices the same all-reduce at exactly that (plus
    the ring's latency term, 2 x 71 steps)."""
    busbw = 834.6 * GB
    n, size = 72, 8 * GiB
    algbw = busbw / (2 * (n - 1) / n)
    cluster = one_level(n, 900, 0.772, algbw / GB, 2.4)
    published_s = size * 2 * (n - 1) / n / busbw
    got = all_reduce_time_s(size, (n,), cluster)
    assert got == pytest.approx(published_s + 2 * (n - 1) * 2.4e-6, rel=1e-12)
    # the ring at NVLink 5's ring busbw (695 GB/s, NVIDIA/nccl issue #2140) would be slower
    ring_s = size * 2 * (n - 1) / n / (900 * GB * 0.772) + 2 * (n - 1) * 2.4e-6
    assert got < ring_s


def test_nvls_wins_on_8_h100_and_the_ring_on_2():
    """8 H100: ring busbw 370 GB/s (450 x 0.822), NVLS algbw 275 GB/s = busbw 481 (NCCL's
    maintainer, NVIDIA/nccl-tests issue #212). On 8 the all-reduce takes ``S / 275 GB/s`` (the
    ring would take ``S * 1.75 / 370``); on 2 the ring's ``S / 370`` is faster than the switch's
    ``S / 275`` and is what the model takes (with NVLS on, 2 to 4 H100s measure the ring's busbw:
    NVIDIA/nccl issue #1455)."""
    cluster = one_level(8, 450, 0.822, 275, 2.4)
    size = 1 * GiB
    ring_bw = 450 * GB * 0.822
    assert all_reduce_time_s(size, (8,), cluster) == pytest.approx(
        size / (275 * GB) + 14 * 2.4e-6, rel=1e-12
    )
    assert all_reduce_time_s(size, (2,), cluster) == pytest.approx(
        size / ring_bw + 2 * 2.4e-6, rel=1e-12
    )


def random_levels(rng: random.Random, n_levels: int) -> tuple[Level, ...]:
    levels = []
    for i in range(n_levels):
        bw = rng.uniform(5, 900) * GB
        eff = rng.uniform(0.5, 1.0)
        on = rng.random() < 0.6
        levels.append(
            Level(
                name=f"l{i}",
                fanout=rng.randint(1, 6),
                bw_bytes_per_s=bw,
                latency_s=rng.uniform(0, 10) * US,
                bw_efficiency=eff,
                in_network=rng.choice(["nvls", "sharp"]) if on else None,
                in_network_bw_bytes_per_s=bw * eff * rng.uniform(0.3, 1.5) if on else 0.0,
            )
        )
    return tuple(levels)


def test_in_network_all_reduce_is_the_per_level_least_of_ring_and_switch():
    """On random hierarchies and splits: the all-reduce's ``a`` is, summed over levels, the least
    of the ring's ``2 (k_l-1)/k_l / prod_{j<l} k_j / bw_l`` and the switch's ``1 / prod_{j<l} k_j
    / B_in_l`` (a level where the group has one member costs nothing); its ``c`` is the ring's;
    so the time never exceeds the ring's, equals it with the switch off, and reduce-scatter and
    all-gather are the rings whatever the switch."""
    rng = random.Random(21)
    switched = 0
    for _ in range(300):
        levels = random_levels(rng, rng.randint(1, 3))
        cluster = Cluster(name="x", device=make_device(), levels=levels)
        rings = Cluster(
            name="x",
            device=make_device(),
            levels=tuple(
                replace(lv, in_network=None, in_network_bw_bytes_per_s=0.0) for lv in levels
            ),
        )
        splits = np.array([[rng.randint(1, lv.fanout) for lv in levels] for _ in range(8)])
        a, c = linear_forms("all_reduce", splits, cluster)
        ra, rc = linear_forms("all_reduce", splits, rings)
        assert np.all(a <= ra * (1 + 1e-12)) and np.array_equal(c, rc)
        bw = np.minimum.accumulate([lv.effective_bw_bytes_per_s for lv in levels])
        for row, got in zip(splits, a, strict=True):
            want, below = 0.0, 1.0
            for k, lv, b in zip(row, levels, bw, strict=True):
                if k > 1:
                    ring = 2 * (k - 1) / k / below / b
                    switch = 1 / below / lv.in_network_bw_bytes_per_s if lv.in_network else np.inf
                    want += min(ring, switch)
                    switched += switch < ring
                below *= k
            assert got == pytest.approx(want, rel=1e-12)
        for op in ("reduce_scatter", "all_gather", "all_to_all"):
            got, ring = linear_forms(op, splits, cluster), linear_forms(op, splits, rings)
            assert np.array_equal(got[0], ring[0]) and np.array_equal(got[1], ring[1])
    assert switched > 100  # the switch was chosen often enough for the check to mean something


def test_ring_forms_without_in_network_are_unchanged():
    """``in_network_bw`` all zero is the ring: twice the reduce-scatter (the hierarchical
    all-reduce of Thakur, Rabenseifner and Gropp)."""
    k = np.array([[2, 3], [4, 1], [1, 1]], dtype=float)
    bw, alpha = np.array([100e9, 10e9]), np.array([1e-6, 5e-6])
    rs = ring_forms("reduce_scatter", k, bw, alpha)
    for got in (
        ring_forms("all_reduce", k, bw, alpha, np.zeros(2)),
        ring_forms("all_reduce", k, bw, alpha),
    ):
        assert np.allclose(got[0], 2 * rs[0]) and np.allclose(got[1], 2 * rs[1])


def with_in_network(problem, rng: random.Random):
    """The problem on its own levels with a random in-network all-reduce on some of them."""
    cluster = problem.cluster
    levels = tuple(
        replace(
            lv,
            in_network=rng.choice(["nvls", "sharp"]),
            in_network_bw_bytes_per_s=lv.effective_bw_bytes_per_s * rng.uniform(0.4, 1.5),
        )
        if rng.random() < 0.7
        else lv
        for lv in cluster.levels
    )
    return replace(problem, cluster=replace(cluster, levels=levels))


def test_nest_equals_brute_force_with_in_network_reductions():
    """``nest`` and ``brute`` agree (objective to 1e-9, or both infeasible) on 40 random small
    problems whose levels reduce in the switch."""
    rng = random.Random(5)
    agreed = 0
    for seed in range(40):
        problem, options = tiny_case(seed)
        problem = with_in_network(problem, rng)
        if assert_nest_equals_brute(problem, options, (seed, options)) is not None:
            agreed += 1
    assert agreed >= 20


def test_floors_stay_below_every_plan_with_in_network_reductions():
    """The search's configuration bounds (nest.dp.bounds: the least over every split of the
    cost model's own forms, now the least of ring and switch) stay below the evaluated time of
    random plans on levels that reduce in the switch."""
    rng = random.Random(13)
    checked = 0
    for seed in range(30):
        problem, options = tiny_case(seed)
        problem = with_in_network(problem, rng)
        space = SpaceOptions(**options)
        floors = Floors(problem, space.recompute_modes)
        fams = list(families(problem, space))
        for family in rng.sample(fams, min(4, len(fams))):
            schedule = rng.choice(family.schedules)
            zero, order = rng.choice(family.zeros), rng.choice(family.orders)
            config = family.config(schedule, zero, order)
            if config.interleaved:
                parts = interleaved_chunks(problem.num_layers, config.pp, config.virtual_stages)
            else:
                cuts = sorted(rng.sample(range(1, problem.num_layers), config.pp - 1))
                bounds = [0, *cuts, problem.num_layers]
                parts = [(bounds[k], bounds[k + 1] - 1) for k in range(config.pp)]
            choices = [(i, j, rng.choice(space.recompute_modes)) for i, j in parts]
            report = evaluate(problem, plan_from_choices(problem, config, choices))
            bound = floors.config_bound_s(family, zero, schedule)
            assert report.iteration_time_s >= bound * (1 - 1e-12), (seed, config)
            checked += 1
    assert checked >= 60


# ----------------------------------------------------------------------------- presets, options
@pytest.mark.parametrize(
    ("name", "gbps"), [("dgx_h100_superpod", 275), ("dgx_b200", 474), ("gb200_nvl72", 423)]
)
def test_nvls_is_on_by_default_on_nvswitch_presets_and_sharp_off(name, gbps):
    cluster = build_problem(compose(f"cluster={name}", "model=tiny")).cluster
    assert cluster.levels[0].in_network == "nvls"
    assert cluster.levels[0].in_network_bw_bytes_per_s == gbps * GB
    assert all(lv.in_network is None for lv in cluster.levels[1:])
    off = build_problem(compose(f"cluster={name}", "model=tiny", "cluster.nvls=false")).cluster
    assert all(lv.in_network is None for lv in off.levels)
    sharp = build_problem(compose(f"cluster={name}", "model=tiny", "cluster.sharp=true")).cluster
    assert [lv.in_network for lv in sharp.levels] == ["nvls", "sharp", "sharp"]
    assert "+NVLS" in cluster.describe() and "+SHARP" in sharp.describe()


def test_nvls_speeds_up_an_all_reduce_on_the_preset_and_changes_nothing_else():
    """On dgx_b200 an 8-GPU all-reduce with NVLS on takes ``S / 474 GB/s`` (the ring would take
    ``S * 1.75 / (900 x 0.772)``); reduce-scatter is the same ring either way."""
    on = build_problem(compose("cluster=dgx_b200", "model=tiny")).cluster
    off = build_problem(compose("cluster=dgx_b200", "model=tiny", "cluster.nvls=false")).cluster
    size, split = 1 * GiB, (8, 1, 1)
    assert all_reduce_time_s(size, split, on) == pytest.approx(
        size / (474 * GB) + 14 * 2.4e-6, rel=1e-12
    )
    assert all_reduce_time_s(size, split, off) == pytest.approx(
        size * 1.75 / (900 * GB * 0.772) + 14 * 2.4e-6, rel=1e-12
    )
    for op in ("reduce_scatter", "all_gather", "all_to_all"):
        assert linear_forms(op, [split], on) == linear_forms(op, [split], off)


def one_line_error(cfg) -> str:
    with pytest.raises(UserError) as info:
        build_cluster(cfg.cluster)
    message = str(info.value)
    assert "\n" not in message and message.strip()
    return message


def test_in_network_on_a_graph_cluster_is_one_line():
    message = one_line_error(
        compose("cluster=graph", "cluster.graph_path=x.json", "cluster.sharp=true")
    )
    assert "cluster.sharp=true" in message and "cluster.sharp=false" in message
    # a preset with NVLS on, priced as a graph: the option must be turned off
    message = one_line_error(compose("cluster=dgx_b200", "cluster.topology=hierarchy"))
    assert "cluster.nvls=false" in message


def test_in_network_where_no_level_offers_it_is_one_line():
    message = one_line_error(compose("cluster=dgx_a100", "cluster.nvls=true"))
    assert "cluster.nvls=true" in message and "cluster.nvls=false" in message


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("+cluster.levels.0.in_network=nvlink", "in_network='nvlink'"),
        ("+cluster.levels.0.in_network=nvls", "in_network_gbps=None"),
        ("cluster.levels.0.in_network_gbps=-3", "in_network_gbps"),
    ],
)
def test_bad_in_network_fields_are_one_line(override, named):
    base = "cluster=dgx_a100" if override.startswith("+") else "cluster=dgx_b200"
    message = one_line_error(compose(base, override.lstrip("+")))
    assert named in message
