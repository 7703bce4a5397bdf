"""Names of parallelism axes and of the discrete choices a plan makes.

Vocabulary: an *axis* is a parallelism (mesh) axis, a *dim* a tensor dimension, a *level* a level of
the network hierarchy. Degrees are ``tp``, ``cp``, ``ep``, ``dp``, ``pp`` at run time; a degree of 1
means that axis is disabled.
"""

from enum import StrEnum
from typing import Literal


class Axis(StrEnum):
    TP = "tp"  # tensor (intra-layer) parallelism
    CP = "cp"  # context (sequence-dimension) parallelism of attention
    DP = "dp"  # data parallelism (replicas)
    PP = "pp"  # pipeline parallelism (stages)


# Axes that a rank order permutes. Expert parallelism is not a separate placement axis: following
# Megatron-Core, expert ranks are carved out of the (cp x dp) ranks of the MoE layers.
PLACEMENT_AXES: tuple[Axis, ...] = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
MEGATRON_RANK_ORDER: tuple[Axis, ...] = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
NEST_ARTIFACT_RANK_ORDER: tuple[Axis, ...] = (Axis.TP, Axis.CP, Axis.PP, Axis.DP)


class Recompute(StrEnum):
    """Activation recomputation of a stage's blocks (Korthikanti et al. 2022; the per-module
    modes are Megatron-Core's ``--recompute-modules``, ``megatron/training/arguments.py``;
    ``op`` is torchtitan's op-level selective checkpointing, ``activation_checkpoint.mode =
    "selective"`` with ``selective_ac_option = "op"``, its default: the policy and what it
    stores are :func:`nest.core.blocks.op_sac_inventory`; ``dots`` is JAX's
    ``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims``, MaxText's
    ``remat_policy=minimal``: what it stores is :func:`nest.core.blocks.dots_inventory`;
    ``mla_up_proj`` is Megatron-Core's ``--recompute-modules mla_up_proj``: what it drops,
    :func:`nest.core.blocks.block_tensors` with ``up_recomputed``; ``mlp_moe`` is
    ``--recompute-modules mlp moe``, every block's whole MLP under normal checkpointing (the
    dense MLP's ``mlp``, the MoE layer's ``moe``: router, permutations, dispatch and combine,
    routed and shared experts; Megatron-LM@84cf979c766f72dfdc7af73d6b4add5ae952c2da
    ``transformer_config.py``, ``transformer_layer.py``, ``moe/moe_layer.py``): what it drops,
    :func:`nest.core.blocks.block_tensors` with ``mlp_whole``; ``mla_up_proj_mlp_moe`` is
    both, dgxc-benchmarking's DeepSeek-V3 H100 setting); ``qkv_proj`` is MaxText's
    ``remat_policy: save_qkv_proj`` (``jax.checkpoint_policies.save_only_these_names`` of
    ``query_proj``, ``key_proj``, ``value_proj``), ``qkv_out_proj`` praxis's
    ``AutodiffCheckpointType.SAVE_QKV_OUT_PROJ`` (``combined_qkv_proj`` and ``out_proj``, as
    Paxml's GPT-3 configs run it): what they keep is :func:`nest.core.blocks.named_inventory`;
    ``nothing_saveable`` is JAX's ``jax.checkpoint`` with no saveable value, MaxText's
    ``remat_policy: full`` (``policy=None``): the block's input only, with JAX rerunning in the
    backward only what a VJP reads, not FC2, unlike Megatron's ``full``)."""

    NONE = "none"
    SELECTIVE = "selective"  # recompute the attention core (softmax, dropout, attention over V)
    MLP = "mlp"  # recompute the MLP (dense: FC1, activation, FC2) / the experts' activation (MoE)
    SELECTIVE_MLP = "selective_mlp"  # both of the above
    OP = "op"  # keep the outputs of every other matmul and of attention; recompute the rest
    FULL = "full"  # keep only each layer's input; recompute its forward in the backward pass
    DOTS = "dots"  # keep the input and the weight matmuls' outputs; recompute the rest (JAX)
    MLA_UP = "mla_up_proj"  # recompute MLA's Q/K/V up-projections and RoPE (none on other blocks)
    MLP_MOE = "mlp_moe"  # recompute every block's whole MLP: dense MLP or MoE layer (a2a included)
    MLA_UP_MLP_MOE = "mla_up_proj_mlp_moe"  # both of the above
    QKV_PROJ = "qkv_proj"  # keep the input and Q, K, V; recompute the rest (JAX, MaxText)
    QKV_OUT_PROJ = "qkv_out_proj"  # and the attention's output projection (JAX, Paxml)
    NOTHING_SAVEABLE = "nothing_saveable"  # keep the input; rerun what the backward reads (JAX)


