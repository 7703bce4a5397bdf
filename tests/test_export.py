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
import re
import tomllib

import pytest

from baselines.fixed import FixedPlanner
from nest.core.errors import UserError
from nest.core.layers import AnalyticModel
from nest.core.problem import Problem, Training
from nest.core.units import TFLOP
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
    "--overlap-param-gather",
    "--tp-comm-overlap",
    "--overlap-moe-expert-parallel-comm",
    "--moe-router-force-load-balancing",
    "--cross-entropy-loss-fusion",
    # TransformerConfig fields as flags (Megatron-LM @ d98e8a64: transformer_config.py)
    "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend",
    "--optimizer",
    "--sgd-momentum",
    # FP8 (_add_transformer_engine_args)
    "--fp8-format",
    "--fp8-recipe",
    "--fp8-amax-history-len",
    "--fp8-amax-compute-algo",
    "--fp8-param-gather",
    # hybrid sharding (arguments.py @ 000c4ac24f61, _add_distributed_args; Megatron-FSDP's
    # guide megatron/core/distributed/fsdp/src/README.md, "DP-Outer Sharding Strategy")
    "--num-distributed-optimizer-instances",
    "--outer-dp-sharding-strategy",
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
        "--cross-entropy-loss-fusion": "",
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
    # FSDP2 reshard_after_forward=False: torchtitan's "never" (nest.core.problem.Training)
    training = dataclasses.replace(problem.training, reshard_after_forward=False)
    kept = dataclasses.replace(problem, training=training)
    zero3_kept = toml_of(
        export_plan(kept, fixed(kept, tp=2, pp=1, dp=8, zero_stage=3), "torchtitan")
    )
    assert zero3_kept["parallelism"]["fsdp_reshard_after_forward"] == "never"


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
        moe_routing="dropless",  # no forced balancing in torchtitan's router
        moe_dispatcher="alltoall",  # the job config has no dispatcher option
    )
    settings.update(torchtitan_fp8(t, tp=tp, dp_shard=shard))
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


def torchtitan_fp8(t: dict, *, tp: int, dp_shard: int) -> dict:
    """What torchtitan @ 000204a4a8bf runs of FP8 from a job config; ``{}`` without converters.

    ``config/job_config.py``: ``[float8] recipe_name`` is ``Literal["tensorwise", "rowwise",
    "rowwise_with_gw_hp"] | None`` (None: torchao's dynamic tensorwise scaling), ``[mx]
    recipe_name`` is ``Literal["mxfp8"]``. ``components/quantization/float8.py``: a recipe_name
    with ``enable_fsdp_float8_all_gather`` is refused; the all-gather is on only when
    ``parallel_dims.dp_shard_enabled`` (``dp_shard > 1``). ``mx.py``: no compile with ``tp > 1``.
    ``"delayed"`` never comes back: torchao float8 has no delayed scaling."""
    converters = t.get("model", {}).get("converters", [])
    if not converters:
        return {}
    float8, mx = t.get("float8", {}), t.get("mx", {})
    name = float8.get("recipe_name")
    assert name in (None, "tensorwise", "rowwise", "rowwise_with_gw_hp")
    if name is not None:
        assert not float8.get("enable_fsdp_float8_all_gather")
    if "mx" in converters:
        assert mx.get("recipe_name", "mxfp8") == "mxfp8"
        assert not (t["training"].get("compile") and tp > 1)
        return dict(precision="fp8", fp8_recipe="mxfp8", fp8_param_gather=False)
    gather = bool(float8.get("enable_fsdp_float8_all_gather")) and dp_shard > 1
    recipe = "tensorwise" if name in (None, "tensorwise") else name
    return dict(precision="fp8", fp8_recipe=recipe, fp8_param_gather=gather)


