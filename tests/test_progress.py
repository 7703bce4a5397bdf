"""Progress lines for long steps (nest/core/progress.py) and where the CLI uses them."""

import logging
import time

import pytest
from hydra import compose, initialize_config_dir

import nest.app.cli
from nest.core.progress import Progress


def test_a_short_step_says_nothing(caplog):
    caplog.set_level(logging.INFO, logger="nest.core.progress")
    with Progress("quick", total=10) as progress:
        progress.done = 10
    assert caplog.records == [] and progress.lines == 0


def test_a_long_step_logs_its_count_and_its_end(caplog):
    caplog.set_level(logging.INFO, logger="nest.core.progress")
    with Progress("counting", total=10, after_s=0.01, every_s=0.05) as progress:
        progress.done = 5
        deadline = time.monotonic() + 10
        while progress.lines == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("counting: 5/10 (50 %) after ")
    assert lines[-1].startswith("counting: done in ")


def test_a_step_without_a_count_says_it_is_still_running():
    progress = Progress("planning with nest")
    progress._started = time.perf_counter()
    assert progress.message().startswith("planning with nest: still running after ")


@pytest.mark.parametrize("simulate", [False, True])
def test_the_cli_watches_planning_and_drawing(monkeypatch, tmp_path, simulate):
    steps = []

    class Recorder(Progress):
        def __enter__(self):
            steps.append(self.what)
            return super().__enter__()

    monkeypatch.setattr(nest.app.cli, "Progress", Recorder)
    with initialize_config_dir(config_dir=nest.app.cli.CONF_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=["model=tiny", "solver=fixed", "solver.pp=2", f"simulate={simulate}"],
        )
    nest.app.cli.run(cfg, tmp_path, echo=lambda line: None)
    assert steps == ["planning with fixed"] + (["drawing timeline.png"] if simulate else [])
