"""One linear model of the exact planners' space, solved by CP-SAT or by a MILP (PuLP + HiGHS).

Variables (groups and choices of :mod:`nest.exact.tables`):

- ``y_g`` (binary): group ``g`` (configuration x placement) is the plan's; ``sum_g y_g = 1``;
- ``z_{g,r,k}`` (binary): rank ``r`` of group ``g`` takes choice ``k``; ``sum_k z_{g,r,k} = y_g``;
  1F1B ranks chain: for every layer ``e``, the choices of rank ``r`` ending at ``e`` are taken as
  often as the choices of rank ``r + 1`` starting at ``e + 1`` (rank 0's choices start at the
  embedding, the last rank's end at the head);
- ``M_g, E_g, O_g >= 0`` (continuous; integer ticks in CP-SAT) with, for every rank ``r``,
  ``M_g >= b_g t_r``, ``E_g >= sync_r + g_r - sum_{q<r} f_q [- f_r]`` and ``E_g >= g_r``
  (``max(0, x) + g = max(g, x + g)``; ``g_r`` the rank's exposed weight all-gather,
  :func:`nest.cost.pipeline.gather_exposed_s`), ``O_g >= opt_r``, where each
  rank term is ``sum_k term_k z_{g,r,k}`` (zero for a group not taken).

Objective: ``sum_g (a_g sum_{r,k} t_k z_{g,r,k} + M_g + E_g + O_g)``. For the group taken this
is the evaluator's ``T`` (:mod:`nest.exact.tables`): the maxima are epigraphs, tight at the optimum
because the objective is minimised and each appears with coefficient one; for the other groups
every term is zero. The model is therefore exact for the shared cost model, with no big-M.

**Integers for CP-SAT.** Times become integer ticks of ``tick_s = scale_s / 2**24`` (``scale_s``:
the upper bound ``U`` the tables were pruned with, else the least lower bound of a group), each
coefficient rounded once. A plan's rounded objective then differs from its value by at most
``pp + 1`` ticks (``pp/2`` from the ``a t`` terms, ``1/2`` from the maximum, ``pp/2`` from the
exposed sync of rank ``r``: its ``sync - f_r`` and ``r`` hiding terms, ``1/2`` from the optimizer
step; ``pp + 1.5`` is used), so the proven bound less that error is a lower
bound on the true optimum; the relative error is below ``(pp + 1.5) / 2**24 < 6e-7`` for
``pp <= 8``. With pruning every coefficient is at most ``2**24`` ticks (``b t <= U``), which
keeps sums over Booleans far from the magnitudes of CP-SAT 9.15's presolve bug (#5293); without
it coefficients can be larger (no enforced constraints are used, the bug's trigger), and the
bug's workaround ``presolve_inclusion_work_limit = 0`` is set either way. The MILP keeps floats
(scaled by ``1 / scale_s`` for conditioning) and asks HiGHS for a zero gap.
"""

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from nest.core.axes import Schedule
from nest.cost.pipeline import exposed_sync_s
from nest.exact.tables import Group

TICKS = 2**24


@dataclass(slots=True)
class Row:
    binaries: dict[int, float]
    """binary index -> coefficient (seconds for time rows, a count otherwise)."""
    aux: dict[int, float]
    sense: str  # "==" or ">="
    time_row: bool
    rhs: float = 0.0


@dataclass(slots=True)
class LinearModel:
    n_binaries: int = 0
    aux_ub_s: list[float] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    objective_binaries: dict[int, float] = field(default_factory=dict)
    z: dict = field(default_factory=dict)
    y: list[int] = field(default_factory=list)
    aux_of: list = field(default_factory=list)
    max_pp: int = 1
    least_lower_bound_s: float = float("inf")
    binary_names: list[str] = field(default_factory=list)
    """``y_{group}``, ``z_{group}_{rank}_{choice}`` (module docstring)."""
    aux_names: list[str] = field(default_factory=list)
    """``M_{group}``, ``E_{group}``, ``O_{group}``."""

    def binary(self, name: str) -> int:
        self.n_binaries += 1
        self.binary_names.append(name)
        return self.n_binaries - 1

    def auxiliary(self, ub_s: float, name: str) -> int:
        self.aux_ub_s.append(ub_s)
        self.aux_names.append(name)
        return len(self.aux_ub_s) - 1


