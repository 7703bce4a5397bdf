"""The optimality study runs as a Hydra sweep and aggregates into its table, histogram and
summary; the summary's numbers follow from the rows."""

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from experiments.optimality.aggregate import main as aggregate_main
from experiments.optimality.aggregate import summarise
from experiments.optimality.instances import instance
from experiments.optimality.run import still_running

ROOT = Path(__file__).resolve().parents[1]


def test_instances_are_seeded_and_small():
    a, opts_a = instance(3)
    b, _ = instance(3)
    assert a.cluster == b.cluster and a.model.spec == b.model.spec and opts_a == {}
    sizes = [instance(s)[0].cluster.num_devices for s in range(60)]
    assert max(sizes) <= 8 and min(sizes) >= 2
    _, restricted = instance(3, restrict=True)
    assert set(restricted) == {"zero_stages", "rank_orders"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("study") / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.optimality.run",
            "-m",
            "seed=1,4,8",
            "solvers=[nest,brute,cpsat_restricted,milp_restricted,cpsat_general]",
            "hydra/launcher=parallel",  # docs/trust/exact.md's command
            "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path_factory.mktemp("cwd"),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sweep, proc.stdout + proc.stderr


def test_study_sweep_writes_table_histogram_and_summary(study):
    sweep, stdout = study
    df = pd.read_csv(sweep / "optimality.csv")
    assert sorted(df["seed"]) == [1, 4, 8]
    for name in ("nest", "brute", "cpsat_restricted", "milp_restricted", "cpsat_general"):
        assert f"{name}_s" in df and f"{name}_status" in df and f"{name}_time_s" in df
    feasible = df[df["nest_status"] == "optimal"]
    assert len(feasible) >= 2
    for col in ("brute_s", "cpsat_restricted_s", "milp_restricted_s"):
        ran = feasible[col].notna()
        assert (
            (feasible[col][ran] - feasible["nest_s"][ran]).abs() <= 1e-6 * feasible["nest_s"][ran]
        ).all()
    assert (feasible["cpsat_general_s"] <= feasible["cpsat_restricted_s"] * (1 + 1e-6)).all()
    assert (sweep / "gap_histogram.png").stat().st_size > 1000
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["instances"] == 3
    assert summary["nest_agrees_with"]["cpsat_restricted"]["equal"] == len(feasible)
    assert "# Optimality study" in stdout  # the callback printed the summary


def test_study_sweep_shows_progress_per_instance(study):
    """Each finished instance logs its values and time, and the sweep how many are done."""
    sweep, output = study
    for seed in (1, 4, 8):
        assert f"seed {seed} done in " in output
    assert "optimality progress: 3/3 instances done" in output
    done = [line for line in output.splitlines() if "optimality progress:" in line]
    assert len(done) == 3  # once per instance
    assert json.loads((sweep / "sweep.json").read_text())["total_jobs"] == 3


def test_a_long_solve_logs_that_it_is_still_running(caplog):
    """``still_running`` logs while its block runs (here: until the first notice arrives) and
    stops with the block."""
    seen = threading.Event()

    class Notice(logging.Handler):
        def emit(self, record):
            if "still running" in record.getMessage():
                seen.set()

    handler = Notice()
    run_log = logging.getLogger("experiments.optimality.run")
    run_log.addHandler(handler)
    caplog.set_level(logging.INFO, logger="experiments.optimality.run")
    try:
        with still_running("seed 7: cpsat_general (limit 60 s)", every_s=0.01):
            assert seen.wait(timeout=60)  # a solve that lasts until it has been reported
    finally:
        run_log.removeHandler(handler)
    messages = [r.getMessage() for r in caplog.records]
    assert messages and all(
        m.startswith("seed 7: cpsat_general (limit 60 s) still running after ") for m in messages
    )
    assert not any(t.name == "still-running" for t in threading.enumerate())


def test_aggregate_again_gives_the_same_tables(study, capsys):
    sweep, _ = study
    first = (sweep / "optimality.csv").read_bytes(), (sweep / "summary.md").read_bytes()
    assert aggregate_main([str(sweep)]) == 0
    assert ((sweep / "optimality.csv").read_bytes(), (sweep / "summary.md").read_bytes()) == first
    assert aggregate_main([str(sweep / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_summary_counts_gaps_and_agreement_from_the_rows():
    """Three feasible instances, general strictly better on one by 25%: share 2/3, worst 0.25."""
    df = pd.DataFrame(
        {
            "seed": [0, 1, 2, 3],
            "nest_s": [1.0, 2.0, 4.0, None],
            "nest_status": ["optimal"] * 3 + ["infeasible"],
            "cpsat_restricted_s": [1.0, 2.0, 4.0, None],
            "cpsat_restricted_status": ["optimal"] * 3 + ["infeasible"],
            "cpsat_restricted_time_s": [0.1, 0.2, 0.3, 0.1],
            "cpsat_general_s": [1.0, 1.5, 4.0, None],
            "general_gap": [0.0, 0.25, 0.0, None],
        }
    )
    s = summarise(df)
    assert s["feasible"] == 3 and s["infeasible"] == 1
    assert s["nest_agrees_with"]["cpsat_restricted"] == {"compared": 3, "equal": 3}
    assert s["general_already_optimal_share"] == pytest.approx(2 / 3)
    assert s["worst_gap"] == 0.25 and s["worst_gap_seed"] == 1


def test_an_instance_without_a_row_and_an_empty_error_file_is_a_note(tmp_path, capsys):
    """An instance directory whose worker left an empty ``error.txt`` is named in a note (it
    was an IndexError on the file's last line), read as the sweep aggregation reads it."""
    from experiments.optimality.aggregate import load_rows

    job = tmp_path / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / "error.txt").write_text("")
    assert load_rows(tmp_path) == []
    assert "0 has no row.json" in capsys.readouterr().err
