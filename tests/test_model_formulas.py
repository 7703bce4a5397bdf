"""Published numbers reproduced by the model layer chain (each test names its source)."""

import pytest

from nest.app.config import build_model_spec
from nest.core.axes import LayerKind, Recompute
from nest.core.layers import AnalyticModel, Shard, unfused_core_bytes_per_score
from nest.core.model import ModelSpec

from .conftest import make_device

CONF_MODEL = __import__("pathlib").Path(__file__).parents[1] / "conf" / "model"


def preset(name: str) -> ModelSpec:
    import yaml

    data = yaml.safe_load((CONF_MODEL / f"{name}.yaml").read_text())
    data.pop("defaults", None)
    return build_model_spec(data)


# (preset, published parameter count, source)
PUBLISHED_PARAMS = [
    ("bert_large", 336e6, "Hugging Face google-bert/bert-large-uncased model card: 336M"),
    ("gpt3_175b", 175.0e9, "Brown et al. 2020, Table 2.1: 175.0B"),
    ("llama2_7b", 6.74e9, "Hugging Face meta-llama/Llama-2-7b-hf: 6.74B"),
    ("llama3_70b", 70.6e9, "Hugging Face meta-llama/Meta-Llama-3-70B: 70.6B"),
    ("llama3_405b", 405.9e9, "Hugging Face meta-llama/Llama-3.1-405B (8 KV heads): 406B"),
    ("mixtral_8x7b", 46.7e9, "Mistral AI, 'Mixtral of experts' (2023): 46.7B total"),
]


@pytest.mark.parametrize(("name", "published", "source"), PUBLISHED_PARAMS)
def test_preset_parameter_counts_within_one_percent(name, published, source):
    count = AnalyticModel(preset(name)).total_params()
    assert count == pytest.approx(published, rel=0.01), source


def test_exact_parameter_counts_from_configs():
    """Exact counts from the Hugging Face configs (embedding + blocks + head, untied)."""
    assert AnalyticModel(preset("llama2_7b")).total_params() == 6_738_415_616
    assert AnalyticModel(preset("llama3_70b")).total_params() == 70_553_706_496
    assert AnalyticModel(preset("mixtral_8x7b")).total_params() == 46_702_792_704
    assert AnalyticModel(preset("llama3_405b")).total_params() == 405_853_388_800
    # transformers' BertForPreTraining (MLM transform + decoder bias, pooler, NSP head)
    assert AnalyticModel(preset("bert_large")).total_params() == 336_226_108


def test_mixtral_active_parameters():
    """Mixtral routes each token to 2 of 8 experts: 12.9B active (Mistral AI, 2023)."""
    spec = preset("mixtral_8x7b")
    model = AnalyticModel(spec)
    expert = 3 * spec.hidden * spec.ffn_hidden
    active = model.total_params() - spec.layers * (spec.num_experts - spec.top_k) * expert
    assert active == pytest.approx(12.9e9, rel=0.01)


def test_embedding_and_head_are_separate_layers():
    """The head is one layer of its own, never copied into the blocks (docs/nest_paper.md §4.3)."""
    model = AnalyticModel(preset("llama2_7b"))
    kinds = [ref.kind for ref in model.chain]
    assert kinds[0] is LayerKind.EMBEDDING and kinds[-1] is LayerKind.HEAD
    assert kinds.count(LayerKind.HEAD) == 1 and len(kinds) == 32 + 2
    block = model.param_count(model.chain[1])
    assert block == 202_383_360  # 4 h^2 + 3 h F + 2 h (RMSNorm weights), no head inside


def gpt3_sc21() -> ModelSpec:
    """GPT-3 175B as in SC21 (Narayanan et al.): V = 51200 (padded), s = 2048."""
    return ModelSpec(
        name="gpt3_sc21",
        hidden=12288,
        layers=96,
        heads=96,
        ffn_hidden=4 * 12288,
        vocab=51200,
        seq_len=2048,
        dropout=True,
        tied_embeddings=True,
    )


