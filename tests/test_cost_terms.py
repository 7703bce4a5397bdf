"""Every term of the cost model worked by hand on a tiny explicit problem.

Each test builds a small plan, scores it with :func:`nest.cost.evaluate` and recomputes the term
from its published formula (or, where no paper gives one, the form ``nest/cost`` documents) with
the numbers of that problem, written out in the test (never by calling the code path under
test), asserting equality to 1e-12 relative. The layer model's own
numbers (a layer's compute seconds) are inputs here, as in ``tests/test_evaluator.py``; they are
worked by hand in ``tests/test_model_formulas.py``. Parameter counts are rebuilt from Narayanan
et al. SC21 §5.1 (a GPT block holds ``12 h^2 + 13 h``). ``docs/trust/cost-terms.md`` lists
the terms, their sources and the test of each.

Collective closed forms used below (Thakur, Rabenseifner and Gropp, IJHPCA 2005; Patarasuk and
Yuan, JPDC 2009), for ``S`` bytes on a group of ``k0`` devices per node over ``k1`` nodes
(levels 0 and 1, bandwidths ``B0 > B1``, latencies ``a0, a1``): reduce-scatter and all-gather
``(k0-1)/k0 S/B0 + (k0-1) a0 + (k1-1)/k1 (S/k0)/B1 + (k1-1) a1``; all-reduce twice that.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines.fixed import FixedPlanner
from nest.core.axes import Recompute, Schedule
from nest.core.layers import LayerCost, Shard
from nest.cost import evaluate
from nest.cost.fsdp import OverlapChain
from nest.cost.memory import peak_bytes
from nest.cost.pipeline import exposed_sync_s, in_flight_microbatches, pipeline_time_s
from nest.cost.state import ModelState

from .conftest import make_cluster, make_device, make_problem, make_spec

REL = 1e-12
P = 2  # bytes of a bf16 weight or activation element
G = 2  # bytes of a bf16 gradient element (Training.grad_bytes default)
ADAM = 12  # fp32 master weight, momentum and variance: K = 12 (ZeRO, SC20, §3.1)
FLOPS = 100e12  # make_device(): 100 TFLOP/s at matmul_efficiency 1 (flat compute model)
HBM_BW = 1000e9  # make_device(): 1000 GB/s


def approx(x):
    return pytest.approx(x, rel=REL, abs=0.0)


def padded(vocab: int, t: int) -> int:
    """Megatron-LM pads the vocabulary to a multiple of 128 t (--make-vocab-size-divisible-by)."""
    multiple = 128 * t
    return -(-vocab // multiple) * multiple


def gpt_params(spec, vocab_padded: int) -> dict[str, int]:
    """Parameters of a GPT-style model (LayerNorm, biases, learned positions, untied head), per
    layer: SC21 §5.1 (Narayanan et al.) counts ``12 h^2 + 13 h`` per block and ``(V + s) h``
    for the embeddings; the untied head adds its own ``V h`` and the final LayerNorm ``2 h``."""
    h, s = spec.hidden, spec.seq_len
    assert spec.ffn_hidden == 4 * h and spec.kv_heads is None  # the SC21 block shape
    return {
        "embedding": (vocab_padded + s) * h,
        "block": 12 * h * h + 13 * h,
        "head": vocab_padded * h + 2 * h,
    }


def korthikanti_block_bytes(spec, b: int, mode: Recompute) -> float:
    """Korthikanti et al. 2022 (arXiv 2205.05198) Table 2, no parallelism, bytes per block:
    ``sbh (34 + 5 a s / h)`` stored without recompute, ``34 sbh`` with selective recompute,
    ``2 sbh`` (the block's input) with full recompute."""
    s, h, a = spec.seq_len, spec.hidden, spec.heads
    sbh = s * b * h
    return {
        Recompute.NONE: sbh * (34 + 5 * a * s / h),
        Recompute.SELECTIVE: 34 * sbh,
        Recompute.FULL: 2 * sbh,
    }[mode]


# ---------------------------------------------------------------- DP sync and ZeRO, per stage


def _zero_case(zero_stage: int):
    """pp=1, tp=1, dp=4 on two nodes of two devices: the DP group splits (2, 2)."""
    spec = make_spec(layers=2)  # h=128, a=8, F=512, V=1000 (padded 1024), s=64
    cluster = make_cluster(fanouts=(2, 2), bws_gbps=(100, 10), lat_us=(1, 10))
    problem = make_problem(spec, cluster, global_batch=8)
    plan = FixedPlanner(tp=1, pp=1, dp=4, microbatch_size=1, zero_stage=zero_stage).solve(problem)
    return spec, problem, plan, evaluate(problem, plan)


def _rs_2x2(n_bytes: float) -> float:
    """Reduce-scatter (or all-gather) of ``n_bytes`` on the (2, 2) split of :func:`_zero_case`:
    half the buffer among the node's two devices at 100 GB/s, then half of the remaining half
    between the two nodes at 10 GB/s, one latency step per level."""
    return 0.5 * n_bytes / 100e9 + 1e-6 + 0.5 * (n_bytes / 2) / 10e9 + 10e-6


def _psi(spec) -> float:
    counts = gpt_params(spec, padded(spec.vocab, 1))
    return counts["embedding"] + spec.layers * counts["block"] + counts["head"]


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_dp_sync_per_zero_stage(zero_stage):
    """Rajbhandari et al. (ZeRO, SC20) §7.2: stages 0-2 move ``2 Psi`` per step (an all-reduce,
    or a reduce-scatter of the gradients plus an all-gather of the updated weights: the same
    volume); stage 3 moves ``3 Psi`` (weights all-gathered for the forward and again for the
    backward, gradients reduce-scattered), 1.5 times as much, every microbatch. Here
    ``Psi = 2 x 198,272 + 139,264 + 131,328 = 667,136`` parameters (two blocks, embedding, head)
    of 2 bytes over 4 ranks split (2, 2)."""
    spec, problem, plan, r = _zero_case(zero_stage)
    psi = _psi(spec)
    assert psi == 667_136
    rs = _rs_2x2(G * psi)
    ag = _rs_2x2(P * psi)
    all_reduce = 2 * rs
    sync = {0: all_reduce, 1: rs + ag, 2: rs + ag, 3: 0.0}[zero_stage]
    assert r.ranks[0].dp_sync_s == approx(sync)
    if zero_stage in (1, 2):  # ZeRO §7.2.1: P_os and P_os+g move what the all-reduce moves
        assert r.ranks[0].dp_sync_s == approx(all_reduce)
    # FSDP gathers and reduce-scatters each layer as one collective (one latency step each)
    counts = gpt_params(spec, padded(spec.vocab, 1))
    units = [counts["embedding"], counts["block"], counts["block"], counts["head"]]
    zero3 = sum(2 * _rs_2x2(P * u) + _rs_2x2(G * u) for u in units)
    assert r.stages[0].zero3_comm_s == approx(zero3 if zero_stage == 3 else 0.0)
    if zero_stage == 3:  # ZeRO §7.2.2: 3 Psi against 2 Psi, plus the per-unit latencies
        extra_latency_s = 3 * (len(units) - 1) * 11e-6
        assert r.stages[0].zero3_comm_s == approx(1.5 * all_reduce + extra_latency_s)
    # the stage pays what prefetching leaves of its gathers and scatters (nest.cost.fsdp): at
    # least the first layer's gather, the last one's re-gather and the first one's scatter
    s0 = r.stages[0]
    compute = s0.compute_fwd_s + s0.compute_bwd_s + s0.recompute_s
    assert s0.fwd_s + s0.bwd_s == approx(compute + s0.zero3_exposed_s)
    if zero_stage == 3:
        unhidden_s = _rs_2x2(P * units[0]) + _rs_2x2(G * units[0]) + _rs_2x2(P * units[-1])
        assert unhidden_s < s0.zero3_exposed_s <= s0.zero3_comm_s
    else:
        assert s0.zero3_exposed_s == 0.0
    # optimizer step: Adam reads and writes 12 bytes of fp32 state, reads the gradient, writes
    # the weight (2 x 12 + 2 + 2 bytes per parameter of the device's shard), after gradient
    # clipping's norm pass reads the gradient once more (Megatron-Core clip_grads.py), at HBM
    # bandwidth
    local = psi / 4 if zero_stage >= 1 else psi
    opt = local * (2 * ADAM + G + P + G) / HBM_BW
    assert r.optimizer_s == approx(opt)
    m = 8 // 4  # microbatches: global batch / dp
    assert r.iteration_time_s == approx(m * (s0.fwd_s + s0.bwd_s) + sync + opt)


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_model_state_memory_per_zero_stage(zero_stage):
    """ZeRO (SC20) §5.1 and Figure 1, mixed-precision Adam at ``2 + 2 + K`` bytes per parameter
    (``K = 12``) on ``N_d = 4`` ranks: baseline ``16 Psi``; P_os ``4 Psi + 12 Psi/N_d``; P_os+g
    ``2 Psi + 14 Psi/N_d``; P_os+g+p ``16 Psi/N_d``."""
    spec, _, _, r = _zero_case(zero_stage)
    psi, n = _psi(spec), 4
    want = {
        0: (2 + 2 + ADAM) * psi,
        1: (2 + 2) * psi + ADAM * psi / n,
        2: 2 * psi + (2 + ADAM) * psi / n,
        3: (2 + 2 + ADAM) * psi / n,
    }[zero_stage]
    mem = r.ranks[0].memory
    assert mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes == approx(want)
    assert mem.weights_bytes == approx(P * psi / (n if zero_stage == 3 else 1))
    assert mem.grads_bytes == approx(G * psi / (n if zero_stage >= 2 else 1))
    assert mem.optimizer_bytes == approx(ADAM * psi / (n if zero_stage >= 1 else 1))


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_transient_memory_and_zero3_gathered_weights(zero_stage):
    """The transient term is the largest single-layer buffer (memory.py): the head's bf16 logits
    ``2 s b V`` bytes (before the fp32 cast), and under ZeRO-3 each layer's weights gathered
    beyond the device's own shard while it runs, ``2 Psi_layer (1 - 1/N_d)``. Stored activations
    (recompute none, one microbatch in flight at pp=1): the embedding's 1-byte dropout mask
    ``sbh``, ``sbh (34 + 5as/h)`` per block (Korthikanti et al. Table 2) and the head's two
    bf16 hidden tensors plus fp32 logits ``4 sbh + 4 s b V``."""
    spec, _, _, r = _zero_case(zero_stage)
    s, b, h, v = spec.seq_len, 1, spec.hidden, padded(spec.vocab, 1)
    counts = gpt_params(spec, v)
    logits = P * s * b * v
    kept = 3 / 4 if zero_stage == 3 else 0.0  # share of a layer's weights the others hold
    transient = max(
        P * counts["embedding"] * kept,
        P * counts["block"] * kept,
        logits + P * counts["head"] * kept,
    )
    mem = r.ranks[0].memory
    assert mem.transient_bytes == approx(transient)
    if zero_stage == 3:  # the head's logits and its gathered weights are the largest here
        assert transient == logits + P * counts["head"] * kept
    stored = s * b * h + 2 * korthikanti_block_bytes(spec, b, Recompute.NONE) + 4 * s * b * h
    stored += 4 * s * b * v
    assert mem.in_flight_microbatches == 1
    assert mem.activations_bytes == approx(stored)
    state = mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes
    assert mem.total_bytes == approx(state + stored + transient + mem.reserve_bytes)


def test_expert_weights_sync_over_the_expert_data_parallel_ranks():
    """MoE, ZeRO-0, dp=4, ep=2 (Megatron-Core): dense gradients all-reduce over the 4 data
    ranks (split (2, 2)); each device holds ``1/ep`` of the experts, replicated over
    ``dp/ep = 2`` ranks ({0, 2} and {1, 3}, across the nodes: split (1, 2)), whose all-reduce
    runs after the dense one: ``2 [(1/2) S / B1 + a1]``."""
    spec = make_spec(layers=1, num_experts=4, top_k=2)
    cluster = make_cluster(fanouts=(2, 2), bws_gbps=(100, 10), lat_us=(1, 10))
    problem = make_problem(spec, cluster, global_batch=8)
    plan = FixedPlanner(tp=1, pp=1, dp=4, ep=2, microbatch_size=1).solve(problem)
    r = evaluate(problem, plan)
    h, f, e, s, v = spec.hidden, spec.ffn_hidden, spec.num_experts, spec.seq_len, 1024
    expert = e * (2 * h * f + f + h) / 2  # E experts' fc1, fc2 and biases, over ep = 2
    attention = 4 * h * h + 4 * h  # QKV and projection with biases
    dense_block = attention + 4 * h + h * e  # + two LayerNorms + the router
    dense = (v + s) * h + dense_block + v * h + 2 * h
    all_reduce_cross = 2 * (0.5 * G * expert / 10e9 + 10e-6)
    assert r.ranks[0].dp_sync_s == approx(2 * _rs_2x2(G * dense) + all_reduce_cross)


# ---------------------------------------------------------------- overlapped DP sync


def test_exposed_sync_rule_on_numbers():
    """The rule pipeline.py documents, on hand-picked numbers (sync 5 and 7 s, last backward 2
    and 3 s): rank r's sync is hidden by the backward left on ranks 0..r-1 and, with overlap,
    by its own last backward: ``max(0, sync_r - sum_{j<r} b_j [- b_r])``."""
    assert exposed_sync_s([5.0, 7.0], [2.0, 3.0], False) == [5.0, 5.0]
    assert exposed_sync_s([5.0, 7.0], [2.0, 3.0], True) == [3.0, 2.0]
    assert exposed_sync_s([1.0, 7.0], [2.0, 3.0], True) == [0.0, 2.0]


@pytest.mark.parametrize("overlap", [False, True])
def test_overlapped_dp_sync_by_hand(overlap):
    """pp=2, dp=2, Megatron order tp,cp,pp,dp on two 2-device nodes: rank 0 on {0, 2}, rank 1
    on {1, 3}; each DP pair crosses the nodes (4 GB/s), so its all-reduce costs
    ``2 [(1/2) S / B1 + a1] = S / B1 + 2 a1``. Rank 1 finishes its last backward ``b_0`` before
    rank 0, which hides that much of its sync; ``overlap_grad_sync`` also hides each rank's sync
    behind its own last backward ``b_r``. The case is sized so that each rank's sync outlasts
    twice the backward that may hide it (``sync_r > b_0 + .. + b_{r-1} + 2 b_r``): every second
    of the overlap budget shows in the exposed time."""
    spec = make_spec(layers=2, seq_len=256)
    cluster = make_cluster(fanouts=(2, 2), bws_gbps=(100, 4), lat_us=(1, 10))
    problem = make_problem(spec, cluster, global_batch=16, overlap_grad_sync=overlap)
    plan = FixedPlanner(
        tp=1, pp=2, dp=2, microbatch_size=2, layer_partition=[2, 2], rank_order="tp,cp,pp,dp"
    ).solve(problem)
    assert plan.stages[0].device_ids == (0, 2) and plan.stages[1].device_ids == (1, 3)
    r = evaluate(problem, plan)
    model, device = problem.model, cluster.device
    cost = [model.layer_cost(ref, Shard(mbs=2), device) for ref in model.chain]
    s, b, h = spec.seq_len, 2, spec.hidden
    p2p = P * s * b * h / 100e9 + 1e-6  # the block's output, devices 0 -> 1 share level 0
    b0 = cost[0].bwd_s + cost[1].bwd_s
    b1 = cost[2].bwd_s + cost[3].bwd_s + p2p  # and the input gradient back to rank 0
    counts = gpt_params(spec, padded(spec.vocab, 1))
    psi = [counts["embedding"] + counts["block"], counts["block"] + counts["head"]]
    sync = [G * n / 4e9 + 2 * 10e-6 for n in psi]
    assert sync[0] > 2 * b0 and sync[1] > b0 + 2 * b1
    hidden = [b0, b0 + b1] if overlap else [0.0, b0]
    exposed = [sync[0] - hidden[0], sync[1] - hidden[1]]
    assert [rk.dp_sync_s for rk in r.ranks] == [approx(x) for x in sync]
    assert [rk.dp_sync_exposed_s for rk in r.ranks] == [approx(x) for x in exposed]
    assert r.dp_sync_exposed_s == approx(max(exposed))
    assert [st.bwd_s for st in r.stages] == [approx(b0), approx(b1)]


@pytest.mark.parametrize("overlap", [False, True])
def test_zero1_weight_gather_hides_only_under_the_first_forward(overlap):
    """ZeRO-1 (Megatron-Core's distributed optimizer) on the case above: the sync is a gradient
    reduce-scatter, ``(1/2) G Psi_r / B1 + a1`` per DP pair, which must end before the optimizer
    step, and an all-gather of the updated weights, ``(1/2) P Psi_r / B1 + a1``, which follows
    it. Megatron-Core launches that all-gather after the step and, with
    ``--overlap-param-gather``, waits for it bucket by bucket in the forward pre-hook of the next
    iteration (NVIDIA/Megatron-LM@baf94af3c667, core_r0.8.0,
    ``megatron/core/optimizer/distrib_optimizer.py``: ``zero_grad`` dispatches the first
    bucket "before forward compute is initiated"). So the backward left hides only the
    reduce-scatter, ``max(0, rs_r - sum_{j<r} b_j [- b_r])``, and only the rank's forward
    ``f_r`` hides the gather, ``max(0, ag_r [- f_r])``: the two add."""
    spec = make_spec(layers=2, seq_len=256)
    cluster = make_cluster(fanouts=(2, 2), bws_gbps=(100, 4), lat_us=(1, 10))
    problem = make_problem(spec, cluster, global_batch=16, overlap_grad_sync=overlap)
    plan = FixedPlanner(
        tp=1,
        pp=2,
        dp=2,
        microbatch_size=2,
        layer_partition=[2, 2],
        rank_order="tp,cp,pp,dp",
        zero_stage=1,
    ).solve(problem)
    r = evaluate(problem, plan)
    model, device = problem.model, cluster.device
    cost = [model.layer_cost(ref, Shard(mbs=2), device) for ref in model.chain]
    s, b, h = spec.seq_len, 2, spec.hidden
    p2p = P * s * b * h / 100e9 + 1e-6
    b0 = cost[0].bwd_s + cost[1].bwd_s
    b1 = cost[2].bwd_s + cost[3].bwd_s + p2p
    f0 = cost[0].fwd_s + cost[1].fwd_s + p2p  # the block's output sent to rank 1
    f1 = cost[2].fwd_s + cost[3].fwd_s
    counts = gpt_params(spec, padded(spec.vocab, 1))
    psi = [counts["embedding"] + counts["block"], counts["block"] + counts["head"]]
    rs = [G * n / 2 / 4e9 + 10e-6 for n in psi]
    ag = [P * n / 2 / 4e9 + 10e-6 for n in psi]
    assert [rk.dp_sync_s for rk in r.ranks] == [approx(x + y) for x, y in zip(rs, ag, strict=True)]
    assert [rk.dp_gather_s for rk in r.ranks] == [approx(x) for x in ag]
    hidden = [b0, b0 + b1] if overlap else [0.0, b0]
    window = [f0, f1] if overlap else [0.0, 0.0]
    exposed = [max(0.0, rs[k] - hidden[k]) + max(0.0, ag[k] - window[k]) for k in range(2)]
    assert [rk.dp_sync_exposed_s for rk in r.ranks] == [approx(x) for x in exposed]
    assert r.dp_sync_exposed_s == approx(max(exposed))
    # the case is sized so that each part is partly exposed: the rule is what the numbers show
    assert all(ag[k] > window[k] for k in range(2)) and rs[1] > hidden[1]


# ---------------------------------------------------------------- pipeline schedules


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (4, 8, 2), (2, 4, 3), (8, 16, 4)])
def test_bubble_fractions(p, m, v):
    """Narayanan et al. SC21 §2.2: with equal stages of ``t`` seconds per microbatch, 1F1B idles
    ``(p-1)/m`` of the ideal time ``m t`` (§2.2.1); the interleaved schedule with ``v`` chunks
    per device ``(p-1)/(v m)`` (§2.2.2)."""
    t = 0.25
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    total = pipeline_time_s([t] * p, m, schedule, v)
    assert (total - m * t) / (m * t) == approx((p - 1) / (v * m))


