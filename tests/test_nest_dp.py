"""Exactness of the NEST DP: its stage model equals the evaluator, its optimum brute force's."""

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

from baselines.brute import count_plans
from nest.core.axes import Optimizer, Recompute
from nest.core.errors import Infeasible
from nest.core.model import ModelSpec
from nest.cost import evaluate
from nest.cost.pipeline import gather_exposed_s
from nest.dp.planner import NestPlanner
from nest.dp.space import SpaceOptions
from nest.dp.stages import StageModel

from .conftest import make_cluster, make_device, make_problem
from .randomcase import (
    RANK_ORDERS,
    assert_nest_equals_brute,
    random_case,
    random_rank_orders,
    random_shape,
    shape_rng,
)


@pytest.mark.parametrize("seed", range(150))
def test_stage_model_equals_the_evaluator(seed):
    """For a plan of the DP's space, every rank's forward, backward, sync, optimizer step and
    memory from the interval model equal the shared evaluator's (1e-9 relative). About half the
    models draw the modern shapes (MLA, windows, shared experts, MoE every n-th block, MTP)."""
    problem, planner = random_case(seed, hbm_gib=100, shapes=True)
    assert_stage_model_equals_the_evaluator(problem, planner.solve(problem))


def assert_stage_model_equals_the_evaluator(problem, plan) -> None:
    """Every 1F1B rank's terms from the DP's interval model equal ``evaluate``'s (1e-9)."""
    report = evaluate(problem, plan)
    sm = StageModel(problem, plan.config)
    for r, stage in enumerate(plan.stages):
        terms = sm.stage(r, stage.first_layer, stage.last_layer, stage.recompute)
        rank = report.ranks[r]
        assert terms.fwd_s == pytest.approx(report.stages[r].fwd_s, rel=1e-9, abs=1e-18)
        assert terms.bwd_s == pytest.approx(report.stages[r].bwd_s, rel=1e-9, abs=1e-18)
        assert_sync_terms_equal(problem, terms, report, r)
        assert terms.optimizer_s == pytest.approx(rank.optimizer_s, rel=1e-9, abs=1e-18)
        assert terms.memory_bytes == pytest.approx(rank.memory.total_bytes, rel=1e-9)


def assert_sync_terms_equal(problem, terms, report, r: int) -> None:
    """The DP's sync terms of rank ``r`` (gradient part and exposed weight all-gather under the
    stage's forward) equal the evaluator's (``dp_sync_s`` less ``dp_gather_s``; 1e-9)."""
    rank = report.ranks[r]
    reduce_s = rank.dp_sync_s - rank.dp_gather_s
    assert terms.sync_s == pytest.approx(reduce_s, rel=1e-9, abs=1e-15)
    overlap = problem.training.overlap_grad_sync
    gathered = float(gather_exposed_s(rank.dp_gather_s, report.stages[r].fwd_s, overlap))
    assert terms.gather_exposed_s == pytest.approx(gathered, rel=1e-9, abs=1e-15)


def shape_compute(rng: random.Random) -> dict:
    """Half the time the shape-aware compute model (nest/core/kernels.py) with random tiles, SMs,
    ceiling, kernel overhead and attention table; else the flat model."""
    if rng.random() < 0.5:
        return {}
    return dict(
        compute_model="shape",
        sm_count=rng.choice([4, 8, 24]),
        gemm_ceiling=rng.uniform(0.5, 1.0),
        kernel_overhead_s=rng.choice([0.0, rng.uniform(0, 5e-6)]),
        tile_shapes=tuple(rng.sample([(16, 16), (32, 16), (16, 32), (64, 64)], 2)),
        attention_efficiency=((32.0, rng.uniform(0.2, 0.5)), (64.0, rng.uniform(0.5, 0.9))),
    )


