"""How robust the choice is: the best plans re-scored under the cost model's uncertainty.

``robust=true`` draws ``samples`` perturbed copies of the problem ("worlds") and scores every plan
of the run (the chosen one and its ``solver.top_k`` alternatives) in each with the shared
evaluator: no private scoring path, only :func:`nest.cost.evaluate` on a perturbed
:class:`~nest.core.problem.Problem` built with :func:`dataclasses.replace` on its frozen parts.

**The uncertain inputs** and how one world perturbs them (each a multiplicative factor drawn
log-uniformly from its range ``[low, high]``, :class:`Ranges`; docs/plan/top-k-robust.md
justifies each default from the validation errors):

- ``matmul_efficiency``: the achieved matmul rate (``peak x matmul_efficiency``), one factor per
  world. It is applied to the peak so that an efficiency of 1.0 can move up too; only the
  achieved rate enters the times (MFU of a perturbed world is not used).
- ``layer_time_per_doubling`` and ``layer_time``: each layer's compute time (forward, backward,
  recompute) is scaled by ``g ** log2(W / W_1) x e``. ``W`` is the layer's nominal forward time
  on its shard (a measure of its kernels' size per device), ``W_1`` the same layer's on the
  chosen plan's shard, ``g`` one factor per world (``layer_time_per_doubling``: how much the
  efficiency of a kernel twice as large differs, the shape-dependent efficiency that one global
  efficiency cannot express), and ``e`` one factor per world and per (layer, shard)
  (``layer_time``: the scatter no trend explains). A shard is a :class:`~nest.core.layers.Shard`
  (tp, cp, ep, sequence parallelism, microbatch size) and a layer is the model's
  :meth:`cost_key`: the same kernels get the same factor in every plan of a world. For a
  measured profile (``model=profile``) these are the only compute factors.
- ``hbm_bandwidth``: the device's HBM bandwidth (elementwise operators, optimizer step), one
  factor per world.
- ``network_bandwidth`` and ``network_latency``: each level's bandwidth (its in-network
  all-reduce's too) and latency, one factor per level and world.
  Hierarchies only: a graph cluster's fabric prices communication on its
  links and routes (:attr:`nest.core.fabric.Fabric.priced_by_levels` is false), which these
  factors do not reach, so there they are not applied and
  ``report.json["robustness"]["network_perturbed"]`` is false.
- ``hbm_capacity``: the device's memory (an allocator margin), one factor per world; ``[1, 1]``
  (off) by default.

**Correlation.** Every plan of a world sees the same factors: plans are compared under the same
hardware, as they would be on one cluster, so a factor shared by two plans moves both and only
what differs between them (the shapes they run, the levels their groups cross, their balance of
compute and communication) changes their order. Independent draws per plan would mostly measure
the noise of the draw, not the risk of the choice.

**Reproducible.** The world factors come from ``numpy.random.default_rng(seed)`` in a fixed order
(per world: matmul, HBM bandwidth, HBM capacity, layer time per doubling, then bandwidth and
latency of each level); a
layer's ``e`` comes from a generator seeded with the seed and a stable hash of its (layer key,
shard), so it does not depend on which plans are scored or in which order (its trend term depends
on the chosen plan, its reference).

**What is reported** (:func:`robustness`): per world the fastest plan that fits wins it (plans
within 1e-9 relative of the fastest share it equally); a plan's regret in a world is its time minus
that world's fastest. A plan that does not fit in a world loses it: it cannot win it, its regret
there is not defined and is left out of its expected and worst regret, and ``fits_probability``
says how often it fits. A world where no plan fits has no winner (the win probabilities then add
up to less than one). The verdict (:func:`verdict`) names the chosen plan robust when it wins at
least ``confidence`` of the worlds, and otherwise lists the plans that win at least
``1 - confidence`` of them as indistinguishable; it adds whether that matters: when the chosen
plan is never more than ``negligible_regret`` slower than a world's fastest, any of them will do,
otherwise they are worth trying on the cluster.
"""

import hashlib
from dataclasses import dataclass, fields, replace

import numpy as np

from nest.analysis.alternatives import seconds_text
from nest.core.errors import UserError
from nest.core.files import atomic_path
from nest.core.layers import LayerCost, Shard
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.cost import evaluate

