"""Hybrid sharding (HSDP, ``ParallelConfig.zero_shard``): the plan field, its groups and its
cost terms, worked by hand."""

import numpy as np
import pytest

from baselines.fixed import FixedPlanner
from nest.core.errors import UserError
from nest.core.plan import ParallelConfig, group_arrays
from nest.cost import evaluate

from .conftest import make_cluster, make_problem

GB, US = 1e9, 1e-6


def test_zero_shard_is_validated_with_one_line_errors():
    """A shard degree must divide ``dp``; it needs a ZeRO stage and (for now) no experts; a
    shard degree equal to ``dp`` is the plain configuration and compares equal to it."""
    with pytest.raises(UserError, match="zero_shard=3 must be a positive divisor of dp=8"):
        ParallelConfig(dp=8, zero_stage=1, zero_shard=3)
    with pytest.raises(UserError, match="zero_stage=0"):
        ParallelConfig(dp=8, zero_shard=4)
    with pytest.raises(UserError, match="ep=2"):
        ParallelConfig(dp=8, ep=2, zero_stage=1, zero_shard=4)
    assert ParallelConfig(dp=8, zero_stage=3, zero_shard=8) == ParallelConfig(dp=8, zero_stage=3)
    assert ParallelConfig(dp=8, zero_stage=1, zero_shard=2).zero_replicas == 4


def test_hsdp_groups_shard_inside_and_replicate_across():
    """``[dp=4][cp=2][tp=1]`` devices ``d[r][c] = 2 r + c`` with ``zero_shard = 2``: replicas
    0, 1 form shard group 0 and 2, 3 shard group 1 (each ``zero_shard x cp = 4`` ranks);
    replicate groups pair the ranks at the same place in each group."""
    got = group_arrays(np.arange(8).reshape(4, 2, 1), ep=1, zero_shard=2)
    assert sorted(sorted(g) for g in got["zero_shard"].tolist()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sorted(sorted(g) for g in got["zero_replicate"].tolist()) == [
        [0, 4],
        [1, 5],
        [2, 6],
        [3, 7],
    ]
    assert "zero_shard" not in group_arrays(np.arange(8).reshape(4, 2, 1), ep=1)


def _case():
    """8 devices, 2 nodes of 4 (400 GB/s, 1 us inside; 50 GB/s, 5 us across), ``dp = 8`` with
    Megatron's rank order, so replica ``d`` is device ``d``; ``zero_shard = 4``: each node is a
    shard group, the two nodes replicate."""
    cluster = make_cluster(fanouts=(4, 2), bws_gbps=(400, 50), lat_us=(1, 5))
    problem = make_problem(cluster=cluster, global_batch=16)
    model = problem.model
    shard = ParallelConfig(dp=8).shard(False)
    params = sum(model.layer_cost(ref, shard, cluster.device).dense_params for ref in model.chain)
    return problem, params


def _ring_s(n_bytes, peers, bw_gbps, lat_us):
    """One ring level (``nest.cost.collectives``: Thakur et al. 2005): ``(k-1)/k S / bw +
    (k-1) alpha``."""
    return (peers - 1) / peers * n_bytes / (bw_gbps * GB) + (peers - 1) * lat_us * US


def test_hsdp_sync_is_reduce_scatter_inside_all_reduce_across_all_gather_inside():
    """Worked example (ZeRO-1 and ZeRO-3 with ``zero_shard = 4`` on :func:`_case`), the HSDP
    gradient path of FSDP2 (torchtitan ``docs/fsdp.md``, a 2-D ``(replicate, shard)`` mesh;
    FSDP1 ``HYBRID_SHARD``) and of Megatron-Core's ``--num-distributed-optimizer-instances``
    (``param_and_grad_buffer.py``: reduce-scatter inside an instance, all-reduce across):

    - ZeRO-1: reduce-scatter ``G = 2 N`` bytes among the 4 devices of a node, all-reduce the
      reduced shard ``G / 4`` between the 2 nodes (twice one ring level), all-gather ``P = 2 N``
      among the 4 again;
    - ZeRO-3: only the all-reduce across at the end of the iteration (its reduce-scatters run
      every microbatch, inside the node);
    - memory: the optimizer state (12 bytes per parameter, Adam) over the 4 of the node, not
      the 8 of ``dp``."""
    problem, n = _case()
    g = 2 * n
    inside = _ring_s(g, 4, 400, 1)
    across = 2 * _ring_s(g / 4, 2, 50, 5)
    one = evaluate(problem, FixedPlanner(dp=8, zero_stage=1, zero_shard=4).solve(problem))
    assert one.ranks[0].dp_sync_s == pytest.approx(inside + across + inside, rel=1e-12)
    three = evaluate(problem, FixedPlanner(dp=8, zero_stage=3, zero_shard=4).solve(problem))
    assert three.ranks[0].dp_sync_s == pytest.approx(across, rel=1e-12)
    full = evaluate(problem, FixedPlanner(dp=8, zero_stage=1).solve(problem))
    mem_hsdp, mem_full = one.ranks[0].memory, full.ranks[0].memory
    assert mem_hsdp.optimizer_bytes - mem_full.optimizer_bytes == pytest.approx(
        12 * n / 4 - 12 * n / 8, rel=1e-12
    )
    # full sharding's hierarchical reduce-scatter and all-gather over split (4, 2) each run
    # the node's ring and then a 2-ring on G / 4 across: the same terms as HSDP's, so on a
    # hierarchy ZeRO-1 HSDP buys no sync time here, only costs memory
    full_sync = 2 * (_ring_s(g, 4, 400, 1) + _ring_s(g / 4, 2, 50, 5))
    assert full.ranks[0].dp_sync_s == pytest.approx(full_sync, rel=1e-12)
    assert one.ranks[0].dp_sync_s == pytest.approx(full_sync, rel=1e-12)


def test_hsdp_zero3_gathers_run_in_the_shard_group():
    """ZeRO-3 with ``zero_shard = 4``: every layer's all-gather and reduce-scatter is one ring
    inside the node (no level-1 term), so a stage's ZeRO-3 traffic equals that of ``dp = 4``
    sharding over one node alone, and it is below full sharding over both nodes."""
    problem, _ = _case()
    hsdp = evaluate(problem, FixedPlanner(dp=8, zero_stage=3, zero_shard=4).solve(problem))
    full = evaluate(problem, FixedPlanner(dp=8, zero_stage=3).solve(problem))
    node = make_problem(
        cluster=make_cluster(fanouts=(4,), bws_gbps=(400,), lat_us=(1,)), global_batch=8
    )
    alone = evaluate(node, FixedPlanner(dp=4, zero_stage=3).solve(node))
    assert hsdp.stages[0].zero3_comm_s == pytest.approx(alone.stages[0].zero3_comm_s, rel=1e-12)
    assert hsdp.stages[0].zero3_comm_s < full.stages[0].zero3_comm_s
    assert hsdp.ranks[0].memory.weights_bytes > full.ranks[0].memory.weights_bytes
