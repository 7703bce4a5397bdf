"""The event-driven simulator against the analytic pipeline formula of the shared cost model."""

import pytest

from nest.analysis.simulate import plot_timeline, rank_order, simulate, simulate_schedule
from nest.core.axes import MEGATRON_RANK_ORDER, Recompute, Schedule
from nest.core.plan import ParallelConfig, make_structured_plan
from nest.cost import evaluate

from .randomcase import random_case


def bare_plan(pp, m, schedule="1f1b", v=1):
    n = pp * v
    config = ParallelConfig(
        pp=pp, schedule=Schedule(schedule), virtual_stages=v, rank_order=MEGATRON_RANK_ORDER
    )
    return make_structured_plan(
        config,
        layer_counts=[1] * n,
        recompute=[Recompute.NONE] * n,
        num_microbatches=m,
        sequence_parallel=False,
    )


@pytest.mark.parametrize(
    ("schedule", "v", "pp", "m"),
    [
        ("1f1b", 1, 4, 8),
        ("1f1b", 1, 3, 2),
        ("gpipe", 1, 4, 8),
        ("interleaved", 2, 4, 8),
        ("interleaved", 3, 3, 9),
        ("interleaved", 2, 2, 6),
    ],
)
def test_equal_stages_match_the_textbook_formulas(schedule, v, pp, m):
    """Equal chunks (f, b): 1F1B and GPipe take ``(m + p - 1) t`` (SC21 §2.2.1), interleaved
    ``m t + (p - 1) t / v`` (SC21 §2.2.2), with ``t = v (f + b)`` per rank."""
    f, b = 1.0, 2.5
    plan = bare_plan(pp, m, schedule, v)
    sim = simulate_schedule(
        plan, fwd_s=[f] * pp * v, bwd_s=[b] * pp * v, sync_s=[0] * pp, optimizer_s=[0] * pp
    )
    t = v * (f + b)
    assert sim.pipeline_s == pytest.approx(m * t + (pp - 1) * t / v, rel=1e-12)
    assert sum(sim.busy_s) == pytest.approx(pp * m * t)


def test_every_task_runs_once_in_dependency_order():
    plan = bare_plan(4, 8, "interleaved", 2)
    for r in range(4):
        order = rank_order(plan, r)
        assert sorted(order) == sorted({(k, c, j) for k, c, j in order})  # no repeats
        assert len(order) == 2 * 8 * 2
    sim = simulate_schedule(
        plan, fwd_s=[1.0] * 8, bwd_s=[2.0] * 8, sync_s=[0] * 4, optimizer_s=[0] * 4
    )
    end = {(t.kind, t.chunk, t.microbatch): t for t in sim.tasks if t.kind in "FB"}
    for (kind, k, j), t in end.items():
        if kind == "F" and k > 0:
            assert t.start_s >= end[("F", k - 1, j)].end_s
        if kind == "B":
            assert t.start_s >= end[("F", k, j)].end_s
            if k + 1 < 8:
                assert t.start_s >= end[("B", k + 1, j)].end_s


def test_sync_hiding_and_optimizer_follow_the_formula_for_equal_stages():
    """With equal stages the exposed sync of :mod:`nest.cost.pipeline` is exact: rank r's sync
    starts when its last backward ends, ``sum_{j<r} b_j`` before rank 0's."""
    pp, m, f, b = 3, 4, 1.0, 2.0
    plan = bare_plan(pp, m)
    sync = [0.5, 4.5, 3.0]
    sim = simulate_schedule(
        plan, fwd_s=[f] * pp, bwd_s=[b] * pp, sync_s=sync, optimizer_s=[0.2] * pp
    )
    exposed = max(max(0.0, s - r * b) for r, s in enumerate(sync))
    assert sim.makespan_s == pytest.approx((m + pp - 1) * (f + b) + exposed + 0.2)