def tiny_case(seed: int):
    """A random problem of 3-8 chain layers (1-6 blocks; the model needs one) on 2-16 devices
    and 1-3 levels, and a random restriction of the space small enough for brute force. About
    half the models draw the modern shapes (tests/randomcase.py's ``random_shape``, from a
    stream of their own, so the base draws stay those of the seed)."""
    rng = random.Random(seed)
    shapes = shape_rng(seed)
    for _ in range(100):
        n_levels = rng.randint(1, 3)
        fanouts = [rng.choice([1, 2, 2, 4]) for _ in range(n_levels)]
        fanouts[0] = max(fanouts[0], 2)
        while __import__("math").prod(fanouts) > 16:
            fanouts[-1] = 1
        bws = sorted((rng.uniform(1, 900) for _ in fanouts), reverse=rng.random() < 0.8)
        lats = [rng.uniform(0, 30) for _ in fanouts]
        moe = rng.random() < 0.25
        base = dict(
            name="tiny",
            hidden=rng.choice([64, 128]),
            layers=rng.randint(1, 6),
            heads=rng.choice([2, 4]),
            ffn_hidden=rng.choice([128, 256]),
            vocab=rng.choice([256, 1000]),
            seq_len=rng.choice([32, 64]),
            activation=rng.choice(["gelu", "swiglu"]),
            dropout=rng.random() < 0.5,
            tied_embeddings=rng.random() < 0.5,
            num_experts=4 if moe else 1,
            top_k=2 if moe else 1,
        )
        base.update(random_shape(shapes, heads=base["heads"], layers=base["layers"], moe=moe))
        spec = ModelSpec(**base)
        device = make_device(
            hbm_bytes=rng.choice([0.002, 0.01, 0.05, 1.0]) * 2**30,
            peak_flops_per_s=rng.uniform(1, 200) * 1e12,
            hbm_bw_bytes_per_s=rng.uniform(100, 3000) * 1e9,
            **shape_compute(rng),
        )
        cluster = make_cluster(
            fanouts=tuple(fanouts),
            bws_gbps=tuple(bws),
            lat_us=tuple(lats),
            device=device,
            effs=tuple(rng.choice([1.0, rng.uniform(0.5, 1.0)]) for _ in fanouts),
        )
        problem = make_problem(
            spec,
            cluster,
            flash=rng.random() < 0.5,
            global_batch=rng.choice([2, 4, 8, 12]),
            microbatch_sizes=(1, 2),
            optimizer=rng.choice([Optimizer.ADAM, Optimizer.SGD]),
            overlap_grad_sync=rng.random() < 0.5,
            grad_bytes=rng.choice([2, 4]),
            tp_comm_overlap=rng.random() < 0.5,
            cp_comm_overlap=rng.random() < 0.5,
            ep_comm_overlap=rng.random() < 0.5,
        )
        options = dict(
            zero_stages=sorted(rng.sample([0, 1, 2, 3], rng.randint(1, 2))),
            recompute=sorted(rng.sample([r.value for r in Recompute], rng.randint(1, 3))),
            rank_orders=random_rank_orders(rng),
            # half search 1F1B only (tests/test_nest_interleaved.py covers interleaved in depth)
            schedules=rng.choice([["1f1b"], ["1f1b", "interleaved"]]),
        )
        if count_plans(problem, SpaceOptions(**options)) <= 2500:
            return problem, options
    raise AssertionError("no small case drawn")


def test_nest_equals_brute_force_on_200_random_problems():
    """``nest`` and ``brute`` (every plan of the same space through ``evaluate``) agree on the
    optimal iteration time to 1e-9 and on infeasibility, on 200 random small problems; when
    nothing fits, on the smallest peak memory any plan of the space needs. Every rank order the
    space allows is searched by at least 20 of the cases."""
    agreed = infeasible = 0
    drawn = Counter()
    for seed in range(200):
        problem, options = tiny_case(seed)
        drawn.update(options["rank_orders"])
        if assert_nest_equals_brute(problem, options, (seed, options)) is None:
            infeasible += 1
            continue
        agreed += 1
    assert agreed >= 120 and infeasible >= 5, (agreed, infeasible)
    assert set(drawn) == set(RANK_ORDERS) and min(drawn.values()) >= 20, drawn


def test_nest_equals_brute_force_with_prefetched_zero3_on_random_problems():
    """The FSDP prefetch overlap (nest.cost.fsdp) is priced per layer on the DP's intervals and
    per chunk by the evaluator: ``nest`` and ``brute`` agree to 1e-9 on random small problems
    searched at ZeRO-3, with ``reshard_after_forward`` on or off and the prefetch depth a whole
    layer or a few hundred parameter elements (DeepSpeed's bucket: most of a gather exposed)."""
    agreed = 0
    for seed in range(40):
        problem, options = tiny_case(1000 + seed)
        rng = random.Random(seed)
        training = dataclasses.replace(
            problem.training,
            reshard_after_forward=rng.random() < 0.5,
            zero3_prefetch_params=rng.choice([None, 500, 20_000]),
        )
        problem = dataclasses.replace(problem, training=training)
        options = {**options, "zero_stages": [3]}
        what = (seed, options, training.reshard_after_forward, training.zero3_prefetch_params)
        agreed += assert_nest_equals_brute(problem, options, what) is not None
    assert agreed >= 20, agreed