TIE_RELATIVE = 1e-9
"""Plans within this relative difference of a world's fastest share its win."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranges:
    """Multiplicative factor ranges ``(low, high)`` of the uncertain inputs (module docstring).
    The defaults are those of ``conf/config.yaml`` (``robustness.ranges``, tested equal)."""

    matmul_efficiency: tuple[float, float] = (0.9, 1.1)
    layer_time_per_doubling: tuple[float, float] = (0.96, 1.04)
    layer_time: tuple[float, float] = (0.95, 1.05)
    hbm_bandwidth: tuple[float, float] = (0.85, 1.15)
    network_bandwidth: tuple[float, float] = (0.75, 1.35)
    network_latency: tuple[float, float] = (0.5, 2.0)
    hbm_capacity: tuple[float, float] = (1.0, 1.0)

    def to_dict(self) -> dict:
        return {f.name: list(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class RobustSettings:
    """``robustness.*`` of the run config; the defaults are ``conf/config.yaml``'s."""

    samples: int = 200
    seed: int = 0
    confidence: float = 0.9
    """The chosen plan is called robust when it wins at least this fraction of the worlds."""
    negligible_regret: float = 0.01
    """A worst regret (fraction of the world's fastest time) the verdict calls negligible."""
    ranges: Ranges = Ranges()


RANGE_NAMES = tuple(f.name for f in fields(Ranges))


