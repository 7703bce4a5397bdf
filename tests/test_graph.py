"""Graph clusters (nest/graph): routing, link sharing, the derived hierarchy, agreement with the
hierarchical model, the floors, exactness of the planners on graphs, the file formats and their
errors."""

import json
import random
from dataclasses import replace
from itertools import permutations

import networkx as nx
import numpy as np
import pytest

from nest.app.config import build_cluster
from nest.core.axes import Axis
from nest.core.errors import Infeasible, UserError
from nest.core.layers import AnalyticModel
from nest.core.plan import place
from nest.core.units import GB, US
from nest.cost import evaluate
from nest.cost.groups import RankGroups, translated
from nest.dp.bounds import Floors
from nest.dp.planner import NestPlanner, plan_from_choices
from nest.dp.space import SpaceOptions, families, interleaved_chunks
from nest.dp.stages import StageModel
from nest.exact.placements import placement_classes, signature
from nest.graph.build import graph_cluster, measured_graph, read_graph_file
from nest.graph.generators import hierarchy_graph, leaf_spine, rail_optimized, tpuv4_torus
from nest.graph.placements import graph_assignments

from .conftest import assert_not_faster_than_peak, make_device, make_problem, make_spec
from .graphcase import graph_case, random_graph
from .randomcase import assert_nest_equals_brute, random_case
from .test_nest_dp import assert_sync_terms_equal

DEVICE = make_device()
ROOT = __import__("pathlib").Path(__file__).parents[1]


def as_graph(problem):
    """The same problem on its cluster drawn as a graph (a switch per block and level)."""
    cluster = graph_cluster(
        problem.cluster.name, problem.cluster.device, hierarchy_graph(problem.cluster)
    )
    return replace(problem, cluster=cluster)


# ---------------------------------------------------------------------------------- agreement
def with_network_terms(problem, seed: int):
    """The problem with cost model v2's network terms drawn at random: each level's achieved
    bandwidth (``bw_efficiency``) and the TP / CP / EP communication overlap (drawn apart from
    the case, which stays the same)."""
    rng = random.Random(10_000 + seed)
    levels = tuple(
        replace(lv, bw_efficiency=rng.uniform(0.5, 1.0)) for lv in problem.cluster.levels
    )
    training = replace(
        problem.training,
        tp_comm_overlap=rng.random() < 0.7,
        cp_comm_overlap=rng.random() < 0.7,
        ep_comm_overlap=rng.random() < 0.7,
    )
    model = AnalyticModel(
        problem.model.spec, flash_attention=training.flash_attention, overlap=training.overlap
    )
    return replace(
        problem, cluster=replace(problem.cluster, levels=levels), training=training, model=model
    )


@pytest.mark.parametrize("seed", range(60))
def test_a_hierarchy_drawn_as_a_graph_prices_every_plan_as_the_hierarchy(seed):
    """On the graph of a hierarchy (every device on its own link to a switch per level) no two
    groups of a kind share a link, so the graph model must give the hierarchical model's
    numbers: random plans (random rank orders, MoE, ZeRO, recompute) on random 1-3 level
    clusters with random achieved bandwidths (the graph's links carry them) and communication
    overlap, every stage and rank term, exposed and total, to 1e-9."""
    problem, planner = random_case(seed, hbm_gib=100)
    problem = with_network_terms(problem, seed)
    graph_problem = as_graph(problem)
    derived = [lv.fanout for lv in graph_problem.cluster.levels]
    # levels of fanout 1 vanish; a cluster made only of them is one level of one device
    assert derived == ([lv.fanout for lv in problem.cluster.levels if lv.fanout > 1] or [1])
    plan = planner.solve(problem)
    want, got = evaluate(problem, plan), evaluate(graph_problem, plan)
    assert got.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-9)
    for a, b in zip(want.stages, got.stages, strict=True):
        for key in (
            "tp_comm_s",
            "cp_comm_s",
            "ep_comm_s",
            "tp_exposed_s",
            "cp_exposed_s",
            "ep_exposed_s",
            "zero3_comm_s",
            "p2p_fwd_s",
        ):
            assert getattr(b, key) == pytest.approx(getattr(a, key), rel=1e-9, abs=1e-15), key
    for a, b in zip(want.ranks, got.ranks, strict=True):
        assert b.dp_sync_s == pytest.approx(a.dp_sync_s, rel=1e-9, abs=1e-15)


