"""The whole-MLP recompute modes: ``mlp_moe`` (Megatron-Core's ``--recompute-modules mlp moe``)
and ``mla_up_proj_mlp_moe`` (``mla_up_proj mlp moe``, dgxc-benchmarking's DeepSeek-V3 on H100).

Megatron-LM@84cf979c766f72dfdc7af73d6b4add5ae952c2da: ``transformer_layer.py`` checkpoints a
dense MLP whole under ``mlp`` (``tensor_parallel.checkpoint(self.mlp, False, pre_mlp_norm_out)``)
and ``moe/moe_layer.py`` ``MoELayer.forward`` checkpoints ``custom_forward`` (router and
preprocess, dispatch, experts, combine) under ``moe``: normal checkpointing, which keeps the
input and reruns the whole forward, collectives included, before the backward."""

import pytest

from baselines.fixed import FixedPlanner
from nest.core.axes import CollectiveOp, GroupKind, Recompute
from nest.core.layers import Shard
from nest.core.model import ModelSpec
from nest.export import export_plan

from .randomcase import nest_equals_brute_over_seeds
from .test_model_shapes import DSV3
from .test_nest_dp import tiny_case
from .test_recompute_modes import LLAMA3_8B, _dense_problem, block_cost

MOE = dict(
    name="moe",
    hidden=256,
    layers=2,
    heads=4,
    ffn_hidden=512,
    vocab=512,
    seq_len=128,
    activation="swiglu",
    num_experts=4,
    top_k=2,
    moe_ffn_hidden=384,
    shared_experts=1,
    dropout=False,
)
"""A small SwiGLU MoE block: 4 experts of width 384, top-2, one shared expert of width 384."""


def test_moe_block_keeps_nothing_of_the_moe_layer():
    """``moe`` checkpoints the whole MoE layer, so a block keeps only the layer's input (the
    pre-MLP norm's output, kept by every mode): each routed copy (``h``), its FC1 output
    (``2 F_e``, SwiGLU) and FC2 input (``F_e``), ``top_k`` copies; the shared expert's FC1
    output and FC2 input (``3 F_s``); and the router's fp32 logits (``4 E`` bytes) are not
    stored. bf16, 128 tokens, ``ep = 2``, ``tp = 1``."""
    spec = ModelSpec(**MOE)
    cost = block_cost(spec, Shard(ep=2))
    h, fe, fs, k, tokens = 256, 384, 384, 2, 128
    dropped = 2 * tokens * (k * (h + 3 * fe) + 3 * fs) + 4 * tokens * 4
    act = cost.act_bytes
    assert act[Recompute.NONE] - act[Recompute.MLP_MOE] == pytest.approx(dropped, rel=1e-12)
    assert act[Recompute.MLP_MOE] < act[Recompute.MLP] < act[Recompute.NONE]


def test_moe_block_reruns_the_moe_layers_gemms_and_its_dispatch_and_combine():
    """The rerun: the routed experts' GEMMs on the ``tokens x top_k`` copies this rank's
    experts receive (balanced routing: the ``ep`` ranks each send their own tokens' copies, and
    each receives as many as it sends) and the shared expert's on every token, ``2 x 3 h F``
    FLOPs per token and expert (SwiGLU: ``h -> 2F``, ``F -> h``; 2 FLOP per multiply-add); the
    router's GEMM is left out of the FLOP count as in the forward. The dispatch and the combine
    all-to-alls run again, as in the forward; the seconds lie above ``mlp`` (the activation
    alone) and below ``full``."""
    spec = ModelSpec(**MOE)
    cost = block_cost(spec, Shard(ep=2))
    h, fe, fs, k, tokens = 256, 384, 384, 2, 128
    rerun = 2 * 3 * h * (tokens * k * fe + tokens * fs)
    rf, rs = cost.recompute_flops, cost.recompute_s
    assert rf[Recompute.MLP_MOE] - rf[Recompute.NONE] == pytest.approx(rerun, rel=1e-12)
    coll = cost.recompute_collectives[Recompute.MLP_MOE]
    assert [c.axis for c in coll] == [GroupKind.EP, GroupKind.EP]
    assert list(coll) == [c for c in cost.fwd_collectives if c.axis is GroupKind.EP]
    assert rs[Recompute.MLP] < rs[Recompute.MLP_MOE] < rs[Recompute.FULL]