def test_per_stage_recompute_beats_any_uniform_mode():
    """Stages hold different numbers of in-flight microbatches (1F1B: ``min(p - r, m)``), so
    under tight memory the optimum mixes recompute modes, and every single mode for all stages
    is slower or does not fit (here: 6 blocks on 4 stages, 32 MiB per device)."""
    spec = ModelSpec(
        name="d",
        hidden=256,
        layers=6,
        heads=4,
        ffn_hidden=1024,
        vocab=256,
        seq_len=256,
        dropout=True,
    )
    problem = make_problem(
        spec,
        make_cluster(fanouts=(4,), device=make_device(hbm_bytes=32 * 2**20)),
        global_batch=8,
        microbatch_sizes=(1,),
    )
    plan = NestPlanner(tp=[1], cp=[1], pp=[4]).solve(problem)
    assert len({s.recompute for s in plan.stages}) > 1
    for mode in ("none", "selective"):  # too little memory for these on every stage
        with pytest.raises(Infeasible):
            NestPlanner(tp=[1], cp=[1], pp=[4], recompute=[mode]).solve(problem)
    uniform = NestPlanner(tp=[1], cp=[1], pp=[4], recompute=["full"]).solve(problem)
    assert uniform.objective_s > plan.objective_s  # full everywhere fits, but recomputes more


def test_empty_space_is_a_clear_error():
    from nest.core.errors import UserError

    problem = make_problem(
        ModelSpec(name="x", hidden=64, layers=2, heads=4, ffn_hidden=128, vocab=256, seq_len=32),
        make_cluster(fanouts=(8,)),
    )
    with pytest.raises(UserError, match="search space is empty") as err:
        NestPlanner(tp=[3]).solve(problem)
    msg = str(err.value)
    assert "(tp must divide heads=4 and the FFN size; dp must divide the global batch; " in msg
    assert "interleaved needs pp*v to divide the 2 blocks" in msg
    with pytest.raises(UserError) as err:
        NestPlanner(tp=[3], schedules=["1f1b"]).solve(problem)
    assert "interleaved" not in str(err.value)  # not searched, so not a rule


def test_empty_space_of_a_profile_states_its_measured_widths_not_heads():
    """A profile has no head count (its spec's heads is None): the rule is its measured widths."""
    from dataclasses import replace

    from nest.core.errors import UserError
    from nest.profile import load_profile_model

    model = load_profile_model(Path(__file__).parents[1] / "data/profiles/example_tiny.json")
    assert model.spec.heads is None
    problem = replace(make_problem(cluster=make_cluster(fanouts=(8,))), model=model)
    with pytest.raises(UserError, match="search space is empty") as err:
        NestPlanner(tp=[3], schedules=["1f1b"]).solve(problem)
    shown = ", ".join(f"(tp={t}, cp={c}, ep={e})" for t, c, e in model.widths)
    assert f"divisibility rules ((tp, cp, ep) must be a measured width: {shown}; " in str(err.value)
    assert "heads" not in str(err.value) and "None" not in str(err.value)


