"""The cost model against published measured runs (``python -m nest.validate``)."""

import csv
from pathlib import Path

import pytest

from nest import validate
from nest.axes import Schedule
from nest.cost import evaluate
from nest.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "experiments" / "validation" / "cases.csv"
VISIBLE = ROOT.parent / "shared" / "validation" / "visible.csv"


@pytest.fixture(scope="module")
def summary():
    return validate.run(CASES, None, echo=lambda _: None)


def test_every_case_is_predicted_and_fits(summary):
    """The configurations ran for real, so the memory model must let them fit."""
    assert summary["predicted"] == summary["cases"] == 60
    assert summary["out_of_memory"] == 0


def test_sc21_weak_scaling_within_ten_percent(summary):
    """Narayanan et al. SC21 Table 1 (Selene, 1.7B-1T, full recompute, achieved TFLOP/s with
    recompute counted). Measured: median 3.3 %, max 8.5 % (the largest models run slower than
    predicted, small ones slightly faster). Tolerance: median 5 %, max 10 %."""
    s = summary["by_source"]["Narayanan2021_SC21_Table1"]
    assert s["n"] == 30
    assert s["median_abs_error"] < 0.05 and s["max_abs_error"] < 0.10


def test_megatron_core_h100_within_stated_tolerance(summary):
    """Megatron-LM README r0.8.0, H100 weak scaling (model TFLOP/s, MFU). Measured: median
    11.9 %, max 40.6 %. The model does not overlap TP/DP/PP communication with compute (the runs
    do), so mid-size models are under-predicted (up to -26 %), and the 1.7B model is over-predicted
    by 40 % (small kernels below the matmul efficiency assumed for all sizes). Tolerance: median
    15 %, max 45 %."""
    s = summary["by_source"]["MegatronLM_README_H100_weak_scaling"]
    assert s["n"] == 27
    assert s["median_abs_error"] < 0.15 and s["max_abs_error"] < 0.45


def test_llama3_405b_within_stated_tolerance(summary):
    """Llama 3 paper Table 4 (405B on 8K-16K H100). Measured: -15 % at 8K GPUs, -31 % and -29 %
    at 16K GPUs: the rows are run with 1F1B because the interleaving depth the paper's modified
    schedule used is not published; 16 microbatches on 16 stages leave a ~47 % bubble that
    interleaving would shrink. Tolerance: max 35 %."""
    s = summary["by_source"]["Dubey2024_Llama3_Table4"]
    assert s["n"] == 3 and s["max_abs_error"] < 0.35


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