def test_the_dgx_8x8_graph_gives_the_hierarchys_plans_and_numbers():
    """The dgx_8x8 preset as a graph (``cluster.topology=hierarchy``): nest and megatron choose
    the same plans with the same iteration times as on the hierarchy."""
    from nest.app.cli import register_schemas

    register_schemas()
    from experiments.bench_search import problem_for

    problem = problem_for("llama2_7b", "dgx_8x8", 64, 1024, [1, 2, 4])
    graph_problem = as_graph(problem)
    assert graph_problem.cluster.network is not None
    from baselines.megatron import MegatronPlanner

    for planner in (NestPlanner(), MegatronPlanner()):
        a, b = planner.solve(problem), planner.solve(graph_problem)
        assert b.config == a.config
        assert [s.devices for s in b.stages] == [s.devices for s in a.stages]
        assert b.objective_s == pytest.approx(a.objective_s, rel=1e-9)


# ---------------------------------------------------------------------------------- derivation
def test_derived_hierarchy_of_the_presets():
    """The derived levels follow each network's structure (nest/graph/derive.py): a torus
    numbered x fastest gives its three rings, a SuperPOD its nodes, scalable units and spine,
    a leaf-spine fabric its nodes, leaves and the spine with the oversubscribed bandwidth."""
    torus = graph_cluster("t", DEVICE, tpuv4_torus(1024))
    assert [(lv.name, lv.fanout) for lv in torus.levels] == [("x", 8), ("y", 8), ("z", 16)]
    assert all(lv.bw_bytes_per_s == pytest.approx(46.875 * GB) for lv in torus.levels)
    assert torus.levels[0].latency_s == pytest.approx(1 * US)  # a ring of one-hop neighbours
    rails = graph_cluster("r", DEVICE, rail_optimized(512))
    assert [lv.fanout for lv in rails.levels] == [8, 32, 2]
    assert [lv.bw_bytes_per_s / GB for lv in rails.levels] == pytest.approx([450, 50, 50])
    assert [lv.latency_s / US for lv in rails.levels] == pytest.approx([2, 5, 7])
    fabric = graph_cluster("l", DEVICE, leaf_spine(128, nodes_per_leaf=4, oversubscription=7))
    assert [lv.fanout for lv in fabric.levels] == [8, 4, 4]
    assert fabric.levels[2].bw_bytes_per_s == pytest.approx(50 * GB / 7)


def test_derivation_reads_the_devices_in_file_order():
    """The derivation probes contiguous blocks of device ids: the same torus numbered z
    fastest derives its z ring first (the order is the file's contract)."""
    graph = tpuv4_torus(128)  # 4 x 4 x 8, x fastest
    order = sorted(graph.nodes, key=lambda n: tuple(reversed(graph.nodes[n]["coord"])))
    assert [graph.nodes[n]["coord"] for n in order[:2]] == [[0, 0, 0], [1, 0, 0]]
    z_first = nx.Graph(**graph.graph)
    for node in sorted(graph.nodes, key=lambda n: tuple(graph.nodes[n]["coord"])):
        z_first.add_node(node, **graph.nodes[node])
    z_first.add_edges_from(graph.edges(data=True))
    cluster = graph_cluster("zfirst", DEVICE, z_first)
    assert [lv.fanout for lv in cluster.levels] == [8, 4, 4]


# ---------------------------------------------------------------------------------- routing
def test_ecmp_splits_a_flow_evenly_over_the_spines():
    """Between two leaves a flow leaves on its NIC and spreads over the 4 spines equally (per
    hop ECMP, RFC 2992); its latency is the sum along the path."""
    cluster = graph_cluster("l", DEVICE, leaf_spine(64, nodes_per_leaf=4, spines=4))
    net = cluster.network
    route = net.route(0, 32)  # gpu0.0 on leaf0 -> gpu4.0 on leaf1
    shares = dict(zip(route.links.tolist(), route.fracs.tolist(), strict=True))
    assert sorted(shares.values()) == pytest.approx([0.25] * 8 + [1.0, 1.0])
    assert route.latency_s == pytest.approx((2.5 + 1 + 1 + 2.5) * US)
    inside = net.route(0, 1)  # same node: NVLink, one path
    assert inside.fracs.tolist() == [1.0, 1.0] and inside.latency_s == pytest.approx(2 * US)


