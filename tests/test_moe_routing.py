"""MoE realism: the router and token-permutation kernels, and dropless routing's wait for the most
loaded expert rank (:mod:`nest.core.layers`), checked against their stated formulas and against
Megatron-MoE-ModelZoo's forced-balance vs dropless measurements."""

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from nest.app import validate
from nest.core.axes import CollectiveOp
from nest.core.errors import UserError
from nest.core.layers import (
    DROPLESS_LOAD_FACTOR,
    ROUTER_BYTES_PER_LOGIT,
    AnalyticModel,
    Shard,
)
from nest.core.model import ModelSpec
from nest.core.problem import Training
from nest.cost import evaluate

from .conftest import make_device

CASES = Path(__file__).parents[1] / "experiments" / "validation" / "cases.csv"

MOE = ModelSpec(
    name="moe",
    hidden=256,
    layers=2,
    heads=8,
    ffn_hidden=512,
    vocab=512,
    seq_len=128,
    num_experts=8,
    top_k=2,
    activation="swiglu",
    norm="rmsnorm",
    bias=False,
    position="rope",
    dropout=False,
)


def block(routing: str, shard: Shard, spec: ModelSpec = MOE):
    model = AnalyticModel(spec, flash_attention=True, moe_routing=routing)
    ref = model.chain[1]
    return model, ref, model.layer_cost(ref, shard, make_device())


def test_router_and_permutations_are_memory_bound_kernels_of_the_stated_bytes():
    """Megatron-Core's MoE layer on one device (``moe/router.py``, ``moe/moe_utils.py``
    ``permute``/``unpermute``, ``MoEAlltoAllTokenDispatcher.sort_chunks_by_idxs``), on a flat
    device (every FLOP at peak, no kernel overhead): the router GEMM ``2 T h E`` FLOPs, its
    softmax and top-k ``12 T E`` bytes, permute and unpermute ``2 (1 + k) T h p`` bytes (read the
    tokens, write their ``k`` copies; and back), and with
    ``ep = 2`` (4 local experts) the two regroupings of the ``T k`` received copies,
    ``2 x 2 T k h p`` more. The backward moves the same bytes and runs the router's two gradient
    GEMMs."""
    dev = make_device()
    T, h, E, k, p = MOE.seq_len, MOE.hidden, MOE.num_experts, MOE.top_k, 2
    router_s = 2 * T * h * E / dev.achieved_flops_per_s
    perm_bytes = ROUTER_BYTES_PER_LOGIT * T * E + 2 * (1 + k) * T * h * p
    for ep, extra in ((1, 0), (2, 2 * 2 * T * k * h * p)):
        model, ref, _ = block("balanced", Shard(ep=ep))
        fwd, bwd = model._moe_kernels_s(ref, Shard(ep=ep), dev)
        stream = (perm_bytes + extra) / dev.hbm_bw_bytes_per_s
        assert fwd == pytest.approx(router_s + stream, rel=1e-12)
        assert bwd == pytest.approx(2 * router_s + stream, rel=1e-12)


def test_the_moe_kernels_are_part_of_the_block_time_and_not_of_a_dense_block():
    """The block's forward time is its GEMMs, attention and elementwise work plus
    :meth:`AnalyticModel._moe_kernels_s`: a MoE block with the same active FFN width as a dense
    one costs at least the kernels more; a dense block has none."""
    dev = make_device()
    model, ref, cost = block("balanced", Shard())
    fwd, _ = model._moe_kernels_s(ref, Shard(), dev)
    assert fwd > 0
    dense = replace(MOE, num_experts=1, top_k=1, ffn_hidden=MOE.ffn_hidden * MOE.top_k)
    _, _, dense_cost = block("balanced", Shard(), dense)
    assert cost.fwd_s >= dense_cost.fwd_s + fwd * (1 - 1e-9)


