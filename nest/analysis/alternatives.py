"""The K best configurations of a run (``solver.top_k=K``): ``report.json["alternatives"]`` and the
summary's table.

Two plans are alternatives of *different configurations* when their
:meth:`~nest.core.plan.ParallelConfig.unordered` configurations differ: ``tp, cp, ep, dp, pp``,
microbatch size, ZeRO stage, hybrid shard degree, schedule or virtual stages. The rank order
(the placement), the layer partition and the recompute modes are chosen per configuration: each
alternative is the best plan of its configuration. Every entry is scored by the shared
evaluator, like the chosen plan.
"""

from nest.core.axes import Schedule
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.report import Report
from nest.core.serialize import report_to_dict
from nest.core.units import GiB

CONFIG_FIELDS = (
    "tp",
    "cp",
    "ep",
    "dp",
    "pp",
    "microbatch_size",
    "zero_stage",
    "zero_shard",
    "optimizer_offload",
    "activation_offload",
    "schedule",
    "virtual_stages",
)
"""What makes two alternatives distinct (module docstring)."""

_SHORT = {
    "microbatch_size": "mbs",
    "zero_stage": "ZeRO",
    "zero_shard": "shard",
    "optimizer_offload": "optimizer offload",
    "activation_offload": "activation offload",
    "virtual_stages": "v",
    "rank_order": "order",
}


def _value(plan: Plan, name: str):
    if name == "schedule":
        return str(plan.schedule)
    if name == "rank_order":
        return ",".join(str(a) for a in plan.rank_order) if plan.rank_order else None
    if name == "layer_partition":
        return [len(s.layers) for s in plan.stages]
    if name == "recompute":
        return [s.recompute_label for s in plan.stages]
    return getattr(plan, name)


def differs(best: Plan, plan: Plan) -> dict:
    """``{field: [best's value, this plan's value]}`` for every configuration field, the rank
    order, the layer partition (layers per stage) and the recompute modes that differ."""
    out = {}
    for name in (*CONFIG_FIELDS, "rank_order", "layer_partition", "recompute"):
        a, b = _value(best, name), _value(plan, name)
        if a != b:
            out[name] = [a, b]
    return out


def describe(plan: Plan) -> str:
    """A configuration in a few words: ``tp8 dp4 pp2 mbs1 ZeRO-1 1f1b`` (degrees of 1 left out,
    but tp and dp always shown; hybrid sharding as ``ZeRO-3/8``, sharded within groups of 8)."""
    parts = [
        f"{name}{getattr(plan, name)}"
        for name in ("tp", "cp", "ep", "dp", "pp")
        if name in ("tp", "dp") or getattr(plan, name) > 1
    ]
    schedule = str(plan.schedule)
    if plan.schedule is Schedule.INTERLEAVED:
        schedule += f" v{plan.virtual_stages}"
    zero = f"ZeRO-{plan.zero_stage}" + (f"/{plan.zero_shard}" if plan.zero_shard else "")
    zero += "+offload" if plan.optimizer_offload else ""
    zero += " act-offload" if plan.activation_offload else ""
    zero += f"({plan.activation_offload_blocks} blocks)" if plan.activation_offload_blocks else ""
    return " ".join([*parts, f"mbs{plan.microbatch_size}", zero, schedule])


def alternatives_to_dict(plans: list[Plan], reports: list[Report]) -> list[dict]:
    """``report.json["alternatives"]``: per plan (best first) its rank, iteration time, slowdown
    against the first (``T / T_1 - 1``), what differs from the first, and the rest of its report
    (``plan``, memory, throughput, MFU, ``breakdown``; the search record is the run's, held once
    at the top of ``report.json``)."""
    best_plan, best = plans[0], reports[0]
    out = []
    for rank, (plan, report) in enumerate(zip(plans, reports, strict=True), start=1):
        rest = {k: v for k, v in report_to_dict(plan, report).items() if k != "search"}
        out.append(
            {
                "rank": rank,
                "iteration_time_s": report.iteration_time_s,
                "slowdown_vs_best": report.iteration_time_s / best.iteration_time_s - 1.0,
                "differs": differs(best_plan, plan),
                **rest,
            }
        )
    return out


def seconds_text(t: float) -> str:
    """Seconds for a table: four decimals, or three significant digits below 10 ms."""
    return f"{t:.4f}" if t >= 0.01 else f"{t:.3e}"


def _differs_text(entry: dict) -> str:
    if entry["rank"] == 1:
        return "(the chosen plan)"
    words = []
    for name, (_, this) in entry["differs"].items():
        if name in ("layer_partition", "recompute"):
            continue
        words.append(f"{_SHORT.get(name, name)} {this}")
    return ", ".join(words)


def format_alternatives(problem: Problem, entries: list[dict]) -> str:
    """The summary's table of the K best configurations."""
    capacity = problem.cluster.device.hbm_bytes
    head = (
        f"top {len(entries)} configurations (each with its best rank order, partition and "
        "recompute; scored by evaluate):"
    )
    lines = [
        head,
        f"{'rank':>4} {'iter s':>10} {'vs best':>8} {'tp':>3} {'cp':>3} {'ep':>3} {'dp':>5} "
        f"{'pp':>3} {'mbs':>4} {'ZeRO':>4} {'schedule':<14} {'mem GiB':>8}  differs from rank 1",
    ]
    for e in entries:
        p = e["plan"]
        schedule = p["schedule"] + (
            f" v{p['virtual_stages']}" if p["schedule"] == str(Schedule.INTERLEAVED) else ""
        )
        slower = "-" if e["rank"] == 1 else f"{100 * e['slowdown_vs_best']:+.2f}%"
        time_s = seconds_text(e["iteration_time_s"])
        lines.append(
            f"{e['rank']:>4} {time_s:>10} {slower:>8} {p['tp']:>3} {p['cp']:>3} {p['ep']:>3} "
            f"{p['dp']:>5} {p['pp']:>3} {p['microbatch_size']:>4} "
            f"{p['zero_stage']:>4} {schedule:<14} {e['peak_memory_bytes'] / GiB:>8.2f}  "
            f"{_differs_text(e)}"
        )
    lines.append(f"(memory of {capacity / GiB:.2f} GiB per device)")
    return "\n".join(lines)
