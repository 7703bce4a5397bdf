"""The opt-in recompute modes of published runs: ``dots`` (JAX's
``checkpoint_dots_with_no_batch_dims``, MaxText's ``remat_policy: minimal``: its inventory on
MaxText's shapes, its place between the other modes, the search's exactness with it, the
exports) and ``mla_up_proj`` (Megatron-Core's module, dgxc-benchmarking's DeepSeek-V3)."""

import pytest

from baselines.fixed import FixedPlanner
from nest.core.axes import Recompute
from nest.core.layers import Shard
from nest.core.model import ModelSpec
from nest.export import export_plan

from .randomcase import nest_equals_brute_over_seeds
from .test_model_shapes import DSV3
from .test_nest_dp import tiny_case
from .test_recompute_modes import LLAMA3_8B, _dense_problem, block_cost

# MaxText 32B at github:AI-Hypercomputer/maxtext@76bd53b0f44caf989c88189afadeb1062f9254f0
# (MaxText/configs/base.yml with global_parameter_scale=32): emb 10240, 32 heads of 256,
# mlp 32768 with one relu matrix, 32 layers, vocab 32768, seq 2048, no biases, RMSNorm, RoPE.
MAXTEXT_32B = dict(
    name="maxtext_32b",
    hidden=10240,
    layers=32,
    heads=32,
    kv_heads=32,
    head_dim=256,
    ffn_hidden=32768,
    vocab=32768,
    seq_len=2048,
    activation="gelu",
    norm="rmsnorm",
    bias=False,
    position="rope",
    dropout=False,
)


@pytest.mark.parametrize("tp", [1, 4])
def test_maxtext_32b_block_bytes_under_dots(tp):
    """What ``checkpoint_dots_with_no_batch_dims`` keeps of MaxText's decoder layer
    (``MaxText/layers/models.py`` ``DecoderLayer`` at 76bd53b): the scan's carry (the layer
    input, ``h``) and the weight matmuls' outputs the backward reads, the query, key and value
    projections (``3 x 32 x 256``) and the MLP's ``wi`` output (``mlp_dim``, relu's input); not
    the output projection's nor ``wo``'s (they feed residual additions only). bf16, one
    2,048-token sequence: ``(10240 + 24576 + 32768) x 2 = 135,168`` bytes per token, under
    tensor parallelism with the activations sharded (``activation_embed``/``heads``/``mlp``
    over ``tensor`` in base.yml's logical axis rules) a ``1 / t`` share each; about half of
    what Megatron's ``selective`` keeps of the same block."""
    spec = ModelSpec(**MAXTEXT_32B)
    cost = block_cost(spec, Shard(tp=tp, sp=tp > 1))
    per_token = 2 * (10240 + 3 * 32 * 256 + 32768) / tp
    assert cost.act_bytes[Recompute.DOTS] == pytest.approx(per_token * 2048, rel=1e-12)
    ratio = cost.act_bytes[Recompute.DOTS] / cost.act_bytes[Recompute.SELECTIVE]
    assert 0.45 < ratio < 0.55


def test_llama3_8b_dots_keeps_both_swiglu_inputs():
    """A gated MLP's two FC1 outputs (``w1``, ``w3``: the SiLU's input and the product's other
    factor) are both kept; grouped-query K and V are ``kv_heads x head_dim`` wide each."""
    spec = ModelSpec(**LLAMA3_8B)
    cost = block_cost(spec, Shard(tp=1, sp=False))
    h, f, q, kv = 4096, 14336, 32 * 128, 8 * 128
    assert cost.act_bytes[Recompute.DOTS] == pytest.approx(2 * (h + q + 2 * kv + 2 * f) * 8192)


@pytest.mark.parametrize("seed", range(6))
def test_dots_lies_between_full_and_none(seed):
    """On any block: keeps at least what ``full`` keeps (the input), at most what ``none``
    keeps; recomputes more than ``selective`` (the elementwise work too), less than ``full``."""
    spec = ModelSpec(**{**LLAMA3_8B, "layers": 2, "seq_len": 1024 * (seed + 1)})
    for tp in (1, 2, 4):
        cost = block_cost(spec, Shard(tp=tp, sp=tp > 1))
        act, rec = cost.act_bytes, cost.recompute_s
        assert act[Recompute.FULL] <= act[Recompute.DOTS] <= act[Recompute.NONE]
        assert rec[Recompute.SELECTIVE] < rec[Recompute.DOTS] < rec[Recompute.FULL]


