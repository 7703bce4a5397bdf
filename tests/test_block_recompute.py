"""Every-n-blocks full recompute (issue 23, item 3): a stage fully recomputes its first ``k``
blocks and runs the rest in its mode (Megatron-LM's ``--recompute-granularity full
--recompute-method block --recompute-num-layers k``: NVIDIA/Megatron-LM@d98e8a6
megatron/core/recompute.py, ``recompute_method == 'block'`` checkpoints layers ``0..k-1`` of each
pipeline stage; torchtitan's ``selective_ac_option = "n"``: ``_apply_layer_sac`` in
torchtitan/distributed/activation_checkpoint.py at v0.2.2 checkpoints a stage's ``n``-th,
``2n``-th, ... block). The plan format and its old files, the evaluator's mix on a worked
example, the monotonicity the search's rule rests on, ``nest == brute`` on random problems
whose memory makes the mix matter, and the exports against each framework's argument rules.
"""

import dataclasses
import random
import tomllib

import pytest

from baselines.brute import BrutePlanner, plans_to_score
from baselines.fixed import FixedPlanner
from nest.core.axes import LayerKind, Recompute, parse_recompute_modes
from nest.core.errors import UserError
from nest.core.model import ModelSpec
from nest.core.plan import BlockRecompute, stage_recompute
from nest.core.serialize import plan_from_dict, plan_to_dict
from nest.cost import evaluate
from nest.dp.planner import NestPlanner
from nest.dp.space import SpaceOptions
from nest.dp.stages import StageModel
from nest.exact.planner import ExactPlanner
from nest.export import export_plan
from nest.export.megatron import megatron_args

from .conftest import make_cluster, make_problem
from .randomcase import assert_nest_equals_brute
from .test_nest_dp import tiny_case


def dense_problem(layers: int = 4, hbm_gib: float | None = None):
    spec = ModelSpec(
        name="d", hidden=256, layers=layers, heads=4, ffn_hidden=1024, vocab=512, seq_len=256
    )
    problem = make_problem(spec, make_cluster(fanouts=(8,)), global_batch=16)
    return with_hbm(problem, hbm_gib * 2**30) if hbm_gib else problem


def with_hbm(problem, hbm_bytes: float):
    device = dataclasses.replace(problem.cluster.device, hbm_bytes=hbm_bytes)
    return dataclasses.replace(problem, cluster=dataclasses.replace(problem.cluster, device=device))


def fixed(problem, **kw):
    kw.setdefault("microbatch_size", 1)
    return FixedPlanner(**kw).solve(problem)


def test_plan_files_keep_full_blocks_and_old_files_read_as_before():
    """``full_blocks`` round-trips through plan.json, is left out when 0 (so files without it
    are the old format and read as 0), and ``full`` means every block (stored as 0)."""
    problem = dense_problem()
    plan = fixed(problem, pp=2, dp=4, recompute=["full1+none", "none"])
    assert [s.full_blocks for s in plan.stages] == [1, 0]
    d = plan_to_dict(plan)
    assert d["stages"][0]["full_blocks"] == 1 and "full_blocks" not in d["stages"][1]
    assert plan_from_dict(d) == plan
    old = plan_to_dict(fixed(problem, pp=2, dp=4, recompute="full"))
    assert all("full_blocks" not in s for s in old["stages"])
    assert all(s.recompute is Recompute.FULL for s in plan_from_dict(old).stages)
    assert stage_recompute("full3+selective") == (Recompute.SELECTIVE, 3)
    assert stage_recompute(BlockRecompute(Recompute.FULL, 2)) == (Recompute.FULL, 2)
    full = fixed(problem, pp=1, dp=8, recompute=[BlockRecompute(Recompute.FULL, 2)])
    assert full.stages[0].full_blocks == 0  # full already recomputes every block


@pytest.mark.parametrize("bad", ["full3+bogus", "fullx+none", "block"])
def test_bad_stage_recompute_is_a_one_line_error(bad):
    with pytest.raises(UserError, match="fullK\\+MODE"):
        stage_recompute(bad)


def test_more_full_blocks_than_the_stage_holds_is_refused():
    problem = dense_problem()
    plan = fixed(problem, pp=2, dp=4)
    stages = (dataclasses.replace(plan.stages[0], full_blocks=5), plan.stages[1])
    with pytest.raises(UserError, match="full_blocks=5 but it holds 2 blocks"):
        evaluate(problem, dataclasses.replace(plan, stages=stages))