def megatron_runs(flags: dict, world: int) -> dict:
    """What Megatron-LM @ 000c4ac24f61 runs from its arguments on ``world`` ranks (the EP
    all-to-all overlap's rules: ``TransformerConfig.__post_init__``).

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
    if "--overlap-param-gather" in flags:  # validate_args @ 000c4ac24f61
        assert "--overlap-grad-reduce" in flags
        assert "--use-distributed-optimizer" in flags or "--use-megatron-fsdp" in flags
    # TransformerConfig.__post_init__ with --overlap-moe-expert-parallel-comm: ep > 1, a virtual
    # pipeline when pp > 1, recompute_granularity != 'full', no recompute_method.
    if "--overlap-moe-expert-parallel-comm" in flags:
        assert ep > 1
        assert pp == 1 or "--num-layers-per-virtual-pipeline-stage" in flags or stages > pp
        assert flags.get("--recompute-granularity") != "full"
        assert "--recompute-method" not in flags
    settings = dict(
        grad_bytes=2 if "--grad-reduce-in-bf16" in flags else 4,
        overlap_grad_sync="--overlap-grad-reduce" in flags,
        tp_comm_overlap="--tp-comm-overlap" in flags,
        cp_comm_overlap=True,
        ep_comm_overlap="--overlap-moe-expert-parallel-comm" in flags,
        moe_routing="balanced" if "--moe-router-force-load-balancing" in flags else "dropless",
        moe_dispatcher=_megatron_dispatcher(flags, ep),
        # --cross-entropy-loss-fusion: store_true, the unfused cross entropy without it
        cross_entropy_loss_fusion="--cross-entropy-loss-fusion" in flags,
    )
    # FP8 (_add_transformer_engine_args): --fp8-format {e4m3,hybrid} (dest fp8, default None:
    # no FP8), --fp8-recipe {tensorwise,delayed,mxfp8,blockwise,custom} (default delayed),
    # --fp8-amax-compute-algo {most_recent,max}. validate_args: --fp8-param-gather "only supported
    # with distributed optimizer, torch fsdp2, megatron fsdp, or inference mode";
    # TransformerConfig: "fp8_param must be used together with fp8 mode".
    fmt = flags.get("--fp8-format")
    recipe = flags.get("--fp8-recipe", "delayed")
    assert fmt in (None, "e4m3", "hybrid")
    assert recipe in ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
    assert flags.get("--fp8-amax-compute-algo", "most_recent") in ("most_recent", "max")
    if "--fp8-param-gather" in flags:
        assert fmt is not None
        assert "--use-distributed-optimizer" in flags or "--use-megatron-fsdp" in flags
    if fmt is not None:
        settings.update(
            precision="fp8", fp8_recipe=recipe, fp8_param_gather="--fp8-param-gather" in flags
        )
    if zero is None:
        zero = 1 if "--use-distributed-optimizer" in flags else 0
    return dict(
        tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, microbatch_size=micro, num_microbatches=n,
        global_batch=global_batch, zero_stage=zero, seq_len=seq, training=settings,
    )  # fmt: skip


def _megatron_dispatcher(flags: dict, ep: int) -> str:
    """The dispatcher Megatron-Core runs (``transformer_config.py`` @ d98e8a64):
    ``moe_token_dispatcher_type`` in {allgather, alltoall, flex}, default ``allgather``, which
    the cost model does not price, so an expert-parallel export must name another; the flex
    dispatcher's backend in {deepep, hybridep, ncclep}, default ``deepep``."""
    kind = flags.get("--moe-token-dispatcher-type", "allgather")
    assert kind in ("allgather", "alltoall", "flex")
    backend = flags.get("--moe-flex-dispatcher-backend", "deepep")
    assert backend in ("deepep", "hybridep", "ncclep")
    if ep == 1:
        return "alltoall"  # no expert exchange: the dispatcher prices nothing
    assert kind != "allgather", "an expert-parallel export must set its dispatcher"
    assert kind == "alltoall" or backend == "deepep"
    return "deepep" if kind == "flex" else "alltoall"


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


@pytest.mark.parametrize("routing", ["balanced", "dropless"])
def test_moe_routing_is_exported_or_re_scored(routing):
    """Megatron carries forced balancing as ``--moe-router-force-load-balancing`` and runs
    dropless without it, so nothing is re-scored; torchtitan's router has no forced balancing, so
    a balanced plan with ``ep > 1`` is re-scored dropless and the difference is named."""
    moe = make_problem(
        make_spec(layers=4, heads=8, num_experts=4, top_k=2, seq_len=128),
        make_cluster(fanouts=(4, 4)),
        global_batch=32,
        grad_bytes=4,  # as torchtitan runs
        moe_routing=routing,
    )
    settings = dict(tp=1, pp=1, dp=16, ep=4, zero_stage=1)
    megatron = check_scored(moe, "megatron", settings)
    assert ("--moe-router-force-load-balancing" in megatron.text) == (routing == "balanced")
    assert "moe_routing" not in megatron.framework_differences
    titan = check_scored(moe, "torchtitan", dict(settings, zero_stage=3))
    assert ("moe_routing" in titan.framework_differences) == (routing == "balanced")


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
        fused_loss=training.fused_loss,
        cross_entropy_loss_fusion=training.cross_entropy_loss_fusion,
        overlap=training.overlap,
        precision=training.numerics,
        moe_routing=training.moe_routing,
        moe_dispatcher=training.moe_dispatcher,
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
    exp = check_scored(defaults_problem, target, settings)
    if target == "megatron":  # Megatron can carry every default: nothing re-scored
        assert not exp.framework_differences