@pytest.mark.parametrize(
    "p, m, r, want",
    [(4, 8, 0, 4), (4, 8, 3, 1), (4, 2, 0, 2), (2, 1, 0, 1)],
)
def test_one_f_one_b_in_flight(p, m, r, want):
    """1F1B (PipeDream-Flush; Narayanan et al. SC21 §2.2.1): rank r holds ``p - r`` microbatches'
    activations at its peak (its warm-up forwards plus one), never more than the ``m`` there
    are; GPipe holds all ``m``."""
    assert in_flight_microbatches(r, p, m, Schedule.ONE_F_ONE_B, 1) == want
    assert in_flight_microbatches(r, p, m, Schedule.GPIPE, 1) == m


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (8, 4, 16)])
def test_interleaved_in_flight(p, v, m):
    """Interleaved 1F1B: rank r runs Megatron-Core's ``(p - r - 1) 2 + (v - 1) p`` warm-up
    chunk-forwards and one more in the steady state, each chunk ``1/v`` of the rank's layers.
    Rank 0 then holds ``p + (p - 1)/v`` microbatches' worth, the first stage's factor
    ``1 + (p - 1)/(p v)`` over 1F1B's ``p`` (Korthikanti et al. 2022 §4.2.3)."""
    assert in_flight_microbatches(0, p, m, Schedule.INTERLEAVED, v) == approx(p + (p - 1) / v)
    for r in range(p):
        chunks = (p - r - 1) * 2 + (v - 1) * p + 1
        assert in_flight_microbatches(r, p, m, Schedule.INTERLEAVED, v) == approx(chunks / v)
    # with fewer microbatches than warm-up chunks the count stops at all m v chunks
    assert in_flight_microbatches(0, 2, 2, Schedule.INTERLEAVED, 2) == approx(2 * 2 / 2)


