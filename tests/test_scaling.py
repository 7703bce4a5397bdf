"""The scaling curve (``+experiment=scaling``) and the cost per token; a second reference planner.

One real multirun in a subprocess (tiny model, three device counts, two planners, a price), then
checks on what it wrote: the cost columns follow their definition (every device of the cluster
billed), the second reference planner gets its own speed-up column and section, and
``plots/scaling.png`` is drawn (and redrawn by ``python -m experiments.scaling``).
"""

import os
import subprocess
import sys
from pathlib import Path

import hydra
import matplotlib.image
import pandas as pd
import pytest

import nest.app.cli
from experiments import aggregate as agg
from experiments import scaling

CONF_DIR = nest.app.cli.CONF_DIR
RUN_PY = Path(CONF_DIR).parent / "run.py"
PRICE = 3.5


def test_the_scaling_experiment_plans_one_model_over_device_counts():
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra.compose(
            config_name="config", overrides=["+experiment=scaling"], return_hydra_config=True
        )
    params = cfg.hydra.sweeper.params
    devices = [int(d) for d in str(params["cluster.devices"]).split(",")]
    assert len(devices) >= 5 and devices == sorted(devices) and devices[-1] >= 4096
    assert {"megatron", "recipes", "nest"} <= set(str(params["solver"]).split(","))
    sweep = cfg.hydra.callbacks.sweep
    assert sweep.baseline == "recipes" and list(sweep.also) == ["megatron"]
    assert sweep.gpu_hour_usd > 0


@pytest.fixture(scope="module")
def scaling_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scaling")
    sweep_dir = tmp / "multirun"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.run(
        [
            sys.executable,
            str(RUN_PY),
            "-m",
            "+experiment=scaling",
            "model=tiny",
            "solver=megatron,recipes",
            "cluster.devices=8,16,32",
            "training.global_batch=24",  # 16 and 32 devices: 12 and 24 replicas, the rest idle
            "training.microbatch_sizes=[1]",
            f"hydra.callbacks.sweep.gpu_hour_usd={PRICE}",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sweep_dir


def test_cost_per_token_bills_every_device_of_the_cluster(scaling_sweep):
    comp = pd.read_csv(scaling_sweep / "comparison.csv")
    rows = pd.read_csv(scaling_sweep / "results.csv")
    assert comp["feasible"].all() and len(comp) == 6
    idle = rows["devices_used"] < rows["devices"]
    assert idle.any()  # a batch of 24 leaves devices idle at 16 and 32
    for _, job in comp.iterrows():
        hours = job["devices"] / 3600 / job["tokens_per_s"] * 1e6
        assert job["gpu_hours_per_mtok"] == pytest.approx(hours, rel=1e-12)
        assert job["usd_per_mtok"] == pytest.approx(PRICE * hours, rel=1e-12)


def test_a_second_reference_planner_gets_its_own_speedups(scaling_sweep):
    comp = pd.read_csv(scaling_sweep / "comparison.csv")
    for _, job in comp.iterrows():
        same = comp[(comp.planner == "megatron") & (comp.devices == job["devices"])]
        tput = same["throughput_samples_per_s"].item()
        assert job["speedup_vs_megatron"] == pytest.approx(
            job["throughput_samples_per_s"] / tput, rel=1e-12
        )
        ref = comp[(comp.planner == "recipes") & (comp.devices == job["devices"])]
        assert job["speedup_vs_baseline"] == pytest.approx(
            job["throughput_samples_per_s"] / ref["throughput_samples_per_s"].item(), rel=1e-12
        )
    md = (scaling_sweep / "results.md").read_text()
    assert "Baseline planner: `recipes`" in md
    assert "## Speed-up over `megatron` at the same scale" in md
    assert "## Cost: device-hours per million tokens" in md and f"${PRICE:g} per" in md


def _png(path: Path) -> tuple[int, int]:
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.std() > 0.01  # drawn, not blank
    return image.shape[:2]


def test_the_scaling_plot_is_drawn_and_can_be_redrawn(scaling_sweep, tmp_path):
    path = scaling_sweep / "plots" / "scaling.png"
    height, width = _png(path)
    assert width > 1000 and height > 300  # three panels side by side
    before = path.read_bytes()
    assert scaling.main([str(scaling_sweep), "--gpu-hour-usd", "1.0"]) == 0
    assert path.read_bytes() != before  # the cost axis follows the price
    _png(path)
    assert scaling.main([str(tmp_path / "nope")]) == 2


def test_standalone_aggregation_keeps_the_sweeps_references_and_price(scaling_sweep):
    assert agg.sweep_baseline(scaling_sweep) == "recipes"
    assert agg.sweep_also(scaling_sweep) == ["megatron"]
    assert agg.sweep_price(scaling_sweep) == PRICE
