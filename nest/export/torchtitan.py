"""A plan as the parallelism part of a torchtitan job config (TOML).

**Target.** torchtitan's TOML job configs, which it read up to release v0.2.2 (February 2026);
PR pytorch/torchtitan#2386 then replaced them with Python dataclass configs (``config_registry``),
where the same settings keep their meaning. Everything below was checked against pytorch/torchtitan
at commit 000204a4a8bf (2025):

- ``torchtitan/config/job_config.py``: ``[parallelism]`` ``data_parallel_replicate_degree``,
  ``data_parallel_shard_degree``, ``fsdp_reshard_after_forward`` (``default|always|never``),
  ``tensor_parallel_degree``, ``context_parallel_degree``, ``expert_parallel_degree``,
  ``pipeline_parallel_degree``, ``pipeline_parallel_split_points`` (module names starting each
  stage after the first, e.g. ``layers.4``), ``pipeline_parallel_schedule`` (``1F1B``,
  ``Interleaved1F1B``, ``GPipe``; its multi-stage ``InterleavedZeroBubble`` and ``ZBVZeroBubble``
  hold several stages per rank (``InterleavedZeroBubble`` is the paper's ZB1P, by its
  docstring; neither is ZB-H2), and ``torch.distributed.pipelining`` has no single-stage
  zero-bubble schedule, so a ZB-H1 or ZB-H2 plan is exported as 1F1B with a warning; a ZB-V
  plan is exported as ``ZBVZeroBubble`` with its ``2 pp`` chunks as stages: torchtitan places
  the stages of that schedule in a V, two per rank (``stage_ids_this_rank(..., style="v")``
  asserts ``stages_per_rank == 2``; pytorch/torchtitan@fb3b230e2a05:
  torchtitan/distributed/pipeline_parallel.py), as :func:`nest.core.plan.chunk_rank` does);
  a DualPipeV plan as ``DualPipeV`` (PyTorch's ``ScheduleDualPipeV``, DeepSeek's order,
  pytorch/pytorch@1fd7abc2f521:torch/distributed/pipelining/schedules.py), which torchtitan
  places in the same V from pytorch/torchtitan@b5bcd76c66d0 on (``style = "v"`` for
  ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV``; at fb3b230e2a05 only for the first),
  with a warning: PyTorch's runtime runs an ``OVERLAP_F_B`` action's forward and backward one
  after the other unless a function is registered for it (``register_custom_function``, which
  torchtitan's ``graph_trainer`` experiment does), and the plan's time counts them overlapped),
  ``pipeline_parallel_microbatch_size``; ``[training]``
  ``local_batch_size``, ``global_batch_size``, ``seq_len``; ``[activation_checkpoint]`` ``mode``
  (``none|selective|full``) and ``selective_ac_option``.
- Batch (``torchtitan/train.py``): the data-parallel degree is ``dp_replicate x dp_shard`` (context
  ranks share a batch); ``gradient_accumulation_steps = global_batch_size / (local_batch_size x
  dp)``, each step one forward/backward of ``local_batch_size`` sequences. With pipeline
  parallelism that step is one pipeline schedule over ``local_batch_size /
  pipeline_parallel_microbatch_size`` microbatches (``distributed/pipeline_parallel.py``).
  So a plan of ``m`` microbatches of ``b`` sequences is exported as ``local_batch_size = b`` (``m``
  accumulation steps) without pipelining and as ``local_batch_size = m b``,
  ``pipeline_parallel_microbatch_size = b`` (one step) with it.
- Mesh (``torchtitan/distributed/parallel_dims.py``): ``[pp, dp_replicate, dp_shard, cp, tp]``,
  outermost first, which is our rank order ``tp,cp,dp,pp``; expert parallelism borrows all context
  ranks and part of the shard ranks: ``ep % cp == 0`` and ``(dp_shard x cp) % ep == 0``. FSDP is on
  whenever ``dp_shard > 1`` or ``cp > 1`` and shards over ``dp_shard x cp`` (as our ZeRO shards
  over ``dp x cp``); DDP (``dp_replicate`` alone) is refused unless data parallelism is the only
  parallelism ("DDP has not supported > 1D parallelism", ``parallelize.py``).
- Hybrid sharding (HSDP, ``zero_shard``; torchtitan ``docs/fsdp.md``): ``dp_replicate > 1`` with
  FSDP is FSDP2 on the 2-D mesh ``(dp_replicate, dp_shard x cp)``, shard groups the inner
  ``dp_shard`` ranks as our ``zero_shard`` innermost replicas: ``data_parallel_shard_degree =
  zero_shard``, ``data_parallel_replicate_degree = dp / zero_shard``, the ZeRO stages as for FSDP
  below (a shard group of one device, ``zero_shard x cp = 1``, is DDP: nearest plan). Without
  pipelining torchtitan all-reduces across the replicas in every accumulation step, which a
  warning says (the evaluated plan counts one all-reduce per iteration, as FSDP2's
  ``set_requires_all_reduce`` runs it).

**ZeRO stages.** What each torchtitan data-parallel setting keeps per device, in our terms:

- no data parallelism (``dp = cp = 1``): every ZeRO stage is the same plan;
- DDP: ZeRO-0 (only with ``tp = cp = pp = ep = 1``);
- FSDP without pipelining: ``fsdp_reshard_after_forward = "always"`` gathers the weights for the
  forward and again for the backward and reduce-scatters every microbatch: ZeRO-3, as our model;
  ``"never"`` keeps the gathered weights from the forward to the backward: ZeRO-2, or ZeRO-3
  with ``training.reshard_after_forward=false`` (exported ``"never"``: the same FSDP2 setting,
  which nest prices with one gather per microbatch and the stage's weights kept gathered);
- FSDP with pipelining: PyTorch's pipeline stage runs every backward but the last with
  ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``
  (``torch/distributed/pipelining/stage.py``, ``backward_maybe_with_nosync``), so full weights and
  full gradients stay on the device until the last microbatch's reduce-scatter: ZeRO-1 (exported
  with ``"never"``, torchtitan's default under pipelining: one weight gather per step). ZeRO-0, 2
  and 3 are not expressible with pipelining.

A plan whose stage torchtitan cannot run is exported as the best expressible stage by the shared
evaluator (a plan that fits first), with a warning. torchtitan's accumulation loop has no
``no_sync``: without pipelining DDP and FSDP synchronise gradients after every accumulation step,
which a note says when the evaluated plan counts one synchronisation per iteration (ZeRO-0/2).

One recompute mode for all stages (nearest: the mode that recomputes everything any stage
recomputes); ``op`` is torchtitan's per-op selective checkpointing (``mode = "selective"``,
``selective_ac_option = "op"``), whose saved set it models
(:func:`nest.core.blocks.op_sac_inventory`); selective maps to the same option, whose saved set
differs from the cost model's attention-core recompute. torchtitan has no MLP-only recompute
(``[activation_checkpoint]`` offers ``none``, ``selective`` by op or every n blocks, and
``full``): ``mlp`` and ``selective_mlp`` are exported as ``full``, which stores less.
Every-n-blocks plans (stages fully recomputing ``k`` of their blocks, the rest ``none``) are
exported as ``selective_ac_option = "n"`` (:func:`every_nth`: a stage of ``c`` blocks then
recomputes ``c // n`` of them, the ``n``-th, ``2n``-th, ...; a warning when that differs from
the plan's counts); over another base mode as ``full``. The option exists up to torchtitan
v0.2.2 (pytorch/torchtitan#2357 removed it in March 2026), the versions that read TOML. Stages
after the first must start with a transformer block (a split point); a stage holding only the
head is moved one block back. An offloaded optimizer
(:attr:`~nest.core.plan.ParallelConfig.optimizer_offload`) is not expressible: torchtitan's
``training.enable_cpu_offload`` ("CPU offloading of parameters, gradients, and optimizer states
in FSDP", ``torchtitan/config/configs.py`` at 2026-08: FSDP2's ``CPUOffloadPolicy``) moves the
weights and gradients too (nearest: the optimizer on the device); activation offload has no
option in its job config (nearest: the activations on the device). ``Interleaved1F1B`` needs
the microbatch count to be a multiple of ``max(1, m // pp)`` (PyTorch's
``ScheduleInterleaved1F1B``), which every plan meets: the evaluator requires ``m`` to be a
multiple of ``pp`` under interleaving.

**Training settings the score assumes.** ``[training] mixed_precision_param = "bfloat16"`` is
emitted; ``mixed_precision_reduce`` accepts only ``"float32"`` at this commit
(``Literal["float32"]``)
and DDP runs fp32 weights under autocast, so torchtitan's gradients are 4 bytes: a plan scored
with ``grad_bytes: 2`` is re-scored with 4. ``tp_comm_overlap``: torchtitan's
``enable_async_tensor_parallel`` works only under ``[training] compile``, which this export does
not turn on, so a plan with ``tp > 1`` is re-scored without it; ``ep_comm_overlap``: no option
overlaps the MoE all-to-all; ``moe_routing: balanced``: no option forces the router to balance,
so a plan with ``ep > 1`` is re-scored dropless; ``moe_dispatcher: deepep``: the job config has
no dispatcher option (DeepEP is a model argument, ``moe_comm_backend``, of the experiments'
config registries), so such a plan is re-scored with the all-to-all. The export states each
difference and the re-scored time.

**FP8** (``precision: fp8``; ``components/quantization/{float8,mx,utils}.py`` and
``docs/float8.md`` at the same commit). ``[model] converters = ["float8"]`` swaps each
``nn.Linear`` whose dimensions are multiples of 16 for torchao's ``Float8Linear``;
``[float8] filter_fqns`` keeps the LM head (``output``) and, in a MoE model, the router
(``router.gate``) in BF16, as the cost model and torchtitan's own configs do. Recipes:

- ``tensorwise``: ``recipe_name`` unset (torchao's dynamic per-tensor scaling, TE's "current
  scaling"); ``delayed``: torchtitan has no delayed scaling (torchao dropped it), so it runs
  tensorwise and is re-scored so;
- ``blockwise``: no 128-block recipe; exported as ``recipe_name = "rowwise"`` (one scale per
  row, the finer-than-tensor scaling it has), with a warning: the cost model has no rowwise recipe
  and still prices blockwise;
- ``mxfp8``: ``converters = ["mx"]``, ``[mx] recipe_name = "mxfp8"`` (``mx.py``: SM100 or later,
  a torchao nightly, and no ``torch.compile`` with ``tp > 1``).

``fp8_param_gather``: ``enable_fsdp_float8_all_gather`` (and
``precompute_float8_dynamic_scale_for_fsdp``), which ``float8.py`` asserts against any
``recipe_name`` and applies only when ``dp_shard > 1``; otherwise re-scored without it.
``[training] compile = true`` with FP8 (torchtitan's float8 docs: "required for competitive
performance", it fuses the casts the cost model prices as fused), except mxfp8 with ``tp > 1``.
torchtitan's experts (``GroupedExperts``) are not ``nn.Linear``: they stay BF16 (the score runs
them in FP8), which a warning says. The model's shape is not part of a job config (``[model]
name``/``flavor`` pick a Python model definition): a note lists what it must have.
"""