def test_interleaved_plan_by_hand():
    """pp=2, v=2, m=4 on one node (100 GB/s, 1 us): chunk k of the chain [emb+b0 | b1 | b2 |
    b3+head] runs on rank k % 2; each boundary sends the block output ``2 s b h`` bytes between
    devices 0 and 1 (``S/B0 + a0``). Rank times ``t_r`` sum their chunks;
    ``T = m max_r t_r + (sum_r t_r - max_r t_r)/v`` (SC21 §2.2.2, unequal stages), the bubble
    ``(sum - max)/v``; in flight (Megatron-Core warm-up): rank 0 ``5/2``, rank 1 ``3/2``."""
    spec = make_spec(layers=4)
    cluster = make_cluster(fanouts=(2,), bws_gbps=(100,), lat_us=(1,))
    problem = make_problem(spec, cluster, global_batch=4)
    plan = FixedPlanner(
        pp=2,
        dp=1,
        microbatch_size=1,
        schedule="interleaved",
        virtual_stages=2,
        layer_partition=[2, 1, 1, 2],
    ).solve(problem)
    r = evaluate(problem, plan)
    model = problem.model
    cost = [model.layer_cost(ref, Shard(mbs=1), cluster.device) for ref in model.chain]
    chunks = [[0, 1], [2], [3], [4, 5]]
    p2p = P * spec.seq_len * 1 * spec.hidden / 100e9 + 1e-6
    f = [sum(cost[i].fwd_s for i in c) + (p2p if k < 3 else 0.0) for k, c in enumerate(chunks)]
    b = [sum(cost[i].bwd_s for i in c) + (p2p if k > 0 else 0.0) for k, c in enumerate(chunks)]
    assert [st.fwd_s for st in r.stages] == [approx(x) for x in f]
    assert [st.bwd_s for st in r.stages] == [approx(x) for x in b]
    t = [f[0] + b[0] + f[2] + b[2], f[1] + b[1] + f[3] + b[3]]
    m, v = 4, 2
    assert r.pipeline_time_s == approx(m * max(t) + (sum(t) - max(t)) / v)
    assert r.bubble_s == approx((sum(t) - max(t)) / v)
    stored = [
        sum(cost[i].act_bytes[Recompute.NONE] for c in chunks[r_::2] for i in c) for r_ in (0, 1)
    ]
    assert [rk.memory.in_flight_microbatches for rk in r.ranks] == [2.5, 1.5]
    assert r.ranks[0].memory.activations_bytes == approx(2.5 * stored[0])
    assert r.ranks[1].memory.activations_bytes == approx(1.5 * stored[1])