def test_peak_in_flight_matches_the_memory_model():
    """The activations the memory model charges (1F1B ``min(p - r, m)``, GPipe ``m``, Megatron's
    interleaved warm-up) are what the schedule really holds, on 200 random plans."""
    for seed in range(200):
        problem, planner = random_case(seed, hbm_gib=100)
        plan = planner.solve(problem)
        report = evaluate(problem, plan)
        sim = simulate(problem, plan, report)
        assert sim.peak_in_flight == tuple(rk.memory.in_flight_microbatches for rk in report.ranks)
    for schedule, v in (("gpipe", 1), ("interleaved", 2)):
        plan = bare_plan(4, 8, schedule, v)
        sim = simulate_schedule(
            plan, fwd_s=[1.0] * 4 * v, bwd_s=[1.0] * 4 * v, sync_s=[0] * 4, optimizer_s=[0] * 4
        )
        from nest.cost.pipeline import in_flight_microbatches

        assert sim.peak_in_flight == tuple(
            in_flight_microbatches(r, 4, 8, Schedule(schedule), v) for r in range(4)
        )


def _schedule_bounds_s(plan, report) -> tuple[float, float]:
    """Bounds on one iteration that follow from the schedule alone, for any stage times.

    Below: the slowest rank must run its ``m`` microbatches (``m * max_r t_r``, ``t_r`` its
    forward + backward per microbatch over its chunks), and one microbatch must cross every
    chunk forward and back (``sum_k f_k + b_k``); the optimizer step follows the pipeline.
    Above: a rank runs its tasks in a fixed order, each as soon as its dependencies end, so the
    pipeline is a longest path and grows with every task's length; padding every forward to the
    slowest ``F`` and every backward to the slowest ``B`` gives equal chunks, whose textbook
    time is ``(m v + p - 1)(F + B)`` (SC21 §2.2.1-2.2.2; reproduced exactly by
    ``test_equal_stages_match_the_textbook_formulas``); after it, at most the longest sync and
    the longest optimizer step."""
    pp, m, v = plan.pp, plan.num_microbatches, plan.virtual_stages
    f = [s.fwd_s for s in report.stages]
    b = [s.bwd_s for s in report.stages]
    per_rank = [sum(f[k] + b[k] for k in range(r, pp * v, pp)) for r in range(pp)]
    sync = max(rk.dp_sync_s for rk in report.ranks)
    step = max(rk.optimizer_s for rk in report.ranks)
    lower = max(m * max(per_rank), sum(f) + sum(b)) + step
    upper = (m * v + pp - 1) * (max(f) + max(b)) + sync + step
    return lower, upper


def test_analytic_and_simulated_times_within_the_schedule_bounds_on_random_plans():
    """On 300 random plans (1F1B, GPipe, interleaved; unequal stages, ZeRO, overlap) the
    simulated and the analytic iteration time both lie between the schedule's bounds
    (:func:`_schedule_bounds_s`), so the analytic formula's error on a plan is at most
    ``upper / lower - 1`` of that plan, a bound derived from its schedule, not measured. Without
    a pipeline (``pp = 1``) there is no bubble to approximate: the formula is exact."""
    flat = 0
    for seed in range(300):
        problem, planner = random_case(seed, hbm_gib=100)
        plan = planner.solve(problem)
        report = evaluate(problem, plan)
        sim = simulate(problem, plan, report)
        lower, upper = _schedule_bounds_s(plan, report)
        for t in (sim.makespan_s, report.iteration_time_s):
            assert lower * (1 - 1e-12) <= t <= upper * (1 + 1e-12), (seed, lower, t, upper)
        assert abs(sim.relative_error) <= upper / lower - 1 + 1e-12
        if plan.pp == 1:
            assert abs(sim.relative_error) < 1e-9, seed
            flat += 1
    assert flat >= 150, flat  # the exactness check ran (178 of the 300 plans have pp = 1)


def test_timeline_plot_is_written(tmp_path):
    problem, planner = random_case(3, hbm_gib=100)
    plan = planner.solve(problem)
    path = tmp_path / "timeline.png"
    plot_timeline(simulate(problem, plan), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_with_simulate_writes_the_timeline(tmp_path):
    from hydra import compose, initialize_config_dir

    from nest.app.cli import CONF_DIR, run

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                "model=tiny",
                "solver=fixed",
                "solver.pp=2",
                "solver.dp=4",
                "training.global_batch=16",
                "simulate=true",
            ],
        )
    lines: list[str] = []
    result = run(cfg, tmp_path, echo=lines.append)
    assert (tmp_path / "timeline.png").is_file()
    sim = result["simulation"]
    assert sim["analytic_s"] == result["iteration_time_s"]
    assert sim["relative_error"] == pytest.approx(sim["analytic_s"] / sim["makespan_s"] - 1)
    assert "simulated iteration" in lines[0]


