"""Offload to host memory (issue 23, item 4): the presets' host links; the optimizer state's and
the activations' cost terms on worked examples; the search over the offload choices (nest ==
brute == cpsat == milp with ``solver.offload=true``, 1F1B and interleaved; a superset space is
never worse; the optimizer offload is taken where nothing else fits, either offload where it
beats recomputation); the exports against Megatron-LM's and torchtitan's argument rules.

Sources: PCIe Gen5 x16 is 128 GB/s in both directions together (NVIDIA H100 datasheet), 64
GB/s per direction; PCIe Gen4 x16 64 GB/s together (NVIDIA A100 datasheet); NVLink-C2C 900 GB/s
together between a Grace CPU and the two GPUs of a GB200 superchip. Mixed-precision Adam keeps
12 bytes of state per parameter (fp32 master weights, m and v: Rajbhandari et al., ZeRO, SC20,
§3.1). ZeRO-Offload's CPU-Adam updates 10B parameters in 2.57 s on one host (Ren et al.,
USENIX ATC 2021).
"""

import dataclasses
import random

import pytest

from baselines.brute import BrutePlanner, count_plans
from baselines.fixed import FixedPlanner
from nest.app.config import build_device, load_preset
from nest.core.errors import Infeasible, UserError
from nest.core.model import ModelSpec
from nest.core.problem import CPU_ADAM_HOST_PARAMS_PER_S, DEVICES_PER_HOST
from nest.cost import evaluate
from nest.cost.state import ModelState
from nest.dp.planner import NestPlanner
from nest.dp.space import SpaceOptions, configurations
from nest.exact.planner import ExactPlanner
from nest.export import export_plan

from .conftest import make_cluster, make_device, make_problem
from .randomcase import assert_nest_equals_brute
from .test_nest_dp import tiny_case

GB = 1e9


@pytest.mark.parametrize(
    ("preset", "per_direction_gbps"),
    [
        # PCIe Gen5 x16: 128 GB/s both directions together, half each way
        ("h100_sxm", 128 / 2),
        ("h100_96gb", 128 / 2),
        ("h200_sxm", 128 / 2),
        ("b200", 128 / 2),
        ("mi300x", 128 / 2),
        ("mi355x", 128 / 2),
        # PCIe Gen4 x16: 64 GB/s together
        ("a100_80gb", 64 / 2),
        # NVLink-C2C: 900 GB/s together, one Grace for two GPUs that offload at once
        ("gb200", 900 / 2 / 2),
    ],
)
def test_presets_carry_their_host_link_per_direction(preset, per_direction_gbps):
    """Each GPU preset's host link, in bytes/s per direction, from its datasheet figure."""
    device = build_device(load_preset("device", preset))
    assert device.host_link_bw_bytes_per_s == per_direction_gbps * GB


