"""JAX's named remat policies as recompute modes: ``qkv_proj`` (MaxText's ``remat_policy:
save_qkv_proj``), ``qkv_out_proj`` (praxis's ``AutodiffCheckpointType.SAVE_QKV_OUT_PROJ``) and
``nothing_saveable`` (MaxText's ``remat_policy: full``, ``jax.checkpoint`` with no policy):
what they keep on the published runs' shapes, what they rerun, their place between the other
modes, the search's exactness with them, the exports."""

import pytest

from baselines.fixed import FixedPlanner
from nest.core.axes import CollectiveOp, GroupKind, Recompute
from nest.core.layers import Shard
from nest.core.model import ModelSpec
from nest.export import export_plan

from .randomcase import nest_equals_brute_over_seeds
from .test_nest_dp import tiny_case
from .test_recompute_modes import LLAMA3_8B, _dense_problem, block_cost

# Llama 3 70B (Hugging Face meta-llama/Meta-Llama-3-70B config.json; MaxText's llama3-70b):
# hidden 8192, 64 heads of 128, 8 KV heads, intermediate 28672, vocab 128256.
LLAMA3_70B = {
    **LLAMA3_8B,
    "name": "llama3_70b",
    "hidden": 8192,
    "layers": 2,
    "heads": 64,
    "kv_heads": 8,
    "ffn_hidden": 28672,
    "dropout": False,
}

# GPT-3 175B as Paxml's GPT175BBase (github:google/paxml@4a6bf2002bf61a6173e7ae80950b145a50fe57cf
# paxml/contrib/gpu/scripts_gpu/configs.py): 12288 wide, 96 heads, 49152 GELU, biases,
# layernorm, learned positions, seq 2048 (two layers here).
GPT3_175B = dict(
    name="gpt3_175b",
    hidden=12288,
    layers=2,
    heads=96,
    ffn_hidden=49152,
    vocab=50257,
    seq_len=2048,
    activation="gelu",
    norm="layernorm",
    bias=True,
    position="learned",
    dropout=False,
)


@pytest.mark.parametrize("tp", [1, 2])
def test_llama3_70b_keeps_its_input_and_q_k_v_under_save_qkv_proj(tp):
    """MaxText's ``save_qkv_proj`` (``save_only_these_names('query_proj', 'key_proj',
    'value_proj', 'qkv_proj')``, github:AI-Hypercomputer/maxtext@d9a4b64e ``models.py``): a
    Llama 3 70B block keeps the scan's carry (``h = 8192``) and Q (``64 x 128``), K and V
    (``8 x 128`` each), bf16, 8,192 tokens; under tensor parallelism with sequence
    parallelism the input is a ``1 / t`` shard and the heads split over ``t``. Nothing of the
    MLP is kept: fewer bytes than ``dots`` by the MLP's two FC1 outputs (``2 x 28672``)."""
    spec = ModelSpec(**LLAMA3_70B)
    act = block_cost(spec, Shard(tp=tp, sp=tp > 1)).act_bytes
    per_token = 2 * (8192 + 8192 + 2 * 1024) / tp
    assert act[Recompute.QKV_PROJ] == pytest.approx(per_token * 8192, rel=1e-12)
    mlp = 2 * 2 * 28672 / tp * 8192
    assert act[Recompute.DOTS] - act[Recompute.QKV_PROJ] == pytest.approx(mlp, rel=1e-12)


def test_gpt3_175b_keeps_ten_bytes_per_token_and_hidden_unit_under_save_qkv_out_proj():
    """praxis's ``SAVE_QKV_OUT_PROJ`` (``save_only_these_names('combined_qkv_proj',
    'out_proj')``, ``praxis/layers/checkpoint_policy.py``; Transformer Engine's flax
    ``TransformerLayer`` names the same tensors): a GPT-3 175B block keeps its input, the fused
    QKV output (``3 x 12288``) and the output projection's (``12288``), bf16: ``2 x 5 x 12288``
    bytes per token, 2,048 tokens; ``qkv_proj`` keeps the same less the output projection's."""
    cost = block_cost(ModelSpec(**GPT3_175B), Shard(tp=1, sp=False))
    act = cost.act_bytes
    assert act[Recompute.QKV_OUT_PROJ] == pytest.approx(2 * 5 * 12288 * 2048, rel=1e-12)
    assert act[Recompute.QKV_OUT_PROJ] - act[Recompute.QKV_PROJ] == pytest.approx(
        2 * 12288 * 2048, rel=1e-12
    )


