"""FP8 training: each term of nest/core/precision.py on worked examples.

Sources (docs/plan/precision.md): Transformer Engine runs the block linears' forward, data-
and weight-gradient GEMMs in FP8 and keeps the attention core, LM head, embedding and router in
BF16; it casts each weight once per iteration and keeps the FP8 weight and its transpose
(Hopper); it saves FP8 GEMM inputs in FP8; per-tensor current scaling reads a tensor once more
for its amax; ``--fp8-param-gather`` makes the FP8 copy the model weight and all-gathers it in
FP8. Speed: the FP8 peak times the FP8 GEMM ceiling of the same micro-benchmark as BF16's
(ml-engineering mamf-finder).
"""

import pytest

from baselines.fixed import FixedPlanner
from nest.core.axes import LayerKind, Recompute
from nest.core.blocks import attention_linears, block_tensors, mlp_linears
from nest.core.errors import UserError
from nest.core.kernels import gemm_time_s
from nest.core.layers import Shard
from nest.core.precision import Fp8Recipe, Precision
from nest.cost import evaluate

from .conftest import TFLOP, make_cluster, make_device, make_problem, make_spec

FP8_DEVICE = dict(fp8_peak_flops_per_s=200 * TFLOP, fp8_gemm_ceiling=0.8, gemm_ceiling=1.0)


def fp8_problem(spec=None, **train):
    cluster = make_cluster(fanouts=(4,), **FP8_DEVICE)
    return make_problem(spec or make_spec(), cluster, precision="fp8", **train)


def blocks_of(problem):
    shard = Shard(tp=1, mbs=1)
    device = problem.cluster.device
    return [
        problem.model.layer_cost(ref, shard, device)
        for ref in problem.model.chain
        if ref.kind is LayerKind.BLOCK
    ]


def test_fp8_gemm_runs_at_the_fp8_peak_times_its_ceiling():
    """Flat compute model: ``2 m n k / (fp8 peak x fp8 ceiling x in-step share)`` where the
    in-step share of a flat device is its matmul efficiency over a BF16 ceiling of 1."""
    device = make_device(matmul_efficiency=0.5, **FP8_DEVICE)
    m, n, k = 1024, 2048, 512
    want = 2 * m * n * k / (200 * TFLOP * 0.8 * 0.5)
    assert gemm_time_s(device, m, n, k, fp8=True) == pytest.approx(want, rel=1e-12)
    assert gemm_time_s(device, m, n, k) == pytest.approx(2 * m * n * k / (50 * TFLOP))


@pytest.mark.parametrize(
    "recipe,bytes_per_element",
    [("delayed", 4.0), ("blockwise", 4.0), ("tensorwise", 6.0)],
)
def test_cast_reads_bf16_writes_fp8_and_its_transpose(recipe, bytes_per_element):
    """Read 2 bytes, write the FP8 byte and its transposed byte; current scaling (tensorwise)
    reads the tensor once more for its amax."""
    assert Precision.parse("fp8", recipe, False).cast_bytes_per_element == bytes_per_element
    assert Precision.parse("bf16", recipe, False).cast_bytes_per_element == 0.0


def test_fp8_weight_copies_are_two_bytes_per_block_linear_weight():
    """Resident bytes of a block = 2 x the weights of its FP8 GEMMs on the device (the router,
    norms and biases excluded); none with FP8 primary weights."""
    spec = make_spec(num_experts=4, top_k=2, activation="swiglu", bias=False, layers=2)
    problem = fp8_problem(spec)
    linears = attention_linears(spec) + mlp_linears(spec, moe=True)
    weights = sum(
        lin.params * (spec.num_experts if lin.split.startswith("e") else 1)
        for lin in linears
        if lin.fp8
    )
    shard = Shard(tp=1, ep=1, mbs=1)
    moe_ref = next(ref for ref in problem.model.chain if ref.moe)
    cost = problem.model.layer_cost(moe_ref, shard, problem.cluster.device)
    assert cost.resident_bytes == 2 * weights
    gathered = fp8_problem(spec, fp8_param_gather=True)
    cost = gathered.model.layer_cost(moe_ref, shard, gathered.cluster.device)
    assert cost.resident_bytes == 0.0


