"""DualPipeV, DeepSeek's V-shaped DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437
§3.2.1; deepseek-ai/DualPipe@3da1bbe:dualpipe/dualpipev.py and README.md; PyTorch's
``ScheduleDualPipeV``, pytorch/pytorch@1fd7abc2f521:torch/distributed/pipelining/schedules.py):
its order against a hand-run of ``DualPipeV.step``, the overlapped F&B rule, the README's bubble
and activation count, the evaluator against the simulator, the memory, the space, the refusals,
nest == brute, the exports and the timeline."""

import random

import pytest

from nest.analysis.simulate import plot_timeline, simulate, simulate_schedule
from nest.core.axes import Schedule
from nest.core.errors import UserError
from nest.core.plan import ParallelConfig
from nest.cost import evaluate
from nest.cost.dualpipe import (
    dualpipe_v_order,
    dualpipe_v_pipeline_s,
    in_flight_chunks,
    overlapped_s,
    run_dualpipe_v,
)
from nest.dp.space import SpaceOptions, configurations

from .conftest import make_problem, make_spec
from .test_zb_v import _plan as _fixed_plan
from .test_zero_bubble import bare_plan


def _text(order):
    out = []
    for op in order:
        if op[0] == "FB":
            out.append(f"F{op[1]}.{op[2]}&BW{op[3]}.{op[4]}")
        else:
            out.append(f"{op[0]}{op[1]}.{op[2]}")
    return " ".join(out)


def test_the_order_is_dualpipev_step_on_a_hand_run_example():
    """``DualPipeV.step`` run by hand for 2 ranks and 4 microbatches. Rank 0 (chunks 0 and 3,
    ``q = 1``): step 1 two F0; step 2 one (F0, F1); step 3 one (B1 with its W queued, the W,
    F1); step 4 ``m - 2 pp + r + 1 = 1`` round F0&B1, F1&B0; step 5 one (B1, F1&B0); step 6 one
    pair: rank 0 is even, so B1 is full and B0 a B pass; step 7 one (W, B0); step 8 one W.
    Rank 1 (chunks 1 and 2, the last rank, ``q = 0``): step 2 two (F0, F1); step 4 two rounds,
    the first F0 and B1 run apart ("we don't overlap these two chunks"); step 6 two pairs, rank
    1 odd, so the second pair is B passes; step 8 their two W."""
    zero = (
        "F0.0 F0.1 F0.2 F3.0 B3.0 W3.0 F3.1 F0.3&BW3.1 F3.2&BW0.0 BW3.2 F3.3&BW0.1 BW3.3 "
        "B0.2 W0.2 B0.3 W0.3"
    )
    one = (
        "F1.0 F2.0 F1.1 F2.1 F1.2 BW2.0 F2.2&BW1.0 F1.3&BW2.1 F2.3&BW1.1 BW2.2 BW1.2 B2.3 B1.3 "
        "W2.3 W1.3"
    )
    assert _text(dualpipe_v_order(2, 4, 0)) == zero
    assert _text(dualpipe_v_order(2, 4, 1)) == one


def test_every_rank_runs_each_pass_of_its_two_chunks_once():
    """Forwards and backwards of both chunks once per microbatch, in microbatch order, and a W
    after each B pass (a full backward or an F&B carries its own)."""
    for pp in range(2, 7):
        for m in (2 * pp, 2 * pp + 1, 3 * pp + 2):
            for r in range(pp):
                seen = {}
                for op in dualpipe_v_order(pp, m, r):
                    parts = [("F", op[1], op[2]), ("BW", op[3], op[4])] if op[0] == "FB" else [op]
                    for kind, k, j in parts:
                        assert k in (r, 2 * pp - 1 - r)
                        kinds = ("B", "BW") if kind in ("B", "BW") else (kind,)
                        key = (kinds[0], k)
                        assert seen.get(key, 0) == j or kind == "W", (pp, m, r, op)
                        seen[key] = j + 1 if kind != "W" else seen.get(key, 0)
                        if kind == "W":
                            seen[("W", k, j)] = True
                for k in (r, 2 * pp - 1 - r):
                    assert seen[("F", k)] == m and seen[("B", k)] == m


