"""What every export shares: the plan's facts in a target's terms, and the nearest expressible plan.

A target (Megatron-LM, torchtitan) can express only part of the plan space. An exporter lists what
it cannot express as *issues*, each with the change that makes the plan expressible; the changed
plan is built with :func:`rebuild` and scored with the shared evaluator, so the warning can say what
the exported plan costs next to the chosen one.
"""

from dataclasses import dataclass, field, replace

import numpy as np

from nest.core.axes import Axis, LayerKind, Recompute, Schedule
from nest.core.layers import AnalyticModel
from nest.core.plan import BlockRecompute, Plan, make_structured_plan, place
from nest.core.problem import Problem
from nest.core.report import Report
from nest.core.segment import segment_allocation
from nest.cost import evaluate

RECOMPUTED = {
    Recompute.NONE: frozenset(),
    Recompute.SELECTIVE: frozenset({"core_attn"}),
    Recompute.MLP: frozenset({"mlp"}),
    Recompute.SELECTIVE_MLP: frozenset({"core_attn", "mlp"}),
    Recompute.OP: frozenset({"every_second_mm", "elementwise"}),
    Recompute.FULL: frozenset({"core_attn", "mlp", "rest"}),
    Recompute.DOTS: frozenset({"core_attn", "elementwise"}),
    Recompute.MLA_UP: frozenset({"mla_up_proj"}),
    Recompute.MLP_MOE: frozenset({"mlp", "moe"}),
    Recompute.MLA_UP_MLP_MOE: frozenset({"mla_up_proj", "mlp", "moe"}),
    Recompute.QKV_PROJ: frozenset({"core_attn", "elementwise", "out_proj", "mlp_in"}),
    Recompute.QKV_OUT_PROJ: frozenset({"core_attn", "elementwise", "mlp_in"}),
    Recompute.NOTHING_SAVEABLE: frozenset(
        {"core_attn", "elementwise", "qkv_proj", "out_proj", "mlp_in"}
    ),
}
"""What each mode recomputes (``rest``: everything else of the block, full recompute only;
``op``: every second matmul and all elementwise work, :func:`nest.core.blocks.op_sac_inventory`;
``dots``: the attention core and the elementwise work, :func:`nest.core.blocks.dots_inventory`;
``mlp``/``moe``: Megatron-Core's modules of those names, the whole dense MLP / MoE layer;
``qkv_proj``/``qkv_out_proj``: JAX's named policies, the attention core, the elementwise work,
the MLP's first GEMMs (``mlp_in``; a MoE layer's routed experts) and, without ``out_proj`` kept,
the output projection, :meth:`nest.core.layers.AnalyticModel._named_recompute`;
``nothing_saveable``: JAX's remat with no saveable value, all of that and the Q/K/V
projections: everything of the block but FC2)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Export:
    """A plan in a target's terms; ``text`` is what the user pastes."""

    target: str
    checked_against: str
    """Upstream source and version the flag names were checked against."""
    filename: str
    text: str
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    plan_iteration_time_s: float
    exported_iteration_time_s: float
    """The evaluated iteration time of the plan ``text`` expresses (the chosen plan's when it is
    expressible, else the nearest expressible plan's)."""
    exported_feasible: bool
    exported_plan: dict = field(default_factory=dict)
    """Degrees and stages of the exported plan (as in report.json)."""
    framework_differences: dict = field(default_factory=dict)
    """Training settings the score assumed that the exported arguments cannot carry:
    ``{setting: {"scored": value, "framework": value, "why": text}}``; the exported iteration time
    is evaluated under the framework's values."""
    runnable_option: dict = field(default_factory=dict)
    """When the plan is not expressible and the planner could re-plan inside what the target runs:
    ``{"option": "solver.export_runnable=...", "iteration_time_s": ..., "plan": {...}}``."""

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "checked_against": self.checked_against,
            "file": self.filename,
            "text": self.text,
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "plan_iteration_time_s": self.plan_iteration_time_s,
            "exported_iteration_time_s": self.exported_iteration_time_s,
            "exported_feasible": self.exported_feasible,
            "exported_plan": self.exported_plan,
            "framework_differences": self.framework_differences,
            "runnable_option": self.runnable_option,
        }


def blocks_per_chunk(problem: Problem, plan: Plan) -> list[int]:
    chain = problem.model.chain
    return [sum(chain[i].kind is LayerKind.BLOCK for i in s.layers) for s in plan.stages]


def has_kind(problem: Problem, plan: Plan, k: int, kind: LayerKind) -> bool:
    chain = problem.model.chain
    return any(chain[i].kind is kind for i in plan.stages[k].layers)


