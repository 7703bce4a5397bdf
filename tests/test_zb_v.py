"""ZB-V, the V-shaped zero-bubble schedule (Qi, Wan, Huang, Lin, "Pipeline Parallelism with
Controllable Memory", NeurIPS 2024, arXiv 2405.15362 §3-§4; the order of PyTorch's
``ScheduleZBVZeroBubble``, pytorch/pytorch@1fd7abc2f521:torch/distributed/pipelining/
schedules.py): its V placement, the order against a hand-run of PyTorch's rules, the pipeline
formula against the simulator, the memory and the hops it charges, the space, the refusals and
the exports."""

import random

import pytest

from nest.analysis.simulate import plot_timeline, rank_order, simulate
from nest.core.axes import Schedule
from nest.core.errors import UserError
from nest.core.plan import ParallelConfig, chunk_rank
from nest.cost import evaluate
from nest.cost.pipeline import zb_v_exposed_sync_s, zb_v_pipeline_s
from nest.dp.space import SpaceOptions, configurations

from .conftest import make_problem, make_spec
from .test_zero_bubble import bare_plan as zero_bubble_plan
from .test_zero_bubble import simulated as zero_bubble_simulated


def bare_plan(pp, m):
    return zero_bubble_plan(pp, m, "zb_v")


def simulated(f, b, w, m, sync=None, overlap=False):
    """The simulated ZB-V iteration on per-chunk forward ``f``, B pass ``b`` and W pass ``w``."""
    return zero_bubble_simulated(f, b, w, m, sync, overlap, "zb_v")


def analytic(f, b, w, m):
    """:func:`zb_v_pipeline_s` on the same chunk times: ``(pipeline, hidden sync per rank)``."""
    pp = len(f) // 2
    t = [f[k] + b[k] + w[k] + f[2 * pp - 1 - k] + b[2 * pp - 1 - k] + w[2 * pp - 1 - k]
         for k in range(pp)]  # fmt: skip
    return zb_v_pipeline_s(t, m, f, [br + wr for br, wr in zip(b, w, strict=True)], w)


def test_the_v_places_chunk_r_and_chunk_2p_minus_1_minus_r_on_rank_r():
    """torchtitan's ``stage_ids_this_rank(..., style="v")`` pairs ``zip(range(pp),
    range(2 pp - 1, pp - 1, -1))`` (pytorch/torchtitan@fb3b230e2a05:
    torchtitan/distributed/pipeline_parallel.py): rank 0 holds the first and the last chunk,
    the last rank the two middle ones; looped interleaving keeps ``k % pp``."""
    for pp in range(2, 9):
        pairs = list(zip(range(pp), range(2 * pp - 1, pp - 1, -1), strict=True))
        for r, (a, b) in enumerate(pairs):
            assert chunk_rank(a, pp, Schedule.ZB_V) == r == chunk_rank(b, pp, Schedule.ZB_V)
        assert bare_plan(pp, 2 * pp).pp_rank_chunks == tuple(pairs)
        assert [chunk_rank(k, pp, Schedule.INTERLEAVED) for k in range(2 * pp)] == [
            k % pp for k in range(2 * pp)
        ]


def test_the_order_is_pytorchs_on_a_hand_run_example():
    """PyTorch's rules run by hand for ``pp = 2``, ``m = 3``, rank 0 (chunks 0 and 3): 3 warm-up
    F of chunk 0, no pairs, 2 triples F B W of chunk 3, one stable round (no F of chunk 0 left:
    B W of chunk 0, F B W of chunk 3), then 2 (B, W) of chunk 0; rank 1 (chunks 1 and 2): 1 F,
    1 pair (F2, F1), 1 triple F B W of chunk 2, stable rounds F1 B1 W1 F2 B2 W2 while forwards
    remain, 1 B pair, 1 (B, W) of chunk 1, then chunk 2's and chunk 1's postponed W."""
    plan = bare_plan(2, 3)
    zero = (
        "F0.0 F0.1 F0.2 F3.0 B3.0 W3.0 F3.1 B3.1 W3.1 B0.0 W0.0 F3.2 B3.2 W3.2 B0.1 W0.1 B0.2 W0.2"
    )
    one = (
        "F1.0 F2.0 F1.1 F2.1 B2.0 W2.0 F1.2 B1.0 W1.0 F2.2 B2.1 W2.1 B1.1 B2.2 B1.2 W1.1 W2.2 W1.2"
    )
    for r, text in enumerate((zero, one)):
        assert " ".join(f"{kind}{k}.{j}" for kind, k, j in rank_order(plan, r)) == text