def test_dimension_order_goes_x_then_y_and_positive_half_way():
    cluster = graph_cluster("t", DEVICE, tpuv4_torus(512))  # 8 x 8 x 8
    net = cluster.network
    coords = net.coords

    def hops(u, v):
        route = net.route(u, v)
        path = [(int(net.link_src[e]), int(net.link_dst[e])) for e in route.links]
        return {tuple(coords[a]): tuple(coords[b]) for a, b in path}

    assert hops(0, 2 + 8 * 3) == {
        (0, 0, 0): (1, 0, 0),
        (1, 0, 0): (2, 0, 0),
        (2, 0, 0): (2, 1, 0),
        (2, 1, 0): (2, 2, 0),
        (2, 2, 0): (2, 3, 0),
    }
    assert set(hops(0, 4)) == {(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)}  # +x half-way
    assert hops(0, 7) == {(0, 0, 0): (7, 0, 0)}  # the wrap-around link


def test_groups_of_a_kind_share_the_links_they_cross():
    """Two switches of 4 devices joined by one 10 GB/s link: the 4 tensor groups of a rank
    that each pair a device with its twin across the link all cross it at once, so each pays
    4x what one group alone pays; groups inside a switch share nothing."""
    graph = nx.Graph()
    for s in range(2):
        graph.add_node(f"s{s}", kind="switch")
        for i in range(4):
            graph.add_node(f"g{s}{i}", kind="gpu")
            graph.add_edge(f"g{s}{i}", f"s{s}", bw_gbps=100.0, latency_us=1.0)
    graph.add_edge("s0", "s1", bw_gbps=10.0, latency_us=1.0)
    cluster = graph_cluster("two", DEVICE, graph)
    assert [lv.fanout for lv in cluster.levels] == [4, 2]
    crossing = np.array([[[0, 4]], [[1, 5]], [[2, 6]], [[3, 7]]])  # [dp][cp][tp]
    alone = RankGroups(crossing[:1], 1, cluster).forms("tp")["reduce_scatter"][0][0]
    shared = RankGroups(crossing, 1, cluster).forms("tp")["reduce_scatter"][0][0]
    assert alone == pytest.approx(0.5 / (10 * GB))  # ring of 2: half the buffer each way
    assert shared == pytest.approx(4 * alone)
    inside = np.array([[[0, 1]], [[2, 3]]])
    assert RankGroups(inside, 1, cluster).forms("tp")["reduce_scatter"][0][0] == pytest.approx(
        0.5 / (100 * GB)
    )


def test_only_a_symmetric_graph_moves_ranks_to_share_their_costs():
    """``translated`` (the stage model's cache) moves a rank by whole top-level blocks only when
    the graph promises that changes nothing, and on the torus it indeed changes nothing."""
    torus = graph_cluster("t", DEVICE, tpuv4_torus(256))  # 4 x 8 x 8
    grid = place(tp=4, cp=1, dp=8, pp=4, rank_order=(Axis.TP, Axis.DP, Axis.CP, Axis.PP))
    last = grid[3]
    moved = translated(last, torus)
    assert moved.min() < last.min()
    for kind in ("tp", "dense_dp"):
        assert RankGroups(moved, 1, torus).splits(kind) == RankGroups(last, 1, torus).splits(kind)
    graph = tpuv4_torus(256)
    graph.graph["symmetric"] = False
    plain = graph_cluster("t", DEVICE, graph)
    assert (translated(last, plain) == last).all()