def test_the_overlapped_step_hides_each_sides_transfers_under_the_others_compute():
    """arXiv 2412.19437 §3.2.1 / Figure 4: one chunk's all-to-all and PP transfers run under the
    other's compute. Fully hidden when each fits; what does not fit stays; no transfers at all
    is the two passes back to back; no compute at all leaves every transfer exposed."""
    assert overlapped_s(2.0, 3.0, 4.0, 5.5) == 6.0  # 1 under 4, 1.5 under 2
    assert overlapped_s(2.0, 3.0, 4.0, 7.0) == 7.0  # 3 of the backward's under 2: 1 exposed
    assert overlapped_s(1.0, 6.0, 2.0, 2.0) == 6.0  # 5 of the forward's under 2: 3 exposed
    assert overlapped_s(1.5, 1.5, 2.5, 2.5) == 4.0
    assert overlapped_s(0.0, 1.0, 0.0, 2.0) == 3.0
    rng = random.Random(7)
    for _ in range(200):
        cf, cb = rng.uniform(0, 2), rng.uniform(0, 2)
        f, b = cf + rng.uniform(0, 2), cb + rng.uniform(0, 2)
        fb = overlapped_s(cf, f, cb, b)
        assert max(f, b, cf + cb) - 1e-12 <= fb <= f + b + 1e-12


def test_dualpipev_holds_pp_plus_one_stage_activations_on_every_rank():
    """README: "Activation Per Device ``PP + 1``" with ``PP`` the stages (``2 pp`` chunks):
    ``2 pp + 1`` chunk-microbatches on every rank, for every ``m >= 2 pp``."""
    for pp in range(2, 9):
        for m in (2 * pp, 2 * pp + 3, 5 * pp):
            assert [in_flight_chunks(pp, m, r) for r in range(pp)] == [2 * pp + 1] * pp


def _idle(pp, m, f, cf, b, cb, w):
    n = 2 * pp
    raw, ends = run_dualpipe_v(pp, m, [f] * n, [cf] * n, [b] * n, [cb] * n, [w] * n)
    busy = [0.0] * pp
    for r, _, start, end in raw:
        busy[r] += end - start
    return [max(ends) - x for x in busy]


def test_equal_chunks_reach_the_readme_bubble():
    """README's table: DualPipeV's bubble ``(PP/2 - 1)(F&B + B - 3W)`` (``PP/2 = pp`` ranks,
    ``B`` the full backward). It holds, as the most idle time of any rank, where the README's
    figure draws its cells: ``W = F`` and ``B = 2F`` (B pass and W pass each as long as a
    forward), for any overlap of the F&B, on every ``pp`` and ``m >= 2 pp``."""
    rng = random.Random(24)
    for _ in range(150):
        pp = rng.randint(2, 8)
        m = rng.randint(2 * pp, 4 * pp)
        f = rng.uniform(0.5, 2.0)
        cf, cb = f * rng.uniform(0.3, 1.0), 2 * f * rng.uniform(0.3, 1.0)
        fb = overlapped_s(cf, f, cb, 2 * f)
        idle = _idle(pp, m, f, cf, 2 * f, cb, f)
        assert max(idle) == pytest.approx((pp - 1) * (fb + 2 * f - 3 * f), rel=1e-9), (pp, m)


def test_the_simulator_respects_every_dependency():
    """A forward after its previous chunk's forward, a backward after its forward and the next
    chunk's backward, on random unequal chunks."""
    rng = random.Random(3)
    for _ in range(40):
        pp = rng.randint(2, 5)
        m = rng.randint(2 * pp, 3 * pp)
        n = 2 * pp
        f, b = [rng.uniform(0.5, 2) for _ in range(n)], [rng.uniform(1, 3) for _ in range(n)]
        w = [x * rng.uniform(0.2, 0.6) for x in b]
        sim = simulate_schedule(
            bare_plan(pp, m, "dualpipe_v"), fwd_s=f, bwd_s=b, wgrad_s=w,
            sync_s=[0.0] * pp, optimizer_s=[0.0] * pp,
            fwd_compute_s=[x * 0.7 for x in f], bwd_compute_s=[x * 0.8 for x in b],
        )  # fmt: skip
        end = {}
        for t in sim.tasks:
            if t.kind in ("F", "B", "W"):
                end[(t.kind, t.chunk, t.microbatch)] = t.end_s
        for t in sim.tasks:
            if t.kind == "F" and t.chunk:
                assert t.start_s >= end[("F", t.chunk - 1, t.microbatch)] - 1e-12
            if t.kind == "B":
                assert t.start_s >= end[("F", t.chunk, t.microbatch)] - 1e-12
                if t.chunk < n - 1:
                    assert t.start_s >= end[("B", t.chunk + 1, t.microbatch)] - 1e-12
        assert sim.peak_in_flight == tuple([pp + 0.5] * pp)


def _plan(problem, pp=2, schedule="dualpipe_v", m=None):
    """ZB-V's fixed plan of 8 blocks in ``pp`` ranks (tests/test_zb_v.py), DualPipeV by default."""
    return _fixed_plan(problem, pp=pp, schedule=schedule, m=m)


