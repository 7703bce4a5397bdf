"""MFU states its FLOP convention and gives the causal-aware figure next to the conventional one.

Worked example: Narayanan et al., SC21, §5.1 count a GPT block's forward as ``24 b s h^2 +
4 b s^2 h`` FLOPs and the logits as ``2 b s h V``; the training step is three forwards. The
``4 b s^2 h`` are the attention scores and their weighted sum, which a causal kernel computes half
of. So for ``L`` blocks the causal-aware MFU is the conventional one times
``1 - (L 4 s^2 h / 2) / (L (24 s h^2 + 4 s^2 h) + 2 s h V)``, recomputed here from the formula.
"""

import pytest

from baselines.fixed import FixedPlanner
from nest.app.config import build_device, load_preset
from nest.app.summary import format_summary
from nest.cost import evaluate
from nest.cost.mfu import FLOP_CONVENTION, causal_mfu

from .conftest import make_cluster, make_problem, make_spec
from .test_cli import run_case


def sc21_causal_fraction(layers: int, s: int, h: int, vocab: int) -> float:
    """The share of SC21's model FLOPs a causal run does usefully (module docstring)."""
    total = layers * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * vocab
    return 1 - (layers * 4 * s * s * h / 2) / total


@pytest.mark.parametrize("seq_len", [64, 1024, 8192])
def test_causal_mfu_is_sc21_with_half_the_attention_scores(seq_len):
    """A GPT-shaped model (MHA, GELU, F = 4h, untied head): the model's FLOPs are SC21's, and the
    causal figure discounts exactly half of the ``4 b s^2 h`` terms."""
    layers, h, vocab = 4, 128, 1000
    spec = make_spec(layers=layers, hidden=h, ffn_hidden=4 * h, vocab=vocab, seq_len=seq_len)
    problem = make_problem(spec, make_cluster(fanouts=(4,)), global_batch=8)
    per_sample = 3 * (
        layers * (24 * seq_len * h * h + 4 * seq_len**2 * h) + 2 * seq_len * h * vocab
    )
    assert problem.model.model_flops_per_sample() == pytest.approx(per_sample, rel=1e-12)
    report = evaluate(problem, FixedPlanner(tp=1, pp=1, dp=4, microbatch_size=1).solve(problem))
    want = report.mfu * sc21_causal_fraction(layers, seq_len, h, vocab)
    assert causal_mfu(problem, report) == pytest.approx(want, rel=1e-12)
    assert causal_mfu(problem, report) < report.mfu


def test_an_encoder_counts_all_its_attention():
    spec = make_spec(encoder=True, seq_len=512)
    problem = make_problem(spec, make_cluster(fanouts=(4,)), global_batch=8)
    report = evaluate(problem, FixedPlanner(tp=1, pp=1, dp=4, microbatch_size=1).solve(problem))
    assert causal_mfu(problem, report) == report.mfu


def test_the_summary_shows_both_where_they_differ():
    long = make_problem(
        make_spec(seq_len=8192), make_cluster(fanouts=(4,)), global_batch=8, flash=True
    )
    report = evaluate(long, FixedPlanner(tp=1, pp=1, dp=4, microbatch_size=1).solve(long))
    text = format_summary(long, FixedPlanner(tp=1, pp=1, dp=4).solve(long), report)
    causal = causal_mfu(long, report)
    assert f"MFU {100 * report.mfu:.1f} % (SC21/Megatron model FLOPs" in text
    assert f"{100 * causal:.1f} % counting only the unmasked causal attention scores" in text


def test_report_json_states_the_convention_and_the_causal_figure(tmp_path):
    _, result, report, _, lines = run_case(tmp_path, "solver=fixed", "model=tiny")
    assert report["flop_convention"] == FLOP_CONVENTION
    assert "SC21" in report["flop_convention"] and "in full" in report["flop_convention"]
    assert 0 < report["mfu_causal"] <= report["mfu"]
    assert any("SC21/Megatron model FLOPs" in line for line in lines)