def check_scored(problem, target: str, settings: dict):
    """The body of the test above, for any problem: returns the export."""
    plan = fixed(problem, **settings)
    exp = export_plan(problem, plan, target)
    if target == "torchtitan":
        ran = torchtitan_runs(toml_of(exp), plan.devices_used)
    else:
        ran = megatron_runs(megatron_flags(exp.text), plan.devices_used)
    want = evaluate(as_run(problem, ran["training"]), plan).iteration_time_s
    assert exp.exported_iteration_time_s == pytest.approx(want, rel=1e-12)
    unused = {
        "tp_comm_overlap": plan.tp,
        "cp_comm_overlap": plan.cp,
        "ep_comm_overlap": plan.ep,
        "moe_routing": plan.ep,
    }
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
    return exp


# ------------------------------------------------------------------------------------------------
# FP8 training options
# ------------------------------------------------------------------------------------------------


def fp8_problem(spec=None, *, recipe="delayed", param_gather=False, **train) -> Problem:
    """conf/training/default.yaml's overlaps with FP8 GEMMs, on a device with FP8 (and MXFP8)
    tensor cores; the analytic model is built at the training's precision."""
    kw = dict(
        global_batch=32,
        microbatch_sizes=(1, 2),
        overlap_grad_sync=True,
        tp_comm_overlap=True,
        cp_comm_overlap=True,
        precision="fp8",
        fp8_recipe=recipe,
        fp8_param_gather=param_gather,
    )
    training = Training(**{**kw, **train})
    cluster = make_cluster(
        fanouts=(4, 4), fp8_peak_flops_per_s=200 * TFLOP, fp8_gemm_ceiling=0.8, mxfp8=True
    )
    model = AnalyticModel(
        spec or make_spec(layers=8, heads=8),
        flash_attention=training.flash_attention,
        overlap=training.overlap,
        precision=training.numerics,
    )
    return Problem(model=model, cluster=cluster, training=training)


FP8_RUN_CASES = [
    ("megatron", "delayed", True, dict(tp=2, pp=2, dp=4, zero_stage=1)),
    ("megatron", "tensorwise", True, dict(tp=2, pp=1, dp=8, zero_stage=3)),
    ("megatron", "blockwise", False, dict(tp=2, cp=2, pp=1, dp=4, zero_stage=0)),
    ("megatron", "mxfp8", True, dict(tp=2, pp=1, dp=8, zero_stage=2)),
    ("megatron", "tensorwise", True, dict(tp=4, pp=4, dp=1, zero_stage=0)),  # no data parallelism
    ("torchtitan", "delayed", True, dict(tp=2, pp=1, dp=8, zero_stage=3)),
    ("torchtitan", "tensorwise", True, dict(tp=1, pp=2, dp=8, zero_stage=1)),
    ("torchtitan", "tensorwise", True, dict(tp=4, pp=4, dp=1, zero_stage=2)),  # no FSDP shards
    ("torchtitan", "mxfp8", True, dict(tp=2, pp=1, dp=8, zero_stage=3)),
    ("torchtitan", "mxfp8", False, dict(tp=1, pp=1, dp=16, zero_stage=2)),
]


