"""``export=megatron|torchtitan``: launcher arguments for a plan, and the nearest expressible plan.

Flag names are the upstream ones (NVIDIA/Megatron-LM megatron/training/arguments.py @ 000c4ac24f61;
pytorch/torchtitan torchtitan/config/job_config.py @ 000204a4a8bf). Expected values are derived
from the plan (degrees, microbatches, blocks per stage), and the warning path's evaluated cost is
recomputed here from an independently built plan.

:func:`torchtitan_runs` and :func:`megatron_runs` restate, from the upstream sources, what each
framework derives from the exported values (its batch arithmetic, its refusals, and what its
data parallelism keeps per device in ZeRO terms); the tests check that this is the exported plan.
"""

import dataclasses
import json
import tomllib

import pytest

from baselines.fixed import FixedPlanner
from nest.core.errors import UserError
from nest.core.layers import AnalyticModel
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.export import export_plan, targets_of
from nest.export.megatron import megatron_args

from .conftest import make_cluster, make_problem, make_spec
from .test_cli import run_case

# Megatron-LM flags (arguments.py @ 000c4ac24f61) the exporter may emit.
MEGATRON_FLAGS = {
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--seq-length",
    "--sequence-parallel",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--use-distributed-optimizer",
    "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy",
    "--ckpt-format",
    "--num-layers-per-virtual-pipeline-stage",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout",
    "--use-tp-pp-dp-mapping",
    "--no-gradient-accumulation-fusion",
    "--bf16",
    "--grad-reduce-in-bf16",
    "--overlap-grad-reduce",
    "--tp-comm-overlap",
    "--overlap-moe-expert-parallel-comm",
    "--optimizer",
    "--sgd-momentum",
}


@pytest.fixture(scope="module")
def problem():
    """Settings both frameworks run as scored (fp32 gradients, the context ring overlapped, no
    TP overlap), so the tests of the plan mapping see no re-scoring; the training defaults are
    tested by ``test_the_export_runs_what_the_plan_was_scored_with``."""
    return make_problem(
        make_spec(layers=8, heads=8),
        make_cluster(fanouts=(4, 4)),
        global_batch=32,
        grad_bytes=4,
        cp_comm_overlap=True,
    )


def fixed(problem, **kw):
    kw.setdefault("microbatch_size", 1)
    return FixedPlanner(**kw).solve(problem)


def flags(problem, plan) -> dict:
    out = {}
    for arg in megatron_args(problem, plan):
        name, _, value = arg.partition(" ")
        assert name in MEGATRON_FLAGS
        out[name] = value.strip('"')
    return out


def test_megatron_uniform_plan(problem):
    plan = fixed(problem, tp=2, pp=2, dp=4, recompute="full", zero_stage=1)
    got = flags(problem, plan)
    assert got == {
        "--tensor-model-parallel-size": "2",
        "--pipeline-model-parallel-size": "2",
        "--context-parallel-size": "1",
        "--expert-model-parallel-size": "1",
        "--micro-batch-size": "1",
        "--global-batch-size": str(plan.microbatch_size * plan.num_microbatches * plan.dp),
        "--seq-length": str(problem.model.seq_len),
        "--sequence-parallel": "",
        "--recompute-granularity": "full",
        "--recompute-method": "uniform",
        "--recompute-num-layers": "1",
        "--use-distributed-optimizer": "",
        "--bf16": "",
    }
    exp = export_plan(problem, plan, "megatron")
    assert not exp.warnings
    assert exp.exported_iteration_time_s == evaluate(problem, plan).iteration_time_s


