"""Sweeps: every job leaves a row, aggregation, plots, the paper's experiment configs, launchers.

The module fixture runs one real multirun in a subprocess (``run.py -m`` with the project's
``parallel`` launcher, two workers): the tiny model, three planners (``nest``, ``megatron`` and
the test-only ``flaky``, which raises an unexpected exception on one cluster size and kills its
own worker process with SIGKILL on another), two clusters and two sizes. Everything is written
under pytest's ``tmp_path`` directories.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import hydra
import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

import nest.app.cli
from experiments import aggregate as agg
from experiments.callbacks import expand_sweep, sweep_progress
from experiments.plots import NO_PLAN_MARKERS, placement_grid, plot_job, throughput_figure
from experiments.published import load_published, published_speedups, published_table
from nest.app.results import ROW_COLUMNS, make_row, planner_label, run_recorded

from .test_cli import compose

CONF_DIR = nest.app.cli.CONF_DIR
REPO_ROOT = Path(CONF_DIR).parent
RUN_PY = REPO_ROOT / "run.py"
DATA = REPO_ROOT / "data"
EXPERIMENTS = sorted(p.stem for p in Path(CONF_DIR, "experiment").glob("*.yaml"))
PAPER_EXPERIMENTS = ("fig5", "fig6", "table3")  # scaling: tests/test_scaling.py
PAPER_MODELS = {"bert_large", "llama2_7b", "llama3_70b", "mixtral_8x7b", "gpt3_175b"}

FLAKY_YAML = """\
_target_: tests.flaky.FlakyPlanner
name: flaky
crash_cluster: h100_spineleaf
crash_devices: 64
kill_cluster: tpuv4_fattree
kill_devices: 32
"""
SWEEP_ARGS = [
    "model=tiny",
    "solver=nest,megatron,flaky",
    "cluster=tpuv4_fattree,h100_spineleaf",
    "cluster.devices=32,64",
    "print_summary=false",
    "hydra/launcher=parallel",
    "hydra.launcher.n_jobs=2",
]
N_JOBS = 12
KILLED_JOB = 8  # flaky on tpuv4_fattree with 32 devices (the first key varies slowest)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["MPLBACKEND"] = "Agg"
    return env


def run_multirun(tmp: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN_PY), "-m", *args],
        cwd=tmp,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "conf/solver").mkdir(parents=True)
    (tmp / "conf/solver/flaky.yaml").write_text(FLAKY_YAML)
    sweep_dir = tmp / "multirun"
    proc = run_multirun(
        tmp, f"--config-dir={tmp / 'conf'}", *SWEEP_ARGS, f"hydra.sweep.dir={sweep_dir}"
    )
    # two jobs crashed (one raised, one killed its worker): the sweep says so in its exit status
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return sweep_dir, proc.stdout + proc.stderr


def _copy(sweep_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(sweep_dir, tmp_path / sweep_dir.name))


# ------------------------------------------------------------------------------------------------
# The multirun: one row per job, the crash marked, the sweep finished and aggregated
# ------------------------------------------------------------------------------------------------


def test_small_multirun_has_a_row_per_job_and_marks_the_crash(small_sweep):
    sweep_dir, output = small_sweep
    df = pd.read_csv(sweep_dir / "results.csv")
    assert list(df.columns[: len(ROW_COLUMNS)]) == list(ROW_COLUMNS)
    assert sorted(df["job"]) == list(range(N_JOBS))
    crashed = df[(df["status"] == "crashed") & (df["job"] != KILLED_JOB)]
    assert len(crashed) == 1
    bad = crashed.iloc[0]
    assert (bad["planner"], bad["cluster"], bad["devices"]) == ("flaky", "h100_spineleaf", 64)
    assert bad["error"] == "RuntimeError: forced crash on h100_spineleaf with 64 devices"
    assert not bad["feasible"] and pd.isna(bad["throughput_samples_per_s"])
    job_dir = sweep_dir / str(bad["job_dir"])
    assert "Traceback" in (job_dir / "error.txt").read_text()
    # every other job planned, and its row holds the shared evaluator's numbers from report.json
    ok = df[df["status"] != "crashed"]
    assert len(ok) == N_JOBS - 2
    assert set(ok["status"]) <= {"optimal", "feasible"} and ok["feasible"].all()
    for _, row in ok.iterrows():
        report = json.loads((sweep_dir / str(row["job_dir"]) / "report.json").read_text())
        assert row["iteration_time_s"] == pytest.approx(report["iteration_time_s"], rel=1e-12)
        assert row["peak_memory_bytes"] == pytest.approx(report["peak_memory_bytes"], rel=1e-12)
        assert row["throughput_samples_per_s"] == pytest.approx(1024 / row["iteration_time_s"])
        assert row["tp"] * row["cp"] * row["dp"] * row["pp"] == row["devices_used"]
        assert row["devices_used"] <= row["devices"]
        assert f"solver={row['solver']}" in row["overrides"].split()
        assert f"cluster.devices={row['devices']}" in row["overrides"].split()
    assert set(df["planner"]) == {"nest", "megatron", "flaky"}
    # progress and the final pointers were printed (the killed job never wrote a row)
    assert "11/12 jobs done, 1 failed (1 crashed)" in output
    assert str(sweep_dir / "results.csv") in output and str(sweep_dir / "plots") in output
    assert "error: 2 of 12 jobs failed (2 crashed)" in output
    md = (sweep_dir / "results.md").read_text()
    assert "| crashed " in md and "RuntimeError: forced crash" in md


def test_a_job_that_kills_its_worker_is_a_crashed_row_and_the_rest_run(small_sweep):
    """The ``parallel`` launcher: one job SIGKILLs its own worker process (Hydra's joblib launcher
    stops the whole sweep there with TerminatedWorkerError); every other job still runs and
    writes its row, the dead one is a ``crashed`` row saying so, and the sweep is aggregated."""
    sweep_dir, output = small_sweep
    df = pd.read_csv(sweep_dir / "results.csv")
    dead = df[df["job"] == KILLED_JOB].iloc[0]
    assert (dead["planner"], dead["cluster"], dead["devices"]) == ("flaky", "tpuv4_fattree", 32)
    assert dead["status"] == "crashed" and not dead["feasible"]
    assert dead["error"].startswith("worker process died (SIGKILL(-9))")
    job_dir = sweep_dir / str(dead["job_dir"])
    assert not (job_dir / "row.json").exists()
    assert (job_dir / "error.txt").read_text().startswith("worker process died")
    assert f"job #{KILLED_JOB} killed its worker process" in output
    rows = sorted(int(p.parent.name) for p in sweep_dir.glob("*/row.json"))
    assert rows == [n for n in range(N_JOBS) if n != KILLED_JOB]
    assert not (sweep_dir / ".launcher").exists()  # the start markers are cleaned up
    assert "worker process died" in (sweep_dir / "results.md").read_text()


def _sweep_conf(tmp: Path, **flaky) -> Path:
    conf = tmp / "conf"
    (conf / "solver").mkdir(parents=True)
    fields = "".join(f"{k}: {v}\n" for k, v in flaky.items())
    (conf / "solver/flaky.yaml").write_text(
        f"_target_: tests.flaky.FlakyPlanner\nname: flaky\n{fields}"
    )
    return conf


SMALL_CLUSTER = ["cluster=dgx_8x8", "cluster.levels.1.fanout=2", "cluster.devices=null"]


@pytest.mark.parametrize(
    "tp, returncode, counts",
    [("1", 0, "1 feasible, 1 infeasible"), ("1,3", 1, "2 error, 1 feasible, 1 infeasible")],
)
def test_sweep_exit_status_counts_failures_not_infeasible_answers(tmp_path, tp, returncode, counts):
    """A model that does not fit (``infeasible``) is an answer: the sweep exits 0. A job with a
    bad setting (``error``: tp=3 does not divide the heads) is a failure: the sweep exits 1,
    after writing every row and the tables."""
    sweep_dir = tmp_path / "multirun"
    proc = run_multirun(
        tmp_path,
        "solver=fixed",
        f"solver.tp={tp}",
        "model=tiny,gpt3_175b",
        *SMALL_CLUSTER,
        "print_summary=false",
        "hydra.callbacks.sweep.plots=false",
        f"hydra.sweep.dir={sweep_dir}",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == returncode, output
    assert f"({counts})" in output  # aggregated either way
    df = pd.read_csv(sweep_dir / "results.csv")
    assert len(df) == (2 if tp == "1" else 4)
    assert ("jobs failed" in proc.stderr) == bool(returncode)
    if returncode:
        assert "error: 2 of 4 jobs failed (2 error)" in proc.stderr


def test_an_interrupted_sweep_prints_the_aggregate_command(tmp_path):
    """A sweep that stops before its end (Ctrl-C: KeyboardInterrupt in the second job) exits
    non-zero and says how to build the tables from the rows written so far; that command works."""
    conf = _sweep_conf(tmp_path, interrupt_cluster="dgx_8x8", interrupt_devices=16)
    sweep_dir = tmp_path / "multirun"
    proc = run_multirun(
        tmp_path,
        f"--config-dir={conf}",
        "solver=flaky",
        "model=tiny",
        "cluster=dgx_8x8",
        "cluster.devices=8,16,32",
        "print_summary=false",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not (sweep_dir / "results.csv").exists()
    assert "note: the sweep stopped before its end-of-sweep step" in proc.stderr
    assert f"python -m experiments.aggregate {sweep_dir}" in proc.stderr
    assert agg.main([str(sweep_dir), "--no-plots"]) == 0
    df = pd.read_csv(sweep_dir / "results.csv")
    assert df["status"].tolist()[0] == "feasible"
    assert df["status"].tolist()[1:] == ["missing", "missing"]  # interrupted, never started


def test_a_failed_aggregation_exits_1_with_the_command(tmp_path, capsys):
    """Hydra turns an exception in ``on_multirun_end`` into a warning and exits 0; the callback
    reports it in one line with the command to rerun and exits 1."""
    from experiments.callbacks import SweepCallback

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SystemExit) as exit_info:
        SweepCallback().on_multirun_end(config)  # an empty directory: nothing to aggregate
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "error: the sweep's tables could not be built (FileNotFoundError" in err
    assert f"python -m experiments.aggregate {tmp_path}" in err


def test_sweep_json_lists_the_jobs_hydra_ran(small_sweep):
    sweep_dir, _ = small_sweep
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["total_jobs"] == N_JOBS == len(record["jobs"])
    for num, overrides in enumerate(record["jobs"]):
        ran = list(OmegaConf.load(sweep_dir / str(num) / ".hydra/overrides.yaml"))
        assert ran == overrides
    assert sweep_progress(sweep_dir).startswith(f"{N_JOBS - 1}/{N_JOBS} jobs done, 1 failed")


def test_comparison_normalises_to_the_baseline(small_sweep):
    """norm = throughput / megatron's at the smallest size of the same cluster and model."""
    sweep_dir, _ = small_sweep
    df = pd.read_csv(sweep_dir / "results.csv")
    comp = pd.read_csv(sweep_dir / "comparison.csv")
    assert len(comp) == len(df)
    for cluster in ("tpuv4_fattree", "h100_spineleaf"):
        ref = df[(df.planner == "megatron") & (df.cluster == cluster) & (df.devices == 32)]
        ref_tput = ref["throughput_samples_per_s"].item()
        for _, row in df[(df.cluster == cluster) & df.feasible].iterrows():
            mine = comp[comp.job == row["job"]].iloc[0]
            same = df[
                (df.planner == "megatron") & (df.cluster == cluster) & (df.devices == row.devices)
            ]["throughput_samples_per_s"].item()
            tput = row["throughput_samples_per_s"]
            assert mine["norm_throughput"] == pytest.approx(tput / ref_tput, rel=1e-12)
            assert mine["speedup_vs_baseline"] == pytest.approx(tput / same, rel=1e-12)
    assert comp[comp.status == "crashed"]["norm_throughput"].isna().all()