def test_dropless_routing_waits_for_the_most_loaded_rank_only_with_expert_parallelism():
    """With ``ep = 1`` every rank runs every expert on its own tokens, so dropless and balanced
    routing cost the same; with ``ep > 1`` the most loaded rank receives
    ``DROPLESS_LOAD_FACTOR`` times the balanced all-to-all bytes and runs longer expert GEMMs."""
    assert DROPLESS_LOAD_FACTOR > 1
    _, _, bal = block("balanced", Shard(ep=1))
    _, _, drop = block("dropless", Shard(ep=1))
    assert drop == bal
    _, _, bal = block("balanced", Shard(ep=4))
    _, _, drop = block("dropless", Shard(ep=4))
    a2a = [c.n_bytes for c in bal.fwd_collectives if c.op is CollectiveOp.ALL_TO_ALL]
    a2a_drop = [c.n_bytes for c in drop.fwd_collectives if c.op is CollectiveOp.ALL_TO_ALL]
    assert a2a and a2a_drop == pytest.approx([DROPLESS_LOAD_FACTOR * b for b in a2a], rel=1e-12)
    assert drop.fwd_s > bal.fwd_s and drop.bwd_s > bal.bwd_s
    assert drop.fwd_flops == bal.fwd_flops  # the same useful work, waited for longer
    dense = replace(MOE, num_experts=1, top_k=1)
    assert block("dropless", Shard(), dense)[2] == block("balanced", Shard(), dense)[2]


def test_an_unknown_routing_is_a_one_line_error_naming_the_choices():
    with pytest.raises(UserError) as err:
        Training(global_batch=8, moe_routing="greedy")
    assert "training.moe_routing='greedy'" in str(err.value)
    assert "dropless" in str(err.value) and "\n" not in str(err.value)


# Megatron-MoE-ModelZoo, best_practice/qwen3/readme.md, "Long Context" (commit e8650517):
# Qwen3-235B-A22B on 32 nodes of 8 H100, TP4 PP8 VP4 EP8, DeepEP, BF16, GBS 256, selective
# recompute; TFLOP/s per GPU with forced balance / dropless routing.
LONG_CONTEXT = {  # seq: (cp, forced-balance TFLOP/s, dropless TFLOP/s)
    16384: (1, 295, 237),
    32768: (2, 335, 277),
    65536: (4, 368, 320),
    131072: (8, 389, 357),
}
CALIBRATION_SEQ = 16384
"""The pair DROPLESS_LOAD_FACTOR is calibrated on; the other three are held out."""


def _long_context_step_s(seq: int, routing: str) -> float:
    rows = list(csv.DictReader(CASES.open()))
    base = next(
        r
        for r in rows
        if r["source"] == "MoEZoo_Qwen3_235B_H100_BF16" and "TP4 PP8 VP4 EP8" in r["case"]
    )
    cp = LONG_CONTEXT[seq][0]
    row = dict(
        base,
        seq=str(seq),
        cp=str(cp),
        dp=str(256 // (4 * 8 * cp)),
        global_batch_seqs="256",
        recompute="selective",
        etp="",  # scored with tp-sharded experts (nest's etp = tp)
        moe_routing=routing,
    )
    problem, plan = validate.problem_and_plan(row)
    return evaluate(problem, plan).iteration_time_s


@pytest.mark.parametrize("seq", sorted(LONG_CONTEXT))
def test_dropless_gap_within_five_points_of_the_measured_one(seq):
    """The issue's target: the predicted dropless-vs-balanced throughput gap
    ``1 - t_balanced / t_dropless`` within 5 points of the measured ``1 - dropless / balanced``
    at each sequence length (16K: the calibration pair; 32K-128K held out)."""
    _, balanced, dropless = LONG_CONTEXT[seq]
    measured = 1 - dropless / balanced
    predicted = 1 - _long_context_step_s(seq, "balanced") / _long_context_step_s(seq, "dropless")
    assert abs(predicted - measured) <= (0.01 if seq == CALIBRATION_SEQ else 0.05)