@pytest.mark.parametrize(
    "target, recipe, param_gather, settings", FP8_RUN_CASES, ids=lambda v: str(v)
)
def test_the_fp8_export_runs_what_the_plan_was_scored_with(target, recipe, param_gather, settings):
    """FP8 recipe and FP8 parameter gather are training settings like the overlaps: each
    framework's own rules (megatron_runs, torchtitan_fp8) applied to the exported values give
    what it runs, and the exported time is the plan evaluated under that. Megatron runs every
    recipe and, with the distributed optimizer, FP8 parameter gather as scored; torchtitan runs
    tensorwise for delayed (it has no delayed scaling) and gathers FP8 weights only with FSDP
    shards and tensorwise scaling."""
    problem = fp8_problem(recipe=recipe, param_gather=param_gather)
    exp = check_scored(problem, target, settings)
    diffs = exp.framework_differences
    if target == "megatron":
        assert not diffs
        got = megatron_flags(exp.text)
        # the cost model's format: E4M3 forward, E5M2 gradients (Megatron's "hybrid")
        assert got["--fp8-format"] == "hybrid" and got["--fp8-recipe"] == recipe
        return
    t = toml_of(exp)
    assert (diffs.get("fp8_recipe", {}).get("framework") == "tensorwise") == (recipe == "delayed")
    gathers = t.get("float8", {}).get("enable_fsdp_float8_all_gather", False)
    assert gathers == (param_gather and recipe != "mxfp8" and settings["dp"] > 1)
    assert ("fp8_param_gather" in diffs) == (param_gather and not gathers)
    # torch.compile fuses the casts; mx.py refuses it with tensor parallelism
    assert t["training"].get("compile", False) == (recipe != "mxfp8" or settings["tp"] == 1)


def test_megatron_fp8_delayed_scaling_uses_nvidias_amax_settings():
    """Megatron's delayed-scaling defaults are a 1-step amax history and most_recent; NVIDIA's
    own FP8 launcher (examples/llama/train_llama3_8b_h100_fp8.sh @ 000c4ac24f61) sets 1024 and
    max, as Transformer Engine's DelayedScaling defaults. The amax flags are delayed-only
    ("delayed scaling only configs" in arguments.py), so other recipes carry none."""
    for recipe in ("delayed", "tensorwise", "blockwise"):
        problem = fp8_problem(recipe=recipe)
        got = flags(problem, fixed(problem, tp=2, pp=1, dp=8, zero_stage=1))
        amax = {k: v for k, v in got.items() if "amax" in k}
        if recipe == "delayed":
            assert amax == {"--fp8-amax-history-len": "1024", "--fp8-amax-compute-algo": "max"}
        else:
            assert amax == {}
    bf16 = flags(defaults_problem_(), fixed(defaults_problem_(), tp=2, pp=1, dp=8))
    assert not any(k.startswith("--fp8") for k in bf16)


def defaults_problem_():
    return make_problem(make_spec(layers=8, heads=8), make_cluster(fanouts=(4, 4)), global_batch=32)


def test_megatron_fp8_param_gather_needs_the_distributed_optimizer():
    """validate_args refuses --fp8-param-gather without the distributed optimizer (or Megatron
    FSDP): a ZeRO-0 plan with data parallelism is exported as ZeRO-1 (priced as that plan, built
    here independently), and one without data parallelism gets --use-distributed-optimizer,
    which over one rank is the same plan."""
    problem = fp8_problem(recipe="tensorwise", param_gather=True)
    plan = fixed(problem, tp=2, pp=1, dp=8, zero_stage=0)
    exp = export_plan(problem, plan, "megatron")
    nearest = fixed(problem, tp=2, pp=1, dp=8, zero_stage=1)
    assert "FP8 parameter gather with ZeRO-0" in exp.warnings[0]
    assert exp.exported_plan["zero_stage"] == 1
    assert exp.exported_iteration_time_s == pytest.approx(
        evaluate(problem, nearest).iteration_time_s, rel=1e-12
    )
    ran = megatron_runs(megatron_flags(exp.text), plan.devices_used)  # accepted
    assert ran["training"]["fp8_param_gather"] and ran["zero_stage"] == 1
    alone = fixed(problem, tp=4, pp=4, dp=1, zero_stage=0)
    exp = export_plan(problem, alone, "megatron")
    assert not exp.warnings
    assert exp.exported_iteration_time_s == evaluate(problem, alone).iteration_time_s
    megatron_runs(megatron_flags(exp.text), alone.devices_used)  # accepted


def module_converted(fqn: str, filter_fqns: list[str]) -> bool:
    """torchtitan's module_filter_fn (components/quantization/utils.py @ 000204a4a8bf) for an
    nn.Linear whose dimensions are multiples of 16: converted unless a filter is a substring of
    its fully qualified name."""
    return not any(f in fqn for f in filter_fqns)