def test_gpt3_flops_per_iteration_sc21():
    """Narayanan et al. SC21, Appendix eq. (3): with activation recomputation an iteration takes
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` FLOPs (blocks run 4 passes, the logit layer 3);
    without it ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``. B = 1536 as in §5.1."""
    spec = gpt3_sc21()
    model = AnalyticModel(spec)
    B, s, l, h, V = 1536, spec.seq_len, spec.layers, spec.hidden, spec.vocab  # noqa: E741
    dev = make_device()
    shard = Shard(tp=1, cp=1, mbs=1)
    block = model.layer_cost(model.chain[1], shard, dev).fwd_flops
    head = model.layer_cost(model.chain[-1], shard, dev).fwd_flops
    with_recompute = B * (4 * l * block + 3 * head)
    expected = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert with_recompute == pytest.approx(expected, rel=1e-12)
    no_recompute = 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert model.model_flops_per_sample() * B == pytest.approx(no_recompute, rel=1e-12)
    # Full recompute costs exactly one more forward of each block, in FLOPs and in seconds.
    cost = model.layer_cost(model.chain[1], shard, dev)
    assert cost.recompute_flops[Recompute.FULL] == block
    assert cost.recompute_s[Recompute.FULL] == pytest.approx(cost.fwd_s, rel=1e-12)


def test_gpt3_training_days_sc21():
    """SC21 §5.1: GPT-3 175B on 1024 A100s at 140 TFLOP/s per GPU trains on 300B tokens in
    about 34 days (their eq. (4), counting recomputation)."""
    spec = gpt3_sc21()
    model = AnalyticModel(spec)
    dev = make_device()
    shard = Shard()
    per_seq = 4 * spec.layers * model.layer_cost(model.chain[1], shard, dev).fwd_flops + 3 * (
        model.layer_cost(model.chain[-1], shard, dev).fwd_flops
    )
    seconds = 300e9 / spec.seq_len * per_seq / (1024 * 140e12)
    assert seconds / 86400 == pytest.approx(34, abs=1)


def gpt_block_act(t: int, sp: bool, mode: Recompute, b: int = 1) -> float:
    model = AnalyticModel(gpt3_sc21(), flash_attention=False)
    return model.layer_cost(model.chain[1], Shard(tp=t, sp=sp, mbs=b), make_device()).act_bytes[
        mode
    ]


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_activation_formulas(t):
    """Korthikanti et al. 2022 (arXiv 2205.05198), Table 2, bytes per layer (GPT-style block,
    16-bit activations, 1-byte dropout masks): no parallelism ``sbh(34 + 5as/h)``; tensor
    parallel ``sbh(10 + 24/t + 5as/(ht))``; + sequence parallel ``sbh/t (34 + 5as/h)``; selective
    recompute ``sbh(10 + 24/t)`` and with SP ``34 sbh/t``; full recompute ``2 sbh``."""
    spec = gpt3_sc21()
    s, b, h, a = spec.seq_len, 2, spec.hidden, spec.heads
    sbh = s * b * h
    core = 5 * a * s / h
    assert gpt_block_act(t, False, Recompute.NONE, b) == pytest.approx(
        sbh * (10 + 24 / t + core / t)
    )
    assert gpt_block_act(t, True, Recompute.NONE, b) == pytest.approx(sbh / t * (34 + core))
    assert gpt_block_act(t, False, Recompute.SELECTIVE, b) == pytest.approx(sbh * (10 + 24 / t))
    assert gpt_block_act(t, True, Recompute.SELECTIVE, b) == pytest.approx(34 * sbh / t)
    assert gpt_block_act(t, False, Recompute.FULL, b) == pytest.approx(2 * sbh)
    if t == 1:
        assert gpt_block_act(1, False, Recompute.NONE, b) == pytest.approx(sbh * (34 + core))