def build(groups: list[Group], n_layers: int) -> LinearModel:
    """The model of the module docstring over ``groups``: variables named as there."""
    lm = LinearModel()
    for g, group in enumerate(groups):
        y = lm.binary(f"y_{g}")
        lm.y.append(y)
        pp = group.config.pp
        lm.max_pp = max(lm.max_pp, pp)
        lm.least_lower_bound_s = min(lm.least_lower_bound_s, group.lower_bound_s())
        zs = []
        for r, choices in enumerate(group.ranks):
            ids = [lm.binary(f"z_{g}_{r}_{k}") for k in range(len(choices))]
            zs.append(ids)
            for k, (var, ch) in enumerate(zip(ids, choices, strict=True)):
                lm.z[g, r, k] = var
                lm.objective_binaries[var] = group.sum_coef * ch.t_s
            # each rank of the group takes one choice if the group is the plan's, else none:
            # sum_k z_{g,r,k} = y_g
            lm.rows.append(Row({**dict.fromkeys(ids, 1.0), y: -1.0}, {}, "==", False))
        if group.config.schedule is not Schedule.INTERLEAVED:
            # 1F1B ranks chain: choices of rank r ending at layer e as often as choices of
            # rank r + 1 starting at e + 1
            for r in range(pp - 1):
                for e in range(n_layers - 1):
                    ends = [
                        k for k, ch in zip(zs[r], group.ranks[r], strict=True) if ch.span[1] == e
                    ]
                    starts = [
                        k
                        for k, ch in zip(zs[r + 1], group.ranks[r + 1], strict=True)
                        if ch.span[0] == e + 1
                    ]
                    if ends or starts:
                        row = dict.fromkeys(ends, 1.0)
                        row.update(dict.fromkeys(starts, -1.0))
                        lm.rows.append(Row(row, {}, "==", False))
        all_choices = [ch for choices in group.ranks for ch in choices]
        m_aux = lm.auxiliary(group.max_coef * max(ch.t_s for ch in all_choices), f"M_{g}")
        e_aux = lm.auxiliary(max(ch.sync_s + ch.gather_s for ch in all_choices), f"E_{g}")
        o_aux = lm.auxiliary(max(ch.opt_s for ch in all_choices), f"O_{g}")
        lm.aux_of.append((m_aux, e_aux, o_aux))
        for r in range(pp):
            pairs = list(zip(zs[r], group.ranks[r], strict=True))
            # the slowest rank's epigraph: M_g >= b_g t_r
            slowest = {k: -group.max_coef * ch.t_s for k, ch in pairs}
            lm.rows.append(Row(slowest, {m_aux: 1.0}, ">=", True))
            # the optimizer step's epigraph: O_g >= opt_r
            lm.rows.append(Row({k: -ch.opt_s for k, ch in pairs}, {o_aux: 1.0}, ">=", True))
            # the exposed sync's epigraph: E_g >= sync_r + g_r - sum_{q<r} f_q [- f_r]
            exposed = {k: -(ch.sync_s + ch.gather_s) for k, ch in pairs}
            hiding = list(range(r)) + ([r] if group.overlap else [])
            for q in hiding:
                for k, ch in zip(zs[q], group.ranks[q], strict=True):
                    exposed[k] = exposed.get(k, 0.0) + ch.first_bwd_s
            lm.rows.append(Row(exposed, {e_aux: 1.0}, ">=", True))
            if any(ch.gather_s > 0.0 for _, ch in pairs):  # and E_g >= g_r
                gathered = {k: -ch.gather_s for k, ch in pairs}
                lm.rows.append(Row(gathered, {e_aux: 1.0}, ">=", True))
    # exactly one group is the plan's: sum_g y_g = 1
    lm.rows.append(Row(dict.fromkeys(lm.y, 1.0), {}, "==", False, 1.0))
    return lm


@dataclass(slots=True)
class Solution:
    status: str
    """optimal / feasible (a limit stopped it) / infeasible / timeout (no solution in time)."""
    group: int | None
    picks: list[int] | None
    bound_s: float | None
    solve_time_s: float
    info: dict


def _decode(lm: LinearModel, groups: list[Group], value) -> tuple[int, list[int]]:
    g = next(g for g, y in enumerate(lm.y) if value(y) > 0.5)
    picks = []
    for r in range(len(groups[g].ranks)):
        ks = [k for k in range(len(groups[g].ranks[r])) if value(lm.z[g, r, k]) > 0.5]
        picks.append(ks[0])
    return g, picks