@pytest.mark.parametrize("recipe", ["tensorwise", "mxfp8"])
def test_torchtitan_fp8_keeps_the_lm_head_and_router_in_bf16(recipe):
    """The cost model runs the LM head and the router in BF16 and every block linear in FP8;
    torchtitan converts every nn.Linear not filtered, so the export filters exactly those
    (module names of torchtitan's llama3 and deepseek_v3 models at the checked commit)."""
    dense = fp8_problem(recipe=recipe)
    moe = fp8_problem(make_spec(layers=8, heads=8, num_experts=4, top_k=2), recipe=recipe)
    section = "mx" if recipe == "mxfp8" else "float8"
    for problem, router in ((dense, None), (moe, "layers.1.moe.router.gate")):
        exp = export_plan(problem, fixed(problem, tp=1, pp=1, dp=16, zero_stage=3), "torchtitan")
        t = toml_of(exp)
        assert t["model"]["converters"] == [section]
        filters = t[section]["filter_fqns"]
        assert not module_converted("output", filters)
        for fqn in ("layers.0.attention.wq", "layers.3.attention.wo", "layers.0.feed_forward.w1"):
            assert module_converted(fqn, filters)
        if router:
            assert not module_converted(router, filters)
            assert any("GroupedExperts" in w for w in exp.warnings)  # experts stay BF16
        else:
            assert not any("GroupedExperts" in w for w in exp.warnings)


def test_torchtitan_blockwise_is_exported_as_rowwise_with_a_warning():
    """torchtitan has no 128-block recipe: rowwise (per-row scales) is the nearest; the cost
    model has no rowwise recipe, so the export says that its time is still blockwise's."""
    problem = fp8_problem(recipe="blockwise", param_gather=True)
    exp = export_plan(problem, fixed(problem, tp=2, pp=1, dp=8, zero_stage=3), "torchtitan")
    t = toml_of(exp)
    assert t["float8"]["recipe_name"] == "rowwise"
    ran = torchtitan_fp8(t, tp=2, dp_shard=8)  # accepted: no FP8 all-gather with a recipe name
    assert ran == dict(precision="fp8", fp8_recipe="rowwise", fp8_param_gather=False)
    assert any("no blockwise" in w and "rowwise" in w for w in exp.warnings)
    assert exp.framework_differences["fp8_param_gather"]["framework"] is False


# ------------------------------------------------------------------------------------------------
# Model shapes: what Megatron-LM builds from the exported flags
# ------------------------------------------------------------------------------------------------


def eval_pattern(pattern: str) -> list[int]:
    """Megatron's ``_eval_pattern`` (megatron/training/arguments.py @ 000c4ac24f61): only
    ``,0-9[]()+*`` pass its check, then Python evaluates the expression."""
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", pattern), pattern
    return eval(pattern)  # noqa: S307 (restricted to list arithmetic, as Megatron does)


def freq_type(value: str):
    """``moe_freq_type``: an integer, or a pattern when the string holds ``[``."""
    return eval_pattern(value) if "[" in value else int(value)


