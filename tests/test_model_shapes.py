"""The block kinds of 2026 models, each checked against its published definition.

- Multi-head latent attention: DeepSeek-AI, "DeepSeek-V2", arXiv 2405.04434, §2.1.2-2.1.3,
  equations (9)-(19): the projection matrices W^DQ, W^UQ, W^QR, W^DKV, W^UK, W^UV, W^KR, W^O.
- Sliding windows: MaxText's ``calculate_tflops_training_per_device`` counts a causal sliding
  window ``w`` as ``s w - w^2 / 2`` scores per head (the exact banded count); a global causal
  block as ``s^2 / 2``.
- Which blocks are MoE: Hugging Face transformers' Llama 4 (``moe_layers = range(step - 1, L,
  step)``) and DeepSeek-V3 (``first_k_dense_replace``).
- The FLOPs of a MoE block with shared experts and of an MTP module: Megatron-LM's
  ``num_floating_point_operations`` (routed ``top_k`` experts plus the shared ones; an MTP module
  is a block, the ``2h -> h`` projection and the logits again).
- DeepSeek's 250 GFLOP per token for DeepSeek-V3 at 4,096 tokens (Zhao et al., "Insights into
  DeepSeek-V3", ISCA 2025, Table 2), which is the causal count without the MTP module.
"""

import pytest

from nest.core.axes import LayerKind
from nest.core.errors import UserError
from nest.core.layers import AnalyticModel, Shard
from nest.core.model import ModelSpec

from .conftest import make_device, make_spec

DSV3 = dict(
    name="dsv3",
    hidden=7168,
    layers=61,
    heads=128,
    ffn_hidden=18432,
    vocab=129280,
    seq_len=4096,
    activation="swiglu",
    norm="rmsnorm",
    bias=False,
    position="rope",
    attention="mla",
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    num_experts=256,
    top_k=8,
    moe_ffn_hidden=2048,
    shared_experts=1,
    first_dense_layers=3,
    mtp_layers=1,
)


def block(model: AnalyticModel, moe: bool, local: bool = False):
    return next(
        ref
        for ref in model.chain
        if ref.kind is LayerKind.BLOCK and ref.moe == moe and ref.local == local
    )


def test_mla_parameters_are_deepseek_v2s_matrices():
    """DeepSeek-V2 eq. (9)-(19) with DeepSeek-V3's sizes: d = 7168, n_h = 128, d_h = 128,
    d_h^R = 64, d_c = 512, d_c' = 1536; plus the two latent RMSNorms (d_c' + d_c) and the block's
    two RMSNorms (2d). A dense block adds its SwiGLU MLP (3 d F)."""
    d, n, dh, dr, dc, dq, f = 7168, 128, 128, 64, 512, 1536, 18432
    attention = (
        dq * d  # W^DQ
        + dh * n * dq  # W^UQ
        + dr * n * dq  # W^QR
        + dc * d  # W^DKV
        + dh * n * dc  # W^UK
        + dh * n * dc  # W^UV
        + dr * d  # W^KR (the shared rotary key)
        + d * dh * n  # W^O
    )
    model = AnalyticModel(ModelSpec(**DSV3))
    want = attention + dq + dc + 2 * d + 3 * d * f
    assert model.param_count(block(model, moe=False)) == want


def test_gqa_head_dim_need_not_be_hidden_over_heads():
    """Qwen3-32B's attention: hidden 5120, 64 query heads and 8 KV heads of 128: Q is 8192
    wide, K and V 1024 each, the output projection 8192 -> 5120; Q/K norms are 128 each."""
    spec = make_spec(
        hidden=5120, heads=64, kv_heads=8, head_dim=128, ffn_hidden=64, bias=False, qk_norm=True
    )
    model = AnalyticModel(spec)
    h, q, kv = 5120, 64 * 128, 8 * 128
    mlp = 2 * h * 64
    norms = 2 * 2 * h + 2 * 128  # two LayerNorms (weight and bias), Q and K norms
    assert model.param_count(block(model, moe=False)) == h * (q + 2 * kv) + q * h + mlp + norms


def test_hidden_not_divisible_by_heads_needs_head_dim():
    with pytest.raises(UserError, match="set head_dim"):
        make_spec(hidden=100, heads=8)


def test_sliding_window_causal_count_is_maxtexts_banded_count():
    """FLOPs a causal kernel computes for one sliding-window block: counted minus skipped is
    MaxText's ``4 (s w - w^2 / 2) a d`` per sequence forward (x3 with the backward)."""
    s, w, a, d = 4096, 128, 8, 16
    spec = make_spec(
        layers=2, heads=a, hidden=a * d, seq_len=s, window=w, global_every=0, encoder=False
    )
    model = AnalyticModel(spec)
    counted = model.attention_score_flops_per_sample()
    skipped = model.causal_skipped_flops_per_sample()
    assert counted == pytest.approx(2 * 3 * 4 * s * w * a * d, rel=1e-12)
    assert counted - skipped == pytest.approx(2 * 3 * 4 * (s * w - w * w / 2) * a * d, rel=1e-12)


