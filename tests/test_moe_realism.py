"""MoE realism: the router and token-permutation kernels, dropless routing's wait for the most
loaded expert rank and expert tensor parallelism decoupled from the attention's (MoE parallel
folding) (:mod:`nest.core.layers`, :mod:`nest.core.plan`), checked against their stated formulas
and against Megatron-MoE-ModelZoo's forced-balance vs dropless measurements."""

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from nest.app import validate
from nest.core.axes import CollectiveOp, GroupKind
from nest.core.errors import UserError
from nest.core.layers import (
    DROPLESS_EXPERT_LOAD_CV,
    ROUTER_BYTES_PER_LOGIT,
    AnalyticModel,
    Shard,
    dropless_load_factor,
)
from nest.core.model import ModelSpec
from nest.core.plan import ParallelConfig, group_arrays
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
    ``dropless_load_factor(ep, E / ep)`` times the balanced all-to-all bytes and runs longer
    expert GEMMs."""
    factor = dropless_load_factor(4, MOE.num_experts // 4)
    assert factor > 1
    _, _, bal = block("balanced", Shard(ep=1))
    _, _, drop = block("dropless", Shard(ep=1))
    assert drop == bal
    _, _, bal = block("balanced", Shard(ep=4))
    _, _, drop = block("dropless", Shard(ep=4))
    a2a = [c.n_bytes for c in bal.fwd_collectives if c.op is CollectiveOp.ALL_TO_ALL]
    a2a_drop = [c.n_bytes for c in drop.fwd_collectives if c.op is CollectiveOp.ALL_TO_ALL]
    assert a2a and a2a_drop == pytest.approx([factor * b for b in a2a], rel=1e-12)
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
"""The pair DROPLESS_EXPERT_LOAD_CV is calibrated on; the other three are held out."""


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
        # DROPLESS_EXPERT_LOAD_CV was calibrated with the expert exchange priced as an all-to-all;
        # priced as DeepEP (the base row's dispatcher) the gaps read 16.8, 13.7, 10.0 and 6.5 %:
        # the held-out three within 5 points, the calibration pair 2.9 points under
        moe_dispatcher="alltoall",
        # the long-context runs' yaml (b0b92ff) sets --cross-entropy-loss-fusion; the base
        # 4K row's (8017e11) does not
        cross_entropy_loss_fusion="true",
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


def test_the_load_factor_is_one_without_expert_parallelism_and_grows_with_the_ranks():
    """Properties of the expected maximum of ``ep`` rank loads: exactly 1 at ``ep = 1`` or with no
    dispersion; non-decreasing in ``ep`` at a fixed number of local experts (the maximum of more
    draws); non-increasing in the local experts at a fixed ``ep`` (a rank averages more of
    them); so at a fixed expert count, more expert ranks (fewer local experts each) never wait
    less."""
    assert dropless_load_factor(1, 16) == 1.0
    assert dropless_load_factor(8, 16, cv=0.0) == 1.0
    for local in (1, 2, 4, 8, 16, 64, 96):
        factors = [dropless_load_factor(ep, local) for ep in (1, 2, 3, 4, 8, 16, 32, 64, 128)]
        assert all(a <= b for a, b in zip(factors[:-1], factors[1:], strict=True)), local
        assert factors[1] > 1
    for ep in (2, 4, 8, 64):
        factors = [dropless_load_factor(ep, local) for local in (1, 2, 4, 8, 16, 64, 96)]
        assert all(a >= b for a, b in zip(factors[:-1], factors[1:], strict=True)), ep
    for experts in (64, 128, 256, 384):
        eps = [ep for ep in (1, 2, 4, 8, 16, 32, 64) if experts % ep == 0]
        factors = [dropless_load_factor(ep, experts // ep) for ep in eps]
        assert all(a <= b for a, b in zip(factors[:-1], factors[1:], strict=True)), experts


def test_the_load_factor_reproduces_published_maxima_of_iid_draws():
    """Worked examples. Two draws: ``E[max(X1, X2)] = E[X] + E|X1 - X2| / 2`` and, for a lognormal
    of log-sd ``s``, ``E|X1 - X2| = 2 E[X] (2 Phi(s / sqrt 2) - 1)`` (the lognormal Gini
    coefficient ``2 Phi(s / sqrt 2) - 1``, Aitchison & Brown, The Lognormal Distribution, 1957),
    so ``E[max] = 2 Phi(s / sqrt 2)``. Small dispersion: ``X ~ 1 + CV Z``, so the factor tends to
    ``1 + CV e_n`` with ``e_n`` the expected maximum of ``n`` standard normals (Harter, Biometrika
    48, 1961, Table: e_2 = 0.56419, e_8 = 1.42360, e_64 = 2.34373)."""
    from math import erf, log, sqrt

    for cv in (0.3, 1.0, 2.0):
        s = sqrt(log(1 + cv * cv))
        exact = 1 + erf(s / 2)  # 2 Phi(s / sqrt 2)
        assert dropless_load_factor(2, 1, cv=cv) == pytest.approx(exact, rel=1e-9)
    for ep, e_n in ((2, 0.56419), (8, 1.42360), (64, 2.34373)):
        cv = 1e-4
        assert (dropless_load_factor(ep, 1, cv=cv) - 1) / cv == pytest.approx(e_n, rel=1e-3)


def test_the_calibrated_dispersion_gives_the_calibration_rows_factor_and_a_published_order():
    """At the calibration row's EP8 with 16 local experts (Qwen3-235B, 128 experts) the factor is
    the 1.4 that reproduces the 16K gap; from TensorRT-LLM's published DeepSeek-R1 expert-load CV
    (blog4 at commit 1d263f15, Table 1: EP32, 8 experts per rank, std 164.1 over mean 128 per
    expert, 491.6 over 1024 per rank, most loaded rank 1 + 1.564 times the mean) the model
    predicts the rank CV within 10 % and the most loaded rank within 15 % (both under)."""
    assert dropless_load_factor(8, 16) == pytest.approx(1.4, abs=0.005)
    assert 0.5 < DROPLESS_EXPERT_LOAD_CV < 2
    cv = 164.1 / 128
    assert cv / 8**0.5 == pytest.approx(491.6 / 1024, rel=0.10)
    assert dropless_load_factor(32, 8, cv=cv) == pytest.approx(2.564, rel=0.15)


def test_a_bad_load_factor_argument_is_a_one_line_error():
    with pytest.raises(ValueError) as err:
        dropless_load_factor(0, 4)
    assert "ep=0" in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------ expert tensor parallelism
def test_expert_mesh_folds_tensor_ranks_with_whole_experts():
    """Megatron-Core's MoE parallel folding on one rank's ``[dp][cp][tp]`` devices (tp innermost):
    with ``etp = 1`` the ``dp x cp x tp`` devices fold into ``edp x ep`` with ``ep`` consecutive
    devices per expert group; with ``etp = tp`` the expert groups are carved out of ``dp x cp``
    ranks of one tensor rank, as before folding existed."""
    devices = np.arange(2 * 1 * 4).reshape(2, 1, 4)  # dp 2, cp 1, tp 4
    folded = group_arrays(devices, ep=4, etp=1)
    assert folded[GroupKind.EP].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert folded[GroupKind.EXPERT_DP].tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert folded[GroupKind.TP].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]  # attention unchanged
    split = group_arrays(devices, ep=2)
    assert split[GroupKind.EP].tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert split[GroupKind.EXPERT_DP].tolist() == [[d] for d in range(8)]  # edp 1


@pytest.mark.parametrize("seed", range(20))
def test_every_device_holds_each_expert_shard_once_per_expert_group(seed):
    """Property of the folded mesh, for random shapes: the EP groups and the expert-DP groups each
    partition the rank's devices, an EP group and an expert-DP group meet in at most one device,
    and ``etp = tp`` (None) gives the same groups as ``etp`` set to ``tp``."""
    rng = np.random.default_rng(seed)
    dp, cp, tp = (int(rng.choice([1, 2, 4])) for _ in range(3))
    devices = rng.permutation(dp * cp * tp).reshape(dp, cp, tp)
    for etp in (1, tp):
        width = dp * cp * tp // etp
        for ep in [e for e in range(1, width + 1) if width % e == 0]:
            arrays = group_arrays(devices, ep, etp)
            for kind, size in ((GroupKind.EP, ep), (GroupKind.EXPERT_DP, width // ep)):
                groups = arrays[kind]
                assert groups.shape[1] == size
                assert sorted(groups.ravel().tolist()) == list(range(dp * cp * tp))
            for g in arrays[GroupKind.EP]:
                for h in arrays[GroupKind.EXPERT_DP]:
                    assert len(set(g) & set(h)) <= 1
            if etp == tp:
                none = group_arrays(devices, ep, None) if width % ep == 0 else None
                for kind in arrays:
                    assert (none[kind] == arrays[kind]).all()


def test_whole_experts_take_the_sequence_shard_and_keep_every_weight():
    """tp = 4 with sequence parallelism, ep = 2 (8 experts, top-2): with experts split like the
    dense weights each device holds ``1/(4 x 2)`` of the expert weights and runs the expert
    GEMMs on the gathered ``s`` tokens at a quarter of the width; with whole experts (etp 1) it
    holds ``1/2`` of them and runs full-width GEMMs on its ``s/4`` tokens (the same FLOPs, the
    same all-to-all bytes: each device dispatches its own sequence shard), and no tensor-parallel
    all-gather / reduce-scatter is issued around the experts."""
    dev = make_device()
    spec = replace(MOE, num_experts=8)
    model = AnalyticModel(spec, flash_attention=True, moe_routing="balanced")
    ref = model.chain[1]
    split = Shard(tp=4, ep=2, sp=True)
    whole = Shard(tp=4, ep=2, sp=True, etp=1)
    a, b = model.layer_cost(ref, split, dev), model.layer_cost(ref, whole, dev)
    assert b.expert_params == pytest.approx(4 * a.expert_params)
    assert a.dense_params == b.dense_params and a.fwd_flops == b.fwd_flops
    ga, gb = model._block_gemms(ref, split)["efc1"], model._block_gemms(ref, whole)["efc1"]
    assert gb[0] == pytest.approx(ga[0] / 4) and gb[1] == pytest.approx(4 * ga[1])
    assert ga[2:] == gb[2:]

    def count(cost, axis, op=None):
        return [c.n_bytes for c in cost.fwd_collectives if c.axis == axis and op in (None, c.op)]

    assert count(a, GroupKind.EP) == count(b, GroupKind.EP)
    assert len(count(a, GroupKind.TP)) == 4 and len(count(b, GroupKind.TP)) == 2  # attention's
    assert Shard(tp=4, etp=4) == Shard(tp=4)  # etp = tp is stored as None


def test_expert_replicas_grow_by_the_fold():
    """``edp = dp x cp x (tp / etp) / ep`` (Megatron-Core's expert data parallelism): tp 4, dp 2,
    ep 8 folds into one expert replica with whole experts; a plan with ep 8 and experts split
    over tp needs dp x cp >= 8 and is refused in one line."""
    config = ParallelConfig(tp=4, dp=2, ep=8, etp=1)
    assert (config.expert_fold, config.expert_dp) == (4, 1)
    assert ParallelConfig(tp=4, dp=8, ep=2).expert_dp == 4
    assert ParallelConfig(tp=4, dp=8, ep=2, etp=4).etp is None
    with pytest.raises(UserError, match="etp=2 with tp=4"):
        ParallelConfig(tp=4, dp=2, ep=8, etp=2)


def test_validation_rows_with_whole_experts_are_scored_not_refused():
    """The MoE rows whose experts ran with etp 1 under tp 2 or 4 (Megatron-MoE-ModelZoo's five
    Qwen3-235B layouts and its four long-context TP4 runs, DeepSeek-V3 on 512 and 1024 H100,
    Megatron-Bridge's Qwen3-235B) are
    predicted as folded plans; an etp that is neither 1 nor tp is still refused in one line."""
    rows = [r for r in csv.DictReader(CASES.open()) if (r.get("etp") or "").strip()]
    folded = [r for r in rows if r["etp"] != r["tp"]]
    assert len(folded) == 12
    for row in folded:
        outcome = validate.predict(row)
        assert outcome.predicted is not None, outcome.note
        _, plan = validate.problem_and_plan(row)
        assert plan.etp == 1
    bad = dict(folded[0], tp="4", etp="2")
    outcome = validate.predict(bad)
    assert outcome.predicted is None and "etp=2 with tp=4" in outcome.note
    assert "\n" not in outcome.note