def megatron_model(flags: dict) -> dict:
    """The model Megatron-LM @ 000c4ac24f61 builds from the flags, per layer.

    ``validate_args``: --num-layers, --hidden-size, --num-attention-heads and
    --max-position-embeddings required, the last >= --seq-length; --kv-channels defaults to
    ``hidden / heads`` (asserting it divides); --moe-ffn-hidden-size defaults to
    --ffn-hidden-size; --mtp-num-layers needs rope or no position embeddings.
    ``core_transformer_config_from_args``: ``num_query_groups`` only with
    --group-query-attention, else (TransformerConfig) ``heads``; TransformerConfig: groups a
    multiple of ``tp``. ``gpt_layer_specs.py``: an integer --moe-layer-freq ``n`` makes layer
    ``i`` MoE iff ``i % n == 0``, a list gives each layer and must have --num-layers entries.
    ``transformer/utils.py`` ``is_layer_window_attention`` (1-indexed ``l``): windowed iff a
    --window-size is given and (no skip freq, or ``l % n != 0``, or ``list[l - 1]``); Transformer
    Engine's window ``(left, right)`` lets query ``i`` see keys ``i - left .. i + right``. MLA's
    latent norms exist only with --qk-layernorm (``q_layernorm``/``kv_layernorm`` IdentityOp
    otherwise)."""
    layers, hidden = int(flags["--num-layers"]), int(flags["--hidden-size"])
    heads = int(flags["--num-attention-heads"])
    assert int(flags["--max-position-embeddings"]) >= int(flags["--seq-length"])
    if "--kv-channels" in flags:
        kv_channels = int(flags["--kv-channels"])
    else:
        assert hidden % heads == 0
        kv_channels = hidden // heads
    groups = int(flags["--num-query-groups"]) if "--group-query-attention" in flags else heads
    assert groups % int(flags["--tensor-model-parallel-size"]) == 0
    experts = int(flags.get("--num-experts", 0))
    if experts:
        freq = freq_type(flags.get("--moe-layer-freq", "1"))
        moe = [i % freq == 0 for i in range(layers)] if isinstance(freq, int) else freq
        assert len(moe) == layers
    else:
        moe = [0] * layers
    window = flags.get("--window-size")
    if window:
        left, right = (int(v) for v in window.strip("()").split(","))
        skip = (
            freq_type(flags["--window-attn-skip-freq"])
            if "--window-attn-skip-freq" in flags
            else None
        )
        local = [
            skip is None or (k % skip != 0 if isinstance(skip, int) else bool(skip[k - 1]))
            for k in range(1, layers + 1)  # Megatron's 1-indexed layer_number
        ]
        keys = left + 1 + right
    else:
        local, keys = [False] * layers, None
    if "--mtp-num-layers" in flags:
        assert flags.get("--position-embedding-type") in ("rope", "none")
    mla = "--multi-latent-attention" in flags
    return dict(
        layers=layers,
        kv_channels=kv_channels,
        groups=groups,
        moe=[bool(b) for b in moe],
        experts=experts,
        top_k=int(flags.get("--moe-router-topk", 2)),
        expert_ffn=int(flags.get("--moe-ffn-hidden-size", flags["--ffn-hidden-size"])),
        shared_ffn=int(flags.get("--moe-shared-expert-intermediate-size", 0)),
        # padded to capacity only with --moe-pad-expert-input-to-capacity (its help: "effective
        # only after the --moe-expert-capacity-factor is set")
        capacity_factor=float(flags["--moe-expert-capacity-factor"])
        if "--moe-pad-expert-input-to-capacity" in flags and "--moe-expert-capacity-factor" in flags
        else None,
        local=local,
        window_keys=keys,
        qk_norm="--qk-layernorm" in flags,
        mla=dict(
            q_lora_rank=int(flags["--q-lora-rank"]) if "--q-lora-rank" in flags else None,
            kv_lora_rank=int(flags["--kv-lora-rank"]),
            qk_nope_head_dim=int(flags["--qk-head-dim"]),
            qk_rope_head_dim=int(flags["--qk-pos-emb-head-dim"]),
            v_head_dim=int(flags["--v-head-dim"]),
        )
        if mla
        else None,
        mtp_layers=int(flags.get("--mtp-num-layers", 0)),
    )


MOE = dict(num_experts=4, top_k=2)
SHAPES = {
    "gqa_head_dim_qk_norm": dict(
        kv_heads=2, head_dim=32, qk_norm=True, position="rope", norm="rmsnorm", bias=False
    ),
    "mha_default_head": dict(activation="swiglu"),
    "sliding_every_2nd_global": dict(window=16, global_every=2, kv_heads=4, **MOE),
    "sliding_every_6th_global": dict(layers=12, window=16, global_every=6),
    "sliding_everywhere": dict(window=16, global_every=0),
    "mla_first_dense_shared_mtp": dict(
        attention="mla",
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        first_dense_layers=3,
        moe_ffn_hidden=64,
        shared_experts=2,
        shared_ffn_hidden=48,
        mtp_layers=1,
        position="rope",
        **MOE,
    ),
    "mla_full_rank_query": dict(
        attention="mla", kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16
    ),
    "moe_every_2nd_phase_1": dict(moe_layer_freq=2, moe_layer_phase=1, **MOE),
    "moe_every_2nd_phase_0": dict(moe_layer_freq=2, **MOE),
    "moe_every_3rd_phase_2_after_1_dense": dict(
        layers=10, moe_layer_freq=3, moe_layer_phase=2, first_dense_layers=1, **MOE
    ),
    "moe_all_blocks": dict(shared_experts=1, **MOE),
    "moe_capacity_factor": dict(capacity_factor=1.25, **MOE),
}