def _moe_problem(**train):
    spec = make_spec(layers=6, num_experts=4, top_k=2, tied_embeddings=True)
    return make_problem(spec, global_batch=8, **train)


def test_the_evaluator_charges_the_simulated_schedule_and_pp_plus_half_activations():
    """The evaluator's pipeline time is DualPipeV's list schedule on its chunks' passes, and the
    simulator, run from the report, ends the pipeline at the same time; every rank holds
    ``p + 1/2`` whole-rank microbatches (``2 p + 1`` chunks), ZB-V ``p``, and the same
    weights (one copy per rank, no tied copy: rank 0 holds the embedding and the head)."""
    problem = _moe_problem()
    plan = _plan(problem)
    report = evaluate(problem, plan)
    st = report.stages
    expected, _, _ = dualpipe_v_pipeline_s(
        2, 8, [s.fwd_s for s in st], [s.compute_fwd_s for s in st], [s.bwd_s for s in st],
        [s.compute_bwd_s + s.recompute_s for s in st], [s.wgrad_s for s in st],
    )  # fmt: skip
    assert report.pipeline_time_s == pytest.approx(expected, rel=1e-12)
    sim = simulate(problem, plan, report)
    assert sim.pipeline_s == pytest.approx(report.pipeline_time_s, rel=1e-12)
    assert sim.makespan_s == pytest.approx(report.iteration_time_s, rel=1e-12)
    assert [rk.memory.in_flight_microbatches for rk in report.ranks] == [2.5, 2.5]
    zbv = evaluate(problem, _plan(problem, schedule="zb_v"))
    assert [rk.memory.in_flight_microbatches for rk in zbv.ranks] == [2.0, 2.0]
    for a, b in zip(report.ranks, zbv.ranks, strict=True):
        assert a.memory.weights_bytes == pytest.approx(b.memory.weights_bytes, rel=1e-12)
        assert a.memory.total_bytes > b.memory.total_bytes
    assert [s.pp_rank for s in st] == [0, 1, 1, 0]
    assert st[1].p2p_fwd_s == 0.0 and st[2].p2p_bwd_s == 0.0


def test_the_overlap_only_shortens_the_pipeline():
    """Each pass's transfers hidden under the other side's compute: the evaluator's time lies
    between the same order with nothing hidden (compute = the whole pass, F&B = F + B) and that
    minus every transfer of the overlapped passes (the list schedule is monotone in each task's
    length); the report's chunks do have transfers (MoE all-to-all, PP sends)."""
    problem = _moe_problem()
    report = evaluate(problem, _plan(problem))
    st = report.stages
    f, b, w = [s.fwd_s for s in st], [s.bwd_s for s in st], [s.wgrad_s for s in st]
    none_hidden, _, _ = dualpipe_v_pipeline_s(2, 8, f, f, b, b, w)
    assert any(s.fwd_s > s.compute_fwd_s for s in st)
    assert report.pipeline_time_s <= none_hidden + 1e-15


def test_dualpipe_v_needs_2p_microbatches_two_chunks_per_rank_and_two_ranks():
    problem = make_problem(make_spec(layers=6), global_batch=3, microbatch_sizes=(1,))
    with pytest.raises(UserError, match=r"dualpipe_v needs num_microbatches\(3\) >= 2\*pp\(4\)"):
        evaluate(problem, _plan(problem))
    with pytest.raises(UserError, match="set virtual_stages=2"):
        ParallelConfig(pp=2, schedule=Schedule.DUALPIPE_V)


def test_a_listed_dualpipe_v_has_zb_v_chunks_and_is_not_in_the_default_space():
    problem = make_problem(make_spec(layers=6), global_batch=8)
    assert all(
        c.schedule is not Schedule.DUALPIPE_V for c in configurations(problem, SpaceOptions())
    )
    both = SpaceOptions(schedules=("zb_v", "dualpipe_v"))
    listed = {c for c in configurations(problem, both) if c.schedule is Schedule.DUALPIPE_V}
    assert listed
    for c in listed:
        assert c.virtual_stages == 2 and c.pp >= 2 and c.num_microbatches(8) >= 2 * c.pp
    zb_v = [c for c in configurations(problem, both) if c.schedule is Schedule.ZB_V]
    assert {c.pp for c in listed} <= {c.pp for c in zb_v}


def test_the_exact_models_refuse_dualpipe_v():
    from nest.exact.planner import ExactPlanner

    for backend in ("cpsat", "milp"):
        with pytest.raises(UserError, match="dualpipe_v"):
            ExactPlanner(name=backend, backend=backend, schedules=["1f1b", "dualpipe_v"])


