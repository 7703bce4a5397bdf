"""Peak memory against measurement (``measured_metric=peak_memory_*`` rows of
``experiments/validation/cases.csv``; sources in docs/trust/memory.md)."""

import csv
from pathlib import Path

import pytest

from nest.app import validate
from nest.cost import evaluate

CASES = Path(__file__).resolve().parents[1] / "experiments" / "validation" / "cases.csv"
TORCHTITAN = "torchtitan_2024-12_H100_96GB_memory"
DEEPSPEED = "DeepSpeed_issue5305_memory"
ZB_T4 = "Qi2024_ZeroBubble_Table4"
ZB_T6 = "Qi2024_ZeroBubble_Table6"
GiB = 2**30


@pytest.fixture(scope="module")
def memory():
    return validate.run(CASES, None, echo=lambda _: None)["memory"]


def _memory_rows() -> list[dict]:
    with open(CASES, newline="") as fh:
        return [r for r in csv.DictReader(fh) if validate.is_memory_metric(r["measured_metric"])]


def test_memory_rows_are_kept_apart_from_the_time_rows(memory):
    assert memory["n"] == 41
    assert {s: v["n"] for s, v in memory["by_source"].items()} == {
        DEEPSPEED: 6,
        TORCHTITAN: 7,
        ZB_T4: 16,
        ZB_T6: 12,
    }


def test_the_three_measured_quantities_differ_by_the_device_reserve():
    """``max_memory_allocated`` < ``max_memory_reserved`` < nvidia-smi: the reserved segments add
    the allocator margin (5 % of the HBM on the H100 presets) to the tensors, nvidia-smi adds the
    CUDA context and NCCL buffers (``memory_reserve_gib``) to the segments; nvidia-smi is the
    evaluator's total."""
    row = _memory_rows()[0]
    problem, plan = validate.problem_and_plan(row)
    report = evaluate(problem, plan)
    device = problem.cluster.device
    got = {m: validate.predicted_memory_bytes(report, device, m) for m in validate.MEMORY_METRICS}
    assert got["peak_memory_nvidia_smi"] == report.peak_memory_bytes
    assert got["peak_memory_reserved"] - got["peak_memory_allocated"] == pytest.approx(
        0.05 * device.hbm_bytes
    )
    assert got["peak_memory_nvidia_smi"] - got["peak_memory_reserved"] == pytest.approx(1.4 * GiB)
    rank0 = validate.predicted_memory_bytes(report, device, "peak_memory_nvidia_smi (rank 0)")
    assert rank0 == report.ranks[0].memory.total_bytes


@pytest.mark.parametrize(
    "change, message",
    [
        ({"measured_metric": "peak_memory_used"}, "give one of"),
        ({"measured_metric": "peak_memory_reserved (rank 3)"}, "pipeline ranks 0..0"),
        ({"measured_metric": "peak_memory_reserved (stage 0)"}, "(rank 0)"),
        ({"unit": "G"}, "unit='G'"),
    ],
)
def test_bad_memory_metric_or_unit_is_a_one_line_row_error(change, message):
    outcome = validate.predict({**_memory_rows()[0], **change})
    assert outcome.predicted is None
    assert outcome.note.startswith("error: ") and message in outcome.note
    assert "\n" not in outcome.note


def test_unfused_loss_adds_six_bytes_per_logit_on_torchtitans_long_sequence_row():
    """torchtitan's Table 2 row (Llama 3.1 8B, 32,768 tokens, vocabulary 128,256 on one rank):
    PyTorch's unfused cross entropy holds 12 bytes per logit, the fused one 6, so the prediction
    drops by ``6 x 32768 x 128256`` bytes (23.5 GiB) with ``fused_loss`` true."""
    row = next(r for r in _memory_rows() if "seq 32768" in r["case"])
    unfused = validate.predict(row).predicted
    fused = validate.predict({**row, "fused_loss": "true"}).predicted
    assert (unfused - fused) * GiB == pytest.approx(6 * 32768 * 128256, rel=1e-9)


def test_torchtitans_selective_ac_rows_run_op_level_checkpointing():
    """torchtitan's "selective AC" of December 2024 is its op-level policy
    (``train_configs/llama3_8b.toml`` at 9dec370: ``mode = 'selective'``,
    ``selective_ac_option = 'op'``), so its rows say ``op``; an op-level policy keeps more than
    full recompute (the block's input) and less than the attention core's recompute, which
    with FlashAttention keeps everything (docs/trust/memory.md)."""
    rows = [r for r in _memory_rows() if "selective AC" in r["case"]]
    assert len(rows) == 2
    for row in rows:
        assert row["recompute"] == "op"
        got = {m: validate.predict({**row, "recompute": m}) for m in ("full", "op", "selective")}
        assert got["full"].predicted < got["op"].predicted < got["selective"].predicted