# ---------------------------------------------------------------------------------- exactness
def test_nest_equals_brute_force_on_random_graphs():
    """``nest`` == ``brute`` (every plan of the space through ``evaluate``) on 120 random small
    graphs (tori with dimension-order routing, random switch graphs, rails, leaf-spine,
    hierarchies as graphs, complete measured-like graphs; 2-16 devices), with the same
    infeasibility and smallest memory need; the DP prices collectives through the same classes
    as the evaluator and prunes with the graph floors."""
    agreed = infeasible = 0
    for seed in range(120):
        problem, options = graph_case(seed)
        if assert_nest_equals_brute(problem, options, (seed, options)) is None:
            infeasible += 1
            continue
        agreed += 1
    assert agreed >= 90 and infeasible >= 3, (agreed, infeasible)


@pytest.mark.parametrize("seed", range(30))
def test_stage_model_equals_the_evaluator_on_graphs(seed):
    """For the DP's plan on a random graph (1F1B, ZeRO 0 or 3), every rank's forward, backward
    and sync from the interval model equal the evaluator's (interleaved chunks are covered by
    nest == brute)."""
    problem, options = graph_case(1000 + seed)
    t = problem.training
    overlap = {k: getattr(t, k) for k in ("tp_comm_overlap", "cp_comm_overlap", "ep_comm_overlap")}
    problem = make_problem(problem.model.spec, problem.cluster, global_batch=8, **overlap)
    options = {**options, "zero_stages": [0, 3], "schedules": ["1f1b"]}
    try:
        plan = NestPlanner(**options).solve(problem)
    except Infeasible:
        pytest.skip("nothing fits")
    report = evaluate(problem, plan)
    sm = StageModel(problem, plan.config)
    for r, stage in enumerate(plan.stages):
        terms = sm.stage(r, stage.first_layer, stage.last_layer, stage.recompute)
        assert terms.fwd_s == pytest.approx(report.stages[r].fwd_s, rel=1e-9, abs=1e-18)
        assert terms.bwd_s == pytest.approx(report.stages[r].bwd_s, rel=1e-9, abs=1e-18)
        assert_sync_terms_equal(problem, terms, report, r)


def test_graph_floors_are_below_every_plan():
    """The pruning bounds on graphs (nest/graph/floors.py through nest/dp/bounds.py) on random
    plans of random spaces on random graphs: every stage takes at least its layers' floors (the
    placement-independent ones and the placement-aware ones of the stage model) and the
    iteration at least its configuration's bound."""
    rng = random.Random(5)
    checked = 0
    for seed in range(60):
        problem, options = graph_case(2000 + seed)
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
            sm = StageModel(problem, config)
            layer = np.diff(sm.min_compute_s(space.recompute_modes))
            # the placement-aware floors: each rank's own cost classes, the least per layer
            placed = np.diff(sm.placed_floor_s(space.recompute_modes))
            for (i, j, _), stage in zip(choices, report.stages, strict=True):
                assert stage.fwd_s + stage.bwd_s >= layer[i : j + 1].sum() * (1 - 1e-12)
                assert stage.fwd_s + stage.bwd_s >= placed[i : j + 1].sum() * (1 - 1e-12), seed
            bound = floors.config_bound_s(family, zero, schedule)
            assert report.iteration_time_s >= bound * (1 - 1e-12), (seed, config)
            checked += 1
    assert checked >= 150


def test_group_floors_hold_for_any_group_of_that_size():
    """The floor of a collective on ``n`` devices (the minimum over every split of the graph
    floors) is below its cost on random groups of ``n`` devices of random graphs, alone or with
    other groups of the kind sharing links."""
    rng = random.Random(9)
    for _ in range(80):
        cluster = graph_cluster("g", DEVICE, random_graph(rng))
        problem = make_problem(make_spec(), cluster)
        floors = Floors(problem, ("none",))
        n_dev = cluster.num_devices
        if n_dev < 2:
            continue
        n = rng.randint(2, n_dev)
        devices = rng.sample(range(n_dev), n - n % 1)
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            n_bytes = rng.choice([1.0, 1e4, 1e8])
            floor = floors.min_time_s(((op, n_bytes),), n)
            grid = np.array(devices).reshape(1, 1, n)
            cost = RankGroups(grid, 1, cluster)
            kind = "ep" if op == "all_to_all" else "tp"
            if kind == "ep":
                cost = RankGroups(np.array(devices).reshape(n, 1, 1), n, cluster)
            assert cost.time_s(op, n_bytes, kind) >= floor * (1 - 1e-12), (op, n, devices)


