"""A plan as Megatron-LM (Megatron-Core) command-line arguments.

**Target.** ``pretrain_gpt.py`` arguments of NVIDIA/Megatron-LM, checked against
``megatron/training/arguments.py`` at commit 000c4ac24f61 (2025, the Megatron-Core 0.14/0.15
development line): ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
``--context-parallel-size``, ``--expert-model-parallel-size``, ``--micro-batch-size``,
``--global-batch-size``, ``--seq-length``, ``--sequence-parallel``, ``--recompute-granularity
{full,selective}``, ``--recompute-method {uniform,block}``, ``--recompute-num-layers``,
``--use-distributed-optimizer``, ``--use-megatron-fsdp`` with ``--data-parallel-sharding-strategy
{no_shard,optim,optim_grads,optim_grads_params}`` (which requires ``--ckpt-format fsdp_dtensor``),
``--num-layers-per-virtual-pipeline-stage``, ``--decoder-first-pipeline-num-layers`` /
``--decoder-last-pipeline-num-layers``, ``--pipeline-model-parallel-layout`` (``E`` embedding,
``t`` transformer layer, ``L`` loss, stages split by ``|``) and ``--use-tp-pp-dp-mapping``.

**Batch** (``validate_args`` and ``megatron/core/num_microbatches_calculator.py``): the
data-parallel size is ``world / (tp x pp x cp)`` and the microbatches per iteration
``global_batch_size / (micro_batch_size x dp)``, which must divide; every rank runs them as
gradient accumulation (``pp = 1``) or through the pipeline schedule. So ``--micro-batch-size b``
and ``--global-batch-size m b dp`` give the plan's ``m`` microbatches of ``b``. The interleaved
schedule (``megatron/core/pipeline_parallel/schedules.py``) groups ``pp`` microbatches per virtual
stage and refuses a microbatch count that is not a multiple of ``pp``, and ``--seq-length`` with
``cp > 1`` must be a multiple of ``2 cp``: the evaluator requires both of every plan.

Mapping of our plan:

- ZeRO 0: plain DDP; 1: ``--use-distributed-optimizer`` (optimizer state sharded over data x
  context ranks, as our model); 2 / 3: Megatron FSDP ``optim_grads`` / ``optim_grads_params``.
- Recompute: one mode for every stage (Megatron has no per-stage mode; ``block`` recomputes the
  first N layers of *every* stage). none: no flag; selective: ``--recompute-granularity
  selective``; full: ``full`` + ``uniform`` + ``--recompute-num-layers 1`` (every layer keeps only
  its input, as our model). Mixed modes: nearest = every stage at the strongest mode used.
- Partition: equal blocks per stage need nothing; equal middle stages and different first / last
  stages use ``--decoder-first/last-pipeline-num-layers``; any other split (or an interleaved
  split with unequal chunks, or a stage without blocks) uses ``--pipeline-model-parallel-layout``.
- Rank order: Megatron's default is ``tp-cp-ep-dp-pp`` (innermost first; expert ranks inside
  the data ranks), which is our ``tp,cp,dp,pp`` (our ``ep`` lives inside ``cp x dp`` the same
  way); ``--use-tp-pp-dp-mapping`` gives ``tp-cp-ep-pp-dp`` = our ``tp,cp,pp,dp``. Any other order
  (or an explicit placement) is not expressible: nearest = the same plan in Megatron's order.
  Device ids are ranks: launch on ranks ``0..N-1`` in the cluster's device order.
- Schedule: 1F1B and interleaved 1F1B; GPipe is not a Megatron schedule (nearest: 1F1B).

Training settings the score assumes (``conf/training``), each emitted or re-scored (Megatron's
defaults are off for every one of them):

- ``--bf16`` (bf16 weights and activations, the cost model's 2-byte elements).
- ``grad_bytes: 2``: ``--grad-reduce-in-bf16``; without it ``validate_args`` sets
  ``accumulate_allreduce_grads_in_fp32`` under ``--bf16`` (4-byte gradients).
- ``overlap_grad_sync``: ``--overlap-grad-reduce`` (default off).
- ``tp_comm_overlap`` with ``tp > 1``: ``--tp-comm-overlap``, which Megatron refuses without
  ``--sequence-parallel`` (the cost model, too, overlaps only sequence-parallel collectives).
- ``cp_comm_overlap``: Megatron's default ``--cp-comm-type p2p`` overlaps the ring (nothing to
  emit); a run scored without it is re-scored with it.
- ``ep_comm_overlap`` with ``ep > 1``: ``--overlap-moe-expert-parallel-comm``.
- ``optimizer: sgd``: ``--optimizer sgd --sgd-momentum 0`` (no optimizer state, as scored).
- ZeRO-2/3 (Megatron FSDP): ``--use-distributed-optimizer`` and
  ``--no-gradient-accumulation-fusion`` beside ``--use-megatron-fsdp``, as Megatron-FSDP's guide
  at the same commit lists them (``megatron/core/distributed/fsdp/src/README.md``).

A setting the arguments cannot carry is scored under what Megatron runs
(:func:`nest.export.common.framework_problem`), and the export says the difference.
"""

