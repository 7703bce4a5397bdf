"""The shared evaluator: a worked example by hand and invariants on random plans."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines.fixed import FixedPlanner
from nest.core.axes import Recompute
from nest.core.hardware import Device
from nest.core.layers import Shard
from nest.core.topology import Cluster
from nest.cost import evaluate
from nest.cost.collectives import all_reduce_time_s

from .conftest import make_cluster, make_problem, make_spec
from .randomcase import random_case

SEEDS = st.integers(0, 10**9)


def _scaled(problem, *, bw=1.0, hbm=1.0):
    c = problem.cluster
    levels = tuple(
        dataclasses.replace(lv, bw_bytes_per_s=lv.bw_bytes_per_s * bw) for lv in c.levels
    )
    device = dataclasses.replace(c.device, hbm_bytes=c.device.hbm_bytes * hbm)
    cluster = Cluster(name=c.name, device=device, levels=levels)
    return dataclasses.replace(problem, cluster=cluster)


def test_worked_example_by_hand():
    """pp=2, dp=2, tp=1 on two 2-device nodes with the Megatron order: each stage's replicas
    sit in different nodes... computed term by term from the layer costs and the formulas of
    :mod:`nest.cost.pipeline`: ``T = t0 + t1 + (m-1) max(t0, t1) + exposed + optimizer``."""
    spec = make_spec(layers=2)
    cluster = make_cluster(fanouts=(2, 2), bws_gbps=(100, 10), lat_us=(1, 10))
    problem = make_problem(spec, cluster, global_batch=8)
    plan = FixedPlanner(
        tp=1, pp=2, dp=2, microbatch_size=2, layer_partition=[2, 2], rank_order="tp,cp,pp,dp"
    ).solve(problem)
    # tp,cp,pp,dp: stage 0 on devices {0 (replica 0), 2 (replica 1)}, stage 1 on {1, 3}
    assert plan.stages[0].device_ids == (0, 2) and plan.stages[1].device_ids == (1, 3)
    r = evaluate(problem, plan)
    model, dev = problem.model, cluster.device
    shard = Shard(mbs=2)
    cost = [model.layer_cost(ref, shard, dev) for ref in model.chain]
    boundary = cost[1].boundary_bytes  # block 0's output crosses the stage boundary
    p2p = boundary / 100e9 + 1e-6  # devices 0 -> 1 share level 0
    f0 = cost[0].fwd_s + cost[1].fwd_s + p2p
    b0 = cost[0].bwd_s + cost[1].bwd_s
    f1 = cost[2].fwd_s + cost[3].fwd_s
    b1 = cost[2].bwd_s + cost[3].bwd_s + p2p
    t0, t1 = f0 + b0, f1 + b1
    m = 8 // (2 * 2)
    pipe = t0 + t1 + (m - 1) * max(t0, t1)
    assert r.pipeline_time_s == pytest.approx(pipe, rel=1e-12)
    # DP sync: all-reduce of bf16 gradients over the pair {0, 2} (level 1), ZeRO-0
    grads = [
        2 * (cost[0].dense_params + cost[1].dense_params),
        2 * (cost[2].dense_params + cost[3].dense_params),
    ]
    sync = [all_reduce_time_s(g, (1, 2), cluster) for g in grads]
    exposed = max(sync[0], max(0.0, sync[1] - b0))
    assert r.dp_sync_exposed_s == pytest.approx(exposed, rel=1e-12)
    params = [
        cost[0].dense_params + cost[1].dense_params,
        cost[2].dense_params + cost[3].dense_params,
    ]
    # Adam: 2 x 12 bytes of state, the gradient read, the weight written; gradient clipping's
    # norm reads the gradient once more (Megatron-Core clip_grads.py); at the achieved HBM rate
    opt = max(p * (24 + 2 + 2 + 2) / dev.achieved_hbm_bw_bytes_per_s for p in params)
    assert r.optimizer_s == pytest.approx(opt, rel=1e-12)
    assert r.iteration_time_s == pytest.approx(pipe + exposed + opt, rel=1e-12)
    assert r.throughput_samples_per_s == pytest.approx(8 / r.iteration_time_s)
    # memory of stage 0: 16 bytes/param, two in-flight microbatches (1F1B: min(pp - 0, m))
    mem0 = r.ranks[0].memory
    assert mem0.in_flight_microbatches == 2 and r.ranks[1].memory.in_flight_microbatches == 1
    assert mem0.weights_bytes + mem0.grads_bytes + mem0.optimizer_bytes == pytest.approx(
        16 * params[0]
    )
    assert mem0.activations_bytes == pytest.approx(
        2 * (cost[0].act_bytes[Recompute.NONE] + cost[1].act_bytes[Recompute.NONE])
    )


def test_equal_stages_give_the_textbook_pipeline_time():
    """With equal stages, 1F1B takes ``(m + p - 1) t`` (Narayanan et al. SC21 §2.2.1)."""
    spec = make_spec(layers=4, vocab=128)  # tiny embedding/head so stages are near equal
    problem = make_problem(
        spec, make_cluster(fanouts=(4,), bws_gbps=(1e6,), lat_us=(0,)), global_batch=8
    )
    plan = FixedPlanner(tp=1, pp=2, dp=1, microbatch_size=1, layer_partition=[3, 3]).solve(problem)
    r = evaluate(problem, plan)
    ts = [rk.time_s for rk in r.ranks]
    assert r.pipeline_time_s == pytest.approx(sum(ts) + 7 * max(ts))
    assert r.bubble_s == pytest.approx(sum(ts) - max(ts))


def test_interleaving_divides_the_bubble():
    spec = make_spec(layers=6, vocab=128)
    problem = make_problem(
        spec, make_cluster(fanouts=(2,), bws_gbps=(1e6,), lat_us=(0,)), global_batch=8
    )
    base = evaluate(problem, FixedPlanner(pp=2, dp=1, microbatch_size=1).solve(problem))
    inter = evaluate(
        problem,
        FixedPlanner(
            pp=2,
            dp=1,
            microbatch_size=1,
            schedule="interleaved",
            virtual_stages=2,
            layer_partition=[2, 2, 1, 1],
        ).solve(problem),
    )
    assert inter.bubble_s < base.bubble_s
    assert (
        inter.ranks[0].memory.in_flight_microbatches > base.ranks[0].memory.in_flight_microbatches
    )


@settings(max_examples=150, deadline=None)
@given(SEEDS)
def test_memory_terms_add_up(seed):
    problem, planner = random_case(seed)
    r = evaluate(problem, planner.solve(problem))
    for rank in r.ranks:
        m = rank.memory
        terms = (
            m.weights_bytes,
            m.grads_bytes,
            m.optimizer_bytes,
            m.activations_bytes,
            m.transient_bytes,
            m.reserve_bytes,
        )
        assert all(t >= 0 for t in terms)
        assert m.total_bytes == pytest.approx(sum(terms), rel=1e-12)
    assert r.peak_memory_bytes == max(rk.memory.total_bytes for rk in r.ranks)
    assert r.feasible == all(rk.memory.fits for rk in r.ranks)
    assert r.iteration_time_s == pytest.approx(
        r.pipeline_time_s + r.dp_sync_exposed_s + r.optimizer_s, rel=1e-12
    )
    assert r.bubble_s >= -1e-12 and r.dp_sync_exposed_s >= 0


@settings(max_examples=150, deadline=None)
@given(SEEDS)
def test_tp1_means_no_tp_traffic_and_dp1_no_sync(seed):
    problem, planner = random_case(seed)
    planner.tp, planner.etp = 1, None
    if (planner.dp * planner.cp) % planner.ep:  # ep had folded the tensor ranks (etp 1)
        planner.ep = 1
    plan = planner.solve(problem)
    r = evaluate(problem, plan)
    assert all(s.tp_comm_s == 0 for s in r.stages)
    planner.dp, planner.cp, planner.ep = 1, 1, 1
    planner.zero_stage = 0
    plan = planner.solve(problem)
    r = evaluate(problem, plan)
    assert all(rank.dp_sync_s == 0 for rank in r.ranks)
    assert all(s.cp_comm_s == 0 and s.ep_comm_s == 0 for s in r.stages)


@settings(max_examples=150, deadline=None)
@given(SEEDS, st.floats(1.0, 8.0))
def test_more_bandwidth_never_slower(seed, factor):
    problem, planner = random_case(seed)
    plan = planner.solve(problem)
    slow = evaluate(problem, plan).iteration_time_s
    fast = evaluate(_scaled(problem, bw=factor), plan).iteration_time_s
    assert fast <= slow * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(SEEDS, st.floats(1.0, 8.0))
def test_more_hbm_never_turns_feasible_infeasible(seed, factor):
    problem, planner = random_case(seed)
    plan = planner.solve(problem)
    before = evaluate(problem, plan)
    after = evaluate(_scaled(problem, hbm=factor), plan)
    assert after.feasible or not before.feasible
    assert after.iteration_time_s == before.iteration_time_s  # memory does not change time


@settings(max_examples=100, deadline=None)
@given(SEEDS)
def test_zero_stages_trade_memory_monotonically(seed):
    """Each ZeRO stage shards one more state over the data-parallel group (Rajbhandari et al.)."""
    problem, planner = random_case(seed)
    peaks = []
    for stage in range(4):
        planner.zero_stage = stage
        r = evaluate(problem, planner.solve(problem))
        peaks.append(
            [
                rk.memory.weights_bytes + rk.memory.grads_bytes + rk.memory.optimizer_bytes
                for rk in r.ranks
            ]
        )
    for lower, higher in zip(peaks, peaks[1:], strict=False):
        assert all(h <= lo * (1 + 1e-12) for lo, h in zip(lower, higher, strict=True))


def test_zero_paper_worked_example():
    """Rajbhandari et al. (ZeRO, SC20) Figure 1: a 7.5B-parameter model on 64 data-parallel
    devices with mixed-precision Adam needs 120 GB of model states per device without ZeRO,
    31.4 GB with P_os (stage 1), 16.6 GB with P_os+g (stage 2), 1.88 GB with P_os+g+p (stage 3)."""
    from nest.cost.state import ModelState

    spec = make_spec()
    problem = make_problem(spec, make_cluster(fanouts=(8, 8)), global_batch=64)
    expected = [120e9, 31.4e9, 16.6e9, 1.88e9]
    for stage, want in enumerate(expected):
        state = ModelState.of(problem, zero_stage=stage, dp=64, cp=1, ep=1)
        states = state.state_bytes(7.5e9, 0.0)
        assert states == pytest.approx(want, rel=0.01)
        parts = state.weights_bytes(7.5e9, 0.0) + state.grads_bytes(7.5e9, 0.0)
        assert parts + state.optimizer_bytes(7.5e9, 0.0) == pytest.approx(states, rel=1e-12)


def test_rank_order_decides_which_groups_use_fast_links():
    """tp innermost keeps tensor traffic on level 0; putting dp innermost moves it across nodes
    and makes the same plan slower (bandwidth 10x lower across nodes)."""
    spec = make_spec(layers=4)
    cluster = make_cluster(fanouts=(4, 4), bws_gbps=(400, 40), lat_us=(1, 5))
    problem = make_problem(spec, cluster, global_batch=16)
    inner = FixedPlanner(tp=4, dp=4, microbatch_size=1, rank_order="tp,dp,pp").solve(problem)
    outer = FixedPlanner(tp=4, dp=4, microbatch_size=1, rank_order="dp,tp,pp").solve(problem)
    r_in, r_out = evaluate(problem, inner), evaluate(problem, outer)
    assert r_in.stages[0].tp_comm_s < r_out.stages[0].tp_comm_s
    assert cluster.group_factors(inner.stages[0].devices[0][0]) == (4, 1)
    assert cluster.group_factors(outer.stages[0].devices[0][0]) == (1, 4)


def test_device_validation_messages():
    with pytest.raises(ValueError, match="matmul_efficiency"):
        Device(name="d", peak_flops_per_s=1, hbm_bytes=1, hbm_bw_bytes_per_s=1, matmul_efficiency=0)


def test_interleaved_sync_is_hidden_only_by_the_chunks_left():
    """Under interleaving rank r's last backward is its first chunk (chunk r); only chunks
    r-1..0 run after it, so only their backward hides rank r's DP synchronisation."""
    spec = make_spec(layers=6, vocab=128)
    problem = make_problem(spec, make_cluster(fanouts=(2, 4)), global_batch=16)
    plan = FixedPlanner(
        pp=2,
        dp=4,
        microbatch_size=1,
        schedule="interleaved",
        virtual_stages=2,
        layer_partition=[1, 3, 1, 3],
    ).solve(problem)
    r = evaluate(problem, plan)
    chunk_bwd = [s.bwd_s for s in r.stages]
    assert r.ranks[1].dp_sync_exposed_s == pytest.approx(
        max(0.0, r.ranks[1].dp_sync_s - chunk_bwd[0])
    )
    assert r.ranks[1].dp_sync_s > chunk_bwd[0] + chunk_bwd[2]  # the case where the rule matters


