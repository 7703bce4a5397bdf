"""The ``dots`` recompute mode: JAX's ``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims``
(MaxText's ``remat_policy: minimal``): its inventory on MaxText's shapes, its place between the
other modes, the search's exactness with it, and the exports."""

import pytest

from baselines.fixed import FixedPlanner
from nest.core.axes import Recompute
from nest.core.layers import Shard
from nest.core.model import ModelSpec
from nest.export import export_plan

from .randomcase import assert_nest_equals_brute
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
    from baselines.brute import count_plans
    from nest.dp.space import SpaceOptions

    used, agreed = set(), 0
    for seed in range(60):
        problem, options = tiny_case(seed)
        options = {**options, "recompute": ["none", "dots", "full"]}
        if count_plans(problem, SpaceOptions(**options)) > 20000:
            continue
        oracle = assert_nest_equals_brute(problem, options, (seed, options))
        if oracle is not None:
            agreed += 1
            used |= {s.recompute for s in oracle.stages}
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