def test_every_rank_runs_each_pass_of_its_two_chunks_once_after_its_dependencies():
    for pp in range(2, 7):
        for m in (2 * pp - 1, 2 * pp, 3 * pp + 1):
            plan = bare_plan(pp, m)
            for r in range(pp):
                order = rank_order(plan, r)
                chunks = (r, 2 * pp - 1 - r)
                assert sorted(order) == sorted(
                    (k, c, j) for k in "FBW" for c in chunks for j in range(m)
                )
                seen = set()
                for kind, c, j in order:
                    need = {"B": ("F", c, j), "W": ("B", c, j)}.get(kind)
                    assert need is None or need in seen
                    seen.add((kind, c, j))


def test_equal_chunks_simulate_to_the_formula_exactly():
    """The analytic time is the simulated one to 1e-12 on random equal chunks and ``m >= 2p - 1``
    (nest/cost/pipeline.py, the lags read off the critical paths), and every rank holds ``p``
    whole-rank microbatches at its peak (arXiv 2405.15362 §4: V-ZB's peak is 1F1B's)."""
    rng = random.Random(24)
    for _ in range(400):
        pp = rng.randint(2, 8)
        m = rng.randint(2 * pp - 1, 4 * pp)
        f, b, w = (rng.choice([rng.uniform(0.05, 3.0), rng.uniform(0.0, 0.1)]) for _ in range(3))
        n = 2 * pp
        sim = simulated([f] * n, [b] * n, [w] * n, m)
        pipe, hidden = analytic([f] * n, [b] * n, [w] * n, m)
        assert sim.pipeline_s == pytest.approx(pipe, rel=1e-12, abs=1e-12)
        assert min(hidden) == 0.0
        assert sim.peak_in_flight == (float(pp),) * pp


def test_equal_passes_reach_the_synchronised_floor():
    """At ``F = B = W`` (the paper's zero-bubble case) the only idle time is the start-up the
    step's synchronisation forces: the last rank gets its first microbatch after ``(p - 1) F``,
    so ``T = 2m (F + B + W) + (p - 1) F``, and no schedule of these chunks does better."""
    for pp in range(2, 9):
        for m in (2 * pp - 1, 3 * pp):
            n = 2 * pp
            sim = simulated([1.0] * n, [1.0] * n, [1.0] * n, m)
            assert sim.pipeline_s == pytest.approx(6.0 * m + (pp - 1), rel=1e-12)


def test_sync_hiding_is_exact_on_equal_chunks():
    """Rank ``r`` ends ``max_s l_s - l_r`` before the pipeline, and with overlap its last W
    hides its sync too: the simulated iteration is the pipeline time plus the largest exposed
    sync of :func:`zb_v_exposed_sync_s` on random equal chunks and syncs."""
    rng = random.Random(25)
    for _ in range(300):
        pp = rng.randint(2, 6)
        m = rng.randint(2 * pp - 1, 3 * pp)
        f, b, w = (rng.uniform(0.1, 2.0) for _ in range(3))
        sync = [rng.uniform(0.0, 8.0) for _ in range(pp)]
        overlap = rng.random() < 0.5
        n = 2 * pp
        sim = simulated([f] * n, [b] * n, [w] * n, m, sync, overlap)
        pipe, hidden = analytic([f] * n, [b] * n, [w] * n, m)
        exposed = zb_v_exposed_sync_s(sync, hidden, [w] * pp, overlap)
        assert sim.makespan_s == pytest.approx(pipe + max(exposed), rel=1e-12)


