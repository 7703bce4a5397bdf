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
- Hybrid sharding (``zero_shard``, :func:`hybrid_args`): ``--num-distributed-optimizer-instances
  dp / zero_shard``. Megatron-Core splits the data x context ranks into that many instances of
  consecutive ranks (``megatron/core/parallel_state.py``: the intra-instance groups; an instance
  is our shard group, the ``zero_shard`` innermost replicas), reduce-scatters the gradients
  inside an instance and all-reduces the shard across instances
  (``megatron/core/distributed/param_and_grad_buffer.py``), as the cost model prices it. ZeRO-1:
  the distributed optimizer; ZeRO-2/3: Megatron-FSDP's HSDP, the inner strategy as above with
  ``--outer-dp-sharding-strategy no_shard`` (replicated across instances; Megatron-FSDP's guide,
  ``megatron/core/distributed/fsdp/src/README.md``, "DP-Outer Sharding Strategy").
- Recompute: one mode for every stage (Megatron has no per-stage mode; ``block`` recomputes the
  first N layers of *every* stage). Every-n-blocks plans (stages fully recomputing their first
  ``k`` blocks, the rest ``none``): ``--recompute-granularity full --recompute-method block
  --recompute-num-layers K`` with ``K`` the largest ``k`` (a warning when stages differ; over
  another base mode: ``full``). none: no flag; selective: ``--recompute-granularity
  selective`` (its default ``--recompute-modules core_attn``); mlp / selective_mlp:
  ``--recompute-granularity selective --recompute-modules [core_attn] mlp`` with ``moe_act``
  for MoE blocks (and ``--moe-grouped-gemm``, which ``moe_act`` requires); full: ``full`` +
  ``uniform`` + ``--recompute-num-layers 1`` (every layer keeps only its input, as our
  model). Mixed modes: nearest = every stage at the mode that recomputes everything any stage
  recomputes (selective and mlp: selective_mlp). ``op`` (torchtitan's op-level selective
  checkpointing) has no Megatron flag (``--recompute-modules`` names modules, not ops): nearest
  ``full``, which stores less.
- Partition: equal blocks per stage need nothing; equal middle stages and different first / last
  stages use ``--decoder-first/last-pipeline-num-layers``; any other split (or an interleaved
  split with unequal chunks, or a stage without blocks) uses ``--pipeline-model-parallel-layout``.
- Rank order: Megatron's default is ``tp-cp-ep-dp-pp`` (innermost first; expert ranks inside
  the data ranks), which is our ``tp,cp,dp,pp`` (our ``ep`` lives inside ``cp x dp`` the same
  way); ``--use-tp-pp-dp-mapping`` gives ``tp-cp-ep-pp-dp`` = our ``tp,cp,pp,dp``. Any other order
  (or an explicit placement) is not expressible: nearest = the same plan in Megatron's order.
  Device ids are ranks: launch on ranks ``0..N-1`` in the cluster's device order.
