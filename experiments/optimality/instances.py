"""Seeded small instances for the optimality study: a random model, network and memory size.

Each seed gives a problem of 2-6 transformer blocks (4-8 chain layers with embedding and head),
dense or MoE, on 2-8 devices in 1-3 levels with random bandwidths (1-900 GB/s per device,
falling outwards with probability 0.8) and latencies (0-30 us), HBM sizes from tight to ample,
global batch 2-16 and microbatch candidates 1 and 2; the space is nest's full space (every ZeRO
stage, recompute mode, rank order with tp innermost and schedule) unless ``restrict`` is set,
which draws a random sub-space (a few rank orders and ZeRO stages), the kind of space a user
narrows to by hand. ``network`` puts the same problem on a small graph instead: a torus, a
rail-optimised pod or an oversubscribed leaf-spine fabric (:func:`graph_of`), where the
structured space is the derived hierarchy's (:mod:`nest.graph.derive`) and general mode
places ranks on the graph's devices with no tree symmetry (:mod:`nest.graph.placements`).
"""

import math
import random

from nest.core.axes import Optimizer
from nest.core.errors import UserError
from nest.core.hardware import Device
from nest.core.layers import AnalyticModel
from nest.core.model import ModelSpec
from nest.core.problem import Problem, Training
from nest.core.topology import Cluster, Level
from nest.core.units import GB, TFLOP, US, GiB
from nest.graph.build import graph_cluster
from nest.graph.generators import leaf_spine, rail_optimized, tpuv4_torus

ORDERS = ("tp-cp-dp-pp", "tp-cp-pp-dp", "tp-dp-pp-cp", "tp-pp-dp-cp", "tp-dp-cp-pp", "tp-pp-cp-dp")


NETWORKS = ("hierarchy", "torus", "rails", "leaf_spine")
"""``hierarchy``: the random levels above; the others draw a small graph of that family
(:func:`graph_of`) and put the same model, device and training on it."""


def graph_of(network: str, seed: int, max_devices: int = 8):
    """A small graph of one family, from its own random stream (so the hierarchy instances of
    the same seeds are unchanged): a torus (2x2, 4x1, 2x2x2, 4x2; dimension-order routing, one
    random link speed), a rail-optimised pod (1-2 scalable units of 2 nodes of 2-4 GPUs) or an
    oversubscribed leaf-spine fabric (nodes of 2 GPUs, 1-2 per leaf, 1-2 spines, 2:1 to 8:1),
    with random link speeds and latencies."""
    rng = random.Random(f"{network}-{seed}")
    if network == "torus":
        shapes = [
            s for s in ((2, 2, 1), (4, 1, 1), (2, 2, 2), (4, 2, 1)) if math.prod(s) <= max_devices
        ]
        shape = rng.choice(shapes)
        return tpuv4_torus(
            math.prod(shape),
            shape=list(shape),
            link_bw_gbps=rng.uniform(10, 400),
            link_latency_us=rng.uniform(0.2, 15),
        )
    fast, slow = rng.uniform(100, 900), rng.uniform(5, 100)
    if network == "rails":
        gpus = rng.choice([g for g in (2, 4) if 2 * g <= max_devices])
        units = rng.choice([u for u in (1, 2) if 2 * gpus * u <= max_devices])
        return rail_optimized(
            2 * gpus * units,
            gpus_per_node=gpus,
            nodes_per_su=2,
            spines=rng.choice([1, 2]),
            nvlink_bw_gbps=fast,
            nvlink_latency_us=rng.uniform(0.2, 5),
            nic_bw_gbps=slow,
            nic_latency_us=rng.uniform(0.5, 15),
            spine_latency_us=rng.uniform(0.5, 15),
        )
    if network == "leaf_spine":
        per_leaf = rng.choice([1, 2])
        leaves = rng.choice([n for n in (2, 4) if 2 * per_leaf * n <= max_devices])
        return leaf_spine(
            2 * per_leaf * leaves,
            gpus_per_node=2,
            nodes_per_leaf=per_leaf,
            spines=rng.choice([1, 2]),
            oversubscription=rng.uniform(2, 8),
            nvlink_bw_gbps=fast,
            nvlink_latency_us=rng.uniform(0.2, 5),
            nic_bw_gbps=slow,
            nic_latency_us=rng.uniform(0.5, 15),
            spine_latency_us=rng.uniform(0.5, 15),
        )
    raise ValueError(f"network={network!r}; use one of {NETWORKS}")


