"""``mcmc``: FlexFlow-style Metropolis-Hastings search over plans on a flat network.

FlexFlow (Jia, Zaharia, Aiken, "Beyond Data and Model Parallelism for Deep Neural Networks",
SysML 2019; its execution optimizer) searches parallelization strategies with Markov chain Monte
Carlo: from a current strategy it proposes a random local change, scores the proposal with its
(topology-agnostic) simulator and accepts it with the Metropolis-Hastings rule
``min(1, exp(beta (cost(S) - cost(S*))))``; it starts from data parallelism or an expert-designed
strategy, returns the best strategy seen, and stops when the search budget is spent or the best
has not improved for half of the search. Here:

- **State**: a structured plan of the NEST space: ``tp, cp, ep, dp, pp``, microbatch size, ZeRO
  stage, a contiguous partition of the chain and a recompute mode per stage; rank order
  ``tp, cp, dp, pp`` and 1F1B (the search is topology-agnostic, so the order does not matter to it).
- **Moves** (one drawn uniformly, then its details uniformly): change one degree to another value
  of its axis (changing ``pp`` re-splits the chain uniformly); move one stage boundary by a few
  layers; change one stage's recompute mode; change the ZeRO stage; change the microbatch size.
  A proposal that breaks a rule (devices, divisibility, shard rules, empty stage) is rejected
  without being scored.
- **Cost during search**: the shared evaluator on a flat copy of the cluster (every pair at the
  slowest pair's bandwidth and latency, :func:`baselines.networks.flat_cluster`), so the search is
  topology-agnostic like FlexFlow's simulator. Plans that do not fit in memory are never accepted
  from a plan that fits; from one that does not, a move is accepted when it fits or needs less.
- **Acceptance**: ``min(1, exp(-(T_new - T_cur) / (temperature * T_cur)))``: ``temperature`` is
  the relative slow-down accepted with probability ``1/e`` (FlexFlow's ``beta`` in relative form).
- **Stopping**: ``max_evaluations`` scored plans (the primary stop; with a seed it makes runs
  reproducible), FlexFlow's rule (``stop_early``: no new best for as many evaluations as it took
  to find the current best, once ``min_evaluations`` are done), ``20 x max_evaluations``
  proposals (invalid or already-seen plans cost no evaluation), and ``max_seconds`` as a safety
  net. Hitting ``max_seconds`` makes the result depend on the machine's speed;
  ``report.json["search"]["stopped_by"]`` says which limit stopped the run.

The best plan found is scored on the real hierarchy by :func:`nest.planner.finish`.
"""

import math
import random
import time
from dataclasses import dataclass, replace

from baselines.megatron import MegatronPlanner
from baselines.networks import flat_cluster, with_cluster
from nest.core.axes import MEGATRON_RANK_ORDER, Recompute, divisors, parse_recompute_modes
from nest.core.errors import Infeasible, UserError
from nest.core.plan import ParallelConfig, Plan, make_structured_plan, uniform_partition
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.planner import finish, infeasible_memory


@dataclass(frozen=True, slots=True)
class State:
    """A plan of the search: its configuration (1F1B, Megatron's rank order), a contiguous
    partition of the chain and a recompute mode per stage."""

    config: ParallelConfig
    counts: tuple[int, ...]
    """Chain layers per stage."""
    modes: tuple[Recompute, ...]

    def with_config(self, **changes) -> "State":
        return replace(self, config=replace(self.config, **changes))


def state_of(plan: Plan) -> State:
    return State(
        config=replace(plan.config, rank_order=MEGATRON_RANK_ORDER),
        counts=tuple(s.last_layer - s.first_layer + 1 for s in plan.stages),
        modes=tuple(s.recompute for s in plan.stages),
    )