@pytest.mark.parametrize("tp", [1, 4])
def test_named_policies_rerun_the_gemms_whose_outputs_the_backward_reads(tp):
    """Beyond the attention core (``dots`` reruns it with the elementwise work), ``qkv_out_proj``
    reruns the MLP's FC1 (GELU's input: ``2 x tokens x 12288 x 49152 / t`` FLOPs) and
    ``qkv_proj`` also the output projection (``2 x tokens x 12288 x 12288 / t``), whose output
    rebuilds the residual stream the MLP's layernorm reads; neither reruns the QKV projection
    (its outputs are kept) nor FC2 (its output feeds a residual addition only)."""
    cost = block_cost(ModelSpec(**GPT3_175B), Shard(tp=tp, sp=tp > 1))
    flops, tokens = cost.recompute_flops, 2048
    fc1 = 2 * tokens * 12288 * 49152 / tp
    proj = 2 * tokens * 12288 * 12288 / tp
    assert flops[Recompute.QKV_OUT_PROJ] - flops[Recompute.DOTS] == pytest.approx(fc1, rel=1e-12)
    assert flops[Recompute.QKV_PROJ] - flops[Recompute.QKV_OUT_PROJ] == pytest.approx(
        proj, rel=1e-12
    )


def test_named_policies_rerun_the_tensor_parallel_collectives_they_need():
    """With sequence parallelism the MLP's input is all-gathered again under both (FC1 reads
    it); ``qkv_proj`` also reruns the reduce-scatter after the output projection (the residual
    stream it rebuilds), ``qkv_out_proj`` keeps that output and does not."""
    cost = block_cost(ModelSpec(**LLAMA3_8B), Shard(tp=2, sp=True))
    ops = {
        mode: [c.op for c in cost.recompute_collectives[mode] if c.axis is GroupKind.TP]
        for mode in (Recompute.QKV_PROJ, Recompute.QKV_OUT_PROJ)
    }
    assert ops[Recompute.QKV_PROJ] == [CollectiveOp.REDUCE_SCATTER, CollectiveOp.ALL_GATHER]
    assert ops[Recompute.QKV_OUT_PROJ] == [CollectiveOp.ALL_GATHER]


@pytest.mark.parametrize("seed", range(6))
def test_named_policies_lie_between_full_and_dots(seed):
    """On any block: ``full`` keeps the input only, the named policies add Q, K, V (and the
    output projection's output), ``dots`` the MLP's FC1 outputs on top; what each reruns
    grows the other way, all below ``full`` (which reruns the QKV projections and FC2 too)."""
    spec = ModelSpec(**{**LLAMA3_8B, "layers": 2, "seq_len": 1024 * (seed + 1)})
    for tp in (1, 2, 4):
        cost = block_cost(spec, Shard(tp=tp, sp=tp > 1))
        act, rec = cost.act_bytes, cost.recompute_s
        order = (Recompute.FULL, Recompute.QKV_PROJ, Recompute.QKV_OUT_PROJ, Recompute.DOTS)
        assert [act[m] for m in order] == sorted(act[m] for m in order)
        assert act[Recompute.FULL] < act[Recompute.QKV_PROJ]
        assert rec[Recompute.DOTS] < rec[Recompute.QKV_OUT_PROJ] < rec[Recompute.QKV_PROJ]
        assert rec[Recompute.QKV_PROJ] < rec[Recompute.FULL]


def test_nest_equals_brute_with_the_named_policies_in_the_space():
    """``nest`` equals ``brute`` on random small problems searching none, qkv_proj,
    qkv_out_proj and full (dense and MoE blocks), and some optimal plans use a named policy."""
    modes = ["none", "qkv_proj", "qkv_out_proj", "full"]
    agreed, used = nest_equals_brute_over_seeds(tiny_case, modes)
    assert agreed >= 30, agreed
    assert used & {Recompute.QKV_PROJ, Recompute.QKV_OUT_PROJ}, used


@pytest.mark.parametrize("mode", ["qkv_proj", "qkv_out_proj", "nothing_saveable"])
def test_exports_of_the_named_policies(mode):
    """Neither Megatron-Core (``--recompute-modules`` names modules) nor torchtitan (whole
    blocks or its op policy) runs JAX's named policies: both export full, with a warning."""
    problem = _dense_problem()
    plan = FixedPlanner(tp=1, pp=2, dp=4, microbatch_size=1, recompute=mode).solve(problem)
    for target in ("megatron", "torchtitan"):
        exp = export_plan(problem, plan, target)
        assert exp.exported_plan["recompute"] == ["full", "full"], target
        assert any(f"recompute {mode}" in w and "used full" in w for w in exp.warnings), target


@pytest.mark.parametrize("tp", [1, 4])
def test_nothing_saveable_keeps_the_input_and_reruns_all_but_fc2(tp):
    """MaxText's ``remat_policy: full`` is ``nn.remat(policy=None)``
    (github:AI-Hypercomputer/maxtext@76bd53b ``MaxText/layers/models.py``), JAX's
    ``nothing_saveable`` (``jax/_src/ad_checkpoint.py`` ``remat_partial_eval``), whose rerun
    is dead-code eliminated to what the backward reads: a GPT-3 175B block keeps its input
    only, as Megatron's ``full`` does, and reruns what ``qkv_proj`` does plus the fused QKV
    projection (``2 x tokens x 12288 x 3 x 12288 / t`` FLOPs; the attention core reads its
    outputs); unlike ``full`` it never reruns FC2 (``2 x tokens x 49152 x 12288 / t``), whose
    output feeds the residual addition only."""
    cost = block_cost(ModelSpec(**GPT3_175B), Shard(tp=tp, sp=tp > 1))
    act, flops, tokens = cost.act_bytes, cost.recompute_flops, 2048
    assert act[Recompute.NOTHING_SAVEABLE] == pytest.approx(2 * 12288 * tokens / tp, rel=1e-12)
    assert act[Recompute.NOTHING_SAVEABLE] == act[Recompute.FULL]
    qkv = 2 * tokens * 12288 * 3 * 12288 / tp
    assert flops[Recompute.NOTHING_SAVEABLE] - flops[Recompute.QKV_PROJ] == pytest.approx(
        qkv, rel=1e-12
    )
    # full reruns the whole forward: FC2 on top (both pay FlashAttention's score recompute)
    fc2 = 2 * tokens * 49152 * 12288 / tp
    assert flops[Recompute.FULL] - flops[Recompute.NOTHING_SAVEABLE] == pytest.approx(
        fc2, rel=1e-12
    )


