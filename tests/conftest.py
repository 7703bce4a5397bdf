"""Shared builders for small problems."""

import pytest
from hypothesis import settings

from nest.core.axes import Optimizer
from nest.core.hardware import Device
from nest.core.layers import AnalyticModel
from nest.core.model import ModelSpec
from nest.core.problem import Problem, Training
from nest.core.topology import Cluster, Level
from nest.core.units import GB, TFLOP, US, GiB

# Property tests draw the same examples on every run (CI cannot flake) and keep no database
# in the working tree.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")


def make_device(**over) -> Device:
    kw = dict(
        name="dev",
        peak_flops_per_s=100 * TFLOP,
        hbm_bytes=16 * GiB,
        hbm_bw_bytes_per_s=1000 * GB,
        matmul_efficiency=1.0,
    )
    kw.update(over)
    return Device(**kw)


def make_cluster(
    fanouts=(4, 2), bws_gbps=None, lat_us=None, device=None, effs=None, **over
) -> Cluster:
    """Defaults: bandwidth falling and latency rising up the levels, nameplate bandwidth."""
    n = len(fanouts)
    bws_gbps = bws_gbps or (400, 50, 25, 12.5, 6.25)[:n]
    lat_us = lat_us or (1, 5, 9, 13, 17)[:n]
    effs = effs or (1.0,) * n
    levels = tuple(
        Level(name=f"l{i}", fanout=f, bw_bytes_per_s=b * GB, latency_s=a * US, bw_efficiency=e)
        for i, (f, b, a, e) in enumerate(zip(fanouts, bws_gbps, lat_us, effs, strict=True))
    )
    return Cluster(name="test", device=device or make_device(**over), levels=levels)


def make_spec(**over) -> ModelSpec:
    kw = dict(
        name="t",
        hidden=128,
        layers=4,
        heads=8,
        ffn_hidden=512,
        vocab=1000,
        seq_len=64,
        activation="gelu",
        dropout=True,
    )
    kw.update(over)
    return ModelSpec(**kw)


NO_OVERLAP = dict(overlap_grad_sync=False, tp_comm_overlap=False, cp_comm_overlap=False)
"""The hand-made problems overlap nothing unless a test says so."""


def make_problem(spec=None, cluster=None, *, flash=False, **train) -> Problem:
    kw = dict(global_batch=16, microbatch_sizes=(1, 2), optimizer=Optimizer.ADAM, **NO_OVERLAP)
    kw.update(train)
    training = Training(flash_attention=flash, **kw)
    return Problem(
        model=AnalyticModel(
            spec or make_spec(),
            flash_attention=flash,
            fused_loss=training.fused_loss,
            cross_entropy_loss_fusion=training.cross_entropy_loss_fusion,
            overlap=training.overlap,
            precision=training.numerics,
            moe_routing=training.moe_routing,
            moe_dispatcher=training.moe_dispatcher,
        ),
        cluster=cluster or make_cluster(),
        training=training,
    )


@pytest.fixture
def problem() -> Problem:
    return make_problem()


def assert_not_faster_than_peak(problem: Problem, plan) -> None:
    """A plan's iteration cannot beat its devices' peak FLOP rate: ``objective_s >= model FLOPs
    per iteration / (devices used * peak FLOP/s)`` (the definition of model FLOPs utilisation,
    MFU <= 1; Chowdhery et al. 2022, PaLM, Appendix B). Computed from the model's FLOP count and
    the device sheet alone, so an objective under-reported by a planner or the evaluator fails."""
    flops = problem.model.model_flops_per_sample() * problem.training.global_batch
    device = problem.cluster.device
    fp8 = problem.training.numerics.fp8  # FP8 GEMMs may run up to the FP8 peak
    peak = (
        max(device.peak_flops_per_s, device.fp8_peak_flops_per_s)
        if fp8
        else device.peak_flops_per_s
    )
    floor_s = flops / (plan.devices_used * peak)
    assert plan.objective_s >= floor_s * (1 - 1e-12), (plan.solver, plan.objective_s, floor_s)
