"""The options that landed together stay exact together: ZB-H1 (tests/test_zero_bubble.py),
offload (tests/test_offload.py), hybrid sharding (tests/test_hsdp.py) and DeepEP
(tests/test_deepep.py) each have their own ``nest == brute`` suite; here they are searched at
once, since each changes a term the others' proofs use (the W pass, the offload excess in the
backward, the state's sharding and its sync, the expert exchange)."""

import dataclasses
import random

from nest.core.errors import UserError
from nest.core.layers import AnalyticModel
from nest.core.problem import Problem

from .randomcase import assert_nest_equals_brute
from .test_nest_dp import tiny_case
from .test_offload import _with_offload_hardware


def _deepep(problem: Problem) -> Problem:
    training = dataclasses.replace(problem.training, moe_dispatcher="deepep")
    model = AnalyticModel(
        problem.model.spec,
        flash_attention=training.flash_attention,
        overlap=training.overlap,
        precision=training.numerics,
        moe_routing=training.moe_routing,
        moe_dispatcher="deepep",
    )
    return Problem(model=model, cluster=problem.cluster, training=training)


def _oracles(first_seed: int, more_options):
    """``nest == brute`` on 25 random small problems from ``tiny_case(first_seed + k)``, on
    offload hardware with offload on, every hybrid shard degree, MoE dispatched with DeepEP, and
    ``more_options(k)``; yields brute's optimum of each problem where something fits (a problem
    with nothing in the restricted space is skipped)."""
    for seed in range(25):
        problem, options = tiny_case(first_seed + seed)
        problem = _with_offload_hardware(problem, random.Random(seed))
        if problem.model.spec.is_moe:
            problem = _deepep(problem)
        options = {**options, "offload": True, "zero_shards": ["all"], **more_options(seed)}
        try:
            oracle = assert_nest_equals_brute(problem, options, (seed, options))
        except UserError:
            continue  # nothing in the restricted space (e.g. no pipeline for ZB-H1)
        if oracle is not None:
            yield oracle


def test_nest_equals_brute_with_zb_h1_offload_hsdp_and_deepep_at_once():
    """25 random small problems searched with 1F1B and ZB-H1, offload on, every hybrid shard
    degree, MoE models dispatched with DeepEP: ``nest`` equals ``brute`` to 1e-9, and the optima
    use ZB-H1 and offload somewhere."""
    optima = list(_oracles(7000, lambda seed: {"schedules": ["1f1b", "zb_h1"]}))
    zb = sum(o.schedule == "zb_h1" for o in optima)
    offloaded = sum(o.optimizer_offload or o.activation_offload for o in optima)
    assert len(optima) >= 12, len(optima)
    assert zb >= 2 and offloaded >= 2, (zb, offloaded)


def test_nest_equals_brute_with_zb_h2_op_recompute_and_the_lazy_bounds_at_once():
    """The later options with the earlier ones: ZB-H2 (its own family floor is 0 in the lazy
    ranking, ``Floors.family_floor_s``), torchtitan's op-level recompute, offload, hybrid sharding
    and DeepEP, searched together on 25 random small problems (a third of them pinned to ZB-H2, a
    third choosing between op and full recompute): ``nest`` equals ``brute`` to 1e-9 and optima
    use ZB-H2 and op."""

    def options(seed):
        # a third of the seeds pin ZB-H2, a third op against full, so both are exercised
        return {
            "schedules": ["zb_h2"] if seed % 3 == 0 else ["1f1b", "zb_h1", "zb_h2"],
            "recompute": ["op", "full"] if seed % 3 == 1 else ["none", "mlp", "op", "full"],
        }

    optima = list(_oracles(7100, options))
    zb2 = sum(o.schedule == "zb_h2" for o in optima)
    op = sum(any(s.recompute == "op" for s in o.stages) for o in optima)
    assert len(optima) >= 12, len(optima)
    assert zb2 >= 2 and op >= 2, (zb2, op)


def test_nest_equals_brute_with_zb_v_offload_hsdp_and_deepep_at_once():
    """ZB-V (nest/dp/zb_v.py: its own solver over the largest B pass, the entry bound and the
    memory floor without the tied copy) beside the other schedules, with offload (its exposed
    copies add to the B pass), every hybrid shard degree and DeepEP, on 25 random small
    problems (a third pinned to ZB-V): ``nest`` equals ``brute`` to 1e-9."""

    def options(seed):
        return {"schedules": ["zb_v"] if seed % 3 == 0 else ["1f1b", "zb_h1", "zb_h2", "zb_v"]}

    optima = list(_oracles(7200, options))
    assert len(optima) >= 12, len(optima)
    assert sum(o.schedule == "zb_v" for o in optima) >= 2


def test_nest_equals_brute_with_dualpipe_v_offload_hsdp_and_deepep_at_once():
    """DualPipeV (nest/dp/dualpipe_v.py: undominated pairs of modes, branch and bound, its own
    family bound on the compute alone) beside ZB-V and 1F1B, with offload (its exposed copies
    are transfers an overlapped step may hide), every hybrid shard degree and DeepEP, on 25
    random small problems (a third pinned to DualPipeV): ``nest`` equals ``brute`` to 1e-9."""

    def options(seed):
        return {"schedules": ["dualpipe_v"] if seed % 3 == 0 else ["1f1b", "zb_v", "dualpipe_v"]}

    optima = list(_oracles(7300, options))
    assert len(optima) >= 12, len(optima)
    assert sum(o.schedule == "dualpipe_v" for o in optima) >= 1  # (it needs m >= 2 pp)