def _fixed_report(problem):
    return evaluate(problem, FixedPlanner(tp=1, pp=1, dp=4, microbatch_size=1).solve(problem))


def test_a_plan_above_the_best_published_run_of_its_kind_says_so():
    """A dense model on an H100 preset at MFU above the best published dense H100 run (62.5 %,
    NVIDIA dgxc-benchmarking's Llama 3.1 8B on 8 H100) gets a note naming that run and why the
    model may be optimistic; on a
    device with no published reference, or below it, none."""
    from nest.cost.mfu import PUBLISHED_BEST, plausibility_note

    spec = make_spec(hidden=2048, ffn_hidden=8192, heads=16, seq_len=512, dropout=False)
    fast_hbm = dict(name="h100_sxm", hbm_bw_bytes_per_s=100e12, hbm_bytes=80 * 2**30)
    fast = make_problem(spec, make_cluster(fanouts=(4,), **fast_hbm), global_batch=64)
    report = _fixed_report(fast)
    dense = next(b for b in PUBLISHED_BEST if b.kind == "dense" and b.precision == "bf16")
    assert report.mfu > dense.mfu  # the toy device runs every FLOP at peak
    note = plausibility_note(fast, report)
    assert note is not None and f"{100 * dense.mfu:.1f} %" in note and "upper bound" in note
    other_hbm = {**fast_hbm, "name": "dev"}
    other = make_problem(spec, make_cluster(fanouts=(4,), **other_hbm), global_batch=64)
    assert plausibility_note(other, _fixed_report(other)) is None
    slow = make_problem(
        spec,
        make_cluster(fanouts=(4,), matmul_efficiency=0.2, **fast_hbm),
        global_batch=64,
    )
    slow_report = _fixed_report(slow)
    assert slow_report.mfu < dense.mfu
    assert plausibility_note(slow, slow_report) is None


def test_fine_grained_moe_is_judged_on_the_causal_count():
    """Published fine-grained MoE TFLOP/s come from Megatron-LM's causal count, so the note
    compares the causal-aware MFU."""
    from nest.cost.mfu import model_kind, plausibility_note

    spec = make_spec(
        hidden=2048, heads=16, num_experts=8, top_k=2, moe_ffn_hidden=1024, seq_len=512
    )
    fast_hbm = dict(name="h100_sxm", hbm_bw_bytes_per_s=100e12, hbm_bytes=80 * 2**30)
    problem = make_problem(spec, make_cluster(fanouts=(4,), **fast_hbm), global_batch=64)
    assert model_kind(problem) == "fine-grained MoE"
    report = _fixed_report(problem)
    note = plausibility_note(problem, report)
    assert note is not None and note.startswith(
        f"causal-aware MFU {100 * causal_mfu(problem, report):.1f} %"
    )
    coarse = make_problem(make_spec(num_experts=8, top_k=2), make_cluster(fanouts=(4,)))
    assert model_kind(coarse) == "coarse MoE"


def test_coarse_moe_above_the_published_mixtral_run_says_why():
    """Mixtral-like experts (wider than the hidden size) on an H100 preset: above 438 TFLOP/s per
    GPU (Megatron-Core's MoE README, MCore v0.8: 44.3 % of 989.4) the note names that run and the
    reason; the full (not causal) count is compared, as Megatron-LM counted then."""
    from nest.cost.mfu import plausibility_note

    spec = make_spec(hidden=1024, ffn_hidden=4096, heads=16, num_experts=8, top_k=2, seq_len=512)
    fast = dict(name="h100_sxm", hbm_bw_bytes_per_s=100e12, hbm_bytes=80 * 2**30)
    problem = make_problem(spec, make_cluster(fanouts=(4,), **fast), global_batch=64)
    report = _fixed_report(problem)
    assert report.mfu > 438 / 989.4  # the flat test device runs at its peak
    note = plausibility_note(problem, report)
    assert note.startswith(f"MFU {100 * report.mfu:.1f} % is above the best published coarse MoE")
    assert "Mixtral 8x7B" in note and "ep = 1" in note


