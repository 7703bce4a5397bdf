"""The planner interface, and the one way a planner reports its result.

A planner is built from its Hydra config (keyword hyper-parameters only, stored verbatim) and has
``solve(problem) -> Plan`` or raises :class:`nest.errors.Infeasible`. Whatever a planner optimises
internally, the objective it reports is ``evaluate(problem, plan).iteration_time_s``: :func:`finish`
sets it, so no planner keeps a private scoring path.
"""

import math
import time
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from nest.axes import Recompute
from nest.cost import evaluate
from nest.errors import Infeasible
from nest.plan import Plan
from nest.problem import Problem
from nest.report import Report
from nest.units import GiB


@runtime_checkable
class Planner(Protocol):
    """``scores_given_plan`` (optional, default False): the planner scores a configuration it is
    given (``fixed``, the paper tables) instead of searching, so a run reports that plan's memory
    rather than refusing it by :func:`check_memory_floor`."""

    name: str

    def solve(self, problem: Problem) -> Plan: ...


def finish(
    planner_name: str,
    problem: Problem,
    plan: Plan,
    *,
    started_s: float,
    status: str | None = None,
    n_evaluations: int = 0,
    bound_s: float | None = None,
    search: Mapping | None = None,
) -> tuple[Plan, Report]:
    """Score ``plan`` with the shared evaluator and attach the solver's record to it."""
    report = evaluate(problem, plan)
    if status is None:
        status = "feasible" if report.feasible else "infeasible"
    plan = plan.with_record(
        solver=planner_name,
        status=status,
        solve_time_s=time.perf_counter() - started_s,
        objective_s=report.iteration_time_s,
        bound_s=bound_s,
        n_evaluations=n_evaluations,
        search=dict(search or {}),
    )
    return plan, report


def model_state_lower_bound_bytes(problem: Problem) -> float:
    """Per-device memory no plan can go below: model states spread perfectly over every device.

    ``params * (weight + gradient + optimizer bytes) / devices + reserve``; activations come on top.
    """
    m = problem.model
    per_param = (
        m.spec.dtype_bytes
        + problem.training.grad_bytes
        + problem.training.optimizer_state_bytes_per_param
    )
    cluster = problem.cluster
    return m.total_params() * per_param / cluster.num_devices + cluster.device.memory_reserve_bytes


def check_memory_floor(problem: Problem, planner_name: str) -> None:
    """Raise :class:`Infeasible` at once when no plan of any planner can fit a device.

    The floor (:func:`model_state_lower_bound_bytes`) holds for every plan: each parameter's
    weight, gradient and optimizer state lives on at least one device, so some device holds at
    least ``1 / devices`` of them, plus the reserve. One pass over the chain's parameters, so a
    search never starts on a model that fits nowhere on this cluster (e.g. ``model.layers`` far
    too many: the search would take minutes to say the same).
    """
    cluster, training = problem.cluster, problem.training
    have = cluster.device.hbm_bytes
    floor = model_state_lower_bound_bytes(problem)
    if floor <= have:
        return
    m = problem.model
    params = m.total_params()
    per_param = m.spec.dtype_bytes + training.grad_bytes + training.optimizer_state_bytes_per_param
    # the fewest devices that lift the floor, in whole blocks of the levels below the top
    inner = math.prod(level.fanout for level in cluster.levels[:-1])
    devices_needed = inner * math.ceil(params * per_param / cluster.device.usable_bytes / inner)
    knobs = [
        f"add devices (cluster.devices >= {devices_needed:,})",
        "use a larger-memory device",
    ]
    if training.optimizer_state_bytes_per_param:
        knobs.append(f"keep no optimizer state (training.optimizer=sgd; now {training.optimizer})")
    raise Infeasible(
        f"{m.name} does not fit on {cluster.name}: any plan needs {floor / GiB:.1f} GiB per "
        f"device, the device has {have / GiB:.1f} GiB (a floor: the model states alone, "
        f"{params:.4g} parameters x {per_param} bytes spread over all {cluster.num_devices} "
        f"devices, plus the {cluster.device.memory_reserve_bytes / GiB:g} GiB reserve; "
        f"{planner_name} did not search); " + ", ".join(knobs) + ", or a smaller model",
        min_memory_bytes=floor,
    )


ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE_MODES = tuple(r.value for r in Recompute)


def _stages_text(stages: Sequence[int]) -> str:
    """``0-3`` for a run of consecutive stages, else ``0,2``."""
    got = sorted(set(stages))
    if len(got) > 2 and got == list(range(got[0], got[-1] + 1)):
        return f"{got[0]}-{got[-1]}"
    return ",".join(str(z) for z in got)


def infeasible_memory(
    problem: Problem,
    planner_name: str,
    best_peak_bytes: float | None,
    *,
    exact: bool = False,
    zero_stages: Sequence[int] = ZERO_STAGES,
    recompute: Sequence[str] = RECOMPUTE_MODES,
) -> Infeasible:
    """An :class:`Infeasible` that says what memory was missing and which knobs would help.

    ``exact``: ``best_peak_bytes`` is the smallest peak of every plan in the planner's space
    (the ``zero_stages`` and ``recompute`` modes it searched), not just of the plans it tried;
    a restriction of either is then named as a knob to widen."""
    cluster = problem.cluster
    have = cluster.device.hbm_bytes
    bound = model_state_lower_bound_bytes(problem)
    widen = []
    if best_peak_bytes is None:
        need = f"{planner_name} found no valid configuration"
    elif exact:
        modes = [str(m) for m in recompute]
        need = (
            f"every plan in {planner_name}'s space (ZeRO {_stages_text(zero_stages)}, recompute "
            f"{'/'.join(modes)}) needs at least {best_peak_bytes / GiB:.1f} GiB per device"
        )
        if set(zero_stages) < set(ZERO_STAGES):
            widen.append(f"solver.zero_stages={list(ZERO_STAGES)}")
        if set(modes) < set(RECOMPUTE_MODES):
            widen.append(f"solver.recompute=[{','.join(RECOMPUTE_MODES)}]")
    else:
        need = (
            f"the smallest plan {planner_name} tried needs {best_peak_bytes / GiB:.1f} GiB per "
            "device"
        )
    knobs = (
        (f"widen the search ({' '.join(widen)}), " if widen else "")
        + "add devices (cluster.devices), use a larger-memory device, or a smaller "
        "training.microbatch_sizes"
    )
    if not exact:
        knobs += ", or a planner that searches ZeRO-3 / recompute (solver=nest)"
    return Infeasible(
        f"{problem.model.name} does not fit on {cluster.name}: {need}, the device has "
        f"{have / GiB:.1f} GiB (any plan needs at least {bound / GiB:.1f} GiB for model states); "
        + knobs,
        min_memory_bytes=best_peak_bytes if best_peak_bytes is not None else bound,
    )
