"""Fit the one calibrated constant, on a declared split: ``python -m nest.calibrate [FILE.csv]``.

The in-step GEMM rate (``matmul_efficiency``: the fraction of peak a large GEMM keeps *inside a
training step*, :mod:`nest.core.kernels`) is the only cost-model constant no published
micro-benchmark isolates. It is fitted here, and only here, on :data:`CALIBRATION_SPLIT`:

- **the split**: the BF16 rows of ``NVIDIA_dgxc_benchmarking_H100_pairs`` (15 runs: GPT-3 175B,
  Llama 3.1 8B / 70B / 405B, Nemotron-4 15B / 340B, Grok-1 314B, Llama 4 Maverick on 8 to 2,048
  H100s, NVIDIA's published step times). It is one half of the pairs of one source, as issue 22
  allows: the BF16 half, because the FP8 half then tests the transfer of the fitted rate to
  FP8 (:attr:`nest.core.hardware.Device.fp8_level` scales the FP8 micro-benchmark ceiling by the
  same in-step share), and because it is the H100 source with the most varied models and
  layouts measured the same way (one framework, one metric: ``train_step_timing``).
- **held out**: every other row (its FP8 half, every other source) is reported as held-out by
  ``python -m nest.validate``; no per-case or per-source factor exists.
- **the objective**: the median over the split of ``|log(predicted / measured)|`` (symmetric
  in over- and under-prediction, robust to one odd row), minimised over a grid of step
  :data:`FIT_STEP` in ``[FIT_LOW, gemm_ceiling]`` (coarse pass at ten steps, then the fine
  steps around the best; ties go to the lower rate). Deterministic.
- **where it goes**: :data:`nest.core.kernels.CALIBRATED_MATMUL_EFFICIENCY` and the
  ``matmul_efficiency`` of the H100 and H200 presets (``conf/device/h100_sxm.yaml``,
  ``h200_sxm.yaml``: the same GH100 compute); ``tests/test_calibrate.py`` fails when the stored
  value and a fresh fit differ by more than :data:`STALE_TOLERANCE`, so it cannot go stale
  silently. After any cost-model change: run ``python -m nest.calibrate``, store the printed
  value in the three places and the derived rates it prints in the other presets with a ceiling
  (:func:`nest.core.kernels.derived_matmul_efficiency`, the same share of each one's measured
  ceiling), re-pin ``tests/test_validate.py``.
"""

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path

import yaml

from nest.app.validate import (
    CALIBRATION_SPLIT,
    CONF_DIR,
    TPU_CALIBRATION_SPLIT,
    CalibrationSplit,
    device_config,
    predict,
    presets,
)
from nest.core.errors import UserError
from nest.core.kernels import (
    CALIBRATED_MATMUL_EFFICIENCY,
    CALIBRATED_TPU_MATMUL_EFFICIENCY,
    derived_matmul_efficiency,
)

DEFAULT_CSV = Path("experiments/validation/cases.csv")
FIT_LOW = 0.45
"""The lowest in-step GEMM rate searched (below every published dense H100 run's MFU / 0.9)."""
FIT_STEP = 0.001
STALE_TOLERANCE = 0.005
"""How far the stored constant may be from a fresh fit before the test calls it stale."""


def split_rows(rows: list[dict], split: CalibrationSplit = CALIBRATION_SPLIT) -> list[dict]:
    return [r for r in rows if split.holds(r)]


def objective(rows: list[dict], matmul_efficiency: float) -> float:
    """Median ``|log(predicted / measured)|`` of the rows at this in-step GEMM rate; a row the
    model cannot score counts as infinitely wrong."""
    logs = []
    for row in rows:
        outcome = predict(row, matmul_efficiency)
        if outcome.predicted is None or not outcome.predicted > 0:
            logs.append(math.inf)
        else:
            logs.append(abs(math.log(outcome.predicted / outcome.measured)))
    return statistics.median(logs)


def fit(
    rows: list[dict], ceiling: float, split: CalibrationSplit = CALIBRATION_SPLIT
) -> tuple[float, float]:
    """``(rate, objective)``: the grid minimum of :func:`objective` in ``[FIT_LOW, ceiling]``
    (module docstring); ``split`` names the rows in the error when there are none."""
    if not rows:
        raise UserError(
            f"no rows of the calibration split ({split.source}, "
            f"{split.precision}); give the CSV that holds them"
        )

    def grid(low: float, high: float, step: float) -> list[float]:
        n = int(round((high - low) / step))
        return [round(low + i * step, 6) for i in range(n + 1)]

    def best_of(points: list[float]) -> tuple[float, float]:
        scored = [(objective(rows, e), e) for e in points]
        value, rate = min(scored)
        return rate, value

    coarse, _ = best_of(grid(FIT_LOW, ceiling, 10 * FIT_STEP))
    low = max(FIT_LOW, coarse - 10 * FIT_STEP)
    high = min(ceiling, coarse + 10 * FIT_STEP)
    return best_of(grid(low, high, FIT_STEP))


