"""Seeded small instances for the optimality study: a random model, network and memory size.

Each seed gives a problem of 2-6 transformer blocks (4-8 chain layers with embedding and head),
dense or MoE, on 2-8 devices in 1-3 levels with random bandwidths (1-900 GB/s per device,
falling outwards with probability 0.8) and latencies (0-30 us), HBM sizes from tight to ample,
global batch 2-16 and microbatch candidates 1 and 2; the space is nest's full space (every ZeRO
stage, recompute mode, rank order with tp innermost and schedule) unless ``restrict`` is set,
which draws a random sub-space (a few rank orders and ZeRO stages), the kind of space a user
narrows to by hand.
"""

import math
import random

from nest.axes import Optimizer
from nest.hardware import Device
from nest.layers import AnalyticModel
from nest.model import ModelSpec
from nest.problem import Problem, Training
from nest.topology import Cluster, Level
from nest.units import GB, TFLOP, US, GiB

ORDERS = ("tp-cp-dp-pp", "tp-cp-pp-dp", "tp-dp-pp-cp", "tp-pp-dp-cp", "tp-dp-cp-pp", "tp-pp-cp-dp")


def instance(seed: int, *, max_devices: int = 8, restrict: bool = False) -> tuple[Problem, dict]:
    """The problem and space options (keyword arguments of the planners) of one seed."""
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
    )
    problem = Problem(
        model=AnalyticModel(spec, flash_attention=flash),
        cluster=Cluster(name=f"random{seed}", device=device, levels=levels),
        training=training,
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
