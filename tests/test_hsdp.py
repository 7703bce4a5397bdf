"""Hybrid sharding (HSDP, ``ParallelConfig.zero_shard``): the plan field, its groups and its
cost terms, worked by hand."""

import numpy as np
import pytest

from baselines.fixed import FixedPlanner
from nest.core.errors import Infeasible, UserError
from nest.core.plan import ParallelConfig, group_arrays
from nest.cost import evaluate

from .conftest import make_cluster, make_problem
from .test_nest_dp import assert_stage_model_equals_the_evaluator
from .test_search_caches import configuration_optimum_s

GB, US = 1e9, 1e-6


def test_zero_shard_is_validated_with_one_line_errors():
    """A shard degree must divide ``dp``; it needs a ZeRO stage and shard groups of whole expert
    groups; a shard degree equal to ``dp`` is the plain configuration and compares equal to
    it."""
    with pytest.raises(UserError, match="zero_shard=3 must be a positive divisor of dp=8"):
        ParallelConfig(dp=8, zero_stage=1, zero_shard=3)
    with pytest.raises(UserError, match="zero_stage=0"):
        ParallelConfig(dp=8, zero_shard=4)
    with pytest.raises(UserError, match="zero_shard=True must be a positive divisor"):
        ParallelConfig(dp=4, zero_stage=1, zero_shard=True)  # a flag is not a shard degree
    with pytest.raises(UserError, match="zero_shard=4 with ep=8"):
        ParallelConfig(dp=8, ep=8, zero_stage=1, zero_shard=4)
    ParallelConfig(dp=8, ep=4, zero_stage=1, zero_shard=4)  # one expert group per shard group
    ParallelConfig(dp=8, tp=2, etp=1, ep=8, zero_stage=1, zero_shard=4)  # 4 x 2 folded ranks
    assert ParallelConfig(dp=8, zero_stage=3, zero_shard=8) == ParallelConfig(dp=8, zero_stage=3)
    assert ParallelConfig(dp=8, zero_stage=1, zero_shard=2).zero_replicas == 4