# ------------------------------------------------------------------------------------------------
# Aggregation of an existing directory
# ------------------------------------------------------------------------------------------------


def test_aggregate_of_an_existing_dir_is_idempotent(small_sweep, tmp_path, capsys):
    sweep_dir = _copy(small_sweep[0], tmp_path)
    files = ("results.csv", "comparison.csv", "results.md")
    first = {f: (sweep_dir / f).read_bytes() for f in files}
    parquet = pd.read_parquet(sweep_dir / "results.parquet")
    listing = sorted(p.relative_to(sweep_dir) for p in sweep_dir.rglob("*"))
    for _ in range(2):
        assert agg.main([str(sweep_dir)]) == 0
        assert {f: (sweep_dir / f).read_bytes() for f in files} == first
        assert sorted(p.relative_to(sweep_dir) for p in sweep_dir.rglob("*")) == listing
        pd.testing.assert_frame_equal(pd.read_parquet(sweep_dir / "results.parquet"), parquet)
    out = capsys.readouterr().out
    assert f"aggregated {N_JOBS} jobs (2 crashed" in out and "results.csv" in out


def test_aggregate_marks_killed_and_unstarted_jobs_missing(small_sweep, tmp_path):
    sweep_dir = _copy(small_sweep[0], tmp_path)
    (sweep_dir / "3" / "row.json").unlink()  # killed: its directory exists, its row does not
    shutil.rmtree(sweep_dir / "5")  # never started: only sweep.json knows it
    result = agg.aggregate(sweep_dir, plots=False)
    df = pd.read_csv(sweep_dir / "results.csv")
    assert sorted(df["job"]) == list(range(N_JOBS)) and result.jobs == N_JOBS
    record = json.loads((sweep_dir / "sweep.json").read_text())
    for num, why in ((3, "killed"), (5, "never started")):
        row = df[df.job == num].iloc[0]
        assert row["status"] == "missing" and why in row["error"]
        assert row["overrides"] == " ".join(record["jobs"][num])
        assert f"solver={row['solver']}" in record["jobs"][num]
    assert result.status_counts["missing"] == 2