# ---------------------------------------------------------------- activations per mode


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_activations_and_recompute_buffer_per_mode(mode):
    """pp=2, 1F1B, m=4: rank 0 [emb + block 0] holds ``min(2, 4) = 2`` microbatches, rank 1
    [block 1 + head] one. A block stores Korthikanti et al.'s Table 2 bytes for its mode; while
    a recomputed block runs its backward its full activations are alive again, a transient
    ``sbh (34 + 5as/h) - stored``; the head's transient is its bf16 logits ``2 s b V``."""
    spec = make_spec(layers=2)
    problem = make_problem(spec, make_cluster(fanouts=(2,)), global_batch=8)
    plan = FixedPlanner(
        pp=2, dp=1, microbatch_size=2, recompute=mode, layer_partition=[2, 2]
    ).solve(problem)
    r = evaluate(problem, plan)
    rec = Recompute(mode)
    s, b, h, v = spec.seq_len, 2, spec.hidden, padded(spec.vocab, 1)
    block = korthikanti_block_bytes(spec, b, rec)
    buffer = korthikanti_block_bytes(spec, b, Recompute.NONE) - block
    head = 4 * s * b * h + 4 * s * b * v
    m0, m1 = r.ranks[0].memory, r.ranks[1].memory
    assert (m0.in_flight_microbatches, m1.in_flight_microbatches) == (2, 1)
    assert m0.activations_bytes == approx(2 * (s * b * h + block))
    assert m1.activations_bytes == approx(block + head)
    assert m0.transient_bytes == approx(buffer)
    assert m1.transient_bytes == approx(max(buffer, P * s * b * v))


