"""Random small graph clusters and problems on them, drawn from a seed (tests of nest/graph)."""

import itertools
import random

import networkx as nx

from baselines.brute import count_plans
from nest.core.axes import Optimizer, Recompute
from nest.core.model import ModelSpec
from nest.dp.space import SpaceOptions
from nest.graph.build import graph_cluster
from nest.graph.generators import hierarchy_graph, leaf_spine, rail_optimized, tpuv4_torus

from .conftest import make_cluster, make_device, make_problem
from .randomcase import random_rank_orders

FAMILIES = ("torus", "switches", "rails", "leaf_spine", "hierarchy", "complete")


def _torus(rng: random.Random) -> nx.Graph:
    dims = rng.choice([(2, 2, 1), (4, 1, 1), (2, 2, 2), (4, 2, 1), (4, 4, 1), (3, 2, 1)])
    graph = tpuv4_torus(
        dims[0] * dims[1] * dims[2], shape=list(dims), link_latency_us=rng.uniform(0, 20)
    )
    for a, b in graph.edges:  # a different speed per dimension
        d = next(i for i in range(3) if graph.nodes[a]["coord"][i] != graph.nodes[b]["coord"][i])
        graph.edges[a, b]["bw_gbps"] = [400.0, 100.0, 25.0][d] * rng.uniform(0.5, 2)
    graph.graph["symmetric"] = False  # random speeds break the translations' symmetry
    return graph


def _switches(rng: random.Random) -> nx.Graph:
    """Devices under random switches, the switches joined in a random connected graph."""
    n_switch = rng.randint(1, 4)
    per = rng.choice([1, 2, 2, 4])
    graph = nx.Graph()
    for s in range(n_switch):
        graph.add_node(f"s{s}", kind="switch")
        for i in range(per):
            graph.add_node(f"g{s}.{i}", kind="gpu")
            graph.add_edge(
                f"g{s}.{i}", f"s{s}", bw_gbps=rng.uniform(5, 500), latency_us=rng.uniform(0, 10)
            )
    for s in range(1, n_switch):  # a random tree, then a few more links
        graph.add_edge(
            f"s{s}",
            f"s{rng.randrange(s)}",
            bw_gbps=rng.uniform(5, 500),
            latency_us=rng.uniform(0, 10),
        )
    for a, b in itertools.combinations(range(n_switch), 2):
        if rng.random() < 0.3:
            graph.add_edge(
                f"s{a}", f"s{b}", bw_gbps=rng.uniform(5, 500), latency_us=rng.uniform(0, 10)
            )
    if rng.random() < 0.5 and per > 1:  # direct device-device links (NVLink-like)
        for s in range(n_switch):
            graph.add_edge(
                f"g{s}.0", f"g{s}.1", bw_gbps=rng.uniform(50, 900), latency_us=rng.uniform(0, 5)
            )
    return graph


def _complete(rng: random.Random) -> nx.Graph:
    n = rng.choice([2, 3, 4, 6, 8])
    graph = nx.Graph()
    for d in range(n):
        graph.add_node(d, kind="gpu")
    for a, b in itertools.combinations(range(n), 2):
        graph.add_edge(a, b, bw_gbps=rng.uniform(5, 500), latency_us=rng.uniform(0, 20))
    return graph


def random_graph(rng: random.Random) -> nx.Graph:
    family = rng.choice(FAMILIES)
    if family == "torus":
        return _torus(rng)
    if family == "switches":
        return _switches(rng)
    if family == "complete":
        return _complete(rng)
    if family == "rails":
        gpus = rng.choice([2, 4])
        return rail_optimized(
            gpus * rng.choice([2, 4]) if gpus == 2 else 8,
            gpus_per_node=gpus,
            nodes_per_su=2,
            spines=rng.choice([1, 2]),
            nvlink_bw_gbps=rng.uniform(100, 900),
            nic_bw_gbps=rng.uniform(5, 100),
            nic_latency_us=rng.uniform(0, 10),
        )
    if family == "leaf_spine":
        return leaf_spine(
            rng.choice([4, 8]),
            gpus_per_node=2,
            nodes_per_leaf=rng.choice([1, 2]),
            spines=rng.choice([1, 2]),
            oversubscription=rng.uniform(1, 8),
            nic_bw_gbps=rng.uniform(5, 100),
        )
    fanouts = rng.choice([(2, 2), (4, 2), (2, 2, 2), (2, 4)])
    bws = sorted((rng.uniform(5, 900) for _ in fanouts), reverse=True)
    lats = sorted(rng.uniform(0.5, 20) + 5 * i for i in range(len(fanouts)))
    return hierarchy_graph(make_cluster(fanouts=fanouts, bws_gbps=tuple(bws), lat_us=tuple(lats)))


def graph_case(seed: int, *, max_plans: int = 2500, max_devices: int = 16):
    """A tiny_case (tests/test_nest_dp.py) on a random graph: a random model of 3-8 chain
    layers, memory from tight to ample, TP / CP / EP communication overlap on or off, and a
    random restriction small enough for brute force."""
    rng = random.Random(seed)
    # cost model v2's communication overlap, drawn apart so that the cases themselves stay those
    # of the graph tests' first version
    overlap = random.Random(50_000 + seed)
    for _ in range(200):
        graph = random_graph(rng)
        if sum(1 for _, d in graph.nodes(data=True) if d["kind"] == "gpu") > max_devices:
            continue
        moe = rng.random() < 0.25
        spec = ModelSpec(
            name="tiny",
            hidden=rng.choice([64, 128]),
            layers=rng.randint(1, 6),
            heads=rng.choice([2, 4]),
            ffn_hidden=rng.choice([128, 256]),
            vocab=rng.choice([256, 1000]),
            seq_len=rng.choice([32, 64]),
            activation=rng.choice(["gelu", "swiglu"]),
            dropout=rng.random() < 0.5,
            tied_embeddings=rng.random() < 0.5,
            num_experts=4 if moe else 1,
            top_k=2 if moe else 1,
        )
        device = make_device(
            hbm_bytes=rng.choice([0.002, 0.01, 0.05, 1.0]) * 2**30,
            peak_flops_per_s=rng.uniform(1, 200) * 1e12,
            hbm_bw_bytes_per_s=rng.uniform(100, 3000) * 1e9,
        )
        cluster = graph_cluster(f"random{seed}", device, graph)
        problem = make_problem(
            spec,
            cluster,
            flash=rng.random() < 0.5,
            global_batch=rng.choice([2, 4, 8, 12]),
            microbatch_sizes=(1, 2),
            optimizer=rng.choice([Optimizer.ADAM, Optimizer.SGD]),
            overlap_grad_sync=rng.random() < 0.5,
            grad_bytes=rng.choice([2, 4]),
            tp_comm_overlap=overlap.random() < 0.5,
            cp_comm_overlap=overlap.random() < 0.5,
            ep_comm_overlap=overlap.random() < 0.5,
        )
        options = dict(
            zero_stages=sorted(rng.sample([0, 1, 2, 3], rng.randint(1, 2))),
            recompute=sorted(rng.sample([r.value for r in Recompute], rng.randint(1, 3))),
            rank_orders=random_rank_orders(rng),
            schedules=rng.choice([["1f1b"], ["1f1b", "interleaved"]]),
        )
        if count_plans(problem, SpaceOptions(**options)) <= max_plans:
            return problem, options
    raise AssertionError("no small graph case drawn")