@pytest.mark.parametrize("name", SHAPES)
def test_megatron_builds_the_models_shape(name):
    """Evaluated the way Megatron-LM evaluates them (megatron_model), the exported flags give the
    spec's blocks: which are MoE, which attend to a window of how many keys, the query groups and
    head width, the MLA ranks, the expert sizes (shared experts together) and the MTP depth."""
    spec = make_spec(**{"layers": 8, "heads": 8, **SHAPES[name]})
    problem = make_problem(spec, make_cluster(fanouts=(4, 4)), global_batch=32)
    exp = export_plan(problem, fixed(problem, tp=2, pp=1, dp=8, zero_stage=1), "megatron")
    assert not exp.warnings
    got = megatron_model(megatron_flags(exp.text))
    n = spec.layers
    assert got["layers"] == n
    assert got["moe"] == [spec.block_is_moe(i) for i in range(n)]
    assert got["local"] == [spec.block_is_local(i) for i in range(n)]
    assert got["window_keys"] == spec.window
    assert got["mtp_layers"] == spec.mtp_layers
    if spec.is_moe:
        assert (got["experts"], got["top_k"]) == (spec.num_experts, spec.top_k)
        assert (got["expert_ffn"], got["shared_ffn"]) == (spec.expert_ffn, spec.shared_ffn)
        assert got["capacity_factor"] == spec.capacity_factor
    if spec.attention == "mla":
        assert got["mla"] == {k: getattr(spec, k) for k in got["mla"]}
        assert got["qk_norm"]  # DeepSeek's latent norms, which the cost model counts
    else:
        assert got["mla"] is None
        assert (got["groups"], got["kv_channels"]) == (spec.num_kv_heads, spec.d_head)
        assert got["qk_norm"] == spec.qk_norm


def test_megatron_moe_pattern_of_published_models():
    """DeepSeek-V3 (61 layers, first_k_dense_replace 3) and Llama 4 Maverick (48 layers, MoE
    every 2nd from the 2nd): the emitted --moe-layer-freq evaluates to the spec's blocks; these
    are the patterns Megatron-LM's own configs write, [0]*3+[1]*58 and ([0,1]*24)
    (examples/post_training/modelopt/conf at 000c4ac24f61)."""
    for layers, extra in (
        (61, dict(first_dense_layers=3)),
        (48, dict(moe_layer_freq=2, moe_layer_phase=1)),
    ):
        spec = make_spec(layers=layers, heads=8, **MOE, **extra)
        problem = make_problem(spec, make_cluster(fanouts=(4, 4)), global_batch=32)
        exp = export_plan(problem, fixed(problem, tp=2, pp=1, dp=8), "megatron")
        pattern = megatron_flags(exp.text)["--moe-layer-freq"]
        want = [int(spec.block_is_moe(i)) for i in range(layers)]
        assert eval_pattern(pattern) == want
        assert eval_pattern(pattern) == eval_pattern(
            "([0]*3+[1]*58)" if layers == 61 else "([0,1]*24)"
        )


def test_megatron_warns_on_what_it_cannot_build():
    """Chunked attention (Llama 4) has no Megatron option: the export says how many blocks run
    with full attention instead, and emits no window; MTP with learned positions is refused."""
    spec = make_spec(layers=8, heads=8, window=16, global_every=4, local_attention="chunked")
    problem = make_problem(spec, make_cluster(fanouts=(4, 4)), global_batch=32)
    exp = export_plan(problem, fixed(problem, tp=2, pp=1, dp=8), "megatron")
    local = sum(spec.block_is_local(i) for i in range(spec.layers))
    (warning,) = exp.warnings
    assert "chunked" in warning and f"{local} of 8 blocks" in warning
    assert megatron_model(megatron_flags(exp.text))["local"] == [False] * 8
    spec = make_spec(layers=8, heads=8, mtp_layers=1)  # learned positions
    problem = make_problem(spec, make_cluster(fanouts=(4, 4)), global_batch=32)
    exp = export_plan(problem, fixed(problem, tp=2, pp=1, dp=8), "megatron")
    assert any("--mtp-num-layers" in w and "learned" in w for w in exp.warnings)


