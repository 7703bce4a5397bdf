"""Discrete-event simulation of one training iteration of a plan.

The analytic pipeline formula of the cost model (``sum_r t_r + (m-1) max_r t_r``,
:mod:`nest.cost.pipeline`) is exact for equal stages and an approximation otherwise. This module
runs the schedule itself to measure that approximation. The tasks and their durations come from
the shared evaluator's report (so both see the same per-chunk forward and backward times, each
including the blocking send of its output):

- ``F(k, j)``: forward of chunk ``k`` on microbatch ``j``; needs ``F(k-1, j)``.
- ``B(k, j)``: backward of chunk ``k`` on microbatch ``j``; needs ``F(k, j)`` and ``B(k+1, j)``.
- Each pipeline rank executes its tasks in the order its schedule prescribes:
  GPipe (all forwards, then all backwards), 1F1B (``pp - r - 1`` warm-up forwards, then one
  forward / one backward, then the cool-down backwards; Narayanan et al. SC21 §2.2.1) or
  Megatron-Core's interleaved 1F1B (``(pp - r - 1) * 2 + (v - 1) * pp`` warm-up chunk-forwards,
  chunks visited in groups of ``pp`` microbatches; SC21 §2.2.2 and Megatron-Core's schedules).
  A task starts when its rank is free and its dependencies are done (list scheduling).
- After its last backward a rank synchronises its gradients (``dp_sync_s`` of the report); with
  ``overlap_grad_sync`` the sync may start when that last backward starts. The optimizer step
  starts when every rank's sync is done (Megatron's global gradient-norm clipping) and lasts
  the slowest rank's step.

Returns the makespan, each rank's busy and idle time, the task timeline and the peak number of
in-flight microbatches per rank; :func:`plot_timeline` draws the timeline as in the 1F1B papers.
"""

from dataclasses import dataclass

from nest.axes import Schedule
from nest.cost import evaluate
from nest.plan import Plan
from nest.problem import Problem
from nest.report import Report


@dataclass(frozen=True, slots=True)
class Task:
    """One piece of work on one pipeline rank; times in seconds from the iteration start."""

    rank: int
    kind: str
    """``F`` forward, ``B`` backward, ``sync`` DP gradient sync, ``opt`` optimizer step."""
    chunk: int
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    makespan_s: float
    """Simulated iteration time."""
    pipeline_s: float
    """End of the last backward (the simulated counterpart of ``pipeline_time_s``)."""
    analytic_s: float
    """``evaluate(problem, plan).iteration_time_s`` for the same plan."""
    busy_s: tuple[float, ...]
    """Per rank: time spent in forward and backward tasks."""
    idle_s: tuple[float, ...]
    """Per rank: ``pipeline_s`` minus busy time (bubbles and waits)."""
    peak_in_flight: tuple[float, ...]
    """Per rank: most microbatches whose activations were held at once (whole-rank units)."""
    tasks: tuple[Task, ...]

    @property
    def relative_error(self) -> float:
        """How far the analytic formula is from the simulation: ``analytic / simulated - 1``."""
        return self.analytic_s / self.makespan_s - 1.0


