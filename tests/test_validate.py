"""The cost model against published measured runs (``python -m nest.validate``)."""

import csv
from pathlib import Path

import pytest

from nest.app import validate
from nest.core.axes import Schedule
from nest.core.errors import UserError
from nest.cost import evaluate

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "experiments" / "validation" / "cases.csv"
VISIBLE = ROOT.parent / "shared" / "validation" / "visible.csv"


@pytest.fixture(scope="module")
def summary():
    return validate.run(CASES, None, echo=lambda _: None)


def test_every_case_is_predicted_and_fits(summary):
    """The configurations ran for real, so the memory model must let them fit: every case but
    DeepSpeed's ZeRO-3 530B run on 640 GPUs with microbatch 4 (SC21 Table 2), whose memory use
    DeepSpeed cuts with means the row cannot state (e.g. activation offloading)."""
    assert summary["predicted"] == summary["cases"] == 73
    assert summary["out_of_memory"] == 1


# ------------------------------------------------------------------------------ accuracy
# The targets docs/trust/fidelity.md states (median <= 5 %, max <= 15 %, no source
# median above 10 %), asserted as stated. A target the model does not meet today is a strict
# xfail whose reason gives the target, the current value and why: it turns red (XPASS) the day
# the model meets it, and docs/trust/fidelity.md must then be updated.
TARGET_MEDIAN = 0.05
TARGET_MAX = 0.15
TARGET_SOURCE_MEDIAN = 0.10

SC21_T1 = "Narayanan2021_SC21_Table1"
MEGATRON = "MegatronLM_README_H100_weak_scaling"
LLAMA3 = "Dubey2024_Llama3_Table4"
SC21_T2 = "Narayanan2021_SC21_Table2"
AUTOMODEL = "NeMoAutomodel_PerfSummary_H100_BF16"


def _unmet(target: str, now: str, why: str):
    return pytest.mark.xfail(strict=True, reason=f"target {target}; now {now}: {why}")


LLAMA3_WHY = (
    "run as 1F1B since the paper's interleaving depth is unpublished, the 16-stage bubble the "
    "real schedule does not have under-predicts every row"
)
SC21_T2_WHY = (
    "ZeRO-3 rows over-predicted 1.4-3x: DeepSpeed 2021's per-parameter gathers are slower "
    "than the bandwidth-bound collectives modelled"
)
AUTOMODEL_WHY = "FSDP2 prefetches the ZeRO-3 gathers the model charges as exposed"


@pytest.mark.parametrize(
    "source",
    [
        SC21_T1,
        MEGATRON,
        pytest.param(LLAMA3, marks=_unmet("source median <= 10 %", "15.5 %", LLAMA3_WHY)),
        pytest.param(SC21_T2, marks=_unmet("source median <= 10 %", "12.0 %", SC21_T2_WHY)),
        pytest.param(AUTOMODEL, marks=_unmet("source median <= 10 %", "30.5 %", AUTOMODEL_WHY)),
    ],
)
def test_accuracy_no_source_median_above_10_percent(summary, source):
    assert summary["by_source"][source]["median_abs_error"] <= TARGET_SOURCE_MEDIAN


@pytest.mark.parametrize(
    "source",
    [
        SC21_T1,
        pytest.param(
            MEGATRON,
            marks=_unmet(
                "max <= 15 %",
                "46.2 %",
                "1.7B over-predicted by 45 % and 7.1B by 19 %: the host and kernel overheads of "
                "small models are not modelled",
            ),
        ),
        pytest.param(LLAMA3, marks=_unmet("max <= 15 %", "31.5 %", LLAMA3_WHY)),
        pytest.param(SC21_T2, marks=_unmet("max <= 15 %", "166 %", SC21_T2_WHY)),
        pytest.param(AUTOMODEL, marks=_unmet("max <= 15 %", "30.5 %", AUTOMODEL_WHY)),
    ],
)
def test_accuracy_every_source_max_within_15_percent(summary, source):
    assert summary["by_source"][source]["max_abs_error"] <= TARGET_MAX