def _signatures_of_every_map(cluster, shape, ep):
    pp, dp, cp, tp = shape
    found, cache = set(), {}
    for devices in permutations(range(cluster.num_devices), pp * dp * cp * tp):
        found.add(signature(cluster, np.asarray(devices).reshape(shape), ep, cache))
    return found


@pytest.mark.parametrize(
    "shape, ep",
    [
        ((1, 2, 1, 2), 1),
        ((2, 1, 1, 2), 1),
        ((1, 4, 1, 1), 2),
        ((1, 2, 2, 1), 1),
        ((4, 1, 1, 1), 1),
        ((2, 2, 1, 1), 2),
    ],
)
def test_graph_placements_meet_every_signature(shape, ep):
    """The general mode's enumeration on a graph (the plan's own symmetries only) reaches every
    signature that some injective map of the ranks has, on random 4-6 device graphs."""
    rng = random.Random(hash(shape) % 1000)
    for _ in range(3):
        while True:
            cluster = graph_cluster("g", DEVICE, random_graph(rng))
            if 4 <= cluster.num_devices <= 6:
                break
        want = _signatures_of_every_map(cluster, shape, ep)
        cache, got = {}, set()
        for devices in graph_assignments(cluster, shape, ep, max_visits=10**6):
            got.add(signature(cluster, np.asarray(devices).reshape(shape), ep, cache))
        assert got == want
        classes = placement_classes(
            cluster, tp=shape[3], cp=shape[2], dp=shape[1], pp=shape[0], ep=ep, max_visits=10**6
        )
        assert len(classes) == len(want)


def test_general_mode_equals_brute_force_over_every_placement_on_graphs():
    """cpsat and milp in general mode == the best plan over every injective placement (all
    permutations, no symmetry) on 10 random 4-device graphs."""
    from .test_exact import _brute_general, check_exact_plan, exact, solve_or_none

    rng = random.Random(21)
    done = solved = 0
    while done < 10:
        graph = random_graph(rng)
        cluster = graph_cluster("g", make_device(), graph)
        if cluster.num_devices != 4:
            continue
        spec = make_spec(layers=rng.randint(1, 3), heads=4, hidden=rng.choice([64, 256]))
        problem = make_problem(spec, cluster, global_batch=rng.choice([4, 8]))
        options = dict(
            zero_stages=[rng.choice([0, 1, 3])],
            recompute=rng.sample(["none", "full"], rng.randint(1, 2)),
            schedules=["1f1b"],
        )
        oracle = _brute_general(problem, options)
        for backend in ("cpsat", "milp"):
            plan = solve_or_none(exact(backend, options, mode="general"), problem)
            if oracle is None:
                assert plan is None
                continue
            check_exact_plan(problem, plan)
            assert plan.objective_s == pytest.approx(oracle, rel=1e-6), (done, backend)
        done += 1
        solved += oracle is not None
    assert solved >= 8, solved  # the comparison above ran, not only the infeasible branch


# ---------------------------------------------------------------------------------- formats
def _small_graph():
    graph = nx.Graph(level_names=["node", "fabric"])
    graph.add_node("leaf", kind="switch")
    for n in range(2):
        graph.add_node(f"nv{n}", kind="switch")
        for i in range(4):
            graph.add_node(f"gpu{n}.{i}", kind="gpu")
            graph.add_edge(f"gpu{n}.{i}", f"nv{n}", bw_gbps=450, latency_us=1)
            graph.add_edge(f"gpu{n}.{i}", "leaf", bw_gbps=50, latency_us=2.5)
    return graph