def test_tensor_parallel_moe_block_reruns_the_shared_experts_gather_and_scatter():
    """With ``tp = 2`` and sequence parallelism the shared expert is split over the tensor
    ranks: the MLP's all-gather and reduce-scatter run again with the MoE layer, the
    attention's do not."""
    spec = ModelSpec(**MOE)
    cost = block_cost(spec, Shard(tp=2, sp=True, ep=2))
    ops = [(c.op, c.axis) for c in cost.recompute_collectives[Recompute.MLP_MOE]]
    assert ops[:2] == [
        (CollectiveOp.ALL_GATHER, GroupKind.TP),
        (CollectiveOp.REDUCE_SCATTER, GroupKind.TP),
    ]
    assert [a for _, a in ops[2:]] == [GroupKind.EP, GroupKind.EP]


@pytest.mark.parametrize("tp", [1, 2])
def test_dense_block_recomputes_its_mlp_as_mlp_does(tp):
    """On a dense block ``mlp_moe`` is Megatron-Core's ``mlp`` module alone: it stores, reruns
    and communicates what ``mlp`` does."""
    cost = block_cost(ModelSpec(**LLAMA3_8B), Shard(tp=tp, sp=tp > 1))
    for terms in (cost.act_bytes, cost.recompute_flops, cost.recompute_s):
        assert terms[Recompute.MLP_MOE] == pytest.approx(terms[Recompute.MLP], rel=1e-12)
    assert (
        cost.recompute_collectives[Recompute.MLP_MOE] == cost.recompute_collectives[Recompute.MLP]
    )


@pytest.mark.parametrize("tp", [1, 2])
def test_mla_up_proj_mlp_moe_is_the_sum_of_its_modules(tp):
    """DeepSeek-V3's MoE block: ``mla_up_proj mlp moe`` drops what ``mla_up_proj`` drops and
    what ``mlp moe`` drops (disjoint tensors: Q/K/V against the MoE layer's), and reruns both
    modules' FLOPs."""
    spec = ModelSpec(**{**DSV3, "layers": 4, "first_dense_layers": 1, "mtp_layers": 0})
    cost = block_cost(spec, Shard(tp=tp, sp=tp > 1, ep=4))
    act, rf = cost.act_bytes, cost.recompute_flops
    none, up, whole, both = (
        Recompute.NONE,
        Recompute.MLA_UP,
        Recompute.MLP_MOE,
        Recompute.MLA_UP_MLP_MOE,
    )
    assert act[none] - act[both] == pytest.approx(
        (act[none] - act[up]) + (act[none] - act[whole]), rel=1e-12
    )
    assert rf[both] - rf[none] == pytest.approx((rf[up] - rf[none]) + (rf[whole] - rf[none]))
    assert act[both] < act[whole] < act[none]


def test_nest_equals_brute_with_the_whole_mlp_modes():
    """``nest`` equals ``brute`` on random small problems searching none, both whole-MLP modes
    and full, and some optimal plans use a whole-MLP mode."""
    modes = ["none", "mlp_moe", "mla_up_proj_mlp_moe", "full"]
    agreed, used = nest_equals_brute_over_seeds(tiny_case, modes)
    assert agreed >= 30, agreed
    assert used & {Recompute.MLP_MOE, Recompute.MLA_UP_MLP_MOE}, used


def test_exports_of_the_whole_mlp_modes():
    """Megatron-Core runs them as named (``--recompute-granularity selective
    --recompute-modules mla_up_proj mlp moe``); torchtitan has no module recompute and runs
    full, with a warning."""
    mla = dict(attention="mla", q_lora_rank=64, kv_lora_rank=32)
    problem = _dense_problem(qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, **mla)
    for mode, modules in (("mlp_moe", "mlp moe"), ("mla_up_proj_mlp_moe", "mla_up_proj mlp moe")):
        plan = FixedPlanner(tp=1, pp=2, dp=4, microbatch_size=1, recompute=mode).solve(problem)
        exp = export_plan(problem, plan, "megatron")
        assert exp.exported_plan["recompute"] == [mode, mode]
        assert "--recompute-granularity selective" in exp.text
        assert f"--recompute-modules {modules}" in exp.text
        tt = export_plan(problem, plan, "torchtitan")
        assert tt.exported_plan["recompute"] == ["full", "full"]
        assert any(f"recompute {mode}" in w and "used full" in w for w in tt.warnings)
