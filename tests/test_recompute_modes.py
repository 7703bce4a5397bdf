"""Per-module recompute (``mlp``, ``selective_mlp``): inventories, the search's exactness with
five modes, and the exports (Megatron-Core ``--recompute-modules``, torchtitan's fallback)."""

import random

import pytest

from baselines.brute import count_plans
from baselines.fixed import FixedPlanner
from nest.core.axes import CollectiveOp, LayerKind, Recompute
from nest.core.layers import AnalyticModel, Shard
from nest.core.model import ModelSpec
from nest.dp.rows import stage_row
from nest.dp.space import SpaceOptions, configurations
from nest.dp.stages import StageModel
from nest.export import export_plan
from nest.export.common import strongest_recompute
from nest.export.megatron import megatron_args

from .conftest import make_cluster, make_device, make_problem
from .randomcase import assert_nest_equals_brute
from .test_nest_dp import tiny_case
from .test_nest_interleaved import interleaved_case

OWN_EXACTNESS_TEST = (
    Recompute.DOTS,
    Recompute.MLP_MOE,
    Recompute.MLA_UP_MLP_MOE,
    Recompute.QKV_PROJ,
    Recompute.QKV_OUT_PROJ,
    Recompute.NOTHING_SAVEABLE,
)
ALL_MODES = [r.value for r in Recompute if r not in OWN_EXACTNESS_TEST]
"""Megatron-Core's modes and torchtitan's ``op``; JAX's ``dots`` has its own exactness test
(tests/test_recompute_dots.py): it stores little and recomputes only elementwise work, so where
it is searched it wins most stages and hides whether the per-module modes are ever optimal;
the whole-MLP modes too (tests/test_recompute_mlp_moe.py: two more modes would push most
random spaces past what brute force enumerates here), and JAX's named policies
(tests/test_recompute_named.py)."""

# Llama 3 8B (Hugging Face meta-llama/Meta-Llama-3-8B config.json): hidden 4096, 32 layers,
# 32 heads, 8 KV heads, intermediate 14336, vocab 128256, context 8192.
LLAMA3_8B = dict(
    name="llama3_8b",
    hidden=4096,
    layers=32,
    heads=32,
    kv_heads=8,
    ffn_hidden=14336,
    vocab=128256,
    seq_len=8192,
    activation="swiglu",
    norm="rmsnorm",
    bias=False,
    position="rope",
)


def block_cost(spec: ModelSpec, shard: Shard, flash: bool = True):
    model = AnalyticModel(spec, flash_attention=flash)
    ref = next(r for r in model.chain if r.kind is LayerKind.BLOCK and r.moe == spec.is_moe)
    return model.layer_cost(ref, shard, make_device())


@pytest.mark.parametrize("tp", [1, 2])
def test_llama3_8b_block_bytes_per_mode_from_korthikanti_inventory(tp):
    """Korthikanti et al. 2022 §4.1 inventory for a SwiGLU/GQA block without dropout, bf16
    (``p = 2``), ``s b = 8192`` tokens, sequence parallelism with ``t = 2``: outside the
    tensor-parallel region the two norm inputs, the attention input and the MLP input
    (``4 h``, split over ``t`` under SP); inside it Q, K, V and the attention output
    (``2 a d + 2 g d``) and the MLP's FC1 output and FC2 input (``2 F + F``); FlashAttention's
    fp32 log-sum-exp (``4 a`` bytes per token, split over ``t``). Megatron-Core's ``mlp``
    recompute drops the MLP's ``3 F``; ``core_attn`` drops the log-sum-exp; full keeps only the
    block input. At ``t = 1`` this is 1.0635 GiB (none) and 0.4072 GiB (mlp)."""
    spec = ModelSpec(**LLAMA3_8B)
    cost = block_cost(spec, Shard(tp=tp, sp=tp > 1))
    tokens, p, h, f = 8192, 2, 4096, 14336
    q, kv = 32 * 128, 8 * 128
    outside = 4 * h * p * tokens / tp
    attention = (2 * q + 2 * kv) * p * tokens / tp
    mlp = 3 * f * p * tokens / tp
    lse = 4 * 32 * tokens / tp
    want = {
        Recompute.NONE: outside + attention + mlp + lse,
        Recompute.SELECTIVE: outside + attention + mlp,
        Recompute.MLP: outside + attention + lse,
        Recompute.SELECTIVE_MLP: outside + attention,
        Recompute.FULL: h * p * tokens / tp,
    }
    for mode, value in want.items():
        assert cost.act_bytes[mode] == pytest.approx(value, rel=1e-12), mode
    if tp == 1:
        assert cost.act_bytes[Recompute.NONE] / 2**30 == pytest.approx(1.0635, abs=1e-4)
        assert cost.act_bytes[Recompute.MLP] / 2**30 == pytest.approx(0.4072, abs=1e-4)