def test_node_link_json_and_graphml_give_the_same_cluster(tmp_path):
    graph = _small_graph()
    as_json = tmp_path / "g.json"
    as_json.write_text(json.dumps(nx.node_link_data(graph, edges="links")))  # the older key
    as_graphml = tmp_path / "g.graphml"
    flat = graph.copy()
    flat.graph["level_names"] = "node,fabric"  # GraphML has no lists: comma-separated
    nx.write_graphml(flat, as_graphml)
    problem = make_problem(make_spec(), graph_cluster("g", DEVICE, graph), global_batch=8)
    want = NestPlanner().solve(problem)
    for path in (as_json, as_graphml):
        cluster = graph_cluster("g", DEVICE, read_graph_file(path))
        assert [lv.name for lv in cluster.levels] == ["node", "fabric"]
        got = NestPlanner().solve(replace(problem, cluster=cluster))
        assert got.objective_s == want.objective_s and got.config == want.config


def test_the_shipped_example_graph_and_table_build():
    cfg = {
        "name": "example",
        "graph_path": str(ROOT / "data/graphs/dgx_2x4.json"),
        "device": {"name": "d", "peak_tflops": 100, "hbm_gb": 80, "hbm_bw_gbps": 3000},
    }
    cluster = build_cluster(cfg)
    assert cluster.num_devices == 8 and [lv.fanout for lv in cluster.levels] == [4, 2]
    table = measured_graph(ROOT / "data/measured/dgx_2x8_example.csv")
    assert table.number_of_nodes() == 16 and table.number_of_edges() == 16 * 15 // 2


def _mutate(graph, how):
    g = graph.copy()
    if how == "no kind":
        del g.nodes["gpu0.1"]["kind"]
    elif how == "bad kind":
        g.nodes["nv0"]["kind"] = "router"
    elif how == "no bw":
        del g.edges["gpu0.1", "nv0"]["bw_gbps"]
    elif how == "negative bw":
        g.edges["gpu0.1", "nv0"]["bw_gbps"] = -3
    elif how == "no latency":
        del g.edges["gpu1.2", "leaf"]["latency_us"]
    elif how == "self loop":
        g.add_edge("nv1", "nv1", bw_gbps=1, latency_us=1)
    elif how == "disconnected":
        g.add_node("gpu9", kind="gpu")
    elif how == "no gpu":
        for node in list(g.nodes):
            if node.startswith("gpu"):
                g.remove_node(node)
    return g


@pytest.mark.parametrize(
    "how, match",
    [
        ("no kind", "node 'gpu0.1' has kind=None; use kind: gpu or switch"),
        ("bad kind", "node 'nv0' has kind='router'"),
        ("no bw", "edge '(nv0' - 'gpu0.1|gpu0.1' - 'nv0)' has no bw_gbps"),
        ("negative bw", "edge '(nv0' - 'gpu0.1|gpu0.1' - 'nv0)' bw_gbps=-3 must be > 0"),
        ("no latency", "edge '(leaf' - 'gpu1.2|gpu1.2' - 'leaf)' has no latency_us"),
        ("self loop", "edge 'nv1' - 'nv1' is a self-loop"),
        ("disconnected", "device 'gpu9' cannot reach device 'gpu0.0'"),
        ("no gpu", "no node has kind: gpu"),
    ],
)
def test_a_bad_graph_is_one_line_naming_the_node_or_edge(how, match):
    with pytest.raises(UserError, match=match) as err:
        graph_cluster("bad", DEVICE, _mutate(_small_graph(), how))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "content, suffix, match",
    [
        ('{"directed": true, "nodes": [], "edges": []}', ".json", "undirected and simple"),
        ('{"edges": []}', ".json", "not a node-link document"),
        ("a,b\n", ".txt", "unknown format '.txt'"),
        ("{not json", ".json", "cannot read it"),
    ],
)
def test_a_bad_file_is_one_line(tmp_path, content, suffix, match):
    path = tmp_path / f"g{suffix}"
    path.write_text(content)
    with pytest.raises(UserError, match=match):
        read_graph_file(path)
    with pytest.raises(UserError, match="no such file"):
        read_graph_file(tmp_path / "missing.json")