def test_unequal_chunks_lie_within_the_schedule_bounds():
    """On random unequal chunks both the simulated and the charged time lie between the
    slowest rank's work ``m max_r t_r`` and the equal-chunk time with every pass padded to its
    largest (the list schedule is monotone in each task's length; nest/cost/pipeline.py)."""
    rng = random.Random(26)
    worst = 0.0
    for _ in range(300):
        pp = rng.randint(2, 6)
        m = rng.randint(2 * pp - 1, 3 * pp)
        n = 2 * pp
        f, b, w = ([rng.uniform(0.2, 2.0) for _ in range(n)] for _ in range(3))
        sim = simulated(f, b, w, m).pipeline_s
        got, _ = analytic(f, b, w, m)
        lower = m * max(
            f[k] + b[k] + w[k] + f[n - 1 - k] + b[n - 1 - k] + w[n - 1 - k] for k in range(pp)
        )
        padded = simulated([max(f)] * n, [max(b)] * n, [max(w)] * n, m).pipeline_s
        for value in (sim, got):
            assert lower * (1 - 1e-12) <= value <= padded * (1 + 1e-12)
        worst = max(worst, abs(got / sim - 1))
    assert worst <= padded / lower - 1 + 1e-12


def _plan(problem, pp=2, schedule="zb_v", m=None):
    from baselines.fixed import FixedPlanner

    v = 1 if schedule in ("1f1b", "zb_h1", "zb_h2") else 2
    counts = [8 // (pp * v)] * (pp * v)
    return FixedPlanner(
        tp=1, pp=pp, dp=1, microbatch_size=1, layer_partition=counts, schedule=schedule,
        virtual_stages=v,
    ).solve(problem)  # fmt: skip


def test_the_evaluator_charges_the_formula_the_v_hops_and_one_f_one_b_memory():
    """A ZB-V plan of 4 chunks on 2 ranks: the evaluator's pipeline time is the formula on its
    chunks; chunks 1 and 2 (both on the last rank) exchange nothing, the others do; every rank
    holds ``p = 2`` microbatches, as the simulator counts; rank 0 holds the embedding and the
    head, so no rank holds a tied copy of the word embedding."""
    problem = make_problem(make_spec(layers=6, tied_embeddings=True), global_batch=8)
    plan = _plan(problem)
    report = evaluate(problem, plan)
    st = report.stages
    t = [rk.fwd_s + rk.bwd_s for rk in report.ranks]
    expected, _ = zb_v_pipeline_s(
        t, 8, [s.fwd_s for s in st], [s.bwd_s for s in st], [s.wgrad_s for s in st]
    )
    assert report.pipeline_time_s == pytest.approx(expected, rel=1e-12)
    assert [s.pp_rank for s in st] == [0, 1, 1, 0]
    assert st[1].p2p_fwd_s == 0.0 and st[2].p2p_bwd_s == 0.0
    assert st[0].p2p_fwd_s > 0.0 and st[2].p2p_fwd_s > 0.0 and st[3].p2p_bwd_s > 0.0
    assert [rk.memory.in_flight_microbatches for rk in report.ranks] == [2.0, 2.0]
    sim = simulate(problem, plan, report)
    assert sim.peak_in_flight == (2.0, 2.0)
    # the looped plan puts the head on rank 1, which then holds a copy of a tied embedding: the
    # two placements hold the same weights in all but that copy
    for tied in (True, False):
        prob = make_problem(make_spec(layers=6, tied_embeddings=tied), global_batch=8)
        held = [
            sum(rk.memory.weights_bytes for rk in evaluate(prob, _plan(prob, schedule=s)).ranks)
            for s in ("zb_v", "interleaved")
        ]
        assert (held[0] < held[1]) if tied else held[0] == pytest.approx(held[1])


def test_zb_v_needs_2p_minus_1_microbatches_and_two_chunks_per_rank():
    problem = make_problem(make_spec(layers=6), global_batch=2)
    with pytest.raises(UserError, match=r"zb_v needs num_microbatches\(2\) >= 2\*pp-1\(3\)"):
        evaluate(problem, _plan(problem))
    with pytest.raises(UserError, match="set virtual_stages=2"):
        ParallelConfig(pp=2, schedule=Schedule.ZB_V, virtual_stages=4)
    with pytest.raises(UserError, match="set virtual_stages=2"):
        ParallelConfig(pp=2, schedule=Schedule.ZB_V)


def test_a_listed_zb_v_has_two_even_chunks_per_rank_and_is_not_in_the_default_space():
    problem = make_problem(make_spec(layers=6), global_batch=8)
    assert all(c.schedule is not Schedule.ZB_V for c in configurations(problem, SpaceOptions()))
    listed = [
        c
        for c in configurations(problem, SpaceOptions(schedules=("1f1b", "zb_v")))
        if c.schedule is Schedule.ZB_V
    ]
    assert listed
    for c in listed:  # 6 blocks split evenly into 2 pp chunks, or the 8 chain layers
        assert c.virtual_stages == 2 and c.pp >= 2 and c.num_microbatches(8) >= 2 * c.pp - 1
        assert 6 % (2 * c.pp) == 0 or 8 % (2 * c.pp) == 0
    assert {c.pp for c in listed} == {2, 3}  # pp = 4 would need 8 chunks of 6 blocks


def test_the_exact_models_refuse_zb_v():
    from nest.exact.planner import ExactPlanner

    for backend in ("cpsat", "milp"):
        with pytest.raises(UserError, match="zb_v"):
            ExactPlanner(name=backend, backend=backend, schedules=["1f1b", "zb_v"])


def test_nest_equals_brute_force_with_zb_v_on_random_problems():
    """``nest`` (nest/dp/zb_v.py: exact over the largest B pass) and ``brute`` agree to 1e-9 on
    random small problems searched with ZB-V alone, beside 1F1B, or beside every schedule."""
    from .randomcase import assert_nest_equals_brute
    from .test_nest_dp import tiny_case

    agreed = alone = 0
    for seed in range(60):
        problem, options = tiny_case(2800 + seed)
        schedules = (["zb_v"], ["1f1b", "zb_v"], ["1f1b", "zb_h1", "zb_h2", "zb_v"])[seed % 3]
        options = {**options, "schedules": schedules}
        try:
            oracle = assert_nest_equals_brute(problem, options, (seed, options))
        except UserError:
            continue  # no configuration of the restricted space (e.g. m < 2 pp - 1)
        if oracle is not None:
            agreed += 1
            alone += schedules == ["zb_v"]
    assert agreed >= 25 and alone >= 3, (agreed, alone)


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_the_exports_write_zbv_to_torchtitan_and_the_nearest_to_megatron(target):
    """torchtitan runs ZB-V as ``ZBVZeroBubble`` with the ``2 pp`` chunks as stages (it places
    them in a V itself): no warning, the exported time is the plan's. Megatron-LM has no V: the
    same chunks looped (interleaved 1F1B, ``m % pp == 0``) with a one-line warning naming ZB-V."""
    from nest.export import export_plan

    problem = make_problem(make_spec(layers=6), global_batch=8)
    plan = _plan(problem)
    result = export_plan(problem, plan, target)
    said = " ".join(result.warnings)
    if target == "torchtitan":
        assert 'pipeline_parallel_schedule = "ZBVZeroBubble"' in result.text
        assert 'split_points = ["layers.1", "layers.3", "layers.5"]' in result.text
        assert "schedule" not in said.lower()
        assert result.exported_plan["schedule"] == "zb_v"
    else:
        assert "ZB-V" in said and "--zero-bubble-v-schedule" in said and "interleaved" in said
        looped = evaluate(problem, _plan(problem, schedule="interleaved"))
        assert result.exported_iteration_time_s == pytest.approx(looped.iteration_time_s, rel=1e-12)


def test_megatron_merges_the_chunk_pairs_when_it_cannot_interleave():
    """``m = 3`` on ``pp = 2``: Megatron's interleaving needs ``m % pp == 0``, so the nearest is
    1F1B with chunks (0, 1) and (2, 3) as the two stages."""
    from nest.export import export_plan

    problem = make_problem(make_spec(layers=6), global_batch=3, microbatch_sizes=(1,))
    result = export_plan(problem, _plan(problem), "megatron")
    said = " ".join(result.warnings)
    assert "ZB-V" in said and "consecutive chunks" in said
    one = evaluate(problem, _plan(problem, schedule="1f1b"))
    assert result.exported_iteration_time_s == pytest.approx(one.iteration_time_s, rel=1e-12)


def test_the_timeline_draws_the_zb_v_w_passes(tmp_path):
    sim = simulated([1.0] * 4, [1.2] * 4, [0.8] * 4, 3)
    view = plot_timeline(sim, tmp_path / "zbv.png")
    assert (tmp_path / "zbv.png").stat().st_size > 0
    assert view.bars == 2 * 3 * 3 * 2  # F, B and W of both chunks of every microbatch per rank
