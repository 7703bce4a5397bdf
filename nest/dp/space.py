"""The structured search space shared by the NEST DP, the brute-force oracle and the exact solvers.

This module is the single definition of the space: :func:`configurations` yields every
configuration (:class:`~nest.core.plan.ParallelConfig`), and a plan of the space is a configuration
plus its partition and recompute modes as stated below. Planners that must search "the same
space" iterate over it rather than re-deriving the rules.

**A configuration** (:class:`~nest.core.plan.ParallelConfig`) fixes everything but the layer
partition and the recompute modes:

- ``tp`` divides the devices, ``cp`` divides ``devices / tp``, ``pp`` is 1 .. chain length, and
  ``tp * cp * pp * dp`` is at most the devices (the rest stay idle);
- ``dp`` divides the global batch; ``ep`` divides the experts (1 for dense models) and
  ``dp * cp * tp / etp``; ``etp`` (MoE models only) is ``tp`` (None) or 1 (whole experts:
  Megatron-Core's MoE parallel folding), among ``SpaceOptions.etp``;
  the shard ``(tp, cp, ep, etp)`` passes the model's rules (``tp`` divides heads, KV heads and
  the FFN size; ``seq_len`` divisible by ``2 cp``; ...);
- the microbatch size ``mbs`` is one of ``training.microbatch_sizes`` with ``mbs * dp`` dividing
  the global batch; ``m = global_batch / (mbs * dp)`` microbatches per replica;
- the ZeRO stage 0-3 (only 0 when ``dp * cp == 1`` and no expert is replicated, i.e. the
  expert data parallelism ``dp * cp * tp / (etp * ep)`` is 1: nothing to shard, stages 1-3
  cost exactly what 0 costs);
- what it keeps in host memory (:class:`~nest.core.plan.Offload`): nothing, and, when
  ``SpaceOptions.offload`` is set and the device has a host link, also the optimizer state
  (:attr:`~nest.core.plan.ParallelConfig.optimizer_offload`, where the optimizer keeps state:
  :func:`nest.cost.state.can_offload_optimizer`), the blocks' stored activations
  (:attr:`~nest.core.plan.ParallelConfig.activation_offload`), and both; off by default, so the
  space is unchanged unless asked;
- hybrid sharding, only when ``SpaceOptions.zero_shards`` asks for it (off by default): the
  ZeRO state of stages 1-3 sharded within groups of ``zero_shard`` data-parallel replicas
  (:attr:`~nest.core.plan.ParallelConfig.zero_shard`), every divisor of ``dp`` below ``dp``
  (``"all"``) or the listed ones that are, for configurations with ``dp >= 2``, each shard
  degree whose shard group holds whole expert groups (``ep`` divides ``zero_shard x cp x tp /
  etp``); ``zero_shard = dp`` is the plain configuration, already in the space;
- the rank order: ``tp`` innermost, any order of ``cp, dp, pp`` above it; orders that place every
  device alike (same order of the axes of degree > 1) are kept once, the first in
  :func:`_orders`' order;
- the schedule ``(schedule, v)`` among ``SpaceOptions.schedules``: ``(1f1b, 1)``, or
  ``(interleaved, v)`` when ``pp >= 2``, ``v >= 2`` (one of ``SpaceOptions.virtual_stages``;
  None: any), ``pp`` divides ``m`` (Megatron-LM's rule) and ``pp * v`` chunks split the chain
  evenly (:func:`chunk_split`: ``pp * v`` divides the blocks, or divides the blocks + 2 while
  not exceeding the blocks, which leaves every chunk at least two chain layers). GPipe is left
  out: under the shared cost model it takes the same time as 1F1B and holds at least as many
  activations (``m >= min(p - r, m)``), so it is never better. ``(zb_h1, 1)`` (zero bubble,
  Qi et al. ICLR 2024 §2.1) when listed in ``SpaceOptions.schedules`` (not by default), with
  ``pp >= 2`` (with one stage it is 1F1B) and ``m >= pp``; its plans are 1F1B's (any partition,
  a recompute mode per stage). ``(zb_h2, 1)`` (§2.2) likewise, with ``m >= 2 pp - 1``.
  ``(zb_v, 2)`` (ZB-V, Qi et al. arXiv 2405.15362 §3) when listed, with ``pp >= 2``,
  ``m >= 2 pp - 1`` and an even split of the blocks into ``2 pp`` chunks; its plans are
  interleaved ``v = 2``'s partition with the chunks placed in a V
  (:func:`nest.core.plan.chunk_rank`) and a recompute mode per chunk; ``nest`` searches it
  exactly (:mod:`nest.dp.zb_v`). ``(dualpipe_v, 2)`` (DeepSeek's DualPipeV,
  :mod:`nest.cost.dualpipe`) likewise, with ``m >= 2 pp``: ZB-V's chunks and placement;
  ``nest`` searches it exactly (:mod:`nest.dp.dualpipe_v`).

**Its plans**:

- 1F1B, ZB-H1 and ZB-H2: any partition of the chain (embedding, blocks, head) into ``pp`` non-empty
  contiguous stages, stage ``r`` on pipeline rank ``r``, and one recompute mode per stage;
- interleaved with ``v``: the partition Megatron-Core runs (:func:`interleaved_chunks`): ``pp * v``
  chunks of ``blocks / (pp v)`` consecutive blocks each, the embedding joined to chunk 0 and the
  head to the last chunk; where ``pp * v`` does not divide the blocks but divides the blocks + 2,
  the split with the embedding and the loss counted as layers (Megatron-LM's
  ``--account-for-embedding/loss-in-pipeline-split``: ``(blocks + 2) / (pp v)`` chain layers per
  chunk, one block fewer in the first and the last); chunk ``k`` on pipeline rank ``k % pp``;
  one recompute mode per chunk.

Recompute modes come from ``SpaceOptions.recompute``; a stage without blocks (only embedding and
/ or head) has nothing to recompute and is ``none``. With ``block`` in it (every-n-blocks full
recompute, Megatron-LM's ``--recompute-method block``), a 1F1B or ZB-H2 stage without activation
offload may also fully recompute its first ``k`` blocks (``1 <= k <`` its blocks) and run the
rest in a listed mode other than ``full`` (:func:`block_options`); interleaved chunks, ZB-H1
and activation offload keep one mode per stage (the DP's fastest-fitting rule for ``k``,
:mod:`nest.dp.recurrence`, needs a stage time non-decreasing in ``k`` and the single-fastest
extension, which ZB-H1's credit and offload's copies break).

Interleaved plans take a mode per chunk, not per rank: the plan format stores one per chunk, a
rank's chunks share its in-flight count, so recomputing only some of them is a real middle
ground between two uniform modes, and the exact per-rank search (:mod:`nest.dp.interleaved`)
costs little more.

Mirroring it (e.g. a CP-SAT or MILP model of "the same space"): iterate :func:`configurations`
(or :func:`families`, which groups configurations sharing ``(tp, cp, ep, dp, pp, mbs, etp)``), take
the partition rule from ``config.schedule`` (:func:`interleaved_chunks` for interleaved) and the
modes from ``SpaceOptions.recompute_modes``; ``baselines/brute.py`` is the reference
enumeration.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import permutations

from nest.core.axes import (
    BLOCK_RECOMPUTE,
    Axis,
    Recompute,
    Schedule,
    divisors,
    parse_rank_order,
    parse_recompute_modes,
)
from nest.core.errors import UserError
from nest.core.layers import Shard
from nest.core.plan import NO_OFFLOAD, BlockRecompute, Offload, ParallelConfig
from nest.core.problem import Problem
from nest.cost.state import can_offload_optimizer

ONE_F_ONE_B = (Schedule.ONE_F_ONE_B, 1)


def block_searchable(config: ParallelConfig) -> bool:
    """Whether the space holds every-n-blocks options for ``config``'s stages: 1F1B and ZB-H2
    without activation offload (module docstring)."""
    return (
        config.schedule in (Schedule.ONE_F_ONE_B, Schedule.ZB_H2) and not config.activation_offload
    )


def block_options(bases, n_blocks: int) -> list:
    """The every-n-blocks choices of a stage holding ``n_blocks`` blocks: ``(base, k)`` for
    each base mode and ``1 <= k < n_blocks`` (``k = 0`` is the base mode itself, ``k =
    n_blocks`` is ``full``)."""
    return [BlockRecompute(b, k) for b in bases for k in range(1, n_blocks)]


@dataclass(frozen=True, slots=True)
class Family:
    """The configurations sharing ``(tp, cp, ep, dp, pp, mbs, etp, zero_shard)``: every
    combination of its schedules, ZeRO stages, offloads and rank orders (in that nesting order)."""

    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    microbatch_size: int
    m: int
    """Microbatches per replica."""
    schedules: tuple[tuple[Schedule, int], ...]
    zeros: tuple[int, ...]
    orders: tuple[tuple[Axis, ...], ...]
    etp: int | None = None
    """Expert tensor degree: None (= tp) or 1 (:attr:`ParallelConfig.etp`)."""
    offloads: tuple[Offload, ...] = (NO_OFFLOAD,)
    """What the configurations keep in host memory: nothing, or also the optimizer state, the
    activations and both (:class:`~nest.core.plan.Offload`)."""
    zero_shard: int | None = None
    """Hybrid sharding's shard degree (:attr:`ParallelConfig.zero_shard`); None: all ``dp``."""

    @property
    def fold(self) -> int:
        """``tp / etp`` (:attr:`ParallelConfig.expert_fold`)."""
        return 1 if self.etp is None else self.tp // self.etp

    def config(
        self, schedule: tuple[Schedule, int], zero: int, order, offload: Offload = NO_OFFLOAD
    ) -> ParallelConfig:
        kind, v = schedule
        return ParallelConfig(
            tp=self.tp,
            cp=self.cp,
            ep=self.ep,
            etp=self.etp,
            dp=self.dp,
            pp=self.pp,
            microbatch_size=self.microbatch_size,
            zero_stage=zero,
            zero_shard=self.zero_shard,
            schedule=kind,
            virtual_stages=v,
            rank_order=order,
            optimizer_offload=offload.optimizer,
            activation_offload=offload.activations,
        )

    def entries(self) -> list[tuple[tuple[Schedule, int], int, Offload]]:
        """``(schedule, zero, offload)`` of every configuration but the rank order, in the
        nesting order of :meth:`configs`."""
        return [
            (schedule, zero, offload)
            for schedule in self.schedules
            for zero in self.zeros
            for offload in self.offloads
        ]

    def configs(self) -> Iterator[ParallelConfig]:
        for schedule, zero, offload in self.entries():
            for order in self.orders:
                yield self.config(schedule, zero, order, offload)

    def __len__(self) -> int:
        return len(self.schedules) * len(self.zeros) * len(self.offloads) * len(self.orders)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceOptions:
    """Restrictions of the space (hyper-parameters of the planners); None means everything."""

    tp: Sequence[int] | None = None
    cp: Sequence[int] | None = None
    ep: Sequence[int] | None = None
    pp: Sequence[int] | None = None
    zero_stages: Sequence[int] = (0, 1, 2, 3)
    recompute: Sequence[str] = ("none", "selective", "mlp", "selective_mlp", "full")
    rank_orders: Sequence[str] | None = None
    """e.g. ``["tp,cp,dp,pp", "tp,cp,pp,dp"]``; None: every order with tp innermost."""
    schedules: Sequence[str] = ("1f1b", "interleaved")
    virtual_stages: Sequence[int] | None = None
    """Interleaved ``v`` candidates; None: every ``v >= 2`` whose ``pp * v`` chunks split the
    chain evenly (:func:`chunk_split`)."""
    etp: Sequence[int | str] | None = None
    """Expert tensor degrees of MoE models: ``"tp"`` (experts split like the dense weights) and
    / or ``1`` (whole experts); None: both."""
    offload: bool = False
    """Also search the optimizer state and the activations offloaded to host memory
    (:class:`~nest.core.plan.Offload`; ``solver.offload``)."""
    zero_shards: Sequence[int | str] | None = None
    """Hybrid sharding (HSDP) degrees to search besides sharding over all ``dp``: None (off,
    the default), ``["all"]`` (every divisor of ``dp`` below it) or shard degrees (those that
    divide a configuration's ``dp`` are searched with it)."""

    def shard_degrees(self, dp: int) -> tuple[int, ...]:
        """The hybrid shard degrees searched with ``dp`` replicas (:attr:`zero_shards`)."""
        if not self.zero_shards:
            return ()
        wanted = tuple(self.zero_shards)
        if "all" in wanted:
            return tuple(d for d in divisors(dp) if d < dp)
        bad = [z for z in wanted if not isinstance(z, int) or isinstance(z, bool) or z < 1]
        if bad:
            raise UserError(
                f"solver.zero_shards={list(wanted)}: {bad[0]!r} is not a shard degree; use "
                "positive integers (data-parallel ranks per ZeRO shard group), [all] or null"
            )
        return tuple(sorted({z for z in wanted if z < dp and dp % z == 0}))

    def etp_values(self, tp: int, is_moe: bool) -> tuple[int | None, ...]:
        """The ``etp`` of the configurations with tensor degree ``tp`` (None = ``tp``)."""
        if not is_moe:
            return (None,)
        wanted = ("tp", 1) if self.etp is None else tuple(self.etp)
        bad = [e for e in wanted if e not in ("tp", 1)]
        if bad:
            raise UserError(
                f"solver.etp={list(wanted)}: {bad[0]!r} is not an expert tensor degree; use "
                "'tp' (experts split like the dense weights) and / or 1 (whole experts)"
            )
        out: list[int | None] = []
        for e in wanted:
            value = None if e == "tp" or tp == 1 else 1
            if value not in out:
                out.append(value)
        return tuple(out)

    @property
    def recompute_modes(self) -> tuple[Recompute, ...]:
        return parse_recompute_modes(self.recompute, block=True)

    @property
    def block_recompute(self) -> bool:
        """Whether ``solver.recompute`` lists :data:`~nest.core.axes.BLOCK_RECOMPUTE`."""
        return BLOCK_RECOMPUTE in self.recompute

    def block_bases(self, config: ParallelConfig) -> tuple[Recompute, ...]:
        """The base modes of the every-n-blocks options of ``config``'s stages (module
        docstring): the listed modes but ``full``, when ``block`` is listed and the
        configuration is a non-interleaved 1F1B or ZB-H2 one without activation offload;
        none otherwise."""
        if not self.block_recompute or not block_searchable(config):
            return ()
        return tuple(m for m in self.recompute_modes if m is not Recompute.FULL)

    @property
    def schedule_kinds(self) -> tuple[Schedule, ...]:
        allowed = (
            Schedule.ONE_F_ONE_B,
            Schedule.INTERLEAVED,
            Schedule.ZB_H1,
            Schedule.ZB_H2,
            Schedule.ZB_V,
            Schedule.DUALPIPE_V,
        )
        out = []
        for s in self.schedules:
            if s not in {a.value for a in allowed}:
                raise UserError(
                    f"solver.schedules={list(self.schedules)}; use values of "
                    f"{[a.value for a in allowed]} (gpipe is never faster than 1f1b here)"
                )
            out.append(Schedule(s))
        return tuple(out)

    @property
    def virtual_values(self) -> tuple[int, ...] | None:
        if self.virtual_stages is None:
            return None
        bad = [v for v in self.virtual_stages if not isinstance(v, int) or v < 2]
        if bad:
            raise UserError(
                f"solver.virtual_stages={list(self.virtual_stages)}: {bad[0]!r} is not an integer "
                ">= 2 (chunks per pipeline rank); use e.g. [2, 4] or null for every valid v"
            )
        return tuple(self.virtual_stages)


