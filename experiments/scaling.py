"""The scaling curve: ``python run.py -m +experiment=scaling`` plans one model over a range of
device counts with the chosen planners (``conf/experiment/scaling.yaml``); the sweep's
``plots/scaling.png`` (:mod:`experiments.scaling_plot`) shows throughput, MFU and the cost of a
million tokens per planner against the devices.

``python -m experiments.scaling DIR [--gpu-hour-usd X]`` redraws ``DIR/plots/scaling.png`` from
a finished (or partial) sweep, at the sweep's price or another one (the price scales the cost
axis only).
"""

import argparse
import sys
from pathlib import Path

from experiments import aggregate as agg
from experiments.scaling_plot import plot_scaling


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.scaling",
        description="Redraw DIR/plots/scaling.png (throughput, MFU, cost per token vs devices).",
    )
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun directory")
    parser.add_argument(
        "--gpu-hour-usd",
        type=float,
        default=None,
        help="price of one device-hour (default: the sweep's hydra.callbacks.sweep.gpu_hour_usd)",
    )
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"error: {args.sweep_dir} is not a directory; give a sweep dir", file=sys.stderr)
        return 2
    price = args.gpu_hour_usd if args.gpu_hour_usd is not None else agg.sweep_price(args.sweep_dir)
    try:
        df = agg.load_rows(args.sweep_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    baseline = agg.sweep_baseline(args.sweep_dir)
    comp = agg.comparison(df, baseline, gpu_hour_usd=price)
    out = args.sweep_dir / agg.PLOTS_DIR
    out.mkdir(exist_ok=True)
    path = plot_scaling(
        comp, out / "scaling.png", planners=agg.planner_order(df, baseline), gpu_hour_usd=price
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