def test_infeasible_names_the_zero_stages_and_recompute_modes_searched():
    """The smallest-need message states the space actually searched, and a restricted one is
    named as a knob to widen; every plan of the full space needs less (it can shard more)."""
    problem = make_problem(
        ModelSpec(name="x", hidden=256, layers=4, heads=4, ffn_hidden=1024, vocab=512, seq_len=64),
        make_cluster(fanouts=(4,), device=make_device(hbm_bytes=2**20)),
        global_batch=8,
    )
    with pytest.raises(Infeasible) as narrow:
        NestPlanner(zero_stages=[0, 1], recompute=["none"]).solve(problem)
    with pytest.raises(Infeasible) as full:
        NestPlanner().solve(problem)
    assert "nest's space (ZeRO 0,1, recompute none) needs at least" in narrow.value.reason
    assert (
        "widen the search (solver.zero_stages=[0, 1, 2, 3] "
        "solver.recompute=[none,selective,mlp,selective_mlp,full])" in narrow.value.reason
    )
    modes = "none/selective/mlp/selective_mlp/full"
    assert f"nest's space (ZeRO 0-3, recompute {modes})" in full.value.reason
    assert "widen" not in full.value.reason and "\n" not in narrow.value.reason
    assert full.value.min_memory_bytes < narrow.value.min_memory_bytes
    with pytest.raises(Infeasible) as zero_only:
        NestPlanner(zero_stages=[0, 1, 2, 3], recompute=["full", "none"]).solve(problem)
    assert "(ZeRO 0-3, recompute full/none)" in zero_only.value.reason
    widen = "widen the search (solver.recompute=[none,selective,mlp,selective_mlp,full])"
    assert widen in zero_only.value.reason


def test_front_keeps_exactly_the_labels_worse_by_at_most_admits():
    """The inlined dominance of Front.insert is worse_by_at_most <= 0 (random labels), with the
    1F1B coefficients (1, m - 1) and the interleaved ones (1/v, m - 1/v)."""
    from nest.dp.recurrence import DPStats, Front, Label, worse_by_at_most

    rng = random.Random(7)
    for trial in range(400):
        m, v = rng.randint(1, 9), rng.choice([1, 2, 3, 4])
        s_coef, m_coef = (1.0, m - 1.0) if v == 1 else (1 / v, m - 1 / v)
        # half the trials with the interleaved DP's later-sync cap (later_sync_caps_s)
        cap = float("inf") if trial % 2 else rng.choice([0.0, 1.0, 2.0, 3 * rng.random()])
        # and, half of those, the later ranks' exposed weight all-gather (gather cap gamma)
        gam = 0.0 if trial % 4 < 2 else rng.choice([0.5, 1.0, rng.random()])
        front, stats = Front(m_coef, s_coef, None if trial % 2 else cap, gam), DPStats()
        kept: list[Label] = []

        def worse(a, b):
            return worse_by_at_most(a, b, m_coef, s_coef, cap, gam)  # noqa: B023

        for _ in range(12):
            lab = Label(*(rng.choice([0.0, 1.0, 2.0, rng.random()]) for _ in range(5)))
            if not any(worse(o, lab) <= 0.0 for o in kept):
                kept = [o for o in kept if worse(lab, o) > 0.0] + [lab]
            front.insert(lab, stats)
            assert front.labels == kept


def _interleaved_final_s(lab, ranks, s_coef, m_coef, overlap):
    """The interleaved objective ``s S + m M + E + O`` of a label extended by later ranks
    ``(t, b, sync, opt, g)``, written from nest.dp.interleaved's module docstring (rank ``q``
    exposes ``max(0, sync_q - B_q [- b_q]) + g_q``, ``B_q`` the backward prefix, ``g_q`` its
    exposed weight all-gather)."""
    total, mx, bwd, exposed, opt = lab.total_s, lab.max_s, lab.bwd_sum_s, lab.exposed_s, lab.opt_s
    for t, b, sync, step, g in ranks:
        exposed = max(exposed, max(0.0, sync - bwd - (b if overlap else 0.0)) + g)
        total, mx, bwd, opt = total + t, max(mx, t), bwd + b, max(opt, step)
    return s_coef * total + m_coef * mx + exposed + opt


