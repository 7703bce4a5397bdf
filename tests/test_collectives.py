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

    from nest.core.plan import GROUP_KINDS
    from nest.cost.groups import RankGroups, translated

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


def test_floors_on_a_graph_bound_every_group_and_equal_the_forms_on_a_hierarchy():
    """:func:`floor_forms` and :func:`p2p_floor_s` are what the search prunes with: on a
    hierarchy they are the cost itself; on a graph (here a hierarchy drawn as one, whose
    collectives cost what the hierarchy's do) no group of the split beats them."""
    from nest.cost.collectives import floor_forms, linear_forms, p2p_classes, p2p_floor_s
    from nest.graph.build import graph_cluster
    from nest.graph.generators import hierarchy_graph

    tree = make_cluster(fanouts=(4, 2), bws_gbps=(400, 50), lat_us=(1, 5))
    graph = graph_cluster("g", tree.device, hierarchy_graph(tree))
    n_bytes = 3e6
    for op in OPS:
        for split in [(2, 1), (4, 1), (1, 2), (2, 2), (4, 2)]:
            a, c = floor_forms(op, [split], tree)
            want = linear_forms(op, [split], tree)
            assert (a[0], c[0]) == (want[0][0], want[1][0])
            group = _box(tree, split)
            (fa,), (fc,) = floor_forms(op, [split], graph)
            priced = collective_time_s(op, n_bytes, group, graph)
            assert 0.0 < fa * n_bytes + fc <= priced * (1 + 1e-9), (op, split)
            assert priced == pytest.approx(collective_time_s(op, n_bytes, group, tree), rel=1e-9)
    for level, (i, j) in enumerate([(0, 1), (0, 4)]):
        assert tree.common_level(i, j) == level
        on_tree = p2p_time_s(n_bytes, level, tree)
        assert p2p_floor_s(n_bytes, level, tree) == on_tree
        (pair,) = p2p_classes(graph, [i], [j])
        on_graph = p2p_time_s(n_bytes, pair, graph)
        assert on_graph == pytest.approx(on_tree, rel=1e-9)
        assert 0.0 < p2p_floor_s(n_bytes, level, graph) <= on_graph * (1 + 1e-9)


# ------------------------------------------------------------------ groups (nest.cost.groups)