def test_fp8_saves_its_gemm_inputs_in_one_byte():
    """Stored activations shrink by (p - 1) bytes per element of every FP8 GEMM input."""
    spec = make_spec(dropout=False)
    bf16 = blocks_of(make_problem(spec, make_cluster(fanouts=(4,), **FP8_DEVICE)))[0]
    fp8 = blocks_of(fp8_problem(spec))[0]
    fp8_inputs = sum(e for e, _, is_input in block_tensors(spec, moe=False) if is_input)
    tokens = spec.seq_len
    saved = bf16.act_bytes[Recompute.SELECTIVE] - fp8.act_bytes[Recompute.SELECTIVE]
    assert saved == pytest.approx((2 - 1) * fp8_inputs * tokens, rel=1e-12)


def test_fp8_is_faster_but_less_than_twice_and_keeps_more_memory():
    """FP8 speeds up only the block GEMMs (attention core, head, elementwise work and
    communication stay), so the iteration speeds up by less than 2x; without FP8 primary
    weights the cached FP8 copies make the state larger (Megatron-LM #1237, TE #1429)."""
    spec = make_spec(hidden=512, ffn_hidden=2048, heads=8, seq_len=512, layers=4)
    bf16_problem = make_problem(spec, make_cluster(fanouts=(4,), **FP8_DEVICE))
    fp8 = fp8_problem(spec)
    plan = FixedPlanner(tp=1, pp=1, dp=4, microbatch_size=1)
    a = evaluate(bf16_problem, plan.solve(bf16_problem))
    b = evaluate(fp8, plan.solve(fp8))
    assert 1.0 < a.iteration_time_s / b.iteration_time_s < 2.0
    assert b.ranks[0].memory.weights_bytes > a.ranks[0].memory.weights_bytes


def test_fp8_param_gather_halves_the_weight_all_gather():
    """ZeRO-1 (distributed optimizer): gradients reduce-scatter in BF16, weights all-gather in
    one byte per parameter with FP8 primary weights."""
    spec = make_spec()
    plan = FixedPlanner(tp=1, pp=1, dp=4, microbatch_size=1, zero_stage=1)
    plain, gathered = fp8_problem(spec), fp8_problem(spec, fp8_param_gather=True)
    a = evaluate(plain, plan.solve(plain)).ranks[0].dp_sync_s
    b = evaluate(gathered, plan.solve(gathered)).ranks[0].dp_sync_s
    assert b < a


def test_fp8_on_a_device_without_fp8_is_one_line():
    with pytest.raises(UserError, match="has no FP8 tensor cores") as err:
        make_problem(make_spec(), make_cluster(fanouts=(4,)), precision="fp8")
    assert "\n" not in str(err.value)


def test_mxfp8_needs_blackwell():
    with pytest.raises(UserError, match="mxfp8 needs Blackwell"):
        fp8_problem(make_spec(), fp8_recipe="mxfp8")


@pytest.mark.parametrize(
    "train,match",
    [
        (dict(precision="fp16"), "training.precision='fp16'"),
        (dict(precision="fp8", fp8_recipe="per-row"), "training.fp8_recipe='per-row'"),
        (dict(fp8_param_gather=True), "fp8_param_gather=true needs training.precision=fp8"),
    ],
)
def test_bad_precision_options_are_one_line(train, match):
    with pytest.raises(UserError, match=match):
        make_problem(make_spec(), make_cluster(fanouts=(4,), **FP8_DEVICE), **train)


def test_recipes_are_megatrons_choices():
    assert {r.value for r in Fp8Recipe} == {"delayed", "tensorwise", "blockwise", "mxfp8"}
