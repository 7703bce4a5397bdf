"""Fit the calibrated constants, each on its declared split: ``python -m nest.calibrate [CSV]``.

The in-step GEMM rate (``matmul_efficiency``: the fraction of peak a large GEMM keeps *inside a
training step*, :mod:`nest.core.kernels`) is the only cost-model quantity no published
micro-benchmark isolates. It is fitted here, and only here, twice by the same procedure
(:data:`CALIBRATIONS`): the GPU rate on :data:`CALIBRATION_SPLIT` and the TPU rate on
:data:`TPU_CALIBRATION_SPLIT`.

- **the TPU split**: the ``MaxText_TPU_v5e_README`` runs on 1, 4 and 16 slices of 256 v5e chips
  (12 of its 24 rows: every other slice count of each model's sweep, each of the four model
  sizes in both halves; the rule was fixed by slice count before the fit). One half of one
  source, as for the GPUs; a TPU rate of its own because the GPU share leaves every MaxText run
  predicted slow (their published MFUs are above 0.778 of the TPU ceilings). The fit is bounded
  by v5e's published ceiling; the v5e runs on 2, 8 and 32 slices and every v5p run stay held
  out, and v6e and v5p run at the fitted share of their own ceilings.
- **the GPU split**: the BF16 rows of ``NVIDIA_dgxc_benchmarking_H100_pairs`` (15 runs: GPT-3 175B,
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
  ``h200_sxm.yaml``: the same GH100 compute); the TPU rate
  :data:`nest.core.kernels.CALIBRATED_TPU_MATMUL_EFFICIENCY` and ``conf/device/tpu_v5e.yaml``'s
  ``matmul_efficiency``. ``tests/test_calibrate.py`` fails when a stored
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
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """One calibrated constant (module docstring): its declared ``split``, the preset whose
    ``gemm_ceiling`` bounds the fit, the presets that store the fitted rate, the value stored
    in :mod:`nest.core.kernels`, and whether it is the TPU one (``tpu``: the derived presets it
    prints are the TPUs)."""

    split: CalibrationSplit
    ceiling_preset: str
    stores: tuple[str, ...]
    stored: float
    constant: str
    tpu: bool


CALIBRATIONS = (
    Calibration(
        split=CALIBRATION_SPLIT,
        ceiling_preset="h100_sxm",
        stores=("h100_sxm", "h200_sxm"),
        stored=CALIBRATED_MATMUL_EFFICIENCY,
        constant="CALIBRATED_MATMUL_EFFICIENCY",
        tpu=False,
    ),
    Calibration(
        split=TPU_CALIBRATION_SPLIT,
        ceiling_preset="tpu_v5e",
        stores=("tpu_v5e",),
        stored=CALIBRATED_TPU_MATMUL_EFFICIENCY,
        constant="CALIBRATED_TPU_MATMUL_EFFICIENCY",
        tpu=True,
    ),
)
"""Each calibrated constant, fitted by :func:`main` in this order."""


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
        for cal in CALIBRATIONS:
            rows = split_rows(all_rows, cal.split)
            ceiling = float(device_config(cal.ceiling_preset)["gemm_ceiling"])
            fits.append((cal, rows, ceiling, *fit(rows, ceiling, cal.split)))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for cal, rows, ceiling, rate, value in fits:
        _report(cal, rows, ceiling, rate, value)
    return 0


def _report(cal: Calibration, rows: list[dict], ceiling: float, rate: float, value: float):
    """Print one calibrated constant's fit (:func:`main`)."""
    kind = "TPU" if cal.tpu else "GPU"
    split = cal.split
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
        f"{100 * value:.2f} %); stored {cal.stored:.3f}"
    )
    print(
        f"the other {kind} presets at the fitted share of their ceilings ({rate / ceiling:.3f}): "
        + ", ".join(
            f"{name} {derived_matmul_efficiency(c, rate / ceiling):.3f}"
            for name, c in _ceilings_of_derived_presets(cal.tpu)
        )
    )
    if abs(rate - cal.stored) > STALE_TOLERANCE:
        print(
            f"stale: store the fitted value in nest/core/kernels.py {cal.constant} and the "
            f"matmul_efficiency of conf/device/{', '.join(f'{p}.yaml' for p in cal.stores)}, "
            "and the line above in those presets' matmul_efficiency"
        )


def _ceilings_of_derived_presets(tpu: bool = False) -> list[tuple[str, float]]:
    """``(preset, gemm_ceiling)`` of the presets whose in-step rate is derived
    (:func:`nest.core.kernels.derived_matmul_efficiency`): those with a published ceiling
    other than the calibrated ones, the TPUs (``tpu``) or the others."""
    calibrated = {p for cal in CALIBRATIONS for p in cal.stores}
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
