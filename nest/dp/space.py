"""The structured search space shared by the NEST DP and the brute-force oracle.

A *configuration* fixes everything but the layer partition and the per-stage recompute modes:
``tp, cp, ep, dp, pp`` (their product at most the cluster's devices; the rest stay idle), the
microbatch size, the ZeRO stage and the rank order of the axes (``tp`` innermost, any order of
``cp, dp, pp`` above it). Validity follows the model's shard rules and the evaluator's checks.
Duplicates are dropped: rank orders that give the same placement, and ZeRO stages 1-3 when
``dp * cp == 1`` (nothing to shard: they cost exactly what stage 0 costs).

The schedule is 1F1B. GPipe is left out because under the shared cost model it takes the same
time as 1F1B and holds at least as many activations (``m >= min(p - r, m)``), so it is never
better; interleaving is not searched yet (its chunks of one rank are not contiguous, which the
recurrence does not cover).
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import permutations

from nest.axes import Axis, Recompute
from nest.errors import UserError
from nest.layers import Shard
from nest.problem import Problem


@dataclass(frozen=True, slots=True)
class SearchConfig:
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    mbs: int
    zero: int
    order: tuple[Axis, ...]

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.dp * self.pp


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceOptions:
    """Restrictions of the space (hyper-parameters of the planners); None means everything."""

    tp: Sequence[int] | None = None
    cp: Sequence[int] | None = None
    ep: Sequence[int] | None = None
    pp: Sequence[int] | None = None
    zero_stages: Sequence[int] = (0, 1, 2, 3)
    recompute: Sequence[str] = ("none", "selective", "full")
    rank_orders: Sequence[str] | None = None
    """e.g. ``["tp,cp,dp,pp", "tp,cp,pp,dp"]``; None: every order with tp innermost."""

    @property
    def recompute_modes(self) -> tuple[Recompute, ...]:
        try:
            return tuple(Recompute(m) for m in self.recompute)
        except ValueError:
            raise UserError(
                f"solver.recompute={list(self.recompute)}; use values of "
                f"{[r.value for r in Recompute]}"
            ) from None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _orders(options: SpaceOptions) -> list[tuple[Axis, ...]]:
    if options.rank_orders is None:
        return [(Axis.TP, *rest) for rest in permutations((Axis.CP, Axis.DP, Axis.PP))]
    from nest.axes import parse_rank_order

    return [parse_rank_order(o) for o in options.rank_orders]


def configurations(problem: Problem, options: SpaceOptions) -> Iterator[SearchConfig]:
    """Every valid configuration of the space, deduplicated (see the module docstring)."""
    model, training = problem.model, problem.training
    n = problem.cluster.num_devices
    chain = problem.num_layers
    spec = model.spec
    orders = _orders(options)
    batch_divisors = _divisors(training.global_batch)
    for tp in options.tp or _divisors(n):
        for cp in options.cp or _divisors(n // tp):
            for pp in options.pp or range(1, chain + 1):
                if pp > chain or tp * cp * pp > n:
                    continue
                # dp must divide the global batch (m = batch / (mbs * dp) is an integer)
                for dp in batch_divisors:
                    if dp > n // (tp * cp * pp):
                        break
                    eps = options.ep or (_divisors(spec.num_experts) if spec.is_moe else [1])
                    for ep in eps:
                        if (dp * cp) % ep:
                            continue
                        shard = Shard(tp=tp, cp=cp, ep=ep, sp=training.sequence_parallel and tp > 1)
                        if model.shard_problem(shard) is not None:
                            continue
                        yield from _inner(problem, options, orders, tp, cp, ep, dp, pp)


def _inner(problem, options, orders, tp, cp, ep, dp, pp) -> Iterator[SearchConfig]:
    training = problem.training
    zeros = [0] if dp * cp == 1 else list(options.zero_stages)
    # two orders place every device alike iff the axes of degree > 1 come in the same order
    degree = {Axis.TP: tp, Axis.CP: cp, Axis.DP: dp, Axis.PP: pp}
    seen: set[tuple] = set()
    placed_orders = []
    for order in orders:
        key = tuple(a for a in order if degree[a] > 1)
        if key not in seen:
            seen.add(key)
            placed_orders.append(order)
    for mbs in training.microbatch_sizes:
        if training.global_batch % (mbs * dp):
            continue
        for zero in zeros:
            for order in placed_orders:
                yield SearchConfig(tp, cp, ep, dp, pp, mbs, zero, order)


class SpacePlanner:
    """The hyper-parameters that restrict the space, shared by ``nest`` and ``brute`` (each
    stores them verbatim; ``None`` means every valid value)."""

    def __init__(
        self,
        *,
        name: str,
        tp: Sequence[int] | None = None,
        cp: Sequence[int] | None = None,
        ep: Sequence[int] | None = None,
        pp: Sequence[int] | None = None,
        zero_stages: Sequence[int] = (0, 1, 2, 3),
        recompute: Sequence[str] = ("none", "selective", "full"),
        rank_orders: Sequence[str] | None = None,
    ) -> None:
        self.name = name
        self.tp, self.cp, self.ep, self.pp = tp, cp, ep, pp
        self.zero_stages = zero_stages
        self.recompute = recompute
        self.rank_orders = rank_orders

    def options(self) -> SpaceOptions:
        return SpaceOptions(
            tp=self.tp,
            cp=self.cp,
            ep=self.ep,
            pp=self.pp,
            zero_stages=tuple(self.zero_stages),
            recompute=tuple(self.recompute),
            rank_orders=self.rank_orders,
        )