def allocation(plan: Plan) -> np.ndarray:
    """The devices the plan uses, in increasing id: rank ``r`` of a launch runs on entry ``r``
    (a job allocated a set of devices numbers its ranks over them in order, e.g. Slurm's
    segments of each NVLink domain: nest/core/segment.py)."""
    return np.unique(np.concatenate([np.asarray(s.devices).ravel() for s in plan.stages]))


def _ranges(ids, shown: int = 4) -> str:
    """Sorted device ids as runs ``a-b``, the first ``shown`` of them (``...`` for the rest)."""
    ids = [int(x) for x in ids]
    runs, start, prev = [], ids[0], ids[0]
    for cur in ids[1:]:
        if cur != prev + 1:
            runs.append((start, prev))
            start = cur
        prev = cur
    runs.append((start, prev))
    text = [f"{a}-{b}" if b > a else f"{a}" for a, b in runs]
    return ",".join(text[:shown]) + (",..." if len(text) > shown else "")


def where_ranks_run(exported: Plan) -> str:
    """Where rank ``r`` of a launch of the exported plan runs: a contiguous range of devices, or
    the ``r``-th of the devices it uses (:func:`allocation`: a segment plan skips the spare devices
    of each scale-up domain, :mod:`nest.core.segment`)."""
    used = allocation(exported)
    if int(used[-1]) - int(used[0]) + 1 == exported.devices_used:
        return f"device {int(used[0])} + r of the cluster" if used[0] else "device r of the cluster"
    return f"the r-th device the plan uses, in increasing id ({_ranges(used)})"


def allocation_notes(problem: Problem, plan: Plan, exported: Plan) -> list[str]:
    """What a launcher must allocate for every export: the devices left idle, and for a plan of
    the segment view (``plan.search["segment_chosen"]``) the Slurm segments that put each
    domain's first devices in the job (docs/plan/presets.md, GB200 NVL72: segments)."""
    notes = []
    idle = problem.cluster.num_devices - exported.devices_used
    if idle > 0:
        notes.append(f"{idle} devices of the cluster stay idle")
    where = segment_allocation(plan.search)
    if where:
        size = plan.search["segment_devices_per_domain"]
        notes.append(
            f"allocate {where}: Slurm's topology/block plugin with --segment = {size} / "
            "(GPUs per node) nodes; docs/plan/presets.md"
        )
    return notes


def placement_order(plan: Plan, candidates) -> tuple[Axis, ...] | None:
    """The first candidate rank order whose layout over the plan's :func:`allocation` (its
    ranks numbered over the devices it uses, in increasing id) is exactly the plan's placement;
    ``None`` when no candidate gives it."""
    actual = np.stack([np.asarray(s.devices) for s in plan.stages[: plan.pp]])
    ranks = np.searchsorted(allocation(plan), actual)
    for order in candidates:
        grid = place(tp=plan.tp, cp=plan.cp, dp=plan.dp, pp=plan.pp, rank_order=order)
        if np.array_equal(grid, ranks):
            return tuple(order)
    return None


def rebuild(
    plan: Plan,
    *,
    rank_order=None,
    recompute=None,
    zero_stage=None,
    schedule=None,
    virtual_stages=None,
    layer_counts=None,
    ep=None,
    whole_experts=None,
    optimizer_offload=None,
    activation_offload=None,
    hybrid: bool = True,
) -> Plan:
    """The plan with some choices changed (placement rebuilt from ``rank_order`` over the plan's
    :func:`allocation`: the degrees, hence the devices used, do not change).
    ``hybrid`` False drops hybrid sharding (:attr:`nest.core.plan.ParallelConfig.zero_shard`),
    as does ZeRO-0, which shards nothing."""
    counts = layer_counts or [s.last_layer - s.first_layer + 1 for s in plan.stages]
    v = virtual_stages or plan.virtual_stages
    modes = recompute or [s.recompute_choice for s in plan.stages]
    if len(modes) != len(counts):
        modes = [modes[0]] * len(counts)
    zero = plan.zero_stage if zero_stage is None else zero_stage
    config = replace(
        plan.config,
        zero_shard=plan.zero_shard if hybrid and zero > 0 else None,
        ep=plan.ep if ep is None else ep,
        etp=plan.etp if whole_experts is None else (1 if whole_experts else None),
        zero_stage=plan.zero_stage if zero_stage is None else zero_stage,
        schedule=Schedule(schedule or plan.schedule),
        virtual_stages=v,
        rank_order=tuple(rank_order or plan.rank_order or (Axis.TP, Axis.CP, Axis.DP, Axis.PP)),
        optimizer_offload=(
            plan.optimizer_offload if optimizer_offload is None else optimizer_offload
        ),
        activation_offload=(
            plan.activation_offload if activation_offload is None else activation_offload
        ),
        activation_offload_blocks=(
            plan.activation_offload_blocks if activation_offload is not False else None
        ),
    )
    order = place(tp=plan.tp, cp=plan.cp, dp=plan.dp, pp=plan.pp, rank_order=config.rank_order)
    return make_structured_plan(
        config,
        layer_counts=counts,
        recompute=modes,
        num_microbatches=plan.num_microbatches,
        sequence_parallel=plan.sequence_parallel,
        grid=allocation(plan)[order],
    ).with_record(solver=plan.solver, status=plan.status)