from nest.core.axes import Axis, LayerKind, Recompute, Schedule
from nest.core.model import ModelSpec
from nest.core.plan import Plan
from nest.core.precision import Fp8Recipe
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.export.common import (
    allocation_notes,
    block_choices,
    blocks_per_chunk,
    finish_export,
    framework_problem,
    full_block_counts,
    global_batch,
    placement_order,
    rebuild,
    strongest_recompute,
    where_ranks_run,
)

CHECKED = (
    "pytorch/torchtitan @ 000204a4a8bf (2025): config/job_config.py, train.py, "
    "distributed/parallel_dims.py; TOML job configs as read up to v0.2.2"
)
ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
SCHEDULES = {
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.INTERLEAVED: "Interleaved1F1B",
    Schedule.GPIPE: "GPipe",
    Schedule.ZB_V: "ZBVZeroBubble",
    Schedule.DUALPIPE_V: "DualPipeV",
}
REPLICATE, SHARD, RESHARD = (
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "fsdp_reshard_after_forward",
)


def _ep_ok(dp_shard: int, cp: int, ep: int) -> bool:
    """torchtitan's expert-parallel rule: EP borrows all context ranks and part of the shards."""
    return ep == 1 or (ep % cp == 0 and (dp_shard * cp) % ep == 0)