def test_aggregate_reports_unreadable_rows_as_missing_with_a_note(small_sweep, tmp_path):
    sweep_dir = _copy(small_sweep[0], tmp_path)
    row_2 = sweep_dir / "2" / "row.json"
    row_2.write_text(row_2.read_text()[:40])  # cut short
    (sweep_dir / "4" / "row.json").write_text("not json\n")
    (sweep_dir / "6" / "row.json").write_text("[1, 2]\n")  # JSON, but not a row
    result = agg.aggregate(sweep_dir)
    df = pd.read_csv(sweep_dir / "results.csv")
    assert sorted(df["job"]) == list(range(N_JOBS)) and result.jobs == N_JOBS
    record = json.loads((sweep_dir / "sweep.json").read_text())
    for num, why in ((2, "JSONDecodeError"), (4, "JSONDecodeError"), (6, "a JSON list")):
        row = df[df.job == num].iloc[0]
        assert row["status"] == "missing" and not row["feasible"]
        assert "row.json is unreadable" in row["error"] and why in row["error"]
        assert row["overrides"] == " ".join(record["jobs"][num])  # from the job's .hydra/
        assert str(row["job_dir"]) == str(num)
    assert result.status_counts["missing"] == 3
    note = "3 unreadable row.json reported as missing (2/row.json, 4/row.json, 6/row.json)"
    assert any(n.startswith(note) for n in result.notes) and note in result.describe()