def hint_values(
    lm: LinearModel, groups: list[Group], g: int, picks: list[int]
) -> tuple[dict[int, int], dict[int, float]]:
    """Values of every binary (by index) and auxiliary (seconds) for one plan."""
    values = dict.fromkeys(range(lm.n_binaries), 0)
    values[lm.y[g]] = 1
    for r, k in enumerate(picks):
        values[lm.z[g, r, k]] = 1
    group = groups[g]
    chosen = [group.ranks[r][k] for r, k in enumerate(picks)]
    exposed = exposed_sync_s(
        [ch.sync_s for ch in chosen],
        [ch.first_bwd_s for ch in chosen],
        group.overlap,
        gather_exposed=[ch.gather_s for ch in chosen],
    )
    aux = dict.fromkeys(range(len(lm.aux_ub_s)), 0.0)
    m_aux, e_aux, o_aux = lm.aux_of[g]
    aux[m_aux] = group.max_coef * max(ch.t_s for ch in chosen)
    aux[e_aux] = max(exposed)
    aux[o_aux] = max(ch.opt_s for ch in chosen)
    return values, aux


def _scale_s(lm: LinearModel, upper_s: float | None) -> float:
    """The time that becomes ``2**24`` ticks: the upper bound when the tables were pruned with
    one (every coefficient is then at most that), else the least group lower bound (at most the
    optimum, so the relative rounding error stays below ``(pp + 1.5) / 2**24`` either way)."""
    if upper_s is not None:
        return upper_s
    return lm.least_lower_bound_s


def solve_cpsat(
    lm: LinearModel,
    groups: list[Group],
    *,
    upper_s: float | None,
    time_limit_s: float,
    workers: int,
    seed: int,
    hint: tuple[int, list[int]] | None,
    deterministic_time: float | None = None,
) -> Solution:
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    tick_s = _scale_s(lm, upper_s) / TICKS
    model = cp_model.CpModel()
    x = [model.new_bool_var(name) for name in lm.binary_names]
    aux = [
        model.new_int_var(0, int(np.ceil(ub / tick_s)) + 1, name)
        for ub, name in zip(lm.aux_ub_s, lm.aux_names, strict=True)
    ]
    for row in lm.rows:
        if row.time_row:
            expr = sum(int(round(c / tick_s)) * x[i] for i, c in row.binaries.items())
        else:
            expr = sum(int(c) * x[i] for i, c in row.binaries.items())
        expr += sum(int(c) * aux[i] for i, c in row.aux.items())
        rhs = int(row.rhs)
        model.add(expr == rhs if row.sense == "==" else expr >= rhs)
    model.minimize(
        sum(int(round(c / tick_s)) * x[i] for i, c in lm.objective_binaries.items()) + sum(aux)
    )
    if hint is not None:
        values, aux_s = hint_values(lm, groups, *hint)
        for i, var in enumerate(x):
            model.add_hint(var, values[i])
        del aux_s  # CP-SAT completes the integer auxiliaries from the hinted Booleans
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = float(time_limit_s)
    if deterministic_time is not None:
        p.max_deterministic_time = float(deterministic_time)  # reproducible stop (§2.5)
    p.num_workers = int(workers)
    p.random_seed = int(seed)
    p.presolve_inclusion_work_limit = 0  # CP-SAT 9.15 presolve bug, google/or-tools issue #5293
    if workers > 1:
        p.interleave_search = True  # deterministic for any number of workers
    status = solver.solve(model)
    elapsed = time.perf_counter() - started
    error_ticks = lm.max_pp + 1.5
    info = {
        "tick_s": tick_s,
        "rounding_error_s": error_ticks * tick_s,
        "cpsat_status": solver.status_name(status),
        "booleans": lm.n_binaries,
        "rows": len(lm.rows),
    }
    if status == cp_model.MODEL_INVALID:
        raise AssertionError(f"CP-SAT rejected the model (a bug): {model.validate()}")
    if status == cp_model.INFEASIBLE:
        return Solution("infeasible", None, None, None, elapsed, info)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solution("timeout", None, None, None, elapsed, info)
    g, picks = _decode(lm, groups, lambda v: solver.value(x[v]))
    bound_s = (solver.best_objective_bound - error_ticks) * tick_s
    info["objective_ticks"] = solver.objective_value
    return Solution(
        "optimal" if status == cp_model.OPTIMAL else "feasible", g, picks, bound_s, elapsed, info
    )


@contextmanager
def _c_stdout_silenced():
    """Send file descriptor 1 to /dev/null for a moment (C code prints there, not to Python's
    ``sys.stdout``)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _milp_name(kind: str, i: int, name: str) -> str:
    """A MILP column's name, ``x12.z_0_1_3``: PuLP hands HiGHS its columns sorted by name, and
    the ``x{i}`` / ``a{i}`` prefix (``.`` sorts before a digit) keeps that order the model's,
    and with it HiGHS's choice among equally good plans."""
    return f"{kind}{i}.{name}"