@pytest.mark.parametrize("tp", [1, 4])
def test_every_mode_that_reruns_the_core_also_pays_flashattentions_score_recompute(tp):
    """FlashAttention's backward recomputes the scores S = QK^T from Q, K and the saved
    log-sum-exp whatever the activation policy (Dao, "FlashAttention-2", 2023, §3.1.2: the
    backward pass "recompute[s] the values of the attention scores"): half the core's forward
    FLOPs, ``none``'s recompute. A mode that reruns the core's forward to rebuild its output
    and log-sum-exp (Megatron's ``selective``, JAX's policies, which save no attention output)
    pays that rerun and the scores again: three halves of the core on a block whose core is
    all it reruns (``selective``, ``dots``), and the same core part under the named JAX modes
    (their difference to ``dots`` is the GEMMs they rerun)."""
    cost = block_cost(ModelSpec(**GPT3_175B), Shard(tp=tp, sp=tp > 1))
    flops = cost.recompute_flops
    half_core = flops[Recompute.NONE]
    assert half_core > 0
    assert flops[Recompute.SELECTIVE] == pytest.approx(3 * half_core, rel=1e-12)
    assert flops[Recompute.DOTS] == pytest.approx(3 * half_core, rel=1e-12)
    tokens = 2048
    out_proj = 2 * tokens * 12288 * 12288 / tp
    fc1 = 2 * tokens * 12288 * 49152 / tp
    assert flops[Recompute.QKV_OUT_PROJ] == pytest.approx(3 * half_core + fc1, rel=1e-12)
    assert flops[Recompute.QKV_PROJ] == pytest.approx(3 * half_core + fc1 + out_proj, rel=1e-12)


def test_nothing_saveable_reruns_the_gathers_before_attention_and_mlp():
    """With sequence parallelism ``nothing_saveable`` reruns the all-gather of the attention's
    input (Q, K, V's projections read it), the reduce-scatter after the output projection
    (the residual stream the MLP's norm reads) and the MLP's all-gather (FC1 reads it), not
    the reduce-scatter after FC2, which ``full`` reruns."""
    cost = block_cost(ModelSpec(**LLAMA3_8B), Shard(tp=2, sp=True))
    ops = {
        mode: [c.op for c in cost.recompute_collectives[mode] if c.axis is GroupKind.TP]
        for mode in (Recompute.NOTHING_SAVEABLE, Recompute.FULL)
    }
    gather, scatter = CollectiveOp.ALL_GATHER, CollectiveOp.REDUCE_SCATTER
    assert ops[Recompute.NOTHING_SAVEABLE] == [gather, scatter, gather]
    assert ops[Recompute.FULL] == [gather, scatter, gather, scatter]


@pytest.mark.parametrize("seed", range(4))
def test_nothing_saveable_lies_between_qkv_proj_and_full(seed):
    """On any block, dense or MoE: ``nothing_saveable`` stores what ``full`` does and reruns
    less (no FC2, no shared experts' FC2), more than ``qkv_proj`` (the Q/K/V projections)."""
    from .test_recompute_mlp_moe import MOE

    for spec in (
        ModelSpec(**{**LLAMA3_8B, "layers": 2, "seq_len": 1024 * (seed + 1)}),
        ModelSpec(**{**MOE, "seq_len": 128 * (seed + 1)}),
    ):
        for tp in (1, 2, 4):
            cost = block_cost(spec, Shard(tp=tp, sp=tp > 1))
            act, rec = cost.act_bytes, cost.recompute_s
            assert act[Recompute.NOTHING_SAVEABLE] == act[Recompute.FULL]
            assert rec[Recompute.QKV_PROJ] < rec[Recompute.NOTHING_SAVEABLE] < rec[Recompute.FULL]


def test_nest_equals_brute_with_nothing_saveable_in_the_space():
    """``nest`` equals ``brute`` on random small problems searching none, qkv_proj,
    nothing_saveable and full (dense and MoE blocks); nothing_saveable stores what full does
    for less rerun, so some optimal plans take it."""
    modes = ["none", "qkv_proj", "nothing_saveable", "full"]
    agreed, used = nest_equals_brute_over_seeds(tiny_case, modes)
    assert agreed >= 30, agreed
    assert Recompute.NOTHING_SAVEABLE in used, used