def chunk_split(blocks: int, chunks: int) -> list[int] | None:
    """Chain layers per chunk (embedding + blocks + head) of Megatron's even pipeline split, or
    None when no even split exists.

    Blocks evenly when ``chunks`` divides them (embedding with the first chunk, head with the
    last: Megatron-LM's default); else the whole chain evenly when ``chunks`` divides
    ``blocks + 2``: Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split`` (``megatron/training/arguments.py``), which count the
    embedding and the loss as one layer each, as NVIDIA's Llama-3.1 405B recipes set (126 blocks
    in 64 chunks of 2). With ``chunks <= blocks`` that split has ``(blocks + 2) / chunks >= 2``
    chain layers per chunk, so every chunk, the first and the last included, holds a block."""
    if chunks > blocks:
        return None
    if blocks % chunks == 0:
        counts = [blocks // chunks] * chunks
        counts[0] += 1
        counts[-1] += 1
        return counts
    if (blocks + 2) % chunks == 0:
        return [(blocks + 2) // chunks] * chunks
    return None


def interleaved_chunks(n_layers: int, pp: int, v: int) -> list[tuple[int, int]]:
    """The partition the space gives interleaved ``v`` on ``pp`` ranks (:func:`chunk_split` of
    ``pp * v`` chunks: ``blocks / (pp v)`` blocks with the embedding in chunk 0 and the head in
    the last, else ``(blocks + 2) / (pp v)`` chain layers each), as inclusive ``(first, last)``
    chain ranges."""
    counts = chunk_split(n_layers - 2, pp * v)
    if counts is None:
        raise ValueError(f"no interleaved split of {n_layers - 2} blocks into {pp} x {v} chunks")
    out, first = [], 0
    for n in counts:
        out.append((first, first + n - 1))
        first += n
    return out


def _restricted(given: Sequence[int] | None, valid: list[int]) -> Sequence[int]:
    """The valid values a restriction lists, in its order (None: every valid value)."""
    return valid if given is None else [v for v in given if v in valid]


def _orders(options: SpaceOptions) -> list[tuple[Axis, ...]]:
    if options.rank_orders is None:
        return [(Axis.TP, *rest) for rest in permutations((Axis.CP, Axis.DP, Axis.PP))]
    orders = []
    for given in options.rank_orders:
        order = parse_rank_order(given)
        # the space (and the bounds that prune it: tensor groups are priced as aligned blocks of
        # consecutive devices) keeps tp innermost
        if order[0] is not Axis.TP:
            raise UserError(
                f"solver.rank_orders entry {given!r} does not put tp innermost; the NEST space "
                "keeps tensor groups on consecutive devices. Give each order as one string with "
                "tp first, e.g. solver.rank_orders=[tp-cp-dp-pp,tp-pp-dp-cp]"
            )
        orders.append(order)
    return orders


def _schedules(kinds, blocks: int, pp: int, m: int):
    kinds, vs = kinds
    out = []
    if Schedule.ONE_F_ONE_B in kinds:
        out.append(ONE_F_ONE_B)
    if Schedule.INTERLEAVED in kinds and pp >= 2 and m % pp == 0:
        vs = range(2, (blocks + 2) // pp + 1) if vs is None else vs
        out += [(Schedule.INTERLEAVED, v) for v in vs if chunk_split(blocks, pp * v)]
    for kind in (Schedule.ZB_H1, Schedule.ZB_H2):
        if kind in kinds and pp >= 2 and m >= kind.min_microbatches(pp):
            out.append((kind, 1))
    for kind in (Schedule.ZB_V, Schedule.DUALPIPE_V):
        fits = pp >= 2 and m >= kind.min_microbatches(pp) and chunk_split(blocks, 2 * pp)
        if kind in kinds and fits:
            out.append((kind, 2))
    return tuple(out)


def fixed_chunks(config: ParallelConfig, n_layers: int) -> list[tuple[int, int]] | None:
    """The one partition the space gives a configuration whose chunks are fixed (interleaved
    ``v``, and ZB-V and DualPipeV: :func:`interleaved_chunks` of ``2 pp`` chunks, two per rank
    in a V), or
    None when the partition is searched (1F1B and the single-chunk zero-bubble schedules)."""
    if config.interleaved or config.schedule.v_shaped:
        return interleaved_chunks(n_layers, config.pp, config.virtual_stages)
    return None


def families(problem: Problem, options: SpaceOptions) -> Iterator[Family]:
    """Every non-empty :class:`Family` of the space (module docstring), in a fixed order."""
    model, training = problem.model, problem.training
    n = problem.cluster.num_devices
    chain = problem.num_layers
    spec = model.spec
    orders = _orders(options)
    kinds = options.schedule_kinds, options.virtual_values
    batch_divisors = divisors(training.global_batch)
    # a restriction intersects the space: a listed tp (cp) that does not divide the devices
    # (devices / tp) is not in it
    for tp in _restricted(options.tp, divisors(n)):
        for cp in _restricted(options.cp, divisors(n // tp)):
            for pp in options.pp or range(1, chain + 1):
                if pp > chain or tp * cp * pp > n:
                    continue
                # dp must divide the global batch (m = batch / (mbs * dp) is an integer)
                for dp in batch_divisors:
                    if dp > n // (tp * cp * pp):
                        break
                    eps = options.ep or (divisors(spec.num_experts) if spec.is_moe else [1])
                    for ep in eps:
                        for etp in options.etp_values(tp, spec.is_moe):
                            fold = 1 if etp is None else tp
                            if (dp * cp * fold) % ep:
                                continue
                            sp = training.sequence_parallel and tp > 1
                            shard = Shard(tp=tp, cp=cp, ep=ep, sp=sp, etp=etp)
                            if model.shard_problem(shard) is not None:
                                continue
                            yield from _families(
                                problem, options, orders, kinds, (tp, cp, ep, dp, pp, etp)
                            )


def _families(problem, options, orders, kinds, degrees) -> Iterator[Family]:
    tp, cp, ep, dp, pp, etp = degrees
    training = problem.training
    fold = 1 if etp is None else tp  # whole experts replicate over the folded tensor ranks
    replicas = dp * cp * fold // ep if problem.model.spec.is_moe else 1
    zeros = (0,) if dp * cp == 1 and replicas == 1 else tuple(options.zero_stages)
    offloads = _offloads(problem, options)
    # two orders place every device alike iff the axes of degree > 1 come in the same order
    degree = {Axis.TP: tp, Axis.CP: cp, Axis.DP: dp, Axis.PP: pp}
    seen: set[tuple] = set()
    placed_orders = []
    for order in orders:
        key = tuple(a for a in order if degree[a] > 1)
        if key not in seen:
            seen.add(key)
            placed_orders.append(order)
    # hybrid sharding (opt-in): shard groups of whole expert groups (ParallelConfig.zero_shard)
    shards = tuple(z for z in options.shard_degrees(dp) if (z * cp * fold) % ep == 0)
    sharded = tuple(z for z in zeros if z >= 1)
    for mbs in training.microbatch_sizes:
        if training.global_batch % (mbs * dp):
            continue
        m = training.global_batch // (mbs * dp)
        schedules = _schedules(kinds, problem.num_layers - 2, pp, m)
        if schedules and zeros and placed_orders:
            orders = tuple(placed_orders)
            yield Family(tp, cp, ep, dp, pp, mbs, m, schedules, zeros, orders, etp, offloads)
            if sharded:
                for zs in shards:
                    yield Family(
                        tp, cp, ep, dp, pp, mbs, m, schedules, sharded, orders, etp, offloads, zs
                    )


def _offloads(problem: Problem, options: SpaceOptions) -> tuple[Offload, ...]:
    """What the space's configurations may keep in host memory (module docstring)."""
    if not options.offload or problem.cluster.device.host_link_bw_bytes_per_s is None:
        return (NO_OFFLOAD,)
    optimizer = (False, True) if can_offload_optimizer(problem) else (False,)
    return tuple(Offload(o, a) for o in optimizer for a in (False, True))


def configurations(problem: Problem, options: SpaceOptions) -> Iterator[ParallelConfig]:
    """Every configuration of the space, deduplicated (see the module docstring)."""
    for family in families(problem, options):
        yield from family.configs()


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
        recompute: Sequence[str] = ("none", "selective", "mlp", "selective_mlp", "full"),
        rank_orders: Sequence[str] | None = None,
        schedules: Sequence[str] = ("1f1b", "interleaved"),
        virtual_stages: Sequence[int] | None = None,
        etp: Sequence[int | str] | None = None,
        offload: bool = False,
        zero_shards: Sequence[int | str] | None = None,
    ) -> None:
        self.name = name
        self.offload = offload
        """Also search the optimizer state and the activations offloaded to host memory (off by
        default: the space, its plans and its search time are then as without offload)."""
        self.tp, self.cp, self.ep, self.pp = tp, cp, ep, pp
        self.etp = etp
        self.zero_shards = zero_shards
        self.zero_stages = zero_stages
        self.recompute = recompute
        self.rank_orders = rank_orders
        self.schedules = schedules
        self.virtual_stages = virtual_stages

    def space_kwargs(self) -> dict:
        """The space hyper-parameters as given (to build another planner on the same space)."""
        keys = ("tp", "cp", "ep", "pp", "zero_stages", "recompute", "rank_orders", "schedules")
        return {
            k: getattr(self, k) for k in (*keys, "virtual_stages", "etp", "offload", "zero_shards")
        }

    def options(self) -> SpaceOptions:
        return SpaceOptions(
            tp=_listed("tp", self.tp),
            cp=_listed("cp", self.cp),
            ep=_listed("ep", self.ep),
            pp=_listed("pp", self.pp),
            zero_stages=_listed("zero_stages", self.zero_stages),
            recompute=_listed("recompute", self.recompute),
            rank_orders=_listed("rank_orders", self.rank_orders),
            schedules=_listed("schedules", self.schedules),
            virtual_stages=_listed("virtual_stages", self.virtual_stages),
            etp=_listed("etp", self.etp),
            offload=_flag("offload", self.offload),
            zero_shards=_listed("zero_shards", self.zero_shards),
        )


def _flag(name: str, value) -> bool:
    """A true / false space option, refused with a one-line message otherwise."""
    if not isinstance(value, bool):
        raise UserError(f"solver.{name}={value!r} must be true or false")
    return value


def _listed(name: str, value) -> tuple | None:
    """A space option as a tuple: a single value (``solver.schedules=interleaved``,
    ``solver.tp=4``) is a list of one, never a string iterated letter by letter."""
    if value is None:
        return None
    if isinstance(value, str | int):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise UserError(f"solver.{name}={value!r} must be a list: solver.{name}=[...]") from None
