"""The one calibrated constant (``python -m nest.calibrate``): a declared split, a fresh value."""

import csv
from pathlib import Path

import pytest
import yaml

from nest.app import calibrate
from nest.app.validate import device_config
from nest.core.kernels import CALIBRATED_MATMUL_EFFICIENCY

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "experiments" / "validation" / "cases.csv"


@pytest.fixture(scope="module")
def rows():
    with open(CASES, newline="", encoding="utf-8-sig") as fh:
        return list(csv.DictReader(fh))


def test_the_split_is_the_bf16_half_of_one_source(rows):
    """The declared split is one source's BF16 rows, each the BF16 half of a BF16/FP8 pair (the
    FP8 halves stay held out); every other source contributes nothing."""
    split = calibrate.split_rows(rows)
    assert len(split) == 15
    assert {r["source"] for r in split} == {calibrate.CALIBRATION_SPLIT.source}
    assert all((r["precision"] or "bf16") == "bf16" for r in split)
    fp8_cases = {r["case"].replace(" FP8 ", " BF16 ") for r in rows if r["precision"] == "fp8"}
    assert all(r["case"] in fp8_cases for r in split)
    held_out = [r for r in rows if not calibrate.CALIBRATION_SPLIT.holds(r)]
    assert len(held_out) == len(rows) - 15


def test_presets_carry_the_stored_constant():
    """The H100 and H200 presets run at the stored calibrated rate (one value, three places)."""
    for preset in ("h100_sxm", "h200_sxm"):
        text = (ROOT / "conf" / "device" / f"{preset}.yaml").read_text()
        assert yaml.safe_load(text)["matmul_efficiency"] == CALIBRATED_MATMUL_EFFICIENCY
        assert device_config(preset)["matmul_efficiency"] == CALIBRATED_MATMUL_EFFICIENCY


def test_stored_constant_equals_a_fresh_fit(rows):
    """The stored rate is what the declared fit gives today (within the tolerance): a cost-model
    change that moves the fit fails here until ``python -m nest.calibrate`` is re-run and its
    value stored."""
    ceiling = float(device_config("h100_sxm")["gemm_ceiling"])
    rate, value = calibrate.fit(calibrate.split_rows(rows), ceiling)
    assert rate == pytest.approx(CALIBRATED_MATMUL_EFFICIENCY, abs=calibrate.STALE_TOLERANCE)
    assert calibrate.FIT_LOW <= rate <= ceiling
    # the grid minimum: its neighbours are no better
    split = calibrate.split_rows(rows)
    for other in (rate - 0.01, rate + 0.01):
        if calibrate.FIT_LOW <= other <= ceiling:
            assert calibrate.objective(split, other) >= value


def test_objective_is_symmetric_in_log_error():
    """Over- and under-prediction by the same factor weigh the same (``|log ratio|``)."""
    with open(CASES, newline="", encoding="utf-8-sig") as fh:
        row = next(r for r in csv.DictReader(fh) if calibrate.CALIBRATION_SPLIT.holds(r))
    from nest.app.validate import predict

    predicted = predict(row, 0.6).predicted
    slow = dict(row, measured_value=str(predicted * 2))
    fast = dict(row, measured_value=str(predicted / 2))
    assert calibrate.objective([slow], 0.6) == pytest.approx(calibrate.objective([fast], 0.6))


def test_cli_prints_the_fit(capsys):
    assert calibrate.main([str(CASES)]) == 0
    out = capsys.readouterr().out
    assert "fitted matmul_efficiency" in out and "stale" not in out


def test_cli_refuses_a_missing_file(tmp_path, capsys):
    assert calibrate.main([str(tmp_path / "none.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