def full_block_counts(problem: Problem, plan: Plan) -> list[int] | None:
    """Per stage, how many blocks it fully recomputes, when every stage holding blocks runs
    its other blocks without recompute (``none`` with :attr:`~nest.core.plan.StagePlan.
    full_blocks`, or ``full``: all of them) and some stage mixes the two (what Megatron's
    ``--recompute-method block`` and torchtitan's every-n-blocks option express); None
    otherwise."""
    counts = blocks_per_chunk(problem, plan)
    if not any(s.full_blocks for s in plan.stages):
        return None
    out = []
    for s, n in zip(plan.stages, counts, strict=True):
        if s.recompute is Recompute.FULL:
            out.append(n)
        elif s.recompute is Recompute.NONE or not n:
            out.append(min(s.full_blocks, n))
        else:
            return None
    return out


def block_choices(problem: Problem, plan: Plan, per_stage) -> list:
    """Recompute choices fully recomputing ``per_stage[s]`` blocks of stage ``s`` and none of
    its others (``full`` when that is all of them)."""
    counts = blocks_per_chunk(problem, plan)
    return [
        Recompute.FULL
        if n and k >= n
        else BlockRecompute(Recompute.NONE, k)
        if k
        else Recompute.NONE
        for k, n in zip(per_stage, counts, strict=True)
    ]


def strongest_recompute(plan: Plan) -> Recompute:
    """The one mode for every stage that recomputes everything any stage's mode recomputes
    (so it stores at most what each stage stored): ``selective`` with ``mlp`` is
    ``selective_mlp``; ``op`` with any other mode but ``none`` is ``full`` (no mode holds
    both)."""
    union = frozenset().union(
        *(RECOMPUTED[Recompute.FULL if s.full_blocks else s.recompute] for s in plan.stages)
    )
    return next((mode for mode, parts in RECOMPUTED.items() if parts == union), Recompute.FULL)


def describe(plan: Plan, counts: list[int]) -> str:
    modes = sorted({s.recompute_label for s in plan.stages})
    return (
        f"tp={plan.tp} cp={plan.cp} ep={plan.ep} dp={plan.dp} pp={plan.pp}"
        + (f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else "")
        + f", blocks per stage {counts}, recompute {'/'.join(modes)}, ZeRO-{plan.zero_stage}, "
        f"{plan.schedule}, rank order {','.join(str(a) for a in plan.rank_order or ())}"
    )


def plan_summary(problem: Problem, plan: Plan) -> dict:
    return {
        **plan.degrees(),
        "virtual_stages": plan.virtual_stages,
        "microbatch_size": plan.microbatch_size,
        "num_microbatches": plan.num_microbatches,
        "zero_stage": plan.zero_stage,
        "optimizer_offload": plan.optimizer_offload,
        "activation_offload": plan.activation_offload,
        "activation_offload_blocks": plan.activation_offload_blocks,
        "zero_shard": plan.zero_shard,
        "schedule": str(plan.schedule),
        "rank_order": [str(a) for a in plan.rank_order] if plan.rank_order else None,
        "blocks_per_stage": blocks_per_chunk(problem, plan),
        "recompute": [s.recompute_label for s in plan.stages],
    }


def framework_problem(problem: Problem, runs: dict) -> tuple[Problem, dict]:
    """The problem under what the framework runs, and the differences from the scored one.

    ``runs`` maps a :class:`~nest.core.problem.Training` setting to ``(value the framework runs
    with the exported arguments, why)``; a setting equal to the scored one is no difference. The
    analytic layer model is rebuilt for the overlap and precision settings it carries; a measured
    profile keeps its own (its timings are what they are)."""
    training = problem.training
    diffs = {
        name: {"scored": getattr(training, name), "framework": value, "why": why}
        for name, (value, why) in (runs or {}).items()
        if getattr(training, name) != value
    }
    if not diffs:
        return problem, {}
    ran = replace(training, **{name: d["framework"] for name, d in diffs.items()})
    model = problem.model
    if isinstance(model, AnalyticModel):
        model = AnalyticModel(
            model.spec,
            flash_attention=model.flash_attention,
            fused_loss=ran.fused_loss,
            cross_entropy_loss_fusion=ran.cross_entropy_loss_fusion,
            overlap=ran.overlap,
            precision=ran.numerics,
            moe_routing=ran.moe_routing,
            moe_dispatcher=ran.moe_dispatcher,
        )
    return replace(problem, training=ran, model=model), diffs