def test_evaluator_counts_k_full_blocks_and_the_rest_in_the_base_mode():
    """One stage of 4 blocks (chain: embedding, 4 blocks, head), ``k = 3`` fully recomputed:
    its recompute is 3 blocks' full recompute plus 1 block's ``none`` recompute
    (FlashAttention's score recompute), its stored activations per microbatch the embedding's
    and the head's plus ``3 act_full + act_none``, and its transient the largest of the
    layers': a fully recomputed block's ``transient + act_none - act_full``
    (:func:`nest.cost.memory.peak_bytes`). ``k = 0`` is the ``none`` plan and ``k = 4`` the
    ``full`` plan, exactly."""
    problem = dense_problem()
    plan = fixed(problem, pp=1, dp=8, recompute="full3+none")
    model, device = problem.model, problem.cluster.device
    shard = plan.config.shard(problem.training.sequence_parallel)
    costs = [model.layer_cost(ref, shard, device) for ref in model.chain]
    blocks = [c for c, ref in zip(costs, model.chain, strict=True) if ref.kind is LayerKind.BLOCK]
    ends = [c for c, ref in zip(costs, model.chain, strict=True) if ref.kind is not LayerKind.BLOCK]
    full, none = Recompute.FULL, Recompute.NONE
    report = evaluate(problem, plan)
    (stage,) = report.stages
    want_redo = sum(b.recompute_s[full] for b in blocks[:3]) + blocks[3].recompute_s[none]
    assert stage.recompute_s == pytest.approx(want_redo, rel=1e-12)
    memory = report.ranks[0].memory
    want_act = sum(e.act_bytes[none] for e in ends)
    want_act += sum(b.act_bytes[full] for b in blocks[:3]) + blocks[3].act_bytes[none]
    assert memory.activations_per_microbatch_bytes == pytest.approx(want_act, rel=1e-12)
    block_peak = blocks[0].transient_bytes + blocks[0].act_bytes[none] - blocks[0].act_bytes[full]
    want_peak = max(block_peak, *(e.transient_bytes for e in ends))
    assert memory.transient_bytes == pytest.approx(want_peak, rel=1e-12)
    for k, mode in ((0, "none"), (4, "full")):
        mixed = evaluate(problem, fixed(problem, pp=1, dp=8, recompute=f"full{k}+none"))
        plain = evaluate(problem, fixed(problem, pp=1, dp=8, recompute=mode))
        assert mixed.iteration_time_s == plain.iteration_time_s
        assert mixed.peak_memory_bytes == plain.peak_memory_bytes


@pytest.mark.parametrize("base", ["none", "selective", "mlp", "op"])
def test_time_grows_and_memory_falls_with_the_fully_recomputed_blocks(base):
    """The structure the search's rule rests on (:mod:`nest.dp.recurrence`): on a Llama 3 8B
    shape (8 blocks, TP 2 with sequence parallelism, 2 stages), a stage's time is
    non-decreasing and the rank's memory non-increasing in ``k`` (memory: ``f >= 1``
    microbatches in flight)."""
    spec = ModelSpec(
        name="l8", hidden=4096, layers=8, heads=32, kv_heads=8, ffn_hidden=14336,
        vocab=128256, seq_len=8192, activation="swiglu", norm="rmsnorm", bias=False,
        position="rope",
    )  # fmt: skip
    problem = make_problem(spec, make_cluster(fanouts=(8,)), global_batch=8)
    times, peaks = [], []
    for k in range(5):
        plan = fixed(problem, tp=2, pp=2, dp=2, recompute=f"full{k}+{base}")
        report = evaluate(problem, plan)
        times.append(report.stages[0].bwd_s)
        peaks.append(report.ranks[0].memory.total_bytes)
    assert all(a <= b for a, b in zip(times, times[1:], strict=False)), times
    assert all(a >= b for a, b in zip(peaks, peaks[1:], strict=False)), peaks
    assert times[0] < times[-1] and peaks[0] > peaks[-1]


MAX_PLANS = 6000
"""The largest space brute scores in these tests (a few seconds each)."""