def test_measured_tables(tmp_path):
    """A table becomes a complete graph of its figures (the lower of two directions); a
    missing pair, a bad header or a bad number is a one-line error naming it."""
    good = tmp_path / "m.csv"
    good.write_text("device_a,device_b,gbps\n0,1,40\n1,0,30\n0,2,20\n1,2,10\n")
    graph = measured_graph(good, latency_us=3)
    assert list(graph.nodes) == ["0", "1", "2"]
    assert graph.edges["0", "1"]["bw_gbps"] == 30 and graph.edges["0", "1"]["latency_us"] == 3
    cluster = graph_cluster("m", DEVICE, graph)
    assert cluster.network.route(1, 2).links.size == 1  # direct, the links are the pairs
    cases = {
        "device_a,device_b,gbps\n0,1,40\n0,2,20\n": "no measurement between devices '1' and '2'",
        "a,b,gbps\n0,1,40\n": "must name device_a, device_b, gbps",
        "device_a,device_b,gbps\n0,1,fast\n": "line 2 gbps='fast' must be a number",
        "device_a,device_b,gbps\n0,0,4\n": "device '0' measured with itself",
    }
    for text, match in cases.items():
        good.write_text(text)
        with pytest.raises(UserError, match=match):
            measured_graph(good)


def test_cli_graph_presets_and_their_errors(tmp_path):
    """The presets run from the command line; a missing file, a wrong device count or an
    unknown generator parameter is ``error: ...`` and exit status 2."""
    import subprocess
    import sys

    def run(*overrides):
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "run.py"),
                "solver=megatron",
                "model=tiny",
                f"hydra.run.dir={tmp_path}",
                *overrides,
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    done = run("cluster=leaf_spine", "cluster.devices=32")
    assert done.returncode == 0, done.stderr
    assert "graph of 32 devices" in done.stdout
    for overrides, match in (
        (["cluster=graph"], "cluster=graph needs cluster.graph_path=FILE"),
        (["cluster=tpuv4_torus", "cluster.devices=100"], "use a multiple of 64"),
        (["cluster=rail_optimized", "+cluster.params.rails=3"], "unknown ['rails']"),
        (["cluster=measured"], "cluster=measured needs cluster.params.table=FILE.csv"),
    ):
        failed = run(*overrides)
        assert failed.returncode == 2, (overrides, failed.stdout, failed.stderr)
        assert "error:" in failed.stderr and match in failed.stderr, failed.stderr


def test_the_network_picture_draws_the_plan_and_its_traffic(tmp_path):
    """``network.png`` of a graph run, and the traffic it draws: a two-stage pipeline across
    the link between two switches puts every boundary pair on that link."""
    from experiments.plots import plan_traffic, save_network_figure
    from nest.core.serialize import plan_to_dict

    graph = _small_graph()
    cluster = graph_cluster("g", DEVICE, graph)
    problem = make_problem(make_spec(), cluster, global_batch=8)
    from baselines.fixed import FixedPlanner

    plan = FixedPlanner(tp=1, pp=2, dp=4, rank_order="tp,cp,dp,pp").solve(problem)
    data = plan_to_dict(plan)
    traffic = plan_traffic(cluster.network, data)
    net = cluster.network
    keys = list(net.devices) + list(net.switches)
    edge = {
        tuple(sorted((keys[a], keys[b]))): t
        for a, b, t in zip(net.link_src[0::2], net.link_dst[0::2], traffic, strict=True)
    }
    # ranks 0 and 1 are the two nodes: each boundary pair crosses its two NICs once, each
    # node's data-parallel ring stays on its NVSwitch
    for i in range(4):
        assert edge[(f"gpu0.{i}", "leaf")] == 1 and edge[(f"gpu1.{i}", "leaf")] == 1
        assert edge[(f"gpu0.{i}", "nv0")] == 2  # in and out of the ring
    path = save_network_figure(data, net, tmp_path / "network.png", title="t")
    assert path.exists() and path.stat().st_size > 10_000


