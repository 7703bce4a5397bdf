"""The ``op`` recompute mode: torchtitan's op-level selective activation checkpointing
(``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``): its inventory
from torchtitan's policy, its place between the other modes, the search's exactness with it,
and the exports."""

import random

import pytest

from baselines.fixed import FixedPlanner
from nest.core.axes import CollectiveOp, Recompute
from nest.core.blocks import op_sac_inventory, torchtitan_matmuls
from nest.core.layers import Shard
from nest.core.model import ModelSpec
from nest.export import export_plan
from nest.export.common import strongest_recompute

from .randomcase import nest_equals_brute_over_seeds
from .test_nest_dp import tiny_case
from .test_recompute_modes import LLAMA3_8B, _dense_problem, block_cost

TOKENS = 8192  # LLAMA3_8B's sequence, microbatch 1


@pytest.mark.parametrize("tp", [1, 2])
def test_llama3_8b_block_bytes_under_op_from_torchtitans_policy(tp):
    """torchtitan's policy at 9dec370 (``torchtitan/parallelisms/parallelize_llama.py``,
    ``_save_list``: ``aten.mm``, the SDPA kernels, ``reduce_scatter_tensor``, ``abs``, ``max``;
    every second mm recomputed) on the Llama block's seven mms ``wq wk wv wo w1 w3 w2``
    (``torchtitan/models/llama/model.py``): kept are the block's input (``h``), the outputs of
    ``wq`` (``a d``, column-parallel: over ``t``), ``wv`` (``g d``, over ``t``), ``w1`` (``F``,
    over ``t``) and ``w2`` (row-parallel: the full ``h``-wide partial sum on every tensor rank),
    the attention output (``a d`` over ``t``) and its fp32 log-sum-exp (``4 a`` bytes over
    ``t``); with sequence parallelism also the two reduce-scatters' outputs (``h`` over ``t``
    each) and the input split over ``t``. bf16, 8,192 tokens. At ``t = 1`` this is
    ``(2 h + 2 a d + g d + F) x 2 + 4 a`` bytes per token = 0.4854 GiB, against none's 1.0635:
    "about half" (issue 23)."""
    spec = ModelSpec(**LLAMA3_8B)
    cost = block_cost(spec, Shard(tp=tp, sp=tp > 1))
    p, h, f, q, kv, a = 2, 4096, 14336, 32 * 128, 8 * 128, 32
    per_token = p * (h / tp + q / tp + kv / tp + f / tp + h + q / tp) + 4 * a / tp
    if tp > 1:
        per_token += 2 * p * h / tp
    assert cost.act_bytes[Recompute.OP] == pytest.approx(per_token * TOKENS, rel=1e-12)
    if tp == 1:
        assert cost.act_bytes[Recompute.OP] / 2**30 == pytest.approx(0.4854, abs=1e-4)
        half = cost.act_bytes[Recompute.OP] / cost.act_bytes[Recompute.NONE]
        assert 0.4 < half < 0.5


def test_llama3_8b_op_recomputes_wk_wo_w3_and_the_elementwise_work():
    """The recomputed mms are the even ones, ``wk`` (``h -> g d``), ``wo`` (``a d -> h``) and
    ``w3`` (``h -> F``): ``2 (h g d + a d h + h F)`` FLOPs per token over ``t`` beyond none
    (FlashAttention's own score recomputation); the SDPA output is saved, so the attention core
    is not run again. With sequence parallelism the two all-gathers rerun, the reduce-scatters'
    outputs are saved; without it the two all-reduces rerun; alone on a device, nothing."""
    spec = ModelSpec(**LLAMA3_8B)
    assert [lin.name for lin in op_sac_inventory(spec, False)[1]] == ["wk", "wo", "w3"]
    h, f, q, kv = 4096, 14336, 32 * 128, 8 * 128
    for tp, sp, ops in [
        (1, False, []),
        (2, True, [CollectiveOp.ALL_GATHER, CollectiveOp.ALL_GATHER]),
        (2, False, [CollectiveOp.ALL_REDUCE, CollectiveOp.ALL_REDUCE]),
    ]:
        cost = block_cost(spec, Shard(tp=tp, sp=sp))
        rf = cost.recompute_flops
        extra = 2 * (h * kv + q * h + h * f) * TOKENS / tp
        assert rf[Recompute.OP] - rf[Recompute.NONE] == pytest.approx(extra, rel=1e-12)
        assert [c.op for c in cost.recompute_collectives[Recompute.OP]] == ops


def test_torchtitan_matmul_order_of_mla_and_moe_blocks():
    """DeepSeek-V3's attention (``torchtitan/models/deepseek_v3/model.py``: ``wq_a``, ``wq_b``,
    ``wkv_a``, ``wkv_b``, ``wo``) then a gated MLP (``w1``, ``w3``, ``w2``): the even ones are
    recomputed. A MoE block counts only its attention's and its shared experts' mms (the
    routed experts run ``torch._grouped_mm`` and the router's gate is force-recomputed,
    ``torchtitan/distributed/activation_checkpoint.py``); a GELU MLP has no ``w3``."""
    mla = dict(
        name="mla", hidden=256, layers=2, heads=4, ffn_hidden=512, vocab=512, seq_len=128,
        activation="swiglu", attention="mla", q_lora_rank=64, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    )  # fmt: skip
    spec = ModelSpec(**mla)
    names = [lin.name for lin in torchtitan_matmuls(spec, False)]
    assert names == ["wq_a", "wq_b", "wkv_a", "wkv_b", "wo", "w1", "w3", "w2"]
    assert [lin.name for lin in op_sac_inventory(spec, False)[1]] == ["wq_b", "wkv_b", "w1", "w2"]
    moe = ModelSpec(**{**mla, "num_experts": 4, "top_k": 2, "shared_experts": 1})
    assert [lin.name for lin in torchtitan_matmuls(moe, True)][-3:] == ["w1", "w3", "w2"]
    plain = ModelSpec(**{**LLAMA3_8B, "activation": "gelu"})
    assert [lin.name for lin in torchtitan_matmuls(plain, False)][-2:] == ["w1", "w2"]