CALIBRATIONS = (
    (CALIBRATION_SPLIT, "h100_sxm", ("h100_sxm", "h200_sxm"), CALIBRATED_MATMUL_EFFICIENCY, False),
    (TPU_CALIBRATION_SPLIT, "tpu_v5e", ("tpu_v5e",), CALIBRATED_TPU_MATMUL_EFFICIENCY, True),
)
"""Each calibrated constant: ``(split, preset whose ceiling bounds the fit, presets that store
the fitted rate, stored value, whether it is the TPU one)`` (module docstring)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nest.calibrate",
        description="Fit the in-step GEMM rates (matmul_efficiency, GPU and TPU) on their declared "
        "calibration splits and print them.",
    )
    parser.add_argument(
        "csv", type=Path, nargs="?", default=DEFAULT_CSV, help=f"default: {DEFAULT_CSV}"
    )
    args = parser.parse_args(argv)
    try:
        if not args.csv.is_file():
            raise UserError(f"{args.csv} does not exist; give the validation CSV")
        with open(args.csv, newline="", encoding="utf-8-sig") as fh:
            all_rows = list(csv.DictReader(fh))
        fits = []
        for split, preset, _, _, _ in CALIBRATIONS:
            rows = split_rows(all_rows, split)
            ceiling = float(device_config(preset)["gemm_ceiling"])
            fits.append((rows, ceiling, *fit(rows, ceiling, split)))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for (split, _, stores, stored, tpu), (rows, ceiling, rate, value) in zip(
        CALIBRATIONS, fits, strict=True
    ):
        _report(split, stores, stored, tpu, rows, ceiling, rate, value)
    return 0


def _report(split, stores, stored, tpu, rows, ceiling, rate, value) -> None:
    """Print one calibrated constant's fit (:func:`main`)."""
    kind = "TPU" if tpu else "GPU"
    counts = f", {'/'.join(map(str, split.gpus))} devices" if split.gpus else ""
    print(
        f"{kind} calibration split: {split.source}, precision {split.precision}{counts}"
        f" ({len(rows)} rows)"
    )
    for row in rows:
        o = predict(row, rate)
        name = f"{row['case'].split(' (')[0][:34]} on {row['gpus']}"
        print(f"  {name:<44} error {100 * o.error:+6.1f} %")
    at_bound = " (at its bound, the ceiling)" if rate >= ceiling else ""
    print(
        f"fitted {kind} matmul_efficiency {rate:.3f}{at_bound} (median |log error| "
        f"{100 * value:.2f} %); stored {stored:.3f}"
    )
    print(
        f"the other {kind} presets at the fitted share of their ceilings ({rate / ceiling:.3f}): "
        + ", ".join(
            f"{name} {derived_matmul_efficiency(c, rate / ceiling):.3f}"
            for name, c in _ceilings_of_derived_presets(tpu)
        )
    )
    if abs(rate - stored) > STALE_TOLERANCE:
        constant = "CALIBRATED_TPU_MATMUL_EFFICIENCY" if tpu else "CALIBRATED_MATMUL_EFFICIENCY"
        print(
            f"stale: store the fitted value in nest/core/kernels.py {constant} and the "
            f"matmul_efficiency of conf/device/{', '.join(f'{p}.yaml' for p in stores)}, and the "
            "line above in those presets' matmul_efficiency"
        )


def _ceilings_of_derived_presets(tpu: bool = False) -> list[tuple[str, float]]:
    """``(preset, gemm_ceiling)`` of the presets whose in-step rate is derived
    (:func:`nest.core.kernels.derived_matmul_efficiency`): those with a published ceiling
    other than the calibrated ones, the TPUs (``tpu``) or the others."""
    calibrated = {p for _, _, stores, _, _ in CALIBRATIONS for p in stores}
    out = []
    for name in presets("device"):
        ceiling = yaml.safe_load((CONF_DIR / "device" / f"{name}.yaml").read_text()).get(
            "gemm_ceiling"
        )
        if name in calibrated or ceiling is None or is_tpu_preset(name) != tpu:
            continue
        out.append((name, float(ceiling)))
    return out


def is_tpu_preset(name: str) -> bool:
    """Whether a device preset is a TPU (its in-step share is the TPU one)."""
    return name.startswith("tpu")