def test_layer_collectives_follow_megatron():
    """Embedding: forward reduce-scatter (SP) whose backward is an all-gather; pipeline boundary
    is the SP shard, or the full tensor without SP; selective recompute re-uses the backward's
    K/V gather under context parallelism."""
    from nest.core.layers import AnalyticModel

    from .conftest import make_device

    spec = make_spec(seq_len=64)
    model = AnalyticModel(spec)
    dev = make_device()
    emb = model.layer_cost(model.chain[0], Shard(tp=4, sp=True), dev)
    assert [c.op for c in emb.fwd_collectives] == ["reduce_scatter"]
    assert [c.op for c in emb.bwd_collectives] == ["all_gather"]
    full = 2 * spec.seq_len * spec.hidden
    assert emb.boundary_bytes == full / 4
    block = model.layer_cost(model.chain[1], Shard(tp=4, sp=False), dev)
    assert block.boundary_bytes == full
    cp = model.layer_cost(model.chain[1], Shard(cp=2), dev)
    assert cp.recompute_collectives[Recompute.SELECTIVE] == ()
    assert [c.op for c in cp.bwd_collectives] == ["all_gather", "reduce_scatter"]


def test_flash_backward_recomputes_only_the_scores():
    """FlashAttention-2 (Dao 2023): the backward recomputes S = QK^T, half the attention core's
    forward FLOPs (the reason its backward is 2.5x its forward)."""
    from nest.core.layers import AnalyticModel

    from .conftest import make_device

    spec = make_spec()
    dev = make_device()
    model = AnalyticModel(spec, flash_attention=True)
    cost = model.layer_cost(model.chain[1], Shard(), dev)
    core_s = 4 * spec.seq_len**2 * spec.hidden / dev.achieved_flops_per_s
    assert cost.recompute_s[Recompute.NONE] == pytest.approx(core_s / 2)
    assert cost.recompute_s[Recompute.FULL] == pytest.approx(cost.fwd_s + core_s / 2)


