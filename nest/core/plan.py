"""A plan: degrees, stages, per-stage choices and explicit device ids.

The evaluator needs nothing but the problem and the plan: every stage lists the device of each
(data-parallel replica, context rank, tensor rank). Structured planners build that placement from a
*rank order* of the axes (innermost first) with :func:`place`; exact planners may return any
placement.

Interleaved schedules: ``stages`` holds ``pp * virtual_stages`` model chunks in chain order; chunk
``k`` runs on pipeline rank ``k % pp`` (Megatron's interleaved assignment), so chunks of one rank
share its devices. ZB-V (``schedule=zb_v``) and DualPipeV (``schedule=dualpipe_v``) hold two
chunks per rank in a V instead: chunk ``k``
on rank ``k`` for ``k < pp`` and ``2 pp - 1 - k`` after (:func:`chunk_rank`).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from nest.core.axes import Axis, GroupKind, Recompute, Schedule, ZeroStage
from nest.core.errors import UserError
from nest.core.layers import Shard

Devices = tuple[tuple[tuple[int, ...], ...], ...]  # [dp replica][cp rank][tp rank] -> device id


class BlockRecompute(NamedTuple):
    """A stage whose first ``full_blocks`` transformer blocks are fully recomputed and whose
    other blocks run in ``base`` (Megatron-LM's ``--recompute-granularity full
    --recompute-method block --recompute-num-layers k``, which recomputes the first ``k``
    layers of each pipeline stage and keeps the rest's activations:
    NVIDIA/Megatron-LM@d98e8a6:megatron/core/recompute.py, ``recompute_method == 'block'``).
    A stage's recompute choice is a :class:`Recompute` or this."""

    base: Recompute
    full_blocks: int


def stage_recompute(choice) -> tuple[Recompute, int]:
    """``(mode, full_blocks)`` of a stage's recompute choice: a mode, a
    :class:`BlockRecompute`, or their names as reports print them (``none``, ``full3+none``:
    :attr:`StagePlan.recompute_label`); a one-line error otherwise."""
    if isinstance(choice, BlockRecompute):
        return Recompute(choice.base), int(choice.full_blocks)
    text = str(choice)
    head, plus, base = text.partition("+")
    count = head.removeprefix("full")
    try:
        if plus and head.startswith("full") and count.isdigit():
            return Recompute(base), int(count)
        return Recompute(text), 0
    except ValueError:
        raise UserError(
            f"recompute {text!r}; use one of {[r.value for r in Recompute]} or fullK+MODE "
            "(the first K blocks of the stage fully recomputed, the rest in MODE)"
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePlan:
    """One pipeline stage (or model chunk, for interleaved schedules)."""

    first_layer: int
    last_layer: int
    """Inclusive range of chain indices (0 = embedding, L+1 = head)."""
    recompute: Recompute
    """The mode of the stage's blocks (those past its first :attr:`full_blocks`)."""
    devices: Devices
    full_blocks: int = 0
    """How many of the stage's first blocks are fully recomputed whatever :attr:`recompute`
    says (every-n-blocks recompute, :class:`BlockRecompute`); 0: every block runs in
    :attr:`recompute` (``full`` = all blocks fully recomputed, as saved plans say). Stored as 0
    when :attr:`recompute` is ``full``."""

    def __post_init__(self) -> None:
        if self.first_layer > self.last_layer:
            raise UserError(
                f"stage layers [{self.first_layer}, {self.last_layer}] are empty; every stage "
                "needs at least one layer"
            )
        k = self.full_blocks
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
            raise UserError(
                f"stage full_blocks={k!r} must be a non-negative integer (how many of the "
                "stage's first blocks are fully recomputed)"
            )
        if self.recompute is Recompute.FULL:
            object.__setattr__(self, "full_blocks", 0)

    def layer_recompute(self, layer: int) -> Recompute:
        """The mode chain layer ``layer`` of this stage runs in: ``full`` for the stage's first
        :attr:`full_blocks` blocks (chain index 0 is the embedding, so its blocks start at
        ``max(first_layer, 1)``), :attr:`recompute` for the rest (non-blocks ignore it)."""
        start = max(self.first_layer, 1)
        if start <= layer < start + self.full_blocks:
            return Recompute.FULL
        return self.recompute

    @property
    def recompute_choice(self):
        """The stage's recompute as a choice :func:`make_structured_plan` takes back: its mode,
        or a :class:`BlockRecompute`."""
        return (
            BlockRecompute(self.recompute, self.full_blocks) if self.full_blocks else self.recompute
        )

    @property
    def recompute_label(self) -> str:
        """The stage's recompute as reports print it: the mode, or ``fullK+mode`` with
        :attr:`full_blocks` ``= K`` (``full3+none``)."""
        if self.full_blocks:
            return f"full{self.full_blocks}+{self.recompute}"
        return str(self.recompute)

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.last_layer + 1)

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d for replica in self.devices for ranks in replica for d in ranks)