class Moves:
    """Random local changes of a :class:`State` and the rules that keep it valid."""

    def __init__(self, problem: Problem, zero_stages, modes) -> None:
        self.problem = problem
        self.n = problem.cluster.num_devices
        self.chain = problem.num_layers
        self.zero_stages = tuple(zero_stages)
        self.modes = tuple(modes)
        spec = problem.model.spec
        self.axes = ["tp", "cp", "dp", "pp"] + (["ep"] if spec.is_moe else [])
        self.values = {
            "tp": divisors(self.n),
            "cp": divisors(self.n),
            "dp": [d for d in divisors(problem.training.global_batch) if d <= self.n],
            "pp": list(range(1, self.chain + 1)),
            "ep": divisors(spec.num_experts),
        }

    def valid(self, s: State) -> bool:
        training, model = self.problem.training, self.problem.model
        c = s.config
        if c.devices > self.n or (self.n // c.tp) % c.cp or self.n % c.tp:
            return False
        if training.global_batch % (c.microbatch_size * c.dp) or (c.dp * c.cp) % c.ep:
            return False
        if len(s.counts) != c.pp or min(s.counts) < 1 or sum(s.counts) != self.chain:
            return False
        if c.zero_stage != 0 and c.dp * c.cp == 1:
            return False
        return model.shard_problem(c.shard(training.sequence_parallel)) is None

    def propose(self, s: State, rng: random.Random) -> State:
        kind = rng.choice(["degree", "boundary", "recompute", "zero", "microbatch"])
        if kind == "degree":
            axis = rng.choice(self.axes)
            value = rng.choice(
                [v for v in self.values[axis] if v != getattr(s.config, axis)] or [1]
            )
            out = s.with_config(**{axis: value})
            if axis == "pp":
                old = s.modes
                modes = tuple(old[min(len(old) - 1, i * len(old) // value)] for i in range(value))
                counts = tuple(uniform_partition(self.chain, value))
                out = replace(out, counts=counts, modes=modes)
            if axis in ("tp", "cp", "pp") and rng.random() < 0.5:
                out = self.fill_dp(out)  # give the data ranks the devices the change freed/took
            return out
        pp = s.config.pp
        if kind == "boundary" and pp > 1:
            b = rng.randrange(pp - 1)
            step = rng.randint(1, max(1, self.chain // (2 * pp))) * rng.choice([-1, 1])
            counts = list(s.counts)
            counts[b] += step
            counts[b + 1] -= step
            return replace(s, counts=tuple(counts))
        if kind == "recompute":
            k = rng.randrange(pp)
            mode = rng.choice([m for m in self.modes if m != s.modes[k]] or [s.modes[k]])
            return replace(s, modes=s.modes[:k] + (mode,) + s.modes[k + 1 :])
        if kind == "zero":
            return s.with_config(zero_stage=rng.choice(self.zero_stages))
        if kind == "microbatch":
            return s.with_config(microbatch_size=rng.choice(self.problem.training.microbatch_sizes))
        return s

    def fill_dp(self, s: State) -> State:
        """The same state with the largest ``dp`` that fits the devices and divides the batch."""
        c = s.config
        room = self.n // (c.tp * c.cp * c.pp)
        batch = self.problem.training.global_batch
        fits = [d for d in self.values["dp"] if d <= room and batch % (c.microbatch_size * d) == 0]
        return s.with_config(dp=max(fits)) if fits else s

    def plan(self, s: State) -> Plan:
        c = s.config
        return make_structured_plan(
            c,
            layer_counts=list(s.counts),
            recompute=list(s.modes),
            num_microbatches=c.num_microbatches(self.problem.training.global_batch),
            sequence_parallel=self.problem.training.sequence_parallel,
        )


@dataclass(frozen=True, slots=True)
class Score:
    feasible: bool
    time_s: float
    overflow_bytes: float
    """Peak memory above the device's HBM (0 when it fits)."""


class MCMCPlanner:
    def __init__(
        self,
        *,
        name: str = "mcmc",
        seed: int = 0,
        max_evaluations: int = 1000,
        max_seconds: float = 60.0,
        temperature: float = 0.05,
        start: str = "megatron",
        stop_early: bool = True,
        min_evaluations: int = 300,
        zero_stages: tuple[int, ...] = (0, 1, 2, 3),
        recompute: tuple[str, ...] = ("none", "selective", "full"),
        flat_bw_gbps: float | None = None,
        flat_latency_us: float | None = None,
    ) -> None:
        self.name = name
        self.seed = seed
        self.max_evaluations = max_evaluations
        """Plans scored before stopping (the primary, reproducible stop)."""
        self.max_seconds = max_seconds
        """Wall-clock safety net; hitting it makes the result time-dependent."""
        self.temperature = temperature
        """Relative slow-down accepted with probability 1/e."""
        self.start = start
        """``megatron`` (the rules' plan on the flat network, falling back to data parallelism
        when they find none) or ``data_parallel``."""
        self.stop_early = stop_early
        """FlexFlow's rule: stop when the best has not improved for as many evaluations as it
        took to find it (once ``min_evaluations`` are done)."""
        self.min_evaluations = min_evaluations
        self.zero_stages = zero_stages
        self.recompute = recompute
        self.flat_bw_gbps = flat_bw_gbps
        self.flat_latency_us = flat_latency_us

    def _check(self) -> tuple[Recompute, ...]:
        for key in ("max_evaluations", "min_evaluations", "seed"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < (1 if key == "max_evaluations" else 0):
                raise UserError(f"solver.{key}={value!r} must be a non-negative integer")
        for key in ("max_seconds", "temperature"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or value <= 0:
                raise UserError(f"solver.{key}={value!r} must be > 0")
        if self.start not in ("megatron", "data_parallel"):
            raise UserError(f"solver.start={self.start!r}; use megatron or data_parallel")
        if not self.zero_stages or any(z not in (0, 1, 2, 3) for z in self.zero_stages):
            raise UserError(f"solver.zero_stages={list(self.zero_stages)}; use values 0-3")
        modes = parse_recompute_modes(self.recompute)
        if not modes:
            raise UserError("solver.recompute is empty; give at least one mode")
        return modes

    def _start(self, flat: Problem, moves: Moves) -> State:
        if self.start == "megatron":
            try:
                return state_of(MegatronPlanner(name="start").solve(flat))
            except Infeasible:
                pass
        training = flat.training
        mbs = training.microbatch_sizes[0]
        dp = max(d for d in moves.values["dp"] if training.global_batch % (mbs * d) == 0)
        config = ParallelConfig(dp=dp, microbatch_size=mbs, rank_order=MEGATRON_RANK_ORDER)
        return State(config, (flat.num_layers,), (moves.modes[0],))

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        modes = self._check()
        flat = with_cluster(
            problem,
            flat_cluster(
                problem.cluster, bw_gbps=self.flat_bw_gbps, latency_us=self.flat_latency_us
            ),
        )
        moves = Moves(flat, self.zero_stages, modes)
        rng = random.Random(self.seed)
        seen: dict[State, Score] = {}

        def score(s: State) -> Score:
            if s not in seen:
                report = evaluate(flat, moves.plan(s))
                over = max(0.0, report.peak_memory_bytes - flat.cluster.device.hbm_bytes)
                seen[s] = Score(report.feasible, report.iteration_time_s, over)
            return seen[s]

        current = self._start(flat, moves)
        cur = score(current)
        start_s = cur.time_s if cur.feasible else None
        best, best_score, best_at = (current, cur, 1) if cur.feasible else (None, None, 0)
        stats = {"proposals": 0, "accepted": 0, "invalid": 0, "repeated": 0}
        while (stopped_by := self._stop(len(seen), stats, best_at, started)) is None:
            stats["proposals"] += 1
            new = moves.propose(current, rng)
            if new == current or not moves.valid(new):
                stats["invalid"] += 1
                continue
            stats["repeated"] += new in seen
            sc = score(new)
            if self._accept(cur, sc, rng):
                current, cur = new, sc
                stats["accepted"] += 1
            if sc.feasible and (best_score is None or sc.time_s < best_score.time_s):
                best, best_score, best_at = new, sc, len(seen)
        search = {
            **stats,
            "evaluations": len(seen),
            "stopped_by": stopped_by,
            "seed": self.seed,
            "start": self.start,
            "start_flat_objective_s": start_s,
            "best_flat_objective_s": best_score.time_s if best_score else None,
            "best_found_at_evaluation": best_at,
        }
        if best is None:
            least = min(seen.values(), key=lambda x: x.overflow_bytes)
            peak = least.overflow_bytes + flat.cluster.device.hbm_bytes
            raise infeasible_memory(problem, self.name, peak)
        plan, _ = finish(
            self.name,
            problem,
            moves.plan(best),
            started_s=started,
            n_evaluations=len(seen),
            search=search,
        )
        return plan

    def _stop(self, evaluations: int, stats: dict, best_at: int, started: float) -> str | None:
        """Which limit stops the chain now (None: go on); ``best_at`` 0 means no plan fits yet."""
        if evaluations >= self.max_evaluations:
            return "evaluations"
        if time.perf_counter() - started > self.max_seconds:
            return "seconds"
        if stats["proposals"] >= 20 * self.max_evaluations:
            return "proposals"
        if (
            self.stop_early
            and best_at > 0
            and evaluations >= self.min_evaluations
            and evaluations - best_at >= best_at
        ):
            return "no_improvement"
        return None

    def _accept(self, cur: Score, new: Score, rng: random.Random) -> bool:
        """Metropolis-Hastings on the flat time; memory feasibility first."""
        if not new.feasible:
            return not cur.feasible and new.overflow_bytes < cur.overflow_bytes
        if not cur.feasible or new.time_s <= cur.time_s:
            return True
        delta = (new.time_s - cur.time_s) / (self.temperature * cur.time_s)
        return rng.random() < math.exp(-delta)