def instance(
    seed: int, *, max_devices: int = 8, restrict: bool = False, network: str = "hierarchy"
) -> tuple[Problem, dict]:
    """The problem and space options (keyword arguments of the planners) of one seed; a graph
    ``network`` replaces the random hierarchy with a graph of that family (:func:`graph_of`)."""
    if network not in NETWORKS:
        raise UserError(f"network={network!r}; use one of {list(NETWORKS)}")
    rng = random.Random(seed)
    n_levels = rng.randint(1, 3)
    fanouts = [rng.choice([2, 2, 4]) for _ in range(n_levels)]
    while math.prod(fanouts) > max_devices:
        fanouts.pop()
    falling = rng.random() < 0.8
    bws = sorted((rng.uniform(1, 900) for _ in fanouts), reverse=falling)
    lats = sorted((rng.uniform(0, 30) for _ in fanouts), reverse=not falling)
    levels = tuple(
        Level(name=f"level{i}", fanout=f, bw_bytes_per_s=b * GB, latency_s=a * US)
        for i, (f, b, a) in enumerate(zip(fanouts, bws, lats, strict=True))
    )
    device = Device(
        name="device",
        peak_flops_per_s=rng.uniform(5, 400) * TFLOP,
        hbm_bytes=rng.choice([0.02, 0.05, 0.2, 1.0]) * GiB,
        hbm_bw_bytes_per_s=rng.uniform(200, 3000) * GB,
        matmul_efficiency=rng.uniform(0.4, 0.9),
    )
    moe = rng.random() < 0.25
    spec = ModelSpec(
        name=f"random{seed}",
        hidden=rng.choice([128, 256, 512]),
        layers=rng.randint(2, 6),
        heads=rng.choice([4, 8]),
        ffn_hidden=rng.choice([512, 1024, 2048]),
        vocab=rng.choice([512, 2048, 8192]),
        seq_len=rng.choice([64, 128, 256]),
        activation=rng.choice(["gelu", "swiglu"]),
        dropout=rng.random() < 0.5,
        tied_embeddings=rng.random() < 0.5,
        num_experts=4 if moe else 1,
        top_k=2 if moe else 1,
    )
    flash = rng.random() < 0.5
    training = Training(
        global_batch=rng.choice([2, 4, 8, 16]),
        microbatch_sizes=(1, 2),
        optimizer=rng.choice([Optimizer.ADAM, Optimizer.SGD]),
        grad_bytes=rng.choice([2, 4]),
        overlap_grad_sync=rng.random() < 0.5,
        flash_attention=flash,
        tp_comm_overlap=False,  # the model below overlaps nothing
        cp_comm_overlap=False,
    )
    cluster = Cluster(name=f"random{seed}", device=device, levels=levels)
    if network != "hierarchy":
        graph = graph_of(network, seed, max_devices)
        cluster = graph_cluster(f"{network}{seed}", device, graph)
    problem = Problem(
        model=AnalyticModel(spec, flash_attention=flash), cluster=cluster, training=training
    )
    options: dict = {}
    if restrict:
        options = dict(
            zero_stages=sorted(rng.sample([0, 1, 2, 3], rng.randint(1, 2))),
            rank_orders=rng.sample(ORDERS, rng.randint(1, 2)),
        )
    return problem, options


def describe(problem: Problem) -> dict:
    """The instance's size, for the study's table."""
    cluster = problem.cluster
    return {
        "devices": cluster.num_devices,
        "levels": "x".join(str(level.fanout) for level in cluster.levels),
        # a datacenter's shape: bandwidth never rises and latency never falls going outwards
        "monotone_network": all(
            a.bw_bytes_per_s >= b.bw_bytes_per_s and a.latency_s <= b.latency_s
            for a, b in zip(cluster.levels, cluster.levels[1:], strict=False)
        ),
        "layers": problem.num_layers,
        "moe": problem.model.spec.is_moe,
        "hbm_gib": cluster.device.hbm_bytes / GiB,
        "global_batch": problem.training.global_batch,
    }