def test_aggregate_without_pyarrow_writes_csv_and_says_so(small_sweep, tmp_path, monkeypatch):
    sweep_dir = _copy(small_sweep[0], tmp_path)

    def no_engine(*args, **kwargs):  # what pandas raises when neither pyarrow nor fastparquet is
        raise ImportError("Unable to find a usable engine; tried using: 'pyarrow', 'fastparquet'.")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", no_engine)
    result = agg.aggregate(sweep_dir, plots=False)
    assert not (sweep_dir / "results.parquet").exists()
    assert (sweep_dir / "results.csv").exists()
    assert any(n.startswith("results.parquet skipped") for n in result.notes)
    assert "results.parquet skipped" in result.describe()


def test_aggregate_cli_rejects_a_dir_without_jobs(tmp_path, capsys):
    assert agg.main([str(tmp_path)]) == 2
    assert agg.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_unknown_baseline_is_a_note_not_a_failure(small_sweep, tmp_path):
    sweep_dir = _copy(small_sweep[0], tmp_path)
    result = agg.aggregate(sweep_dir, baseline="manual", plots=False)
    assert any("'manual' is not in this sweep" in n for n in result.notes)
    assert pd.read_csv(sweep_dir / "comparison.csv")["norm_throughput"].isna().all()


# ------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------


def _check_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 10_000, path
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 400
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_sweep_plots_are_drawn(small_sweep):
    plots = small_sweep[0] / "plots"
    names = sorted(p.name for p in plots.glob("*.png"))
    assert "throughput_vs_devices.png" in names
    for cluster in ("tpuv4_fattree", "h100_spineleaf"):  # the largest size of each cluster
        assert f"memory_tiny_{cluster}_64.png" in names
        assert f"placement_tiny_{cluster}_64.png" in names
    for name in names:
        _check_png(plots / name)