def test_flash_attention_and_gqa_adjust_the_inventory():
    """The adjustments layers.py documents to Korthikanti et al.'s ``sbh (34 + 5as/h)``:
    grouped-query attention stores K and V ``g d`` wide instead of ``h`` (``2 x 2 sbh (1 - g/a)``
    fewer bytes), and FlashAttention keeps no ``a s^2 b`` scores, only the fp32 log-sum-exp
    ``4 a s b`` bytes (Dao et al. 2022). Here ``a = 8``, ``g = 2``: ``sbh (34 - 3) + 4 a s b``."""
    spec = make_spec(layers=1, kv_heads=2)
    problem = make_problem(spec, make_cluster(fanouts=(2,)), flash=True, global_batch=2)
    plan = FixedPlanner(pp=1, dp=1, microbatch_size=1).solve(problem)
    r = evaluate(problem, plan)
    s, b, h, a, g = spec.seq_len, 1, spec.hidden, spec.heads, 2
    block = s * b * h * (34 - 4 * (1 - g / a)) + 4 * a * s * b
    emb, head = s * b * h, 4 * s * b * h + 4 * s * b * padded(spec.vocab, 1)
    assert r.ranks[0].memory.activations_bytes == approx(emb + block + head)


# ---------------------------------------------------------------- stage boundaries