def test_nest_equals_brute_with_dots_in_the_space():
    """``nest`` equals ``brute`` on random small problems searching none, dots and full, and
    some optimal plans use dots."""
    agreed, used = nest_equals_brute_over_seeds(tiny_case, ["none", "dots", "full"])
    assert agreed >= 30, agreed
    assert Recompute.DOTS in used, used


def test_exports_of_dots():
    """Neither Megatron-Core (``--recompute-modules`` names modules) nor torchtitan (whole
    blocks or its op policy) runs JAX's dots policy: both export full, with a warning."""
    problem = _dense_problem()
    plan = FixedPlanner(tp=1, pp=2, dp=4, microbatch_size=1, recompute="dots").solve(problem)
    for target in ("megatron", "torchtitan"):
        exp = export_plan(problem, plan, target)
        assert exp.exported_plan["recompute"] == ["full", "full"], target
        assert any("recompute dots" in w and "used full" in w for w in exp.warnings), target


# DeepSeek-V3's attention (conf/model/deepseek_v3, the Hugging Face config.json): hidden 7168,
# 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128; dense blocks.
DSV3_MOE_FIELDS = (
    "num_experts",
    "top_k",
    "moe_ffn_hidden",
    "shared_experts",
    "first_dense_layers",
    "mtp_layers",
)
DSV3_MLA = {
    **{k: v for k, v in DSV3.items() if k not in DSV3_MOE_FIELDS},
    "name": "mla",
    "layers": 2,
    "dropout": False,
}
"""DeepSeek-V3's dense MLA block (the shape of :data:`tests.test_model_shapes.DSV3`, no experts)."""


@pytest.mark.parametrize("tp", [1, 2])
def test_mla_up_proj_drops_q_k_v_and_reruns_the_up_projections(tp):
    """Megatron-Core's ``mla_up_proj`` recompute module (``multi_latent_attention.py``: the
    up-projections and RoPE under ``CheckpointWithoutOutput``, discarded after the attention
    core): a DeepSeek-V3 block keeps no Q, K (``128 x 192`` each) nor V (``128 x 128``), bf16,
    split over ``t``, 4,096 tokens; the backward reruns ``q_up`` (``1536 -> 128 x 192``) and
    ``kv_up`` (``512 -> 128 x (128 + 128)``): ``2 x tokens x (1536 x 24576 + 512 x 32768) / t``
    FLOPs more than ``none``."""
    spec = ModelSpec(**DSV3_MLA)
    cost = block_cost(spec, Shard(tp=tp, sp=tp > 1))
    tokens = 4096
    act, flops = cost.act_bytes, cost.recompute_flops
    dropped = 2 * (2 * 128 * 192 + 128 * 128) * tokens / tp
    assert act[Recompute.NONE] - act[Recompute.MLA_UP] == pytest.approx(dropped, rel=1e-12)
    rerun = 2 * tokens * (1536 * 128 * 192 + 512 * 128 * 256) / tp
    assert flops[Recompute.MLA_UP] - flops[Recompute.NONE] == pytest.approx(rerun, rel=1e-12)
    assert cost.recompute_s[Recompute.MLA_UP] > cost.recompute_s[Recompute.NONE]


def test_mla_up_proj_is_none_on_other_blocks():
    """A block without MLA has nothing for ``mla_up_proj`` to recompute: it stores and reruns
    what ``none`` does."""
    cost = block_cost(ModelSpec(**LLAMA3_8B), Shard(tp=2, sp=True))
    assert cost.act_bytes[Recompute.MLA_UP] == cost.act_bytes[Recompute.NONE]
    assert cost.recompute_s[Recompute.MLA_UP] == cost.recompute_s[Recompute.NONE]


def test_megatron_exports_mla_up_proj_as_its_recompute_module():
    """``mla_up_proj`` is a Megatron-Core module: ``--recompute-granularity selective
    --recompute-modules mla_up_proj`` (``TransformerConfig.recompute_modules``), no warning."""
    mla = dict(attention="mla", q_lora_rank=64, kv_lora_rank=32)
    problem = _dense_problem(qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, **mla)
    plan = FixedPlanner(tp=1, pp=2, dp=4, microbatch_size=1, recompute="mla_up_proj").solve(problem)
    exp = export_plan(problem, plan, "megatron")
    assert exp.exported_plan["recompute"] == ["mla_up_proj", "mla_up_proj"]
    assert "--recompute-granularity selective" in exp.text
    assert "--recompute-modules mla_up_proj" in exp.text
    assert not any("used full" in w for w in exp.warnings)
