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
    CalibrationSplit,
    device_config,
    predict,
    presets,
)
from nest.core.errors import UserError
from nest.core.kernels import CALIBRATED_MATMUL_EFFICIENCY, derived_matmul_efficiency

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


def fit(rows: list[dict], ceiling: float) -> tuple[float, float]:
    """``(rate, objective)``: the grid minimum of :func:`objective` in ``[FIT_LOW, ceiling]``
    (module docstring)."""
    if not rows:
        raise UserError(
            f"no rows of the calibration split ({CALIBRATION_SPLIT.source}, "
            f"{CALIBRATION_SPLIT.precision}); give the CSV that holds them"
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nest.calibrate",
        description="Fit the in-step GEMM rate (matmul_efficiency) on the declared calibration "
        "split and print it.",
    )
    parser.add_argument(
        "csv", type=Path, nargs="?", default=DEFAULT_CSV, help=f"default: {DEFAULT_CSV}"
    )
    args = parser.parse_args(argv)
    try:
        if not args.csv.is_file():
            raise UserError(f"{args.csv} does not exist; give the validation CSV")
        with open(args.csv, newline="", encoding="utf-8-sig") as fh:
            rows = split_rows(list(csv.DictReader(fh)))
        ceiling = float(device_config("h100_sxm")["gemm_ceiling"])
        rate, value = fit(rows, ceiling)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"calibration split: {CALIBRATION_SPLIT.source}, precision {CALIBRATION_SPLIT.precision}"
        f" ({len(rows)} rows)"
    )
    for row in rows:
        o = predict(row, rate)
        print(f"  {row['case'].split(' (')[0]:<44} error {100 * o.error:+6.1f} %")
    print(
        f"fitted matmul_efficiency {rate:.3f} (median |log error| {100 * value:.2f} %); "
        f"stored {CALIBRATED_MATMUL_EFFICIENCY:.3f}"
    )
    print(
        f"the other presets at the fitted share of their ceilings ({rate / ceiling:.3f}): "
        + ", ".join(
            f"{name} {derived_matmul_efficiency(c, rate / ceiling):.3f}"
            for name, c in _ceilings_of_derived_presets()
        )
    )
    if abs(rate - CALIBRATED_MATMUL_EFFICIENCY) > STALE_TOLERANCE:
        print(
            "stale: store the fitted value in nest/core/kernels.py CALIBRATED_MATMUL_EFFICIENCY "
            "and conf/device/h100_sxm.yaml, h200_sxm.yaml matmul_efficiency, and the line above "
            "in the other presets' matmul_efficiency"
        )
    return 0


def _ceilings_of_derived_presets() -> list[tuple[str, float]]:
    """``(preset, gemm_ceiling)`` of the presets whose in-step rate is derived
    (:func:`nest.core.kernels.derived_matmul_efficiency`): those with a published ceiling
    other than the calibrated H100 and H200."""
    out = []
    for name in presets("device"):
        ceiling = yaml.safe_load((CONF_DIR / "device" / f"{name}.yaml").read_text()).get(
            "gemm_ceiling"
        )
        if name not in ("h100_sxm", "h200_sxm") and ceiling is not None:
            out.append((name, float(ceiling)))
    return out