def _tight_case(seed: int):
    """tiny_case's problem (3+ blocks) with the listed base modes, ``full`` and ``block``,
    1F1B and / or ZB-H2, and a device memory drawn between the peaks of the best all-``full``
    and the best base-mode plans, where the mix can matter; None when too big for brute."""
    problem, options = tiny_case(seed)
    if problem.model.spec.layers < 3:
        return None
    rng = random.Random(seed * 7 + 3)
    bases = rng.sample(["none", "selective", "mlp", "op"], rng.randint(1, 2))
    options = {
        **options,
        "recompute": [*bases, "full", "block"],
        "schedules": rng.choice([["1f1b"], ["1f1b", "zb_h2"]]),
    }
    if plans_to_score(problem, SpaceOptions(**options), MAX_PLANS) > MAX_PLANS:
        return None
    big = with_hbm(problem, 1e15)
    peaks = [
        evaluate(big, NestPlanner(**{**options, "recompute": modes}).solve(big)).peak_memory_bytes
        for modes in (["full"], bases)
    ]
    lo, hi = min(peaks), max(peaks)
    return with_hbm(problem, lo + rng.random() * (hi - lo)), options


def test_nest_equals_brute_with_every_n_blocks_recompute():
    """``nest`` (the smallest fitting ``k`` per base mode, :func:`nest.dp.recurrence.
    block_fitting`) equals ``brute`` (every ``k`` of every stage through ``evaluate``) on
    random small problems whose memory lies between what ``full`` and the base modes need,
    and some optima mix full and base blocks."""
    agreed = mixed = 0
    for seed in range(70):
        case = _tight_case(seed)
        if case is None:
            continue
        problem, options = case
        oracle = assert_nest_equals_brute(problem, options, (seed, options))
        if oracle is not None:
            agreed += 1
            mixed += any(s.full_blocks for s in oracle.stages)
    assert agreed >= 30, agreed
    assert mixed >= 8, mixed


def test_nest_equals_brute_with_block_beside_none_only():
    """Without ``full`` listed, ``k`` still ranges over ``1 .. nb - 1`` beside ``none``."""
    agreed = mixed = 0
    for seed in range(24):
        case = _tight_case(seed)
        if case is None:
            continue
        problem, options = case
        options = {**options, "recompute": ["none", "block"]}
        oracle = assert_nest_equals_brute(problem, options, (seed, options))
        if oracle is not None:
            agreed += 1
            mixed += any(s.full_blocks for s in oracle.stages)
    assert agreed >= 10 and mixed >= 5, (agreed, mixed)


def test_nest_equals_brute_when_every_fitting_k_is_offered(monkeypatch):
    """The fallback for a cost model where full recompute could cost less than a base mode
    (:meth:`~nest.dp.stages.StageModel.block_monotone` false: every fitting ``k`` extends the
    stage) is exact too."""
    monkeypatch.setattr(StageModel, "block_monotone", lambda self, r, base: False)
    agreed = 0
    for seed in range(30):
        case = _tight_case(seed)
        if case is not None and assert_nest_equals_brute(*case, (seed,)) is not None:
            agreed += 1
    assert agreed >= 12, agreed


def test_full_recompute_costs_at_least_every_mode_on_random_problems():
    """What makes the smallest fitting ``k`` the fastest: per block and group split, full
    recompute costs at least every other mode (seconds and collectives), on every rank of
    random configurations."""
    from nest.dp.space import configurations

    checked = 0
    for seed in range(40):
        problem, options = tiny_case(seed)
        for config in list(configurations(problem, SpaceOptions(**options)))[:10]:
            sm = StageModel(problem, config)
            for r in range(config.pp):
                for base in Recompute:
                    assert sm.block_monotone(r, base), (seed, config, base)
                    checked += 1
    assert checked > 500


def test_block_is_opt_in_and_only_nest_and_brute_search_it():
    """Off by default; a planner that does not search it refuses it in one line."""
    assert "block" not in SpaceOptions().recompute
    with pytest.raises(UserError, match="searched by solver=nest and solver=brute only"):
        parse_recompute_modes(["none", "block"])
    assert parse_recompute_modes(["none", "block"], block=True) == (Recompute.NONE,)
    problem = dense_problem()
    with pytest.raises(UserError, match="does not cover every-n-blocks recompute"):
        ExactPlanner(
            name="cpsat", backend="cpsat", recompute=["none", "full", "block"], tp=[1], pp=[1, 2]
        ).solve(problem)
    brute = BrutePlanner(recompute=["none", "full", "block"], tp=[1], cp=[1], pp=[2])
    assert brute.solve(problem).objective_s is not None