def test_hsdp_groups_shard_inside_and_replicate_across():
    """``[dp=4][cp=2][tp=1]`` devices ``d[r][c] = 2 r + c`` with ``zero_shard = 2``: replicas
    0, 1 form shard group 0 and 2, 3 shard group 1 (each ``zero_shard x cp = 4`` ranks);
    replicate groups pair the ranks at the same place in each group."""
    got = group_arrays(np.arange(8).reshape(4, 2, 1), ep=1, zero_shard=2)
    assert sorted(sorted(g) for g in got["zero_shard"].tolist()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sorted(sorted(g) for g in got["zero_replicate"].tolist()) == [
        [0, 4],
        [1, 5],
        [2, 6],
        [3, 7],
    ]
    assert "zero_shard" not in group_arrays(np.arange(8).reshape(4, 2, 1), ep=1)


def test_hsdp_expert_groups_are_whole_expert_groups_of_a_shard_group():
    """``[dp=4][cp=1][tp=2]`` devices ``d[r][t] = 2 r + t`` with ``ep = 2``, ``zero_shard = 2``:
    experts split like the dense weights (etp = tp) form expert groups of 2 replicas of one
    tensor rank ({0, 2}, {1, 3}, {4, 6}, {5, 7}: Megatron's); inside shard group 0 (replicas
    0, 1) each expert rank has one copy, so its expert shard groups are single devices, and the
    copies across the two shard groups replicate ({0, 4}, ...). With ``etp = 1`` and ``ep = 4``
    the 4 devices of shard group 0 are one expert group ({0, 1, 2, 3})."""
    devices = np.arange(8).reshape(4, 1, 2)
    got = group_arrays(devices, ep=2, zero_shard=2)
    assert sorted(sorted(g) for g in got["ep"].tolist()) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert got["expert_zero_shard"].shape == (8, 1)
    assert sorted(sorted(g) for g in got["expert_zero_replicate"].tolist()) == [
        [0, 4],
        [1, 5],
        [2, 6],
        [3, 7],
    ]
    folded = group_arrays(devices, ep=4, etp=1, zero_shard=2)
    assert sorted(sorted(g) for g in folded["ep"].tolist()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sorted(sorted(g) for g in folded["expert_zero_replicate"].tolist()) == [
        [0, 4],
        [1, 5],
        [2, 6],
        [3, 7],
    ]
    # ep = 1: the expert groups are the dense ones
    plain = group_arrays(devices, ep=1, zero_shard=2)
    for kind in ("zero_shard", "zero_replicate"):
        dense = sorted(sorted(g) for g in plain[kind].tolist())
        assert sorted(sorted(g) for g in plain[f"expert_{kind}"].tolist()) == dense


def _case():
    """8 devices, 2 nodes of 4 (400 GB/s, 1 us inside; 50 GB/s, 5 us across), ``dp = 8`` with
    Megatron's rank order, so replica ``d`` is device ``d``; ``zero_shard = 4``: each node is a
    shard group, the two nodes replicate."""
    cluster = make_cluster(fanouts=(4, 2), bws_gbps=(400, 50), lat_us=(1, 5))
    problem = make_problem(cluster=cluster, global_batch=16)
    model = problem.model
    shard = ParallelConfig(dp=8).shard(False)
    params = sum(model.layer_cost(ref, shard, cluster.device).dense_params for ref in model.chain)
    return problem, params


def _ring_s(n_bytes, peers, bw_gbps, lat_us):
    """One ring level (``nest.cost.collectives``: Thakur et al. 2005): ``(k-1)/k S / bw +
    (k-1) alpha``."""
    return (peers - 1) / peers * n_bytes / (bw_gbps * GB) + (peers - 1) * lat_us * US


def test_hsdp_sync_is_reduce_scatter_inside_all_reduce_across_all_gather_inside():
    """Worked example (ZeRO-1 and ZeRO-3 with ``zero_shard = 4`` on :func:`_case`), the HSDP
    gradient path of FSDP2 (torchtitan ``docs/fsdp.md``, a 2-D ``(replicate, shard)`` mesh;
    FSDP1 ``HYBRID_SHARD``) and of Megatron-Core's ``--num-distributed-optimizer-instances``
    (``param_and_grad_buffer.py``: reduce-scatter inside an instance, all-reduce across):

    - ZeRO-1: reduce-scatter ``G = 2 N`` bytes among the 4 devices of a node, all-reduce the
      reduced shard ``G / 4`` between the 2 nodes (twice one ring level), all-gather ``P = 2 N``
      among the 4 again;
    - ZeRO-3: only the all-reduce across at the end of the iteration (its reduce-scatters run
      every microbatch, inside the node);
    - memory: the optimizer state (12 bytes per parameter, Adam) over the 4 of the node, not
      the 8 of ``dp``."""
    problem, n = _case()
    g = 2 * n
    inside = _ring_s(g, 4, 400, 1)
    across = 2 * _ring_s(g / 4, 2, 50, 5)
    one = evaluate(problem, FixedPlanner(dp=8, zero_stage=1, zero_shard=4).solve(problem))
    assert one.ranks[0].dp_sync_s == pytest.approx(inside + across + inside, rel=1e-12)
    three = evaluate(problem, FixedPlanner(dp=8, zero_stage=3, zero_shard=4).solve(problem))
    assert three.ranks[0].dp_sync_s == pytest.approx(across, rel=1e-12)
    full = evaluate(problem, FixedPlanner(dp=8, zero_stage=1).solve(problem))
    mem_hsdp, mem_full = one.ranks[0].memory, full.ranks[0].memory
    assert mem_hsdp.optimizer_bytes - mem_full.optimizer_bytes == pytest.approx(
        12 * n / 4 - 12 * n / 8, rel=1e-12
    )
    # full sharding's hierarchical reduce-scatter and all-gather over split (4, 2) each run
    # the node's ring and then a 2-ring on G / 4 across: the same terms as HSDP's, so on a
    # hierarchy ZeRO-1 HSDP buys no sync time here, only costs memory
    full_sync = 2 * (_ring_s(g, 4, 400, 1) + _ring_s(g / 4, 2, 50, 5))
    assert full.ranks[0].dp_sync_s == pytest.approx(full_sync, rel=1e-12)
    assert one.ranks[0].dp_sync_s == pytest.approx(full_sync, rel=1e-12)


def test_hsdp_zero3_gathers_run_in_the_shard_group():
    """ZeRO-3 with ``zero_shard = 4``: every layer's all-gather and reduce-scatter is one ring
    inside the node (no level-1 term), so a stage's ZeRO-3 traffic equals that of ``dp = 4``
    sharding over one node alone, and it is below full sharding over both nodes."""
    problem, _ = _case()
    hsdp = evaluate(problem, FixedPlanner(dp=8, zero_stage=3, zero_shard=4).solve(problem))
    full = evaluate(problem, FixedPlanner(dp=8, zero_stage=3).solve(problem))
    node = make_problem(
        cluster=make_cluster(fanouts=(4,), bws_gbps=(400,), lat_us=(1,)), global_batch=8
    )
    alone = evaluate(node, FixedPlanner(dp=4, zero_stage=3).solve(node))
    assert hsdp.stages[0].zero3_comm_s == pytest.approx(alone.stages[0].zero3_comm_s, rel=1e-12)
    assert hsdp.stages[0].zero3_comm_s < full.stages[0].zero3_comm_s
    assert hsdp.ranks[0].memory.weights_bytes > full.ranks[0].memory.weights_bytes


# ------------------------------------------------------------------ the search (opt-in)


def test_the_default_space_has_no_hybrid_sharding():
    """Hybrid sharding is opt-in: the default space, its size and every existing pin stay as
    they were; ``solver.zero_shards=[all]`` adds, for each configuration with ``dp >= 2``, one
    family per proper divisor of ``dp`` with the ZeRO stages 1-3."""
    from nest.dp.space import SpaceOptions, families

    problem = make_problem(cluster=make_cluster(fanouts=(4, 2)), global_batch=16)
    plain = list(families(problem, SpaceOptions()))
    assert all(f.zero_shard is None for f in plain)
    hybrid = list(families(problem, SpaceOptions(zero_shards=("all",))))
    extra = [f for f in hybrid if f.zero_shard is not None]
    assert [f for f in hybrid if f.zero_shard is None] == plain
    assert extra and all(f.dp % f.zero_shard == 0 < f.dp - f.zero_shard for f in extra)
    assert all(f.zeros == (1, 2, 3) and f.ep == 1 for f in extra)
    want = sum(sum(1 for d in range(1, f.dp) if f.dp % d == 0) for f in plain if f.dp > 1)
    assert len(extra) == want
    with pytest.raises(UserError, match="solver.zero_shards"):
        list(families(problem, SpaceOptions(zero_shards=(0,))))


def _hsdp_case(seed: int):
    """A tiny random problem (tests/test_nest_dp.py's ``tiny_case``) with every hybrid shard
    degree in its space."""
    from .test_nest_dp import tiny_case

    problem, options = tiny_case(seed)
    zeros = sorted({*options["zero_stages"], 1})  # hybrid families need a ZeRO stage >= 1
    return problem, {**options, "zero_stages": zeros, "zero_shards": ["all"]}


@pytest.mark.parametrize("seed", range(40))
def test_nest_equals_brute_with_hybrid_sharding_in_the_space(seed):
    """``nest`` (its bounds on hybrid configurations included) and ``brute`` (every plan of the
    same space through ``evaluate``) agree to 1e-9 on random small problems whose space holds
    every hybrid shard degree."""
    from .randomcase import assert_nest_equals_brute

    problem, options = _hsdp_case(5000 + seed)
    assert_nest_equals_brute(problem, options, (seed, options))


def test_hybrid_sharding_is_the_optimum_of_some_random_problems():
    """The random spaces above hold hybrid plans that win, not only ones that lose: restricted
    to ZeRO-3 and shard degrees of at least 2, brute's optimum shards within groups on some of
    the 40 draws (2 when written: ZeRO-3's gathers kept inside the shard group beat gathers over
    every replica), and nest finds the same optimum there."""
    from baselines.brute import BrutePlanner

    from .randomcase import assert_nest_equals_brute

    wins = 0
    for seed in range(40):
        problem, options = _hsdp_case(5000 + seed)
        options = {**options, "zero_stages": [3], "zero_shards": [2, 4, 8]}
        try:
            best = BrutePlanner(**options).solve(problem)
        except Infeasible:
            continue
        if best.zero_shard is not None:
            wins += 1
            assert_nest_equals_brute(problem, options, (seed, options))
    assert wins >= 1


@pytest.mark.parametrize("seed", range(12))
def test_stage_model_equals_the_evaluator_on_hybrid_plans(seed):
    """The DP's interval model (:class:`nest.dp.stages.StageModel`) prices a hybrid plan's
    stages as the evaluator does (1e-9): forward, backward, sync, optimizer step, memory."""
    from nest.dp.planner import NestPlanner

    problem, options = _hsdp_case(6000 + seed)
    try:
        ranked = NestPlanner(**options, top_k=20).solve_ranked(problem)
    except Infeasible as exc:
        pytest.skip(exc.reason)
    checked = 0
    for plan in ranked:
        if plan.zero_shard is None or plan.config.interleaved:
            continue
        assert_stage_model_equals_the_evaluator(problem, plan)
        checked += 1
    if not checked:
        pytest.skip("no hybrid plan among the best of this draw")


@pytest.mark.parametrize("seed", range(20))
def test_hybrid_bound_never_exceeds_a_configurations_optimum(seed):
    """The bounds of hybrid configurations (:mod:`nest.dp.bounds`: the configuration's own
    state and group sizes) never exceed their optimum (the exact DP with no incumbent), nor
    does their memory floor exceed the least peak memory of any of their plans, at every ZeRO
    stage, 1F1B or interleaved, any rank order, on random problems."""
    import dataclasses
    import random

    from nest.dp.bounds import Floors
    from nest.dp.planner import smallest_peak_bytes
    from nest.dp.space import SpaceOptions, families
    from nest.dp.stages import StageModel

    from .randomcase import random_problem

    rng = random.Random(7000 + seed)
    problem = random_problem(rng, hbm_gib=rng.choice([0.05, 4]))
    training = dataclasses.replace(
        problem.training,
        reshard_after_forward=rng.random() < 0.5,
        overlap_grad_sync=rng.random() < 0.5,
    )
    problem = dataclasses.replace(problem, training=training)
    options = SpaceOptions(zero_shards=("all",))
    modes = options.recompute_modes
    floors = Floors(problem, modes)
    shared: dict = {}
    checked = 0
    for family in families(problem, options):
        if family.zero_shard is None:
            continue
        for schedule in family.schedules:
            for zero in family.zeros:
                bound = floors.config_bound_s(family, zero, schedule)
                need = floors.memory_floor_bytes(family, zero, schedule)
                for order in family.orders:
                    config = family.config(schedule, zero, order)
                    sm = StageModel(problem, config, shared)
                    peak = smallest_peak_bytes(sm, modes)
                    assert need <= peak * (1 + 1e-12), (config, need, peak)
                    optimum = configuration_optimum_s(sm, modes)
                    if optimum is not None:
                        assert bound <= optimum * (1 + 1e-12), (config, bound, optimum)
                        checked += 1
    if checked == 0:
        pytest.skip("no hybrid configuration fits on this draw")


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
def test_exact_planners_refuse_hybrid_sharding_in_one_line(backend):
    """The CP-SAT and MILP models do not cover hybrid sharding: asking them for it is a one-line
    error naming the option and the planners that do."""
    from nest.exact.planner import ExactPlanner

    problem, _ = _case()
    with pytest.raises(UserError, match="does not cover hybrid sharding") as err:
        ExactPlanner(name=backend, backend=backend, zero_shards=["all"]).solve(problem)
    assert "\n" not in str(err.value) and "solver=nest" in str(err.value)


def test_fixed_planner_takes_zero_shard_from_its_config():
    """``solver=fixed solver.zero_shard=4`` reaches the plan (conf/solver/fixed.yaml)."""
    from hydra import compose, initialize_config_dir

    from nest.app.cli import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["solver=fixed", "solver.zero_shard=4"])
    assert cfg.solver.zero_shard == 4
    problem, _ = _case()
    plan = FixedPlanner(dp=8, zero_stage=3, zero_shard=cfg.solver.zero_shard).solve(problem)
    assert plan.zero_shard == 4 and plan.config.zero_replicas == 2


# ------------------------------------------------------------------ exports


def _export_problem():
    """Two nodes of four, dp 8, fp32 gradients (what the frameworks run as scored)."""
    cluster = make_cluster(fanouts=(4, 2), bws_gbps=(400, 50), lat_us=(1, 5))
    return make_problem(cluster=cluster, global_batch=16, grad_bytes=4, cp_comm_overlap=True)


def test_torchtitan_exports_hsdp_as_replicate_times_shard():
    """torchtitan's HSDP (``docs/fsdp.md``; mesh ``[pp, dp_replicate, dp_shard, cp, tp]``):
    ``data_parallel_shard_degree = zero_shard``, ``data_parallel_replicate_degree = dp /
    zero_shard``; ZeRO-3 reshards after forward, and the exported plan is the plan itself."""
    import tomllib

    from nest.export import export_plan

    problem = _export_problem()
    plan = FixedPlanner(dp=8, zero_stage=3, zero_shard=4, microbatch_size=1).solve(problem)
    exp = export_plan(problem, plan, "torchtitan")
    par = tomllib.loads(exp.text)["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (4, 2)
    assert par["fsdp_reshard_after_forward"] == "always"
    assert exp.exported_plan["zero_shard"] == 4 and exp.exported_plan["zero_stage"] == 3
    # 16 sequences over dp 8 at microbatch 1: two accumulation steps, each all-reducing
    assert plan.num_microbatches == 2
    assert any("across the 2 HSDP replicas in each of the 2" in w for w in exp.warnings)
    assert exp.exported_iteration_time_s == pytest.approx(
        evaluate(problem, plan).iteration_time_s, rel=1e-12
    )


def test_megatron_exports_hsdp_as_distributed_optimizer_instances():
    """Megatron-LM: ``--num-distributed-optimizer-instances dp / zero_shard`` (instances of
    consecutive data-parallel ranks, ``param_and_grad_buffer.py``: reduce-scatter inside,
    all-reduce across); ZeRO-2/3 through Megatron-FSDP with ``--outer-dp-sharding-strategy
    no_shard`` (replicated across instances)."""
    from nest.export.megatron import megatron_args

    problem = _export_problem()
    one = FixedPlanner(dp=8, zero_stage=1, zero_shard=2, microbatch_size=1).solve(problem)
    args = megatron_args(problem, one)
    assert "--num-distributed-optimizer-instances 4" in args
    assert "--use-distributed-optimizer" in args
    assert not any(a.startswith("--outer-dp-sharding-strategy") for a in args)
    three = FixedPlanner(dp=8, zero_stage=3, zero_shard=4, microbatch_size=1).solve(problem)
    args = megatron_args(problem, three)
    assert "--num-distributed-optimizer-instances 2" in args
    assert "--outer-dp-sharding-strategy no_shard" in args
    assert "--data-parallel-sharding-strategy optim_grads_params" in args
    plain = FixedPlanner(dp=8, zero_stage=3, microbatch_size=1).solve(problem)
    assert not any("instances" in a for a in megatron_args(problem, plain))


def test_torchtitan_hsdp_zero1_without_pipelining_is_the_best_expressible_plan():
    """torchtitan's FSDP without pipelining is ZeRO-2 or ZeRO-3: a hybrid ZeRO-1 plan is
    exported as the fastest of those, on the same 2-D mesh or sharded over all ranks (ties keep
    the plan's shard groups), and a warning names what changed. Here full sharding's ZeRO-2
    wins: the hybrid all-reduce moves the 4-byte gradient shard across nodes where full
    sharding's all-gather moves 2-byte weights, and the hybrid optimizer step updates twice the
    shard."""
    from nest.export import export_plan

    problem = _export_problem()
    plan = FixedPlanner(dp=8, zero_stage=1, zero_shard=4, microbatch_size=1).solve(problem)
    exp = export_plan(problem, plan, "torchtitan")
    options = {
        (z, zs): evaluate(
            problem,
            FixedPlanner(dp=8, zero_stage=z, zero_shard=zs, microbatch_size=1).solve(problem),
        )
        for z in (2, 3)
        for zs in (4, None)
    }
    best = min(
        options,
        key=lambda k: (not options[k].feasible, options[k].iteration_time_s, k[1] is None),
    )
    got = (exp.exported_plan["zero_stage"], exp.exported_plan["zero_shard"])
    assert got == best == (2, None)
    assert "ZeRO-1 within groups of 4" in exp.warnings[0]
    assert "over all data-parallel ranks" in exp.warnings[0]
    assert exp.exported_iteration_time_s == pytest.approx(options[best].iteration_time_s, rel=1e-12)