def _differences_warning(target: str, diffs: dict, got, base) -> str:
    said = "; ".join(
        f"{name}={d['framework']} where the plan was scored with {d['scored']} ({d['why']})"
        for name, d in diffs.items()
    )
    return (
        f"{target} runs the exported arguments with {said}: evaluated iteration "
        f"{got.iteration_time_s:.4f} s vs {base.iteration_time_s:.4f} s as scored "
        f"({got.iteration_time_s / base.iteration_time_s:.3f}x)"
        + ("" if got.feasible else f"; it does NOT fit: {got.violation}")
    )


def _runnable_option(problem, got, option: str, replanned: Plan | None) -> dict:
    """The re-planned plan inside what the target runs, scored under the framework's settings."""
    if replanned is None:
        return {}
    again = evaluate(problem, replanned)
    return {
        "option": option,
        "iteration_time_s": again.iteration_time_s,
        "feasible": again.feasible,
        "fallback_vs_option": got.iteration_time_s / again.iteration_time_s,
        "plan": plan_summary(problem, replanned),
    }


def finish_export(
    problem: Problem,
    plan: Plan,
    exported: Plan,
    issues: list[str],
    *,
    target: str,
    checked_against: str,
    filename: str,
    text: str,
    notes: list[str],
    report: Report | None = None,
    warnings: list[str] = (),
    runs: dict | None = None,
    option: str | None = None,
    replan=None,
) -> Export:
    """Score the exported plan and phrase the warning when it differs from the chosen one;
    ``warnings`` are further ones (what the target may refuse or run differently).

    ``runs`` is what the framework runs of the training settings (:func:`framework_problem`); the
    exported plan is scored under it, so ``exported_iteration_time_s`` is what the exported
    arguments run. ``option`` names the solver option that keeps the search inside what the
    target runs; ``replan(option)`` (when given) returns the plan the planner finds with it, which
    the warning prices next to the fallback."""
    base = report or evaluate(problem, plan)
    ran, diffs = framework_problem(problem, runs)
    warnings = list(warnings)
    found = {}
    if issues:
        got = evaluate(ran, exported)
        ratio = got.iteration_time_s / base.iteration_time_s
        fit = "" if got.feasible else f"; it does NOT fit: {got.violation}"
        head = (
            f"{target} cannot express this plan: {'; '.join(issues)}. Exported the nearest "
            f"expressible plan instead ({describe(exported, blocks_per_chunk(problem, exported))})"
            f": evaluated iteration {got.iteration_time_s:.4f} s vs {base.iteration_time_s:.4f} s "
            f"for the chosen plan ({ratio:.3f}x){fit}"
        )
        if option:
            replanned = replan(option) if replan is not None else None
            found = _runnable_option(ran, got, option, replanned)
            if found:
                head += (
                    f". Re-planning with {option} keeps the search inside what {target} runs: "
                    f"{found['iteration_time_s']:.4f} s "
                    f"({found['iteration_time_s'] / base.iteration_time_s:.3f}x the chosen plan; "
                    f"this fallback is {found['fallback_vs_option']:.3f}x that)"
                )
            else:
                head += f". Re-plan with {option} to search only plans {target} runs"
        warnings.insert(0, head)
    else:
        got = evaluate(ran, exported) if diffs else base
    if diffs:
        warnings.insert(1 if issues else 0, _differences_warning(target, diffs, got, base))
    return Export(
        target=target,
        checked_against=checked_against,
        filename=filename,
        text=text,
        warnings=tuple(warnings),
        notes=tuple(notes),
        plan_iteration_time_s=base.iteration_time_s,
        exported_iteration_time_s=got.iteration_time_s,
        exported_feasible=got.feasible,
        exported_plan=plan_summary(problem, exported),
        framework_differences=diffs,
        runnable_option=found,
    )


def global_batch(plan: Plan) -> int:
    return plan.microbatch_size * plan.num_microbatches * plan.dp


def is_gpipe(plan: Plan) -> bool:
    return plan.schedule is Schedule.GPIPE