def settings_from_config(cfg, run_seed: int) -> RobustSettings:
    """:class:`RobustSettings` from the ``robustness`` block of a run config (a mapping; missing
    keys take their defaults, ``seed: null`` the run's seed), or a one-line error."""
    cfg = dict(cfg or {})
    known = {"samples", "seed", "confidence", "negligible_regret", "ranges"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise UserError(
            f"robustness.{unknown[0]} is not a setting; use robustness.samples, .seed, "
            f".confidence, .negligible_regret or .ranges.<{'|'.join(RANGE_NAMES)}>"
        )
    default = RobustSettings()
    samples = cfg.get("samples", default.samples)
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= 100_000:
        raise UserError(f"robustness.samples={samples!r} must be an integer in 1..100000")
    seed = cfg.get("seed")
    seed = run_seed if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(
            f"robustness.seed={seed!r} must be a non-negative integer (null: the run's seed)"
        )
    confidence = cfg.get("confidence", default.confidence)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        confidence = None
    if confidence is None or not 0.5 <= confidence < 1:
        raise UserError(
            f"robustness.confidence={cfg.get('confidence')!r} must be a number in [0.5, 1): the "
            "fraction of samples the chosen plan must win to be called robust"
        )
    negligible = cfg.get("negligible_regret", default.negligible_regret)
    if isinstance(negligible, bool) or not isinstance(negligible, int | float) or negligible < 0:
        raise UserError(
            f"robustness.negligible_regret={negligible!r} must be a number >= 0: the worst "
            "regret (a fraction, 0.01 = 1 %) below which the choice does not matter"
        )
    given = dict(cfg.get("ranges") or {})
    bad = sorted(set(given) - set(RANGE_NAMES))
    if bad:
        raise UserError(
            f"robustness.ranges.{bad[0]} is not an uncertain input; use {', '.join(RANGE_NAMES)}"
        )
    ranges = {}
    for name in RANGE_NAMES:
        value = given.get(name, getattr(default.ranges, name))
        try:
            low, high = (float(x) for x in value)
        except (TypeError, ValueError):
            low = high = float("nan")
        if not 0 < low <= high < float("inf"):
            raise UserError(
                f"robustness.ranges.{name}={value!r} must be [low, high] with 0 < low <= high "
                f"(multiplicative factors, e.g. [0.9, 1.1]; [1, 1] turns it off)"
            )
        ranges[name] = (low, high)
    return RobustSettings(
        samples=samples,
        seed=seed,
        confidence=float(confidence),
        negligible_regret=float(negligible),
        ranges=Ranges(**ranges),
    )


def check_ranges(problem: Problem, settings: RobustSettings) -> None:
    """A one-line error when a range cannot apply to this problem: the smallest HBM capacity
    must stay above the device's reserve (the device would not be valid)."""
    device = problem.cluster.device
    low = settings.ranges.hbm_capacity[0]
    if device.hbm_bytes * low <= device.memory_reserve_bytes:
        raise UserError(
            f"robustness.ranges.hbm_capacity={list(settings.ranges.hbm_capacity)}: {low:g} x "
            f"{device.hbm_bytes / 2**30:.1f} GiB leaves nothing above the device's reserve of "
            f"{device.memory_reserve_bytes / 2**30:.1f} GiB; raise the low end"
        )


def _log_uniform(u: np.ndarray, low: float, high: float) -> np.ndarray:
    """Factors ``low * (high / low) ** u`` for uniform ``u`` in [0, 1) (exactly 1 when off)."""
    if low == high:
        return np.full_like(u, low)
    return low * (high / low) ** u


def _stable_hash(key) -> int:
    """A hash of ``repr(key)`` that is the same in every process (``hash()`` of a str is not)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


class PerturbedModel:
    """A layer model whose layers' compute times are scaled by per-(layer, shard) factors; every
    other question goes to the wrapped model (the :class:`~nest.core.problem.LayerModel`
    protocol)."""

    def __init__(self, base, factor) -> None:
        self._base = base
        self._factor = factor
        """``factor(ref, shard) -> float``."""
        self._cache: dict = {}

    def __getattr__(self, name):
        return getattr(self._base, name)

    @property
    def name(self) -> str:
        return self._base.name

    @property
    def seq_len(self) -> int:
        return self._base.seq_len

    def layer_cost(self, ref, shard: Shard, device) -> LayerCost:
        key = (ref, shard, device)
        cost = self._cache.get(key)
        if cost is None:
            cost = self._base.layer_cost(ref, shard, device)
            f = self._factor(ref, shard)
            if f != 1.0:
                cost = replace(
                    cost,
                    fwd_s=cost.fwd_s * f,
                    bwd_s=cost.bwd_s * f,
                    wgrad_s=cost.wgrad_s * f,
                    recompute_s={mode: t * f for mode, t in cost.recompute_s.items()},
                )
            self._cache[key] = cost
        return cost


class Worlds:
    """The ``samples`` perturbed problems of one robustness run (module docstring);
    ``reference`` is the chosen plan's shard (``W_1`` of the layer-time trend)."""

    def __init__(self, problem: Problem, settings: RobustSettings, reference: Shard) -> None:
        self.problem = problem
        self.settings = settings
        self.reference = reference
        n, levels = settings.samples, problem.cluster.num_levels
        r = settings.ranges
        u = np.random.default_rng(settings.seed).random((n, 4 + 2 * levels))
        self.matmul = _log_uniform(u[:, 0], *r.matmul_efficiency)
        self.hbm_bw = _log_uniform(u[:, 1], *r.hbm_bandwidth)
        self.hbm_capacity = _log_uniform(u[:, 2], *r.hbm_capacity)
        self.per_doubling = _log_uniform(u[:, 3], *r.layer_time_per_doubling)
        self.bandwidth = _log_uniform(u[:, 4 : 4 + levels], *r.network_bandwidth)
        self.latency = _log_uniform(u[:, 4 + levels :], *r.network_latency)
        self._layer_factors: dict = {}

    def _nominal_fwd_s(self, ref, shard: Shard) -> float:
        return self.problem.model.layer_cost(ref, shard, self.problem.cluster.device).fwd_s

    def layer_factors(self, ref, shard: Shard) -> np.ndarray:
        """The compute-time factor of one (layer, shard) in every world (module docstring)."""
        got = self._layer_factors.get((ref, shard))
        if got is None:
            key = (self.problem.model.cost_key(ref), shard)
            rng = np.random.default_rng([self.settings.seed, _stable_hash(key)])
            got = _log_uniform(rng.random(self.settings.samples), *self.settings.ranges.layer_time)
            size, size_1 = self._nominal_fwd_s(ref, shard), self._nominal_fwd_s(ref, self.reference)
            if size > 0 and size_1 > 0 and size != size_1:
                got = got * self.per_doubling ** np.log2(size / size_1)
            self._layer_factors[(ref, shard)] = got
        return got

    def world(self, s: int) -> Problem:
        """World ``s``: the problem with every uncertain input scaled by its factor."""
        problem = self.problem
        cluster, device = problem.cluster, problem.cluster.device
        device = replace(
            device,
            peak_flops_per_s=device.peak_flops_per_s * float(self.matmul[s]),
            hbm_bw_bytes_per_s=device.hbm_bw_bytes_per_s * float(self.hbm_bw[s]),
            hbm_bytes=device.hbm_bytes * float(self.hbm_capacity[s]),
        )
        levels = tuple(
            replace(
                level,
                bw_bytes_per_s=level.bw_bytes_per_s * float(self.bandwidth[s, k]),
                # the level's in-network all-reduce moves on the same links
                in_network_bw_bytes_per_s=level.in_network_bw_bytes_per_s
                * float(self.bandwidth[s, k]),
                latency_s=level.latency_s * float(self.latency[s, k]),
            )
            for k, level in enumerate(cluster.levels)
        )
        model = PerturbedModel(
            problem.model, lambda ref, shard: float(self.layer_factors(ref, shard)[s])
        )
        return replace(problem, model=model, cluster=replace(cluster, device=device, levels=levels))


def sample_times(problem: Problem, plans: list[Plan], settings: RobustSettings, progress=None):
    """``times[s, p]``: plan ``p``'s iteration time in world ``s`` by :func:`evaluate` (infinite
    where it does not fit)."""
    reference = plans[0].config.shard(plans[0].sequence_parallel)
    worlds = Worlds(problem, settings, reference)
    times = np.empty((settings.samples, len(plans)))
    for s in range(settings.samples):
        world = worlds.world(s)
        for p, plan in enumerate(plans):
            report = evaluate(world, plan)
            times[s, p] = report.iteration_time_s if report.feasible else np.inf
        if progress is not None:
            progress.done = s + 1
    return times


def _fraction_text(x: float) -> str:
    return f"{100 * x:.0f} %"


def _ranks_text(ranks: list[int]) -> str:
    names = [str(r) for r in ranks]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _quantiles(x: np.ndarray) -> dict | None:
    if x.size == 0:
        return None
    p05, p50, p95 = np.quantile(x, [0.05, 0.5, 0.95])
    return {
        "mean": float(x.mean()),
        "p05": float(p05),
        "median": float(p50),
        "p95": float(p95),
        "min": float(x.min()),
        "max": float(x.max()),
    }


def summarise(times: np.ndarray, nominal_s: list[float]) -> list[dict]:
    """Per plan: win probability, regrets and its time's spread over the worlds (module
    docstring); ``nominal_s`` are the unperturbed iteration times."""
    n, k = times.shape
    fits = np.isfinite(times)
    fastest = np.where(fits, times, np.inf).min(axis=1)  # inf: nothing fits in that world
    some = np.isfinite(fastest)
    winners = fits & (times <= fastest[:, None] * (1 + TIE_RELATIVE)) & some[:, None]
    share = np.where(winners, 1.0 / np.maximum(winners.sum(axis=1, keepdims=True), 1), 0.0)
    with np.errstate(invalid="ignore"):  # inf - inf where nothing fits: masked just below
        regret = np.where(fits, times - fastest[:, None], np.nan)
        same = np.abs(times - times[:, :1]) <= TIE_RELATIVE * np.abs(times[:, :1])
        relative = regret / fastest[:, None]
    same |= ~fits & ~fits[:, :1]
    out = []
    for p in range(k):
        ok = fits[:, p]
        r, rel = regret[ok, p], relative[ok, p]
        beats = None if p == 0 else float(np.mean(ok & (~fits[:, 0] | (times[:, p] < times[:, 0]))))
        out.append(
            {
                "rank": p + 1,
                "nominal_iteration_time_s": nominal_s[p],
                "win_probability": float(share[:, p].sum() / n),
                "beats_chosen_probability": beats,
                "tied_with_chosen": p > 0 and bool(same[:, p].all()),
                "fits_probability": float(ok.mean()),
                "expected_regret_s": float(r.mean()) if r.size else None,
                "worst_regret_s": float(r.max()) if r.size else None,
                "expected_regret_fraction": float(rel.mean()) if rel.size else None,
                "worst_regret_fraction": float(rel.max()) if rel.size else None,
                "iteration_time_s": _quantiles(times[ok, p]),
            }
        )
    return out


def verdict(
    plans: list[dict], samples: int, confidence: float, negligible_regret: float = 0.01
) -> dict:
    """``{"kind", "text", "contenders", "negligible"}``. Kinds: ``single`` (one plan, nothing to
    compare), ``robust`` (the chosen plan wins at least ``confidence`` of the worlds) or
    ``indistinguishable`` (the plans that win at least ``1 - confidence`` of the worlds, or
    every plan that wins any when none does, are the ``contenders``). ``negligible``: the chosen
    plan's worst regret is at most ``negligible_regret`` (a fraction of the world's fastest),
    so the choice among the contenders does not matter."""
    chosen = plans[0]
    spread = chosen["iteration_time_s"]
    if len(plans) == 1:
        text = (
            "one plan scored, nothing to compare (solver.top_k=5 compares the best five "
            "configurations); its iteration time is "
            + (
                f"{spread['p05']:.4g}-{spread['p95']:.4g} s (5-95 %) over {samples} samples"
                if spread
                else "undefined: it does not fit in any sample"
            )
        )
        return {"kind": "single", "text": text, "contenders": [1], "negligible": None}
    worst = chosen["worst_regret_fraction"]
    negligible = worst is not None and worst <= negligible_regret
    sentences = []
    if chosen["win_probability"] >= confidence:
        kind, contenders = "robust", [1]
        sentences.append(
            f"robust: plan 1 is the fastest of the {len(plans)} in "
            f"{_fraction_text(chosen['win_probability'])} of {samples} samples of the cost "
            "model's uncertainty."
        )
    else:
        kind = "indistinguishable"
        contenders = [p["rank"] for p in plans if p["win_probability"] >= 1 - confidence] or [
            p["rank"] for p in plans if p["win_probability"] > 0
        ]
        wins = ", ".join(
            _fraction_text(p["win_probability"]) for p in plans if p["rank"] in contenders
        )
        advice = (
            "it hardly matters which"
            if negligible
            else "the cost model cannot rank them: try them on the cluster"
        )
        if not contenders:
            sentences.append(f"indistinguishable: no plan fits in any of the {samples} samples.")
        elif len(contenders) > 1:
            sentences.append(
                f"indistinguishable: plans {_ranks_text(contenders)} are each the fastest in "
                f"{wins} of {samples} samples; {advice}."
            )
        else:
            sentences.append(
                f"indistinguishable: plan {contenders[0]} is the fastest in {wins} of {samples} "
                f"samples, the chosen plan in {_fraction_text(chosen['win_probability'])}; "
                f"{advice}."
            )
    tied = [p["rank"] for p in plans[1:] if p["tied_with_chosen"]]
    if tied:
        many = len(tied) > 1
        sentences.append(
            f"Plan{'s' if many else ''} {_ranks_text(tied)} take{'' if many else 's'} exactly "
            "the time of plan 1 in every sample: only what differs (e.g. memory) separates "
            f"{'them' if many else 'it'}."
        )
    if worst is not None:
        sentences.append(
            f"Choosing plan 1 costs {100 * chosen['expected_regret_fraction']:.2f} % on average "
            f"and {100 * worst:.2f} % at worst against each sample's fastest of the "
            f"{len(plans)}"
            + (f" (negligible: at most {100 * negligible_regret:g} %)." if negligible else ".")
        )
    return {
        "kind": kind,
        "text": " ".join(sentences),
        "contenders": contenders,
        "negligible": negligible,
    }


def robustness(
    problem: Problem, plans: list[Plan], settings: RobustSettings, progress=None
) -> dict:
    """``report.json["robustness"]``: the settings, per plan (best first) the numbers of
    :func:`summarise`, the chosen plan's ``win_probability``, and the :func:`verdict`."""
    times = sample_times(problem, plans, settings, progress)
    nominal = [evaluate(problem, plan).iteration_time_s for plan in plans]
    per_plan = summarise(times, nominal)
    return {
        "samples": settings.samples,
        "seed": settings.seed,
        "confidence": settings.confidence,
        "negligible_regret": settings.negligible_regret,
        "ranges": settings.ranges.to_dict(),
        # graph clusters price links, not levels: the network factors do not reach them
        "network_perturbed": problem.cluster.fabric.priced_by_levels,
        "correlation": (
            "one factor per world for the matmul rate, HBM bandwidth and capacity; one per level "
            "and world for network bandwidth and latency; one per (layer, shard) and world for "
            "layer times; every plan of a world sees the same factors"
        ),
        "win_probability": per_plan[0]["win_probability"],
        "plans": per_plan,
        "verdict": verdict(
            per_plan, settings.samples, settings.confidence, settings.negligible_regret
        ),
        "sample_times_s": [[t if np.isfinite(t) else None for t in row] for row in times.tolist()],
    }


def format_robustness(result: dict) -> str:
    """The summary's robustness lines: one row per plan and the verdict."""
    lines = [
        f"robustness over {result['samples']} samples of the cost model's uncertainty (seed "
        f"{result['seed']}; ranges in report.json)"
        + ("" if result.get("network_perturbed", True) else "; network not perturbed (a graph)")
        + ":",
        f"{'rank':>4} {'wins':>6} {'beats 1':>8} {'fits':>6} {'mean regret':>12} "
        f"{'worst regret':>13} {'iteration s, 5-95 %':>22}",
    ]
    for p in result["plans"]:
        spread = p["iteration_time_s"]
        beats = (
            "-"
            if p["beats_chosen_probability"] is None
            else (_fraction_text(p["beats_chosen_probability"]))
        )
        mean = (
            "-"
            if p["expected_regret_fraction"] is None
            else (f"{100 * p['expected_regret_fraction']:.2f} %")
        )
        worst = (
            "-"
            if p["worst_regret_fraction"] is None
            else (f"{100 * p['worst_regret_fraction']:.2f} %")
        )
        span = (
            "-"
            if spread is None
            else (f"{seconds_text(spread['p05'])}..{seconds_text(spread['p95'])}")
        )
        lines.append(
            f"{p['rank']:>4} {_fraction_text(p['win_probability']):>6} {beats:>8} "
            f"{_fraction_text(p['fits_probability']):>6} {mean:>12} {worst:>13} {span:>22}"
        )
    lines.append(f"verdict: {result['verdict']['text']}")
    return "\n".join(lines)


def plot_robustness(result: dict, labels: list[str], path) -> None:
    """``robustness.png``: each plan's win probability, and its regret over the samples relative
    to each sample's fastest plan (box: quartiles, orange: median, line: 5-95 %)."""
    from matplotlib.figure import Figure

    plans = result["plans"]
    times = np.array(
        [[np.inf if t is None else t for t in row] for row in result["sample_times_s"]]
    )
    fastest = times.min(axis=1)
    k = len(plans)
    fig = Figure(figsize=(10, 1.2 + 0.45 * k))
    win_ax, regret_ax = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [1, 2]})
    y = np.arange(k)
    names = [f"{p['rank']}: {label}" for p, label in zip(plans, labels, strict=True)]
    win_ax.barh(y, [100 * p["win_probability"] for p in plans], color="tab:blue")
    win_ax.set_yticks(y, names)
    win_ax.invert_yaxis()
    win_ax.set_xlim(0, 100)
    win_ax.set_xlabel("samples won, %")
    for p in range(k):
        ok = np.isfinite(times[:, p]) & np.isfinite(fastest)
        if not ok.any():
            continue
        slower = 100 * (times[ok, p] / fastest[ok] - 1)
        p05, p25, p50, p75, p95 = np.percentile(slower, [5, 25, 50, 75, 95])
        regret_ax.hlines(p, p05, p95, color="black", lw=1)
        regret_ax.barh(p, p75 - p25, left=p25, height=0.5, color="white", edgecolor="black")
        regret_ax.vlines(p50, p - 0.25, p + 0.25, color="tab:orange", lw=2)
    regret_ax.set_xlabel("slower than the sample's fastest plan, %")
    regret_ax.axvline(0, color="grey", lw=0.8)
    fig.suptitle(
        f"{result['samples']} samples, seed {result['seed']}: {result['verdict']['kind']}",
        fontsize=10,
    )
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