@pytest.mark.parametrize(
    ("schedule", "v", "pp", "m"), [("1f1b", 1, 8, 1024), ("interleaved", 4, 8, 256)]
)
def test_long_schedules_match_the_textbook_formulas(schedule, v, pp, m):
    """The largest preset cases have around a thousand microbatches (GPT-3 at batch 65536 on
    1024 devices: 1024); the event loop gives the closed form there too."""
    f, b = 0.25, 0.5
    plan = bare_plan(pp, m, schedule, v)
    n = pp * v
    sim = simulate_schedule(
        plan, fwd_s=[f] * n, bwd_s=[b] * n, sync_s=[0] * pp, optimizer_s=[0] * pp
    )
    t = v * (f + b)
    assert sim.pipeline_s == pytest.approx(m * t + (pp - 1) * t / v, rel=1e-12)
    assert len(sim.tasks) == 2 * m * n + 2 * pp


def test_the_simulation_reports_its_progress(monkeypatch):
    """A long simulation says how far it is (nest.core.progress); the count it reports reaches every
    task."""
    import nest.analysis.simulate

    seen = []

    class Recorder:
        def __init__(self, what, *, total):
            seen.append(self)
            self.what, self.total, self.done = what, total, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(nest.analysis.simulate, "Progress", Recorder)
    plan = bare_plan(4, 64)
    simulate_schedule(plan, fwd_s=[1.0] * 4, bwd_s=[2.0] * 4, sync_s=[0] * 4, optimizer_s=[0] * 4)
    (progress,) = seen
    assert progress.total == progress.done == 2 * 64 * 4
    assert "512 tasks on 4 pipeline ranks" in progress.what


def long_sim(m=1024, schedule="1f1b", v=1, pp=8):
    plan = bare_plan(pp, m, schedule, v)
    n = pp * v
    return simulate_schedule(
        plan,
        fwd_s=[0.02 * (1 + k % 3) for k in range(n)],
        bwd_s=[0.04 * (1 + k % 3) for k in range(n)],
        sync_s=[0.3] * pp,
        optimizer_s=[0.01] * pp,
        analytic_s=63.09,
    )


def test_format_duration_never_uses_an_exponent():
    from nest.analysis.simulate import format_duration

    assert format_duration(63.09) == "63.09 s"  # was "6.309e+04 ms" in the timeline's title
    assert format_duration(6274.8) == "6,275 s"
    assert format_duration(0.08831) == "88.31 ms"


@pytest.mark.parametrize(
    ("schedule", "v", "m"), [("1f1b", 1, 1024), ("interleaved", 4, 256), ("gpipe", 1, 512)]
)
def test_a_long_timeline_shows_its_start_and_its_end(schedule, v, m):
    """At 1024 microbatches the whole timeline is stripes: two windows are shown instead, the
    first holding every rank's fill and first backward, the last every rank's last backward, DP
    sync and the optimizer step, each with a bounded number of bars per row."""
    from nest.analysis.simulate import BARS_PER_ROW, timeline_windows

    sim = long_sim(m, schedule, v)
    (lo1, hi1), (lo2, hi2) = timeline_windows(sim)
    assert lo1 == 0 and hi2 == sim.makespan_s and hi1 < lo2
    compute = [t for t in sim.tasks if t.kind in ("F", "B")]
    for r in range(8):
        mine = [t for t in compute if t.rank == r]
        assert mine[0].start_s < hi1
        # GPipe: every forward comes first, and the fast ranks end long before the slow ones
        if schedule != "gpipe":
            assert next(t for t in mine if t.kind == "B").end_s <= hi1
            assert mine[-1].start_s >= lo2
        for lo, hi in ((lo1, hi1), (lo2, hi2)):
            shown = [t for t in mine if t.end_s > lo and t.start_s < hi]
            assert len(shown) <= 3 * BARS_PER_ROW


def test_a_short_timeline_is_shown_whole():
    from nest.analysis.simulate import timeline_windows

    sim = long_sim(m=8)
    assert timeline_windows(sim) == ((0.0, sim.makespan_s),)


def test_the_timeline_of_1024_microbatches_is_a_readable_summary(tmp_path):
    sim = long_sim(1024)
    view = plot_timeline(sim, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(view.windows) == 2 and view.unit == "s"
    assert view.bars < len(sim.tasks) / 10
    assert "e+" not in view.title and "1,024 microbatches" in view.title
    assert 2 <= view.shown_microbatches < 1024
