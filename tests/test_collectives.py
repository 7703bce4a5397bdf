"""Alpha-beta collectives on the hierarchy: closed forms and monotonicity properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nest.cost.collectives import (
    all_gather_time_s,
    all_reduce_time_s,
    all_to_all_time_s,
    collective_time_s,
    p2p_time_s,
    reduce_scatter_time_s,
)

from .conftest import make_cluster

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


@pytest.mark.parametrize("n", [2, 3, 8])
def test_ring_allreduce_inside_one_level(n):
    """Ring all-reduce of S bytes over n devices on one link class:
    ``2 (n-1)/n * S / B + 2 (n-1) alpha`` (Patarasuk and Yuan 2009; Thakur et al. 2005)."""
    cluster = make_cluster(fanouts=(8, 4), bws_gbps=(300, 25), lat_us=(3, 9))
    S = 1e9
    B, alpha = 300e9, 3e-6
    t = collective_time_s("all_reduce", S, list(range(n)), cluster)
    assert t == pytest.approx(2 * (n - 1) / n * S / B + 2 * (n - 1) * alpha, rel=1e-12)
    half = collective_time_s("reduce_scatter", S, list(range(n)), cluster)
    assert half == pytest.approx(t / 2)
    assert collective_time_s("all_gather", S, list(range(n)), cluster) == pytest.approx(t / 2)


def test_two_level_hierarchical_allreduce_closed_form():
    """4 devices in each of 3 nodes: reduce-scatter among the 4 on level 0, then all-reduce of
    the S/4 shard among the 3 nodes on level 1, then all-gather on level 0:
    ``2 [3/4 S/B0 + 3 a0] + 2 [2/3 (S/4)/B1 + 2 a1]``."""
    cluster = make_cluster(fanouts=(8, 4), bws_gbps=(300, 25), lat_us=(3, 9))
    group = [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert cluster.group_factors(group) == (4, 3)
    S, B0, B1, a0, a1 = 2e9, 300e9, 25e9, 3e-6, 9e-6
    expected = 2 * (3 / 4 * S / B0 + 3 * a0) + 2 * (2 / 3 * (S / 4) / B1 + 2 * a1)
    assert collective_time_s("all_reduce", S, group, cluster) == pytest.approx(expected, rel=1e-12)


def test_all_to_all_closed_form():
    """8 members, 4 per node on 2 nodes: each sends S/8 to every member; 3/8 of S stays in the
    node (level 0), 4/8 crosses level 1; one alpha per peer."""
    cluster = make_cluster(fanouts=(4, 2), bws_gbps=(400, 50), lat_us=(1, 5))
    S = 8e8
    expected = 3 / 8 * S / 400e9 + 3 * 1e-6 + 4 / 8 * S / 50e9 + 4 * 5e-6
    assert collective_time_s("all_to_all", S, list(range(8)), cluster) == pytest.approx(expected)


def test_p2p_uses_the_common_level_and_its_bottleneck():
    """A transfer through level l runs at min(bw_0..bw_l) (topology docstring; NEST artifact)."""
    cluster = make_cluster(fanouts=(8, 4, 2), bws_gbps=(900, 100, 400), lat_us=(100, 200, 300))
    S = 1e8
    assert cluster.common_level(3, 3) == -1
    assert p2p_time_s(S, cluster.common_level(0, 7), cluster) == pytest.approx(S / 900e9 + 1e-4)
    assert p2p_time_s(S, cluster.common_level(0, 8), cluster) == pytest.approx(S / 100e9 + 2e-4)
    # level 2 is nominally 400 GB/s but traffic crosses the 100 GB/s level 1 first
    assert p2p_time_s(S, cluster.common_level(0, 32), cluster) == pytest.approx(S / 100e9 + 3e-4)
    assert p2p_time_s(S, -1, cluster) == 0.0


def test_single_member_and_empty_buffers_cost_nothing():
    cluster = make_cluster()
    for op in OPS:
        assert collective_time_s(op, 1e9, [5], cluster) == 0.0
        assert collective_time_s(op, 0.0, [0, 1, 2], cluster) == 0.0


def _cluster_from(data, *, min_levels=1, min_fanout=1, first_fanout=1):
    """A random hierarchy: bandwidth falling and latency rising up the levels. Every level's
    fanout is at least ``min_fanout`` (the first at least ``first_fanout``)."""
    n_levels = data.draw(st.integers(min_levels, 4))
    fanouts = [data.draw(st.integers(max(min_fanout, first_fanout), 4))]
    fanouts += [data.draw(st.integers(min_fanout, 4)) for _ in range(n_levels - 1)]
    bws = sorted((data.draw(st.floats(1.0, 1000.0)) for _ in fanouts), reverse=True)
    lats = sorted(data.draw(st.floats(0.0, 50.0)) for _ in fanouts)
    return make_cluster(fanouts=tuple(fanouts), bws_gbps=tuple(bws), lat_us=tuple(lats))


def _box(cluster, counts):
    """Devices whose coordinate at level l is below counts[l]: a regular group, factors = counts."""
    grids = np.meshgrid(*[np.arange(c) for c in counts], indexing="ij")
    ids = sum(g * cluster.block_size(level - 1) for level, g in enumerate(grids))
    return sorted(int(x) for x in np.ravel(ids))


# The strategies below build only meaningful cases (no early return, no filter): every draw
# compares two different groups of at least two devices, whose collectives take time.


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_moving_a_group_to_a_faster_level_is_never_slower(data):
    """The same group shape one level lower in the tree (faster links, lower latency) never
    takes longer, for every collective."""
    cluster = _cluster_from(data, min_levels=2, min_fanout=2)
    level = data.draw(st.integers(0, cluster.num_levels - 2))
    k = data.draw(
        st.integers(2, min(cluster.levels[level].fanout, cluster.levels[level + 1].fanout))
    )
    low = [1] * cluster.num_levels
    high = [1] * cluster.num_levels
    low[level], high[level + 1] = k, k
    n_bytes = data.draw(st.floats(1.0, 1e10))
    g_low, g_high = _box(cluster, low), _box(cluster, high)
    assert cluster.group_factors(g_low) == tuple(low)
    assert cluster.group_factors(g_high) == tuple(high)
    for op in OPS:
        fast = collective_time_s(op, n_bytes, g_low, cluster)
        assert 0.0 < fast <= collective_time_s(op, n_bytes, g_high, cluster) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_packing_more_of_a_group_lower_never_costs_bandwidth(data):
    """Moving a factor q of a regular group from level l+1 to level l never adds transfer time
    (latency-free: ring latency grows with the steps of a level, so it can favour balance)."""
    drawn = _cluster_from(data, min_levels=2, min_fanout=2)
    cluster = make_cluster(
        fanouts=tuple(lv.fanout for lv in drawn.levels),
        bws_gbps=tuple(lv.bw_bytes_per_s / 1e9 for lv in drawn.levels),
        lat_us=(0,) * drawn.num_levels,
    )
    level = data.draw(st.integers(0, cluster.num_levels - 2))
    inner, outer = cluster.levels[level].fanout, cluster.levels[level + 1].fanout
    q = data.draw(st.integers(2, min(inner, outer)))  # room for q more at level, q divides l+1
    counts = [data.draw(st.integers(1, lv.fanout)) for lv in cluster.levels]
    counts[level] = data.draw(st.integers(1, inner // q))
    counts[level + 1] = q * data.draw(st.integers(1, outer // q))
    packed = list(counts)
    packed[level] *= q
    packed[level + 1] //= q
    n_bytes = data.draw(st.floats(1.0, 1e10))
    g_packed, g_spread = _box(cluster, packed), _box(cluster, counts)
    assert cluster.group_factors(g_spread) == tuple(counts)
    assert cluster.group_factors(g_packed) == tuple(packed)
    for op in OPS:
        t_packed = collective_time_s(op, n_bytes, g_packed, cluster)
        assert 0.0 < t_packed <= collective_time_s(op, n_bytes, g_spread, cluster) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_more_bandwidth_or_fewer_bytes_never_slower(data):
    cluster = _cluster_from(data, first_fanout=2)  # at least two devices
    size = data.draw(st.integers(2, cluster.num_devices))
    group = list(range(size))
    factors = cluster.group_factors(group)
    n_bytes = data.draw(st.floats(1.0, 1e10))
    fast = make_cluster(
        fanouts=tuple(lv.fanout for lv in cluster.levels),
        bws_gbps=tuple(2 * lv.bw_bytes_per_s / 1e9 for lv in cluster.levels),
        lat_us=tuple(lv.latency_s * 1e6 for lv in cluster.levels),
    )
    for fn in (all_reduce_time_s, all_gather_time_s, reduce_scatter_time_s, all_to_all_time_s):
        slow_t = fn(n_bytes, factors, cluster)
        assert slow_t > 0.0
        assert fn(n_bytes, factors, fast) < slow_t  # the bandwidth term halves, latency stays
        assert fn(n_bytes / 2, factors, cluster) < slow_t


def _stepwise_time_s(op: str, n_bytes: float, factors, cluster) -> float:
    """The hierarchical algorithms of :mod:`nest.cost.collectives` run level by level, as the
    module docstring describes them (an independent oracle for the affine forms)."""
    if op == "all_to_all":
        n, inside, total = 1, 1, 0.0
        for k in factors:
            n *= k
        for level, k in enumerate(factors):
            crossing = inside * k - inside
            if crossing:
                bw = cluster.path_bw_bytes_per_s(level)
                total += crossing / n * n_bytes / bw + crossing * cluster.levels[level].latency_s
            inside *= k
        return total
    total, remaining = 0.0, n_bytes
    for level, k in enumerate(factors):
        if k > 1:
            bw = cluster.path_bw_bytes_per_s(level)
            total += (k - 1) / k * remaining / bw + (k - 1) * cluster.levels[level].latency_s
            remaining /= k
    return 2 * total if op == "all_reduce" else total


def test_affine_forms_equal_the_level_by_level_algorithms():
    """``a S + c`` (:func:`linear_forms`, on many splits at once and on one) equals the
    algorithms run level by level on random splits and sizes."""
    import random

    from nest.cost.collectives import linear_form, linear_forms

    rng = random.Random(3)
    cluster = make_cluster(fanouts=(4, 2, 8), bws_gbps=(400, 100, 200), lat_us=(1, 4, 9))
    splits = [tuple(rng.randint(1, f) for f in (4, 2, 8)) for _ in range(200)]
    for op in OPS:
        a_all, c_all = linear_forms(op, splits, cluster)
        for factors, a, c in zip(splits, a_all, c_all, strict=True):
            n_bytes = rng.choice([1.0, 1e3, 1e6, 1e9]) * rng.random()
            want = _stepwise_time_s(op, n_bytes, factors, cluster)
            assert a * n_bytes + c == pytest.approx(want, rel=1e-12)
            assert linear_form(op, factors, cluster) == pytest.approx((a, c), rel=1e-15)


def test_translated_ranks_have_the_same_group_splits():
    """:func:`nest.cost.groups.translated` moves a rank's devices by whole top-level child
    blocks; every group kind keeps its level splits (what lets the DP share one RankGroups
    between, e.g., pipeline ranks in different scalable units)."""
    import random

    from nest.cost.groups import GROUP_KINDS, RankGroups, translated

    rng = random.Random(5)
    for fanouts in [(4,), (2, 4), (4, 2, 4), (2, 2, 2, 2)]:
        cluster = make_cluster(fanouts=fanouts, bws_gbps=(100,) * len(fanouts))
        n = cluster.num_devices
        for _ in range(25):
            tp, cp, dp = rng.choice([1, 2]), rng.choice([1, 2]), rng.choice([1, 2])
            if tp * cp * dp > n:
                continue
            ids = rng.sample(range(n), tp * cp * dp)
            devices = np.array(ids).reshape(dp, cp, tp)
            moved = translated(devices, cluster)
            assert moved.min() >= 0 and (devices - moved).min() == (devices - moved).max()
            a, b = RankGroups(devices, 1, cluster), RankGroups(moved, 1, cluster)
            for kind in GROUP_KINDS:
                assert a.splits(kind) == b.splits(kind), (fanouts, ids, kind)