def test_moe_with_tensor_parallelism_needs_sequence_parallelism():
    from nest.core.errors import UserError

    spec = make_spec(num_experts=4, top_k=2)
    problem = make_problem(spec, make_cluster(fanouts=(4, 2)), sequence_parallel=False)
    with pytest.raises(UserError, match="sequence parallelism"):
        FixedPlanner(tp=2, dp=4, microbatch_size=1).solve(problem)


def test_malformed_placements_are_rejected_with_the_device_named():
    from nest.core.errors import UserError

    problem = make_problem(make_spec(layers=4), make_cluster(fanouts=(4, 2)), global_batch=16)
    plan = FixedPlanner(pp=2, dp=4, microbatch_size=1).solve(problem)
    stages = list(plan.stages)
    stages[1] = dataclasses.replace(stages[1], devices=stages[0].devices)
    with pytest.raises(UserError, match="device 0 is used twice"):
        evaluate(problem, dataclasses.replace(plan, stages=tuple(stages)))
    stages[1] = dataclasses.replace(stages[1], devices=(((99,),),) * 4)
    with pytest.raises(UserError, match="device id 99 is outside"):
        evaluate(problem, dataclasses.replace(plan, stages=tuple(stages)))


def test_hardware_flops_count_the_recompute_pass():
    """With full recompute and V padded already, an iteration executes SC21's
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` FLOPs (eq. 3), model FLOPs the ``72`` form."""
    spec = make_spec(layers=4, hidden=256, heads=8, ffn_hidden=1024, vocab=1024, seq_len=128)
    problem = make_problem(spec, make_cluster(fanouts=(2, 2)), global_batch=8)
    r = evaluate(
        problem, FixedPlanner(tp=2, pp=2, recompute="full", microbatch_size=1).solve(problem)
    )
    B, s, l, h, V = 8, 128, 4, 256, 1024  # noqa: E741
    assert r.hardware_flops_per_iteration == pytest.approx(
        96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-9
    )
    assert r.model_flops_per_iteration == pytest.approx(
        72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h)), rel=1e-9
    )