def test_torchtitan_notes_the_shape_its_job_config_cannot_carry():
    spec = make_spec(layers=8, heads=8, **SHAPES["mla_first_dense_shared_mtp"])
    problem = make_problem(spec, make_cluster(fanouts=(4, 4)), global_batch=32)
    exp = export_plan(problem, fixed(problem, tp=1, pp=1, dp=16, zero_stage=3), "torchtitan")
    (note,) = [n for n in exp.notes if "model shape" in n]
    for field in ("attention=mla", "kv_lora_rank=32", "first_dense_layers=3", "mtp_layers=1"):
        assert field in note
    assert "model" not in toml_of(exp)  # BF16: no converters, no [model] section


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_moe_dispatcher_is_exported_or_re_scored(dispatcher):
    """Megatron carries the dispatcher (``alltoall``, or ``flex`` with the DeepEP backend);
    torchtitan's job config has none, so a DeepEP plan is re-scored with the all-to-all and the
    difference is named."""
    moe = make_problem(
        make_spec(layers=4, heads=8, num_experts=4, top_k=2, seq_len=128),
        make_cluster(fanouts=(4, 4)),
        global_batch=32,
        grad_bytes=4,
        moe_routing="dropless",
        moe_dispatcher=dispatcher,
    )
    settings = dict(tp=1, pp=1, dp=16, ep=4, zero_stage=1)
    megatron = check_scored(moe, "megatron", settings)
    assert ("--moe-flex-dispatcher-backend deepep" in megatron.text) == (dispatcher == "deepep")
    assert "moe_dispatcher" not in megatron.framework_differences
    titan = check_scored(moe, "torchtitan", dict(settings, zero_stage=3))
    assert ("moe_dispatcher" in titan.framework_differences) == (dispatcher == "deepep")


@pytest.mark.parametrize(
    "settings, runs",
    [
        (dict(tp=1, pp=1, dp=16, ep=4, zero_stage=1), True),
        (
            dict(tp=1, pp=2, dp=8, ep=4, zero_stage=1, schedule="interleaved", virtual_stages=2),
            True,
        ),
        (dict(tp=1, pp=2, dp=8, ep=4, zero_stage=1), False),  # 1F1B: no virtual pipeline
        (dict(tp=1, pp=1, dp=16, ep=4, zero_stage=1, recompute="full"), False),
        (dict(tp=1, pp=1, dp=16, ep=4, zero_stage=1, recompute="full1+none"), False),
    ],
    ids=["pp1", "interleaved", "1f1b-pp2", "full", "block"],
)
def test_ep_overlap_is_exported_where_megatron_runs_it_and_re_scored_elsewhere(settings, runs):
    """``--overlap-moe-expert-parallel-comm`` (Megatron-LM 000c4ac24f61,
    ``TransformerConfig.__post_init__``) needs a virtual pipeline when ``pp > 1`` and refuses
    full and ``--recompute-method`` recompute: a plan scored with the overlap gets the flag
    where Megatron accepts it; elsewhere the flag is left out and the plan is re-scored without
    the overlap, the difference named."""
    moe = make_problem(
        make_spec(layers=4, heads=8, num_experts=4, top_k=2, seq_len=128),
        make_cluster(fanouts=(4, 4)),
        global_batch=32,
        grad_bytes=4,
        ep_comm_overlap=True,
    )
    exp = check_scored(moe, "megatron", settings)
    assert ("--overlap-moe-expert-parallel-comm" in exp.text) == runs
    assert ("ep_comm_overlap" in exp.framework_differences) == (not runs)
    if not runs:
        assert exp.exported_iteration_time_s > exp.plan_iteration_time_s


@pytest.mark.parametrize("fusion", [True, False])
def test_megatron_export_carries_the_cross_entropy_fusion_it_was_scored_with(fusion):
    """``--cross-entropy-loss-fusion`` is a ``store_true`` flag (Megatron-LM arguments.py @
    000c4ac24f61): a plan scored with the fused loss exports it, one scored with Megatron's
    unfused default does not, and neither is re-scored; the two scores differ by the unfused
    forward's 12 extra bytes per logit on the last stage."""
    problem = make_problem(
        make_spec(layers=8, heads=8),
        make_cluster(fanouts=(4, 4)),
        global_batch=32,
        cross_entropy_loss_fusion=fusion,
    )
    plan = fixed(problem, tp=2, pp=2, dp=4, zero_stage=1)
    exp = check_scored(problem, "megatron", dict(tp=2, pp=2, dp=4, zero_stage=1))
    assert ("--cross-entropy-loss-fusion" in megatron_args(problem, plan)) is fusion
    assert not exp.framework_differences
    other = make_problem(
        make_spec(layers=8, heads=8),
        make_cluster(fanouts=(4, 4)),
        global_batch=32,
        cross_entropy_loss_fusion=not fusion,
    )
    faster, slower = sorted(
        (evaluate(problem, plan).iteration_time_s, evaluate(other, plan).iteration_time_s)
    )
    assert slower > faster