class Offload(NamedTuple):
    """What a configuration keeps in host memory (:attr:`ParallelConfig.optimizer_offload`,
    :attr:`ParallelConfig.activation_offload`); nothing by default."""

    optimizer: bool = False
    activations: bool = False


NO_OFFLOAD = Offload()
"""Everything on the device."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """What a plan fixes besides its partition, recompute modes and device ids: the one
    configuration type of the project (plans, the DP's search, mcmc's state and alpa's stage
    meshes all use it)."""

    tp: int = 1
    """Tensor degree (1 = off)."""
    cp: int = 1
    """Context degree (1 = off)."""
    ep: int = 1
    """Expert degree, carved out of the ``dp x cp x tp / etp`` ranks of MoE blocks (1 = off)."""
    etp: int | None = None
    """Expert tensor degree: None (= ``tp``: each expert's weights split like the dense ones) or
    1 (whole experts, ``--expert-tensor-parallel-size 1``: Megatron-Core's MoE parallel folding,
    where the expert mesh ``etp x ep x edp`` folds the attention's tensor ranks into expert
    ranks). Stored as None when it equals ``tp``, so equal configurations compare equal."""
    dp: int = 1
    """Data-parallel replicas."""
    pp: int = 1
    """Pipeline ranks (devices along the pipeline)."""
    microbatch_size: int = 1
    """Sequences per microbatch."""
    zero_stage: ZeroStage = 0
    """0: plain DP; 1: optimizer state sharded (distributed optimizer); 2: + gradients;
    3: + weights."""
    zero_shard: int | None = None
    """Hybrid sharding (HSDP): the data-parallel ranks one ZeRO shard group spans, the
    innermost ``zero_shard`` of the ``dp`` replicas (times ``cp``); the state is sharded within
    each group and replicated over the ``dp / zero_shard`` groups (FSDP2 HSDP, torchtitan's
    ``data_parallel_shard_degree``; Megatron-Core's ``--num-distributed-optimizer-instances``
    ``= dp / zero_shard``; MaxText's ``ici_fsdp_parallelism`` with ``dcn_data_parallelism``
    across slices). None: all ``dp`` ranks (stored as None when it equals ``dp``, so equal
    configurations compare equal). Needs ``zero_stage >= 1``, and ``ep`` dividing
    ``zero_shard x cp x tp / etp`` (each shard group holds whole expert groups)."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved schedule); 1 otherwise."""
    optimizer_offload: bool = False
    """The optimizer state (fp32 master weights, Adam's m and v) of each device's shard lives in
    host memory and the host CPU runs its step (Megatron-Core ``--optimizer-cpu-offload``,
    DeepSpeed ZeRO-Offload): :class:`nest.cost.state.ModelState`. False: on the device."""
    activation_offload: bool = False
    """Every transformer block copies its stored activations to host memory after its forward
    and back before its backward (Megatron-Core ``--cpu-offloading``, Transformer Engine's CPU
    offload): :mod:`nest.cost.memory`, :mod:`nest.cost.offload`. False: kept on the device."""
    activation_offload_blocks: int | None = None
    """With :attr:`activation_offload`: how many blocks offload, the first ``N`` of the chunk
    (Megatron-Core ``--cpu-offloading-num-layers N``: Transformer Engine's CPU offload context
    offloads the stored tensors of layers ``0 .. N-1`` of the ``TransformerBlock``,
    ``transformer_engine/pytorch/cpu_offload.py``); None: every block. Megatron-Core refuses
    CPU offloading with pipeline parallelism (``TransformerConfig.__post_init__``), and a count
    is defined only for its one chunk, so a count needs ``pp = 1``. A plan setting (validation
    rows, fixed plans); the planners' search offloads all blocks or none."""
    rank_order: tuple[Axis, ...] | None = None
    """Innermost-first axis order the placement is built from (:func:`place`); None for an
    explicit placement, or when the placement is not part of the comparison."""

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "ep", "dp", "pp", "microbatch_size", "virtual_stages"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise UserError(f"plan {name}={value!r} must be a positive integer")
        if self.etp is not None and self.etp == self.tp:
            object.__setattr__(self, "etp", None)
        if self.etp is not None and self.etp != 1:
            raise UserError(
                f"plan etp={self.etp!r} with tp={self.tp}; use etp=1 (whole experts) or etp=tp"
            )
        if self.zero_stage not in (0, 1, 2, 3):
            raise UserError(f"plan zero_stage={self.zero_stage!r}; use 0, 1, 2 or 3")
        for name in ("optimizer_offload", "activation_offload"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise UserError(f"plan {name}={getattr(self, name)!r} must be true or false")
        self._check_offload_blocks()
        self._check_zero_shard()
        if self.schedule.v_shaped and self.virtual_stages != 2:
            raise UserError(
                f"schedule={self.schedule} holds 2 chunks per rank (got virtual_stages="
                f"{self.virtual_stages}); set virtual_stages=2"
            )
        if (
            not self.schedule.v_shaped
            and self.schedule is not Schedule.INTERLEAVED
            and (self.virtual_stages != 1)
        ):
            raise UserError(
                f"virtual_stages={self.virtual_stages} needs schedule=interleaved "
                f"(got {self.schedule})"
            )

    def _check_offload_blocks(self) -> None:
        """:attr:`activation_offload_blocks`: a positive count, with activation offload, on one
        pipeline rank (one-line errors naming the fix)."""
        n = self.activation_offload_blocks
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise UserError(
                f"plan activation_offload_blocks={n!r} must be a positive whole number (the "
                "first blocks that offload), or null for all"
            )
        if not self.activation_offload:
            raise UserError(
                f"plan activation_offload_blocks={n} with activation_offload=false; set "
                "activation_offload true, or leave activation_offload_blocks null"
            )
        if self.pp > 1:
            raise UserError(
                f"plan activation_offload_blocks={n} with pp={self.pp}: a partial offload is "
                "defined for one pipeline rank (Megatron-Core refuses CPU offloading with "
                "pipeline parallelism); use pp=1, or activation_offload_blocks null for all"
            )

    def _check_zero_shard(self) -> None:
        """Normalise and validate :attr:`zero_shard` (one-line errors naming the fix)."""
        zs = self.zero_shard
        if zs is None:
            return
        if isinstance(zs, bool) or not isinstance(zs, int | np.integer) or zs < 1 or self.dp % zs:
            raise UserError(
                f"plan zero_shard={zs!r} must be a positive divisor of dp={self.dp} (the "
                "data-parallel ranks of one ZeRO shard group); use a divisor or null for all"
            )
        if zs == self.dp:
            object.__setattr__(self, "zero_shard", None)
            return
        if self.zero_stage == 0:
            raise UserError(
                f"plan zero_shard={zs} with zero_stage=0: nothing is sharded; set zero_stage "
                "1, 2 or 3, or leave zero_shard null"
            )
        width = zs * self.cp * self.expert_fold
        if width % self.ep:
            raise UserError(
                f"plan zero_shard={zs} with ep={self.ep}: a shard group's zero_shard*cp*tp/etp "
                f"= {width} ranks must hold whole expert groups; use a zero_shard that ep "
                "divides into, or leave zero_shard null"
            )

    @property
    def zero_replicas(self) -> int:
        """Copies of each ZeRO shard: ``dp / zero_shard`` (1 without hybrid sharding)."""
        return 1 if self.zero_shard is None else self.dp // self.zero_shard

    @property
    def offload(self) -> Offload:
        """What the configuration keeps in host memory."""
        return Offload(self.optimizer_offload, self.activation_offload)

    @property
    def devices(self) -> int:
        """Devices the configuration uses: ``tp x cp x dp x pp``."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def interleaved(self) -> bool:
        return self.schedule is Schedule.INTERLEAVED

    @property
    def expert_tp(self) -> int:
        """The expert tensor degree (``etp``, or ``tp`` when None)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_fold(self) -> int:
        """``tp / etp``: how many attention tensor ranks fold into distinct expert ranks (1 when
        experts split like the dense weights)."""
        return self.tp // self.expert_tp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts: ``dp x cp x (tp / etp) / ep`` (Megatron-Core's EDP)."""
        return self.dp * self.cp * self.expert_fold // self.ep

    def num_microbatches(self, global_batch: int) -> int:
        """Microbatches per replica per iteration for ``global_batch`` sequences."""
        return global_batch // (self.microbatch_size * self.dp)

    def shard(self, sequence_parallel: bool) -> Shard:
        """How one layer is split under this configuration (sequence parallelism only with
        tensor parallelism)."""
        return Shard(
            tp=self.tp,
            cp=self.cp,
            ep=self.ep,
            etp=self.etp,
            sp=sequence_parallel and self.tp > 1,
            mbs=self.microbatch_size,
        )

    def unordered(self) -> "ParallelConfig":
        """The same configuration with the placement left out (the rank order cleared)."""
        return replace(self, rank_order=None)

    def degrees(self) -> dict:
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": self.dp, "pp": self.pp}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A complete parallelisation and placement of one training iteration."""

    config: ParallelConfig
    num_microbatches: int
    """Microbatches per replica per iteration, ``m``."""
    sequence_parallel: bool = False
    stages: tuple[StagePlan, ...]
    # -- the solver's record (not part of what the evaluator reads)
    solver: str = ""
    status: str = "feasible"
    """optimal / feasible / infeasible / timeout."""
    solve_time_s: float = 0.0
    objective_s: float | None = None
    """The planner's objective: always ``evaluate(problem, plan).iteration_time_s``."""
    bound_s: float | None = None
    n_evaluations: int = 0
    search: Mapping = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.num_microbatches, int | np.integer) or self.num_microbatches < 1:
            raise UserError(
                f"plan num_microbatches={self.num_microbatches!r} must be a positive integer"
            )
        c = self.config
        if len(self.stages) != c.pp * c.virtual_stages:
            raise UserError(
                f"plan has {len(self.stages)} stages but pp({c.pp}) x virtual_stages"
                f"({c.virtual_stages}) = {c.pp * c.virtual_stages}"
            )
        for i, stage in enumerate(self.stages):
            shape = _shape(stage.devices)
            if shape != (c.dp, c.cp, c.tp):
                raise UserError(
                    f"stage {i} devices have shape {shape}; expected (dp, cp, tp) = "
                    f"({c.dp}, {c.cp}, {c.tp})"
                )

    # the configuration's fields, read through the plan
    tp = property(lambda self: self.config.tp)
    cp = property(lambda self: self.config.cp)
    ep = property(lambda self: self.config.ep)
    etp = property(lambda self: self.config.etp)
    dp = property(lambda self: self.config.dp)
    pp = property(lambda self: self.config.pp)
    microbatch_size = property(lambda self: self.config.microbatch_size)
    zero_stage = property(lambda self: self.config.zero_stage)
    zero_shard = property(lambda self: self.config.zero_shard)
    schedule = property(lambda self: self.config.schedule)
    optimizer_offload = property(lambda self: self.config.optimizer_offload)
    activation_offload = property(lambda self: self.config.activation_offload)
    activation_offload_blocks = property(lambda self: self.config.activation_offload_blocks)
    virtual_stages = property(lambda self: self.config.virtual_stages)
    rank_order = property(lambda self: self.config.rank_order)

    @property
    def devices_used(self) -> int:
        return self.config.devices

    @property
    def pp_rank_chunks(self) -> tuple[tuple[int, ...], ...]:
        """For each pipeline rank, the indices of its chunks in ``stages`` (increasing)."""
        if self.schedule.v_shaped:
            return tuple((r, 2 * self.pp - 1 - r) for r in range(self.pp))
        return tuple(tuple(range(r, len(self.stages), self.pp)) for r in range(self.pp))

    def chunk_rank(self, k: int) -> int:
        """The pipeline rank chunk ``k`` runs on (:func:`chunk_rank`)."""
        return chunk_rank(k, self.pp, self.schedule)

    def with_record(self, **record) -> "Plan":
        return replace(self, **record)

    def degrees(self) -> dict:
        return self.config.degrees()


def chunk_rank(k: int, pp: int, schedule: Schedule) -> int:
    """The pipeline rank of chunk ``k``: ``k % pp`` (one chunk per rank, and Megatron's looped
    interleaving), or under ZB-V the V: ``k`` for ``k < pp``, ``2 pp - 1 - k`` after, so chunks
    ``pp - 1`` and ``pp`` share the last rank and rank 0 holds the embedding and the loss (Qi et
    al. arXiv 2405.15362 §3, Figure 3; PyTorch's ``generate_stage_to_rank_mapping(...,
    style="v")``, pytorch/pytorch@1fd7abc2f521:torch/distributed/pipelining/schedules.py)."""
    if schedule.v_shaped and k >= pp:
        return 2 * pp - 1 - k
    return k % pp


def _shape(devices: Devices) -> tuple[int, int, int]:
    try:
        arr = np.asarray(devices, dtype=np.int64)
    except ValueError as exc:  # ragged
        raise UserError(f"stage devices are ragged: {exc}") from None
    if arr.ndim != 3:
        raise UserError(f"stage devices must be nested [dp][cp][tp], got {arr.ndim} levels")
    return tuple(int(x) for x in arr.shape)  # type: ignore[return-value]


def place(
    *, tp: int, cp: int, dp: int, pp: int, rank_order: Sequence[Axis], offset: int = 0
) -> np.ndarray:
    """Device ids of a structured layout: array ``[pp][dp][cp][tp]``.

    The axes are laid out as mixed-radix digits of the device id in ``rank_order``, innermost
    first: with Megatron's order ``tp, cp, dp, pp`` the ``tp`` ranks of a group are consecutive
    ids (inside one node), then ``cp``, ``dp``, and pipeline stages are outermost. Devices
    ``offset .. offset + tp*cp*dp*pp - 1`` are used.
    """
    degrees = {Axis.TP: tp, Axis.CP: cp, Axis.DP: dp, Axis.PP: pp}
    if sorted(rank_order) != sorted(degrees):
        raise UserError(f"rank_order {list(rank_order)} must be a permutation of tp, cp, dp, pp")
    stride, strides = 1, {}
    for axis in rank_order:
        strides[axis] = stride
        stride *= degrees[axis]
    p = np.arange(pp)[:, None, None, None] * strides[Axis.PP]
    d = np.arange(dp)[None, :, None, None] * strides[Axis.DP]
    c = np.arange(cp)[None, None, :, None] * strides[Axis.CP]
    t = np.arange(tp)[None, None, None, :] * strides[Axis.TP]
    return offset + p + d + c + t


HSDP_KINDS = (
    GroupKind.ZERO_SHARD,
    GroupKind.ZERO_REPLICATE,
    GroupKind.EXPERT_ZERO_SHARD,
    GroupKind.EXPERT_ZERO_REPLICATE,
)
"""The group kinds of hybrid sharding (:attr:`ParallelConfig.zero_shard`), built only for
plans that set it."""
GROUP_KINDS = tuple(k for k in GroupKind if k not in HSDP_KINDS)
"""The kinds of communication group of every pipeline rank (:func:`group_arrays`; what each
carries and how its collectives are priced: :mod:`nest.cost.groups`)."""


def hsdp_arrays(
    devices, zero_shard: int, ep: int = 1, etp: int | None = None
) -> dict[str, np.ndarray]:
    """Hybrid sharding's groups of one rank's ``[dp][cp][tp]`` devices, one group per row:
    replica ``d = a x zero_shard + s`` (``s`` innermost) lies in shard group ``a``; a shard group
    holds the ``zero_shard x cp`` ranks of one tensor rank with the same ``a`` (FSDP2 HSDP's
    ``dp_shard`` mesh dimension, flattened with ``cp`` as torchtitan's ``dp_shard_cp``); a
    replicate group the ``dp / zero_shard`` ranks with the same ``(s, context rank, tensor
    rank)``, which hold the same shard. Experts: shard group ``a``'s devices (consecutive in the
    ``dp x cp x tp`` order) fold into ``edp_a x ep x etp`` as :func:`group_arrays`' expert mesh
    does (``ep`` divides ``zero_shard x cp x tp / etp``, so its expert groups are whole); an
    expert shard group holds the ``edp_a`` ranks of one shard group with the same experts, an
    expert replicate group their ``dp / zero_shard`` copies (torchtitan's expert FSDP mesh
    ``dp_shard x cp / ep`` inside ``dp_replicate``)."""
    devices = np.asarray(devices, dtype=np.int64)
    dp, cp, tp = devices.shape
    etp = tp if etp is None else etp
    outer = dp // zero_shard
    blocks = devices.reshape(outer, zero_shard, cp, tp)
    edp = zero_shard * cp * tp // (ep * etp)
    experts = devices.reshape(outer, edp, ep, etp)
    return {
        GroupKind.ZERO_SHARD: blocks.transpose(0, 3, 1, 2).reshape(outer * tp, zero_shard * cp),
        GroupKind.ZERO_REPLICATE: blocks.transpose(1, 2, 3, 0).reshape(-1, outer),
        GroupKind.EXPERT_ZERO_SHARD: experts.transpose(0, 2, 3, 1).reshape(-1, edp),
        GroupKind.EXPERT_ZERO_REPLICATE: experts.transpose(1, 2, 3, 0).reshape(-1, outer),
    }


def group_arrays(
    devices, ep: int, etp: int | None = None, zero_shard: int | None = None
) -> dict[str, np.ndarray]:
    """The groups of each kind (:data:`GROUP_KINDS`) of one rank's ``[dp][cp][tp]`` devices, one
    group per row; dense gradients sync over all ``dp x cp`` ranks of a tensor rank. The expert
    mesh folds the rank's ``dp x cp x tp`` devices, in that order with the tensor rank innermost,
    into ``edp x ep x etp`` with ``etp`` innermost (Megatron-Core's MoE parallel folding,
    ``RankGenerator`` order ``tp-ep-dp`` for experts): with ``etp = tp`` (None) expert ranks are
    carved out of the ``dp x cp`` ranks of one tensor rank, with ``etp = 1`` an expert group takes
    ``ep`` consecutive devices across tensor ranks. With ``zero_shard`` (hybrid sharding) also
    :func:`hsdp_arrays`' kinds."""
    devices = np.asarray(devices, dtype=np.int64)
    dp, cp, tp = devices.shape
    etp = tp if etp is None else etp
    flat = devices.reshape(dp * cp, tp)  # row j = replica * cp + context rank
    edp = dp * cp * tp // (ep * etp)
    blocks = devices.reshape(edp, ep, etp)
    out = {
        GroupKind.TP: flat,
        GroupKind.CP: devices.transpose(0, 2, 1).reshape(-1, cp),
        GroupKind.EP: blocks.transpose(0, 2, 1).reshape(-1, ep),
        GroupKind.DENSE_DP: flat.T,
        GroupKind.EXPERT_DP: blocks.transpose(1, 2, 0).reshape(-1, edp),
    }
    if zero_shard is not None:
        out.update(hsdp_arrays(devices, zero_shard, ep, etp))
    return out


def uniform_partition(num_layers: int, parts: int) -> list[int]:
    """Split ``num_layers`` into ``parts`` contiguous counts differing by at most one."""
    if not 1 <= parts <= num_layers:
        raise UserError(f"cannot split {num_layers} layers into {parts} stages")
    base, extra = divmod(num_layers, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def make_structured_plan(
    config: ParallelConfig,
    *,
    layer_counts: Sequence[int],
    recompute: Sequence,
    num_microbatches: int,
    sequence_parallel: bool,
    offset: int = 0,
    grid: np.ndarray | None = None,
) -> Plan:
    """Build a plan from a configuration, chunk layer counts (chain order), each chunk's
    recompute choice (:func:`stage_recompute`) and the placement of ``config.rank_order``, or
    an explicit placement ``grid[pp][dp][cp][tp] -> device`` (then the rank order may be
    None)."""
    c = config
    n_chunks = c.pp * c.virtual_stages
    if len(layer_counts) != n_chunks or len(recompute) != n_chunks:
        raise UserError(
            f"need {n_chunks} layer counts and recompute modes (pp x virtual_stages), got "
            f"{len(layer_counts)} and {len(recompute)}"
        )
    if grid is None:
        grid = place(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp, rank_order=c.rank_order, offset=offset)
    stages, first = [], 0
    ranks = [chunk_rank(k, c.pp, c.schedule) for k in range(n_chunks)]
    for k, count in enumerate(layer_counts):
        if count < 1:
            raise UserError(f"layer partition {list(layer_counts)} has an empty stage {k}")
        mode, full_blocks = stage_recompute(recompute[k])
        stages.append(
            StagePlan(
                first_layer=first,
                last_layer=first + count - 1,
                recompute=mode,
                full_blocks=full_blocks,
                devices=tuple(
                    tuple(tuple(int(x) for x in row) for row in rep) for rep in grid[ranks[k]]
                ),
            )
        )
        first += count
    return Plan(
        config=c,
        num_microbatches=num_microbatches,
        sequence_parallel=sequence_parallel and c.tp > 1,
        stages=tuple(stages),
    )