def test_korthikanti_gpt3_selective_numbers():
    """Korthikanti et al. §5: for GPT-3, 5as/h = 80 and selective recompute saves 70% of the
    activation memory for 2.7% extra FLOPs (the attention core's share of a block's forward)."""
    spec = gpt3_sc21()
    assert 5 * spec.heads * spec.seq_len / spec.hidden == 80
    saved = 1 - gpt_block_act(8, True, Recompute.SELECTIVE) / gpt_block_act(8, True, Recompute.NONE)
    assert saved == pytest.approx(0.70, abs=0.005)
    model = AnalyticModel(spec, flash_attention=False)
    cost = model.layer_cost(model.chain[1], Shard(tp=8, sp=True), make_device())
    ratio = cost.recompute_flops[Recompute.SELECTIVE] / cost.fwd_flops
    assert ratio == pytest.approx(0.027, abs=0.0005)


def test_flash_attention_drops_the_score_matrix():
    """With FlashAttention the stored core is the fp32 log-sum-exp (4 a s b bytes), so the
    no-recompute inventory equals the selective one plus that."""
    spec = gpt3_sc21()
    model = AnalyticModel(spec, flash_attention=True)
    cost = model.layer_cost(model.chain[1], Shard(tp=8, sp=True), make_device())
    lse = 4 * spec.heads * spec.seq_len / 8
    assert cost.act_bytes[Recompute.NONE] == pytest.approx(
        cost.act_bytes[Recompute.SELECTIVE] + lse
    )


def test_gqa_and_swiglu_change_the_inventory_as_derived():
    """Llama-style block (no dropout, SwiGLU, GQA), no parallelism, selective recompute:
    norms 4sbh, Q 2sbh, K and V 2 * 2 s b g d, out-proj input 2sbh, SwiGLU 3 * 2 s b F."""
    spec = preset("llama3_70b")
    model = AnalyticModel(spec, flash_attention=False)
    s, h, F, kvd = spec.seq_len, spec.hidden, spec.ffn_hidden, spec.kv_dim
    got = model.layer_cost(model.chain[1], Shard(), make_device()).act_bytes[Recompute.SELECTIVE]
    assert got == 8 * s * h + 2 * s * h + 4 * s * kvd + 2 * s * h + 6 * s * F


def test_moe_block_params_and_flops():
    """A MoE block holds all E experts but computes top_k of them per token."""
    spec = preset("mixtral_8x7b")
    model = AnalyticModel(spec)
    dev = make_device()
    ref = model.chain[1]
    assert ref.moe
    one = model.layer_cost(ref, Shard(ep=1), dev)
    split = model.layer_cost(ref, Shard(ep=4), dev)
    assert split.expert_params == pytest.approx(one.expert_params / 4)
    assert split.fwd_flops == one.fwd_flops  # experts are split, the work per token is not
    mlp_flops = 2 * spec.seq_len * spec.hidden * spec.ffn_hidden * 3 * spec.top_k
    dense = ModelSpec(**{**spec_kwargs(spec), "num_experts": 1, "top_k": 1})
    dense_model = AnalyticModel(dense)
    dense_flops = dense_model.layer_cost(dense_model.chain[1], Shard(), dev).fwd_flops
    assert one.fwd_flops - dense_flops == pytest.approx(mlp_flops / spec.top_k * (spec.top_k - 1))


def spec_kwargs(spec: ModelSpec) -> dict:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


def test_tensor_parallel_shards_parameters_and_flops():
    spec = preset("llama2_7b")
    model = AnalyticModel(spec)
    dev = make_device()
    one = model.layer_cost(model.chain[1], Shard(tp=1), dev)
    eight = model.layer_cost(model.chain[1], Shard(tp=8), dev)
    norms = 2 * spec.hidden  # RMSNorm weights are replicated
    assert eight.dense_params == pytest.approx((one.dense_params - norms) / 8 + norms)
    assert eight.fwd_flops == pytest.approx(one.fwd_flops / 8)
    assert one.fwd_collectives == () and one.bwd_collectives == ()
    assert len(eight.fwd_collectives) == 2  # two all-reduces (attention, MLP) without SP


