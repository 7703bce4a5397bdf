"""Overheads that small models pay (issue 22, item 3): the cross-entropy loss over the logits and
the word embedding's dense gradient, memory-bound kernels at the device's *achieved* HBM bandwidth
plus the fixed per-kernel time (:data:`nest.core.layers.LOSS_STREAM`,
:data:`nest.core.layers.EMBEDDING_GRAD_ACCUMULATE_BYTES_PER_WEIGHT`).

The worked example is the Megatron-LM README's smallest weak-scaling model (GPT 1.7B: hidden
2048, 24 layers, vocabulary 131,072, sequence 4096, microbatch 1) on the H100 preset, whose
achieved bandwidth is the cited device-to-device copy (2,903 GB/s of 3,350: 86.7 %)."""

from pathlib import Path

import pytest
import yaml

from nest.app.config import build_device
from nest.core.axes import LayerKind
from nest.core.errors import UserError
from nest.core.kernels import gemm_time_s
from nest.core.layers import (
    EMBEDDING_GRAD_ACCUMULATE_BYTES_PER_WEIGHT,
    LOSS_STREAM,
    UNFUSED_MEGATRON_LOSS_STREAM,
    AnalyticModel,
    Shard,
    padded_vocab,
)
from nest.core.problem import Problem

from .conftest import make_problem, make_spec

CONF = Path(__file__).resolve().parents[1] / "conf"


def h100():
    data = yaml.safe_load((CONF / "device" / "h100_sxm.yaml").read_text())
    data.pop("defaults", None)
    return build_device(data)


def gpt_1p7b(fused_loss: bool = True, ce_fusion: bool = True) -> AnalyticModel:
    spec = make_spec(
        hidden=2048, layers=24, heads=16, ffn_hidden=8192, vocab=131072, seq_len=4096,
        activation="gelu", dropout=False,
    )  # fmt: skip
    return AnalyticModel(
        spec, flash_attention=True, fused_loss=fused_loss, cross_entropy_loss_fusion=ce_fusion
    )


def layer(model: AnalyticModel, kind: LayerKind, shard: Shard, device):
    ref = next(r for r in model.chain if r.kind is kind)
    return model.layer_cost(ref, shard, device)


def head_gemm_s(model: AnalyticModel, shard: Shard, device) -> tuple[float, float]:
    """The LM head's GEMM alone, forward and backward (data and weight gradients)."""
    tokens, h = shard.mbs * model.spec.seq_len, model.spec.hidden
    n = padded_vocab(model.spec.vocab, shard.tp) / shard.tp
    fwd = gemm_time_s(device, tokens, n, h)
    bwd = gemm_time_s(device, tokens, h, n) + gemm_time_s(device, h, n, tokens)
    return fwd, bwd


def test_the_achieved_bandwidth_is_the_cited_copy_rate():
    assert h100().achieved_hbm_bw_bytes_per_s == pytest.approx(0.867 * 3350e9)


def test_gpt_1p7b_loss_worked_example():
    """4096 x 131,072 = 536,870,912 logits per microbatch. Megatron-Core's fused cross entropy
    moves 26 bytes per logit in 4 kernels forward and 14 bytes in 2 backward (LOSS_STREAM's
    operator list): at 2,904.45 GB/s that is 4.806 ms + 12.8 us forward and 2.588 ms + 6.4 us
    backward, on top of the head's GEMM (3.5 ms forward): the loss takes over twice the logits
    GEMM's forward time, which is why a 131k vocabulary weighs on a 1.7B model."""
    device, model = h100(), gpt_1p7b()
    shard = Shard(mbs=1)
    head = layer(model, LayerKind.HEAD, shard, device)
    gemm_fwd, gemm_bwd = head_gemm_s(model, shard, device)
    assert head.fwd_s - gemm_fwd == pytest.approx(4.806e-3 + 12.8e-6, rel=1e-3)
    assert head.bwd_s - gemm_bwd == pytest.approx(2.588e-3 + 6.4e-6, rel=1e-3)
    assert (head.fwd_s + head.bwd_s - gemm_fwd - gemm_bwd) / gemm_fwd > 2.0


def test_loss_streams_follow_the_operator_lists():
    """Megatron-Core fused: cast+max 6, exp 8, sum 4, div 8; backward scale 8, cast 6.
    torchtitan: cast 6, log_softmax 8; backward nll zero-fill 4, log_softmax_backward 12, cast 6."""
    assert LOSS_STREAM[True] == ((6 + 8 + 4 + 8, 4), (8 + 6, 2))
    assert LOSS_STREAM[False] == ((6 + 8, 3), (4 + 12 + 6, 3))


def test_unfused_megatron_loss_follows_its_operator_list():
    """Megatron-LM@1e057005 ``tensor_parallel/cross_entropy.py`` without
    ``--cross-entropy-loss-fusion``: cast 6, max 4, subtract 8, exp 8, sum 4, div 8 in six
    kernels; backward as the fused path's (scale 8, cast 6): the forward's separate cast, max and
    subtraction add 12 bytes and 2 kernels per logit over the fused one, the backward none."""
    assert UNFUSED_MEGATRON_LOSS_STREAM == ((6 + 4 + 8 + 8 + 4 + 8, 6), (8 + 6, 2))
    (ufb, ufk), unfused_bwd = UNFUSED_MEGATRON_LOSS_STREAM
    (fb, fk), fused_bwd = LOSS_STREAM[True]
    assert (ufb - fb, ufk - fk) == (12, 2)
    assert unfused_bwd == fused_bwd