def test_mlp_recompute_repeats_the_mlps_forward_and_its_collectives():
    """A dense MLP recomputed: FC1 (``h -> 2F``) and FC2 (``F -> h``) again, ``2 (2hF + Fh)
    = 6 h F`` FLOPs per token over ``t`` (Narayanan et al. 2021's 2 FLOP per multiply-add),
    on top of what ``none`` (and ``selective``) recompute; with sequence parallelism its
    all-gather before FC1 and reduce-scatter after FC2 run again (Korthikanti et al. §4.2.2);
    its seconds lie between none's and full's."""
    spec = ModelSpec(**LLAMA3_8B)
    tp = 2
    cost = block_cost(spec, Shard(tp=tp, sp=True))
    extra = 6 * 4096 * 14336 * 8192 / tp
    rf, rs = cost.recompute_flops, cost.recompute_s
    assert rf[Recompute.MLP] - rf[Recompute.NONE] == pytest.approx(extra, rel=1e-12)
    assert rf[Recompute.SELECTIVE_MLP] - rf[Recompute.SELECTIVE] == pytest.approx(extra, rel=1e-12)
    ops = [c.op for c in cost.recompute_collectives[Recompute.MLP]]
    assert ops == [CollectiveOp.ALL_GATHER, CollectiveOp.REDUCE_SCATTER]
    assert rs[Recompute.NONE] < rs[Recompute.MLP] < rs[Recompute.FULL]
    assert rs[Recompute.SELECTIVE_MLP] - rs[Recompute.MLP] == pytest.approx(
        rs[Recompute.SELECTIVE] - rs[Recompute.NONE], rel=1e-12
    )


def test_moe_blocks_recompute_only_the_experts_activation():
    """MoE blocks: Megatron-Core's ``moe_act`` discards each routed copy's activation output
    (the FC2 input, ``F_e`` per copy, ``top_k`` copies) and recomputes the activation function
    from the kept FC1 output: no GEMM, no collective, memory-bound seconds only."""
    spec = ModelSpec(
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
        dropout=False,
    )
    tp = 2
    cost = block_cost(spec, Shard(tp=tp, sp=True, ep=2), flash=True)
    dropped = spec.top_k * spec.expert_ffn * 2 * 128 / tp
    assert cost.act_bytes[Recompute.NONE] - cost.act_bytes[Recompute.MLP] == pytest.approx(
        dropped, rel=1e-12
    )
    assert cost.recompute_flops[Recompute.MLP] == cost.recompute_flops[Recompute.NONE]
    assert cost.recompute_collectives[Recompute.MLP] == ()
    assert cost.recompute_s[Recompute.MLP] > cost.recompute_s[Recompute.NONE]


@pytest.mark.parametrize("seed", range(6))
def test_modes_of_one_stage_differ_only_in_the_backward(seed):
    """The premise of the DP's fastest-fitting-mode rule (nest/dp/recurrence.py): for one rank
    and layers ``i..j`` two modes' stage times differ exactly as their backward times do, and
    their sync and optimizer step are the same."""
    problem, options = tiny_case(seed)
    rng = random.Random(seed)
    space = SpaceOptions(**{**options, "schedules": ["1f1b"], "recompute": ALL_MODES})
    for config in rng.sample(list(configurations(problem, space)), 2):
        sm = StageModel(problem, config)
        r, i = rng.randrange(config.pp), rng.randrange(sm.n_layers)
        rows = {mode: stage_row(sm, r, i, mode) for mode in Recompute}
        base = rows[Recompute.NONE]
        for row in rows.values():
            for k in range(sm.n_layers - i):
                assert row.time_s[k] - base.time_s[k] == pytest.approx(
                    row.bwd_s[k] - base.bwd_s[k], rel=1e-9, abs=1e-15
                )
                assert row.sync_s[k] == base.sync_s[k]
                assert row.optimizer_s[k] == base.optimizer_s[k]


def test_nest_equals_brute_with_all_modes():
    """``nest`` (which extends a 1F1B stage with its fastest fitting mode only, and takes an
    interleaved rank's fastest assignment when it fits) equals ``brute`` (every mode of every
    stage or chunk through ``evaluate``) on random small problems searching every mode,
    1F1B and interleaved (``op`` included: tests/test_recompute_op.py); some optimal plans use
    the per-module modes."""
    used, agreed = set(), 0
    cases = [tiny_case(seed) for seed in range(48)]
    cases += [interleaved_case(2000 + seed, max_plans=4000) for seed in range(20)]
    for seed, (problem, options) in enumerate(cases):
        options = {**options, "recompute": ALL_MODES}
        if count_plans(problem, SpaceOptions(**options)) > 20000:
            continue
        oracle = assert_nest_equals_brute(problem, options, (seed, options))
        if oracle is not None:
            agreed += 1
            used |= {s.recompute for s in oracle.stages}
    assert agreed >= 25, agreed
    assert used & {Recompute.MLP, Recompute.SELECTIVE_MLP}, used


def _dense_problem(**spec_over):
    spec = ModelSpec(
        name="d",
        hidden=256,
        layers=4,
        heads=4,
        ffn_hidden=1024,
        vocab=512,
        seq_len=256,
        **spec_over,
    )
    return make_problem(spec, make_cluster(fanouts=(8,)), global_batch=16)


