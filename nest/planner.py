"""The planner interface, and the one way a planner reports its result.

A planner is built from its Hydra config (keyword hyper-parameters only, stored verbatim) and has
``solve(problem) -> Plan`` or raises :class:`nest.core.errors.Infeasible`. A planner that can
return the
K best configurations (:class:`RankedPlanner`: ``nest``, ``brute``) also has a ``top_k`` setting
and ``solve_ranked(problem) -> list[Plan]``; :func:`solve_ranked` is how a run asks any planner
for its ranked list. Whatever a planner optimises
internally, the objective it reports is ``evaluate(problem, plan).iteration_time_s``: :func:`finish`
sets it, so no planner keeps a private scoring path.

:func:`build_planner` is the one way a run turns a solver config into a planner: it resolves the
config's ``_target_`` first and calls it only if it is a planner class (the :class:`Planner`
protocol), so a solver YAML on the search path cannot make a run call any other Python callable.
"""

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from nest.core.axes import Recompute
from nest.core.errors import Infeasible, UserError
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.report import MemoryReport, Report
from nest.core.units import GiB
from nest.cost import evaluate
from nest.cost.state import ModelState, can_offload_optimizer


@runtime_checkable
class Planner(Protocol):
    """``scores_given_plan`` (optional, default False): the planner scores a configuration it is
    given (``fixed``, the paper tables) instead of searching, so a run reports that plan's memory
    rather than refusing it by :func:`check_memory_floor`."""

    name: str

    def solve(self, problem: Problem) -> Plan: ...


@runtime_checkable
class RankedPlanner(Planner, Protocol):
    """A planner that returns the best plan of each of its ``top_k`` best configurations."""

    top_k: int

    def solve_ranked(self, problem: Problem) -> list[Plan]: ...


def solve_ranked(planner: Planner, problem: Problem) -> list[Plan]:
    """The planner's plans, best first: its ranked list when it has one, else its one plan."""
    if isinstance(planner, RankedPlanner):
        return planner.solve_ranked(problem)
    return [planner.solve(problem)]


def _ranks(cls: type) -> bool:
    return callable(getattr(cls, "solve_ranked", None))