@pytest.mark.parametrize(
    "partition, expected",
    [
        (
            [3, 2, 2, 1],
            {"--decoder-first-pipeline-num-layers": "3", "--decoder-last-pipeline-num-layers": "1"},
        ),
        ([2, 2, 2, 2], {}),
        ([1, 3, 2, 2], {"--pipeline-model-parallel-layout": "Et|ttt|tt|ttL"}),
        ([1, 4, 5], {"--pipeline-model-parallel-layout": "E|tttt|ttttL"}),  # chain layers
    ],
)
def test_megatron_partitions(problem, partition, expected):
    plan = fixed(problem, tp=1, pp=len(partition), dp=4, layer_partition=partition)
    got = flags(problem, plan)
    uneven = {k: v for k, v in got.items() if "layers" in k or "layout" in k}
    assert uneven == expected
    assert not export_plan(problem, plan, "megatron").warnings


def test_megatron_interleaving_rank_order_and_zero3(problem):
    plan = fixed(problem, tp=1, pp=2, dp=4, schedule="interleaved", virtual_stages=2)
    assert flags(problem, plan)["--num-layers-per-virtual-pipeline-stage"] == "2"
    plan = fixed(problem, tp=2, pp=2, dp=2, rank_order="tp,pp,dp")
    assert "--use-tp-pp-dp-mapping" in flags(problem, plan)
    plan = fixed(problem, tp=2, pp=1, dp=8, zero_stage=3)
    got = flags(problem, plan)
    assert got["--use-megatron-fsdp"] == "" and got["--ckpt-format"] == "fsdp_dtensor"
    assert got["--data-parallel-sharding-strategy"] == "optim_grads_params"
    # Megatron-FSDP's guide at the checked commit (megatron/core/distributed/fsdp/src/README.md)
    # lists both beside --use-megatron-fsdp
    assert "--use-distributed-optimizer" in got and "--no-gradient-accumulation-fusion" in got


def test_megatron_warns_on_per_stage_recompute_with_the_nearest_plans_cost(problem):
    plan = fixed(problem, tp=1, pp=2, dp=4, recompute=["full", "none"])
    exp = export_plan(problem, plan, "megatron")
    nearest = fixed(problem, tp=1, pp=2, dp=4, recompute="full")  # built independently
    want = evaluate(problem, nearest).iteration_time_s
    assert exp.exported_iteration_time_s == pytest.approx(want, rel=1e-12)
    assert exp.plan_iteration_time_s == evaluate(problem, plan).iteration_time_s
    (warning,) = exp.warnings
    assert "per-stage recompute" in warning and f"{want:.4f} s" in warning
    assert "--recompute-granularity full" in exp.text
    assert exp.exported_plan["recompute"] == ["full", "full"]


def test_megatron_warns_on_a_foreign_rank_order_and_gpipe(problem):
    plan = fixed(problem, tp=2, cp=2, pp=1, dp=2, rank_order="tp,dp,cp,pp")
    exp = export_plan(problem, plan, "megatron")
    nearest = fixed(problem, tp=2, cp=2, pp=1, dp=2, rank_order="tp,cp,dp,pp")
    assert exp.exported_iteration_time_s == pytest.approx(
        evaluate(problem, nearest).iteration_time_s, rel=1e-12
    )
    assert "rank order tp,dp,cp,pp" in exp.warnings[0]
    gpipe = fixed(problem, tp=1, pp=2, dp=4, schedule="gpipe")
    exp = export_plan(problem, gpipe, "megatron")
    assert "GPipe" in exp.warnings[0]
    assert exp.exported_plan["schedule"] == "1f1b"


def toml_of(exp) -> dict:
    return tomllib.loads(exp.text)