def data_parallel_modes(plan: Plan, ep: int | None = None, hybrid: bool = True) -> dict[int, dict]:
    """ZeRO stage -> the ``[parallelism]`` data-parallel fields that run it, for this plan's shape
    (module docstring); a stage missing from the dict is not expressible. With ``hybrid`` (and a
    plan that shards within groups) only the stages 1-3 on HSDP's 2-D mesh."""
    ep = plan.ep if ep is None else ep
    dp, cp = plan.dp, plan.cp
    if dp * cp == 1:
        return {z: {REPLICATE: 1, SHARD: 1} for z in range(4)}
    modes = {}
    zs = plan.zero_shard if hybrid else None
    if zs is not None:
        if zs * cp > 1 and _ep_ok(zs, cp, ep):
            hsdp = {REPLICATE: dp // zs, SHARD: zs}
            if plan.pp == 1:
                modes[2] = {**hsdp, RESHARD: "never"}
                modes[3] = {**hsdp, RESHARD: "always"}
            else:
                modes[1] = {**hsdp, RESHARD: "never"}
        return modes
    if plan.tp == cp == plan.pp == ep == 1:
        modes[0] = {REPLICATE: dp, SHARD: 1}
    if _ep_ok(dp, cp, ep):
        fsdp = {REPLICATE: 1, SHARD: dp}
        if plan.pp == 1:
            modes[2] = {**fsdp, RESHARD: "never"}
            modes[3] = {**fsdp, RESHARD: "always"}
        else:
            modes[1] = {**fsdp, RESHARD: "never"}
    return modes


def _menu(plan: Plan) -> str:
    """What torchtitan offers for this shape, for the warning."""
    if plan.pp > 1:
        return (
            "with pipelining its FSDP keeps full gradients until the last microbatch (ZeRO-1) "
            "and DDP needs data parallelism alone"
        )
    ddp = "DDP (ZeRO-0) only when data parallelism is alone, " if plan.tp * plan.cp > 1 else ""
    return f"{ddp}DDP = ZeRO-0, FSDP resharding after forward = ZeRO-3, FSDP keeping it = ZeRO-2"


def _split_counts(problem: Problem, counts: list[int]) -> list[int] | None:
    """Layer counts with every stage after the first starting at a block (None: already so)."""
    chain = problem.model.chain
    starts = [sum(counts[:k]) for k in range(len(counts))]
    bad = [k for k in range(1, len(counts)) if chain[starts[k]].kind is not LayerKind.BLOCK]
    if not bad:
        return None
    counts = list(counts)
    for k in bad:
        if counts[k - 1] > 1:
            counts[k - 1] -= 1
            counts[k] += 1
    return counts


def _ep_candidates(problem: Problem, plan: Plan) -> list[int]:
    """Expert degrees torchtitan can lay out for this plan: the plan's, else every ``ep`` that
    divides ``dp x cp`` and the experts, is a multiple of ``cp``, or is 1."""
    if _ep_ok(plan.dp, plan.cp, plan.ep):
        return [plan.ep]
    experts = problem.model.spec.num_experts
    width = plan.dp * plan.cp
    return [
        e
        for e in range(1, width + 1)
        if width % e == 0 and experts % e == 0 and _ep_ok(plan.dp, plan.cp, e)
    ]


def _best_data_parallel(problem: Problem, plan: Plan, changes: dict) -> tuple[int, int, bool]:
    """``(zero stage, ep, hybrid)`` of the fastest data parallelism torchtitan runs for the plan
    with ``changes``, scored as torchtitan runs it (a plan that fits first): a hybrid plan keeps
    its shard groups where torchtitan runs them, else shards over all ranks; ties keep the
    plan's own sharding."""
    scored = []
    for hybrid in dict.fromkeys((plan.zero_shard is not None, False)):
        for ep in _ep_candidates(problem, plan):
            for z in data_parallel_modes(plan, ep, hybrid):
                option = rebuild(plan, zero_stage=z, ep=ep, hybrid=hybrid, **changes)
                ran, _ = framework_problem(problem, framework_runs(problem, option))
                report = evaluate(ran, option)
                differs = hybrid != (plan.zero_shard is not None)
                scored.append(
                    (not report.feasible, report.iteration_time_s, differs, z, ep, hybrid)
                )
    *_, zero, ep, hybrid = min(scored)
    return zero, ep, hybrid


MODULE_MODES = (
    Recompute.MLP,
    Recompute.SELECTIVE_MLP,
    Recompute.DOTS,
    Recompute.MLA_UP,
    Recompute.MLP_MOE,
    Recompute.MLA_UP_MLP_MOE,
    Recompute.QKV_PROJ,
    Recompute.QKV_OUT_PROJ,
    Recompute.NOTHING_SAVEABLE,
)
"""Modes torchtitan cannot run (single modules, JAX's dots and named policies): exported as
full."""


def _recompute_changes(problem: Problem, plan: Plan, issues: list, changes: dict) -> None:
    """The recompute torchtitan runs for ``plan`` (module docstring), and why it differs."""
    modes = [s.recompute for s in plan.stages]
    strongest = strongest_recompute(plan)
    block = full_block_counts(problem, plan)
    if block is not None:
        counts = blocks_per_chunk(problem, plan)
        n = every_nth(block, counts)
        got = [c // n for c in counts]
        if got != block:
            issues.append(
                f"every-n-blocks recompute of {block} blocks per stage (torchtitan checkpoints "
                f"every n-th block; used n={n}: {got}, at least as many on every stage)"
            )
        changes["recompute"] = block_choices(problem, plan, got)
    elif any(s.full_blocks for s in plan.stages):
        issues.append(
            "every-n-blocks recompute over a recomputing mode (torchtitan's every-n-blocks "
            "option keeps the other blocks' activations whole; used full everywhere)"
        )
        changes["recompute"] = [Recompute.FULL] * len(modes)
    elif strongest in MODULE_MODES:
        issues.append(
            f"recompute {strongest} (torchtitan recomputes whole blocks or by its op-level "
            "policy, not single modules nor by JAX's remat policies; used full everywhere)"
        )
        changes["recompute"] = [Recompute.FULL] * len(modes)
    elif len(set(modes)) > 1:
        issues.append(f"per-stage recompute (used {strongest} everywhere)")
        changes["recompute"] = [strongest] * len(modes)


def nearest_expressible(problem: Problem, plan: Plan) -> tuple[Plan, list[str]]:
    issues, changes = [], {}
    if plan.schedule not in SCHEDULES:
        issues.append(
            f"the {plan.schedule} schedule (torchtitan's zero-bubble schedules, "
            "InterleavedZeroBubble and ZBVZeroBubble, run several stages per rank; a single "
            "stage per rank runs 1F1B or GPipe; used 1F1B)"
        )
        changes["schedule"] = Schedule.ONE_F_ONE_B
    _recompute_changes(problem, plan, issues, changes)
    if placement_order(plan, (ORDER,)) is None:
        issues.append("a rank order other than torchtitan's mesh pp,dp,cp,tp (used it)")
        changes["rank_order"] = ORDER
    moved = _split_counts(problem, [s.last_layer - s.first_layer + 1 for s in plan.stages])
    if moved is not None:
        issues.append("a stage that starts without a transformer block (moved one block into it)")
        changes["layer_counts"] = moved
    if plan.optimizer_offload:
        issues.append(
            "optimizer offload (torchtitan's training.enable_cpu_offload moves FSDP's parameters "
            "and gradients to the host as well as the optimizer state, a different plan; used "
            "the optimizer on the device)"
        )
        changes["optimizer_offload"] = False
    if plan.activation_offload:
        issues.append(
            "activation offload (torchtitan's job config has no activation offload option; used "
            "the activations on the device)"
        )
        changes["activation_offload"] = False
    if plan.etp is not None:
        issues.append(
            "whole experts under tensor parallelism (etp 1; this export lays out torchtitan's "
            "expert_tensor_parallel_degree = tp, used it)"
        )
        changes["whole_experts"] = False
    if plan.zero_stage not in data_parallel_modes(plan):
        zero, ep, hybrid = _best_data_parallel(problem, plan, changes)
        if plan.zero_shard is not None and not hybrid:
            changes["hybrid"] = False
        shown = f" within groups of {plan.zero_shard}" if plan.zero_shard else ""
        used = "" if hybrid or plan.zero_shard is None else " over all data-parallel ranks"
        issues.append(
            f"ZeRO-{plan.zero_stage}{shown} (torchtitan: {_menu(plan)}"
            + (
                f"; its expert parallelism needs ep % cp == 0 and (dp x cp) % ep == 0, so ep={ep}"
                if ep != plan.ep
                else ""
            )
            + f"; used ZeRO-{zero}{used})"
        )
        changes["zero_stage"] = zero
        if ep != plan.ep:
            changes["ep"] = ep
    if not changes:
        return plan, []
    return rebuild(plan, **changes), issues


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def local_batch_size(plan: Plan) -> int:
    """Sequences per forward/backward step of a data-parallel rank (module docstring): the whole
    per-rank batch under pipelining (the schedule splits it), one microbatch without (torchtitan
    accumulates ``num_microbatches`` steps)."""
    per_rank = plan.microbatch_size * plan.num_microbatches
    return per_rank if plan.pp > 1 else plan.microbatch_size


def torchtitan_sections(problem: Problem, plan: Plan) -> dict:
    """The TOML sections of an expressible plan (its ZeRO stage in :func:`data_parallel_modes`)."""
    chain = problem.model.chain
    parallelism = {
        **data_parallel_modes(plan)[plan.zero_stage],
        "tensor_parallel_degree": plan.tp,
        "context_parallel_degree": plan.cp,
        "expert_parallel_degree": plan.ep,
        "pipeline_parallel_degree": plan.pp,
    }
    if plan.zero_stage == 3 and not problem.training.reshard_after_forward:
        parallelism[RESHARD] = "never"  # FSDP2 reshard_after_forward=False (module docstring)
    if plan.ep > 1:  # torchtitan's default is 1; experts split like the dense weights, as scored
        parallelism["expert_tensor_parallel_degree"] = plan.tp
    if plan.pp > 1:
        blocks = [i for i, ref in enumerate(chain) if ref.kind is LayerKind.BLOCK]
        parallelism["pipeline_parallel_split_points"] = [
            f"layers.{blocks.index(s.first_layer)}" for s in plan.stages[1:]
        ]
        parallelism["pipeline_parallel_schedule"] = SCHEDULES[plan.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = plan.microbatch_size
    training = {
        "local_batch_size": local_batch_size(plan),
        "global_batch_size": global_batch(plan),
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
    }
    if problem.model.seq_len:
        training["seq_len"] = problem.model.seq_len
    mode = plan.stages[0].recompute
    checkpoint = {"mode": str(mode)}
    block = full_block_counts(problem, plan)
    if block is not None:  # nearest_expressible left what one n gives
        n = every_nth(block, blocks_per_chunk(problem, plan))
        checkpoint = {"mode": "selective", "selective_ac_option": str(n)}
    elif mode in (Recompute.SELECTIVE, Recompute.OP):
        checkpoint = {"mode": "selective", "selective_ac_option": "op"}
    sections = {"parallelism": parallelism, "training": training}
    sections["activation_checkpoint"] = checkpoint
    fp8 = fp8_sections(problem, plan)
    if fp8:
        if _compiles(problem, plan):
            training["compile"] = True
        sections = {"model": fp8.pop("model"), **sections, **fp8}
    return sections


def every_nth(full: list[int], counts: list[int]) -> int:
    """torchtitan's ``selective_ac_option = "n"`` for stages fully recomputing ``full[s]`` of
    their ``counts[s]`` blocks: it checkpoints a stage's ``n``-th, ``2n``-th, ... block, so
    ``counts[s] // n`` of them (``_apply_layer_sac`` in torchtitan/distributed/
    activation_checkpoint.py at v0.2.2, 73a0e69; removed after it by pytorch/torchtitan#2357,
    114151a); the largest ``n`` that checkpoints at least ``full[s]`` on every stage."""
    top = max(counts)
    return max(
        n for n in range(1, top + 1) if all(c // n >= k for k, c in zip(full, counts, strict=True))
    )


def _fsdp_float8_all_gather(problem: Problem, plan: Plan) -> bool:
    """FP8 weights all-gathered (module docstring): tensorwise only, with FSDP shards."""
    numerics = problem.training.numerics
    return (
        numerics.param_gather
        and numerics.recipe in (Fp8Recipe.DELAYED, Fp8Recipe.TENSORWISE)
        and data_parallel_modes(plan)[plan.zero_stage][SHARD] > 1
    )


def _compiles(problem: Problem, plan: Plan) -> bool:
    """``[training] compile`` with FP8, except where ``mx.py`` refuses it (mxfp8 with TP)."""
    return not (problem.training.numerics.recipe is Fp8Recipe.MXFP8 and plan.tp > 1)


def fp8_sections(problem: Problem, plan: Plan) -> dict:
    """``[model] converters`` and the ``[float8]`` or ``[mx]`` section; ``{}`` in BF16."""
    numerics = problem.training.numerics
    if not numerics.fp8:
        return {}
    filters = ["output"] + (["router.gate"] if problem.model.spec.is_moe else [])
    if numerics.recipe is Fp8Recipe.MXFP8:
        return {
            "model": {"converters": ["mx"]},
            "mx": {"recipe_name": "mxfp8", "filter_fqns": filters},
        }
    float8 = {"filter_fqns": filters}
    if numerics.recipe is Fp8Recipe.BLOCKWISE:
        float8["recipe_name"] = "rowwise"
    if _fsdp_float8_all_gather(problem, plan):
        float8["enable_fsdp_float8_all_gather"] = True
        float8["precompute_float8_dynamic_scale_for_fsdp"] = True
    return {"model": {"converters": ["float8"]}, "float8": float8}


def fp8_warnings(problem: Problem) -> list[str]:
    """What torchtitan runs differently in FP8 that no training setting can re-score."""
    numerics = problem.training.numerics
    if not numerics.fp8:
        return []
    out = []
    if numerics.recipe is Fp8Recipe.BLOCKWISE:
        out.append(
            "torchtitan has no blockwise (1x128 / 128x128) FP8 recipe: exported float8 "
            'recipe_name = "rowwise" (one scale per row), the nearest it has; the cost model has '
            "no rowwise recipe and the exported time is still blockwise's (torchao's published "
            "Llama3-8B runs on 8 H100 gained +10% with rowwise against +25% with tensorwise)"
        )
    if problem.model.spec.is_moe:
        out.append(
            "torchtitan's FP8 converters swap nn.Linear modules only: the routed experts "
            "(GroupedExperts) run in BF16 while the plan was scored with them in FP8 "
            "(float8.moe_fqns_prototype converts them rowwise: a prototype that needs pp = cp = 1)"
        )
    return out


def fp8_notes(problem: Problem, plan: Plan) -> list[str]:
    numerics = problem.training.numerics
    if not numerics.fp8:
        return []
    if numerics.recipe is Fp8Recipe.MXFP8:
        note = (
            "the mx converter needs an SM100 (Blackwell) GPU and a torchao nightly "
            "(components/quantization/mx.py)"
        )
        if not _compiles(problem, plan):
            note += "; it refuses torch.compile with tensor parallelism, so compile stays off"
        return [note]
    return [
        "[training] compile = true: torchtitan's float8 docs call torch.compile required for "
        "competitive performance (it fuses the scaling and cast kernels)"
    ]


SHAPE_FIELDS = [
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn_hidden",
    "attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "qk_norm",
    "window",
    "local_attention",
    "global_every",
    "activation",
    "norm",
    "num_experts",
    "top_k",
    "moe_ffn_hidden",
    "shared_experts",
    "shared_ffn_hidden",
    "first_dense_layers",
    "moe_layer_freq",
    "moe_layer_phase",
    "mtp_layers",
    "capacity_factor",
]


def shape_note(problem: Problem) -> list[str]:
    """The model fields the ``[model]`` flavor must have (its shape is Python, not TOML)."""
    spec = getattr(problem.model, "spec", None)
    if not isinstance(spec, ModelSpec):
        return []
    defaults = {f: ModelSpec.__dataclass_fields__[f].default for f in SHAPE_FIELDS}
    shown = [
        f"{f}={getattr(spec, f)}"
        for f in SHAPE_FIELDS
        if f in ("layers", "hidden", "heads", "ffn_hidden") or getattr(spec, f) != defaults[f]
    ]
    return [
        "torchtitan's job config cannot carry the model shape: [model] name and flavor select a "
        "Python model definition (torchtitan/models/<name>/), which must have "
        + ", ".join(shown)
        + (
            "; deepseek_v3's model args have the MLA ranks and head widths, n_dense_layers and "
            "n_shared_experts"
            if spec.attention == "mla" or spec.shared_experts or spec.first_dense_layers
            else ""
        )
    ]


def _batch_note(plan: Plan) -> str:
    m, b = plan.num_microbatches, plan.microbatch_size
    if plan.pp > 1:
        how = (
            f"the pipeline schedule splits local_batch_size {m * b} into {m} microbatches of "
            f"pipeline_parallel_microbatch_size {b} (one accumulation step)"
        )
    else:
        how = (
            f"torchtitan accumulates global_batch_size / (local_batch_size x dp) = "
            f"{global_batch(plan)} / ({b} x {plan.dp}) = {m} steps of {b}"
        )
    return f"each data-parallel rank runs {m} microbatches (microbatch size {b}) per step: {how}"


def framework_runs(problem: Problem, plan: Plan) -> dict:
    """What torchtitan runs of the training settings (module docstring)."""
    runs = {"grad_bytes": (4, "torchtitan reduces and keeps gradients in float32 only")}
    if plan.tp > 1:
        runs["tp_comm_overlap"] = (
            False,
            "enable_async_tensor_parallel is not turned on here (it also needs [training] compile)",
        )
    if plan.ep > 1:
        runs["ep_comm_overlap"] = (False, "torchtitan has no MoE all-to-all overlap")
        runs["moe_routing"] = ("dropless", "torchtitan's MoE router has no forced balancing")
        runs["moe_dispatcher"] = (
            "alltoall",
            "torchtitan's job config has no dispatcher option (its DeepEP backend is a model "
            "argument, moe_comm_backend, of the experiments' config registries)",
        )
    numerics = problem.training.numerics
    if numerics.fp8 and numerics.recipe is Fp8Recipe.DELAYED:
        runs["fp8_recipe"] = (
            "tensorwise",
            "torchtitan's float8 has no delayed scaling: dynamic tensorwise scaling",
        )
    if numerics.param_gather and not _fsdp_float8_all_gather(problem, plan):
        why = (
            "float8.enable_fsdp_float8_all_gather works only with FSDP shards (dp_shard > 1)"
            if numerics.recipe in (Fp8Recipe.DELAYED, Fp8Recipe.TENSORWISE)
            else "float8.py refuses enable_fsdp_float8_all_gather with a recipe_name (rowwise)"
            if numerics.recipe is Fp8Recipe.BLOCKWISE
            else "torchtitan's mx converter has no float8 all-gather"
        )
        runs["fp8_param_gather"] = (False, why)
    return runs


def export_torchtitan(problem: Problem, plan: Plan, report=None, replan=None):
    exported, issues = nearest_expressible(problem, plan)
    sections = torchtitan_sections(problem, exported)
    lines = [f"# torchtitan job config sections for {plan.solver or 'the plan'} ({CHECKED})"]
    for name, values in sections.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
    notes = [
        *shape_note(problem),
        *fp8_notes(problem, exported),
        f"run on {exported.devices_used} ranks (NGPU x nodes); rank r runs on "
        f"{where_ranks_run(exported)}; blocks per stage {blocks_per_chunk(problem, exported)}; "
        "split points name torchtitan's 'layers.N' blocks",
        *allocation_notes(problem, plan, exported),
        _batch_note(exported),
        "TOML job configs are read by torchtitan up to v0.2.2; later versions (PR #2386) take "
        "the same settings in a Python config",
    ]
    warnings = fp8_warnings(problem)
    if exported.schedule is Schedule.DUALPIPE_V:
        warnings.append(
            "DualPipeV: torch.distributed.pipelining runs each OVERLAP_F_B action's forward and "
            "backward one after the other unless a function is registered for it "
            "(schedule.register_custom_function; torchtitan's graph_trainer experiment does); "
            "the evaluated plan counts them overlapped, and needs torchtitan from b5bcd76c66d0 "
            "on to place the stages in a V"
        )
    m = exported.num_microbatches
    if exported.pp == 1 and m > 1 and exported.dp * exported.cp > 1 and exported.zero_stage < 3:
        warnings.append(
            f"torchtitan synchronises gradients (and FSDP gathers weights) in each of the {m} "
            f"accumulation steps (its loop has no no_sync); the evaluated "
            f"ZeRO-{exported.zero_stage} plan counts one synchronisation per iteration"
        )
    elif exported.pp == 1 and m > 1 and exported.zero_shard is not None:
        warnings.append(
            f"torchtitan all-reduces the gradient shards across the "
            f"{exported.config.zero_replicas} HSDP replicas in each of the {m} accumulation "
            "steps (its loop does not call FSDP2's set_requires_all_reduce(False)); the "
            "evaluated plan counts one all-reduce per iteration"
        )
    return finish_export(
        problem,
        plan,
        exported,
        issues,
        target="torchtitan",
        checked_against=CHECKED,
        filename="torchtitan.toml",
        text="\n".join(lines) + "\n",
        notes=notes,
        report=report,
        warnings=warnings,
        runs=framework_runs(problem, exported),
    )