- Schedule: 1F1B and interleaved 1F1B; GPipe is not a Megatron schedule (nearest: 1F1B).
  Neither is ZB-H1 (nearest: 1F1B): upstream Megatron-LM's ``--delay-wgrad-compute`` defers
  weight gradients only inside the EP-overlap schedule of ``--overlap-moe-expert-parallel-comm``
  (Megatron-Core's MoE docs); ZB-H1 runs in the authors' fork
  (github.com/sail-sg/zero-bubble-pipeline-parallelism, README: ``--enable-zero-bubble`` with
  ``--zero-bubble-max-pending-backward`` = pp gives ZB1P), which the note names; ZB-H2 likewise
  (nearest: 1F1B; the fork's ``--zero-bubble-max-pending-backward`` = 2 pp gives its ZB2P, the
  schedule its solver finds under ZB-H2's memory, not the handcrafted order).

Training settings the score assumes (``conf/training``), each emitted or re-scored (Megatron's
defaults are off for every one of them):

- ``--bf16`` (bf16 weights and activations, the cost model's 2-byte elements).
- ``grad_bytes: 2``: ``--grad-reduce-in-bf16``; without it ``validate_args`` sets
  ``accumulate_allreduce_grads_in_fp32`` under ``--bf16`` (4-byte gradients).
- ``overlap_grad_sync``: ``--overlap-grad-reduce`` (default off), and with ZeRO-1/2 over more
  than one rank ``--overlap-param-gather`` (the weight all-gather under the next iteration's
  forward, as the score hides it).
- ``tp_comm_overlap`` with ``tp > 1``: ``--tp-comm-overlap``, which Megatron refuses without
  ``--sequence-parallel`` (the cost model, too, overlaps only sequence-parallel collectives).
- ``cp_comm_overlap``: Megatron's default ``--cp-comm-type p2p`` overlaps the ring (nothing to
  emit); a run scored without it is re-scored with it.
- ``ep_comm_overlap`` with ``ep > 1``: ``--overlap-moe-expert-parallel-comm`` where Megatron-Core
  runs it (``TransformerConfig.__post_init__`` at 000c4ac24f61 asserts a virtual pipeline when
  ``pp > 1``, no full recompute, no ``--recompute-method`` and at most one MTP layer); a plan
  it cannot run so (1F1B with ``pp > 1``, full or every-n-blocks recompute, deeper MTP) is
  re-scored without it.
- ``ep > 1``: ``--moe-token-dispatcher-type alltoall``, or ``flex`` with
  ``--moe-flex-dispatcher-backend deepep`` under ``moe_dispatcher: deepep``
  (:func:`dispatcher_args`; Megatron-Core's default dispatcher is ``allgather``).
- ``moe_routing: balanced`` with ``ep > 1``: ``--moe-router-force-load-balancing`` (the
  benchmarking switch of Megatron-Core's router); ``dropless`` is Megatron's default (no capacity
  factor: every token reaches its experts).
- ``optimizer: sgd``: ``--optimizer sgd --sgd-momentum 0`` (no optimizer state, as scored).
- ``cross_entropy_loss_fusion`` (with ``fused_loss``): ``--cross-entropy-loss-fusion``, a
  ``store_true`` flag (``megatron/training/arguments.py``); without it Megatron runs the unfused
  vocabulary-parallel cross entropy, which a plan scored with ``cross_entropy_loss_fusion:
  false`` assumes.
- Optimizer offload (:attr:`~nest.core.plan.ParallelConfig.optimizer_offload`):
  ``--optimizer-cpu-offload --optimizer-offload-fraction 1.0 --use-precision-aware-optimizer``
  (NVIDIA/Megatron-LM ``megatron/training/arguments.py``, checked at 2026-08: ``validate_args``
  asserts ``--use-precision-aware-optimizer`` with ``--optimizer-cpu-offload``, and with
  ``--fp8-param-gather`` the ``delayed`` FP8 recipe; ``megatron/core/optimizer/__init__.py``
  refuses the precision-aware optimizer without the distributed optimizer, which every ZeRO
  stage >= 1 emits). A ZeRO-0 plan without data parallelism gets
  ``--use-distributed-optimizer`` (it shards nothing over one rank); with it, it is not
  expressible (nearest: ZeRO-1). FP8 parameter gather with another recipe: not expressible
  (nearest: the optimizer on the device). ``--overlap-cpu-optimizer-d2h-h2d`` is not emitted:
  the cost model charges the copies and the CPU step one after the other.
- Activation offload (:attr:`~nest.core.plan.ParallelConfig.activation_offload`):
  ``--cpu-offloading-num-layers L-1`` (``ModelParallelConfig.cpu_offloading_num_layers``, a CLI
  argument generated from the config; it turns ``cpu_offloading`` on, activations only by
  default). ``TransformerConfig.__post_init__`` refuses it with pipeline parallelism, with any
  recomputation and for ``L`` or more layers, so it is expressible only with ``pp = 1``, no
  recompute and at least two blocks (nearest otherwise: the activations on the device). Megatron
  keeps the last block's activations on the device, which the cost model's two-block buffer
  covers. A partial offload
  (:attr:`~nest.core.plan.ParallelConfig.activation_offload_blocks` ``= N < L``) is
  ``--cpu-offloading-num-layers N``, the same flag's own meaning (the first ``N`` layers).
- ZeRO-2/3 (Megatron FSDP): ``--use-distributed-optimizer`` and
  ``--no-gradient-accumulation-fusion`` beside ``--use-megatron-fsdp``, as Megatron-FSDP's guide
  at the same commit lists them (``megatron/core/distributed/fsdp/src/README.md``).

- ``precision: fp8`` (:mod:`nest.core.precision`): ``--fp8-format hybrid`` (E4M3 forward, E5M2
  gradients, as the cost model) and ``--fp8-recipe {delayed,tensorwise,blockwise,mxfp8}``; the
  delayed recipe adds ``--fp8-amax-history-len 1024 --fp8-amax-compute-algo max`` as NVIDIA's
  own FP8 launcher does (``examples/llama/train_llama3_8b_h100_fp8.sh`` at the same commit;
  Megatron's defaults are a history of 1 and ``most_recent``). ``fp8_param_gather``:
  ``--fp8-param-gather``, which ``validate_args`` accepts only with the distributed optimizer or
  Megatron FSDP: a ZeRO-0 plan with data parallelism is not expressible (nearest: ZeRO-1), and
  one without it gets ``--use-distributed-optimizer``, which shards nothing over one rank.
  Transformer Engine versions each recipe needs (``megatron/core/fp8_utils.py``): tensorwise
  >= 2.2.0.dev0, blockwise >= 2.3.0.dev0, mxfp8 >= 2.1.0 (and Blackwell).

A setting the arguments cannot carry is scored under what Megatron runs
(:func:`nest.export.common.framework_problem`), and the export says the difference.

**Model shape** (a :class:`~nest.core.model.ModelSpec`; a measured profile has none): the
network-size, MoE and MLA arguments of the same ``arguments.py`` (:func:`model_args`), each
field as Megatron-Core reads it:

- ``head_dim``: ``--kv-channels``; ``kv_heads``: ``--group-query-attention --num-query-groups``
  (without them Megatron uses ``heads`` groups; ``TransformerConfig`` asserts the groups are a
  multiple of ``tp``).
- ``attention: mla``: ``--multi-latent-attention``, ``--q-lora-rank`` (absent: a full-rank
  query), ``--kv-lora-rank``, ``--qk-head-dim`` (= ``qk_nope_head_dim``),
  ``--qk-pos-emb-head-dim`` (= ``qk_rope_head_dim``), ``--v-head-dim``, and ``--qk-layernorm``,
  without which Megatron's MLA builds no latent norms (``gpt_layer_specs.py``: ``q_layernorm`` /
  ``kv_layernorm`` are ``IdentityOp`` unless ``qk_layernorm``) while the cost model, as
  DeepSeek-V2/V3, has them. ``qk_norm`` (GQA): ``--qk-layernorm``.
- ``window`` (sliding): ``--window-size w-1,0``: Transformer Engine's window ``(left, right)``
  lets query ``i`` see keys ``i - left .. i + right``, so ``w`` keys including itself (as the cost
  model's ``min(i + 1, w)``; Megatron-LM commit 6ec369d4a1 set gpt-oss's 128-token window to
  ``127,0`` for this reason). ``global_every = n >= 2``: ``--window-attn-skip-freq n``
  (``transformer/utils.py`` ``is_layer_window_attention``: 1-indexed layer ``l`` is windowed iff
  ``l % n != 0``, our block ``i = l - 1``); ``0``: no skip flag (every layer windowed). Chunked
  attention (Llama 4) has no Megatron option: the export warns that Megatron runs those blocks
  with full attention.
- MoE: ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
  ``--moe-shared-expert-intermediate-size`` (all shared experts together, as its help says),
  ``--moe-layer-freq``: an integer ``n`` when MoE blocks are exactly ``i % n == 0``
  (``gpt_layer_specs.py``), else the per-layer list as a pattern expression (``[0]*3+[1]*58``)
  that ``_eval_pattern`` evaluates (only ``,0-9[]()+*`` allowed); ``capacity_factor``:
  ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity`` (the cost model
  pads each expert's GEMM to its capacity).
- ``mtp_layers``: ``--mtp-num-layers``, which ``validate_args`` accepts only with rope (or no)
  position embeddings.
- The rest: ``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size``, ``--num-attention-heads``,
  ``--max-position-embeddings`` (required, ``>= --seq-length``), ``--position-embedding-type
  rope``, ``--normalization RMSNorm``, ``--swiglu``, ``--disable-bias-linear``,
  ``--untie-embeddings-and-output-weights``, and ``--attention-dropout 0 --hidden-dropout 0`` for a
  model without dropout (Megatron's default is 0.1). The vocabulary comes from the tokenizer.
"""

import itertools

from nest.core.axes import Axis, LayerKind, Optimizer, Recompute, Schedule
from nest.core.model import ModelSpec
from nest.core.plan import Plan
from nest.core.precision import Fp8Recipe
from nest.core.problem import Problem
from nest.export.common import (
    allocation_notes,
    block_choices,
    blocks_per_chunk,
    finish_export,
    full_block_counts,
    global_batch,
    has_kind,
    placement_order,
    rebuild,
    strongest_recompute,
    where_ranks_run,
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


def _block_recompute(problem: Problem, plan: Plan, block: list[int], issues, changes) -> None:
    """Every-n-blocks recompute as ``--recompute-method block --recompute-num-layers K``,
    which fully recomputes the first ``K`` layers of every stage (or chunk) and none of the
    rest (NVIDIA/Megatron-LM@d98e8a6:megatron/core/recompute.py): stages fully recomputing
    different counts get the largest, which stores at most what each stored."""
    k = max(block)
    want = [min(k, n) for n in blocks_per_chunk(problem, plan)]
    if want != block:
        issues.append(
            f"per-stage every-n-blocks recompute (full on the first {block} blocks; Megatron's "
            f"--recompute-method block recomputes the same first K on every stage; used K={k})"
        )
    changes["recompute"] = block_choices(problem, plan, want)


def nearest_expressible(problem: Problem, plan: Plan) -> tuple[Plan, list[str]]:
    """The plan Megatron can run that differs least from ``plan``, and what had to change."""
    issues, changes = [], {}
    modes = [s.recompute for s in plan.stages]
    held = {m for m, n in zip(modes, blocks_per_chunk(problem, plan), strict=True) if n}
    _recompute_changes(problem, plan, held, issues, changes)
    if problem.training.numerics.param_gather and plan.zero_stage == 0 and plan.dp * plan.cp > 1:
        issues.append(
            "FP8 parameter gather with ZeRO-0 (Megatron accepts --fp8-param-gather only with the "
            "distributed optimizer or Megatron FSDP; used ZeRO-1)"
        )
        changes["zero_stage"] = 1
    numerics = problem.training.numerics
    delayed = numerics.recipe is Fp8Recipe.DELAYED
    if plan.optimizer_offload and numerics.param_gather and not delayed:
        issues.append(
            f"optimizer offload with FP8 parameter gather and the {numerics.recipe.value} recipe "
            "(Megatron's --optimizer-cpu-offload accepts --fp8-param-gather only with "
            "--fp8-recipe delayed; used the optimizer on the device)"
        )
        changes["optimizer_offload"] = False
    elif plan.optimizer_offload and plan.zero_stage == 0 and plan.dp * plan.cp > 1:
        issues.append(
            "optimizer offload with ZeRO-0 (Megatron's --optimizer-cpu-offload needs "
            "--use-precision-aware-optimizer, which runs only with the distributed optimizer; "
            "used ZeRO-1)"
        )
        changes["zero_stage"] = 1
    if plan.activation_offload:
        why = []
        if plan.pp > 1:
            why.append("pipeline parallelism")
        if changes.get("recompute", modes)[0] is not Recompute.NONE or len(held) > 1:
            why.append("recomputation")
        if problem.model.spec.layers < 2:
            why.append("fewer than two blocks")
        if why:
            issues.append(
                f"activation offload with {' and '.join(why)} (Megatron's CPU offloading refuses "
                "them: TransformerConfig; used the activations on the device)"
            )
            changes["activation_offload"] = False
    schedule_issue = _schedule_issue(plan)
    if schedule_issue:
        issues.append(schedule_issue)
        changes.update(_schedule_changes(plan, changes.get("recompute", modes)))
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


JAX_OR_OP_MODES = (
    Recompute.OP,
    Recompute.DOTS,
    Recompute.QKV_PROJ,
    Recompute.QKV_OUT_PROJ,
    Recompute.NOTHING_SAVEABLE,
)
"""Modes that name ops or JAX's saved tensors, which ``--recompute-modules`` cannot: exported as
full."""


def _recompute_changes(problem: Problem, plan: Plan, held: set, issues: list, changes: dict):
    """The recompute Megatron runs for ``plan`` (one mode for every stage, modules not ops, the
    block method's one count), and why it differs; ``held``: the modes of stages with blocks."""
    modes = [s.recompute for s in plan.stages]
    block = full_block_counts(problem, plan)
    if block is not None:
        _block_recompute(problem, plan, block, issues, changes)
    elif any(s.full_blocks for s in plan.stages):
        issues.append(
            "every-n-blocks recompute over a recomputing mode (Megatron's --recompute-method "
            "block keeps the other layers' activations whole; used full everywhere)"
        )
        changes["recompute"] = [Recompute.FULL] * len(modes)
    elif len(held) > 1:  # a stage without blocks has nothing to recompute
        strongest = strongest_recompute(plan)
        counts = {str(m): modes.count(m) for m in dict.fromkeys(modes)}
        shown = ", ".join(f"{m} on {n} of {len(modes)}" for m, n in counts.items())
        issues.append(
            f"per-stage recompute ({shown} stages; Megatron applies one mode to every stage; used "
            f"{strongest} everywhere)"
        )
        changes["recompute"] = [strongest] * len(modes)
    if held and strongest_recompute(plan) in JAX_OR_OP_MODES:
        issues.append(
            f"recompute {strongest_recompute(plan)} (torchtitan's op-level selective "
            "checkpointing or a JAX remat policy; Megatron-Core's --recompute-modules names "
            "modules, not ops; used full everywhere, which stores no more)"
        )
        changes["recompute"] = [Recompute.FULL] * len(modes)


def _schedule_issue(plan: Plan) -> str | None:
    """Why Megatron-LM cannot run the plan's schedule as is (it then runs
    :func:`_schedule_changes`' schedule), or None."""
    if plan.schedule is Schedule.GPIPE:
        return "the GPipe schedule (Megatron runs 1F1B; used 1F1B)"
    if not plan.schedule.splits_backward:
        return None
    if plan.schedule.v_shaped:
        looped = plan.num_microbatches % plan.pp == 0
        used = (
            "interleaved 1F1B with the same 2 chunks per rank, placed looped"
            if looped
            else "1F1B with each pair of consecutive chunks as one stage (interleaving needs "
            f"num_microbatches({plan.num_microbatches}) divisible by pp({plan.pp}))"
        )
        if plan.schedule is Schedule.DUALPIPE_V:
            return (
                "the DualPipeV schedule (upstream Megatron-LM has no V placement nor DeepSeek's "
                "overlapped forward-and-backward; deepseek-ai/DualPipe runs it in plain PyTorch; "
                f"used {used})"
            )
        return (
            "the ZB-V schedule (Megatron-LM has no V placement; the authors' fork "
            "sail-sg/zero-bubble-pipeline-parallelism runs it with --zero-bubble-v-schedule; "
            f"used {used})"
        )
    name, pending = {
        Schedule.ZB_H1: ("ZB-H1", plan.pp),
        Schedule.ZB_H2: ("ZB-H2", 2 * plan.pp),
    }[plan.schedule]
    return (
        f"the {name} schedule (upstream Megatron-LM has no zero-bubble schedule; the authors' "
        "fork sail-sg/zero-bubble-pipeline-parallelism runs it with --enable-zero-bubble "
        f"--zero-bubble-max-pending-backward {pending}; used 1F1B)"
    )


def _schedule_changes(plan: Plan, modes) -> dict:
    """The schedule Megatron-LM runs for a plan it cannot run as is (:func:`_schedule_issue`):
    1F1B, or for ZB-V and DualPipeV the nearest: looped interleaving of the same chunks where
    Megatron's ``m % pp == 0`` holds, else 1F1B on the chunks merged in consecutive pairs (each
    pair's first recompute mode: by then one mode holds for every chunk)."""
    if not plan.schedule.v_shaped:
        return {"schedule": Schedule.ONE_F_ONE_B}
    if plan.num_microbatches % plan.pp == 0:
        return {"schedule": Schedule.INTERLEAVED}
    counts = [s.last_layer - s.first_layer + 1 for s in plan.stages]
    return {
        "schedule": Schedule.ONE_F_ONE_B,
        "virtual_stages": 1,
        "layer_counts": [counts[k] + counts[k + 1] for k in range(0, len(counts), 2)],
        "recompute": list(modes[::2]),
    }


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


def _recompute_modules_args(problem: Problem, mode: Recompute) -> list[str]:
    """``mlp`` / ``selective_mlp`` as Megatron-Core's per-module recompute
    (``TransformerConfig.recompute_modules``): ``mlp`` for dense blocks, ``moe_act`` for MoE
    blocks (which ``TransformerConfig.__post_init__`` accepts only with ``--moe-grouped-gemm``),
    and ``core_attn`` for the selective part."""
    moe = {ref.moe for ref in problem.model.chain if ref.kind is LayerKind.BLOCK}
    modules = ["core_attn"] if mode is Recompute.SELECTIVE_MLP else []
    modules += (["mlp"] if False in moe else []) + (["moe_act"] if True in moe else [])
    out = ["--recompute-granularity selective", f"--recompute-modules {' '.join(modules)}"]
    return out + (["--moe-grouped-gemm"] if True in moe else [])


def hybrid_args(plan: Plan) -> list[str]:
    """Hybrid sharding's flags (module docstring); none for a plan sharding over all ranks."""
    if plan.zero_shard is None:
        return []
    out = [f"--num-distributed-optimizer-instances {plan.config.zero_replicas}"]
    if plan.zero_stage >= 2:  # Megatron-FSDP: replicate across instances
        out.append("--outer-dp-sharding-strategy no_shard")
    return out


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
    if plan.etp is not None:  # Megatron-Core's default expert tensor degree is tp
        args.append(f"--expert-tensor-parallel-size {plan.etp}")
    if problem.model.seq_len:
        args.append(f"--seq-length {problem.model.seq_len}")
    if plan.sequence_parallel and plan.tp > 1:
        args.append("--sequence-parallel")
    mode = plan.stages[0].recompute
    block = full_block_counts(problem, plan)
    if block is not None:  # nearest_expressible left one K for every stage
        args += [
            "--recompute-granularity full",
            "--recompute-method block",
            f"--recompute-num-layers {max(block)}",
        ]
    elif mode is Recompute.SELECTIVE:
        args.append("--recompute-granularity selective")
    elif mode in (Recompute.MLP, Recompute.SELECTIVE_MLP):
        args += _recompute_modules_args(problem, mode)
    elif mode is Recompute.MLA_UP:
        args += ["--recompute-granularity selective", "--recompute-modules mla_up_proj"]
    elif mode in (Recompute.MLP_MOE, Recompute.MLA_UP_MLP_MOE):
        up = "mla_up_proj " if mode is Recompute.MLA_UP_MLP_MOE else ""
        args += ["--recompute-granularity selective", f"--recompute-modules {up}mlp moe"]
    elif mode is Recompute.FULL:
        args += [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    args += ZERO_FLAGS[plan.zero_stage] + hybrid_args(plan)
    if plan.zero_stage == 0 and (problem.training.numerics.param_gather or plan.optimizer_offload):
        # no data parallelism (nearest_expressible moved any other ZeRO-0 plan): the distributed
        # optimizer over one rank shards nothing, and --fp8-param-gather and the precision-aware
        # optimizer of --optimizer-cpu-offload need it
        args.append("--use-distributed-optimizer")
    if plan.activation_offload:
        blocks = problem.model.spec.layers
        n = min(plan.activation_offload_blocks or blocks, blocks - 1)
        args.append(f"--cpu-offloading-num-layers {n}")
    if plan.optimizer_offload:
        args += [
            "--optimizer-cpu-offload",
            "--optimizer-offload-fraction 1.0",
            "--use-precision-aware-optimizer",
        ]
    args += _partition_args(problem, plan)
    if placement_order(plan, (DEFAULT_ORDER,)) is None:
        args.append("--use-tp-pp-dp-mapping")
    return args + training_args(problem, plan)


def _tp_overlap_runs(problem: Problem, plan: Plan) -> bool:
    """``--tp-comm-overlap`` is emitted (Megatron asserts sequence parallelism with it)."""
    t = problem.training
    return t.tp_comm_overlap and plan.tp > 1 and plan.sequence_parallel


def ep_overlap_runs(problem: Problem, plan: Plan) -> str | None:
    """None when ``--overlap-moe-expert-parallel-comm`` is emitted for the plan, else why not
    (Megatron-Core 000c4ac24f61 ``TransformerConfig.__post_init__``: with ``pp > 1`` the
    virtual pipeline must be set; ``recompute_granularity != 'full'``, ``recompute_method`` and
    ``recompute_num_layers`` None; ``mtp_num_layers`` None or 1); ``""`` when the plan was not
    scored with it or has no expert parallelism."""
    if not problem.training.ep_comm_overlap or plan.ep == 1:
        return ""
    if plan.pp > 1 and plan.virtual_stages == 1:
        return "it needs a virtual pipeline when pp > 1 (interleaved schedule)"
    if any(s.recompute is Recompute.FULL or s.full_blocks for s in plan.stages):
        return "it refuses full recompute and --recompute-method"
    if getattr(getattr(problem.model, "spec", None), "mtp_layers", 0) > 1:
        return "it supports at most one MTP layer"
    return None


def dispatcher_args(dispatcher: str) -> list[str]:
    """The token dispatcher the plan was scored with (``TransformerConfig``'s default,
    ``allgather``, is neither): ``alltoall``, or DeepEP through the flex dispatcher
    (``__post_init__`` accepts the DeepEP backend only with ``flex``)."""
    if dispatcher == "deepep":
        return ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]
    return ["--moe-token-dispatcher-type alltoall"]


def training_args(problem: Problem, plan: Plan) -> list[str]:
    """The flags that carry the training settings the plan was scored with (module docstring)."""
    t = problem.training
    args = ["--bf16"]
    if t.grad_bytes == 2:
        args.append("--grad-reduce-in-bf16")
    if t.overlap_grad_sync:
        args.append("--overlap-grad-reduce")
        if plan.zero_stage in (1, 2) and plan.dp * plan.cp > 1:
            # the weight all-gather under the next forward, as scored (validate_args asserts the
            # distributed optimizer or Megatron-FSDP and --overlap-grad-reduce)
            args.append("--overlap-param-gather")
    if _tp_overlap_runs(problem, plan):
        args.append("--tp-comm-overlap")
    if ep_overlap_runs(problem, plan) is None:
        args.append("--overlap-moe-expert-parallel-comm")
    if t.moe_routing == "balanced" and plan.ep > 1:
        args.append("--moe-router-force-load-balancing")
    if plan.ep > 1:
        args += dispatcher_args(t.moe_dispatcher)
    if t.optimizer is Optimizer.SGD:
        args += ["--optimizer sgd", "--sgd-momentum 0"]
    if t.fused_loss and t.cross_entropy_loss_fusion:
        args.append("--cross-entropy-loss-fusion")
    return args + fp8_args(problem, plan)


def fp8_args(problem: Problem, plan: Plan) -> list[str]:
    """The FP8 flags (module docstring); none in BF16."""
    numerics = problem.training.numerics
    if not numerics.fp8:
        return []
    args = ["--fp8-format hybrid", f"--fp8-recipe {numerics.recipe.value}"]
    if numerics.recipe is Fp8Recipe.DELAYED:
        args += ["--fp8-amax-history-len 1024", "--fp8-amax-compute-algo max"]
    if numerics.param_gather:
        args.append("--fp8-param-gather")
    return args


def framework_runs(problem: Problem, plan: Plan) -> dict:
    """What Megatron runs of the settings :func:`training_args` cannot always carry."""
    runs = {}
    if plan.cp > 1:
        runs["cp_comm_overlap"] = (True, "Megatron's default --cp-comm-type p2p overlaps the ring")
    why = ep_overlap_runs(problem, plan)
    if why:
        runs["ep_comm_overlap"] = (False, f"--overlap-moe-expert-parallel-comm is left out: {why}")
    return runs


def pattern_expr(bits: list[int]) -> str:
    """A per-layer 0/1 list as the shortest pattern expression this builds (run lengths, or runs
    then one repeated unit): Megatron's ``_eval_pattern`` evaluates it back to ``bits``."""

    def runs(seq) -> list[str]:
        out = []
        for v, group in itertools.groupby(seq):
            n = len(list(group))
            out.append(f"[{v}]*{n}" if n > 1 else f"[{v}]")
        return out

    best = "+".join(runs(bits))
    for start in range(len(bits)):
        rest = bits[start:]
        for p in range(2, len(rest) // 2 + 1):
            unit, reps = rest[:p], len(rest) // p
            tail = rest[p * reps :]
            if unit * reps + tail != rest or tail != unit[: len(tail)]:
                continue
            terms = runs(bits[:start]) + [f"[{','.join(map(str, unit))}]*{reps}"]
            if tail:
                terms.append(f"[{','.join(map(str, tail))}]")
            if len("+".join(terms)) < len(best):
                best = "+".join(terms)
            break  # the shortest unit from this start
    return f"({best})"


def model_args(problem: Problem) -> tuple[list[str], list[str]]:
    """The model-shape flags of a :class:`ModelSpec` (module docstring) and warnings for what
    Megatron cannot build as specified; ``([], [])`` for a measured profile."""
    spec = getattr(problem.model, "spec", None)
    if not isinstance(spec, ModelSpec):
        return [], []
    seq = problem.model.seq_len or spec.seq_len
    args = [
        f"--num-layers {spec.layers}",
        f"--hidden-size {spec.hidden}",
        f"--ffn-hidden-size {spec.ffn_hidden}",
        f"--num-attention-heads {spec.heads}",
        f"--max-position-embeddings {max(spec.max_position or 0, seq)}",
    ]
    if spec.position == "rope":
        args.append("--position-embedding-type rope")
    if spec.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if spec.activation == "swiglu":
        args.append("--swiglu")
    if not spec.bias:
        args.append("--disable-bias-linear")
    if not spec.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not spec.dropout:
        args += ["--attention-dropout 0", "--hidden-dropout 0"]
    attention, warnings = _attention_args(spec)
    args += attention + _moe_args(spec)
    if spec.mtp_layers:
        args.append(f"--mtp-num-layers {spec.mtp_layers}")
        if spec.position != "rope":
            warnings.append(
                f"Megatron refuses --mtp-num-layers with {spec.position} position embeddings "
                "(validate_args: rope or none only)"
            )
    return args, warnings


def _attention_args(spec: ModelSpec) -> tuple[list[str], list[str]]:
    """The attention's flags (MLA, GQA, head width, Q/K norms, windows) and warnings."""
    args: list[str] = []
    warnings: list[str] = []
    if spec.attention == "mla":
        args.append("--multi-latent-attention")
        if spec.q_lora_rank is not None:
            args.append(f"--q-lora-rank {spec.q_lora_rank}")
        args += [
            f"--kv-lora-rank {spec.kv_lora_rank}",
            f"--qk-head-dim {spec.qk_nope_head_dim}",
            f"--qk-pos-emb-head-dim {spec.qk_rope_head_dim}",
            f"--v-head-dim {spec.v_head_dim}",
            "--qk-layernorm",
        ]
    else:
        if spec.head_dim is not None:
            args.append(f"--kv-channels {spec.head_dim}")
        if spec.num_kv_heads != spec.heads:
            args += ["--group-query-attention", f"--num-query-groups {spec.num_kv_heads}"]
        if spec.qk_norm:
            args.append("--qk-layernorm")
    if spec.window is not None:
        if spec.local_attention == "sliding":
            args.append(f"--window-size {spec.window - 1},0")
            if spec.global_every:
                args.append(f"--window-attn-skip-freq {spec.global_every}")
        else:
            local = sum(spec.block_is_local(i) for i in range(spec.layers))
            warnings.append(
                f"Megatron-LM has no chunked attention (model {spec.name}: {local} of "
                f"{spec.layers} blocks attend within chunks of {spec.window} tokens): the "
                "exported arguments run them with full causal attention, more attention FLOPs "
                "and activations than the plan was scored with"
            )
    return args, warnings


def _moe_args(spec: ModelSpec) -> list[str]:
    """The mixture-of-experts flags (experts, shared experts, capacity, which blocks)."""
    args: list[str] = []
    if spec.is_moe:
        args += [f"--num-experts {spec.num_experts}", f"--moe-router-topk {spec.top_k}"]
        args.append(f"--moe-ffn-hidden-size {spec.expert_ffn}")
        if spec.shared_experts:
            args.append(f"--moe-shared-expert-intermediate-size {spec.shared_ffn}")
        if spec.capacity_factor is not None:  # each expert's GEMM padded to its capacity
            args += [
                f"--moe-expert-capacity-factor {spec.capacity_factor}",
                "--moe-pad-expert-input-to-capacity",
            ]
        if spec.first_dense_layers == 0 and spec.moe_layer_phase == 0:
            args.append(f"--moe-layer-freq {spec.moe_layer_freq}")
        else:
            bits = [int(spec.block_is_moe(i)) for i in range(spec.layers)]
            args.append(f'--moe-layer-freq "{pattern_expr(bits)}"')
    return args


def export_megatron(problem: Problem, plan: Plan, report=None, replan=None):
    exported, issues = nearest_expressible(problem, plan)
    args = megatron_args(problem, exported)
    n = exported.devices_used
    notes = [
        f"launch {n} ranks (world size {n} = tp {exported.tp} x cp {exported.cp} x dp "
        f"{exported.dp} x pp {exported.pp}); rank r runs on {where_ranks_run(exported)}",
        *allocation_notes(problem, plan, exported),
    ]
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
    shape, warnings = model_args(problem)
    numerics = problem.training.numerics
    if numerics.fp8 and numerics.recipe is not Fp8Recipe.DELAYED:
        need = {"tensorwise": "2.2.0.dev0", "blockwise": "2.3.0.dev0", "mxfp8": "2.1.0"}
        notes.append(
            f"--fp8-recipe {numerics.recipe.value} needs Transformer Engine >= "
            f"{need[numerics.recipe.value]} (megatron/core/fp8_utils.py)"
            + ("; mxfp8 runs on Blackwell only" if numerics.recipe is Fp8Recipe.MXFP8 else "")
        )
    if shape:
        head = (
            "# Model shape from the model spec, then the plan. Add data and tokenizer flags\n"
            "# (the vocabulary comes from the tokenizer).\n"
        )
    else:
        head = (
            "# Add your model's shape flags (--num-layers, --hidden-size,\n"
            "# --max-position-embeddings >= --seq-length, ...) and data flags.\n"
        )
    text = (
        f"# Megatron-LM arguments for {plan.solver or 'the plan'} ({CHECKED}).\n"
        + head
        + " \\\n".join(shape + args)
        + "\n"
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
        warnings=warnings,
        runs=framework_runs(problem, exported),
        option=OPTION,
        replan=replan,
    )
