"""The two calibrated constants (``python -m nest.calibrate``, GPU and TPU in-step GEMM rates):
each a declared split, a fresh value."""

import csv
from collections import Counter
from pathlib import Path

import pytest
import yaml

from nest.app import calibrate
from nest.app.validate import (
    CALIBRATION_SPLITS,
    TPU_CALIBRATION_SPLIT,
    device_config,
    in_calibration_split,
)
from nest.core.kernels import (
    CALIBRATED_MATMUL_EFFICIENCY,
    CALIBRATED_TPU_MATMUL_EFFICIENCY,
    H100_GEMM_CEILING,
    IN_STEP_SHARE_OF_CEILING,
    TPU_IN_STEP_SHARE_OF_CEILING,
    TPU_V5E_GEMM_CEILING,
    derived_matmul_efficiency,
)

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


def test_the_tpu_split_is_every_other_slice_count_of_the_v5e_source(rows):
    """The declared TPU split is exactly the MaxText v5e README runs on 1, 4 and 16 slices of 256
    chips: three of each model's six slice counts (1, 2, 4, 8, 16, 32), every model size in both
    halves; the 2, 8 and 32 slice runs, v5p and every other source stay held out."""
    v5e = [r for r in rows if r["source"] == "MaxText_TPU_v5e_README"]
    split = calibrate.split_rows(rows, TPU_CALIBRATION_SPLIT)
    assert len(v5e) == 24 and len(split) == 12
    assert all(r in v5e and int(r["gpus"]) // 256 in (1, 4, 16) for r in split)
    assert all(r in split for r in v5e if int(r["gpus"]) // 256 in (1, 4, 16))
    sizes = {r["model_params_b"] for r in v5e}
    assert len(sizes) == 4
    for half in (split, [r for r in v5e if r not in split]):
        assert Counter(r["model_params_b"] for r in half) == dict.fromkeys(sizes, 3)
    # the two splits are disjoint; every row of neither is held out
    assert not [r for r in rows if all(s.holds(r) for s in CALIBRATION_SPLITS)]
    calibration = [r for r in rows if in_calibration_split(r)]
    assert len(calibration) == 15 + 12


@pytest.mark.parametrize(
    ("preset", "stored"),
    [
        ("h100_sxm", CALIBRATED_MATMUL_EFFICIENCY),
        ("h200_sxm", CALIBRATED_MATMUL_EFFICIENCY),
        ("tpu_v5e", CALIBRATED_TPU_MATMUL_EFFICIENCY),
    ],
)
def test_presets_carry_the_stored_constant(preset, stored):
    """The H100 and H200 presets run at the stored GPU rate, TPU v5e at the stored TPU rate (each
    one value in the code and its presets)."""
    text = (ROOT / "conf" / "device" / f"{preset}.yaml").read_text()
    assert yaml.safe_load(text)["matmul_efficiency"] == stored
    assert device_config(preset)["matmul_efficiency"] == stored


CALIBRATED_PRESETS = ("h100_sxm", "h200_sxm", "tpu_v5e")


def test_the_in_step_share_is_the_calibrated_rate_over_h100s_ceiling():
    """The share the other presets inherit is H100's fitted rate over H100's own measured
    ceiling, as the preset stores it (one ceiling, two places)."""
    for preset in ("h100_sxm", "h200_sxm"):
        assert float(device_config(preset)["gemm_ceiling"]) == H100_GEMM_CEILING
    assert pytest.approx(CALIBRATED_MATMUL_EFFICIENCY / 0.803, rel=1e-9) == IN_STEP_SHARE_OF_CEILING
    assert 0.0 < IN_STEP_SHARE_OF_CEILING < 1.0


def test_the_tpu_share_is_the_tpu_rate_over_v5es_ceiling():
    """The share the other TPUs inherit is v5e's fitted rate over v5e's own published ceiling
    (XLA's 8192-cubed matmul at 92.3 %, JAX's Pallas TPU guide), as the preset stores it; it is
    at most 1 (the fit's bound is the ceiling)."""
    assert float(device_config("tpu_v5e")["gemm_ceiling"]) == TPU_V5E_GEMM_CEILING == 0.923
    share = CALIBRATED_TPU_MATMUL_EFFICIENCY / 0.923
    assert pytest.approx(share, rel=1e-9) == TPU_IN_STEP_SHARE_OF_CEILING
    assert 0.0 < TPU_IN_STEP_SHARE_OF_CEILING <= 1.0


def test_no_tpu_preset_runs_above_its_ceiling():
    """Every TPU preset with a ceiling keeps its in-step rate at or below it (the calibrated one
    by the fit's bound, the derived ones by a share of at most 1)."""
    checked = []
    for path in sorted((ROOT / "conf" / "device").glob("tpu*.yaml")):
        data = device_config(path.stem)
        if data.get("gemm_ceiling") is not None:
            assert 0.0 < data["matmul_efficiency"] <= data["gemm_ceiling"] <= 1.0, path.stem
            checked.append(path.stem)
    assert {"tpu_v5e", "tpu_v5p", "tpu_v6e"} <= set(checked)


def test_every_other_preset_with_a_ceiling_runs_at_the_derived_rate():
    """A preset with a published (or, v5p, assumed) GEMM ceiling and no calibration split of its
    own (the other GPUs; TPU v5p and v6e) stores ``derived_matmul_efficiency(gemm_ceiling)``
    (nest.core.kernels), the TPUs at the TPU share; it goes stale, and fails here, when a
    calibrated constant moves. The rest (no ceiling: TPU v4, the NEST paper's devices) keep the
    stated 0.65."""
    derived = []
    for path in sorted((ROOT / "conf" / "device").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if path.stem in CALIBRATED_PRESETS or path.stem.endswith("schema"):
            continue
        if not isinstance(data, dict) or "matmul_efficiency" not in data:
            continue
        if data.get("gemm_ceiling") is None:
            assert data["matmul_efficiency"] == 0.65, path.stem
            continue
        tpu = calibrate.is_tpu_preset(path.stem)
        want = derived_matmul_efficiency(float(data["gemm_ceiling"]), tpu=tpu)
        assert data["matmul_efficiency"] == pytest.approx(want, abs=5e-4), path.stem
        assert data["matmul_efficiency"] <= data["gemm_ceiling"]
        derived.append(path.stem)
    assert {"a100_80gb", "b200", "gb200", "mi300x", "mi355x", "h100_96gb"} <= set(derived)
    assert {"tpu_v5p", "tpu_v6e"} <= set(derived)


@pytest.mark.parametrize(
    ("preset", "seconds", "printed"),
    [
        # JAX's Pallas TPU guide "Matrix Multiplication", section "Performance of pipelined
        # kernels", XLA's jnp.matmul on TPU v5e, printed as "FLOP/s utilization: 92.2960%"
        # (github:jax-ml/jax@cec06d116c05f0d52adfceee3d3b730fdbcb0ce5:
        # docs/pallas/tpu/matmul.ipynb)
        ("tpu_v5e", 0.006047147869830951, 181.823175395037e12),
        # Google's tpu-recipes micro-benchmark on one v6e chip, device time from the profiler
        # trace, printed as "TFLOPS: 827.474382048629" (github:AI-Hypercomputer/tpu-recipes@
        # c8cfe2f689081d36701a101cd73a70965d80926b:microbenchmarks/README.md)
        ("tpu_v6e", 1.328756094e-3, 827.474382048629e12),
    ],
)
def test_tpu_ceiling_is_the_published_8192_cubed_matmul_rate(preset, seconds, printed):
    """A TPU preset's ``gemm_ceiling`` is its published bf16 matmul of 8192 x 8192 x 8192 (the
    sources above): ``2 m n k`` FLOPs over the published time is the printed rate, and that
    over the preset's peak, rounded, is the ceiling; its in-step rate (v5e's calibrated, v6e's
    derived from the TPU share) is at most it."""
    m = n = k = 8192
    data = device_config(preset)
    achieved_flops_per_s = 2 * m * n * k / seconds
    assert achieved_flops_per_s == pytest.approx(printed, rel=1e-9)
    assert data["gemm_ceiling"] == round(achieved_flops_per_s / (data["peak_tflops"] * 1e12), 3)
    if preset != "tpu_v5e":
        assert data["matmul_efficiency"] == derived_matmul_efficiency(
            data["gemm_ceiling"], tpu=True
        )
    assert data["matmul_efficiency"] <= data["gemm_ceiling"]


def test_tpu_v6e_hbm_efficiency_is_the_published_copy_rate():
    """``hbm_efficiency`` of TPU v6e: Google's tpu-recipes HBM micro-benchmark copies 33,554,432
    bytes (read and written) in 0.049359414 ms, printed as 1359.5960438266143 GB/s
    (github:AI-Hypercomputer/tpu-recipes@c8cfe2f689081d36701a101cd73a70965d80926b:
    microbenchmarks/README.md), of the preset's nameplate 1,640 GB/s."""
    data = device_config("tpu_v6e")
    achieved_gb_per_s = 2 * 33_554_432 / 0.049359414e-3 / 1e9
    assert achieved_gb_per_s == pytest.approx(1359.5960438266143, rel=1e-6)
    assert data["hbm_efficiency"] == round(achieved_gb_per_s / data["hbm_bw_gbps"], 3)


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


def test_stored_tpu_constant_equals_a_fresh_fit(rows):
    """The stored TPU rate is what the same fit gives today on the TPU split, bounded by v5e's
    ceiling; its grid neighbours are no better."""
    split = calibrate.split_rows(rows, TPU_CALIBRATION_SPLIT)
    ceiling = float(device_config("tpu_v5e")["gemm_ceiling"])
    rate, value = calibrate.fit(split, ceiling, TPU_CALIBRATION_SPLIT)
    assert rate == pytest.approx(CALIBRATED_TPU_MATMUL_EFFICIENCY, abs=calibrate.STALE_TOLERANCE)
    assert calibrate.FIT_LOW <= rate <= ceiling
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
    assert "fitted GPU matmul_efficiency" in out and "fitted TPU matmul_efficiency" in out
    assert "stale" not in out


def test_cli_refuses_a_missing_file(tmp_path, capsys):
    assert calibrate.main([str(tmp_path / "none.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