@pytest.mark.parametrize(
    "preset", ["tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "nest_h100_90g", "nest_tpuv4_64g"]
)
def test_devices_without_a_cited_host_link_offer_no_offload(preset):
    """TPUs (no host-link figure cited) and the paper's two devices have none."""
    assert build_device(load_preset("device", preset)).host_link_bw_bytes_per_s is None


def _problem(*, link_gbps=64.0, **train):
    device = make_device(host_link_bw_bytes_per_s=link_gbps * GB if link_gbps else None)
    return make_problem(cluster=make_cluster(fanouts=(4, 2), device=device), **train)


def test_offload_moves_the_shards_12_bytes_per_parameter_to_the_host():
    """Mixed-precision Adam keeps 12 bytes per parameter of its ZeRO-1 shard (SC20, §3.1):
    offloaded, the device keeps none of them and the host the same 12 bytes per parameter of
    the shard; weights and gradients stay where they were."""
    problem = _problem()
    dense, expert = 3.0e8, 1.0e8
    for zero, dp in ((0, 4), (1, 4), (2, 8), (3, 2)):
        kw = dict(zero_stage=zero, dp=dp, cp=1, ep=1)
        on = ModelState.of(problem, **kw)
        off = ModelState.of(problem, **kw, optimizer_offload=True)
        shard = (dense + expert) / (dp if zero >= 1 else 1)
        assert on.optimizer_bytes(dense, expert) == pytest.approx(12 * shard, rel=1e-12)
        assert off.optimizer_bytes(dense, expert) == 0.0
        assert off.host_optimizer_bytes(dense, expert) == pytest.approx(12 * shard, rel=1e-12)
        assert on.host_optimizer_bytes(dense, expert) == 0.0
        assert off.weights_bytes(dense, expert) == on.weights_bytes(dense, expert)
        assert off.grads_bytes(dense, expert) == on.grads_bytes(dense, expert)


def test_offloaded_step_is_copies_over_the_host_link_and_cpu_adam_worked_example():
    """One device, ZeRO-0, 1e9 parameters, bf16 gradients and weights, PCIe Gen5 x16 (64e9 B/s
    per direction; NVIDIA H100 datasheet), CPU-Adam at 10e9 / 2.57 s per host (Ren et al. 2021)
    shared by 8 devices:

    - gradients down: 1e9 x 2 B / 64e9 B/s = 0.03125 s; weights up: the same, 0.03125 s;
    - Adam on the host: 1e9 / (10e9 / 2.57 / 8) = 2.056 s;
    - on the device, gradient clipping reads the gradients once: 1e9 x 2 B / HBM bytes/s.
    """
    problem = _problem(grad_bytes=2)
    state = ModelState.of(problem, zero_stage=0, dp=1, cp=1, ep=1, optimizer_offload=True)
    params, hbm = 1e9, problem.cluster.device.achieved_hbm_bw_bytes_per_s
    cpu_rate = 10e9 / 2.57 / 8
    assert problem.training.cpu_adam_params_per_s == pytest.approx(cpu_rate, rel=1e-15)
    shared = CPU_ADAM_HOST_PARAMS_PER_S / DEVICES_PER_HOST
    assert shared == pytest.approx(cpu_rate, rel=1e-15)
    copies = 2 * (params * 2 / 64e9)
    assert copies == pytest.approx(0.0625)
    expect = copies + params / cpu_rate
    assert state.offload_step_s(params, 0.0) == pytest.approx(expect, rel=1e-12)
    assert state.optimizer_step_s(params, 0.0, hbm) == pytest.approx(
        expect + params * 2 / hbm, rel=1e-12
    )
    # not offloaded: the HBM step (2 x 12 state bytes + g + p + the clipping's g), no copies
    plain = ModelState.of(problem, zero_stage=0, dp=1, cp=1, ep=1)
    assert plain.offload_step_s(params, 0.0) == 0.0
    assert plain.optimizer_step_s(params, 0.0, hbm) == pytest.approx(
        params * (24 + 2 + 2 + 2) / hbm, rel=1e-12
    )


def _fixed(problem, **kw):
    return FixedPlanner(**{"tp": 2, "pp": 2, "dp": 2, "zero_stage": 1, **kw}).solve(problem)


def test_evaluate_charges_the_offload_and_reports_the_host_bytes():
    """The evaluator's optimizer step and memory of an offloaded plan are the state terms of
    its ranks; the device total drops by exactly the optimizer bytes, which the report gives
    apart as host memory; the stage times do not change."""
    problem = _problem()
    base, off = _fixed(problem), _fixed(problem, optimizer_offload=True)
    a, b = evaluate(problem, base), evaluate(problem, off)
    for ra, rb in zip(a.ranks, b.ranks, strict=True):
        assert rb.memory.optimizer_bytes == 0.0
        assert rb.memory.host_optimizer_bytes == pytest.approx(ra.memory.optimizer_bytes)
        assert rb.memory.total_bytes == pytest.approx(
            ra.memory.total_bytes - ra.memory.optimizer_bytes, rel=1e-12
        )
        assert sum(rb.memory.terms().values()) == pytest.approx(rb.memory.total_bytes)
        assert rb.memory.host_terms() == {
            "optimizer_state": rb.memory.host_optimizer_bytes,
            "activations": 0.0,
        }
        assert rb.time_s == ra.time_s
        assert rb.optimizer_s > ra.optimizer_s  # the CPU's Adam is slower than the HBM step
    assert b.iteration_time_s - a.iteration_time_s == pytest.approx(
        b.optimizer_s - a.optimizer_s, rel=1e-9
    )


@pytest.mark.parametrize(
    ("link_gbps", "train", "match"),
    [(None, {}, "no host link"), (64.0, {"optimizer": "sgd"}, "keeps no state")],
)
def test_offload_without_a_host_link_or_optimizer_state_is_refused(link_gbps, train, match):
    from nest.core.axes import Optimizer

    train = {k: Optimizer(v) for k, v in train.items()}
    problem = _problem(link_gbps=link_gbps, **train)
    with pytest.raises(UserError, match=match):
        evaluate(problem, _fixed(problem, optimizer_offload=True))


def _with_offload_hardware(problem, rng: random.Random):
    """The problem on a device with a host link and a CPU-Adam rate drawn over wide ranges, so
    that offloading is sometimes the best choice and sometimes not."""
    device = dataclasses.replace(
        problem.cluster.device, host_link_bw_bytes_per_s=rng.choice([1, 16, 64, 450]) * GB
    )
    training = dataclasses.replace(
        problem.training, cpu_adam_params_per_s=rng.choice([1e7, 1e8, 4.86e8, 1e10])
    )
    cluster = dataclasses.replace(problem.cluster, device=device)
    return dataclasses.replace(problem, cluster=cluster, training=training)


def _offload_cases(n: int, start: int = 0, max_plans: int = 5000):
    for seed in range(start, start + n):
        problem, options = tiny_case(seed)
        problem = _with_offload_hardware(problem, random.Random(seed))
        options = {**options, "offload": True}
        if count_plans(problem, SpaceOptions(**options)) <= max_plans:
            yield seed, problem, options


def test_nest_equals_brute_with_offload_on_random_problems():
    """``nest`` (bounds, memory floors and the DP with the offloaded state's terms) equals
    ``brute`` (every plan of the space, offloaded or not, through ``evaluate``) on random small
    problems; some optima offload, some do not."""
    agreed, offloaded = 0, 0
    for seed, problem, options in _offload_cases(60):
        oracle = assert_nest_equals_brute(problem, options, (seed, options))
        if oracle is not None:
            agreed += 1
            offloaded += oracle.optimizer_offload
    assert agreed >= 40, agreed
    assert 1 <= offloaded < agreed, (offloaded, agreed)


def test_exact_solvers_equal_brute_with_offload():
    """The exact planners build their groups from the same space (offload included) and agree
    with brute on random small problems."""
    compared = 0
    for seed, problem, options in _offload_cases(12, start=100, max_plans=1500):
        try:
            best = BrutePlanner(**options).solve(problem).objective_s
        except Infeasible:
            continue
        for backend in ("cpsat", "milp"):
            plan = ExactPlanner(name=backend, backend=backend, **options).solve(problem)
            assert plan.objective_s == pytest.approx(best, rel=1e-6), (seed, backend)
        compared += 1
    assert compared >= 5, compared


def test_offload_never_makes_the_optimum_worse():
    """The space with offload holds every plan of the space without it."""
    compared = 0
    for seed, problem, options in _offload_cases(40, start=300):
        try:
            without = NestPlanner(**{**options, "offload": False}).solve(problem)
        except Infeasible:
            without = None
        try:
            with_offload = NestPlanner(**options).solve(problem)
        except Infeasible:
            assert without is None, seed
            continue
        if without is not None:
            assert with_offload.objective_s <= without.objective_s * (1 + 1e-12), seed
            compared += 1
    assert compared >= 20, compared


def _one_device(spec, hbm_bytes, *, link_gbps=64.0, cpu=None, **train):
    device = make_device(hbm_bytes=hbm_bytes, host_link_bw_bytes_per_s=link_gbps * GB)
    if cpu is not None:
        train["cpu_adam_params_per_s"] = cpu
    return make_problem(spec, make_cluster(fanouts=(1,), device=device), flash=True, **train)


def _peak_bytes(problem, **kw) -> float:
    plan = FixedPlanner(**kw).solve(problem)
    return evaluate(problem, plan).peak_memory_bytes


SPEC = ModelSpec(
    name="m", hidden=1024, layers=4, heads=8, ffn_hidden=4096, vocab=32000, seq_len=4096
)


def test_offload_is_taken_where_nothing_else_fits():
    """One device (no data parallelism: ZeRO cannot shard) whose memory lies halfway between
    the least any plan needs with Adam's state on it (full recomputation, microbatch 1) and the
    same plan with the state on the host: without offload nothing fits, and the error names the
    knob; with ``solver.offload=true`` nest offloads."""
    roomy = _one_device(SPEC, 1e12, global_batch=4, microbatch_sizes=(1,))
    least = _peak_bytes(roomy, recompute="full")
    least_off = _peak_bytes(roomy, recompute="full", optimizer_offload=True)
    params = roomy.model.total_params()
    assert least - least_off == pytest.approx(12 * params, rel=1e-9)  # Adam's 12 B / param
    problem = _one_device(SPEC, (least + least_off) / 2, global_batch=4, microbatch_sizes=(1,))
    with pytest.raises(Infeasible, match="solver.offload=true"):
        NestPlanner(offload=False).solve(problem)
    plan = NestPlanner(offload=True).solve(problem)
    assert plan.optimizer_offload
    assert evaluate(problem, plan).feasible


def test_offload_beats_recompute_where_the_host_is_fast():
    """Memory between what recomputing (or offloading) needs and what neither needs: nest takes
    whichever costs less. A fast host (a 450 GB/s link, a CPU-Adam of 1e11 parameters/s) makes
    the offloaded step cheaper than recomputing, and nest offloads without recomputing; a slow
    one (16 GB/s, 1e7 parameters/s) makes it recompute and keep the state on the device."""
    roomy = _one_device(SPEC, 1e12, global_batch=8, microbatch_sizes=(1,))
    plain = _peak_bytes(roomy)
    offloaded = _peak_bytes(roomy, optimizer_offload=True)
    recomputed = _peak_bytes(roomy, recompute="full")
    assert max(offloaded, recomputed) < plain
    capacity = (max(offloaded, recomputed) + plain) / 2
    chosen = {}
    for name, link, cpu in (("fast", 450.0, 1e11), ("slow", 16.0, 1e7)):
        problem = _one_device(
            SPEC, capacity, link_gbps=link, cpu=cpu, global_batch=8, microbatch_sizes=(1,)
        )
        plan = NestPlanner(offload=True, schedules=["1f1b"]).solve(problem)
        chosen[name] = (plan.optimizer_offload, {str(s.recompute) for s in plan.stages})
    assert chosen["fast"][0] and chosen["fast"][1] <= {"none", "selective"}, chosen
    assert not chosen["slow"][0] and chosen["slow"][1] - {"none", "selective"}, chosen


def test_offload_is_off_by_default():
    """Without ``solver.offload`` the space and its plans are those of before: no configuration
    offloads, even where the device has a host link."""
    problem = _problem()
    assert all(not c.optimizer_offload for c in configurations(problem, SpaceOptions()))
    assert NestPlanner().offload is False
    with pytest.raises(UserError, match="solver.offload"):
        NestPlanner(offload="yes").solve(problem)


def _exported(problem, target, **kw):
    return export_plan(problem, _fixed(problem, **kw), target)


def test_megatron_exports_the_cpu_offload_flags_its_arguments_require():
    """Megatron-LM ``validate_args`` asserts ``--use-precision-aware-optimizer`` with
    ``--optimizer-cpu-offload``, and Megatron-Core's optimizer refuses the precision-aware
    optimizer without ``--use-distributed-optimizer``: an offloaded ZeRO-1 plan carries all
    three (and the full offload fraction), and is exported as planned."""
    problem = _problem()
    exp = _exported(problem, "megatron", optimizer_offload=True)
    for flag in (
        "--optimizer-cpu-offload",
        "--optimizer-offload-fraction 1.0",
        "--use-precision-aware-optimizer",
        "--use-distributed-optimizer",
    ):
        assert flag in exp.text, flag
    assert "--overlap-cpu-optimizer-d2h-h2d" not in exp.text  # scored without the overlap
    assert exp.warnings == ()
    assert exp.exported_plan["optimizer_offload"] is True
    plain = _exported(problem, "megatron")
    assert "--optimizer-cpu-offload" not in plain.text


def test_megatron_moves_an_offloaded_zero0_plan_with_data_parallelism_to_zero1():
    """ZeRO-0 has no distributed optimizer, which the precision-aware optimizer needs: with
    data parallelism the nearest expressible plan is ZeRO-1, scored by the evaluator."""
    problem = _problem()
    plan = FixedPlanner(tp=2, pp=2, dp=2, zero_stage=0, optimizer_offload=True).solve(problem)
    exp = export_plan(problem, plan, "megatron")
    assert "optimizer offload with ZeRO-0" in exp.warnings[0]
    assert exp.exported_plan["zero_stage"] == 1 and exp.exported_plan["optimizer_offload"]
    nearest = FixedPlanner(tp=2, pp=2, dp=2, zero_stage=1, optimizer_offload=True).solve(problem)
    assert exp.exported_iteration_time_s == pytest.approx(
        evaluate(problem, nearest).iteration_time_s, rel=1e-12
    )


def test_torchtitan_refuses_the_optimizer_offload_as_not_expressible():
    """torchtitan's ``training.enable_cpu_offload`` offloads FSDP's weights and gradients too:
    the export warns and exports the plan with the optimizer on the device, scored."""
    problem = _problem()
    exp = _exported(problem, "torchtitan", optimizer_offload=True)
    assert any("optimizer offload" in w for w in exp.warnings), exp.warnings
    assert exp.exported_plan["optimizer_offload"] is False
    assert "enable_cpu_offload = true" not in exp.text


# ---------------------------------------------------------------- activation offload


def test_activation_offload_worked_example():
    """A 2-stage 1F1B plan with every block's stored activations offloaded over a slow host link
    (1 GB/s per direction, so the copies stick out of the compute): per stage, ``A`` = its
    blocks' stored bytes per microbatch go out during the forward and back for the backward;
    the exposed part ``max(0, A / bw - f) + max(0, A / bw - b)`` (``f`` the forward compute,
    ``b`` the backward compute with recomputation) lands in the backward. The device stores
    only the embedding's / head's activations per in-flight microbatch, the host the blocks'
    ones, and the transient holds two blocks' worth (the one running, the one in transit)."""
    from nest.core.axes import LayerKind
    from nest.cost.evaluate import shard_of

    problem = _problem(link_gbps=1.0)
    kw = dict(tp=1, pp=2, dp=4, zero_stage=1, recompute="none")
    base, off = _fixed(problem, **kw), _fixed(problem, activation_offload=True, **kw)
    a, b = evaluate(problem, base), evaluate(problem, off)
    model, device = problem.model, problem.cluster.device
    chunks = [
        [
            (
                model.layer_cost(model.chain[i], shard_of(off), device),
                stage.recompute,
                model.chain[i].kind is LayerKind.BLOCK,
            )
            for i in stage.layers
        ]
        for stage in off.stages
    ]
    for k, (sa, sb) in enumerate(zip(a.stages, b.stages, strict=True)):
        blocks = [c for c, _, blk in chunks[k] if blk]
        moved = sum(c.act_bytes[off.stages[k].recompute] for c in blocks)
        copy_s = moved / 1e9
        want = max(0.0, copy_s - sb.compute_fwd_s) + max(0.0, copy_s - sb.compute_bwd_s)
        assert sb.offload_exposed_s == pytest.approx(want, rel=1e-12)
        assert want > 0  # the slow link shows
        assert sb.bwd_s == pytest.approx(sa.bwd_s + want, rel=1e-12)
        assert sb.fwd_s == sa.fwd_s
    for r, (ra, rb) in enumerate(zip(a.ranks, b.ranks, strict=True)):
        layers = chunks[r]
        block_bytes = sum(c.act_bytes[m] for c, m, blk in layers if blk)
        kept = sum(c.act_bytes[m] for c, m, blk in layers if not blk)
        flight = rb.memory.in_flight_microbatches
        assert rb.memory.activations_bytes == pytest.approx(kept * flight, rel=1e-12)
        assert rb.memory.host_activations_bytes == pytest.approx(block_bytes * flight, rel=1e-12)
        biggest = max(c.act_bytes[m] for c, m, blk in layers if blk)
        assert rb.memory.transient_bytes >= 2 * biggest
        assert ra.memory.host_activations_bytes == 0.0


def test_partial_activation_offload_worked_example():
    """Megatron-Core's ``--cpu-offloading-num-layers N`` (one pipeline rank): Transformer
    Engine offloads the first ``N`` blocks' stored tensors and keeps the rest
    (transformer_engine/pytorch/cpu_offload.py at v2.7: ``current_group <
    num_offload_group``; at 366798ef: ``offload_layer_map``). On one rank of ``L = 8`` blocks
    with ``N = 3`` over a slow link: the host holds 3 blocks' stored bytes per microbatch, the
    device the other 5 blocks' plus the embedding's and head's; the transient holds one
    offloaded block in transit beyond the layer's own; the copies of the 3 blocks (not 8) are
    charged where they outlast the rank's whole forward / backward compute. ``N = L`` is the
    all-blocks plan; ``N`` above ``L``, a count without offload, or with ``pp > 1`` are
    one-line errors."""
    from nest.core.axes import LayerKind, Recompute
    from nest.cost.evaluate import shard_of

    problem = make_problem(
        LONG,
        make_cluster(
            fanouts=(8,), device=make_device(hbm_bytes=1e12, host_link_bw_bytes_per_s=0.2 * GB)
        ),
        global_batch=8,
        microbatch_sizes=(1,),
    )
    kw = dict(tp=1, pp=1, dp=8, zero_stage=1)
    plain = evaluate(problem, FixedPlanner(**kw).solve(problem))
    plan = FixedPlanner(activation_offload=True, activation_offload_blocks=3, **kw).solve(problem)
    every = FixedPlanner(activation_offload=True, **kw).solve(problem)
    part, full = evaluate(problem, plan), evaluate(problem, every)
    model, device = problem.model, problem.cluster.device
    costs = [model.layer_cost(ref, shard_of(plan), device) for ref in model.chain]
    blocks = [c for c, ref in zip(costs, model.chain, strict=True) if ref.kind is LayerKind.BLOCK]
    act = [c.act_bytes[Recompute.NONE] for c in blocks]  # the plan recomputes nothing
    assert len(blocks) == 8 and plain.ranks[0].memory.in_flight_microbatches == 1
    memory = part.ranks[0].memory
    assert memory.host_activations_bytes == pytest.approx(sum(act[:3]), rel=1e-12)
    kept = plain.ranks[0].memory.activations_bytes - sum(act[:3])  # 5 blocks, embedding, head
    assert memory.activations_bytes == pytest.approx(kept, rel=1e-12)
    transient = max(plain.ranks[0].memory.transient_bytes, blocks[0].transient_bytes + act[0])
    assert memory.transient_bytes == pytest.approx(transient, rel=1e-12)
    stage = part.stages[0]
    copy_s = sum(act[:3]) / (0.2 * GB)
    want = max(0.0, copy_s - stage.compute_fwd_s) + max(
        0.0, copy_s - stage.compute_bwd_s - stage.recompute_s
    )
    assert want > 0 and stage.offload_exposed_s == pytest.approx(want, rel=1e-12)
    assert full.stages[0].offload_exposed_s > stage.offload_exposed_s
    from nest.core.serialize import plan_from_dict, plan_to_dict

    assert plan_from_dict(plan_to_dict(plan)).config == plan.config
    assert "activation_offload_blocks" not in plan_to_dict(every)
    all8 = FixedPlanner(activation_offload=True, activation_offload_blocks=8, **kw)
    assert evaluate(problem, all8.solve(problem)).iteration_time_s == full.iteration_time_s
    with pytest.raises(UserError, match="activation_offload_blocks=9 but the model has 8"):
        FixedPlanner(activation_offload=True, activation_offload_blocks=9, **kw).solve(problem)
    with pytest.raises(UserError, match="set activation_offload true"):
        FixedPlanner(activation_offload_blocks=3, **kw).solve(problem)
    with pytest.raises(UserError, match="pp=2"):
        FixedPlanner(
            tp=1, pp=2, dp=4, zero_stage=1, activation_offload=True, activation_offload_blocks=3
        ).solve(problem)


def test_megatron_exports_a_partial_offload_as_its_count():
    """``--cpu-offloading-num-layers N`` is Megatron-Core's own partial offload (the first
    ``N`` layers: ``ModelParallelConfig.cpu_offloading_num_layers``); the exported plan keeps
    the count, and a plan exported without the offload drops it."""
    problem = _problem()
    kw = dict(tp=2, pp=1, dp=4, zero_stage=1, activation_offload=True)
    plan = FixedPlanner(activation_offload_blocks=1, **kw).solve(problem)
    exp = export_plan(problem, plan, "megatron")
    assert "--cpu-offloading-num-layers 1" in exp.text and exp.warnings == ()
    assert exp.exported_plan["activation_offload_blocks"] == 1
    titan = export_plan(problem, plan, "torchtitan")
    assert titan.exported_plan["activation_offload"] is False
    assert titan.exported_plan["activation_offload_blocks"] is None


def test_activation_offload_is_free_on_a_fast_link():
    """Where the link moves a stage's activations faster than its compute runs, nothing is
    charged: the offloaded plan takes exactly the time of the plan without offload."""
    problem = _problem(link_gbps=10_000.0)
    kw = dict(tp=1, pp=2, dp=4, zero_stage=1)
    plain = evaluate(problem, _fixed(problem, **kw))
    off = evaluate(problem, _fixed(problem, activation_offload=True, **kw))
    assert all(s.offload_exposed_s == 0.0 for s in off.stages)
    assert off.iteration_time_s == plain.iteration_time_s


LONG = ModelSpec(
    name="m", hidden=1024, layers=8, heads=8, ffn_hidden=4096, vocab=32000, seq_len=4096
)


def test_activation_offload_beats_recompute_on_a_fast_link():
    """One device, memory between what offloading the activations (or recomputing them) needs
    and what neither needs: with a fast link (450 GB/s per direction, NVLink-C2C-like) the
    copies hide under the compute and nest offloads the activations without recomputing; with a
    slow one (1 GB/s) it recomputes and keeps them on the device. A slow CPU-Adam keeps the
    optimizer on the device in both."""
    roomy = _one_device(LONG, 1e12, global_batch=4, microbatch_sizes=(1,))
    plain = _peak_bytes(roomy)
    offloaded = _peak_bytes(roomy, activation_offload=True)
    recomputed = _peak_bytes(roomy, recompute="full")
    assert max(offloaded, recomputed) < plain
    capacity = (max(offloaded, recomputed) + plain) / 2
    chosen = {}
    for name, link in (("fast", 450.0), ("slow", 1.0)):
        problem = _one_device(
            LONG, capacity, link_gbps=link, cpu=1e6, global_batch=4, microbatch_sizes=(1,)
        )
        plan = NestPlanner(offload=True, schedules=["1f1b"]).solve(problem)
        brute = BrutePlanner(offload=True, schedules=["1f1b"]).solve(problem)
        assert plan.objective_s == pytest.approx(brute.objective_s, rel=1e-9)
        chosen[name] = (plan.activation_offload, plan.optimizer_offload, plan.stages[0].recompute)
    assert chosen["fast"][:2] == (True, False), chosen
    assert str(chosen["fast"][2]) in ("none", "selective"), chosen
    assert chosen["slow"][:2] == (False, False), chosen
    assert str(chosen["slow"][2]) not in ("none", "selective"), chosen


def test_exports_of_activation_offload_follow_each_frameworks_rules():
    """Megatron-LM's ``--cpu-offloading-num-layers`` (at most ``L - 1`` layers; no pipeline
    parallelism, no recomputation: ``TransformerConfig``) for a one-stage plan without
    recompute; a pipelined plan is exported without it, warned; torchtitan has no activation
    offload option, warned."""
    problem = _problem()
    one = FixedPlanner(tp=2, pp=1, dp=4, zero_stage=1, activation_offload=True).solve(problem)
    exp = export_plan(problem, one, "megatron")
    layers = problem.model.spec.layers
    assert f"--cpu-offloading-num-layers {layers - 1}" in exp.text
    assert exp.warnings == () and exp.exported_plan["activation_offload"] is True
    piped = export_plan(problem, _fixed(problem, activation_offload=True), "megatron")
    assert "--cpu-offloading" not in piped.text
    assert "activation offload with pipeline parallelism" in piped.warnings[0]
    assert piped.exported_plan["activation_offload"] is False
    titan = export_plan(problem, one, "torchtitan")
    assert any("activation offload" in w for w in titan.warnings)
    assert titan.exported_plan["activation_offload"] is False


def test_export_runnable_search_refuses_offload_in_one_line():
    """``solver.export_runnable`` searches only what Megatron runs as planned, which this space's
    offload choices do not all meet: the combination is a one-line error naming both options."""
    with pytest.raises(UserError, match="solver.export_runnable=megatron with solver.offload"):
        NestPlanner(offload=True, export_runnable="megatron").solve(_problem())


def test_nest_equals_brute_with_offload_where_interleaving_competes():
    """The interleaved DP (each chunk's mode chosen per rank, its offload copies in the chunk's
    backward) equals ``brute`` with the offload choices in the space."""
    from .test_nest_interleaved import interleaved_case

    agreed = 0
    for seed in range(12):
        problem, options = interleaved_case(2000 + seed, max_plans=4000)
        problem = _with_offload_hardware(problem, random.Random(seed))
        options = {**options, "offload": True}
        if count_plans(problem, SpaceOptions(**options)) > 16000:
            continue
        agreed += assert_nest_equals_brute(problem, options, (seed, options)) is not None
    assert agreed >= 5, agreed


def test_general_mode_keeps_the_activation_offload_configurations():
    """``mode=general`` deduplicates configurations that differ only in their rank order (it
    places ranks itself); activation offload is not a rank order, so general mode keeps those
    configurations: on the one-device case above where offloading the activations wins, the
    general optimum offloads them and equals the restricted one (its key once lacked the field
    and dropped them, so general mode recomputed and came out slower)."""
    roomy = _one_device(LONG, 1e12, global_batch=4, microbatch_sizes=(1,))
    plain = _peak_bytes(roomy)
    need = max(_peak_bytes(roomy, activation_offload=True), _peak_bytes(roomy, recompute="full"))
    problem = _one_device(
        LONG, (need + plain) / 2, link_gbps=450.0, cpu=1e6, global_batch=4, microbatch_sizes=(1,)
    )
    options = dict(offload=True, schedules=["1f1b"])
    restricted = ExactPlanner(name="cpsat", backend="cpsat", **options).solve(problem)
    general = ExactPlanner(name="cpsat", backend="cpsat", mode="general", **options).solve(problem)
    assert restricted.activation_offload and general.activation_offload
    assert general.objective_s == pytest.approx(restricted.objective_s, rel=1e-6)


@pytest.mark.parametrize("value", ["fast", -1.0, 0])
def test_a_bad_cpu_adam_rate_is_a_one_line_error(value):
    from nest.app.config import build_training

    with pytest.raises(UserError, match="training: cpu_adam_params_per_s="):
        build_training({"global_batch": 8, "cpu_adam_params_per_s": value})