def _megatron_flags(problem, plan) -> dict:
    return {a.partition(" ")[0]: a.partition(" ")[2] for a in megatron_args(problem, plan)}


def _megatron_accepts(got: dict, layers_per_stage: int) -> None:
    """Megatron-Core's rules (TransformerConfig.__post_init__ at d98e8a6): full granularity
    needs a method, block or uniform, and ``recompute_num_layers`` "between 1 and
    num_layers_per_pipeline_rank"; selective takes neither."""
    if got.get("--recompute-granularity") == "full":
        assert got["--recompute-method"] in ("block", "uniform")
        assert 1 <= int(got["--recompute-num-layers"]) <= layers_per_stage


def test_megatron_exports_block_recompute_with_one_k():
    """The same ``k`` on every stage (base ``none``) is Megatron's block method exactly."""
    problem = dense_problem(layers=8)
    plan = fixed(problem, pp=2, dp=4, recompute="full3+none")
    got = _megatron_flags(problem, plan)
    assert got["--recompute-granularity"] == "full"
    assert got["--recompute-method"] == "block" and got["--recompute-num-layers"] == "3"
    _megatron_accepts(got, 4)
    exp = export_plan(problem, plan, "megatron")
    assert not exp.warnings
    assert exp.exported_iteration_time_s == evaluate(problem, plan).iteration_time_s


def test_megatron_exports_differing_k_at_the_largest_with_a_warning():
    problem = dense_problem(layers=8)
    plan = fixed(problem, pp=2, dp=4, recompute=["full1+none", "full3+none"])
    exp = export_plan(problem, plan, "megatron")
    nearest = fixed(problem, pp=2, dp=4, recompute="full3+none")  # built independently
    want = evaluate(problem, nearest).iteration_time_s
    assert exp.exported_iteration_time_s == pytest.approx(want, rel=1e-12)
    (warning,) = exp.warnings
    assert "every-n-blocks" in warning and "K=3" in warning
    assert exp.exported_plan["recompute"] == ["full3+none", "full3+none"]
    _megatron_accepts(_megatron_flags(problem, nearest), 4)
    assert "--recompute-method block" in exp.text and "--recompute-num-layers 3" in exp.text
    # a stage fully recomputed beside one at k = 2 of 4: K = 4 (all its blocks) is full
    # recompute everywhere, Megatron's uniform method
    plan = fixed(problem, pp=2, dp=4, recompute=["full", "full2+none"])
    exp = export_plan(problem, plan, "megatron")
    assert exp.exported_plan["recompute"] == ["full", "full"]
    assert "--recompute-method uniform" in exp.text
    # over a recomputing base mode: full everywhere
    plan = fixed(problem, pp=2, dp=4, recompute="full1+selective")
    exp = export_plan(problem, plan, "megatron")
    assert any("over a recomputing mode" in w for w in exp.warnings)
    assert "--recompute-method uniform" in exp.text


@pytest.mark.parametrize(
    ("recompute", "section", "exact"),
    [
        # 4 blocks per stage: n = 2 checkpoints blocks 2 and 4
        ("full2+none", {"mode": "selective", "selective_ac_option": "2"}, True),
        ("full1+none", {"mode": "selective", "selective_ac_option": "4"}, True),
        # n = 2 checkpoints only 2 < 3: n = 1, every block, which is full
        ("full3+none", {"mode": "full"}, False),
        # n = 2: 2 on each stage, at least 1 and 2
        (["full1+none", "full2+none"], {"mode": "selective", "selective_ac_option": "2"}, False),
    ],
)
def test_torchtitan_exports_every_nth_block(recompute, section, exact):
    """torchtitan's ``selective_ac_option = "n"`` checkpoints ``c // n`` of a stage's ``c``
    blocks (``_apply_layer_sac`` at v0.2.2: ``_layer_sac_count % ac_freq == 0``); the export
    takes the largest ``n`` recomputing at least ``k`` on every stage and warns when that is not
    the plan's ``k``."""
    problem = dense_problem(layers=8)
    plan = fixed(problem, pp=2, dp=4, recompute=recompute)
    exp = export_plan(problem, plan, "torchtitan")
    assert tomllib.loads(exp.text)["activation_checkpoint"] == section
    assert any("every-n-blocks" in w for w in exp.warnings) is not exact