BLOCK_RECOMPUTE = "block"
"""The ``solver.recompute`` value that adds every-n-blocks full recompute to the space: a stage
fully recomputes its first ``k`` blocks and runs the rest in one of the listed modes
(:class:`nest.core.plan.BlockRecompute`; searched by ``nest`` and ``brute``)."""


def parse_recompute_modes(values, block: bool = False) -> tuple[Recompute, ...]:
    """``solver.recompute`` as modes, or a one-line error naming the value and the choices;
    ``block``: the planner also searches :data:`BLOCK_RECOMPUTE`, which is then skipped here
    (refused otherwise)."""
    from nest.core.errors import UserError

    values = list(values)
    if BLOCK_RECOMPUTE in values and not block:
        raise UserError(
            f"solver.recompute={values}: {BLOCK_RECOMPUTE!r} (every-n-blocks full recompute) "
            "is searched by solver=nest and solver=brute only; leave it out here"
        )
    try:
        return tuple(Recompute(m) for m in values if m != BLOCK_RECOMPUTE)
    except ValueError:
        choices = [r.value for r in Recompute] + [BLOCK_RECOMPUTE]
        raise UserError(f"solver.recompute={values}; use values of {choices}") from None


class Schedule(StrEnum):
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"  # interleaved 1F1B with v virtual stages per device (SC21 §2.2.2)
    GPIPE = "gpipe"
    ZB_H1 = "zb_h1"  # zero bubble, handcrafted 1 (Qi et al. ICLR 2024 §2.1): 1F1B memory
    ZB_H2 = "zb_h2"  # zero bubble, handcrafted 2 (Qi et al. ICLR 2024 §2.2): 2p - 1 in flight
    ZB_V = "zb_v"  # zero bubble V (Qi et al. arXiv 2405.15362 §3): 2 chunks per rank in a V
    DUALPIPE_V = "dualpipe_v"  # DeepSeek's DualPipeV (deepseek-ai/DualPipe): V, overlapped F&B

    @property
    def splits_backward(self) -> bool:
        """Whether the schedule runs the backward as B (input gradient) and W (weight
        gradient) passes (Qi et al. 2024 §2); DualPipeV does for part of its backwards
        (deepseek-ai/DualPipe@3da1bbe:dualpipe/dualpipev.py, ``enable_zb``)."""
        return self in (Schedule.ZB_H1, Schedule.ZB_H2, Schedule.ZB_V, Schedule.DUALPIPE_V)

    @property
    def v_shaped(self) -> bool:
        """Whether the schedule places its two chunks per rank in a V (rank ``r`` holds chunk
        ``r`` and chunk ``2 pp - 1 - r``; :func:`nest.core.plan.chunk_rank`): ZB-V and
        DualPipeV (whose ``module[0]`` and ``module[1]`` are those chunks)."""
        return self in (Schedule.ZB_V, Schedule.DUALPIPE_V)

    def min_microbatches(self, pp: int) -> int:
        """The fewest microbatches the schedule runs on ``pp`` stages: ZB-H1 ``pp`` (its
        ``pp - r`` in flight, Qi et al. 2024 §2.1), ZB-H2 ``2 pp - 1`` (rank 0's warm-up
        forwards, §2.2), ZB-V ``2 pp - 1`` (rank 0's ``2 pp - 1`` warm-up forwards of its first
        chunk: PyTorch's ``ScheduleZBVZeroBubble`` pads fewer with idle slots,
        pytorch/pytorch@1fd7abc2f521:torch/distributed/pipelining/schedules.py), DualPipeV
        ``2 pp`` (``DualPipeV.step`` asserts ``num_chunks >= num_ranks * 2``,
        deepseek-ai/DualPipe@3da1bbe:dualpipe/dualpipev.py; PyTorch's ``ScheduleDualPipeV``
        asks as many microbatches as stages); 1 for the others."""
        if self is Schedule.DUALPIPE_V:
            return 2 * pp
        if self is Schedule.ZB_H1:
            return pp
        if self in (Schedule.ZB_H2, Schedule.ZB_V):
            return 2 * pp - 1
        return 1