def _random_spec(rng: random.Random) -> ModelSpec:
    heads = rng.choice([4, 8])
    base = dict(
        name="r", hidden=rng.choice([256, 512]), layers=2, heads=heads,
        kv_heads=rng.choice([1, 2, heads]), ffn_hidden=rng.choice([512, 1024, 2048]),
        vocab=512, seq_len=rng.choice([128, 256]), activation=rng.choice(["gelu", "swiglu"]),
        dropout=rng.random() < 0.3,
    )  # fmt: skip
    if rng.random() < 0.3:
        base.update(num_experts=4, top_k=2)
    return ModelSpec(**base)


@pytest.mark.parametrize("seed", range(12))
def test_op_lies_between_full_and_none(seed):
    """Property of the policy: op keeps a subset of what no recompute keeps plus mm outputs
    that none stores anyway as the next op's input, so it stores at least full's block input
    and at most none's activations; it recomputes part of the forward, so its backward
    costs more than none's and less than full's (with FlashAttention the attention kernel's
    output is saved; without it the core reruns, as in full)."""
    rng = random.Random(seed)
    spec = _random_spec(rng)
    tp = rng.choice([1, 2])
    shard = Shard(
        tp=tp, sp=tp > 1 and rng.random() < 0.7, ep=rng.choice([1, 2]) if spec.is_moe else 1
    )
    cost = block_cost(spec, shard, flash=rng.random() < 0.75)
    act, rs = cost.act_bytes, cost.recompute_s
    assert act[Recompute.FULL] < act[Recompute.OP] < act[Recompute.NONE], (spec, shard)
    assert rs[Recompute.NONE] < rs[Recompute.OP] < rs[Recompute.FULL], (spec, shard)


def test_nest_equals_brute_with_op_in_the_space():
    """``nest`` equals ``brute`` on random small problems searching none, op and full (the DP's
    fastest-fitting-mode rule needs op to differ from the others only in the backward, which
    ``test_modes_of_one_stage_differ_only_in_the_backward`` checks for every mode), and some
    optimal plans use op."""
    agreed, used = nest_equals_brute_over_seeds(tiny_case, ["none", "op", "full"])
    assert agreed >= 30, agreed
    assert Recompute.OP in used, used


def test_exports_of_op():
    """torchtitan runs op as ``[activation_checkpoint] mode = "selective"``,
    ``selective_ac_option = "op"`` without a warning; Megatron-Core has no per-op policy
    (``--recompute-modules`` names modules) and runs full instead, with a warning; op with
    any mode but none on another stage exports as full (no single mode recomputes both)."""
    problem = _dense_problem()

    def plan(modes):
        return FixedPlanner(tp=1, pp=2, dp=4, microbatch_size=1, recompute=modes).solve(problem)

    assert strongest_recompute(plan(["none", "op"])) is Recompute.OP
    assert strongest_recompute(plan(["op", "selective"])) is Recompute.FULL
    exp = export_plan(problem, plan("op"), "torchtitan")
    assert exp.exported_plan["recompute"] == ["op", "op"]
    assert 'mode = "selective"' in exp.text and 'selective_ac_option = "op"' in exp.text
    assert not any("used full" in w or "per-stage recompute" in w for w in exp.warnings)
    exp = export_plan(problem, plan("op"), "megatron")
    assert exp.exported_plan["recompute"] == ["full", "full"]
    assert any("recompute op" in w and "used full" in w for w in exp.warnings)
    assert "--recompute-granularity full" in exp.text


def test_llama3_8b_on_h100_takes_op_where_it_beats_mlp_and_full():
    """The issue's done-when with op in the space: Llama 3 8B data-parallel on one DGX H100
    node with ZeRO-0/1 (the layout of ``test_llama3_8b_on_h100_takes_mlp_where_memory_forces_
    recompute``) must recompute; op fits there and recomputes fewer FLOPs than mlp (three of
    seven mms against the MLP's three larger ones), so the best plan takes op and is faster than
    the best without it (mlp) and than the old three modes' (full)."""
    from nest.dp.planner import NestPlanner

    from .test_recompute_modes import llama3_8b_on_one_h100_node

    problem = llama3_8b_on_one_h100_node()
    space = dict(tp=[1], cp=[1], pp=[1], zero_stages=[0, 1])
    without = NestPlanner(**space).solve(problem)
    old = NestPlanner(**space, recompute=["none", "selective", "full"]).solve(problem)
    jax = (  # JAX's: their own tests
        Recompute.DOTS,
        Recompute.QKV_PROJ,
        Recompute.QKV_OUT_PROJ,
        Recompute.NOTHING_SAVEABLE,
    )
    modes = [r.value for r in Recompute if r not in jax]
    with_op = NestPlanner(**space, recompute=modes).solve(problem)
    assert {s.recompute for s in with_op.stages} == {Recompute.OP}
    assert with_op.objective_s < without.objective_s < old.objective_s