def _nested_targets(node: Any, where: str) -> list[str]:
    """Paths of every ``_target_`` below the top of a solver config (in dicts and lists)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_":
                found.append(f"{where}._target_")
            found += _nested_targets(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _nested_targets(value, f"{where}[{i}]")
    return found


def planner_class(target) -> type:
    """The class a solver config's ``_target_`` names, refused unless it is a planner class (a
    class with ``solve``): resolved without calling anything."""
    if not isinstance(target, str) or not target.strip():
        raise UserError(
            f"solver._target_={target!r}; a solver config names its planner class, e.g. "
            "_target_: baselines.fixed.FixedPlanner"
        )
    try:
        obj = get_object(target)
    except Exception as exc:
        raise UserError(
            f"solver._target_={target!r} cannot be imported ({' '.join(str(exc).split())[:200]}); "
            "name a planner class importable from this Python environment"
        ) from None
    if not isinstance(obj, type) or not callable(getattr(obj, "solve", None)):
        kind = "a class without solve()" if isinstance(obj, type) else type(obj).__name__
        raise UserError(
            f"solver._target_={target!r} is not a planner class (a class with solve(problem), "
            f"nest.planner.Planner) but {kind}; refusing to call it"
        )
    return obj


def checked_solver(solver_cfg: DictConfig | Mapping) -> tuple[dict, type]:
    """A solver config's plain values and planner class, refused before anything is called
    (module's :func:`build_planner` docstring): the target must be a planner class, no nested
    ``_target_``, no ``_partial_``."""
    cfg = solver_cfg if isinstance(solver_cfg, DictConfig) else OmegaConf.create(dict(solver_cfg))
    cls = planner_class(cfg.get("_target_"))  # refused before anything else is read
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that does not resolve is a config mistake
        raise UserError(f"solver config does not resolve: {' '.join(str(exc).split())}") from None
    nested = _nested_targets({k: v for k, v in plain.items() if k != "_target_"}, "solver")
    if nested:
        raise UserError(
            f"{nested[0]}: a solver config may name one class (its top-level _target_); nested "
            "targets are not instantiated. Give the planner its settings as plain values"
        )
    if plain.get("_partial_"):
        raise UserError("solver._partial_=true; a solver config builds a planner, not a partial")
    return plain, cls


def build_planner(solver_cfg: DictConfig | Mapping) -> Planner:
    """The planner a solver config names, after checking that its ``_target_`` is a planner class.

    Hydra's ``instantiate`` calls whatever ``_target_`` names (``_target_: shutil.copy`` copies a
    file), so the target is resolved first and refused unless it is a class with a ``solve``
    method; nested ``_target_`` keys (which ``instantiate`` would call before the planner) and
    ``_partial_`` are refused outright (:func:`checked_solver`). Planner classes in the user's own
    packages work as before: ``_target_: mypackage.MyPlanner`` with ``mypackage`` importable.
    """
    cfg = solver_cfg if isinstance(solver_cfg, DictConfig) else OmegaConf.create(dict(solver_cfg))
    plain, obj = checked_solver(cfg)
    target = plain["_target_"]
    if "top_k" in plain and not _ranks(obj):
        # a planner that builds one plan: top_k=1 is what it does anyway, more it cannot
        if plain["top_k"] != 1:
            raise UserError(
                f"solver.top_k={plain['top_k']!r}: solver={plain.get('name', target)} returns "
                "one plan; the K best configurations come from solver=nest (or brute on tiny "
                "problems)"
            )
        cfg = OmegaConf.create({k: v for k, v in plain.items() if k != "top_k"})
    try:
        planner = instantiate(cfg, _convert_="all")
    except InstantiationException as exc:
        # a mistake the constructor finds is the planner's own one-line error, not Hydra's
        # "Error in call to target" wrapping of it
        if isinstance(exc.__cause__, UserError):
            raise exc.__cause__ from None
        raise
    if not isinstance(planner, Planner):
        raise UserError(
            f"solver._target_={target!r} built a {type(planner).__name__} without a 'name' "
            "attribute; a planner has name and solve(problem) (nest.planner.Planner)"
        )
    return planner


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


def model_state_lower_bound_bytes(problem: Problem, offload: bool = False) -> float:
    """Per-device memory no plan can go below: model states spread perfectly over every device.

    ``params * (weight + gradient + optimizer bytes) / devices + reserve``: the model state of
    ZeRO-3 sharded over every device (:class:`nest.cost.state.ModelState`); activations come on
    top. ``offload``: the space may offload the optimizer state to host memory
    (:attr:`nest.core.plan.ParallelConfig.optimizer_offload`), so it counts no optimizer bytes.
    """
    cluster = problem.cluster
    offload = offload and can_offload_optimizer(problem)
    everywhere = ModelState.of(
        problem, zero_stage=3, dp=cluster.num_devices, cp=1, ep=1, optimizer_offload=offload
    )
    state = everywhere.state_bytes(problem.model.total_params(), 0.0)
    return state + cluster.device.memory_reserve_bytes


def check_memory_floor(problem: Problem, planner_name: str, offload: bool = False) -> None:
    """Raise :class:`Infeasible` at once when no plan of any planner can fit a device.

    The floor (:func:`model_state_lower_bound_bytes`) holds for every plan: each parameter's
    weight, gradient and optimizer state lives on at least one device, so some device holds at
    least ``1 / devices`` of them, plus the reserve. One pass over the chain's parameters, so a
    search never starts on a model that fits nowhere on this cluster (e.g. ``model.layers`` far
    too many: the search would take minutes to say the same).
    """
    cluster, training = problem.cluster, problem.training
    have = cluster.device.hbm_bytes
    floor = model_state_lower_bound_bytes(problem, offload)
    if floor <= have:
        return
    m = problem.model
    params = m.total_params()
    # bytes per parameter unsharded: the model state of one device holding everything
    per_param, _ = ModelState.of(problem, zero_stage=0, dp=1, cp=1, ep=1).state_bytes_per_param()
    # the fewest devices that lift the floor, in whole blocks of the levels below the top
    inner = math.prod(level.fanout for level in cluster.levels[:-1])
    devices_needed = inner * math.ceil(params * per_param / cluster.device.usable_bytes / inner)
    knobs = [
        f"add devices (cluster.devices >= {devices_needed:,})",
        "use a larger-memory device",
    ]
    if training.optimizer_state_bytes_per_param:
        if not offload and can_offload_optimizer(problem):
            knobs.append("offload the optimizer state to host memory (solver.offload=true)")
        knobs.append(f"keep no optimizer state (training.optimizer=sgd; now {training.optimizer})")
    raise Infeasible(
        f"{m.name} does not fit on {cluster.name}: any plan needs {floor / GiB:.1f} GiB per "
        f"device, the device has {have / GiB:.1f} GiB (a floor: the model states alone, "
        f"{params:.4g} parameters x {per_param} bytes spread over all {cluster.num_devices} "
        f"devices, plus the {cluster.device.memory_reserve_bytes / GiB:.3g} GiB reserve; "
        f"{planner_name} did not search); " + ", ".join(knobs) + ", or a smaller model",
        min_memory_bytes=floor,
    )


ZERO_STAGES = (0, 1, 2, 3)
OPT_IN_RECOMPUTE = (
    Recompute.OP,
    Recompute.DOTS,
    Recompute.MLA_UP,
    Recompute.MLP_MOE,
    Recompute.MLA_UP_MLP_MOE,
    Recompute.QKV_PROJ,
    Recompute.QKV_OUT_PROJ,
    Recompute.NOTHING_SAVEABLE,
)
RECOMPUTE_MODES = tuple(r.value for r in Recompute if r not in OPT_IN_RECOMPUTE)
"""The recompute modes an infeasible search names as the space to widen to: the default space
(``nest.dp.space.SpaceOptions.recompute``). ``op``, ``dots``, ``mla_up_proj``, ``mlp_moe``,
``mla_up_proj_mlp_moe``, ``qkv_proj``, ``qkv_out_proj`` and ``nothing_saveable`` are opt-in
(docs/plan/training.md) and never store less than ``full`` (each keeps at least the block's
input), so adding them cannot make a plan fit that the default space lacks."""


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
    offload: bool = False,
) -> Infeasible:
    """An :class:`Infeasible` that says what memory was missing and which knobs would help.

    ``exact``: ``best_peak_bytes`` is the smallest peak of every plan in the planner's space
    (the ``zero_stages`` and ``recompute`` modes it searched), not just of the plans it tried;
    a restriction of either is then named as a knob to widen, and so is the optimizer offload
    (``offload``: searched) where the device has a host link."""
    cluster = problem.cluster
    have = cluster.device.hbm_bytes
    bound = model_state_lower_bound_bytes(problem, offload)
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
        if not set(RECOMPUTE_MODES) <= set(modes):
            widen.append(f"solver.recompute=[{','.join(RECOMPUTE_MODES)}]")
        if not offload and can_offload_optimizer(problem):
            widen.append("solver.offload=true")
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


# What to change when a plan does not fit: the ``memory fix:`` line of the summary and of a
# planner's out-of-memory error.
#
# The line names the largest term of the worst pipeline rank's memory
# (:meth:`nest.core.report.MemoryReport.terms`) and the cheapest single knob that makes the plan
# fit, with the memory it saves on that rank. Each knob is the plan with one setting changed,
# scored by the shared evaluator (never a formula of its own):
#
# - ``recompute=full`` on every stage (stores only each block's input);
# - the next ZeRO stage (shards the optimizer state, then the gradients, then the weights);
# - a microbatch half the size (half the stored activations per microbatch, twice as many
#   microbatches: the global batch is unchanged);
# - the optimizer state offloaded to host memory, where the device has a host link and the
#   optimizer keeps state (Megatron-Core ``--optimizer-cpu-offload``; ``solver.offload=true``
#   searches it), and the activations offloaded, where it has a host link.
#
# "Cheapest" is the shortest iteration among the knobs that fit; when none fits alone, the line
# gives the one that saves the most and what is still missing.

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


def knobs(plan: Plan, problem: Problem | None = None) -> Iterator[tuple[str, Plan]]:
    """The plans one setting away from ``plan`` that may need less memory (module docstring);
    the optimizer offload only with ``problem`` (it needs the device's host link)."""
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
    if problem is not None and not plan.optimizer_offload and can_offload_optimizer(problem):
        yield (
            "optimizer state offloaded to host memory (solver.offload=true)",
            replace(plan, config=replace(plan.config, optimizer_offload=True)),
        )
    linked = problem is not None and problem.cluster.device.host_link_bw_bytes_per_s is not None
    if linked and not plan.activation_offload:
        yield (
            "activations offloaded to host memory (solver.offload=true)",
            replace(plan, config=replace(plan.config, activation_offload=True)),
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
    for label, changed in knobs(plan, problem):
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