def test_chunked_attention_counts_its_chunk_and_halves_it():
    s, c = 4096, 512
    model = AnalyticModel(
        make_spec(layers=4, seq_len=s, window=c, local_attention="chunked", global_every=4)
    )
    locals_ = [ref.local for ref in model.chain if ref.kind is LayerKind.BLOCK]
    assert locals_ == [True, True, True, False]  # Llama 4: every 4th block global
    h = model.spec.hidden
    counted = model.attention_score_flops_per_sample()
    assert counted == pytest.approx(3 * 4 * s * h * (3 * c + s), rel=1e-12)
    assert model.causal_skipped_flops_per_sample() == pytest.approx(counted / 2, rel=1e-12)


@pytest.mark.parametrize("layers,step", [(48, 2), (48, 1), (12, 3)])
def test_moe_every_nth_block_is_llama4s_interleave(layers, step):
    spec = make_spec(layers=layers, num_experts=4, moe_layer_freq=step, moe_layer_phase=step - 1)
    moe = [i for i in range(layers) if spec.block_is_moe(i)]
    assert moe == list(range(step - 1, layers, step))


def test_first_dense_blocks_are_deepseeks_first_k_dense_replace():
    spec = ModelSpec(**DSV3)
    assert [spec.block_is_moe(i) for i in range(5)] == [False, False, False, True, True]
    assert sum(spec.block_is_moe(i) for i in range(spec.layers)) == 58


def test_moe_block_flops_run_top_k_routed_and_the_shared_experts():
    """Megatron-LM: a MoE block's MLP is ``2 x 3 h (top_k F_e + F_s)`` FLOPs per token forward
    (gated), the router left out."""
    h, fe, fs, k = 128, 64, 96, 2
    spec = make_spec(
        hidden=h,
        num_experts=4,
        top_k=k,
        moe_ffn_hidden=fe,
        shared_experts=1,
        shared_ffn_hidden=fs,
        activation="swiglu",
    )
    dense = AnalyticModel(make_spec(hidden=h, ffn_hidden=1, activation="swiglu"))
    model = AnalyticModel(spec)
    tokens, vocab = 10, 1000
    moe_flops = model._fwd_flops(block(model, moe=True), tokens, vocab)
    attention = dense._fwd_flops(block(dense, moe=False), tokens, vocab) - 2 * tokens * 3 * h
    assert moe_flops - attention == pytest.approx(2 * tokens * 3 * h * (k * fe + fs), rel=1e-12)


def test_mtp_module_is_a_block_a_projection_and_the_logits_again():
    spec = make_spec(mtp_layers=1)
    model, plain = AnalyticModel(spec), AnalyticModel(make_spec())
    head = next(ref for ref in model.chain if ref.kind is LayerKind.HEAD)
    tokens, vocab, h = 64, 1000, spec.hidden
    extra = model._fwd_flops(head, tokens, vocab) - plain._fwd_flops(head, tokens, vocab)
    blk = plain._fwd_flops(block(plain, moe=False), tokens, vocab)
    assert extra == pytest.approx(blk + 2 * tokens * 2 * h * h + 2 * tokens * h * vocab)
    # its parameters: two norms, the projection and a block (the embedding and head are shared)
    assert model.mtp_params() == 2 * 2 * h + 2 * h * h + plain.param_count(block(plain, False))
    assert model.model_stats()["params_total"] == plain.total_params()


def test_deepseek_v3_causal_flops_per_token_are_deepseeks_250_gflop():
    """Insights into DeepSeek-V3 (ISCA 2025) Table 2: 250 GFLOP per token at 4,096 tokens;
    that is the causal count (half the scores) without the MTP module, router left out."""
    spec = ModelSpec(**{**DSV3, "mtp_layers": 0})
    model = AnalyticModel(spec)
    causal = model.model_flops_per_sample() - model.causal_skipped_flops_per_sample()
    assert causal / spec.seq_len == pytest.approx(250e9, rel=0.01)


def test_mla_under_sequence_parallelism_gathers_its_latents():
    """Megatron-Core runs MLA's down-projections on the sequence-parallel shard and all-gathers
    their outputs: the attention's all-gather carries q_lora + kv_lora + rope wide rows, not the
    hidden state."""
    spec = ModelSpec(
        **{**DSV3, "layers": 4, "num_experts": 1, "top_k": 1, "shared_experts": 0, "mtp_layers": 0}
    )
    model = AnalyticModel(spec)
    shard = Shard(tp=8, sp=True, mbs=1)
    cost = model.layer_cost(block(model, moe=False), shard, make_device())
    gathers = [c.n_bytes for c in cost.fwd_collectives if c.op == "all_gather"]
    tokens = spec.seq_len
    assert sorted(gathers) == sorted([2 * tokens * (1536 + 512 + 64), 2 * tokens * 7168])


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(attention="mla"), "attention=mla needs kv_lora_rank"),
        (dict(window=128), "global_every=1 makes every block global"),
        (dict(num_experts=4, first_dense_layers=4), "no block is MoE"),
        (dict(shared_experts=1), "needs num_experts > 1"),
        (dict(num_experts=4, moe_layer_freq=2, moe_layer_phase=2), "moe_layer_phase=2"),
        (dict(local_attention="ring"), "local_attention='ring'"),
    ],
)
def test_inexpressible_shapes_are_one_line_errors(over, match):
    with pytest.raises(UserError, match=match) as err:
        make_spec(**over)
    assert "\n" not in str(err.value)