def _unmet(target: str, now: str, why: str):
    return pytest.mark.xfail(strict=True, reason=f"target {target}; now {now}: {why}")


TORCHTITAN_WHY = (
    "the 70B FSDP x TP row (full AC, torch.compile + Float8) is 26 % under: nothing in its "
    "layout explains 19 GiB (compile and Float8's casts are not modelled)"
)
DEEPSPEED_WHY = (
    "the issue states neither which memory figure it gives nor the TP rows' ZeRO stage or "
    "sequence parallelism; DeepSpeed's ZeRO-3 measured above ZeRO-2 (+9.0 GiB with recompute, "
    "+12.9 without; modelled -10.7 and -11.1: about 20 GiB of stage-3 runtime buffers, its "
    "live-parameter cache and buckets, are not modelled, so the Ulysses ZeRO-3 rows read -56 "
    "and -28 %) and the TP run without recompute ran in 45 G where the Korthikanti inventory "
    "without sequence parallelism needs 66 GiB of activations"
)


@pytest.mark.parametrize(
    "source, median, worst",
    [
        pytest.param(TORCHTITAN, 0.095, 0.260),  # met since its selective-AC rows run op
        pytest.param(ZB_T4, 0.013, 0.033),
        pytest.param(ZB_T6, 0.030, 0.065),
        pytest.param(
            DEEPSPEED, 0.252, 0.980, marks=_unmet("median <= 10 %", "25.2 %", DEEPSPEED_WHY)
        ),
    ],
)
def test_accuracy_memory_median_within_10_percent_per_source(memory, source, median, worst):
    assert memory["by_source"][source]["median_abs_error"] <= 0.10


@pytest.mark.xfail(
    strict=True,
    reason=f"target max <= 20 %; now 98.0 %: {DEEPSPEED_WHY}; torchtitan: {TORCHTITAN_WHY}",
)
def test_accuracy_memory_max_within_20_percent(memory):
    assert memory["max_abs_error"] <= 0.20


@pytest.mark.xfail(strict=True, reason=f"target: every row fits; now 40/41: {DEEPSPEED_WHY}")
def test_accuracy_every_measured_run_fits(memory):
    assert memory["verdict_right"] == memory["n"]


CURRENT = {  # source: (n, median |error|, max |error|, median signed error, verdict right)
    TORCHTITAN: (7, 0.095, 0.260, -0.095, 7),
    DEEPSPEED: (6, 0.252, 0.980, -0.091, 5),
    ZB_T4: (16, 0.013, 0.033, -0.002, 16),
    ZB_T6: (12, 0.030, 0.065, 0.030, 12),
}


@pytest.mark.parametrize("source", [ZB_T4, ZB_T6])
def test_accuracy_zero_bubble_schedules_memory_within_10_percent(memory, source):
    """Issue 24's target on the zero-bubble paper's peak memories (Tables 4 and 6: 1F1B,
    1F1B-I, ZB-1p, ZB-2p, ZB-2p*, ZB-V on 8 to 32 A100; their layouts stated): every row within
    10 % (max 3.3 % and 6.5 % today), and the schedules' memory ordered as measured within each
    model's sweep where the measured values differ by more than 5 %."""
    assert memory["by_source"][source]["max_abs_error"] <= 0.10
    outcomes = [validate.predict(r) for r in _memory_rows() if r["source"] == source]
    for x in outcomes:
        for y in outcomes:
            same_model = x.row["model_params_b"] == y.row["model_params_b"]
            if same_model and x.measured > 1.05 * y.measured:
                assert x.predicted > y.predicted, (x.row["case"], y.row["case"])


@pytest.mark.parametrize("source", sorted(CURRENT))
def test_regression_memory_errors_pin_the_current_model(memory, source):
    """Pins the current errors (not their accuracy: the ``test_accuracy_*`` tests above)."""
    n, median, worst, signed, right = CURRENT[source]
    s = memory["by_source"][source]
    assert s["n"] == n and s["verdict_right"] == right
    assert s["median_abs_error"] == pytest.approx(median, abs=0.005)
    assert s["max_abs_error"] == pytest.approx(worst, abs=0.005)
    assert s["median_error"] == pytest.approx(signed, abs=0.005)