@pytest.mark.parametrize("sp", [True, False])
def test_stage_boundary_p2p(sp):
    """tp=2, pp=2, dp=1 on two 2-device nodes (order tp,cp,dp,pp): rank 0 on {0, 1}, rank 1 on
    {2, 3}; each pair (0, 2), (1, 3) crosses level 1, whose path runs at min(B0, B1) = 10 GB/s:
    ``S / B1 + a1``. Each device sends its sequence-parallel shard ``2 s b h / t`` of the block
    output, or the full ``2 s b h`` without SP (Megatron-Core); the gradient comes back the
    same way."""
    spec = make_spec(layers=2)
    cluster = make_cluster(fanouts=(2, 2), bws_gbps=(100, 10), lat_us=(1, 10))
    problem = make_problem(spec, cluster, global_batch=8, sequence_parallel=sp)
    plan = FixedPlanner(tp=2, pp=2, dp=1, microbatch_size=2, layer_partition=[2, 2]).solve(problem)
    assert plan.stages[0].device_ids == (0, 1) and plan.stages[1].device_ids == (2, 3)
    r = evaluate(problem, plan)
    n_bytes = P * spec.seq_len * 2 * spec.hidden / (2 if sp else 1)
    p2p = n_bytes / 10e9 + 10e-6
    assert r.stages[0].p2p_fwd_s == approx(p2p) and r.stages[1].p2p_bwd_s == approx(p2p)
    assert r.stages[0].p2p_bwd_s == 0.0 and r.stages[1].p2p_fwd_s == 0.0


# ---------------------------------------------------------------- TP, CP and EP overlap

SLOWDOWN = 16 / (132 - 16)
"""A communication kernel overlapped with compute takes 16 SMs (Megatron-Bridge performance
guide, "TP communication overlap": "The default SM count for communication is 16"): on a
132-SM device the compute under it runs 132/116 as long while they overlap."""


def exposed(t: float, hidden_by: float, least: float = 0.0) -> float:
    """What a collective of ``t`` seconds overlapped with ``hidden_by`` seconds of compute adds
    to its stage (:class:`nest.core.layers.Collective`): ``max(t - hidden_by, least t)`` plus the
    compute's slowdown over the overlapped time."""
    return max(t - hidden_by, least * t) + SLOWDOWN * min(t, hidden_by)


def _overlap_problem(spec, fanouts, *, global_batch, bw_gbps=50, **flags):
    device = make_device(sm_count=132)  # flat compute model; the SM count sets the slowdown
    cluster = make_cluster(fanouts=fanouts, bws_gbps=(bw_gbps,), lat_us=(1,), device=device)
    return make_problem(spec, cluster, global_batch=global_batch, microbatch_sizes=(1,), **flags)


@pytest.mark.parametrize("overlap", [False, True])
def test_tp_comm_overlap_by_hand(overlap):
    """tp=2 with sequence parallelism, one GPT block (h=1024, F=4096, s=512, b=1) on one
    50 GB/s, 1 us link; every all-gather and reduce-scatter of the ``2 s b h`` activation costs
    ``T = (1/2) 2 s b h / B0 + a0``. Megatron-Core's ``--tp-comm-overlap`` (NeMo and
    Megatron-Bridge performance guides): the forward all-gathers run under the QKV and FC1 GEMMs
    that consume them, the reduce-scatters pipelined with the projection and FC2 GEMMs in 4
    chunks of which the last stays exposed (``least = 1/4``); in the backward the all-gathers
    under the data-gradient GEMMs of the projection and FC2, the reduce-scatters under the
    weight-gradient GEMMs of QKV and FC1 (each half of a GEMM's backward, the forward's time in
    the flat model: ``2 m n k`` FLOPs at 100 TFLOP/s). The embedding's reduce-scatter and
    all-gather, the head's all-gather and reduce-scatter and its three fp32 all-reduces of the
    cross entropy (``4 s b`` bytes each) are not overlapped."""
    spec = make_spec(layers=1, hidden=1024, heads=8, ffn_hidden=4096, seq_len=512)
    problem = _overlap_problem(spec, (2,), global_batch=1, tp_comm_overlap=overlap)
    r = evaluate(problem, FixedPlanner(tp=2, dp=1, microbatch_size=1).solve(problem))
    s, b, h, f, t = 512, 1, 1024, 4096, 2
    tokens = s * b  # the GEMMs run on the gathered sequence
    gemm = {
        "qkv": 2 * tokens * (3 * h / t) * h / FLOPS,
        "proj": 2 * tokens * h * (h / t) / FLOPS,
        "fc1": 2 * tokens * (f / t) * h / FLOPS,
        "fc2": 2 * tokens * h * (f / t) / FLOPS,
    }
    T = 0.5 * P * s * b * h / 50e9 + 1e-6
    xent = 2 * (0.5 * 4 * s * b / 50e9 + 1e-6)  # all-reduce of 4 s b bytes
    plain = 4 * T + 3 * xent  # embedding RS + AG, head AG + RS, cross-entropy all-reduces
    assert r.stages[0].tp_comm_s == approx(plain + 8 * T)
    if overlap:
        block = (
            exposed(T, gemm["qkv"])  # forward
            + exposed(T, gemm["proj"], 1 / 4)
            + exposed(T, gemm["fc1"])
            + exposed(T, gemm["fc2"], 1 / 4)
            + exposed(T, gemm["proj"])  # backward
            + exposed(T, gemm["qkv"])
            + exposed(T, gemm["fc2"])
            + exposed(T, gemm["fc1"])
        )
        assert gemm["proj"] < T < gemm["qkv"]  # partly and wholly hidden both occur
    else:
        block = 8 * T
    assert r.stages[0].tp_exposed_s == approx(plain + block)
    s0 = r.stages[0]
    assert s0.fwd_s + s0.bwd_s == approx(
        s0.compute_fwd_s + s0.compute_bwd_s + s0.recompute_s + plain + block
    )


