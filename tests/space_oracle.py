"""An independent enumeration of the NEST structured space, written from its stated rules alone.

``nest``, ``brute``, ``cpsat``, ``milp`` and the general-placement oracle all iterate
:func:`nest.dp.space.configurations`, so their agreement cannot see a configuration missing from
(or duplicated in) that space. This module enumerates the space again without importing
:mod:`nest.dp.space`: every candidate value is tried (``1 .. devices`` for each degree) and kept
iff it passes the rules as they are written, each rule quoted with where it is stated:

- [S] the module docstring of ``nest/dp/space.py`` (the space's written contract);
- [D] ``DESIGN.md`` §4 (the plan and its space) and §6 (the ``nest`` planner);
- [M] :meth:`nest.core.layers.AnalyticModel.shard_problem` (the model's shard rules, its
  docstring and messages) and :meth:`~nest.core.layers.AnalyticModel.shard_rules`;
- [G] the docstring of ``nest/cost/groups.py`` (which devices form each group of a rank).

Two rank orders are the same point of the space iff they place every device alike; here that is
decided by computing the placement each order produces (:func:`grid`, mixed-radix device ids in
the order, innermost first, as the docstring of :func:`nest.core.plan.place` states) and the groups
it forms (:func:`placement`), never by the space's own shortcut ("the axes of degree > 1 in the
same order"), which ``tests/test_space_oracle.py`` checks against this one.

Only the public domain types are used (:class:`~nest.core.plan.ParallelConfig`, the problem, the
rank-order parser); the space's options are taken as the planner's keyword arguments
(``tp=[...]``, ``rank_orders=[...]``, ...), with ``None`` meaning every valid value.
"""

import dataclasses
import math
from functools import cache
from itertools import combinations, permutations, product

import numpy as np

from nest.core.axes import Axis, Recompute, Schedule, parse_rank_order
from nest.core.plan import ParallelConfig, make_structured_plan

ALL_ORDERS: tuple[tuple[Axis, ...], ...] = tuple(
    (Axis.TP, *rest) for rest in permutations((Axis.CP, Axis.DP, Axis.PP))
)
"""[S] "the rank order: ``tp`` innermost, any order of ``cp, dp, pp`` above it" (six orders),
in lexicographic order of the three outer axes (cp < dp < pp, the order the docstring lists
them in); among orders that place every device alike "the first" is kept."""

ORDER_STRINGS: tuple[str, ...] = tuple(",".join(a.value for a in o) for o in ALL_ORDERS)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ------------------------------------------------------------------------------ model rules
def shard_allowed(spec, *, tp: int, cp: int, ep: int, sp: bool, etp: int | None = None) -> bool:
    """[M] ``tp`` divides heads, KV heads and the FFN size (a routed expert's FFN: the expert
    tensor degree ``etp`` does, ``tp`` when None); ``cp > 1`` needs ``seq_len`` divisible by
    ``2 cp`` (load-balanced context parallelism); ``ep`` divides the experts and is 1 for a dense
    model; a mixture of experts with ``tp > 1`` needs sequence parallelism (Megatron-Core asserts
    it)."""
    if spec.heads % tp or spec.num_kv_heads % tp:
        return False
    dense_blocks = not spec.is_moe or any(not spec.block_is_moe(i) for i in range(spec.layers))
    if dense_blocks and spec.ffn_hidden % tp:
        return False
    if spec.is_moe and (spec.expert_ffn % (tp if etp is None else etp) or spec.shared_ffn % tp):
        return False
    if cp > 1 and spec.seq_len % (2 * cp):
        return False
    if spec.num_experts % ep or (ep > 1 and not spec.is_moe):
        return False
    return not (spec.is_moe and tp > 1 and not sp)


# ------------------------------------------------------------------------------ placement
@cache
def placement_of(
    tp: int, cp: int, dp: int, pp: int, ep: int, order: tuple[Axis, ...], etp: int | None = None
) -> tuple:
    """:func:`placement` of the :func:`grid` of a rank order (cached: the same degrees recur
    across configurations)."""
    return placement(grid(tp, cp, dp, pp, order), ep, etp)