def test_throughput_plot_says_why_a_job_has_no_plan():
    """An ``invalid`` published row is not drawn as out of memory: each kind of job without a
    plan has its own marker and legend entry; ``unpublished`` rows are not drawn."""
    rows = [
        ("megatron", 32, "feasible", True, 10.0),
        ("megatron", 64, "feasible", True, 18.0),
        ("paper_mcmc", 32, "invalid", False, None),
        ("paper_mcmc", 64, "infeasible", False, None),
        ("paper_phaze", 32, "unpublished", False, None),
        ("paper_phaze", 64, "crashed", False, None),
    ]
    comp = pd.DataFrame(
        [
            {"planner": p, "devices": d, "status": st, "feasible": ok, "tput": v, "model": "m"}
            for p, d, st, ok, v in rows
        ]
    )
    planners = ["megatron", "paper_mcmc", "paper_phaze"]
    fig = throughput_figure(
        comp,
        x="devices",
        xlabel="devices",
        ylabel="samples/s",
        value="tput",
        title="t",
        planners=planners,
        panel_keys=["model"],
    )
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == planners
    assert labels[3:] == [NO_PLAN_MARKERS[k][1] for k in ("oom", "invalid", "failed")]
    assert not any("OOM/error" in label for label in labels)
    drawn = {}  # marker -> the devices drawn with it on the x axis
    for line in fig.axes[0].get_lines():
        if len(line.get_xdata()) and line.get_marker() != "o":
            drawn.setdefault(line.get_marker(), []).extend(line.get_xdata())
    assert drawn == {
        NO_PLAN_MARKERS["oom"][0]["marker"]: [64],
        NO_PLAN_MARKERS["invalid"][0]["marker"]: [32],
        NO_PLAN_MARKERS["failed"][0]["marker"]: [64],
    }


