"""A plan as the parallelism part of a torchtitan job config (TOML).

Field names checked against ``torchtitan/config/job_config.py`` of pytorch/torchtitan at commit
000204a4a8bf (2025): ``[parallelism]`` ``data_parallel_replicate_degree``,
``data_parallel_shard_degree``, ``fsdp_reshard_after_forward`` (``default|always|never``),
``tensor_parallel_degree``, ``context_parallel_degree``, ``expert_parallel_degree`` (constraint
``cp <= ep <= dp_shard * cp``), ``pipeline_parallel_degree``, ``pipeline_parallel_split_points``
(module names starting each stage after the first, e.g. ``layers.4``),
``pipeline_parallel_schedule`` (``1F1B``, ``Interleaved1F1B``, ``GPipe``),
``pipeline_parallel_microbatch_size``; ``[training]`` ``local_batch_size``, ``global_batch_size``,
``seq_len``; ``[activation_checkpoint]`` ``mode`` (``none|selective|full``) and
``selective_ac_option``. The mesh (``torchtitan/distributed/parallel_dims.py``) is
``[pp, dp_replicate, dp_shard, cp, tp]``, outermost first: our rank order ``tp,cp,dp,pp``.

Mapping: ZeRO-0 = DDP (``data_parallel_replicate_degree = dp``); ZeRO-3 = FSDP2
(``data_parallel_shard_degree = dp``, reshard after forward ``always``, as our model gathers the
weights again for the backward pass). ZeRO-1 and ZeRO-2 have no torchtitan equivalent: nearest =
the better of ZeRO-0 and ZeRO-3 by the shared evaluator (a plan that fits first). One recompute
mode for all stages (nearest: the strongest mode used); selective maps to torchtitan's per-op
selective checkpointing, whose saved set differs from the cost model's attention-core recompute.
Stages after the first must start with a transformer block (a split point); a stage holding only
the head is moved one block back.
"""

from nest.axes import Axis, LayerKind, Recompute, Schedule
from nest.cost import evaluate
from nest.export.common import (
    blocks_per_chunk,
    finish_export,
    global_batch,
    placement_order,
    rebuild,
    strongest_recompute,
)
from nest.plan import Plan
from nest.problem import Problem

CHECKED = "pytorch/torchtitan torchtitan/config/job_config.py @ 000204a4a8bf (2025)"
ORDER = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
SCHEDULES = {
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.INTERLEAVED: "Interleaved1F1B",
    Schedule.GPIPE: "GPipe",
}


def _ep_ok(plan: Plan, zero: int) -> bool:
    shard = plan.dp if zero == 3 else 1
    return plan.ep == 1 or plan.cp <= plan.ep <= shard * plan.cp


def _split_ok(problem: Problem, plan: Plan) -> list[int] | None:
    """Layer counts with every stage after the first starting at a block (None: already so)."""
    chain = problem.model.chain
    counts = [s.last_layer - s.first_layer + 1 for s in plan.stages]
    bad = [
        k
        for k in range(1, len(counts))
        if chain[plan.stages[k].first_layer].kind is not LayerKind.BLOCK
    ]
    if not bad:
        return None
    for k in bad:
        if counts[k - 1] > 1:
            counts[k - 1] -= 1
            counts[k] += 1
    return counts


def nearest_expressible(problem: Problem, plan: Plan) -> tuple[Plan, list[str]]:
    issues, changes = [], {}
    if len({s.recompute for s in plan.stages}) > 1:
        strongest = strongest_recompute(plan)
        issues.append(f"per-stage recompute (used {strongest} everywhere)")
        changes["recompute"] = [strongest] * len(plan.stages)
    if placement_order(plan, (ORDER,)) is None:
        issues.append("a rank order other than torchtitan's mesh pp,dp,cp,tp (used it)")
        changes["rank_order"] = ORDER
    counts = _split_ok(problem, plan)
    if counts is not None:
        issues.append("a stage that starts without a transformer block (moved one block into it)")
        changes["layer_counts"] = counts
    zero_ok = plan.zero_stage in (0, 3) and _ep_ok(plan, plan.zero_stage)
    if not zero_ok:
        candidates = [z for z in (0, 3) if _ep_ok(plan, z)] or [3]
        scored = []
        for z in candidates:
            option = rebuild(plan, zero_stage=z, **changes)
            report = evaluate(problem, option)
            scored.append((not report.feasible, report.iteration_time_s, z))
        best = min(scored)[2]
        if best != plan.zero_stage:
            issues.append(
                f"ZeRO-{plan.zero_stage} (torchtitan has DDP = ZeRO-0 and FSDP = ZeRO-3"
                + (f" and needs cp <= ep <= dp_shard x cp for ep={plan.ep}" if plan.ep > 1 else "")
                + f"; used ZeRO-{best})"
            )
            changes["zero_stage"] = best
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


def torchtitan_sections(problem: Problem, plan: Plan) -> dict:
    chain = problem.model.chain
    fsdp = plan.zero_stage == 3
    parallelism = {
        "data_parallel_replicate_degree": 1 if fsdp else plan.dp,
        "data_parallel_shard_degree": plan.dp if fsdp else 1,
        "tensor_parallel_degree": plan.tp,
        "context_parallel_degree": plan.cp,
        "expert_parallel_degree": plan.ep,
        "pipeline_parallel_degree": plan.pp,
    }
    if fsdp:
        parallelism["fsdp_reshard_after_forward"] = "always"
    if plan.pp > 1:
        blocks = [i for i, ref in enumerate(chain) if ref.kind is LayerKind.BLOCK]
        parallelism["pipeline_parallel_split_points"] = [
            f"layers.{blocks.index(s.first_layer)}" for s in plan.stages[1:]
        ]
        parallelism["pipeline_parallel_schedule"] = SCHEDULES[plan.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = plan.microbatch_size
    training = {
        "local_batch_size": plan.microbatch_size * plan.num_microbatches,
        "global_batch_size": global_batch(plan),
    }
    if problem.model.seq_len:
        training["seq_len"] = problem.model.seq_len
    mode = plan.stages[0].recompute
    checkpoint = {"mode": str(mode)}
    if mode is Recompute.SELECTIVE:
        checkpoint["selective_ac_option"] = "op"
    return {"parallelism": parallelism, "training": training, "activation_checkpoint": checkpoint}


def export_torchtitan(problem: Problem, plan: Plan, report=None):
    exported, issues = nearest_expressible(problem, plan)
    sections = torchtitan_sections(problem, exported)
    lines = [f"# torchtitan job config sections for {plan.solver or 'the plan'} ({CHECKED})"]
    for name, values in sections.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
    notes = [
        f"run on {exported.devices_used} ranks (NGPU x nodes); blocks per stage "
        f"{blocks_per_chunk(problem, exported)}; split points name torchtitan's 'layers.N' blocks"
    ]
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
    )