from nest.core.axes import Axis, LayerKind, Optimizer, Recompute, Schedule
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.export.common import (
    blocks_per_chunk,
    finish_export,
    global_batch,
    has_kind,
    placement_order,
    rebuild,
    strongest_recompute,
)

CHECKED = "NVIDIA/Megatron-LM megatron/training/arguments.py @ 000c4ac24f61 (2025)"
DEFAULT_ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
TP_PP_DP_ORDER = (Axis.TP, Axis.CP, Axis.PP, Axis.DP)
ZERO_FLAGS = {
    0: [],
    1: ["--use-distributed-optimizer"],
    2: [
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy optim_grads",
        "--ckpt-format fsdp_dtensor",
        "--use-distributed-optimizer",
        "--no-gradient-accumulation-fusion",
    ],
    3: [
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy optim_grads_params",
        "--ckpt-format fsdp_dtensor",
        "--use-distributed-optimizer",
        "--no-gradient-accumulation-fusion",
    ],
}
OPTION = "solver.export_runnable=megatron"


def nearest_expressible(problem: Problem, plan: Plan) -> tuple[Plan, list[str]]:
    """The plan Megatron can run that differs least from ``plan``, and what had to change."""
    issues, changes = [], {}
    modes = [s.recompute for s in plan.stages]
    held = {m for m, n in zip(modes, blocks_per_chunk(problem, plan), strict=True) if n}
    if len(held) > 1:  # a stage without blocks has nothing to recompute
        strongest = strongest_recompute(plan)
        counts = {str(m): modes.count(m) for m in dict.fromkeys(modes)}
        shown = ", ".join(f"{m} on {n} of {len(modes)}" for m, n in counts.items())
        issues.append(
            f"per-stage recompute ({shown} stages; Megatron applies one mode to every stage; used "
            f"{strongest} everywhere)"
        )
        changes["recompute"] = [strongest] * len(modes)
    if plan.schedule is Schedule.GPIPE:
        issues.append("the GPipe schedule (Megatron runs 1F1B; used 1F1B)")
        changes["schedule"] = Schedule.ONE_F_ONE_B
    order = placement_order(plan, (DEFAULT_ORDER, TP_PP_DP_ORDER))
    if order is None:
        shown = ",".join(str(a) for a in plan.rank_order) if plan.rank_order else "explicit"
        issues.append(
            f"rank order {shown} (Megatron lays ranks out as tp-cp-ep-dp-pp or, with "
            "--use-tp-pp-dp-mapping, tp-cp-ep-pp-dp; used tp-cp-ep-dp-pp)"
        )
        changes["rank_order"] = DEFAULT_ORDER
    if not changes:
        return plan, []
    return rebuild(plan, **changes), issues


def _partition_args(problem: Problem, plan: Plan) -> list[str]:
    counts = blocks_per_chunk(problem, plan)
    v, pp = plan.virtual_stages, plan.pp
    if pp == 1:
        return []
    if len(set(counts)) == 1 and counts[0] > 0:
        return [f"--num-layers-per-virtual-pipeline-stage {counts[0]}"] if v > 1 else []
    middle = counts[1:-1]
    if v == 1 and min(counts) > 0 and len(set(middle)) <= 1:
        out = []
        if not middle or counts[0] != middle[0]:
            out.append(f"--decoder-first-pipeline-num-layers {counts[0]}")
        if not middle or counts[-1] != middle[0]:
            out.append(f"--decoder-last-pipeline-num-layers {counts[-1]}")
        return out
    stages = []
    for k, n in enumerate(counts):
        text = ("E" if has_kind(problem, plan, k, LayerKind.EMBEDDING) else "") + "t" * n
        stages.append(text + ("L" if has_kind(problem, plan, k, LayerKind.HEAD) else ""))
    return [f'--pipeline-model-parallel-layout "{"|".join(stages)}"']