def test_a_sweep_over_clusters_gets_the_topology_table():
    """``results.md``'s "What topology awareness buys": per cluster, nest's time and each other
    planner's over it (here phaze 1.5x slower on the torus, as fast on the fat tree)."""
    import pandas as pd

    from experiments.tables import topology_table

    rows = []
    for cluster, network, times in (
        ("tpuv4_fattree", "hierarchy", {"nest": 2.0, "phaze": 2.0, "megatron": 3.0}),
        ("tpuv4_torus", "graph", {"nest": 2.0, "phaze": 3.0, "megatron": 5.0}),
    ):
        for planner, t in times.items():
            rows.append(
                dict(
                    cluster=cluster,
                    network=network,
                    model="m",
                    variant="",
                    global_batch=8,
                    devices=64,
                    microbatch=1,
                    planner=planner,
                    feasible=True,
                    status="optimal",
                    iteration_time_s=t,
                )
            )
    comp = pd.DataFrame(rows)
    table = topology_table(comp, ["megatron", "phaze", "nest"])
    assert list(table["cluster"]) == ["tpuv4_fattree", "tpuv4_torus"]
    assert list(table["network"]) == ["hierarchy", "graph"]
    assert list(table["phaze / nest"]) == ["1.00x", "1.50x"]
    assert list(table["megatron / nest"]) == ["1.50x", "2.50x"]
    assert topology_table(comp[comp["cluster"] == "tpuv4_torus"], ["phaze", "nest"]) is None


def _graph_problems():
    yield make_problem(
        make_spec(layers=4),
        graph_cluster("rails", DEVICE, rail_optimized(8, gpus_per_node=4, nodes_per_su=2)),
        global_batch=16,
    )
    yield make_problem(
        make_spec(layers=3, num_experts=4, top_k=2, activation="swiglu"),
        graph_cluster("torus", DEVICE, tpuv4_torus(8, shape=[2, 2, 2])),
        global_batch=16,
    )


@pytest.mark.parametrize(
    "name", ["megatron", "nest", "phaze", "alpa", "mcmc", "brute", "cpsat", "milp", "fixed"]
)
def test_every_planner_runs_on_a_graph_and_is_scored_on_it(name):
    """The conformance checks of tests/test_planners.py on graph clusters (a rail-optimised pod
    and a 2x2x2 torus with a mixture of experts): valid plans no faster than their devices'
    peak FLOP/s, feasible on the graph, the same plan twice."""
    from nest.core.serialize import plan_to_dict
    from nest.cost import check_plan

    from .test_planners import planner_from_config

    for problem in _graph_problems():
        plan = planner_from_config(name).solve(problem)
        check_plan(problem, plan)
        assert [i for s in plan.stages for i in s.layers] == list(range(problem.num_layers))
        report = evaluate(problem, plan)
        assert_not_faster_than_peak(problem, plan)
        assert report.feasible
        again = planner_from_config(name).solve(problem)
        a, b = plan_to_dict(plan), plan_to_dict(again)
        for d in (a, b):
            d.pop("solve_time_s")
            d["search"] = {k: v for k, v in d["search"].items() if not k.startswith("time_")}
        assert a == b


def test_bad_generator_parameters_and_unreadable_files_are_one_line_errors(tmp_path):
    """A link figure that is not a number, a torus shape that is not a list, a malformed
    GraphML file and a measured table that is not UTF-8 are each a ``UserError`` naming the
    value (they were a TypeError, a ParseError and a UnicodeDecodeError)."""
    with pytest.raises(UserError, match=r"nic_bw_gbps='fast' must be a number"):
        leaf_spine(64, nic_bw_gbps="fast")
    with pytest.raises(UserError, match=r"oversubscription='x' must be a number"):
        leaf_spine(64, oversubscription="x")
    with pytest.raises(UserError, match=r"nvlink_latency_us=-1 must be >= 0"):
        rail_optimized(16, nvlink_latency_us=-1)
    with pytest.raises(UserError, match=r"shape=64 must be a list"):
        tpuv4_torus(64, shape=64)
    assert leaf_spine(64, nic_bw_gbps="50").number_of_nodes() == leaf_spine(64).number_of_nodes()
    bad = tmp_path / "bad.graphml"
    bad.write_text("<graphml><graph>")
    with pytest.raises(UserError, match="cannot read it"):
        read_graph_file(bad)
    table = tmp_path / "t.csv"
    table.write_bytes(b"device_a,device_b,gbps\n0,1,4\xff\n")
    with pytest.raises(UserError, match="not UTF-8 text"):
        measured_graph(table)