def grid(tp: int, cp: int, dp: int, pp: int, order) -> np.ndarray:
    """Device ids ``[pp][dp][cp][tp]`` of a rank order: the rank coordinates are the digits of
    the device id, innermost (least significant) first (:func:`nest.core.plan.place`'s
    docstring; DESIGN.md §4: "a rank order of the axes (innermost first) ... mapped onto device
    ids"). Written here as a loop over ranks, not as ``place``'s stride arithmetic."""
    degree = {Axis.TP: tp, Axis.CP: cp, Axis.DP: dp, Axis.PP: pp}
    out = np.empty((pp, dp, cp, tp), dtype=np.int64)
    for p, d, c, t in product(range(pp), range(dp), range(cp), range(tp)):
        coord = {Axis.TP: t, Axis.CP: c, Axis.DP: d, Axis.PP: p}
        device, radix = 0, 1
        for axis in order:
            device += coord[axis] * radix
            radix *= degree[axis]
        out[p, d, c, t] = device
    return out


def placement(devices: np.ndarray, ep: int, etp: int | None = None) -> tuple:
    """Which devices form each group, per pipeline rank (in pipeline order), and each pipeline
    (the devices one microbatch's boundary activations cross, rank by rank):

    [G] ``tp``: the devices of one (replica, context rank); ``cp``: of one (replica, tensor
    rank); ``ep``: ``ep`` consecutive data x context ranks (replica-major) of one tensor rank;
    ``dense_dp``: all data x context ranks of one tensor rank; ``expert_dp``: the ranks holding
    the same experts (same position in their ``ep`` block, same tensor rank). With whole experts
    (``etp = 1``, Megatron-Core's MoE parallel folding) the devices of the rank, replica-major
    with the tensor rank innermost, are read as one line: ``ep`` consecutive devices form an
    expert group, and the devices at the same position of every expert group hold the same
    experts.

    Groups are sets (a collective's cost sees a group's members); two placements are the same
    iff every rank has the same device set and the same groups of every kind, and the same
    pipelines connect them."""
    pp, dp, cp, tp = devices.shape
    devices = devices.tolist()
    ranks = []
    for r in range(pp):
        g = devices[r]  # [dp][cp][tp]
        rows = [(d, c) for d in range(dp) for c in range(cp)]  # replica-major data x context ranks

        def groups(members):
            return frozenset(frozenset(m) for m in members)

        tp_groups = groups(g[d][c] for d, c in rows)
        cp_groups = groups([g[d][c][t] for c in range(cp)] for d in range(dp) for t in range(tp))
        if etp is None:
            ep_groups = groups(
                [g[d][c][t] for d, c in rows[b * ep : (b + 1) * ep]]
                for b in range(dp * cp // ep)
                for t in range(tp)
            )
            expert_dp = groups(
                [g[d][c][t] for d, c in rows[j::ep]] for j in range(ep) for t in range(tp)
            )
        else:
            line = [g[d][c][t] for d, c in rows for t in range(tp)]
            ep_groups = groups(line[b * ep : (b + 1) * ep] for b in range(len(line) // ep))
            expert_dp = groups(line[j::ep] for j in range(ep))
        dense_dp = groups([g[d][c][t] for d, c in rows] for t in range(tp))
        ranks.append((tp_groups, cp_groups, ep_groups, dense_dp, expert_dp))
    pipelines = frozenset(
        tuple(devices[r][d][c][t] for r in range(pp))
        for d, c, t in product(range(dp), range(cp), range(tp))
    )
    return tuple(ranks), pipelines


# ------------------------------------------------------------------------------ schedules
def even_chunks(blocks: int, chunks: int) -> list[int] | None:
    """Chain layers per chunk of the interleaved split, or None.

    [S] "``pp * v`` chunks split the chain evenly: ``pp * v`` divides the blocks (the embedding
    joined to chunk 0 and the head to the last chunk), or divides the blocks + 2 while not
    exceeding the blocks" (Megatron-LM's ``--account-for-embedding/loss-in-pipeline-split``:
    ``(blocks + 2) / (pp v)`` chain layers per chunk)."""
    if chunks > blocks:
        return None
    if blocks % chunks == 0:
        per = blocks // chunks
        return [per + (k == 0) + (k == chunks - 1) for k in range(chunks)]
    if (blocks + 2) % chunks == 0:
        return [(blocks + 2) // chunks] * chunks
    return None


def schedules(options: dict, blocks: int, pp: int, m: int) -> list[tuple[Schedule, int]]:
    """[S] ``(1f1b, 1)``, or ``(interleaved, v)`` when ``pp >= 2``, ``v >= 2`` (one of
    ``virtual_stages``; None: any), ``pp`` divides ``m`` (Megatron-LM's rule) and the chunks
    split the chain evenly (:func:`even_chunks`). GPipe is left out ([S]: never better)."""
    kinds = options.get("schedules", ("1f1b", "interleaved"))
    out = []
    if "1f1b" in kinds:
        out.append((Schedule.ONE_F_ONE_B, 1))
    if "interleaved" in kinds and pp >= 2 and m % pp == 0:
        vs = options.get("virtual_stages") or range(2, blocks + 3)
        out += [(Schedule.INTERLEAVED, v) for v in vs if v >= 2 and even_chunks(blocks, pp * v)]
    return out


# ------------------------------------------------------------------------------ the space
def _allowed(options: dict, key: str, value) -> bool:
    """An option restricts the space (``SpaceOptions``: "Restrictions of the space"): a value
    must be listed (None: every value) and pass every rule; a listed value never adds one."""
    given = options.get(key)
    return given is None or value in given


def orders(options: dict) -> list[tuple[Axis, ...]]:
    """[S] every order with ``tp`` innermost, or the given ``rank_orders`` (parsed by the public
    parser: axes left out follow in Megatron order), in the given order."""
    given = options.get("rank_orders")
    return list(ALL_ORDERS) if given is None else [parse_rank_order(o) for o in given]


def _degrees(n: int):
    """Every ``(tp, cp, dp, pp)`` of positive integers with product at most ``n`` (the rules
    are applied by the caller)."""
    for tp in range(1, n + 1):
        for cp in range(1, n // tp + 1):
            for dp in range(1, n // (tp * cp) + 1):
                for pp in range(1, n // (tp * cp * dp) + 1):
                    yield tp, cp, dp, pp


def oracle_space(problem, options: dict) -> dict:
    """Every point of the space: ``(configuration without rank order, placement) -> the rank
    orders (in :func:`orders`' order) that produce that placement``. The configuration the
    space should yield for a point is the first of its orders ([S]: "kept once, the first")."""
    spec = problem.model.spec
    training = problem.training
    n = problem.cluster.num_devices
    chain = problem.num_layers
    blocks = chain - 2
    sp = training.sequence_parallel
    gb = training.global_batch
    zero_stages = options.get("zero_stages", (0, 1, 2, 3))
    points: dict = {}
    for tp, cp, dp, pp in _degrees(n):
        # [S] tp divides the devices, cp divides devices / tp, pp is 1 .. chain length,
        # tp cp pp dp at most the devices (the rest stay idle; [D] §4 "Devices may stay idle")
        if n % tp or (n // tp) % cp or pp > chain or tp * cp * dp * pp > n:
            continue
        # [S] dp divides the global batch
        if gb % dp:
            continue
        if not all(_allowed(options, k, v) for k, v in (("tp", tp), ("cp", cp), ("pp", pp))):
            continue
        # [S] a MoE model's experts split like the dense weights (None) or whole (etp 1)
        etps = (None, 1) if spec.is_moe and tp > 1 else (None,)
        for ep, etp in product(range(1, n * max(spec.num_experts, 1) + 1), etps):
            # [S]/[D] ep divides the experts and dp * cp (x tp with whole experts); [M] the
            # shard's own rules
            fold = tp if etp == 1 else 1
            if (dp * cp * fold) % ep or not _allowed(options, "ep", ep):
                continue
            if not shard_allowed(spec, tp=tp, cp=cp, ep=ep, sp=sp and tp > 1, etp=etp):
                continue
            # [S] ZeRO 0-3, only 0 when dp * cp == 1 and no expert is replicated (nothing to
            # shard: whole experts replicate over the folded tensor ranks)
            replicas = dp * cp * fold // ep if spec.is_moe else 1
            alone = dp * cp == 1 and replicas == 1
            zeros = [0] if alone else [z for z in (0, 1, 2, 3) if z in zero_stages]
            placed: dict = {}
            for order in orders(options):
                key = placement_of(tp, cp, dp, pp, ep, order, etp)
                placed.setdefault(key, []).append(order)
            for mbs in training.microbatch_sizes:
                # [S] mbs * dp divides the global batch; m = batch / (mbs dp) per replica
                if gb % (mbs * dp):
                    continue
                m = gb // (mbs * dp)
                for (kind, v), zero in product(schedules(options, blocks, pp, m), zeros):
                    config = ParallelConfig(
                        tp=tp,
                        cp=cp,
                        ep=ep,
                        etp=etp,
                        dp=dp,
                        pp=pp,
                        microbatch_size=mbs,
                        zero_stage=zero,
                        schedule=kind,
                        virtual_stages=v,
                    )
                    for key, same in placed.items():
                        points[(config, key)] = same
    return points


def space_points(configs) -> list:
    """The space's configurations as ``(configuration without rank order, placement)``."""
    return [
        (
            c.unordered(),
            placement_of(c.tp, c.cp, c.dp, c.pp, c.ep, tuple(c.rank_order), c.etp),
        )
        for c in configs
    ]


# ------------------------------------------------------------------------------ its plans
def partitions(n_layers: int, parts: int):
    """[S] 1F1B: every partition of the chain into ``parts`` non-empty contiguous stages, as
    layer counts."""
    for cuts in combinations(range(1, n_layers), parts - 1):
        bounds = (0, *cuts, n_layers)
        yield [bounds[k + 1] - bounds[k] for k in range(parts)]


def _stages(problem, config: ParallelConfig, recompute):
    """For each layer split of the configuration (layer counts per stage or chunk), the modes
    each stage may take: [S] 1F1B, any partition; interleaved, the even chunks
    (:func:`even_chunks`); a stage without blocks (embedding and / or head alone) is ``none``."""
    chain = problem.num_layers
    if config.schedule is Schedule.INTERLEAVED:
        splits = [even_chunks(chain - 2, config.pp * config.virtual_stages)]
    else:
        splits = partitions(chain, config.pp)
    for counts in splits:
        first, choices = 0, []
        for count in counts:
            holds_block = any(0 < i < chain - 1 for i in range(first, first + count))
            choices.append([Recompute(r) for r in recompute] if holds_block else [Recompute.NONE])
            first += count
        yield counts, choices


def plan_count(problem, config: ParallelConfig, recompute) -> int:
    """How many plans :func:`plans` yields."""
    return sum(math.prod(map(len, choices)) for _, choices in _stages(problem, config, recompute))


def plans(problem, config: ParallelConfig, order, recompute):
    """Every plan of a configuration placed by ``order`` (:func:`grid`): [S] each split of
    :func:`_stages` with every choice of modes; chunk ``k`` on pipeline rank ``k % pp``."""
    devices = grid(config.tp, config.cp, config.dp, config.pp, order)
    m = problem.training.global_batch // (config.microbatch_size * config.dp)
    for counts, choices in _stages(problem, config, recompute):
        for modes in product(*choices):
            yield make_structured_plan(
                dataclasses.replace(config, rank_order=order),
                layer_counts=counts,
                recompute=modes,
                num_microbatches=m,
                sequence_parallel=problem.training.sequence_parallel,
                grid=devices,
            )