def test_results_md_lists_each_jobs_schedule(tmp_path):
    """The "Every job" table of results.md has the plan's pipeline schedule (and the model chunks
    per device of an interleaved one), as plan.json has it."""
    schedules = [
        ["solver.pp=2"],
        ["solver.pp=2", "solver.schedule=interleaved", "solver.virtual_stages=2"],
        ["solver.pp=2", "solver.schedule=gpipe"],
    ]
    for num, knobs in enumerate(schedules):
        overrides = ["solver=fixed", *knobs, "model=tiny", *SMALL_CLUSTER]
        cfg = compose(*overrides, "print_summary=false")
        run_recorded(
            lambda c, d: nest.app.cli.run(c, d, echo=lambda _: None),
            cfg,
            tmp_path / str(num),
            overrides=overrides,
            job=num,
        )
    agg.aggregate(tmp_path, baseline="fixed", plots=False)
    md = (tmp_path / "results.md").read_text().split("## Every job", 1)[1]
    lines = [line for line in md.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert "schedule" in header and len(cells) == len(schedules)
    for num, row in enumerate(cells):
        plan = json.loads((tmp_path / str(num) / "plan.json").read_text())
        assert plan["pp"] == 2
        expected = plan["schedule"]
        if plan["schedule"] == "interleaved":
            expected += f" v={plan['virtual_stages']}"
        assert row[header.index("job")] == str(num)
        assert row[header.index("schedule")] == expected
    assert sorted(r[header.index("schedule")] for r in cells) == [
        "1f1b",
        "gpipe",
        "interleaved v=2",
    ]


def test_placement_grid_puts_every_device_where_the_plan_does(small_sweep):
    """The map's cell of device ``i`` (row-major) holds the stage and replica the plan gives
    ``i``; devices the plan leaves idle are NaN (grey)."""
    sweep_dir = small_sweep[0]
    df = pd.read_csv(sweep_dir / "results.csv")
    assert (df["devices_used"] < df["devices"]).any()  # some plan leaves devices idle
    for _, row in df[df.feasible].iterrows():
        plan = json.loads((sweep_dir / str(row["job_dir"]) / "plan.json").read_text())
        fanouts = [int(f) for f in row["level_fanouts"].split("x")]
        stage, replica, level = placement_grid(plan, fanouts)
        assert stage.shape[1] == int(np.prod(fanouts[: level + 1]))
        stage, replica = stage.ravel(), replica.ravel()
        assert stage.size == row["devices"]
        for r, st in enumerate(plan["stages"][: plan["pp"]]):
            for d, rep in enumerate(st["devices"]):
                ids = np.asarray(rep).ravel()
                assert (stage[ids] == r).all() and (replica[ids] == d).all()
        assert np.isnan(stage).sum() == row["devices"] - row["devices_used"]


def test_microbatch_sweep_statuses_and_plots(tmp_path):
    """In-process jobs (run_recorded) over microbatch sizes, plus a user error and an OOM plan."""
    small = ["cluster=dgx_8x8", "cluster.levels.1.fanout=2", "cluster.devices=null"]
    jobs = [
        [f"solver={s}", "model=tiny", f"training.microbatch_sizes=[{m}]", *small]
        for s in ("megatron", "nest")
        for m in (1, 2, 4)
    ]
    jobs.append(["solver=fixed", "solver.tp=3", "model=tiny", *small])  # tp does not divide
    jobs.append(["solver=fixed", "model=gpt3_175b", "training.microbatch_sizes=[1]", *small])
    for num, overrides in enumerate(jobs):
        with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = hydra.compose(config_name="config", overrides=overrides)
        run_recorded(
            lambda c, d: nest.app.cli.run(c, d, echo=lambda _: None),
            cfg,
            tmp_path / str(num),
            overrides=overrides,
            job=num,
        )
    result = agg.aggregate(tmp_path)
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["status"].tolist()[-2:] == ["error", "infeasible"]
    assert "tp=3 must divide" in df.iloc[-2]["error"] and pd.isna(df.iloc[-2]["tp"])
    assert df.iloc[-2]["planner"] == "fixed(tp=3)"
    oom = df.iloc[-1]
    assert not oom["feasible"] and oom["peak_memory_bytes"] > oom["hbm_bytes"]
    assert oom["error"].startswith("out of memory") and oom["devices"] == 16
    assert df["microbatch_candidates"].astype(str).tolist()[:3] == ["1", "2", "4"]
    assert df["microbatch_size"].tolist()[3:6] == [1, 2, 4]  # nest took the only size offered
    names = {p.name for p in result.plots}
    assert "throughput_vs_microbatch.png" in names
    assert "throughput_vs_devices.png" not in names  # one size only
    for path in result.plots:
        _check_png(path)
    # a run's own plots (what plots=true draws at the end of each job)
    for path in plot_job(tmp_path / "4"):
        _check_png(path)
    assert plot_job(tmp_path / "6") == []  # no plan, no plots


def test_run_recorded_reraises_a_crash_in_a_single_run(tmp_path):
    cfg = OmegaConf.create({"solver": {"name": "boom"}})

    def crash(cfg, out_dir):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run_recorded(crash, cfg, tmp_path, keep_going=False)
    row = json.loads((tmp_path / "row.json").read_text())
    assert row["status"] == "crashed" and row["error"] == "KeyError: 'bug'"
    assert set(row) == set(ROW_COLUMNS)
    assert run_recorded(crash, cfg, tmp_path / "b")["status"] == "crashed"  # keep_going


def test_planner_label_and_variant():
    assert planner_label("fixed", ["solver=fixed", "solver.tp=2", "+solver.pp=4", "model=x"]) == (
        "fixed(pp=4,tp=2)"
    )
    assert planner_label("nest", ["solver=nest", "cluster.devices=64"]) == "nest"
    overrides = ["model=x", "cluster.devices=64", "solver.tp=2", "seed=3", "+experiment=f"]
    assert agg.variant(overrides) == "seed=3"
    row = make_row(
        OmegaConf.create({"solver": {"name": "x"}}), {"status": "error", "error": "a\n b"}
    )
    assert row["error"] == "a b" and row["model"] is None


@pytest.mark.parametrize(
    "overrides, name",
    [
        (["model=hf", f"model.config_path={DATA / 'hf/gpt2.json'}"], "openai-community/gpt2"),
        (["model=profile", f"model.path={DATA / 'profiles/example_tiny.json'}"], "example_tiny"),
        (["model=hf", "model.config_path=/nonexistent/config.json"], "/nonexistent/config.json"),
    ],
)
def test_rows_name_the_model_the_run_built(tmp_path, overrides, name):
    """``model.name`` is null for Hugging Face and profile models: the row takes the built
    model's name (the file's path when the file cannot be read), never 'None'."""
    cfg = compose(*overrides, "solver=megatron", "print_summary=false")

    def crash(cfg, out_dir):
        raise RuntimeError("after the config was built")

    run_recorded(crash, cfg, tmp_path / "crashed")  # a crash result carries no model
    assert json.loads((tmp_path / "crashed" / "row.json").read_text())["model"] == name
    run_recorded(lambda c, d: nest.app.cli.run(c, d, echo=lambda _: None), cfg, tmp_path / "ran")
    assert json.loads((tmp_path / "ran" / "row.json").read_text())["model"] == name


# ------------------------------------------------------------------------------------------------
# The paper's published numbers
# ------------------------------------------------------------------------------------------------


def test_published_speedups_match_the_paper():
    """docs/nest_paper.md §3 (Wang et al., arXiv 2603.06798): Figure 5 Llama-2 at 1024 devices is
    Manual 13.31, NEST 16.63 (1.25x); Table 3 Mixtral at 1024 is NEST 1.519 over Manual 1.000;
    Figure 6 has Manual out of memory at microbatch 2 and NEST at 1.83."""
    table = published_speedups(load_published()).set_index(["source", "model", "devices"])
    assert table.loc[("Figure 5", "llama2_7b", 1024), "NEST"] == f"{16.63 / 13.31:.2f}x"
    assert table.loc[("Figure 5", "gpt3_175b", 128), "MCMC"] == "1.12x"
    assert table.loc[("Table 3", "mixtral_8x7b", 1024), "NEST"] == "1.52x"
    fig6 = table.loc[("Figure 6", "llama2_7b", 256)].set_index("microbatch")
    assert fig6.loc[2, "NEST"] == "1.83 norm." and fig6.loc[2, "MCMC"] == "OOM"
    pub = load_published()
    assert len(pub[pub.source == "Figure 5"]) == 5 * 3 * 5 - 5  # Alpa-E has no 1024 values


def test_published_table_pairs_the_sweep_with_the_paper():
    rows = [
        ("megatron", 1.0, True, "feasible"),
        ("nest", 1.46, True, "optimal"),
        ("other", float("nan"), False, "infeasible"),
    ]
    comp = pd.DataFrame(
        [
            {
                "cluster": "h100_spineleaf",
                "model": "mixtral_8x7b",
                "devices": 1024.0,
                "microbatch": 1.0,
                "planner": p,
                "speedup_vs_baseline": v,
                "feasible": ok,
                "status": st,
            }
            for p, v, ok, st in rows
        ]
    )
    table = published_table(comp, "megatron", ["megatron", "nest", "other"])
    assert table.to_dict("records") == [
        {
            "source": "Table 3",
            "model": "mixtral_8x7b",
            "devices": 1024,
            "paper NEST/Manual": "1.52x",
            "paper Phaze/Manual": "1.22x",
            "paper MCMC/Manual": "1.32x",
            "here nest/megatron": "1.46x",
            "here other/megatron": "OOM",
        }
    ]
    assert published_table(comp.assign(devices=64.0), "megatron", ["nest"]) is None


# ------------------------------------------------------------------------------------------------
# The paper's experiments
# ------------------------------------------------------------------------------------------------


def _experiment_jobs(name: str):
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra.compose(
            config_name="config", overrides=[f"+experiment={name}"], return_hydra_config=True
        )
    params = {k: str(v) for k, v in cfg.hydra.sweeper.params.items()}
    return cfg, params, expand_sweep(params, [f"+experiment={name}"])


def test_experiment_list():
    assert set(EXPERIMENTS) == {*PAPER_EXPERIMENTS, "scaling"}


@pytest.mark.parametrize("name", PAPER_EXPERIMENTS)
def test_experiment_composes_and_its_first_job_runs(name, tmp_path):
    cfg, params, jobs = _experiment_jobs(name)
    solvers = params["solver"].split(",")
    assert {"megatron", "nest"} <= set(solvers)
    assert cfg.training.global_batch == 4096  # docs/nest_paper.md §2: the artifact's global batch
    assert cfg.hydra.callbacks.sweep.baseline in solvers
    models = set(params["model"].split(","))
    if name == "fig5":
        assert models == PAPER_MODELS and cfg.cluster.name == "tpuv4_fattree"
        assert params["cluster.devices"] == "64,128,256,512,1024"
        assert list(cfg.training.microbatch_sizes) == [1]
        assert len(jobs) == len(solvers) * 5 * 5
    elif name == "fig6":
        assert models == PAPER_MODELS and cfg.cluster.devices == 256
        assert params["training.microbatch_sizes"] == "[1],[2],[4],[8]"
        assert len(jobs) == len(solvers) * 5 * 4
    elif name == "table3":
        assert models == {"mixtral_8x7b", "gpt3_175b"} and cfg.cluster.name == "h100_spineleaf"
        assert params["cluster.devices"] == "128,1024"
        assert len(jobs) == len(solvers) * 2 * 2
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        first = hydra.compose(config_name="config", overrides=jobs[0])
    result = run_recorded(lambda c, d: nest.app.cli.run(c, d, echo=lambda _: None), first, tmp_path)
    row = json.loads((tmp_path / "row.json").read_text())
    assert result["status"] in ("feasible", "optimal"), result.get("error")
    assert row["feasible"] and row["global_batch"] == 4096
    assert row["solver"] == jobs[0][0].split("=")[1]


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------


def test_submitit_local_launcher_runs_a_sweep(tmp_path):
    """hydra/launcher=submitit_local: each job in its own process via submitit, no SLURM."""
    sweep_dir = tmp_path / "multirun"
    proc = run_multirun(
        tmp_path,
        "hydra/launcher=submitit_local",
        "model=tiny",
        "solver=megatron",
        "cluster=dgx_8x8",
        "training.microbatch_sizes=[1],[2]",
        "print_summary=false",
        "plots=true",  # each job draws its own memory.png and placement.png (on_job_end)
        "hydra.callbacks.sweep.plots=false",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (sweep_dir / ".submitit").is_dir()
    df = pd.read_csv(sweep_dir / "results.csv")
    assert sorted(df["job"]) == [0, 1] and df["feasible"].all()
    assert sorted(df["microbatch_size"]) == [1, 2]
    for job in ("0", "1"):
        _check_png(sweep_dir / job / "memory.png")
        _check_png(sweep_dir / job / "placement.png")
    assert not (sweep_dir / "plots").exists()
    assert (
        "2/2 jobs done"
        in (sweep_dir / "0" / "cli.log").read_text() + (sweep_dir / "1" / "cli.log").read_text()
    )


def test_slurm_example_config_composes():
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra.compose(
            config_name="config", overrides=["hydra/launcher=slurm"], return_hydra_config=True
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.timeout_min > 0 and launcher.cpus_per_task >= 1


def test_case_plots_skip_jobs_without_a_plan(tmp_path):
    """A job of the drawn case that produced no plan (an ``invalid`` paper row, an error) has a
    report without ``plan``: the case's memory and placement figures show the other planners."""
    small = ["cluster=dgx_8x8", "cluster.levels.1.fanout=2", "cluster.devices=null"]
    overrides = ["solver=nest", "model=tiny", "training.microbatch_sizes=[1]", *small]
    with hydra.initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra.compose(config_name="config", overrides=overrides)
    run_recorded(
        lambda c, d: nest.app.cli.run(c, d, echo=lambda _: None),
        cfg,
        tmp_path / "0",
        overrides=overrides,
        job=0,
    )
    # job 1: the same case, a planner that reported the configuration invalid
    (tmp_path / "1").mkdir()
    row = json.loads((tmp_path / "0" / "row.json").read_text())
    row.update(
        job=1, solver="paper_manual", planner="paper_manual", status="invalid", feasible=False
    )
    row.update({k: None for k in ("tp", "cp", "ep", "dp", "pp", "iteration_time_s")})
    (tmp_path / "1" / "row.json").write_text(json.dumps(row))
    report = {"solver": "paper_manual", "status": "invalid", "feasible": False, "error": "x"}
    (tmp_path / "1" / "report.json").write_text(json.dumps(report))
    result = agg.aggregate(tmp_path, baseline="nest")
    names = {p.name for p in result.plots}
    assert any(n.startswith("memory_") for n in names)
    assert any(n.startswith("placement_") for n in names)
    for path in result.plots:
        _check_png(path)


def test_standalone_aggregation_uses_the_sweeps_own_baseline(tmp_path):
    """``python -m experiments.aggregate DIR`` normalises to the baseline the sweep ran with
    (``multirun.yaml``), so it rebuilds what the callback wrote; without one, the default."""
    assert agg.sweep_baseline(tmp_path) == agg.DEFAULT_BASELINE
    OmegaConf.save(
        OmegaConf.create({"hydra": {"callbacks": {"sweep": {"baseline": "paper_manual"}}}}),
        tmp_path / "multirun.yaml",
    )
    assert agg.sweep_baseline(tmp_path) == "paper_manual"
