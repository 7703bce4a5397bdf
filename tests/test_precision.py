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
from nest.app.config import build_device, load_preset
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
    "recipe,any_layout,bytes_per_element",
    [
        ("delayed", False, 2 + 1 + 1),
        ("tensorwise", False, 2 + 1 + 1 + 2),
        ("delayed", True, 2 + 1),
        ("tensorwise", True, 2 + 1 + 2),
        ("mxfp8", True, 2 + 2 * (1 + 1 / 32)),
        ("blockwise", False, 2 + 2 * (1 + 4 / 128)),
        ("blockwise", True, 2 + 2 * (1 + 4 / 128)),
    ],
)
def test_cast_writes_the_copies_transformer_engine_writes(recipe, any_layout, bytes_per_element):
    """Transformer Engine's quantizers (github:NVIDIA/TransformerEngine v2.2 c55e425,
    ``pytorch/csrc/extensions/quantizer.cpp``: ``create_transpose = columnwise_usage &&
    !non_tn_fp8_gemm_supported()``; ``pytorch/tensor/mxfp8_tensor.py``; v2.3 5de3e14
    ``float8_blockwise_tensor.py``): read the BF16 tensor (2 bytes), write the FP8 byte, its
    transposed byte only where FP8 GEMMs are TN-only (Hopper; not on Blackwell); MXFP8 a
    row-wise and a column-wise byte each with one E8M0 scale byte per 32 elements, blockwise
    the same with one fp32 scale per 128; current scaling (tensorwise) reads the tensor once
    more for its amax."""
    fp8 = Precision.parse("fp8", recipe, False)
    assert fp8.cast_bytes_per_element(any_layout) == pytest.approx(bytes_per_element, rel=1e-12)
    assert Precision.parse("bf16", recipe, False).cast_bytes_per_element(any_layout) == 0.0
    # the once-per-iteration weight cast is the same quantisation, current scaling's amax read
    # included (TE@d0067d0 transformer_engine/pytorch/csrc/quantizer.cpp l. 1009-1028 computes
    # the amax before every current-scaling quantisation): 6 / 5 bytes, not 4 / 3
    assert fp8.weight_cast_bytes_per_param(any_layout) == pytest.approx(bytes_per_element)
    assert Precision.parse("bf16", recipe, False).weight_cast_bytes_per_param(any_layout) == 0.0


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_blackwell_casts_skip_the_transpose(recipe):
    """Worked example, a dense GELU block (h 128, ffn 512, 8 heads, seq 64, microbatch 1, tp 1)
    on a device streaming 1000 GB/s: the forward casts the inputs no norm produced (the
    attention projection's, 64 x 128, and FC2's, 64 x 512: 40,960 elements), the backward every
    output gradient (QKV 64 x 384, projection 64 x 128, FC1 64 x 512, FC2 64 x 128: 73,728).
    Where FP8 GEMMs take any layout (Blackwell) each cast writes one byte less (no transpose),
    so the block is 40,960 and 73,728 bytes / 1e12 B/s faster, and its cached FP8 weight
    copies take one byte per weight instead of two; the GEMMs are unchanged."""
    spec = make_spec(dropout=False)
    hopper = make_cluster(fanouts=(4,), **FP8_DEVICE)
    blackwell = make_cluster(fanouts=(4,), fp8_any_layout=True, **FP8_DEVICE)
    a = blocks_of(make_problem(spec, hopper, precision="fp8", fp8_recipe=recipe))[0]
    b = blocks_of(make_problem(spec, blackwell, precision="fp8", fp8_recipe=recipe))[0]
    bw = 1000e9
    assert a.fwd_s - b.fwd_s == pytest.approx(64 * (128 + 512) / bw, rel=1e-9)
    assert a.bwd_s - b.bwd_s == pytest.approx(64 * (384 + 128 + 512 + 128) / bw, rel=1e-9)
    assert a.wgrad_s == b.wgrad_s
    assert b.resident_bytes == pytest.approx(a.resident_bytes / 2, rel=1e-12)


def test_mxfp8_with_fp8_primary_weights_gathers_bf16():
    """Megatron-Core (github:NVIDIA/Megatron-LM@0d8e071, ``param_and_grad_buffer.py``) gathers
    MXFP8 weights into a bf16 view of the gradient buffer and quantises after the gather, so
    ``--fp8-param-gather`` saves the all-gather's bytes only for the per-tensor and blockwise
    recipes."""
    assert Precision.parse("fp8", "mxfp8", True).gathered_param_bytes is None
    assert Precision.parse("fp8", "delayed", True).gathered_param_bytes == 1.0
    assert Precision.parse("fp8", "blockwise", True).gathered_param_bytes == 1.0
    assert Precision.parse("fp8", "mxfp8", False).gathered_param_bytes is None


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
    assert Precision.parse("fp8", "delayed", False).weight_cache_bytes_per_param() == 2.0
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


@pytest.mark.parametrize(
    "preset,any_layout",
    [("h100_sxm", False), ("h200_sxm", False), ("b200", True), ("gb200", True)],
)
def test_presets_state_whether_fp8_gemms_take_any_layout(preset, any_layout):
    """Transformer Engine's ``non_tn_fp8_gemm_supported``: compute capability 10.0 and up
    (Blackwell B200 / GB200), not Hopper (9.0)."""
    assert build_device(load_preset("device", preset)).fp8_any_layout is any_layout