def test_nest_equals_brute_force_with_dualpipe_v_on_random_problems():
    """``nest`` (nest/dp/dualpipe_v.py: branch and bound over each rank's undominated pairs of
    modes) and ``brute`` agree to 1e-9 on random small problems searched with DualPipeV alone,
    beside 1F1B, or beside the zero-bubble schedules; some of them with memory tight enough
    that a rank keeps several undominated pairs (the search branches)."""
    import nest.dp.dualpipe_v as search

    from .randomcase import assert_nest_equals_brute
    from .test_nest_dp import tiny_case

    widths = []
    undominated = search._undominated

    def counted(options):
        out = undominated(options)
        widths.append(len(out))
        return out

    agreed = alone = 0
    search._undominated = counted
    try:
        for seed in range(110):
            problem, options = tiny_case(3100 + seed)
            schedules = (
                ["dualpipe_v"], ["1f1b", "dualpipe_v"], ["1f1b", "zb_h2", "zb_v", "dualpipe_v"]
            )[seed % 3]  # fmt: skip
            options = {**options, "schedules": schedules}
            try:
                oracle = assert_nest_equals_brute(problem, options, (seed, options))
            except UserError:
                continue  # no configuration of the restricted space (e.g. m < 2 pp)
            if oracle is not None:
                agreed += 1
                alone += oracle.schedule is Schedule.DUALPIPE_V
    finally:
        search._undominated = undominated
    assert agreed >= 40 and alone >= 3, (agreed, alone)
    assert sum(w > 1 for w in widths) >= 5, widths
    # DualPipeV alone, where every plan found is one of its own
    agreed = 0
    for seed in range(60):
        problem, options = tiny_case(5000 + seed)
        options = {**options, "schedules": ["dualpipe_v"]}
        try:
            agreed += assert_nest_equals_brute(problem, options, (seed, options)) is not None
        except UserError:
            continue
    assert agreed >= 8, agreed


def test_brute_searches_dualpipe_v_beside_the_others():
    """``brute`` with every schedule listed scores DualPipeV's plans too; with DualPipeV alone
    its best plan is DualPipeV's and the evaluator's time."""
    from baselines.brute import BrutePlanner

    problem = _moe_problem()
    small = dict(pp=[2], tp=[1], zero_stages=[0, 1], recompute=["none", "full"])
    alone = BrutePlanner(schedules=["dualpipe_v"], **small).solve(problem)
    assert alone.schedule is Schedule.DUALPIPE_V
    assert alone.objective_s == pytest.approx(evaluate(problem, alone).iteration_time_s, rel=1e-12)
    every = BrutePlanner(
        schedules=["1f1b", "interleaved", "zb_h1", "zb_h2", "zb_v", "dualpipe_v"], **small
    ).solve(problem)
    assert every.objective_s <= alone.objective_s * (1 + 1e-12)


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_the_exports_write_dualpipev_to_torchtitan_and_the_nearest_to_megatron(target):
    """torchtitan runs ``DualPipeV`` (PyTorch's ``ScheduleDualPipeV``) with the ``2 pp`` chunks
    as stages, with a one-line warning that PyTorch runs the F&B's halves one after the other
    unless a function is registered for OVERLAP_F_B; Megatron-LM has no V: ZB-V's nearest
    (looped interleaving where ``m % pp == 0``) with a warning naming DualPipeV."""
    from nest.export import export_plan

    problem = make_problem(make_spec(layers=6), global_batch=8)
    result = export_plan(problem, _plan(problem), target)
    said = " ".join(result.warnings)
    if target == "torchtitan":
        assert 'pipeline_parallel_schedule = "DualPipeV"' in result.text
        assert "OVERLAP_F_B" in said and "register_custom_function" in said
        assert result.exported_plan["schedule"] == "dualpipe_v"
    else:
        assert "DualPipeV" in said and "interleaved" in said
        looped = evaluate(problem, _plan(problem, schedule="interleaved"))
        assert result.exported_iteration_time_s == pytest.approx(looped.iteration_time_s, rel=1e-12)


def test_the_timeline_draws_the_dualpipe_v_tasks(tmp_path):
    pp, m = 2, 4
    sim = simulate_schedule(
        bare_plan(pp, m, "dualpipe_v"), fwd_s=[1.0] * 4, bwd_s=[2.0] * 4, wgrad_s=[0.8] * 4,
        sync_s=[0.0] * pp, optimizer_s=[0.0] * pp,
    )  # fmt: skip
    view = plot_timeline(sim, tmp_path / "dpv.png")
    assert (tmp_path / "dpv.png").stat().st_size > 0
    assert view.bars == 2 * m * 3 * pp  # F, B and W of both chunks of every microbatch per rank