ZeroStage = Literal[0, 1, 2, 3]
"""ZeRO stage (Rajbhandari et al. SC20): 0 plain data parallelism; 1 optimizer state sharded;
2 also the gradients; 3 also the weights."""


class CollectiveOp(StrEnum):
    """The collectives the cost model prices (nest/cost/collectives.py)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"


class GroupKind(StrEnum):
    """The communicator groups of one pipeline rank (nest/cost/groups.py)."""

    TP = "tp"  # tensor ranks of one (replica, context rank)
    CP = "cp"  # context ranks of one (replica, tensor rank)
    EP = "ep"  # expert ranks, carved out of the cp x dp ranks
    DENSE_DP = "dense_dp"  # replicas of the dense weights: the dp x cp ranks of a tensor rank
    EXPERT_DP = "expert_dp"  # replicas of the experts: dp x cp / ep ranks
    ZERO_SHARD = "zero_shard"  # HSDP: the zero_shard x cp ranks one ZeRO shard group spans
    ZERO_REPLICATE = "zero_replicate"  # HSDP: the dp / zero_shard ranks holding the same shard
    EXPERT_ZERO_SHARD = "expert_zero_shard"  # HSDP: a shard group's ranks holding the same experts
    EXPERT_ZERO_REPLICATE = "expert_zero_replicate"  # HSDP: their copies in the other groups


class Optimizer(StrEnum):
    ADAM = "adam"  # mixed precision: fp32 master weights, m and v (12 bytes/param)
    SGD = "sgd"  # no optimizer state, as the NEST artifact's scripts use


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, 1 and ``n`` included: the degrees an axis of
    ``n`` ranks (or a batch of ``n`` sequences) can be split into."""
    return [d for d in range(1, n + 1) if n % d == 0]


class LayerKind(StrEnum):
    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"


def parse_rank_order(value: str | list | tuple) -> tuple[Axis, ...]:
    """Parse ``"tp,cp,dp,pp"`` / ``"tp-cp-dp-pp"`` / a list into a full permutation of the axes.

    Axes left out are appended after the given ones in Megatron order, so the artifact's
    ``"tp,pp,dp"`` becomes ``tp, pp, dp, cp``; an axis of degree 1 may sit anywhere. ``ep`` is
    accepted and skipped (expert ranks live inside the cp x dp ranks).
    """
    from nest.core.errors import UserError

    if isinstance(value, str):
        parts = [p.strip() for p in value.replace("-", ",").split(",") if p.strip()]
    else:
        parts = [str(p).strip() for p in value]
    valid = {a.value for a in PLACEMENT_AXES}
    out: list[Axis] = []
    for p in parts:
        if p == "ep":
            continue  # expert ranks live inside cp x dp; accepted for Megatron-style strings
        if p not in valid:
            raise UserError(
                f"rank_order entry {p!r} is not an axis; use a permutation of {sorted(valid)}"
            )
        if Axis(p) in out:
            raise UserError(f"rank_order {value!r} names {p!r} twice; name each axis once")
        out.append(Axis(p))
    out += [a for a in MEGATRON_RANK_ORDER if a not in out]
    return tuple(out)