def rank_order(plan: Plan, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, chunk, microbatch) sequence pipeline rank ``rank`` executes."""
    pp, m, v = plan.pp, plan.num_microbatches, plan.virtual_stages
    if plan.schedule is Schedule.GPIPE:
        return [("F", rank, j) for j in range(m)] + [("B", rank, j) for j in range(m)]
    if plan.schedule is Schedule.ONE_F_ONE_B:
        warm = min(pp - rank - 1, m)
        order = [("F", rank, j) for j in range(warm)]
        for i in range(m - warm):
            order += [("F", rank, warm + i), ("B", rank, i)]
        return order + [("B", rank, j) for j in range(m - warm, m)]
    total = m * v

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        group = (k % (pp * v)) // pp
        local = group if forward else v - 1 - group
        return local * pp + rank, (k // (pp * v)) * pp + k % pp

    warm = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    order = [("F", *virtual(k, True)) for k in range(warm)]
    for i in range(total - warm):
        order += [("F", *virtual(warm + i, True)), ("B", *virtual(i, False))]
    return order + [("B", *virtual(k, False)) for k in range(total - warm, total)]


def simulate(problem: Problem, plan: Plan, report: Report | None = None) -> SimResult:
    """Run one iteration of ``plan`` event by event (see the module docstring)."""
    report = report or evaluate(problem, plan)
    return simulate_schedule(
        plan,
        fwd_s=[s.fwd_s for s in report.stages],
        bwd_s=[s.bwd_s for s in report.stages],
        sync_s=[rk.dp_sync_s for rk in report.ranks],
        optimizer_s=[rk.optimizer_s for rk in report.ranks],
        overlap_grad_sync=problem.training.overlap_grad_sync,
        analytic_s=report.iteration_time_s,
    )


def simulate_schedule(
    plan: Plan,
    *,
    fwd_s,
    bwd_s,
    sync_s,
    optimizer_s,
    overlap_grad_sync: bool = False,
    analytic_s: float = float("nan"),
) -> SimResult:
    """The simulation on given per-chunk forward/backward and per-rank sync/step seconds."""
    n_chunks = len(plan.stages)
    duration = {"F": list(fwd_s), "B": list(bwd_s)}
    orders = [rank_order(plan, r) for r in range(plan.pp)]
    done: dict[tuple[str, int, int], float] = {}
    next_task = [0] * plan.pp
    free_at = [0.0] * plan.pp
    tasks: list[Task] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(plan.pp):
            while next_task[r] < len(orders[r]):
                kind, k, j = orders[r][next_task[r]]
                deps = [("F", k - 1, j)] if kind == "F" and k > 0 else []
                if kind == "B":
                    deps = [("F", k, j)] + ([("B", k + 1, j)] if k + 1 < n_chunks else [])
                if any(d not in done for d in deps):
                    break
                start = max([free_at[r]] + [done[d] for d in deps])
                end = start + duration[kind][k]
                done[(kind, k, j)] = end
                free_at[r] = end
                tasks.append(Task(r, kind, k, j, start, end))
                next_task[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise AssertionError(f"schedule {plan.schedule} deadlocked; this is a bug")
    pipeline_s = max(free_at)
    sync_end = []
    for r in range(plan.pp):
        last = next(t for t in reversed(tasks) if t.rank == r)
        start = last.start_s if overlap_grad_sync else last.end_s
        end = max(last.end_s, start + sync_s[r])
        tasks.append(Task(r, "sync", -1, -1, start, start + sync_s[r]))
        sync_end.append(end)
    step_start = max(sync_end)
    for r in range(plan.pp):
        tasks.append(Task(r, "opt", -1, -1, step_start, step_start + optimizer_s[r]))
    makespan = step_start + max(optimizer_s)
    busy = [0.0] * plan.pp
    events: list[list[tuple[float, int]]] = [[] for _ in range(plan.pp)]
    for t in tasks:
        if t.kind in ("F", "B"):
            busy[t.rank] += t.end_s - t.start_s
            # a forward holds its activations from its start until its backward ends
            events[t.rank].append((t.start_s, 1) if t.kind == "F" else (t.end_s, -1))
    peak = []
    for rank_events in events:
        held = best = 0
        for _, delta in sorted(rank_events):  # at equal times a release (-1) comes first
            held += delta
            best = max(best, held)
        peak.append(best)
    return SimResult(
        makespan_s=makespan,
        pipeline_s=pipeline_s,
        analytic_s=analytic_s,
        busy_s=tuple(busy),
        idle_s=tuple(pipeline_s - b for b in busy),
        peak_in_flight=tuple(p / plan.virtual_stages for p in peak),
        tasks=tuple(tasks),
    )


def plot_timeline(sim: SimResult, path, *, title: str = "") -> None:
    """Draw the iteration as one row per pipeline rank (forward blue, backward orange)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = 1 + max(t.rank for t in sim.tasks)
    fig, ax = plt.subplots(figsize=(12, 0.5 * ranks + 1.6))
    colors = {"F": "#4c72b0", "B": "#dd8452", "sync": "#8c8c8c", "opt": "#55a868"}
    scale = 1e3  # milliseconds on the axis
    for t in sim.tasks:
        ax.broken_barh(
            [(t.start_s * scale, (t.end_s - t.start_s) * scale)],
            (t.rank - 0.4, 0.8),
            facecolors=colors[t.kind],
            edgecolors="white",
            linewidth=0.3,
        )
        width = (t.end_s - t.start_s) * scale
        if t.kind in "FB" and width > sim.makespan_s * scale / 120:
            ax.text(
                (t.start_s + t.end_s) / 2 * scale,
                t.rank,
                str(t.microbatch),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlabel("time within the iteration (ms)")
    ax.set_title(
        title
        or f"simulated iteration {sim.makespan_s * 1e3:.4g} ms; analytic formula "
        f"{sim.analytic_s * 1e3:.4g} ms ({100 * sim.relative_error:+.2f} %)"
    )
    legend = [
        Patch(color=c, label=k)
        for k, c in (
            ("forward", colors["F"]),
            ("backward", colors["B"]),
            ("DP gradient sync", colors["sync"]),
            ("optimizer step", colors["opt"]),
        )
    ]
    ax.legend(
        handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, frameon=False
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