@_unmet(
    "median <= 5 % over all cases",
    "8.4 %",
    "SC21 Table 1's 30 A100 rows (2021 software, no FlashAttention) run 4-13 % faster than "
    "predicted at the assumed in-step GEMM rate of 0.65",
)
def test_accuracy_median_within_5_percent(summary):
    assert summary["median_abs_error"] <= TARGET_MEDIAN


@_unmet("max <= 15 % over all cases", "166 %", SC21_T2_WHY)
def test_accuracy_max_within_15_percent(summary):
    assert summary["max_abs_error"] <= TARGET_MAX


@_unmet(
    "3D parallelism predicted above ZeRO-3 at every scale, as measured "
    "(docs/trust/fidelity.md, Ranking)",
    "ZeRO-3 predicted above at the smallest scale of both sweeps (175B on 384 GPUs: 165.5 vs "
    "141.8 TFLOP/s, measured 144 vs 153; 530B: 168.7 on 640 vs 157.7 on 560, measured 138 vs "
    "171)",
    SC21_T2_WHY,
)
def test_accuracy_3d_parallelism_ranked_above_zero3_at_every_scale():
    """SC21 Table 2: at each of the three scales of each model, the 3D-parallel configuration
    (PTD-P) runs faster than ZeRO-3; the prediction must order every such pair as measured."""
    with open(CASES, newline="") as fh:
        rows = sorted(
            (r for r in csv.DictReader(fh) if r["source"] == SC21_T2), key=lambda r: int(r["gpus"])
        )
    for sweep in ("SC21_Table2_174.6B", "SC21_Table2_529.6B"):
        zero3 = [validate.predict(r) for r in rows if r["sweep"] == sweep and "ZeRO-3" in r["case"]]
        ptdp = [validate.predict(r) for r in rows if r["sweep"] == sweep and "PTD-P" in r["case"]]
        assert len(zero3) == len(ptdp) == 3
        for z, d in zip(zero3, ptdp, strict=True):  # the same scale: the k-th smallest of each
            assert d.measured > z.measured  # the published fact the claim rests on
            assert d.predicted > z.predicted, (sweep, d.row["gpus"], d.predicted, z.predicted)


# ---------------------------------------------------------------------------- regressions
# Pins of the current cost model (v2, 2026-12), NOT accuracy: the errors the model makes today,
# to half a percentage point, so that any change of the model's numbers is noticed. A change
# made on purpose updates this table together with docs/trust/fidelity.md.
CURRENT = {  # source: (cases, median |error|, max |error|, signed median)
    SC21_T1: (30, 0.085, 0.127, -0.085),
    MEGATRON: (27, 0.038, 0.462, -0.026),
    LLAMA3: (3, 0.155, 0.315, -0.155),
    SC21_T2: (12, 0.120, 1.656, 0.038),
    AUTOMODEL: (1, 0.305, 0.305, -0.305),
}


@pytest.mark.parametrize("source", sorted(CURRENT))
def test_regression_errors_per_source_pin_the_current_model(summary, source):
    """Pins the current model's per-source errors (the table above), not its accuracy: the
    accuracy targets are the ``test_accuracy_*`` tests."""
    n, median, worst, signed = CURRENT[source]
    s = summary["by_source"][source]
    assert s["n"] == n
    assert s["median_abs_error"] == pytest.approx(median, abs=0.005)
    assert s["max_abs_error"] == pytest.approx(worst, abs=0.005)
    assert s["median_error"] == pytest.approx(signed, abs=0.005)


def test_regression_sc21_table2_kendall_tau_pins_the_current_model(summary):
    """Pins the current model's ranking of SC21 Table 2's two sweeps (six configurations each),
    not an accuracy target: Kendall tau +0.73 (175B: 11 of 15 pairs ordered as measured) and
    +0.60 (530B: 12 of 15)."""
    sweeps = summary["sweeps"]
    assert set(sweeps) == {"SC21_Table2_174.6B", "SC21_Table2_529.6B"}
    assert all(s["n"] == 6 for s in sweeps.values())
    assert sweeps["SC21_Table2_174.6B"]["kendall_tau"] == pytest.approx(11 / 15)
    assert sweeps["SC21_Table2_529.6B"]["kendall_tau"] == pytest.approx(9 / 15)