def test_a_tpu_plan_above_maxtexts_best_run_says_so_with_the_tpu_reason():
    """TPU v5p: a dense plan above MaxText's best published v5p run (32B on 64 chips, MFU
    71.47 %, causal count; MaxText@76bd53b configs/v5p/README.md) gets the note with the TPU
    reason (the TPU rate is calibrated on runs that all recompute), not the H100 one."""
    from nest.cost.mfu import PUBLISHED_BEST, TPU_WHY, plausibility_note

    spec = make_spec(hidden=2048, ffn_hidden=8192, heads=16, seq_len=512, dropout=False)
    fast = dict(name="tpu_v5p", hbm_bw_bytes_per_s=100e12, hbm_bytes=95 * 2**30)
    problem = make_problem(spec, make_cluster(fanouts=(4,), **fast), global_batch=64)
    report = _fixed_report(problem)
    best = next(b for b in PUBLISHED_BEST if "tpu_v5p" in b.devices)
    assert causal_mfu(problem, report) > best.mfu
    note = plausibility_note(problem, report)
    assert note.startswith("causal-aware MFU") and f"{100 * best.mfu:.1f} %" in note
    assert TPU_WHY in note and "H100" not in note.split("; read it")[1]
    slow = make_problem(
        spec, make_cluster(fanouts=(4,), matmul_efficiency=0.3, **fast), global_batch=64
    )
    slow_report = _fixed_report(slow)
    assert causal_mfu(slow, slow_report) < best.mfu
    assert plausibility_note(slow, slow_report) is None


def test_blackwell_references_are_the_quoted_rates_over_the_presets_peaks():
    """Each Blackwell reference's MFU is the TFLOP/s per GPU its source quotes (Megatron-Bridge's
    performance archive) over the BF16 peak of the device preset it is matched to, so the note
    compares like with like."""
    import re

    from nest.cost.mfu import BLACKWELL_WHY, PUBLISHED_BEST

    blackwell = [b for b in PUBLISHED_BEST if b.devices <= {"b200", "gb200"}]
    assert {(b.kind, b.precision, *b.devices) for b in blackwell} >= {
        ("dense", "fp8", "gb200"),
        ("dense", "fp8", "b200"),
        ("fine-grained MoE", "fp8", "gb200"),
    }
    for best in blackwell:
        (device,) = best.devices
        quoted = float(re.search(r"([\d,]+) TFLOP/s per GPU", best.source)[1].replace(",", ""))
        peak = build_device(load_preset("device", device)).peak_flops_per_s / 1e12
        assert best.mfu == pytest.approx(quoted / peak, rel=1e-12)
        assert best.causal and best.why == BLACKWELL_WHY


def test_llama3_70b_fp8_on_64_b200_is_above_the_best_published_b200_run_and_says_so():
    """The plan nest prints for Llama 3 70B in FP8 on 64 B200 is above the best published dense
    FP8 B200 run (Llama 3.1 405B, 1,667 TFLOP/s per GPU, Megatron-Bridge 25.11): the summary
    names that run and the Blackwell reason."""
    import hydra

    from nest.app.cli import CONF_DIR
    from nest.app.config import build_problem
    from nest.cost.mfu import BLACKWELL_WHY, plausibility_note
    from nest.dp.planner import NestPlanner

    overrides = ["cluster=dgx_b200", "cluster.devices=64", "model=llama3_70b"]
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra.compose("config", overrides=[*overrides, "training.precision=fp8"])
    problem = build_problem(cfg)
    report = evaluate(problem, NestPlanner().solve(problem))
    note = plausibility_note(problem, report)
    assert causal_mfu(problem, report) > 1667 / 2250
    assert note is not None and "1,667 TFLOP/s" in note and BLACKWELL_WHY in note
