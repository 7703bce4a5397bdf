"""A plan from a configuration given by hand: degrees, microbatch, ZeRO, schedule, partition.

Building a placed plan from given settings is a core job: the ``fixed`` and ``paper_table``
planners do it, and so does :mod:`nest.app.validate` for published runs. The rules are checked
here
with one-line errors naming the setting (``solver.<key>``, the Hydra names of the ``fixed``
planner's options).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from nest.core.axes import Recompute, Schedule, parse_rank_order
from nest.core.errors import UserError
from nest.core.layers import Shard
from nest.core.plan import (
    BlockRecompute,
    ParallelConfig,
    Plan,
    make_structured_plan,
    stage_recompute,
    uniform_partition,
)
from nest.core.problem import Problem


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSettings:
    """A configuration as a user gives it (the ``fixed`` planner's options, verbatim)."""

    tp: int = 1
    """Tensor degree (1 = off)."""
    pp: int = 1
    """Pipeline ranks (1 = off)."""
    dp: int | None = None
    """Data-parallel replicas; None: as many as the devices left after ``tp x cp x pp``."""
    cp: int = 1
    """Context degree (1 = off)."""
    ep: int = 1
    """Expert degree, carved out of the ``dp x cp`` ranks (x ``tp`` with ``etp = 1``; 1 = off)."""
    etp: int | None = None
    """Expert tensor degree: None or ``tp`` (experts split like the dense weights) or 1 (whole
    experts: MoE parallel folding)."""
    microbatch_size: int | None = None
    """Sequences per microbatch; None: the first of ``training.microbatch_sizes``."""
    recompute: str | Sequence[str] = "none"
    """One mode for every chunk, or one per chunk (``none``, ``selective``, ``full``)."""
    zero_stage: int = 0
    zero_shard: int | None = None
    """Hybrid sharding: data-parallel ranks per ZeRO shard group (a divisor of ``dp``); None:
    all of them (:attr:`nest.core.plan.ParallelConfig.zero_shard`)."""
    schedule: str = "1f1b"
    virtual_stages: int = 1
    """Chunks per pipeline rank (interleaved schedule)."""
    layer_partition: Sequence[int] | None = None
    """Blocks or chain layers per chunk; None: blocks split uniformly."""
    rank_order: str | Sequence[str] = "tp,cp,dp,pp"
    sequence_parallel: bool | None = None
    """None: ``training.sequence_parallel``."""
    optimizer_offload: bool = False
    """The optimizer state and step on the host (:attr:`ParallelConfig.optimizer_offload`)."""
    activation_offload: bool = False
    """The blocks' stored activations on the host (:attr:`ParallelConfig.activation_offload`)."""
    activation_offload_blocks: int | None = None
    """With ``activation_offload``: the first blocks that offload; None: all
    (:attr:`ParallelConfig.activation_offload_blocks`)."""


def _as_list(value) -> list | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def chunk_layer_counts(
    num_blocks: int, n_chunks: int, partition: Sequence[int] | None
) -> list[int]:
    """Layer counts per chunk over the whole chain (embedding + blocks + head).

    ``partition`` may count chain layers (sums to ``num_blocks + 2``) or transformer blocks (sums
    to ``num_blocks``; the embedding joins the first chunk and the head the last). ``None`` splits
    the blocks uniformly.
    """
    if partition is None:
        if n_chunks > num_blocks:
            raise UserError(
                f"{n_chunks} pipeline chunks for {num_blocks} transformer blocks; lower pp or "
                "virtual_stages, or give solver.layer_partition over the whole chain"
            )
        counts = uniform_partition(num_blocks, n_chunks)
    else:
        # every message shows the partition as given, never the counts derived from it
        shown = f"solver.layer_partition=[{', '.join(str(c) for c in partition)}]"
        given = []
        for k, c in enumerate(partition):
            if isinstance(c, str) and c.strip().isdigit():
                c = int(c)  # "9,8,8,7" given as one string
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise UserError(f"{shown}: entry {k} is {c!r}; give whole numbers of layers (>= 0)")
            given.append(c)
        if len(given) != n_chunks:
            raise UserError(f"{shown} has {len(given)} entries; pp x virtual_stages = {n_chunks}")
        if sum(given) == num_blocks + 2:
            counts, counting = given, "chain layers"
        elif sum(given) == num_blocks:
            counts = [*given]
            counting = "blocks; the embedding joins the first and the head the last"
            counts[0] += 1  # embedding
            counts[-1] += 1  # head
        else:
            raise UserError(
                f"{shown} sums to {sum(given)}; it must count the {num_blocks} blocks or all "
                f"{num_blocks + 2} chain layers"
            )
        empty = [k for k, c in enumerate(counts) if c < 1]
        if empty:
            raise UserError(
                f"{shown} has an empty stage {empty[0]} (counting {counting}); give every stage "
                "at least one layer"
            )
        return counts
    counts = list(counts)
    counts[0] += 1  # embedding
    counts[-1] += 1  # head
    return counts


def build_plan(problem: Problem, settings: "PlanSettings") -> Plan:
    """The plan ``settings`` describe on ``problem``, placed by its rank order and unscored.

    Raises :class:`UserError` naming the setting when the configuration cannot be built (a
    degree that does not divide, more devices than the cluster has, a partition that does not
    cover the chain); whether it fits in memory is the evaluator's call.
    """
    s = settings
    _check_sizes(s)
    n = problem.cluster.num_devices
    width = s.tp * s.cp * s.pp
    if width > n:
        raise UserError(
            f"tp*cp*pp = {s.tp}*{s.cp}*{s.pp} = {width} exceeds the cluster's {n} "
            "devices; lower a degree or raise cluster.devices"
        )
    training = problem.training
    sp = training.sequence_parallel if s.sequence_parallel is None else s.sequence_parallel
    etp = None if s.etp is None or s.etp == s.tp else s.etp
    if etp is not None and etp != 1:
        raise UserError(f"solver.etp={s.etp} with tp={s.tp}; use etp=1 (whole experts) or etp=tp")
    shard = Shard(tp=s.tp, cp=s.cp, ep=s.ep, sp=bool(sp) and s.tp > 1, etp=etp)
    reason = problem.model.shard_problem(shard)
    if reason:
        raise UserError(f"solver: {reason}")
    dp = s.dp if s.dp is not None else n // width
    fold = 1 if etp is None else s.tp
    if (dp * s.cp * fold) % s.ep:
        if fold == 1:
            raise UserError(
                f"solver.ep={s.ep} must divide dp*cp = {dp}*{s.cp}; expert ranks are carved "
                "out of the data x context ranks (or set solver.etp=1 to fold the tensor ranks in)"
            )
        raise UserError(
            f"solver.ep={s.ep} must divide dp*cp*tp = {dp}*{s.cp}*{s.tp} with etp=1; expert "
            "ranks are carved out of the data x context x tensor ranks"
        )
    mbs = training.microbatch_sizes[0] if s.microbatch_size is None else s.microbatch_size
    if training.global_batch % (mbs * dp):
        raise UserError(
            f"training.global_batch={training.global_batch} is not divisible by "
            f"microbatch_size({mbs}) x dp({dp}) = {mbs * dp}; change one of them"
        )
    try:
        schedule = Schedule(s.schedule)
    except ValueError:
        raise UserError(
            f"solver.schedule={s.schedule!r}; use one of {[x.value for x in Schedule]}"
        ) from None
    n_chunks = s.pp * s.virtual_stages
    counts = chunk_layer_counts(problem.model.spec.layers, n_chunks, _as_list(s.layer_partition))
    recompute = _recompute_modes(s, n_chunks)
    config = ParallelConfig(
        tp=s.tp,
        cp=s.cp,
        ep=s.ep,
        etp=etp,
        dp=dp,
        pp=s.pp,
        microbatch_size=mbs,
        zero_stage=s.zero_stage,
        optimizer_offload=s.optimizer_offload,
        activation_offload=s.activation_offload,
        activation_offload_blocks=s.activation_offload_blocks,
        zero_shard=s.zero_shard,
        schedule=schedule,
        virtual_stages=s.virtual_stages,
        rank_order=parse_rank_order(s.rank_order),
    )
    return make_structured_plan(
        config,
        layer_counts=counts,
        recompute=recompute,
        num_microbatches=training.global_batch // (mbs * dp),
        sequence_parallel=bool(sp),
    )


def _check_sizes(s: "PlanSettings") -> None:
    """The degrees, ``dp`` and the microbatch size are positive integers (or null where
    allowed)."""
    for key in ("tp", "pp", "cp", "ep", "virtual_stages"):
        value = getattr(s, key)
        if not isinstance(value, int) or value < 1:
            raise UserError(f"solver.{key}={value!r} must be a positive integer")
    if s.dp is not None and (not isinstance(s.dp, int) or s.dp < 1):
        raise UserError(
            f"solver.dp={s.dp!r} must be a positive integer (or null for the remaining devices)"
        )
    if s.microbatch_size is not None and (
        not isinstance(s.microbatch_size, int) or s.microbatch_size < 1
    ):
        raise UserError(
            f"solver.microbatch_size={s.microbatch_size!r} must be a positive integer (or "
            "null for the first of training.microbatch_sizes)"
        )


def _recompute_modes(s: "PlanSettings", n_chunks: int) -> list:
    """One recompute choice per chunk: ``solver.recompute`` given once or per chunk, a mode or
    ``fullK+MODE`` (:func:`nest.core.plan.stage_recompute`)."""
    modes = _as_list(s.recompute) or ["none"]
    if len(modes) == 1:
        modes = modes * n_chunks
    if len(modes) != n_chunks:
        raise UserError(
            f"solver.recompute has {len(modes)} entries; give one, or one per chunk ({n_chunks})"
        )
    try:
        recompute = [stage_recompute(m) for m in modes]
    except UserError:
        raise UserError(
            f"solver.recompute={s.recompute!r}; use {[r.value for r in Recompute]} or fullK+MODE "
            "(a stage's first K blocks fully recomputed, the rest in MODE)"
        ) from None
    return [BlockRecompute(m, k) if k else m for m, k in recompute]