def test_at_the_micro_benchmark_ceiling_every_source_is_over_predicted():
    """Why the presets' GEMM level is an assumption below the cited ceiling: with every kernel at
    its isolated micro-benchmark rate (``--matmul-efficiency ceiling``) the model predicts more
    throughput than measured for every Megatron or DeepSpeed source (median signed error > 0:
    SC21 Table 1 +13.8 %, Megatron-Core H100 +16.7 %, Llama 3 +0.2 %, SC21 Table 2 +30.9 %), so
    kernels inside a training step run slower than in isolation; at the assumed 0.65 no source is
    over-predicted by more than 12 % at the median. The FSDP2 row (NeMo Automodel) is left out of
    the first claim: its error is the exposed ZeRO-3 gathers (see the next test), not the GEMM
    rate, and it stays under-predicted at the ceiling (-21.8 %)."""
    at_ceiling = validate.run(CASES, None, echo=lambda _: None, matmul_efficiency="ceiling")
    kernel_bound = {k: v for k, v in at_ceiling["by_source"].items() if k != AUTOMODEL}
    assert len(kernel_bound) == 4
    assert all(s["median_error"] > 0 for s in kernel_bound.values())
    default = validate.run(CASES, None, echo=lambda _: None)
    assert all(s["median_error"] < 0.12 for s in default["by_source"].values())


def test_fsdp2_run_is_under_predicted_by_its_exposed_gathers(summary):
    """NeMo Automodel's Llama3 70B on 64 H100 (FSDP2 over 32 ranks x CP 2, BF16): 866.77 tokens/s
    per GPU measured, 602 predicted (-30.5 %). nest charges ZeRO-3's per-microbatch parameter
    all-gathers and gradient reduce-scatters as exposed, while FSDP2 prefetches the gathers under
    compute (the row's ``fsdp2_prefetch``): that traffic is what the model adds, since the row
    without it (compute, recompute and the CP ring alone) would run faster than measured.
    (Its error is pinned by the regression table.)"""
    s = summary["by_source"][AUTOMODEL]
    assert s["n"] == 1 and s["median_error"] < 0
    row = _case(AUTOMODEL, "70.6")
    problem, plan = validate.problem_and_plan(row)
    report = evaluate(problem, plan)
    (stage,) = report.stages
    assert stage.zero3_comm_s > 0
    without_zero3_s = report.iteration_time_s - plan.num_microbatches * stage.zero3_comm_s
    tokens = problem.training.global_batch * problem.model.seq_len
    measured = float(row["measured_value"])
    assert tokens / without_zero3_s / report.devices_used > measured


def test_bad_matmul_efficiency_flag_is_one_line_error(capsys, tmp_path):
    for bad in ("2", "abc", "0"):
        code = validate.main([str(CASES), "--out", str(tmp_path), "--matmul-efficiency", bad])
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --matmul-efficiency") and "\n" not in err


def test_kendall_tau_counts_agreeing_and_reversed_pairs():
    """Kendall's tau of two orders: 1 identical, -1 reversed, (concordant - discordant) / pairs
    otherwise (pairs tied in either order are left out)."""
    assert validate.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert validate.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert validate.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert validate.kendall_tau([1, 1, 2], [5, 6, 7]) == 1.0  # the tied pair is left out
    assert validate.kendall_tau([1], [2]) is None


def test_outcome_error_is_relative_to_the_measurement():
    row = {"source": "x"}
    o = validate.Outcome(row, "tflops_per_gpu", 400.0, 440.0, True)
    assert o.error == pytest.approx(0.10)


