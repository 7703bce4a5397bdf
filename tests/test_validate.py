"""The cost model against published measured runs (``python -m nest.validate``)."""

from pathlib import Path

import pytest

from nest import validate

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