def test_megatron_exports_recompute_modules():
    """Megatron-Core's ``TransformerConfig.recompute_modules`` (``--recompute-modules``, with
    ``--recompute-granularity selective``): ``mlp`` recomputes the dense MLP, ``moe_act`` the
    experts' activation and needs ``--moe-grouped-gemm`` (``TransformerConfig.__post_init__``:
    "moe_act in recompute_modules is only supported with moe_grouped_gemm"), ``core_attn`` the
    attention core."""
    dense = _dense_problem()
    plan = FixedPlanner(tp=2, pp=2, dp=2, microbatch_size=1, recompute="mlp").solve(dense)
    args = megatron_args(dense, plan)
    assert "--recompute-granularity selective" in args
    assert "--recompute-modules mlp" in args
    assert "--moe-grouped-gemm" not in args
    moe = _dense_problem(num_experts=4, top_k=2, moe_layer_freq=2)
    plan = FixedPlanner(tp=2, pp=2, dp=2, microbatch_size=1, recompute="selective_mlp").solve(moe)
    args = megatron_args(moe, plan)
    assert "--recompute-modules core_attn mlp moe_act" in args
    assert "--moe-grouped-gemm" in args


def test_mixed_modes_export_as_the_mode_recomputing_everything_used():
    """Megatron has one mode for every stage: selective on one stage and mlp on another
    become selective_mlp (stores no more than either), and anything with full becomes full;
    torchtitan has no MLP-only recompute and runs full instead, with a warning."""
    problem = _dense_problem()

    def plan(modes):
        return FixedPlanner(tp=1, pp=2, dp=4, microbatch_size=1, recompute=modes).solve(problem)

    assert strongest_recompute(plan(["selective", "mlp"])) is Recompute.SELECTIVE_MLP
    assert strongest_recompute(plan(["none", "selective"])) is Recompute.SELECTIVE
    assert strongest_recompute(plan(["mlp", "full"])) is Recompute.FULL
    exp = export_plan(problem, plan(["selective", "mlp"]), "megatron")
    assert exp.exported_plan["recompute"] == ["selective_mlp", "selective_mlp"]
    assert "--recompute-modules core_attn mlp" in exp.text
    exp = export_plan(problem, plan("mlp"), "torchtitan")
    assert exp.exported_plan["recompute"] == ["full", "full"]
    assert any("recompute mlp" in w and "used full" in w for w in exp.warnings)


def llama3_8b_on_one_h100_node():
    """Llama 3 8B (the 70B preset with 8B's published shape) on one DGX H100 node, batch 64."""
    from nest.app.config import build_problem

    from .test_cli import compose

    spec = "model.hidden=4096 model.layers=32 model.heads=32 model.kv_heads=8"
    spec += " model.ffn_hidden=14336"
    cfg = compose(
        "cluster=dgx_8x8", "cluster.devices=8", "model=llama3_70b", "model.name=llama3_8b",
        *spec.split(), "training.global_batch=64",
    )  # fmt: skip
    return build_problem(cfg)


def test_llama3_8b_on_h100_takes_mlp_where_memory_forces_recompute():
    """The issue's done-when: Llama 3 8B data-parallel on one DGX H100 node (8 x 80 GB; ZeRO-1
    keeps 16 bytes of model state per parameter over 8 ranks, about 44 GB, beside the
    activations) cannot keep every activation; the best plan of the five-mode space recomputes
    only MLPs and beats the best plan of the old three modes (which must recompute everything)."""
    from nest.dp.planner import NestPlanner

    problem = llama3_8b_on_one_h100_node()
    space = dict(tp=[1], cp=[1], pp=[1], zero_stages=[0, 1])
    old = NestPlanner(**space, recompute=["none", "selective", "full"]).solve(problem)
    new = NestPlanner(**space).solve(problem)
    assert {s.recompute for s in old.stages} == {Recompute.FULL}
    assert {s.recompute for s in new.stages} == {Recompute.MLP}
    assert new.objective_s < 0.95 * old.objective_s


def test_more_modes_never_make_the_optimum_worse():
    """A larger space holds every plan of a smaller one: ``nest`` over all five modes is never
    slower than over any three of them, 1F1B and interleaved (a rule that dropped a needed
    mode, e.g. keeping only a rank's fastest assignment where a slower first chunk hides more
    gradient sync, breaks this)."""
    from nest.core.errors import Infeasible
    from nest.dp.planner import NestPlanner

    rng = random.Random(7)
    compared = 0
    for seed in range(30):
        problem, options = interleaved_case(3000 + seed) if seed % 2 else tiny_case(seed)
        try:
            full = NestPlanner(**{**options, "recompute": ALL_MODES}).solve(problem)
        except Infeasible:
            continue
        subset = sorted(rng.sample(ALL_MODES, 3))
        try:
            part = NestPlanner(**{**options, "recompute": subset}).solve(problem)
        except Infeasible:
            continue
        assert full.objective_s <= part.objective_s * (1 + 1e-12), (seed, subset)
        compared += 1
    assert compared >= 15, compared