@pytest.mark.parametrize("overlap", [False, True])
def test_cp_ring_overlap_by_hand(overlap):
    """cp=2, one block (h=1024, s=512, b=1, no FlashAttention) on one 50 GB/s, 1 us link. The
    K/V exchange moves ``2 s b 2 h`` bytes (K and V of the whole sequence): an all-gather in the
    forward, an all-gather and a reduce-scatter in the backward, each ``T = (1/2) S/B0 + a0``.
    The ring (TE ``cp_comm_type=p2p``) runs each step's transfer under the attention of the block
    already held: ``(c-1)/c`` of the attention core's ``4 (s/c) s h b`` FLOPs hide each one."""
    spec = make_spec(layers=1, hidden=1024, heads=8, ffn_hidden=4096, seq_len=512)
    problem = _overlap_problem(spec, (2,), global_batch=1, cp_comm_overlap=overlap)
    r = evaluate(problem, FixedPlanner(cp=2, dp=1, microbatch_size=1).solve(problem))
    s, b, h, c = 512, 1, 1024, 2
    T = 0.5 * P * s * b * 2 * h / 50e9 + 1e-6
    attention = 4 * (s / c) * s * h * b / FLOPS
    hidden = (c - 1) / c * attention if overlap else 0.0
    assert r.stages[0].cp_comm_s == approx(3 * T)
    want = 3 * exposed(T, hidden) if overlap else 3 * T
    assert r.stages[0].cp_exposed_s == approx(want)


@pytest.mark.parametrize("overlap", [False, True])
def test_ep_overlap_by_hand(overlap):
    """A MoE block (4 experts, top-2, h=1024, s=512, b=1), ep=2 over dp=2 on one 25 GB/s link.
    Dispatch and combine are all-to-alls of the ``top_k`` token copies, ``2 s b k h`` bytes sent
    per device, half to the other member: ``T = (1/2) S / B0 + a0``, two in the forward and two
    in the backward. ``--overlap-moe-expert-parallel-comm`` runs each under half of another
    microbatch's attention: forward ``(QKV + projection + core)/2``, backward twice that
    (FLOPs ``2 s 3h h``, ``2 s h h``, ``4 s^2 h`` at 100 TFLOP/s). The link is slow enough that
    the forward's all-to-alls stick out of their half and the backward's hide. Balanced routing
    (dropless routing's larger share for the most loaded rank: tests/test_moe_realism.py)."""
    spec = make_spec(
        layers=1, hidden=1024, heads=8, ffn_hidden=4096, seq_len=512, num_experts=4, top_k=2
    )
    problem = _overlap_problem(
        spec, (2,), global_batch=2, bw_gbps=25, ep_comm_overlap=overlap, moe_routing="balanced"
    )
    r = evaluate(problem, FixedPlanner(dp=2, ep=2, microbatch_size=1).solve(problem))
    s, b, h, k = 512, 1, 1024, 2
    T = 0.5 * P * s * b * k * h / 25e9 + 1e-6
    attention_fwd = (2 * s * 3 * h * h + 2 * s * h * h + 4 * s * s * h * b) / FLOPS
    assert attention_fwd / 2 < T < attention_fwd
    assert r.stages[0].ep_comm_s == approx(4 * T)
    want = 4 * T
    if overlap:
        want = 2 * exposed(T, attention_fwd / 2) + 2 * exposed(T, attention_fwd)
    assert r.stages[0].ep_exposed_s == approx(want)


@pytest.mark.parametrize("mode", [Recompute.SELECTIVE, Recompute.FULL])
def test_recompute_buffer_adds_to_the_layers_own_transient(mode):
    """A block recomputed in ``mode`` holds, while it runs, its own short-lived buffer plus the
    activations recomputation rebuilds beyond what it stored, ``act[none] - act[mode]``
    (the form ``nest/cost/memory.py`` documents: recomputation rebuilds the layer's activations
    for its backward, Korthikanti et al. 2022); ZeRO-3 adds the layer's gathered weights,
    ``2 Psi (1 - 1/N)``. A non-block layer is never recomputed: only its transient (and the
    gathered weights) count."""
    act = {Recompute.NONE: 1000.0, Recompute.SELECTIVE: 600.0, Recompute.FULL: 100.0}
    cost = LayerCost(dense_params=1e3, act_bytes=act, transient_bytes=250.0)
    for zero, n in ((0, 4), (3, 4)):
        state = ModelState(
            zero_stage=zero,
            dense_replicas=n,
            expert_replicas=n,
            param_bytes=P,
            grad_bytes=G,
            optimizer_bytes_per_param=ADAM,
        )
        gathered = P * 1e3 * (1 - 1 / n) if zero == 3 else 0.0
        assert peak_bytes(cost, mode, True, state) == approx(250.0 + 1000.0 - act[mode] + gathered)
        assert peak_bytes(cost, mode, False, state) == approx(250.0 + gathered)