def _hinted_highs(lm: LinearModel, groups: list[Group], hint, x, aux, scale_s: float):
    """PuLP's HiGHS solver class, started from the ``hint`` plan when there is one."""
    import highspy
    import pulp

    class Hinted(pulp.HiGHS):
        """HiGHS started from a known solution (PuLP 3.3's HiGHS has no warm start), without
        the banner it prints to the C stdout when constructed."""

        def createAndConfigureSolver(self, lp):  # noqa: N802 (PuLP's name)
            with _c_stdout_silenced():
                super().createAndConfigureSolver(lp)

        def callSolver(self, lp):  # noqa: N802 (PuLP's name)
            if hint is not None:
                values, aux_s = hint_values(lm, groups, *hint)
                by_name = {x[i].name: float(v) for i, v in values.items()}
                by_name.update({aux[i].name: v / scale_s for i, v in aux_s.items()})
                sol = highspy.HighsSolution()
                sol.col_value = [by_name.get(v.name, 0.0) for v in lp.variables()]
                sol.value_valid = True
                lp.solverModel.setSolution(sol)
                # highspy 1.16 maps a start solution into the presolved model without its
                # objective offset ("MIP start solution is feasible in the reduced space:
                # objective value is 0") and may close the tree on it at once, reporting the
                # start as optimal (seen on graph clusters: tests/test_graph.py); without
                # presolve the start is taken at its true value
                lp.solverModel.setOptionValue("presolve", "off")
            lp.solverModel.run()

    return Hinted


def solve_milp(
    lm: LinearModel,
    groups: list[Group],
    *,
    upper_s: float | None,
    time_limit_s: float,
    workers: int,
    seed: int,
    hint: tuple[int, list[int]] | None,
    deterministic_time: float | None = None,
) -> Solution:
    del deterministic_time  # HiGHS has no work-based limit; its wall-clock limit applies
    import pulp

    started = time.perf_counter()
    scale_s = _scale_s(lm, upper_s)
    prob = pulp.LpProblem("exact_plan", pulp.LpMinimize)
    x = [
        prob.add_variable(_milp_name("x", i, name), cat="Binary")
        for i, name in enumerate(lm.binary_names)
    ]
    aux = [
        prob.add_variable(
            _milp_name("a", i, name), lowBound=0, upBound=ub / scale_s * (1 + 1e-6) + 1e-9
        )
        for i, (ub, name) in enumerate(zip(lm.aux_ub_s, lm.aux_names, strict=True))
    ]
    prob += pulp.lpSum(c / scale_s * x[i] for i, c in lm.objective_binaries.items()) + pulp.lpSum(
        aux
    )
    for n, row in enumerate(lm.rows):
        div = scale_s if row.time_row else 1.0
        expr = pulp.lpSum(c / div * x[i] for i, c in row.binaries.items())
        expr += pulp.lpSum(c * aux[i] for i, c in row.aux.items())
        prob += (expr == row.rhs) if row.sense == "==" else (expr >= row.rhs), f"r{n}"

    solver = _hinted_highs(lm, groups, hint, x, aux, scale_s)(
        msg=False,
        timeLimit=float(time_limit_s),
        threads=int(workers),
        gapRel=0.0,
        gapAbs=0.0,
        random_seed=int(seed),
    )
    prob.solve(solver)
    elapsed = time.perf_counter() - started
    highs = prob.solverModel
    model_status = highs.modelStatusToString(highs.getModelStatus())
    info = {"highs_status": model_status, "booleans": lm.n_binaries, "rows": len(lm.rows)}
    sol_status = prob.sol_status
    if sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        if prob.status == pulp.LpStatusInfeasible or "nfeasible" in model_status:
            return Solution("infeasible", None, None, None, elapsed, info)
        return Solution("timeout", None, None, None, elapsed, info)
    g, picks = _decode(lm, groups, lambda v: x[v].varValue or 0.0)
    status = "optimal" if sol_status == pulp.LpSolutionOptimal else "feasible"
    # with mip_rel_gap = mip_abs_gap = 0, "optimal" is HiGHS's proof that the solution's
    # objective is the bound (its info reads 0 for both when a start solution closes the tree)
    optimal = status == "optimal"
    bound = pulp.value(prob.objective) if optimal else highs.getInfo().mip_dual_bound
    bound_s = float(bound) * scale_s if np.isfinite(bound) else None
    return Solution(status, g, picks, bound_s, elapsed, info)