def megatron_args(problem: Problem, plan: Plan) -> list[str]:
    """The arguments of an expressible plan, one flag (with its value) per entry."""
    args = [
        f"--tensor-model-parallel-size {plan.tp}",
        f"--pipeline-model-parallel-size {plan.pp}",
        f"--context-parallel-size {plan.cp}",
        f"--expert-model-parallel-size {plan.ep}",
        f"--micro-batch-size {plan.microbatch_size}",
        f"--global-batch-size {global_batch(plan)}",
    ]
    if problem.model.seq_len:
        args.append(f"--seq-length {problem.model.seq_len}")
    if plan.sequence_parallel and plan.tp > 1:
        args.append("--sequence-parallel")
    mode = plan.stages[0].recompute
    if mode is Recompute.SELECTIVE:
        args.append("--recompute-granularity selective")
    elif mode is Recompute.FULL:
        args += [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    args += ZERO_FLAGS[plan.zero_stage]
    args += _partition_args(problem, plan)
    if placement_order(plan, (DEFAULT_ORDER,)) is None:
        args.append("--use-tp-pp-dp-mapping")
    return args + training_args(problem, plan)


def _tp_overlap_runs(problem: Problem, plan: Plan) -> bool:
    """``--tp-comm-overlap`` is emitted (Megatron asserts sequence parallelism with it)."""
    t = problem.training
    return t.tp_comm_overlap and plan.tp > 1 and plan.sequence_parallel


def training_args(problem: Problem, plan: Plan) -> list[str]:
    """The flags that carry the training settings the plan was scored with (module docstring)."""
    t = problem.training
    args = ["--bf16"]
    if t.grad_bytes == 2:
        args.append("--grad-reduce-in-bf16")
    if t.overlap_grad_sync:
        args.append("--overlap-grad-reduce")
    if _tp_overlap_runs(problem, plan):
        args.append("--tp-comm-overlap")
    if t.ep_comm_overlap and plan.ep > 1:
        args.append("--overlap-moe-expert-parallel-comm")
    if t.optimizer is Optimizer.SGD:
        args += ["--optimizer sgd", "--sgd-momentum 0"]
    return args


def framework_runs(problem: Problem, plan: Plan) -> dict:
    """What Megatron runs of the settings :func:`training_args` cannot always carry."""
    runs = {}
    if plan.cp > 1:
        runs["cp_comm_overlap"] = (True, "Megatron's default --cp-comm-type p2p overlaps the ring")
    return runs


def export_megatron(problem: Problem, plan: Plan, report=None, replan=None):
    exported, issues = nearest_expressible(problem, plan)
    args = megatron_args(problem, exported)
    n = exported.devices_used
    notes = [
        f"launch {n} ranks (world size {n} = tp {exported.tp} x cp {exported.cp} x dp "
        f"{exported.dp} x pp {exported.pp}); rank r runs on device r of the cluster"
    ]
    if problem.cluster.num_devices > n:
        notes.append(f"{problem.cluster.num_devices - n} devices of the cluster stay idle")
    notes.append(
        f"{exported.num_microbatches} microbatches of {exported.microbatch_size} per iteration: "
        f"global_batch_size / (micro_batch_size x dp) = {global_batch(exported)} / "
        f"({exported.microbatch_size} x {exported.dp})"
    )
    if exported.zero_stage >= 2:
        notes.append("ZeRO-2/3 use Megatron FSDP (--use-megatron-fsdp), newer than the other flags")
    elif exported.tp > 1 or exported.cp > 1:
        notes.append(
            "set CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron asserts it with tp or cp > 1 on Hopper "
            "and older GPUs)"
        )
    text = (
        f"# Megatron-LM arguments for {plan.solver or 'the plan'} ({CHECKED}).\n"
        "# Add your model's shape flags (--num-layers, --hidden-size, --max-position-embeddings\n"
        "# >= --seq-length, ...) and data flags.\n" + " \\\n".join(args) + "\n"
    )
    return finish_export(
        problem,
        plan,
        exported,
        issues,
        target="Megatron-LM",
        checked_against=CHECKED,
        filename="megatron_args.sh",
        text=text,
        notes=notes,
        report=report,
        runs=framework_runs(problem, exported),
        option=OPTION,
        replan=replan,
    )