def test_later_sync_cap_bounds_every_completion():
    """worse_by_at_most with the caps ``sigma`` (every later sync's gradient part at most
    ``sigma``) and ``gamma`` (every later exposed weight all-gather at most ``gamma``) is an upper
    bound on ``F(a + c) - F(b + c)`` for random labels and random completions (so a label it
    drops is never needed), never above the plain rule, and strictly below it in some cases
    (the cap is what lets the interleaved fronts collapse)."""
    from nest.dp.recurrence import Label, worse_by_at_most

    rng = random.Random(11)
    tighter = 0
    for _ in range(3000):
        m, v = rng.randint(2, 9), rng.choice([2, 3, 4])
        s_coef, m_coef = 1 / v, m - 1 / v
        sigma = rng.choice([0.0, 0.5, 2.0, 4 * rng.random()])
        gamma = rng.choice([0.0, 0.0, 0.5, rng.random()])  # later exposed all-gathers' cap
        a, b = (
            Label(*(rng.choice([0.0, 1.0, 2.0, 3 * rng.random()]) for _ in range(5)))
            for _ in range(2)
        )
        bound = worse_by_at_most(a, b, m_coef, s_coef, sigma, gamma)
        plain = worse_by_at_most(a, b, m_coef, s_coef)
        assert bound <= plain
        tighter += bound < plain
        for _ in range(10):
            later = [
                (
                    rng.random() * 3,
                    rng.choice([0.0, rng.random()]),
                    sigma * rng.random(),
                    rng.random(),
                    gamma * rng.choice([0.0, 1.0, rng.random()]),
                )
                for _ in range(rng.randint(0, 4))
            ]
            overlap = rng.random() < 0.5
            gap = _interleaved_final_s(a, later, s_coef, m_coef, overlap) - _interleaved_final_s(
                b, later, s_coef, m_coef, overlap
            )
            assert gap <= bound + 1e-12, (a, b, later, sigma, gamma)
    assert tighter >= 100, tighter


# ------------------------------------------------------------------ the space (nest.dp.space)
# The rules of the module docstring of nest.dp.space, checked on published splits and against
# an enumeration written from the docstring alone (not from the module's loops).


def test_chunk_split_is_megatrons_even_split():
    """Megatron-LM's default puts ``blocks / chunks`` blocks in every chunk, the embedding with
    the first and the head with the last; where ``chunks`` does not divide the blocks but
    divides ``blocks + 2``, ``--account-for-embedding/loss-in-pipeline-split`` counts both as a
    layer: NVIDIA's Llama-3.1 405B recipe runs 126 blocks in 64 chunks of 2 chain layers."""
    from nest.dp.space import chunk_split

    assert chunk_split(126, 64) == [2] * 64
    assert chunk_split(126, 63) == [3] + [2] * 61 + [3]
    assert chunk_split(8, 4) == [3, 2, 2, 3]
    assert chunk_split(6, 6) == [2, 1, 1, 1, 1, 2]  # chunks == blocks: one block each
    assert chunk_split(1, 1) == [3]
    assert chunk_split(10, 4) == [3, 3, 3, 3]  # 4 does not divide 10, it divides 12
    assert chunk_split(7, 4) is None  # neither 7 nor 9
    assert chunk_split(7, 3) == [3, 3, 3]  # 9 / 3
    assert chunk_split(5, 6) is None  # more chunks than blocks
    assert chunk_split(4, 6) is None  # 6 divides 4 + 2, but a chunk would hold no block
    for blocks in range(1, 30):
        for chunks in range(1, 33):
            counts = chunk_split(blocks, chunks)
            if counts is None:
                assert chunks > blocks or (blocks % chunks and (blocks + 2) % chunks)
                continue
            assert len(counts) == chunks and sum(counts) == blocks + 2
            assert all(isinstance(c, int) for c in counts)  # whole layers
            assert min(counts) >= 1 and max(counts) - min(counts) <= 1 + (blocks % chunks == 0)


def test_interleaved_chunks_cover_the_chain_contiguously():
    from nest.dp.space import interleaved_chunks

    # 4 blocks on 2 ranks x 2 chunks: embedding + block 1 | block 2 | block 3 | block 4 + head
    assert interleaved_chunks(6, 2, 2) == [(0, 1), (2, 2), (3, 3), (4, 5)]
    assert interleaved_chunks(12, 2, 2) == [(0, 2), (3, 5), (6, 8), (9, 11)]  # 10 + 2 = 4 x 3
    for n_layers, pp, v in [(6, 2, 2), (12, 2, 2), (14, 3, 2), (128, 8, 8), (66, 4, 4)]:
        chunks = interleaved_chunks(n_layers, pp, v)
        assert len(chunks) == pp * v
        assert chunks[0][0] == 0 and chunks[-1][1] == n_layers - 1
        assert all(b[0] == a[1] + 1 for a, b in zip(chunks, chunks[1:], strict=False))
    with pytest.raises(ValueError, match="no interleaved split of 7 blocks into 2 x 2 chunks"):
        interleaved_chunks(9, 2, 2)