@pytest.mark.skipif(not VISIBLE.is_file(), reason="shared/validation/visible.csv not beside")
def test_visible_set_reads_with_defaults(tmp_path):
    summary = validate.run(VISIBLE, tmp_path, echo=lambda _: None)
    assert summary["predicted"] == summary["cases"]
    assert (tmp_path / "validation.csv").read_text().count("\n") == summary["cases"] + 1


def test_missing_file_is_one_line_error(capsys, tmp_path):
    assert validate.main([str(tmp_path / "none.csv"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def _case(source: str, params_b: str) -> dict:
    with open(CASES, newline="") as fh:
        return next(
            r
            for r in csv.DictReader(fh)
            if r["source"] == source and r["model_params_b"] == params_b
        )


def test_a_row_is_scored_with_its_published_schedule_and_partition():
    """Korthikanti et al. 2022 (arXiv 2205.05198, §6) ran 175B/530B/1T with the interleaved
    schedule, 3 chunks per rank: a row's ``schedule`` and ``virtual_stages`` must reach the plan,
    and interleaving shrinks the bubble of the same configuration (SC21 §2.2.2: by ``v``)."""
    row = _case("Narayanan2021_SC21_Table1", "145.6")  # 80 layers, pp 8: 8 x 3 chunks do not
    row = dict(row, layers="96", pp="8")  # divide 80, so use 96 layers (GPT-3 depth)
    problem, plain = validate.problem_and_plan(row)
    _, inter = validate.problem_and_plan(dict(row, schedule="interleaved", virtual_stages="3"))
    assert plain.schedule is Schedule.ONE_F_ONE_B and plain.virtual_stages == 1
    assert inter.schedule is Schedule.INTERLEAVED and inter.virtual_stages == 3
    assert len(inter.stages) == 8 * 3
    t_plain = evaluate(problem, plain)
    t_inter = evaluate(problem, inter)
    assert t_inter.bubble_s < t_plain.bubble_s


def test_a_row_is_scored_with_its_published_layer_partition():
    row = dict(_case("Narayanan2021_SC21_Table1", "39.1"), layer_partition="20;28")  # 48 blocks
    _, plan = validate.problem_and_plan(row)
    blocks = [s.last_layer - s.first_layer + 1 for s in plan.stages]
    assert blocks == [20 + 1, 28 + 1]  # the embedding joins the first stage, the head the last


def test_a_bad_layer_partition_is_one_line_error():
    row = dict(_case("Narayanan2021_SC21_Table1", "39.1"), layer_partition="20,x")
    with pytest.raises(UserError, match=r"layer_partition='20,x'.*separated by ';'"):
        validate.problem_and_plan(row)


def _mixtral_row(**changes) -> dict:
    """A Megatron-Core H100 row given Mixtral 8x7B's shape (Hugging Face
    mistralai/Mixtral-8x7B-v0.1 config.json, as conf/model/mixtral_8x7b.yaml) on 64 GPUs."""
    row = dict(
        _case("MegatronLM_README_H100_weak_scaling", "7.1"),
        model_params_b="46.7",
        layers="32",
        hidden="4096",
        heads="32",
        kv_heads="8",
        ffn="14336",
        vocab="32000",
        seq="4096",
        gpus="64",
        tp="1",
        pp="1",
        dp="64",
        global_batch_seqs="256",
        activation="swiglu",
        norm="rmsnorm",
        bias="false",
        position="rope",
        num_experts="8",
        top_k="2",
        ep="8",
    )
    row.update(changes)
    return row


def test_moe_columns_make_a_mixtral_problem():
    """``num_experts``, ``top_k`` and ``ep`` reach the model and the plan: a row with Mixtral
    8x7B's shape has its published 46.7B parameters (Jiang et al. 2024, arXiv 2401.04088 §2:
    "46.7B total parameters") and 8 expert ranks; without the columns a row stays dense."""
    problem, plan = validate.problem_and_plan(_mixtral_row())
    spec = problem.model.spec
    assert (spec.num_experts, spec.top_k, plan.ep) == (8, 2, 8)
    assert problem.model.total_params() == pytest.approx(46.7e9, rel=0.001)
    dense = {k: v for k, v in _mixtral_row().items() if k not in ("num_experts", "top_k", "ep")}
    problem, plan = validate.problem_and_plan(dense)
    assert (problem.model.spec.num_experts, plan.ep) == (1, 1)
    assert problem.model.total_params() < 15e9  # one expert: a dense 13B-class model


def test_bad_moe_values_are_one_line_errors():
    """As for any bad row: the row is reported with a one-line error naming the value, the run
    goes on."""
    for changes, named in (
        ({"ep": "3"}, "ep=3"),  # 3 ranks cannot share 8 experts
        ({"ep": "x"}, "ep='x'"),
        ({"ep": "0"}, "ep='0'"),
        ({"top_k": "9"}, "top_k=9"),
    ):
        outcome = validate.predict(_mixtral_row(**changes))
        assert outcome.predicted is None
        assert outcome.note.startswith("error:") and named in outcome.note
        assert "\n" not in outcome.note
    with pytest.raises(UserError, match=r"ep='x' must be a positive whole number"):
        validate.problem_and_plan(_mixtral_row(ep="x"))


def test_tokens_metric_agrees_with_the_model_flop_metric():
    """Tokens per second per GPU times the model FLOPs of a token is the model TFLOP/s per GPU:
    the two metrics of one run, read through the same evaluation."""
    row = _mixtral_row()
    tokens = validate.predict(dict(row, measured_metric="tokens_per_s_per_gpu"))
    tflops = validate.predict(dict(row, measured_metric="tflops_per_gpu"))
    problem, plan = validate.problem_and_plan(row)
    report = evaluate(problem, plan)
    per_token = report.model_flops_per_iteration / (
        problem.training.global_batch * problem.model.seq_len
    )
    assert tokens.predicted * per_token / 1e12 == pytest.approx(tflops.predicted, rel=1e-9)


def test_bad_numbers_in_any_column_are_one_line_row_errors():
    """Every numeric column, not only the MoE ones: text, a fraction where a count is due, a
    blank required number, and a bad measured value are each a one-line error on that row that
    names the column and the text, and the run goes on (no traceback)."""
    for changes, named in (
        ({"tp": "x"}, "tp='x' is not a number"),
        ({"pp": "1.5"}, "pp='1.5' is not a whole number"),
        ({"hidden": ""}, "hidden is blank"),
        ({"nvlink_gbps": "fast"}, "nvlink_gbps='fast' is not a number"),
        ({"microbatch": "nan"}, "microbatch='nan' is not a finite number"),
        ({"measured_value": "n/a"}, "measured_value='n/a' is not a number"),
        ({"measured_value": "0"}, "measured_value='0' must be above 0"),
        ({"ep": "inf"}, "ep='inf' must be a positive whole number"),
        ({"num_experts": "nan"}, "num_experts='nan' must be a positive whole number"),
        ({"gpu": ""}, "gpu '' is not known"),
    ):
        outcome = validate.predict(_mixtral_row(**changes))
        assert outcome.predicted is None, changes
        assert outcome.note.startswith("error:") and named in outcome.note, outcome.note
        assert "\n" not in outcome.note


def test_a_csv_without_a_required_column_names_it(tmp_path):
    """A header that lacks a column every row needs is refused before any row, naming it."""
    row = _mixtral_row()
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, [c for c in row if c != "tp"], extrasaction="ignore")
        writer.writeheader()
        writer.writerow(row)
    with pytest.raises(UserError, match=r"lacks the columns \['tp'\]"):
        validate.run(path, None, echo=lambda *a: None)


def test_a_csv_that_is_not_utf8_is_one_line_error(tmp_path):
    """A file in another encoding is refused naming it, not a UnicodeDecodeError."""
    path = tmp_path / "runs.csv"
    path.write_bytes(",".join(validate.REQUIRED_COLUMNS).encode() + b"\nGr\xfc\xdfe\n")
    with pytest.raises(UserError, match="is not UTF-8 text"):
        validate.run(path, None, echo=lambda *a: None)