def test_group_arrays_are_the_megatron_groups_worked_by_hand():
    """A rank of ``[dp=2][cp=2][tp=2]`` devices ``d[r][c][t] = 4 r + 2 c + t`` with ``ep = 2``:
    tensor groups are the ``tp`` devices of one (replica, context rank); context groups the
    ``cp`` devices of one (replica, tensor rank); dense data-parallel groups all ``dp x cp``
    ranks of one tensor rank; expert groups ``ep`` consecutive data x context ranks of one
    tensor rank, and expert data-parallel groups the ranks holding the same experts
    (Megatron-Core's convention, module docstring of :mod:`nest.cost.groups`)."""
    from nest.core.plan import GROUP_KINDS, group_arrays

    got = group_arrays(np.arange(8).reshape(2, 2, 2), ep=2)
    want = {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "cp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "ep": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dense_dp": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "expert_dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    }
    assert set(got) == set(GROUP_KINDS)
    for kind, groups in want.items():
        assert sorted(sorted(g) for g in got[kind].tolist()) == groups, kind
    # ep = 4 over dp x cp = 4 ranks: one expert group per tensor rank, no expert replicas
    four = group_arrays(np.arange(8).reshape(2, 2, 2), ep=4)
    assert sorted(sorted(g) for g in four["ep"].tolist()) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert four["expert_dp"].shape == (8, 1)


def test_translated_moves_by_whole_top_level_blocks():
    """On 4 x 2 devices (child blocks of 4 below the top level) a rank moves down by whole
    blocks of 4 as far as it can; on one level any shift keeps the splits and it moves to 0."""
    from nest.cost.groups import translated

    two = make_cluster(fanouts=(4, 2))
    assert translated(np.array([5, 6]), two).tolist() == [1, 2]
    assert translated(np.array([4, 7]), two).tolist() == [0, 3]
    assert translated(np.array([3, 4]), two).tolist() == [3, 4]  # straddles: stays
    three = make_cluster(fanouts=(2, 2, 2))
    assert translated(np.array([6, 7]), three).tolist() == [2, 3]  # blocks of 4 below the top
    assert translated(np.array([3, 5]), make_cluster(fanouts=(8,))).tolist() == [0, 2]


def test_distinct_splits_of_groups_worked_by_hand():
    """Splits count the peers per level (``Cluster.group_factors``); groups of one member never
    communicate; translated copies of a group have its split and appear once."""
    from nest.cost.groups import distinct_splits

    cluster = make_cluster(fanouts=(4, 2))
    groups = np.array([[0, 1], [4, 5], [2, 6], [3, 7], [1, 2]])
    assert distinct_splits(groups, cluster) == ((1, 2), (2, 1))
    assert distinct_splits(np.array([[0, 1, 2, 3], [0, 4, 1, 5]]), cluster) == ((2, 2), (4, 1))
    assert distinct_splits(np.array([[3], [5]]), cluster) == ()


def test_rank_groups_price_the_slowest_group_of_each_kind():
    """All groups of a kind run at once, so a collective costs its slowest group: here two
    tensor groups, one inside a node (400 GB/s) and one across nodes (50 GB/s); the price of
    any byte count (scalar or array) is the cross-node ring's, and groups of one cost nothing."""
    from nest.core.layers import Collective
    from nest.cost.groups import RankGroups, rank_groups

    cluster = make_cluster(fanouts=(4, 2), bws_gbps=(400, 50), lat_us=(1, 5))
    devices = np.array([[[0, 1]], [[3, 4]]])  # [dp=2][cp=1][tp=2]
    groups = RankGroups(devices, 1, cluster)
    assert groups.splits("tp") == ((1, 2), (2, 1))
    assert groups.splits("cp") == ()
    s = 8e6
    slow = 2 * (1 / 2 * s / 50e9 + 5e-6)  # the 2-member ring across the 50 GB/s level
    assert groups.time_s("all_reduce", s, "tp") == pytest.approx(slow, rel=1e-12)
    arr = groups.time_s("all_reduce", np.array([s, 0.0, 2 * s]), "tp")
    assert arr.tolist() == pytest.approx([slow, 0.0, 2 * (s / 50e9 + 5e-6)], rel=1e-12)
    assert groups.time_s("all_reduce", 0.0, "tp") == 0.0
    assert groups.time_s("all_gather", s, "cp") == 0.0
    assert groups.time_s("all_gather", np.array([s, s]), "cp").tolist() == [0.0, 0.0]
    assert groups.time_s("all_gather", np.zeros(2), "tp").tolist() == [0.0, 0.0]
    # dense_dp: the two replicas of each tensor rank, (0, 3) inside a node, (1, 4) across
    assert groups.time_s("reduce_scatter", s, "dense_dp") == pytest.approx(slow / 2, rel=1e-12)
    # a stage's collectives of one axis, one after another, the slowest split's total
    colls = [
        (Collective("all_reduce", "tp", s), 3),
        (Collective("all_gather", "cp", s), 5),  # another axis: not counted
        (Collective("all_gather", "tp", 0.0), 7),  # empty: free
    ]
    assert groups.axis_time_s(colls, "tp") == pytest.approx(3 * slow, rel=1e-12)
    hidden = [(Collective("all_reduce", "tp", s, hidden_by_s=slow / 2), 2)]
    assert groups.axis_time_s(hidden, "tp") == pytest.approx(2 * slow / 2, rel=1e-12)
    assert groups.axis_time_s(hidden, "tp", exposed=False) == pytest.approx(2 * slow, rel=1e-12)
    assert groups.axis_time_s(colls, "cp") == 0.0
    # a plan's ranks: a translated copy of a rank shares its groups
    assert len({id(g) for g in rank_groups(_two_rank_plan(), cluster)}) == 1


def _two_rank_plan(dp=2):
    from nest.core.axes import MEGATRON_RANK_ORDER, Recompute, Schedule
    from nest.core.plan import ParallelConfig, make_structured_plan

    config = ParallelConfig(
        tp=2, dp=dp, pp=2, schedule=Schedule.ONE_F_ONE_B, rank_order=MEGATRON_RANK_ORDER
    )
    return make_structured_plan(
        config,
        layer_counts=[2, 2],
        recompute=[Recompute.NONE] * 2,
        num_microbatches=4,
        sequence_parallel=False,
    )


# ---------------------------------------------------------------- compute (nest.cost.compute)


def test_exposed_part_of_an_overlapped_collective():
    """``max(t - h, min_exposed t) + slowdown min(t, h)`` (:class:`Collective`): all of it
    without overlap; what sticks out past the compute it hides under; never below the share no
    schedule hides; plus the compute's slowdown over the overlapped time."""
    from nest.core.layers import Collective
    from nest.cost.compute import exposed_s

    plain = Collective("all_gather", "tp", 1.0)
    assert exposed_s(3.0, plain) == 3.0
    hidden = Collective("all_gather", "tp", 1.0, hidden_by_s=2.0)
    assert exposed_s(3.0, hidden) == pytest.approx(1.0)
    assert exposed_s(1.5, hidden) == 0.0
    floor = Collective("all_gather", "tp", 1.0, hidden_by_s=2.0, min_exposed=0.25)
    assert exposed_s(1.0, floor) == pytest.approx(0.25)
    assert exposed_s(4.0, floor) == pytest.approx(2.0)
    slow = Collective("all_gather", "tp", 1.0, hidden_by_s=2.0, slowdown=0.1)
    assert exposed_s(3.0, slow) == pytest.approx(1.0 + 0.1 * 2.0)
    assert exposed_s(1.0, slow) == pytest.approx(0.1 * 1.0)
    arr = exposed_s(np.array([1.0, 3.0]), slow)
    assert arr.tolist() == pytest.approx([0.1, 1.2])


def test_only_blocks_are_recomputed():
    """Embedding and head always run in mode ``none``; a block adds its mode's recompute
    seconds, FLOPs and repeated collectives; hardware FLOPs are three forwards (backward =
    twice the forward) plus the recomputation."""
    from nest.core.axes import Recompute
    from nest.core.layers import Collective, LayerCost
    from nest.cost import compute

    full = Recompute.FULL
    fwd_c = (Collective("all_gather", "tp", 1.0),)
    bwd_c = (Collective("reduce_scatter", "tp", 2.0),)
    again = (Collective("all_gather", "tp", 3.0),)
    cost = LayerCost(
        dense_params=1.0,
        expert_params=0.0,
        fwd_s=1.0,
        bwd_s=2.0,
        fwd_flops=10.0,
        recompute_s={full: 0.5},
        recompute_flops={full: 4.0},
        fwd_collectives=fwd_c,
        bwd_collectives=bwd_c,
        recompute_collectives={full: again},
    )
    assert compute.layer_mode(full, True) is full
    assert compute.layer_mode(full, False) is Recompute.NONE
    assert compute.recompute_s(cost, full, True) == 0.5
    assert compute.recompute_s(cost, full, False) == 0.0
    assert compute.recompute_s(cost, Recompute.SELECTIVE, True) == 0.0
    assert compute.hardware_flops(cost, full, True) == 34.0
    assert compute.hardware_flops(cost, full, False) == 30.0
    assert compute.hardware_flops(cost, Recompute.NONE, True) == 30.0
    assert compute.fwd_collectives(cost) == fwd_c
    assert compute.bwd_collectives(cost, full, True) == bwd_c + again
    assert compute.bwd_collectives(cost, full, False) == bwd_c
    assert compute.bwd_collectives(cost, Recompute.NONE, True) == bwd_c


def test_the_slowest_split_wins_whichever_comes_first():
    """With the outer level's latency below the inner one's (a real case: tests/test_exact.py),
    a 2-member group across nodes beats one inside a node: the sorted-first split (1, 2) is the
    fast one and every price must still be the slowest split's, scalar or array, per collective
    or summed over a stage's collectives; a single byte is not free."""
    from nest.core.layers import Collective
    from nest.cost.groups import RankGroups, collectives_time_s, split_forms

    cluster = make_cluster(fanouts=(4, 2), bws_gbps=(100, 100), lat_us=(40, 0))
    groups = RankGroups(np.array([[[0, 4]], [[1, 2]]]), 1, cluster)  # tp groups (0,4), (1,2)
    assert groups.splits("tp") == ((1, 2), (2, 1))
    s = 8e6

    def ring(split_alpha_s, n_bytes):  # 2-member all-reduce, 100 GB/s
        return 2 * (n_bytes / 2 / 100e9 + split_alpha_s)

    inside = ring(40e-6, s)
    assert inside > ring(0.0, s)
    assert groups.time_s("all_reduce", s, "tp") == pytest.approx(inside, rel=1e-12)
    got = groups.time_s("all_reduce", np.array([s, 1.0, 0.0]), "tp")
    assert got.tolist() == pytest.approx([inside, ring(40e-6, 1.0), 0.0], rel=1e-12)
    assert groups.time_s("all_reduce", 1.0, "tp") == pytest.approx(ring(40e-6, 1.0), rel=1e-12)
    colls = [(Collective("all_reduce", "tp", s), 2), (Collective("all_reduce", "tp", 1.0), 1)]
    want = 2 * inside + ring(40e-6, 1.0)
    assert groups.axis_time_s(colls, "tp") == pytest.approx(want, rel=1e-12)
    # one split's forms (the DP's layout): k defaults to that split, exposure to on
    hidden = [(Collective("all_reduce", "tp", s, hidden_by_s=inside / 2), 1)]
    forms = split_forms((2, 1), cluster)
    assert collectives_time_s(hidden, "tp", forms) == pytest.approx(inside / 2, rel=1e-12)
    assert collectives_time_s(hidden, "tp", forms, exposed=False) == pytest.approx(inside)
    with pytest.raises(KeyError, match="bogus"):
        groups.forms("tp")["bogus"]


def test_rank_groups_on_a_graph_price_as_the_hierarchy_it_draws():
    """A hierarchy drawn as a graph (every device on its own link to a switch per level) prices
    every group kind as the hierarchy does; on a graph the splits are cost classes computed for
    all groups of a kind at once, groups of one have none, and :func:`distinct_splits` refuses
    a graph. Ranks that are not translated copies of each other keep their own groups."""
    from nest.cost.groups import RankGroups, distinct_splits, rank_groups, translated
    from nest.graph.build import graph_cluster
    from nest.graph.generators import hierarchy_graph

    tree = make_cluster(fanouts=(4, 2), bws_gbps=(400, 50), lat_us=(1, 5))
    graph = graph_cluster("g", tree.device, hierarchy_graph(tree))
    assert graph.network.symmetric  # a tree looks the same from every block
    assert translated(np.array([5, 6]), graph).tolist() == [1, 2]
    devices = np.array([[[0, 1]], [[4, 5]], [[2, 3]], [[6, 7]]])  # [dp=4][cp=1][tp=2]
    on_tree, on_graph = RankGroups(devices, 2, tree), RankGroups(devices, 2, graph)
    assert on_graph.splits("cp") == ()
    for kind, op in [("tp", "all_reduce"), ("dense_dp", "reduce_scatter"), ("ep", "all_to_all")]:
        assert on_graph.splits(kind)
        want = on_tree.time_s(op, 4e6, kind)
        assert want > 0 and on_graph.time_s(op, 4e6, kind) == pytest.approx(want, rel=1e-9)
    with pytest.raises(
        AssertionError,
        match=r"^distinct_splits on a graph cluster: use RankGroups.splits per rank$",
    ):
        distinct_splits(np.array([[0, 1]]), graph)
    plan = _two_rank_plan(dp=1)  # ranks on devices 0-1 and 2-3 of a node: not a translation
    assert len({id(g) for g in rank_groups(plan, tree)}) == 2


def test_affine_and_point_to_point_times_worked_by_hand():
    """``a S + c`` for ``S > 0`` bytes and nothing for an empty buffer, on scalars and arrays
    alike; a transfer within one device (level -1) is free; a stage boundary costs its slowest
    pair, nothing without pairs; :func:`ring_forms` prices only the ring collectives."""
    from nest.cost.collectives import affine_time_s, pair_p2p_time_s, ring_forms

    assert affine_time_s(2.0, 3.0, 0.0) == 0.0
    assert affine_time_s(2.0, 3.0, 1.0) == 5.0
    assert affine_time_s(2.0, 3.0, 0.5) == 4.0
    got = affine_time_s(2.0, 3.0, np.array([0.0, 0.5, 1.0, 4.0]))
    assert got.tolist() == [0.0, 4.0, 5.0, 11.0]
    cluster = make_cluster(fanouts=(4, 2), bws_gbps=(400, 50), lat_us=(1, 5))
    s = 1e6
    assert p2p_time_s(s, -1, cluster) == 0.0 and isinstance(p2p_time_s(s, -1, cluster), float)
    # the four collectives by name, on a 2-member group inside a node (ring: (n-1)/n S / B + a)
    half = 0.5 * s / 400e9 + 1e-6
    assert reduce_scatter_time_s(s, (2, 1), cluster) == pytest.approx(half, rel=1e-12)
    assert all_gather_time_s(s, (2, 1), cluster) == pytest.approx(half, rel=1e-12)
    assert all_reduce_time_s(s, (2, 1), cluster) == pytest.approx(2 * half, rel=1e-12)
    assert all_to_all_time_s(s, (2, 1), cluster) == pytest.approx(half, rel=1e-12)
    none = p2p_time_s(np.array([s, 2 * s]), -1, cluster)
    assert isinstance(none, np.ndarray) and none.tolist() == [0.0, 0.0]
    inside, across = s / 400e9 + 1e-6, s / 50e9 + 5e-6
    assert pair_p2p_time_s(s, [0, 1], cluster) == pytest.approx(across, rel=1e-12)
    assert pair_p2p_time_s(s, [0], cluster) == pytest.approx(inside, rel=1e-12)
    assert pair_p2p_time_s(s, [], cluster) == 0.0
    rows = pair_p2p_time_s(np.array([s, 0.0]), [0, 1], cluster)
    assert rows.tolist() == pytest.approx([across, 0.0], rel=1e-12)
    assert pair_p2p_time_s(np.array([s, s]), [], cluster).tolist() == [0.0, 0.0]
    k = np.array([[2.0, 1.0]])
    bw, alpha = np.array([400e9, 50e9]), np.array([1e-6, 5e-6])
    for bad in ("all_to_all", "bogus"):
        with pytest.raises(ValueError) as info:
            ring_forms(bad, k, bw, alpha)
        ops = "('all_reduce', 'all_gather', 'reduce_scatter')"
        assert str(info.value) == f"unknown ring collective {bad!r}; one of {ops}"
    a, c = ring_forms("all_reduce", k, bw, alpha)
    assert (a[0], c[0]) == pytest.approx((2 * 0.5 / 400e9, 2 * 1e-6), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    fanouts=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    seed=st.integers(0, 2**31 - 1),
    size=st.integers(1, 9),
    rows=st.integers(1, 12),
)
def test_hierarchy_fabric_classes_are_the_splits_of_each_group(fanouts, seed, size, rows):
    """A hierarchy's fabric answers with the definition, whichever path it takes: the classes of
    a kind's groups are the distinct :meth:`Cluster.group_factors` of its rows, sorted (plain
    Python for small arrays, numpy with rows moved and deduplicated for large ones), and a
    boundary's classes are the distinct :meth:`Cluster.common_level` of its pairs."""
    from nest.core.hierarchy import SMALL_GROUPS, Hierarchy

    cluster = make_cluster(fanouts=tuple(fanouts))
    n = cluster.num_devices
    size = min(size, n)
    rng = np.random.default_rng(seed)
    groups = np.array([rng.choice(n, size, replace=False) for _ in range(rows)])
    want = tuple(sorted({cluster.group_factors(g) for g in groups})) if size > 1 else ()
    fabric = cluster.fabric
    assert isinstance(fabric, Hierarchy)
    assert fabric.group_classes(groups) == want
    tiled = np.tile(groups, (SMALL_GROUPS // groups.size + 1, 1))  # the numpy path
    assert tiled.size > SMALL_GROUPS and Hierarchy(cluster.levels).group_classes(tiled) == want
    a, b = groups[:, 0], groups[:, -1]
    pairs = {cluster.common_level(int(x), int(y)) for x, y in zip(a, b, strict=True)}
    assert fabric.p2p_classes(a, b) == tuple(sorted(pairs))
    a_big, b_big = np.tile(a, SMALL_GROUPS), np.tile(b, SMALL_GROUPS)
    assert fabric.p2p_classes(a_big, b_big) == tuple(sorted(pairs))