def test_torchtitan_fsdp_plan(problem):
    plan = fixed(problem, tp=2, pp=2, dp=4, zero_stage=1, recompute="selective")
    exp = export_plan(problem, plan, "torchtitan")
    assert not exp.warnings
    t = toml_of(exp)
    par = t["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (4, 1)
    assert par["fsdp_reshard_after_forward"] == "never"
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (2, 2)
    assert par["pipeline_parallel_split_points"] == ["layers.4"]
    assert par["pipeline_parallel_schedule"] == "1F1B"
    assert par["pipeline_parallel_microbatch_size"] == plan.microbatch_size
    assert t["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert t["training"]["global_batch_size"] == 32
    assert t["training"]["local_batch_size"] == 32 // 4  # the whole per-rank batch: pipelined
    zero3 = toml_of(
        export_plan(problem, fixed(problem, tp=2, pp=1, dp=8, zero_stage=3), "torchtitan")
    )
    assert zero3["parallelism"]["fsdp_reshard_after_forward"] == "always"
    assert zero3["training"]["local_batch_size"] == 1  # one microbatch per accumulation step


def test_torchtitan_zero1_without_pipelining_exports_the_better_of_fsdp_modes(problem):
    """No DDP beside tensor parallelism, and FSDP without pipelining is ZeRO-2 or ZeRO-3."""
    plan = fixed(problem, tp=2, pp=1, dp=8, zero_stage=1)
    exp = export_plan(problem, plan, "torchtitan")
    options = {z: evaluate(problem, fixed(problem, tp=2, pp=1, dp=8, zero_stage=z)) for z in (2, 3)}
    best = min(options, key=lambda z: (not options[z].feasible, options[z].iteration_time_s))
    assert exp.exported_iteration_time_s == pytest.approx(options[best].iteration_time_s, rel=1e-12)
    assert "ZeRO-1" in exp.warnings[0] and f"used ZeRO-{best}" in exp.warnings[0]
    assert exp.exported_plan["zero_stage"] == best


def test_torchtitan_zero3_with_pipelining_is_exported_as_zero1(problem):
    """PyTorch's pipeline stage keeps full weights and gradients until the last microbatch, so
    torchtitan's FSDP under pipelining is ZeRO-1 (and DDP is refused): ZeRO-3 is not expressible."""
    for zero in (0, 3):
        plan = fixed(problem, tp=1, pp=2, dp=8, zero_stage=zero)
        exp = export_plan(problem, plan, "torchtitan")
        nearest = fixed(problem, tp=1, pp=2, dp=8, zero_stage=1)
        assert exp.exported_iteration_time_s == pytest.approx(
            evaluate(problem, nearest).iteration_time_s, rel=1e-12
        )
        assert f"ZeRO-{zero}" in exp.warnings[0] and "used ZeRO-1" in exp.warnings[0]
        assert toml_of(exp)["parallelism"]["fsdp_reshard_after_forward"] == "never"


def test_torchtitan_interleaved_plan_exports_split_points_per_chunk(problem):
    plan = fixed(problem, tp=1, pp=2, dp=8, zero_stage=1, schedule="interleaved", virtual_stages=2)
    exp = export_plan(problem, plan, "torchtitan")
    assert not exp.warnings
    par = toml_of(exp)["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_split_points"] == ["layers.2", "layers.4", "layers.6"]


def test_torchtitan_moves_a_head_only_stage(problem):
    plan = fixed(problem, tp=1, pp=3, dp=4, zero_stage=1, layer_partition=[5, 4, 1])  # chain
    exp = export_plan(problem, plan, "torchtitan")
    assert "starts without a transformer block" in exp.warnings[0]
    assert exp.exported_plan["blocks_per_stage"] == [4, 3, 1]
    assert toml_of(exp)["parallelism"]["pipeline_parallel_split_points"] == ["layers.4", "layers.7"]
    nearest = fixed(problem, tp=1, pp=3, dp=4, zero_stage=1, layer_partition=[5, 3, 2])
    assert exp.exported_iteration_time_s == pytest.approx(
        evaluate(problem, nearest).iteration_time_s, rel=1e-12
    )


# ------------------------------------------------------------------------------------------------
# What the frameworks do with the exported values
# ------------------------------------------------------------------------------------------------


def torchtitan_runs(t: dict, world: int) -> dict:
    """What torchtitan @ 000204a4a8bf runs from a job config on ``world`` ranks.

    ``distributed/parallel_dims.py``: ``dp_shard = -1`` takes the leftover ranks; the degrees must
    multiply to the world; EP needs ``ep % cp == 0`` and ``(dp_shard cp) % ep == 0``; FSDP is on
    when ``dp_shard > 1`` or ``cp > 1``. ``models/llama3/infra/parallelize.py``: DDP only as the one
    parallelism. ``train.py``: ``dp = dp_replicate dp_shard``, ``global % (local dp) == 0``,
    ``gradient_accumulation_steps = global / (local dp)``. ``distributed/pipeline_parallel.py``:
    ``n_microbatches = local / pipeline_parallel_microbatch_size``; PyTorch's
    ``ScheduleInterleaved1F1B`` needs ``n % max(1, n // pp) == 0``. ZeRO terms: DDP keeps
    everything (0); FSDP reshards after forward (``always``, or ``default`` without pipelining: 3)
    or not (2); under pipelining PyTorch's stage skips the reduce-scatter and the reshard until the
    last microbatch, so FSDP keeps full weights and gradients (1).
    """
    par, tr = t["parallelism"], t["training"]
    rep = par.get("data_parallel_replicate_degree", 1)
    shard = par.get("data_parallel_shard_degree", -1)
    tp, cp, pp, ep = (
        par.get(f"{k}_parallel_degree", 1) for k in ("tensor", "context", "pipeline", "expert")
    )
    if shard == -1:
        shard = world // (rep * cp * tp * pp)
    assert rep * shard * cp * tp * pp == world
    assert ep == 1 or (ep % cp == 0 and (shard * cp) % ep == 0)
    fsdp = shard > 1 or cp > 1
    if rep > 1 and not fsdp:
        assert rep == world, "DDP has not supported > 1D parallelism"
    dp = rep * shard
    local, global_batch = tr["local_batch_size"], tr["global_batch_size"]
    assert global_batch % (local * dp) == 0
    steps = global_batch // (local * dp)
    if pp > 1:
        mbs = par.get("pipeline_parallel_microbatch_size", 1)
        assert local % mbs == 0
        n = local // mbs
        if par.get("pipeline_parallel_schedule") == "Interleaved1F1B":
            assert n % max(1, n // pp) == 0
    else:
        mbs, n = local, 1
    reshard = par.get("fsdp_reshard_after_forward", "default")
    # [training] mixed_precision_reduce is Literal["float32"] (its only value) and DDP runs fp32
    # weights under autocast: 4-byte gradients. Async TP only under [training] compile.
    assert tr.get("mixed_precision_reduce", "float32") == "float32"
    assert tr.get("mixed_precision_param", "bfloat16") == "bfloat16"
    settings = dict(
        grad_bytes=4,
        tp_comm_overlap=bool(par.get("enable_async_tensor_parallel") and tr.get("compile")),
        ep_comm_overlap=False,
    )
    if not fsdp:
        zero = 0 if rep > 1 else None  # None: no data parallelism, every stage is the same
    elif pp > 1:
        zero = 1
    else:
        zero = 2 if reshard == "never" else 3
    return dict(
        tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, microbatch_size=mbs, num_microbatches=steps * n,
        global_batch=global_batch, zero_stage=zero, seq_len=tr.get("seq_len"), training=settings,
    )  # fmt: skip


def megatron_runs(flags: dict, world: int) -> dict:
    """What Megatron-LM @ 000c4ac24f61 runs from its arguments on ``world`` ranks.

    ``validate_args``: ``world % (tp pp cp) == 0``, ``dp = world / (tp pp cp)``; ``--seq-length``
    a multiple of ``2 cp`` when ``cp > 1``. ``num_microbatches_calculator.py``: ``global % (micro
    dp) == 0``, ``num_microbatches = global / (micro dp)``. ``pipeline_parallel/schedules.py``
    (interleaved): groups of ``pp`` microbatches, so ``num_microbatches % pp == 0``. ZeRO terms:
    ``--use-distributed-optimizer`` 1, Megatron FSDP ``optim_grads`` 2 / ``optim_grads_params`` 3.
    """
    tp, pp, cp, ep = (
        int(
            flags[f"--{k}-model-parallel-size"]
            if k != "context"
            else flags["--context-parallel-size"]
        )
        for k in ("tensor", "pipeline", "context", "expert")
    )
    assert world % (tp * pp * cp) == 0
    dp = world // (tp * pp * cp)
    micro, global_batch = int(flags["--micro-batch-size"]), int(flags["--global-batch-size"])
    assert global_batch % (micro * dp) == 0
    n = global_batch // (micro * dp)
    layout = flags.get("--pipeline-model-parallel-layout")
    stages = layout.count("|") + 1 if layout else pp
    if "--num-layers-per-virtual-pipeline-stage" in flags or stages > pp:
        assert n % pp == 0
    seq = int(flags["--seq-length"])
    assert cp == 1 or seq % (2 * cp) == 0
    strategy = flags.get("--data-parallel-sharding-strategy")
    zero = {"optim_grads": 2, "optim_grads_params": 3}.get(strategy)
    if zero is not None:  # the guide's required flags (fsdp/src/README.md)
        assert "--use-distributed-optimizer" in flags
        assert "--no-gradient-accumulation-fusion" in flags
    # Training settings: every one off by default; --bf16 reduces in fp32 unless
    # --grad-reduce-in-bf16; --tp-comm-overlap asserts --sequence-parallel; --cp-comm-type
    # defaults to p2p (the ring overlapped).
    assert "--bf16" in flags
    if "--tp-comm-overlap" in flags:
        assert "--sequence-parallel" in flags
    settings = dict(
        grad_bytes=2 if "--grad-reduce-in-bf16" in flags else 4,
        overlap_grad_sync="--overlap-grad-reduce" in flags,
        tp_comm_overlap="--tp-comm-overlap" in flags,
        cp_comm_overlap=True,
        ep_comm_overlap="--overlap-moe-expert-parallel-comm" in flags,
    )
    if zero is None:
        zero = 1 if "--use-distributed-optimizer" in flags else 0
    return dict(
        tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, microbatch_size=micro, num_microbatches=n,
        global_batch=global_batch, zero_stage=zero, seq_len=seq, training=settings,
    )  # fmt: skip


def megatron_flags(text: str) -> dict:
    """``--flag value`` lines of an exported megatron_args.sh."""
    out = {}
    for line in text.splitlines():
        if line.startswith("--"):
            name, _, value = line.rstrip(" \\").partition(" ")
            out[name] = value.strip('"')
    return out


def check_runs(problem, exp, ran: dict) -> None:
    """The framework runs the exported plan: degrees, batch arithmetic and ZeRO stage."""
    want = exp.exported_plan
    for key in ("tp", "cp", "ep", "pp", "dp", "microbatch_size", "num_microbatches"):
        assert ran[key] == want[key], key
    assert ran["global_batch"] == problem.training.global_batch
    assert ran["seq_len"] == problem.model.seq_len
    if ran["zero_stage"] is not None:
        assert ran["zero_stage"] == want["zero_stage"]
    else:
        assert want["dp"] * want["cp"] == 1


FRAMEWORK_CASES = [
    dict(tp=1, pp=1, dp=16, zero_stage=0),
    dict(tp=1, pp=1, dp=16, zero_stage=1, microbatch_size=2),
    dict(tp=2, pp=1, dp=8, zero_stage=2),
    dict(tp=2, pp=1, dp=8, zero_stage=3),
    dict(tp=2, cp=2, pp=1, dp=4, zero_stage=0),
    dict(tp=1, pp=2, dp=8, zero_stage=1),
    dict(tp=2, pp=4, dp=2, zero_stage=3, recompute="full"),
    dict(tp=1, pp=2, dp=8, zero_stage=1, schedule="interleaved", virtual_stages=2),
    dict(tp=4, pp=4, dp=1, zero_stage=2),
]


@pytest.mark.parametrize(
    "settings", FRAMEWORK_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items())
)
@pytest.mark.parametrize("target", ["torchtitan", "megatron"])
def test_the_framework_runs_the_exported_plan(problem, settings, target):
    """From the exported values alone, each framework's own formulas give the exported plan's
    microbatch size and count, degrees and ZeRO stage; without a warning that is the chosen plan."""
    plan = fixed(problem, **settings)
    exp = export_plan(problem, plan, target)
    world = plan.devices_used  # the exporters never change tp, cp, dp or pp
    if target == "torchtitan":
        ran = torchtitan_runs(toml_of(exp), world)
    else:
        ran = megatron_runs(megatron_flags(exp.text), world)
    check_runs(problem, exp, ran)
    if not exp.warnings:
        assert (ran["microbatch_size"], ran["num_microbatches"], ran["dp"]) == (
            plan.microbatch_size,
            plan.num_microbatches,
            plan.dp,
        )


def test_torchtitan_runs_the_planned_microbatch_of_the_readme_command(tmp_path):
    """The export command of docs/export.md (nest, llama2_7b, dgx_8x8): a data-parallel plan of
    several microbatches per replica (16 of 1 under the first cost model, the issue's case);
    torchtitan must run them as accumulation steps of one microbatch, not all at once."""
    _, result, report, plan, _ = run_case(
        tmp_path,
        "solver=nest",
        "cluster=dgx_8x8",
        "model=llama2_7b",
        "export=[torchtitan,megatron]",
    )
    world = report["devices_used"]
    ran = torchtitan_runs(tomllib.loads((tmp_path / "torchtitan.toml").read_text()), world)
    want = (plan["microbatch_size"], plan["num_microbatches"])
    assert want[1] > 1 and ran["global_batch"] == 1024  # accumulation matters, 1024 sequences
    assert (ran["microbatch_size"], ran["num_microbatches"]) == want
    ran = megatron_runs(megatron_flags((tmp_path / "megatron_args.sh").read_text()), world)
    assert (ran["microbatch_size"], ran["num_microbatches"]) == want


def test_torchtitan_expert_parallelism_needs_ep_a_multiple_of_cp():
    """torchtitan's EP borrows all context ranks: ep=2 with cp=4 is refused; the nearest plan
    takes the best ep it can lay out (here 1 or 4) by the evaluator."""
    moe = make_problem(
        make_spec(layers=4, heads=8, num_experts=4, top_k=2, seq_len=128),
        make_cluster(fanouts=(4, 4)),
        global_batch=32,
        grad_bytes=4,  # as torchtitan runs
    )
    plan = fixed(moe, tp=1, cp=4, pp=1, dp=4, ep=2, zero_stage=3)
    exp = export_plan(moe, plan, "torchtitan")
    options = {
        (ep, z): evaluate(moe, fixed(moe, tp=1, cp=4, pp=1, dp=4, ep=ep, zero_stage=z))
        for ep in (1, 4)  # divide dp x cp = 16 and the 4 experts; 1 or a multiple of cp = 4
        for z in (2, 3)  # FSDP without pipelining (cp > 1: no DDP)
    }
    best = min(options, key=lambda k: (not options[k].feasible, options[k].iteration_time_s))
    assert "ep % cp == 0" in exp.warnings[0]
    assert (exp.exported_plan["ep"], exp.exported_plan["zero_stage"]) == best
    assert exp.exported_iteration_time_s == pytest.approx(options[best].iteration_time_s, rel=1e-12)
    torchtitan_runs(toml_of(exp), plan.devices_used)  # accepted by torchtitan's rules


def test_targets_and_cli(tmp_path):
    assert targets_of(None) == [] and targets_of("megatron") == ["megatron"]
    assert targets_of(["torchtitan", "megatron"]) == ["torchtitan", "megatron"]
    with pytest.raises(UserError, match="export='deepspeed'"):
        targets_of("deepspeed")
    _, result, report, _, lines = run_case(tmp_path, "export=[megatron,torchtitan]")
    assert (tmp_path / "megatron_args.sh").read_text().count("--tensor-model-parallel-size") == 1
    tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    saved = json.loads((tmp_path / "export_megatron_args.json").read_text())
    assert saved["exported_iteration_time_s"] == report["iteration_time_s"]
    assert set(report["export"]) == {"megatron", "torchtitan"}
    assert any("--pipeline-model-parallel-size" in line for line in lines)
    _, bad, _, _, lines = run_case(tmp_path / "bad", "export=deepspeed")
    assert bad["status"] == "error" and lines == [f"error: {bad['error']}"]


# ------------------------------------------------------------------------------------------------
# Every assumption of the score is exported, or the export re-scores under what the framework runs
# ------------------------------------------------------------------------------------------------


def as_run(problem, settings: dict):
    """The problem under the training settings a framework derives from the exported values,
    built here independently of the exporter (the analytic model carries the overlaps)."""
    training = dataclasses.replace(problem.training, **settings)
    model = AnalyticModel(
        problem.model.spec,
        flash_attention=problem.training.flash_attention,
        overlap=training.overlap,
    )
    return Problem(model=model, cluster=problem.cluster, training=training)


@pytest.fixture(scope="module")
def defaults_problem():
    """conf/training/default.yaml's settings: bf16 gradients, every overlap the model knows on."""
    return make_problem(
        make_spec(layers=8, heads=8),
        make_cluster(fanouts=(4, 4)),
        global_batch=32,
        overlap_grad_sync=True,
        tp_comm_overlap=True,
        cp_comm_overlap=True,
    )


RUN_CASES = [
    ("megatron", dict(tp=2, pp=2, dp=4, zero_stage=1)),
    ("megatron", dict(tp=2, cp=2, pp=1, dp=4, zero_stage=0)),
    ("megatron", dict(tp=2, pp=1, dp=8, zero_stage=3)),
    ("torchtitan", dict(tp=2, pp=1, dp=8, zero_stage=3)),
    ("torchtitan", dict(tp=1, pp=2, dp=8, zero_stage=1)),
]


@pytest.mark.parametrize("target, settings", RUN_CASES, ids=lambda v: str(v))
def test_the_export_runs_what_the_plan_was_scored_with(defaults_problem, target, settings):
    """The framework's own rules applied to the exported values give its training settings; the
    exported iteration time is the plan evaluated under them, and any setting that differs from
    the scored one is named in a warning and in the JSON (issue 26: Megatron ran without
    --overlap-grad-reduce and --tp-comm-overlap while the export said exported = planned)."""
    problem = defaults_problem
    plan = fixed(problem, **settings)
    exp = export_plan(problem, plan, target)
    if target == "torchtitan":
        ran = torchtitan_runs(toml_of(exp), plan.devices_used)
    else:
        ran = megatron_runs(megatron_flags(exp.text), plan.devices_used)
    want = evaluate(as_run(problem, ran["training"]), plan).iteration_time_s
    assert exp.exported_iteration_time_s == pytest.approx(want, rel=1e-12)
    unused = {"tp_comm_overlap": plan.tp, "cp_comm_overlap": plan.cp, "ep_comm_overlap": plan.ep}
    differs = {
        k
        for k, v in ran["training"].items()
        if getattr(problem.training, k) != v and unused.get(k, 2) > 1  # settings the plan uses
    }
    assert set(exp.framework_differences) == differs
    assert exp.to_dict()["framework_differences"] == exp.framework_differences
    if differs:
        warning = next(w for w in exp.warnings if "where the plan was scored with" in w)
        assert all(k in warning for k in differs) and f"{want:.4f} s" in warning
    else:
        assert exp.exported_iteration_time_s == exp.plan_iteration_time_s and not exp.warnings
    if target == "megatron":  # Megatron can carry every default: nothing re-scored
        assert not differs