def _space_by_the_docstring(
    problem, *, zero_stages=(0, 1, 2, 3), kinds=("1f1b", "interleaved"), hybrid=False
):
    """The configurations of ``nest.dp.space``'s module docstring, enumerated naively: every
    tuple of degrees, then the rules as written there (``hybrid``: ``zero_shards=[all]``)."""
    from itertools import permutations, product

    from nest.core.axes import Axis, Schedule
    from nest.core.layers import Shard

    n, chain = problem.cluster.num_devices, problem.num_layers
    blocks, batch = chain - 2, problem.training.global_batch
    spec, training = problem.model.spec, problem.training
    orders = [(Axis.TP, *rest) for rest in permutations((Axis.CP, Axis.DP, Axis.PP))]
    out = set()
    degrees = product(*[range(1, n + 1)] * 3, range(1, batch + 1), range(1, 9), (None, 1))
    for tp, cp, pp, dp, ep, etp in degrees:
        if n % tp or (n // tp) % cp or tp * cp * pp * dp > n or pp > chain or batch % dp:
            continue
        # etp: a MoE model's experts split like the dense weights (None) or whole (1, tp > 1)
        if etp == 1 and (not spec.is_moe or tp == 1):
            continue
        fold = tp if etp == 1 else 1  # whole experts fold the tensor ranks into expert ranks
        if (spec.num_experts if spec.is_moe else 1) % ep or (dp * cp * fold) % ep:
            continue
        shard = Shard(tp=tp, cp=cp, ep=ep, sp=training.sequence_parallel and tp > 1, etp=etp)
        if problem.model.shard_problem(shard) is not None:
            continue
        for mbs in training.microbatch_sizes:
            if batch % (mbs * dp):
                continue
            m = batch // (mbs * dp)
            schedules = [(Schedule.ONE_F_ONE_B, 1)] if "1f1b" in kinds else []
            if "interleaved" in kinds and pp >= 2 and m % pp == 0:
                for v in range(2, blocks + 1):
                    c = pp * v
                    if c <= blocks and (blocks % c == 0 or (blocks + 2) % c == 0):
                        schedules.append((Schedule.INTERLEAVED, v))
            degree = {Axis.TP: tp, Axis.CP: cp, Axis.DP: dp, Axis.PP: pp}
            placed = {}
            for order in orders:  # the first order of each placement is kept
                placed.setdefault(tuple(a for a in order if degree[a] > 1), order)
            # ZeRO 0 alone when nothing is replicated: no dense and no expert replica
            replicas = dp * cp * fold // ep if spec.is_moe else 1
            zeros = (0,) if dp * cp == 1 and replicas == 1 else zero_stages
            # hybrid sharding: every divisor of dp below it whose shard group holds whole
            # expert groups, ZeRO 1-3; nothing is offloaded (optimizer, activations) unless
            # solver.offload asks for it
            shards = [None]
            if hybrid:
                shards += [d for d in range(1, dp) if dp % d == 0 and (d * cp * fold) % ep == 0]
            for (kind, v), zero, order, zs in product(schedules, zeros, placed.values(), shards):
                if zs is None or zero >= 1:
                    # no offload (optimizer, activations, a count of offloaded blocks)
                    off = (False, False, None)
                    out.add((tp, cp, ep, etp, dp, pp, mbs, zero, zs, kind, v, *off, order))
    return out


def _as_tuple(c):
    """Every field of the configuration, rank order included, in declaration order."""
    return dataclasses.astuple(c)


@pytest.mark.parametrize(
    ("spec_kw", "zeros"),
    [
        (dict(layers=4, heads=4), None),
        (dict(layers=4, heads=4), (0, 3)),
        (dict(layers=4, heads=4, num_experts=4, top_k=2, activation="swiglu"), None),
    ],
)
def test_configurations_with_hybrid_sharding_are_the_docstrings_space(spec_kw, zeros):
    """With ``zero_shards=[all]`` :func:`configurations` adds exactly the hybrid configurations
    the module docstring defines (every divisor of ``dp`` below it whose shard group holds whole
    expert groups, ZeRO 1-3), each once; the plain space is unchanged beside them."""
    from nest.dp.space import configurations
    from tests.conftest import make_spec

    problem = make_problem(make_spec(**spec_kw), make_cluster(fanouts=(4, 2)), global_batch=8)
    restrict = {} if zeros is None else {"zero_stages": zeros}
    options = SpaceOptions(zero_shards=("all",), **restrict)
    got = [_as_tuple(c) for c in configurations(problem, options)]
    want = _space_by_the_docstring(problem, hybrid=True, **restrict)
    assert len(got) == len(set(got)) and set(got) == want
    plain = {_as_tuple(c) for c in configurations(problem, SpaceOptions(**restrict))}
    assert plain == {c for c in want if c[8] is None} and len(want) > len(plain)


@pytest.mark.parametrize(
    ("fanouts", "spec_kw", "train_kw", "kinds", "zeros"),
    [
        ((4, 2), dict(layers=6, heads=4), dict(global_batch=16), ("1f1b", "interleaved"), None),
        ((2, 2), dict(layers=4, heads=2), dict(global_batch=6), ("interleaved",), (1, 3)),
        ((8,), dict(layers=2, heads=8), dict(global_batch=8), ("1f1b",), None),
        (
            (4, 2),
            dict(layers=4, heads=4, num_experts=4, top_k=2, activation="swiglu"),
            dict(global_batch=8, microbatch_sizes=(1, 2, 4)),
            ("1f1b", "interleaved"),
            None,
        ),
        ((3,), dict(layers=7, heads=3, hidden=96), dict(global_batch=12), ("1f1b",), (2,)),
        (  # 6 experts on 3 data-parallel ranks: ep 3 divides dp, ep 2 does not
            (3, 2),
            dict(layers=2, heads=6, hidden=96, num_experts=6, top_k=2, activation="swiglu"),
            dict(global_batch=6, microbatch_sizes=(3, 1, 2), sequence_parallel=False),
            ("1f1b", "interleaved"),
            None,
        ),
    ],
)
def test_configurations_are_the_docstrings_space(fanouts, spec_kw, train_kw, kinds, zeros):
    """:func:`configurations` yields exactly the configurations the module docstring defines
    (dense and MoE models, 1F1B and interleaved, ZeRO restrictions), each once."""
    from nest.dp.space import Family, configurations, families
    from tests.conftest import make_spec

    problem = make_problem(make_spec(**spec_kw), make_cluster(fanouts=fanouts), **train_kw)
    options = SpaceOptions(schedules=kinds, **({} if zeros is None else {"zero_stages": zeros}))
    got = [_as_tuple(c) for c in configurations(problem, options)]
    want = _space_by_the_docstring(
        problem, kinds=kinds, **({} if zeros is None else {"zero_stages": zeros})
    )
    assert len(got) == len(set(got))
    assert set(got) == want
    assert want  # a non-empty space was compared
    fams = list(families(problem, options))
    assert sum(len(f) for f in fams) == len(got)
    assert all(len(f) > 0 and isinstance(f.m, int) for f in fams)  # non-empty, whole microbatches
    assert all(
        isinstance(f, Family) and f.m * f.microbatch_size * f.dp == problem.training.global_batch
        for f in fams
    )


def test_space_restrictions_keep_only_what_they_name():
    """Restrictions (``SpaceOptions``) select from the space, in any order, and never add to it:
    a pipeline longer than the chain, an expert degree a dense model cannot take and an order
    outside ``rank_orders`` are not configurations; ``virtual_stages`` picks ``v``."""
    from nest.core.axes import Axis, Schedule
    from nest.dp.space import configurations
    from tests.conftest import make_spec

    problem = make_problem(make_spec(layers=2, heads=4), make_cluster(fanouts=(8,)), global_batch=8)
    chain = problem.num_layers  # 4
    got = list(configurations(problem, SpaceOptions(pp=(chain + 2, 2), schedules=("1f1b",))))
    assert got and {c.pp for c in got} == {2}
    got = list(configurations(problem, SpaceOptions(ep=(2, 1), pp=(1,))))
    assert got == list(configurations(problem, SpaceOptions(ep=(1,), pp=(1,))))  # dense: no experts
    order = "tp,pp,dp,cp"
    got = list(configurations(problem, SpaceOptions(rank_orders=[order], pp=(1, 2))))
    assert got and {c.rank_order for c in got} == {(Axis.TP, Axis.PP, Axis.DP, Axis.CP)}
    message = (
        "solver.rank_orders entry 'cp,tp,dp,pp' does not put tp innermost; the NEST space keeps "
        "tensor groups on consecutive devices. Give each order as one string with tp first, "
        "e.g. solver.rank_orders=[tp-cp-dp-pp,tp-pp-dp-cp]"
    )
    with pytest.raises(Exception) as info:
        list(configurations(problem, SpaceOptions(rank_orders=["cp,tp,dp,pp"])))
    assert str(info.value) == message
    deep = make_problem(make_spec(layers=10, heads=4), make_cluster(fanouts=(4,)), global_batch=8)
    kinds = ("interleaved",)
    every = {c.virtual_stages for c in configurations(deep, SpaceOptions(schedules=kinds, pp=(2,)))}
    assert every == {2, 3, 5}  # 2 x 5 chunks divide 10 blocks, 2 x 2 and 2 x 3 divide 10 + 2
    two = {
        c.virtual_stages
        for c in configurations(deep, SpaceOptions(schedules=kinds, pp=(2,), virtual_stages=[2]))
    }
    assert two == {2} and all(
        c.schedule is Schedule.INTERLEAVED
        for c in configurations(deep, SpaceOptions(schedules=kinds, pp=(2,)))
    )


def test_space_planner_keeps_its_hyper_parameters_as_given():
    """``space_kwargs`` returns the restrictions as given (to build another planner on the same
    space) and ``options`` reads single values as lists of one, never letter by letter."""
    from nest.core.errors import UserError
    from nest.dp.space import SpacePlanner

    given = dict(
        tp=[2],
        cp=[1],
        ep=[1],
        pp=4,
        zero_stages=[1, 3],
        recompute="full",
        rank_orders=["tp,dp,cp,pp"],
        schedules="interleaved",
        virtual_stages=[2, 4],
        etp=1,
        zero_shards="all",
    )
    planner = SpacePlanner(name="x", **given)
    assert planner.name == "x"
    assert planner.space_kwargs() == {**given, "offload": False}  # off unless given
    assert planner.options() == SpaceOptions(
        tp=(2,),
        cp=(1,),
        ep=(1,),
        pp=(4,),
        zero_stages=(1, 3),
        recompute=("full",),
        rank_orders=("tp,dp,cp,pp",),
        schedules=("interleaved",),
        virtual_stages=(2, 4),
        etp=(1,),
        zero_shards=("all",),
    )
    default = SpacePlanner(name="d")
    assert default.options() == SpaceOptions(zero_stages=(0, 1, 2, 3))
    assert default.space_kwargs()["schedules"] == ("1f1b", "interleaved")
    for name in given:  # a bad value is named with its option
        with pytest.raises(UserError) as info:
            SpacePlanner(name="x", **{name: 3.5}).options()
        assert str(info.value) == f"solver.{name}=3.5 must be a list: solver.{name}=[...]"


def test_etp_option_selects_whole_or_split_experts():
    """``solver.etp``: ``tp`` keeps experts split like the dense weights, ``1`` whole experts, both
    by default (MoE models with tp > 1 only); a dense model has no expert degree to choose; any
    other value is a one-line error naming the choices."""
    from nest.core.errors import UserError
    from nest.dp.space import configurations
    from tests.conftest import make_spec

    moe = make_problem(
        make_spec(layers=2, heads=4, num_experts=4, top_k=2, activation="swiglu"),
        make_cluster(fanouts=(4,)),
        global_batch=8,
    )
    both = {c.etp for c in configurations(moe, SpaceOptions(tp=(2,), pp=(1,)))}
    assert both == {None, 1}
    assert {c.etp for c in configurations(moe, SpaceOptions(tp=(2,), pp=(1,), etp=("tp",)))} == {
        None
    }
    assert {c.etp for c in configurations(moe, SpaceOptions(tp=(2,), pp=(1,), etp=(1,)))} == {1}
    assert {c.etp for c in configurations(moe, SpaceOptions(tp=(1,), pp=(1,), etp=(1,)))} == {
        None  # tp 1: whole experts are the split ones
    }
    dense = make_problem(make_spec(layers=2, heads=4), make_cluster(fanouts=(4,)), global_batch=8)
    assert {c.etp for c in configurations(dense, SpaceOptions(tp=(2,), pp=(1,)))} == {None}
    with pytest.raises(UserError, match=r"solver.etp=\[2\]: 2 is not an expert tensor degree"):
        list(configurations(moe, SpaceOptions(tp=(2,), pp=(1,), etp=(2,))))