def test_elementwise_time_is_the_roofline_of_the_listed_operators():
    """Forward time of a GPT block (no TP, no FlashAttention): matmul FLOPs at the achieved rate
    plus HBM traffic of norms and residual adds ``10 p sbh``, two hidden dropouts
    ``2 (2p+1) sbh``, GeLU ``2 p sbF``, Megatron's causal fused softmax ``(p/2 + p) a s^2 b``
    (it loads the lower triangle and writes whole rows,
    ``megatron/fused_kernels/scaled_upper_triang_masked_softmax.h`` at 83c4d95a) and its dropout
    ``(2p + 1) a s^2 b`` (PyTorch ``fused_dropout``: read, write, uint8 mask). The backward is
    twice the forward except the core's softmax and dropout, which move their own bytes: the
    softmax backward loads the gradient and the output on the lower triangle and writes whole
    rows ``(p + p) a s^2 b``, the dropout backward (``masked_scale``) ``(2p + 1) a s^2 b``."""
    spec = ModelSpec(
        name="g",
        hidden=256,
        layers=2,
        heads=8,
        ffn_hidden=1024,
        vocab=512,
        seq_len=128,
        dropout=True,
    )
    model = AnalyticModel(spec, flash_attention=False)
    dev = make_device()
    cost = model.layer_cost(model.chain[1], Shard(), dev)
    s, h, F, a, p = 128, 256, 1024, 8, 2
    block = 10 * p * s * h + 2 * (2 * p + 1) * s * h + 2 * p * s * F
    core_fwd = (p / 2 + p + 2 * p + 1) * a * s * s
    core_bwd = (p + p + 2 * p + 1) * a * s * s
    gemm_s = cost.fwd_flops / dev.achieved_flops_per_s
    bw = dev.hbm_bw_bytes_per_s
    assert cost.fwd_s == pytest.approx(gemm_s + (block + core_fwd) / bw, rel=1e-12)
    assert cost.bwd_s == pytest.approx(2 * gemm_s + (2 * block + core_bwd) / bw, rel=1e-12)


def test_unfused_softmax_reads_whole_rows_without_a_causal_mask():
    """Megatron's softmax for any other mask (``scaled_masked_softmax``, an encoder's) loads the
    whole score row, so against the causal kernel the encoder's core moves ``p / 2`` more bytes
    per score element forward and ``p`` more backward (the gradient and the output on the other
    half); without dropout no ``2p + 1`` (``unfused_core_bytes_per_score``)."""
    p = 2
    assert unfused_core_bytes_per_score(p, False, 0.5) == (1.5 * p, 2 * p)
    assert unfused_core_bytes_per_score(p, False, 1.0) == (2 * p, 3 * p)
    assert unfused_core_bytes_per_score(p, True, 1.0) == (4 * p + 1, 5 * p + 1)
    kw = dict(name="e", hidden=256, layers=2, heads=8, ffn_hidden=1024, vocab=512, seq_len=128)
    dev = make_device()
    seconds = {}
    for encoder in (False, True):
        model = AnalyticModel(ModelSpec(**kw, encoder=encoder), flash_attention=False)
        cost = model.layer_cost(model.chain[1], Shard(), dev)
        seconds[encoder] = (cost.fwd_s, cost.bwd_s)
    elems = 8 * 128 * 128
    bw = dev.hbm_bw_bytes_per_s
    assert seconds[True][0] - seconds[False][0] == pytest.approx(p / 2 * elems / bw, rel=1e-9)
    assert seconds[True][1] - seconds[False][1] == pytest.approx(p * elems / bw, rel=1e-9)