@pytest.mark.parametrize("tp", [1, 2])
def test_unfused_megatron_loss_costs_twelve_bytes_per_logit_more_in_the_forward(tp):
    """GPT 1.7B at microbatch 1: ``4096 x 131,072 / tp`` logits per device. Without the fusion
    the head's forward takes ``12 bytes x logits / achieved HBM`` and two kernels' fixed time
    longer (2.218 ms + 6.4 us at tp 1); its backward and its memory do not change. Without
    ``fused_loss`` (torchtitan's ``F.cross_entropy``) the flag changes nothing."""
    device = h100()
    shard = Shard(tp=tp, mbs=1)
    fused = layer(gpt_1p7b(), LayerKind.HEAD, shard, device)
    unfused = layer(gpt_1p7b(ce_fusion=False), LayerKind.HEAD, shard, device)
    logits = 4096 * padded_vocab(131072, tp) / tp
    extra_s = logits * 12 / device.achieved_hbm_bw_bytes_per_s + 2 * device.kernel_overhead_s
    assert unfused.fwd_s - fused.fwd_s == pytest.approx(extra_s, rel=1e-9)
    if tp == 1:
        assert extra_s == pytest.approx(2.218e-3 + 6.4e-6, rel=1e-3)
    assert unfused.bwd_s == pytest.approx(fused.bwd_s, rel=1e-12)
    assert unfused.transient_bytes == fused.transient_bytes
    torch_fused = layer(gpt_1p7b(fused_loss=False), LayerKind.HEAD, shard, device)
    torch_unfused = layer(gpt_1p7b(False, ce_fusion=False), LayerKind.HEAD, shard, device)
    assert torch_unfused.fwd_s == torch_fused.fwd_s


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_loss_time_scales_with_the_logits_each_device_holds(fused, tp):
    """The loss's streamed bytes are per logit: twice the microbatch, twice the bytes; tensor
    parallelism splits the vocabulary, so each device streams 1/tp of them (the fixed
    per-kernel time stays)."""
    device, model = h100(), gpt_1p7b(fused)
    (fb, fk), (bb, bk) = LOSS_STREAM[fused]
    kernel_s = device.kernel_overhead_s
    for mbs in (1, 2):
        shard = Shard(tp=tp, mbs=mbs)
        head = layer(model, LayerKind.HEAD, shard, device)
        gemm_fwd, gemm_bwd = head_gemm_s(model, shard, device)
        logits = mbs * 4096 * padded_vocab(131072, tp) / tp
        bw = device.achieved_hbm_bw_bytes_per_s
        assert head.fwd_s - gemm_fwd == pytest.approx(logits * fb / bw + fk * kernel_s, rel=1e-9)
        assert head.bwd_s - gemm_bwd == pytest.approx(logits * bb / bw + bk * kernel_s, rel=1e-9)


def test_embedding_gradient_is_a_cost_of_the_vocabulary_not_of_the_tokens():
    """131,072 x 2048 weights x (2 + 10) bytes at 2,904.45 GB/s: 1.109 ms of the embedding's
    backward per microbatch plus two kernels, whatever the microbatch size; halved per device
    by tensor parallelism (the vocabulary is split)."""
    device, model = h100(), gpt_1p7b()
    assert EMBEDDING_GRAD_ACCUMULATE_BYTES_PER_WEIGHT == 2 + 4 + 4
    extra = {}
    for tp, mbs in ((1, 1), (1, 4), (2, 1)):
        emb = layer(model, LayerKind.EMBEDDING, Shard(tp=tp, mbs=mbs), device)
        extra[tp, mbs] = emb.bwd_s - 2.0 * emb.fwd_s - 2 * device.kernel_overhead_s
    assert extra[1, 1] == pytest.approx(1.109e-3, rel=1e-3)
    assert extra[1, 4] == pytest.approx(extra[1, 1], rel=1e-12)
    assert extra[2, 1] == pytest.approx(extra[1, 1] / 2, rel=1e-12)


@pytest.mark.parametrize("flag", ["fused_loss", "cross_entropy_loss_fusion"])
def test_a_model_built_with_other_loss_flags_than_training_is_refused(flag):
    """Bad input: the cost reads the model's loss flags and the Megatron export the training's;
    a problem whose two disagree is a one-line error naming the flag (as for the precision and
    the MoE dispatcher), not a plan scored on one loss and exported with the other."""
    problem = make_problem(make_spec())
    other = AnalyticModel(problem.model.spec, **{flag: not getattr(problem.training, flag)})
    with pytest.raises(UserError, match=f"built with {flag}="):
        Problem(model=other, cluster=problem.cluster, training=problem.training)