def test_fsdp_prefetch_overlap_worked_example():
    """The overlap formula of :mod:`nest.cost.fsdp` (FSDP2 forward/backward prefetch, Zhao et
    al., VLDB 2023, §3.3) on three layers worked by hand: gathers ``g = (3, 2, 5)``, reduce-
    scatters ``s = (4, 1, 2)``, forward compute ``f = (1, 4, 2)``, backward ``b = (2, 8, 4)``.
    Forward: ``g_0 + max(0, g_1 - f_0) + max(0, g_2 - f_1) = 3 + 1 + 1 = 5``. Backward with
    resharding: ``gb_2 + s_0 = 5 + 4`` exposed, layer 2 hides ``gb_1 = 2`` (``max(0, 2 - 4) =
    0``), layer 1 hides ``gb_0 + s_2 = 5`` (``max(0, 5 - 8) = 0``), layer 0 hides ``s_1 = 1``
    (``max(0, 1 - 2) = 0``): 9. Without resharding no backward gathers: ``s_0 = 4``, layer 1
    hides ``s_2 = 2`` and layer 0 ``s_1``: 4."""
    args = ((3, 2, 5), (4, 1, 2), (1, 4, 2), (2, 8, 4))
    on = OverlapChain.build(*args, reshard_after_forward=True)
    off = OverlapChain.build(*args, reshard_after_forward=False)
    assert on.fwd_s(0, 2) == 5 and off.fwd_s(0, 2) == 5
    assert on.bwd_s(0, 2) == 9
    assert off.bwd_s(0, 2) == 4
    assert on.total_s(0, 2) == 10 + 7 + 10 and off.total_s(0, 2) == 10 + 7
    # a one-layer stage hides nothing; the middle layer alone: g_1 + gb_1 + s_1
    assert on.fwd_s(1, 1) + on.bwd_s(1, 1) == 2 + 2 + 1
    # a short middle backward (b_1 = 0.5) leaves gb_0 + s_2 - b_1 = 3 + 2 - 0.5 exposed
    slow = OverlapChain.build(*args[:3], (2, 0.5, 4), reshard_after_forward=True)
    assert slow.bwd_s(0, 2) == 9 + 4.5
    # DeepSpeed's prefetch bucket: only q = (1, 0.5, 0.5) of each gather can run ahead, so
    # u = (0, 1, 2.5) waits in the open: forward 3 + max(1, 2 - 1) + max(2.5, 5 - 4) = 6.5;
    # backward 9 + layer 2 max(ub_1 = 1, 2 - 4) + layer 1 max(ub_0 = 0, 5 - 8) = 10
    bucket = OverlapChain.build(*args, reshard_after_forward=True, prefetch_share=(1, 0.5, 0.5))
    assert bucket.fwd_s(0, 2) == 6.5 and bucket.bwd_s(0, 2) == 10


@given(
    st.lists(st.tuples(*[st.floats(0, 10, allow_nan=False)] * 4), min_size=1, max_size=8),
    st.booleans(),
    st.data(),
)
def test_fsdp_exposed_is_between_zero_and_unoverlapped(layers, reshard, data):
    """Each hiding term of :mod:`nest.cost.fsdp` is at most the communication it hides:
    ``0 <= exposed <= all gathers and scatters`` on every interval, the rows (the DP's form)
    equal the scalars (the evaluator's), and compute never adds exposed time."""
    g, s, f, b = (np.array(col) for col in zip(*layers, strict=True))
    share = data.draw(st.sampled_from([1.0, 0.0, 0.3]))
    chain = OverlapChain.build(g, s, f, b, reshard_after_forward=reshard, prefetch_share=share)
    n = len(g)
    i = data.draw(st.integers(0, n - 1))
    js = np.arange(i, n)
    rows = chain.fwd_s(i, js) + chain.bwd_s(i, js)
    for j in js:
        exposed = chain.fwd_s(i, j) + chain.bwd_s(i, j)
        assert abs(exposed - rows[j - i]) <= 1e-12
        assert -1e-12 <= exposed <= chain.total_s(i, j) + 1e-12
    idle = OverlapChain.build(
        g, s, 0 * f, 0 * b, reshard_after_forward=reshard, prefetch_share=share
    )
    assert chain.fwd_s(i, n - 1) + chain.bwd_s(i, n - 1) <= (
        idle.fwd_s(i, n - 1) + idle.bwd_s(i, n - 1) + 1e-12
    )
    idle_s = idle.fwd_s(i, n - 1) + idle.bwd_s(i, n - 1)
    assert abs(idle_s - chain.total_s(i, n - 1)) <= 1e-12


def test_zero3_without_reshard_after_forward_keeps_the_gathered_weights():
    """FSDP2 ``reshard_after_forward=False`` (PyTorch ``fully_shard`` docs): the weights gathered
    in the forward stay until the backward, so the backward gathers nothing (the traffic is one
    gather and one reduce-scatter per unit, ``2 Psi`` bytes instead of ``3 Psi``) and the stage's
    whole weights are in memory: ``2 Psi (1 - 1/N_d)`` more weight bytes, none gathered as a
    transient (the :func:`_zero_case` problem, ``Psi = 667,136``, ``N_d = 4``)."""
    spec, problem, plan, on = _zero_case(3)
    training = dataclasses.replace(problem.training, reshard_after_forward=False)
    kept = dataclasses.replace(problem, training=training)
    off = evaluate(kept, plan)
    counts = gpt_params(spec, padded(spec.vocab, 1))
    units = [counts["embedding"], counts["block"], counts["block"], counts["head"]]
    assert off.stages[0].zero3_comm_s == approx(sum(_rs_2x2(P * u) + _rs_2x2(G * u) for u in units))
    psi = _psi(spec)
    gained = off.ranks[0].memory.weights_bytes - on.ranks[0].memory.weights_bytes
    assert gained == approx(P * psi * 3 / 4)
    logits = P * spec.seq_len * padded(spec.vocab, 1)
    assert off.ranks[0].memory.transient_bytes == approx(logits)
    assert off.stages[0].bwd_s < on.stages[0].bwd_s
    assert off.stages[0].fwd_s == approx(on.stages[0].fwd_s)
