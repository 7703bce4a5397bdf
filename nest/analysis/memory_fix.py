"""What to change when a plan does not fit: the ``memory fix:`` line of the summary and of a
planner's out-of-memory error.

The line names the largest term of the worst pipeline rank's memory
(:meth:`nest.core.report.MemoryReport.terms`) and the cheapest single knob that makes the plan
fit, with the memory it saves on that rank. Each knob is the plan with one setting changed,
scored by the shared evaluator (never a formula of its own):

- ``recompute=full`` on every stage (stores only each block's input);
- the next ZeRO stage (shards the optimizer state, then the gradients, then the weights);
- a microbatch half the size (half the stored activations per microbatch, twice as many
  microbatches: the global batch is unchanged).

"Cheapest" is the shortest iteration among the knobs that fit; when none fits alone, the line
gives the one that saves the most and what is still missing.
"""

from collections.abc import Iterator
from dataclasses import replace

from nest.core.axes import Recompute
from nest.core.errors import UserError
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.report import MemoryReport, Report
from nest.core.units import GiB
from nest.cost import evaluate

TERM_NAMES = {
    "weights": "weights",
    "fp8_copies": "FP8 weight copies",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "stored activations",
    "comm_buffers": "communication buffers",
    "transient": "transient buffers",
    "reserve": "reserve",
}
"""How the summary names each :meth:`MemoryReport.terms` key."""


def worst_rank_memory(report: Report) -> tuple[int, MemoryReport]:
    """The pipeline rank furthest over (or least under) its capacity, and its memory."""
    worst = max(report.ranks, key=lambda r: r.memory.total_bytes - r.memory.capacity_bytes)
    return worst.pp_rank, worst.memory


def largest_term(memory: MemoryReport) -> tuple[str, float]:
    """The largest of the memory's terms (reserve excluded: no knob of a plan moves it)."""
    terms = {k: v for k, v in memory.terms().items() if k != "reserve"}
    name = max(terms, key=terms.get)
    return name, terms[name]


def knobs(plan: Plan) -> Iterator[tuple[str, Plan]]:
    """The plans one setting away from ``plan`` that may need less memory (module docstring)."""
    if any(s.recompute is not Recompute.FULL for s in plan.stages):
        stages = tuple(replace(s, recompute=Recompute.FULL) for s in plan.stages)
        yield "recompute=full on every stage", replace(plan, stages=stages)
    if plan.zero_stage < 3:
        z = plan.zero_stage + 1
        yield f"ZeRO stage {z}", replace(plan, config=replace(plan.config, zero_stage=z))
    b = plan.microbatch_size
    if b > 1 and b % 2 == 0:
        yield (
            f"microbatch size {b // 2} ({2 * plan.num_microbatches} microbatches)",
            replace(
                plan,
                config=replace(plan.config, microbatch_size=b // 2),
                num_microbatches=2 * plan.num_microbatches,
            ),
        )


def memory_fix(problem: Problem, plan: Plan, report: Report) -> str | None:
    """The ``memory fix:`` line of a plan that does not fit (None when it fits)."""
    if report.feasible:
        return None
    rank, memory = worst_rank_memory(report)
    term, term_bytes = largest_term(memory)
    short = memory.total_bytes - memory.capacity_bytes
    head = (
        f"memory fix: pipeline rank {rank} is {short / GiB:.2f} GiB over; its largest term is "
        f"{TERM_NAMES[term]} ({term_bytes / GiB:.2f} GiB)"
    )
    scored = []
    for label, changed in knobs(plan):
        try:
            after = evaluate(problem, changed)
        except UserError:
            continue  # a knob the configuration does not admit
        saved = memory.total_bytes - worst_rank_memory(after)[1].total_bytes
        scored.append((label, after, saved))
    fitting = [k for k in scored if k[1].feasible]
    if fitting:
        label, after, saved = min(fitting, key=lambda k: k[1].iteration_time_s)
        return (
            f"{head}; cheapest knob that fits: {label}, saves {saved / GiB:.2f} GiB "
            f"(iteration {report.iteration_time_s:.3f} s -> {after.iteration_time_s:.3f} s)"
        )
    if scored:
        label, after, saved = max(scored, key=lambda k: k[2])
        still = max(r.memory.total_bytes - r.memory.capacity_bytes for r in after.ranks)
        return (
            f"{head}; no single knob fits: {label} saves the most, {saved / GiB:.2f} GiB, "
            f"{still / GiB:.2f} GiB still missing: add devices (more tp / pp / dp) or use a "
            "larger-memory device"
        )
    return f"{head}; add devices (more tp / pp / dp) or use a larger-memory device"
