"""Per-layer costs of a transformer as functions of the parallel configuration.

For one layer and one ``Shard`` (tp, cp, ep, sequence parallelism, microbatch size) the
:class:`AnalyticModel` gives, per device and per microbatch: parameters held, forward FLOPs and
seconds, backward seconds (2x forward), recompute seconds, activation bytes per recompute mode,
transient bytes, boundary bytes and the collectives the layer issues. Symbols: ``b`` microbatch,
``s`` sequence, ``h`` hidden, ``a`` heads, ``g`` KV heads, ``d = h/a``, ``F`` FFN size, ``V``
vocabulary, ``t`` tensor degree, ``c`` context degree, ``p`` bytes per element (2 for bf16).

Sources:
- FLOPs (matmuls only, 2 FLOP per multiply-add): Narayanan et al., "Efficient Large-Scale Language
  Model Training on GPU Clusters Using Megatron-LM", SC21, §5.1: a block's forward is
  ``24 b s h^2 + 4 b s^2 h`` and the logit layer's ``2 b s h V``. The generalisation to GQA,
  SwiGLU and MoE follows Megatron-LM's ``num_floating_point_operations``: QKV ``2 b s h (h + 2gd)``,
  a gated MLP has three matrices instead of two, a MoE block runs ``top_k`` experts per token. The
  router's ``2 b s h E`` is left out there and here. Attention scores are counted without a causal
  discount, as both sources do.
- Activation bytes: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", MLSys 2023 (arXiv 2205.05198), §4: per block ``s b h (34 + 5 a s / h)`` without
  parallelism, ``s b h (10 + 24/t + 5 a s/(h t))`` with tensor parallelism, ``s b h/t (34 + 5as/h)``
  with sequence parallelism, ``34 s b h / t`` with selective recompute, ``2 s b h`` (``/t`` with SP)
  with full recompute. We rebuild these from the per-tensor inventory of §4.1 (attention
  ``11 sbh + 5 a s^2 b``, MLP ``19 sbh``, norms ``4 sbh``), so that GQA (K, V are ``g d`` wide),
  SwiGLU (``3 F`` stored instead of ``2 F``), no dropout (no masks) and MoE (``top_k`` token copies)
  follow from the same inventory; the tests check that it reduces to the published formulas.
- Time: matmul FLOPs at the device's achieved rate plus the memory-bound elementwise work (norms,
  residual adds, activation function, dropout, RoPE, softmax, the loss) at HBM bandwidth, each
  operator streaming its inputs and outputs once (roofline; Williams et al., CACM 2009). The
  backward pass takes twice the forward, but for the fused attention core, whose backward runs
  at its published backward rate (:func:`nest.core.kernels.attention_bwd_time_s`).
- Tied embeddings on separate stages: Megatron keeps a copy of the word embedding on the last
  stage; it is counted as ``tied_copy_params``.
- Pipeline boundary: each device sends its (sequence-parallel shard of the) output; without
  sequence parallelism every tensor rank sends the full ``s/c x b x h`` tensor (Megatron-Core).
- Vocabulary padding: Megatron pads ``V`` to a multiple of ``128 * t``
  (``--make-vocab-size-divisible-by 128``).
"""

from dataclasses import dataclass, field, replace
from functools import cache
from math import ceil, erfc, exp, log, pi, sqrt

from nest.core.alphabeta import deepep_op
from nest.core.axes import CollectiveOp, GroupKind, LayerKind, Recompute
from nest.core.blocks import (
    COL,
    ECOL,
    EROW,
    INSIDE,
    NORM_FED,
    OUTSIDE,
    REP,
    ROW,
    attention_core,
    attention_linears,
    block_tensors,
    dots_inventory,
    elementwise_bytes_per_token,
    elementwise_kernels,
    mlp_linears,
    named_inventory,
    op_sac_inventory,
)
from nest.core.hardware import Device
from nest.core.kernels import (
    SCORE_RECOMPUTE_PER_FWD,
    attention_bwd_time_s,
    attention_time_s,
    gemm_time_s,
)
from nest.core.model import LayerRef, ModelSpec, build_chain
from nest.core.precision import Precision

VOCAB_PAD_MULTIPLE = 128  # Megatron-LM --make-vocab-size-divisible-by default

DROPLESS_EXPERT_LOAD_CV = 1.016
"""Coefficient of variation of one routed expert's token load under dropless routing (its standard
deviation over the balanced share), the one dispersion behind :func:`dropless_load_factor`.

Calibrated, on one declared row: no published micro-benchmark isolates the per-rank load of a
dropless training run. Megatron-MoE-ModelZoo (``best_practice/qwen3/readme.md``, "Long Context":
Qwen3-235B, 128 experts, on 256 H100, TP4 PP8 VP4 EP8, so 16 local experts, DeepEP, BF16)
measures forced-balance vs dropless routing at four sequence lengths: 295 / 237, 335 / 277,
368 / 320 and 389 / 357 TFLOP/s per GPU at 16K, 32K, 64K and 128K tokens (CP 1, 2, 4, 8), i.e.
dropless 19.7 %, 17.3 %, 13.0 % and 8.2 % slower. 1.016 is the dispersion whose
:func:`dropless_load_factor` at EP8 with 16 local experts is 1.40, the factor that reproduces the
16K gap (19.7 % predicted); the 32K, 64K and 128K pairs are held out (16.9 %, 13.0 %, 9.0 %
predicted: tests/test_moe_realism.py). No validation row is dropless (the published benchmarks
force balance, ``--moe-router-force-load-balancing``), so the factor's growth with ``ep`` is
checked only against the inference statistics below, not against a training run.

Cross-check (not fitted): TensorRT-LLM's published DeepSeek-R1 routing statistics (NVIDIA
TensorRT-LLM ``docs/source/blogs/tech_blog/blog4_Scaling_Expert_Parallelism_in_TensorRT-LLM.md``
at commit ``1d263f15``, Table 1, EP32, 8 experts per rank, no EPLB) give an expert-load CV of
164.1 / 128 = 1.28, the same order as this one."""

EXPERT_FC1 = "efc1"
EXPERT_LINEARS = frozenset((EXPERT_FC1, "efc2"))
"""The routed experts' linears (:func:`nest.core.blocks.mlp_linears`)."""
SHARED_LINEARS = frozenset(("sh_fc1", "sh_fc2"))
"""The shared experts' linears (:func:`nest.core.blocks.mlp_linears`)."""

ROUTER_BYTES_PER_LOGIT = 12
"""HBM bytes per router logit of the router's memory-bound kernels, each way: the softmax reads
and writes the fp32 logits (8 bytes; Megatron-Core ``--moe-router-dtype fp32``) and the top-k
reads the probabilities (4 bytes) (Megatron-Core ``moe/router.py``, ``topk_softmax_with_capacity``;
roofline, each operator streaming its inputs and outputs once)."""


@cache
def dropless_load_factor(ep: int, local_experts: int, cv: float = DROPLESS_EXPERT_LOAD_CV) -> float:
    """Expected tokens of the most loaded of ``ep`` expert-parallel ranks, each holding
    ``local_experts`` experts, over the balanced share, under dropless routing.

    Model: each expert's load (over its balanced share) is an independent draw with mean 1 and
    coefficient of variation ``cv`` (:data:`DROPLESS_EXPERT_LOAD_CV`); a rank's load, the mean of
    its ``local_experts`` experts' loads, then has mean 1 and CV ``cv / sqrt(local_experts)``;
    it is taken lognormal with that mean and CV (Fenton-Wilkinson's moment match for a sum of
    lognormals, Fenton, IRE Trans. Commun. Syst. 8(1), 1960; per-rank token counts of DeepSeek-V3
    fitted best by a lognormal: deepseek-ai/DeepEP pull request 393), and the factor is the
    expected maximum of ``ep`` such ranks, ``E[max_r X_r] = int exp(mu + s z) n Phi(z)^(n-1)
    phi(z) dz`` with ``s^2 = ln(1 + CV^2)``, ``mu = -s^2 / 2``, ``n = ep``, by Simpson's rule.

    Exactly 1 at ``ep = 1`` (every rank runs every expert on its own tokens); increasing in ``ep``
    at fixed ``local_experts`` (the maximum of more draws), decreasing in ``local_experts`` at
    fixed ``ep`` (a rank sums more experts). Checked against TensorRT-LLM's published DeepSeek-R1
    statistics (blog4 at commit ``1d263f15``, Table 1: EP32, 8 experts per rank): from their
    expert-load CV 1.28 this model gives a rank-load CV of 0.45 (0.48 measured) and a most
    loaded rank 2.28 times the mean (2.56 measured); a normal instead of a lognormal gives
    1.94. Left out: sampling noise of small microbatches (Poisson, CV ``1 / sqrt(tokens per
    expert)``), negligible at the calibration row's 16K-token sequences, and correlation of
    experts placed on one rank."""
    if ep < 1 or local_experts < 1 or cv < 0:
        raise ValueError(
            f"dropless_load_factor(ep={ep}, local_experts={local_experts}, cv={cv}): "
            "need ep >= 1, local_experts >= 1 and cv >= 0"
        )
    if ep == 1 or cv == 0:
        return 1.0
    s = sqrt(log(1.0 + cv * cv / local_experts))
    mu = -0.5 * s * s
    lo_z, hi_z, steps = -12.0, 12.0, 2400
    dz = (hi_z - lo_z) / steps
    total = 0.0
    for i in range(steps + 1):
        z = lo_z + i * dz
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        cdf = 0.5 * erfc(-z / sqrt(2.0))
        pdf = exp(-0.5 * z * z) / sqrt(2.0 * pi)
        total += weight * exp(mu + s * z) * ep * cdf ** (ep - 1) * pdf
    return total * dz / 3.0


@dataclass(frozen=True, slots=True)
class Shard:
    """How one layer is split: degrees and the microbatch size."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    """Sequence parallelism (Korthikanti et al.); only matters when ``tp > 1``."""
    mbs: int = 1
    etp: int | None = None
    """Expert tensor degree: None (= ``tp``) or 1 (whole experts on the sequence-parallel
    tokens: :attr:`nest.core.plan.ParallelConfig.etp`)."""

    def __post_init__(self) -> None:
        if self.etp is not None and self.etp == self.tp:
            object.__setattr__(self, "etp", None)

    @property
    def expert_tp(self) -> int:
        """The degree each expert's weights are split over (``etp``, or ``tp`` when None)."""
        return self.tp if self.etp is None else self.etp


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective a layer issues; ``n_bytes`` is its full buffer (see nest.cost.collectives).

    Overlap: a framework feature may run the collective concurrently with ``hidden_by_s`` seconds
    of the layer's compute (e.g. Megatron-Core's ``--tp-comm-overlap`` runs a tensor-parallel
    all-gather chunk by chunk under the GEMM that consumes it). What sticks out is charged,
    ``max(t - hidden_by_s, min_exposed * t)`` for a collective of ``t`` seconds, plus the
    slowdown of the compute while the two share the SMs, ``slowdown * min(t, hidden_by_s)``
    (:func:`nest.cost.compute.exposed_s`); ``min_exposed`` is the share no schedule hides (e.g.
    the last of ``num_splits`` chunks of a pipelined reduce-scatter). The defaults charge it all.
    """

    op: CollectiveOp
    axis: GroupKind
    """Group it runs over: ``tp``, ``cp`` or ``ep``."""
    n_bytes: float
    hidden_by_s: float = 0.0
    """Compute seconds the collective runs under (0: none, it is exposed)."""
    min_exposed: float = 0.0
    """Share of the collective that stays exposed whatever the compute, in [0, 1]."""
    slowdown: float = 0.0
    """How much longer the compute under it takes while they overlap (the communication kernels
    take SMs from it), as a fraction of the overlapped time."""
    role: str = field(default="", compare=False)
    """What it does in its block, for the recompute modes that rerun some of a block's
    collectives: the tensor-parallel ones are ``attn_in`` / ``mlp_in`` (sequence parallelism's
    all-gather before the attention or the MLP) and ``attn_out`` / ``mlp_out`` (the
    reduce-scatter or all-reduce after it), set by :meth:`AnalyticModel._tp_collectives`; ``""``
    otherwise. Not part of its identity (equality, hashing)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """Cost of one layer on one device for one microbatch. SI units."""

    dense_params: float
    """Parameters held that are replicated across the data-parallel (x context) group."""
    expert_params: float = 0.0
    """Expert parameters held, replicated across the expert-data-parallel group."""
    tied_copy_params: float = 0.0
    """Head only: the copy of a tied word embedding Megatron keeps on the last stage."""
    fwd_flops: float = 0.0
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    wgrad_s: float = 0.0
    """The part of ``bwd_s`` that computes the weight gradients (the weight-gradient GEMMs):
    the W pass of the zero-bubble schedules (Qi et al. ICLR 2024 §2), which may run after the
    rest of the backward, the B pass (input gradients, attention core, norms, activations,
    casts, collectives). 0 where the model does not split its backward (measured profiles)."""
    recompute_s: dict = field(default_factory=dict)
    """Extra backward-pass seconds per recompute mode."""
    recompute_flops: dict = field(default_factory=dict)
    """Matmul FLOPs of that recomputation, per recompute mode."""
    act_bytes: dict = field(default_factory=dict)
    """Stored activation bytes per recompute mode."""
    transient_bytes: float = 0.0
    """Short-lived buffer at this layer's peak (e.g. bf16 logits), beyond stored activations."""
    resident_bytes: float = 0.0
    """Bytes the layer keeps all iteration beyond its parameters' state (the FP8 weight copies
    of :mod:`nest.core.precision`); below ZeRO-3 only (ZeRO-3 gathers weights per use)."""
    boundary_bytes: float = 0.0
    """Bytes of the output activation each device sends to the next layer's devices."""
    fwd_collectives: tuple[Collective, ...] = ()
    bwd_collectives: tuple[Collective, ...] = ()
    recompute_collectives: dict = field(default_factory=dict)


def combine(a: LayerCost, b: LayerCost) -> LayerCost:
    """Two layer parts run one after the other as one layer (the head and its MTP modules):
    sums of every term, the larger transient buffer, ``a``'s output boundary."""

    def both(x: dict, y: dict, zero) -> dict:
        return {mode: x.get(mode, zero) + y.get(mode, zero) for mode in Recompute}

    return LayerCost(
        dense_params=a.dense_params + b.dense_params,
        expert_params=a.expert_params + b.expert_params,
        tied_copy_params=a.tied_copy_params + b.tied_copy_params,
        fwd_flops=a.fwd_flops + b.fwd_flops,
        fwd_s=a.fwd_s + b.fwd_s,
        bwd_s=a.bwd_s + b.bwd_s,
        wgrad_s=a.wgrad_s + b.wgrad_s,
        recompute_s=both(a.recompute_s, b.recompute_s, 0.0),
        recompute_flops=both(a.recompute_flops, b.recompute_flops, 0.0),
        act_bytes=both(a.act_bytes, b.act_bytes, 0.0),
        transient_bytes=max(a.transient_bytes, b.transient_bytes),
        resident_bytes=a.resident_bytes + b.resident_bytes,
        boundary_bytes=a.boundary_bytes,
        fwd_collectives=a.fwd_collectives + b.fwd_collectives,
        bwd_collectives=a.bwd_collectives + b.bwd_collectives,
        recompute_collectives=both(a.recompute_collectives, b.recompute_collectives, ()),
    )


EMBEDDING_GRAD_ACCUMULATE_BYTES_PER_WEIGHT = 10
"""HBM bytes per word-embedding weight that accumulating its gradient moves every microbatch,
beyond the ``p`` bytes of the dense gradient itself: the backward of the lookup
(``F.embedding`` / ``weight[ids]`` in Megatron-Core's ``VocabParallelEmbedding``) writes a dense
``V/t x h`` gradient in the parameter dtype (zero-filled, the tokens' rows added: ``p`` bytes),
and Megatron-Core's DDP backward hook (``distributed_data_parallel.py``,
``_make_backward_post_hook``: ``param.main_grad.add_(param.grad.data)``; the linear layers skip
it, their weight-gradient GEMMs accumulate into ``main_grad`` directly) adds it into the fp32
main gradient: read ``p`` (2) and 4, write 4. Two memory-bound kernels at the achieved HBM
bandwidth, a cost of the vocabulary, not of the tokens: ~1 ms per microbatch for a 131k x 2048
embedding on H100."""


LOSS_STREAM = {
    True: ((26, 4), (14, 2)),
    False: ((14, 3), (22, 3)),
}
"""HBM bytes per logit and kernels of the cross-entropy loss, ``{fused_loss: ((forward bytes,
forward kernels), (backward bytes, backward kernels))}``, each operator streaming its inputs and
outputs once (roofline, as the block's elementwise work;
:attr:`nest.core.problem.Training.fused_loss` picks the implementation):

- ``True``, Megatron-Core's vocabulary-parallel cross entropy with ``cross_entropy_loss_fusion``
  (``megatron/core/fusions/fused_cross_entropy.py``; NeMo's ``GPTConfig`` turns it on): forward
  ``calculate_logits_max`` (the fp32 cast and the row max, one fused kernel: read 2, write 4),
  ``_exp_logits_inplace`` (subtract the max and exponentiate: read 4, write 4), the row
  ``sum`` (read 4), ``calculate_cross_entropy_loss``'s ``div_`` (read 4, write 4): 26 bytes,
  4 kernels; backward ``_scale_gradients_inplace`` (read 4, write 4) and the cast of the
  gradient to the logits' bf16 (read 4, write 2): 14 bytes, 2 kernels. Megatron-LM's unfused
  default (``megatron/core/tensor_parallel/cross_entropy.py``) moves 12 more bytes in its
  forward (separate cast, max, subtract and exponential: 38), charged where
  ``cross_entropy_loss_fusion`` is off (:data:`UNFUSED_MEGATRON_LOSS_STREAM`);
- ``False``, torchtitan's ``F.cross_entropy(pred.float(), labels)``: forward the cast (read 2,
  write 4), ``log_softmax`` (read 4, write 4), ``nll_loss`` (a gather): 14 bytes, 3 kernels;
  backward ``nll_loss_backward`` (a dense fp32 zero gradient: write 4),
  ``log_softmax_backward_data`` (read 4 + 4, write 4), the cast back (read 4, write 2): 22
  bytes, 3 kernels.

The target gathers and the per-token reductions' outputs are ``1/V`` of these and not counted.
With a 131k vocabulary a microbatch's loss moves ~40 bytes for each of its ``s b V / t`` logits,
which a small model's blocks do not outweigh."""


def unfused_core_bytes_per_score(
    p: int, dropout: bool, read_fraction: float
) -> tuple[float, float]:
    """HBM bytes per score element of an unfused attention core's memory-bound work, (forward,
    backward), as Megatron-LM runs it without FlashAttention (``megatron/model/transformer.py``
    ``ParallelAttention.forward`` at 83c4d95a, June 2021, the code of the SC21 runs, and the same
    path in the zero-bubble fork of 2023): ``torch.baddbmm`` writes the scaled scores (a GEMM
    output, charged with the GEMM), then

    - the fused scale-mask-softmax (``megatron/fused_kernels/scaled_upper_triang_masked_softmax.h``
      at 83c4d95a): the forward loads only the ``read_fraction`` of each row that is not masked
      (``element_index < local_seq``, the lower triangle: one half for causal attention) and
      writes the whole row (zeros above the diagonal): ``read_fraction p + p``; the backward
      loads the output gradient and the saved softmax output on the same elements and writes
      the input gradient in place over the whole row: ``2 read_fraction p + p``;
    - the attention dropout (PyTorch ``aten/src/ATen/native/cuda/Dropout.cu``:
      ``fused_dropout`` reads the probabilities, writes them and a ``uint8`` mask;
      ``masked_scale``, its backward, reads the gradient and the mask and writes the
      gradient): ``2p + 1`` each way.

    Each kernel streams what it reads and writes once (roofline; Williams et al., CACM 2009).
    A softmax under another mask (an encoder's, a window's) reads the whole row
    (``read_fraction`` 1)."""
    fwd = read_fraction * p + p
    bwd = 2 * read_fraction * p + p
    if dropout:
        fwd += 2 * p + 1
        bwd += 2 * p + 1
    return fwd, bwd


UNFUSED_MEGATRON_LOSS_STREAM = ((38, 6), (14, 2))
"""HBM bytes per logit and kernels of Megatron-Core's vocabulary-parallel cross entropy without
``--cross-entropy-loss-fusion`` (Megatron-LM's default: ``megatron/training/arguments.py`` at
1e057005 declares the flag ``store_true``), as :data:`LOSS_STREAM`. Forward,
``megatron/core/tensor_parallel/cross_entropy.py`` at 1e057005: ``calculate_logits_max``'s
``.float()`` (read 2, write 4) and ``torch.max`` (read 4) as two kernels,
``calculate_predicted_logits``' in-place subtraction of the max (read 4, write 4), ``torch.exp``
in place (read 4, write 4) and the row ``sum`` (read 4), ``calculate_cross_entropy_loss``'s
``div_`` (read 4, write 4): 38 bytes, 6 kernels. Backward as the fused path's: the in-place
``mul_`` of ``calculate_gradients`` (read 4, write 4) and autograd's cast of the fp32 gradient to
the bf16 logits' dtype (read 4, write 2): 14 bytes, 2 kernels. The target gathers and per-token
reductions are ``1/V`` of these and not counted; the peak holds the same fp32 softmax and casts
as the fused path (:meth:`AnalyticModel._loss_transient_bytes_per_logit`)."""


def padded_vocab(vocab: int, tp: int) -> int:
    multiple = VOCAB_PAD_MULTIPLE * tp
    return ceil(vocab / multiple) * multiple


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlap:
    """Which framework features run a layer's collectives under its compute (each the feature of
    Megatron-Core / Transformer Engine it models; NVIDIA NeMo and Megatron-Bridge performance
    guides, "Communication overlap"). Off: the collective is charged in full.

    - ``tp``: ``--tp-comm-overlap`` (TE userbuffers, needs sequence parallelism): the all-gather
      before the QKV and FC1 GEMMs runs chunk by chunk under them (ring exchange); the
      reduce-scatter after the projection and FC2 GEMMs is pipelined with them in
      ``TP_OVERLAP_SPLITS`` chunks, the last of which stays exposed; in the backward the gradient
      all-gathers run under the data-gradient GEMMs and the reduce-scatters under the
      weight-gradient GEMMs (bulk overlap). Dense attention and MLP only (MoE experts run grouped
      GEMMs without userbuffers).
    - ``cp``: context parallelism's ring exchange of K/V blocks (TE ``cp_comm_type=p2p``, "fully
      overlapped"): each step's transfer runs under the attention of the block already held, so
      the exchange hides behind ``(cp - 1) / cp`` of the attention kernel time.
    - ``ep``: ``--overlap-moe-expert-parallel-comm`` (Megatron-Core's 1F1B all-to-all overlap):
      a microbatch's dispatch and combine run under another microbatch's attention compute in
      the steady state, each under half of it.

    An overlapped collective's kernels take ``COMM_SMS`` of the device's SMs from the compute it
    hides under, which runs correspondingly slower while they overlap
    (:attr:`Collective.slowdown`); devices without an SM count (the flat model) pay nothing.
    """

    tp: bool = False
    cp: bool = False
    ep: bool = False


COMM_SMS = 16
"""SMs a communication kernel overlapped with compute occupies (Megatron-Bridge performance guide,
"TP communication overlap": "The default SM count for communication is 16")."""

TP_OVERLAP_SPLITS = 4
"""Chunks of a pipelined GEMM + reduce-scatter (Megatron-Bridge performance guide: "num_splits =
4 generally provides the best performance"); one of them stays exposed."""


class AnalyticModel:
    """Per-layer costs of a :class:`ModelSpec` from published formulas.

    Costs are cached per (layer signature, shard, device) on the instance.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        flash_attention: bool = False,
        fused_loss: bool = True,
        cross_entropy_loss_fusion: bool = True,
        overlap: Overlap | None = None,
        precision: Precision | None = None,
        moe_routing: str = "dropless",
        moe_dispatcher: str = "alltoall",
        seq_len_source: str = "model.seq_len",
        notes: tuple[str, ...] = (),
    ) -> None:
        self.spec = spec
        self.flash_attention = flash_attention
        self.fused_loss = fused_loss
        self.cross_entropy_loss_fusion = cross_entropy_loss_fusion
        """Megatron-LM's ``--cross-entropy-loss-fusion`` where ``fused_loss``
        (:attr:`nest.core.problem.Training.cross_entropy_loss_fusion`)."""
        self.overlap = overlap or Overlap()
        self.precision = precision or Precision()
        self.moe_routing = moe_routing
        """``dropless`` or ``balanced`` (:attr:`nest.core.problem.Training.moe_routing`)."""
        self.moe_dispatcher = moe_dispatcher
        """``alltoall`` or ``deepep`` (:attr:`nest.core.problem.Training.moe_dispatcher`)."""
        self.chain: tuple[LayerRef, ...] = build_chain(spec)
        last = spec.layers - 1
        self.mtp_ref = LayerRef(
            index=-1,
            kind=LayerKind.BLOCK,
            name="mtp",
            moe=spec.block_is_moe(last),
            local=spec.block_is_local(last),
        )
        """The kind of block a multi-token-prediction module runs: the last block's."""
        self._ffn_sizes = self._tp_split_ffn_sizes()
        self.seq_len_source = seq_len_source
        """Where ``spec.seq_len`` came from (``LayerModel.seq_len_source``)."""
        self.notes = tuple(notes)
        """Remarks the run summary prints (e.g. a Hugging Face config's defaults)."""
        self._cache: dict = {}

    @property
    def name(self) -> str:
        return self.spec.name

    def cost_key(self, ref: LayerRef) -> tuple:
        """Layers with equal keys have equal costs under every shard (the analytic formulas
        depend on the layer's kind, whether it is MoE and whether its attention is local)."""
        return ref.signature

    @property
    def seq_len(self) -> int:
        return self.spec.seq_len

    # ----------------------------------------------------------------- validity of a shard
    def shard_rules(self) -> list[str]:
        m = self.spec
        rules = [f"tp must divide heads={m.heads} and the FFN size"]
        if m.is_moe:
            rules.append(
                f"ep must divide num_experts={m.num_experts} and dp*cp*tp/etp; etp is tp or 1"
            )
        return rules

    def _tp_split_ffn_sizes(self) -> dict[str, int]:
        """The FFN widths a tensor-parallel split must divide, by field name (computed once:
        :meth:`shard_problem` runs for every shard a search visits)."""
        m = self.spec
        sizes = {}
        if any(not m.block_is_moe(i) for i in range(m.layers)):
            sizes["ffn_hidden"] = m.ffn_hidden
        if m.is_moe and m.shared_experts:
            sizes["shared FFN (shared_experts x shared_ffn_hidden)"] = m.shared_ffn
        return sizes

    def shard_problem(self, shard: Shard) -> str | None:
        """Why this model cannot be split this way (None if it can)."""
        m = self.spec
        if m.heads % shard.tp or (m.attention == "gqa" and m.num_kv_heads % shard.tp):
            kv = f" and kv_heads={m.num_kv_heads}" if m.attention == "gqa" else ""
            return f"tp={shard.tp} must divide heads={m.heads}{kv} of {m.name}"
        for name, size in self._ffn_sizes.items():
            if size % shard.tp:
                return f"tp={shard.tp} must divide {name}={size} of {m.name}"
        if m.is_moe and m.expert_ffn % shard.expert_tp:
            return (
                f"tp={shard.tp} must divide moe_ffn_hidden={m.expert_ffn} of {m.name} "
                "(or use etp=1: whole experts)"
            )
        if shard.etp is not None and not m.is_moe:
            return f"etp={shard.etp} but {m.name} has no experts; leave etp unset"
        if shard.cp > 1 and m.seq_len % (2 * shard.cp):
            return (
                f"cp={shard.cp} needs seq_len={m.seq_len} divisible by 2*cp (load-balanced "
                f"context parallelism); choose a cp that divides {m.seq_len // 2}"
            )
        if shard.ep > 1 and not m.is_moe:
            return f"ep={shard.ep} but {m.name} has no experts; use ep=1"
        if m.is_moe and shard.tp > 1 and not shard.sp:
            return (
                f"{m.name} is a mixture of experts: tp={shard.tp} needs sequence parallelism "
                "(Megatron-Core asserts it); set training.sequence_parallel=true or tp=1"
            )
        if m.num_experts % shard.ep:
            return f"ep={shard.ep} must divide num_experts={m.num_experts} of {m.name}"
        return None

    # ----------------------------------------------------------------- totals
    def param_count(self, ref: LayerRef) -> float:
        """Unique parameters of a layer (unsharded, unpadded vocabulary; the head's includes
        its multi-token-prediction modules)."""
        m = self.spec
        if ref.kind is LayerKind.EMBEDDING:
            return sum(self._embedding_params(m.vocab))
        if ref.kind is LayerKind.HEAD:
            sharded, replicated, _ = self._head_params(m.vocab)
            return sharded + replicated + self.mtp_params()
        return sum(self._block_params(ref.moe))

    def total_params(self) -> float:
        return sum(self.param_count(ref) for ref in self.chain)

    def mtp_params(self) -> float:
        """Parameters of the multi-token-prediction modules: per module two input norms, the
        ``2h -> h`` projection and a block (DeepSeek-V3 §2.2; the embedding and output head
        are the main model's)."""
        m = self.spec
        per = (
            2 * self._norm_params()
            + 2 * m.hidden * m.hidden
            + sum(self._block_params(self.mtp_ref.moe))
        )
        return m.mtp_layers * per

    def active_params(self) -> float:
        """Parameters one token's forward uses: every dense parameter, ``top_k`` of each MoE
        block's routed experts (the model cards' "activated" count; MTP left out as
        :meth:`model_stats` says)."""
        m = self.spec
        total = 0.0
        for ref in self.chain:
            if ref.kind is LayerKind.BLOCK:
                dense_s, dense_r, exp_s, exp_r = self._block_params(ref.moe)
                total += dense_s + dense_r + (exp_s + exp_r) * m.top_k / m.num_experts
            elif ref.kind is LayerKind.EMBEDDING:
                total += sum(self._embedding_params(m.vocab))
            else:
                sharded, replicated, _ = self._head_params(m.vocab)
                total += sharded + replicated
        return total

    def model_stats(self) -> dict:
        """``report.json["model_stats"]``: ``params_total`` and ``params_active`` as model cards
        count them (embedding and output head included, multi-token-prediction modules not:
        they are ``params_mtp``), ``params_active_non_embedding`` (the active count without the
        input embedding, a lookup with no matmul, as gpt-oss's model card counts its active
        parameters; a tied matrix stays, as the output head uses it) and
        ``model_flops_per_token`` (the convention of
        :mod:`nest.cost.mfu`, forward and backward, MTP included as it is trained)."""
        total = self.total_params()
        mtp = self.mtp_params()
        active = self.active_params()
        m = self.spec
        lookup = sum(self._embedding_params(m.vocab)) - (
            m.vocab * m.hidden if m.tied_embeddings else 0
        )
        return {
            "params_total": total - mtp,
            "params_active": active,
            "params_active_non_embedding": active - lookup,
            "params_mtp": mtp,
            "model_flops_per_token": self.model_flops_per_sample() / self.spec.seq_len,
        }

    def model_flops_per_sample(self) -> float:
        """Model FLOPs of one sequence, forward + backward (3x forward), no recompute."""
        m = self.spec
        return 3.0 * sum(self._fwd_flops(ref, m.seq_len, m.vocab) for ref in self.chain)

    def _block_refs(self) -> list[LayerRef]:
        blocks = [ref for ref in self.chain if ref.kind is LayerKind.BLOCK]
        return blocks + [self.mtp_ref] * self.spec.mtp_layers

    def attention_score_flops_per_sample(self) -> float:
        """The part of :meth:`model_flops_per_sample` spent on attention scores and their
        weighted sum (``4 b s^2 h`` per global MHA block forward, x3 with the backward)."""
        s = self.spec.seq_len
        return (
            3.0
            * s
            * sum(
                attention_core(self.spec, ref.local).flops_per_token() for ref in self._block_refs()
            )
        )

    def causal_skipped_flops_per_sample(self) -> float:
        """The counted score FLOPs a causal kernel skips (the masked part; 0 for an encoder):
        half of a global block's, ``w / (2 s)`` of a sliding window's."""
        if not self.causal:
            return 0.0
        s = self.spec.seq_len
        total = 0.0
        for ref in self._block_refs():
            core = attention_core(self.spec, ref.local)
            total += (1.0 - core.done_fraction) * core.flops_per_token()
        return 3.0 * s * total

    @property
    def causal(self) -> bool:
        """Decoder attention (a causal mask); an encoder attends to every position."""
        return not self.spec.encoder

    # ----------------------------------------------------------------- parameters
    def _norm_params(self) -> int:
        return 2 * self.spec.hidden if self.spec.norm == "layernorm" else self.spec.hidden

    def _block_params(self, moe: bool) -> tuple[float, float, float, float]:
        """(dense sharded, dense replicated, expert sharded, expert replicated) of one block:
        its linears (:mod:`nest.core.blocks`) with their biases, its norms (two per block;
        MLA's latent norms; per-head Q/K norms)."""
        m = self.spec
        sharded = replicated = exp_sharded = exp_replicated = 0.0
        for lin in attention_linears(m) + mlp_linears(m, moe):
            bias = lin.n if m.bias and lin.name != "router" else 0  # Megatron's router: none
            if lin.split == COL:
                sharded += lin.params + bias
            elif lin.split == ROW:
                sharded += lin.params
                replicated += bias
            elif lin.split == REP:
                replicated += lin.params + bias
            elif lin.split == ECOL:
                exp_sharded += m.num_experts * (lin.params + bias)
            else:
                exp_sharded += m.num_experts * lin.params
                exp_replicated += m.num_experts * bias
        replicated += 2 * self._norm_params()
        if m.attention == "mla":
            replicated += (m.q_lora_rank or 0) + m.kv_lora_rank
        elif m.qk_norm:
            replicated += 2 * m.d_head
        return sharded, replicated, exp_sharded, exp_replicated

    def _embedding_params(self, vocab: int) -> tuple[float, float]:
        """(vocab-sharded, replicated) parameters of the embedding."""
        m = self.spec
        replicated = 0.0
        if m.position == "learned":
            replicated += (m.max_position or m.seq_len) * m.hidden
        if m.encoder:
            replicated += 2 * m.hidden + self._norm_params()  # token types, embedding norm
        return vocab * m.hidden, replicated

    def _head_params(self, vocab: int) -> tuple[float, float, float]:
        """(vocab-sharded, replicated, tied copy) parameters of the head (without MTP). A last
        stage running MTP modules keeps a copy of the word embedding for them, as a tied
        embedding does (Megatron-Core shares it between the first and last stage)."""
        m = self.spec
        h = m.hidden
        if m.encoder:
            # MLM transform (dense h x h + bias, norm), decoder bias; pooler and NSP classifier.
            replicated = (h * h + h) + self._norm_params() + (h * h + h) + (2 * h + 2)
            sharded = vocab  # decoder bias, vocab-parallel
        else:
            replicated = self._norm_params()
            sharded = 0.0
        if m.tied_embeddings:
            return sharded, replicated, vocab * h
        return sharded + vocab * h, replicated, vocab * h if m.mtp_layers else 0.0

    # ----------------------------------------------------------------- flops
    def _fwd_flops(self, ref: LayerRef, tokens: float, vocab: int) -> float:
        """Forward FLOPs of a layer for ``tokens`` tokens of sequences of length ``s``: 2 per
        weight per token over the linears (the router left out, as Megatron-LM does), the
        attention core's score FLOPs, ``top_k`` routed experts and the shared ones."""
        m = self.spec
        h = m.hidden
        if ref.kind is LayerKind.EMBEDDING:
            return 0.0
        if ref.kind is LayerKind.HEAD:
            flops = 2.0 * tokens * h * vocab
            if m.encoder:
                flops += 2.0 * tokens * h * h  # MLM transform
            mtp = 2.0 * tokens * 2 * h * h + self._fwd_flops(self.mtp_ref, tokens, vocab)
            return flops + m.mtp_layers * (mtp + 2.0 * tokens * h * vocab)
        weights = 0.0
        for lin in attention_linears(m) + mlp_linears(m, ref.moe):
            if lin.split in (ECOL, EROW):
                weights += m.top_k * lin.params
            elif lin.name != "router":
                weights += lin.params
        return 2.0 * tokens * weights + tokens * attention_core(m, ref.local).flops_per_token()

    # ----------------------------------------------------------------- the cost
    def layer_cost(self, ref: LayerRef, shard: Shard, device: Device) -> LayerCost:
        key = (ref.signature, shard, device)
        cost = self._cache.get(key)
        if cost is None:
            cost = self._layer_cost(ref, shard, device)
            self._cache[key] = cost
        return cost

    def _layer_cost(self, ref: LayerRef, shard: Shard, device: Device) -> LayerCost:
        if ref.kind is LayerKind.EMBEDDING:
            return self._embedding_cost(shard, device)
        if ref.kind is LayerKind.HEAD:
            cost = self._head_cost(ref, shard, device)
            for _ in range(self.spec.mtp_layers):
                cost = combine(cost, self._mtp_cost(shard, device))
            return cost
        return self._block_cost(ref, shard, device)

    def _dims(self, shard: Shard) -> tuple:
        """(t, c, sp, sp_div, p, b, s, h, s_loc, hsb, x_bytes) of a shard."""
        m = self.spec
        t, c = shard.tp, shard.cp
        sp = shard.sp and t > 1
        sp_div = t if sp else 1
        p = m.dtype_bytes
        b, s, h = shard.mbs, m.seq_len, m.hidden
        s_loc = s / c
        hsb = s_loc * b * h  # elements of one hidden activation on this device's sequence chunk
        return t, c, sp, sp_div, p, b, s, h, s_loc, hsb, p * hsb

    def _gemms_s(self, device: Device, gemms, fp8: bool = False) -> tuple[float, float]:
        """Forward and backward seconds of ``(m, n, k, groups)`` GEMMs: the forward GEMM, and the
        backward's data gradient ``[m x n] @ [n x k]`` and weight gradient ``[k x m] @ [m x n]``
        (:func:`nest.core.kernels.gemm_time_s`; ``fp8``: at the FP8 rate)."""
        p = self.spec.dtype_bytes
        fwd = sum(gemm_time_s(device, m, n, k, g, p, fp8) for m, n, k, g in gemms)
        bwd = sum(
            gemm_time_s(device, m, k, n, g, p, fp8) + gemm_time_s(device, k, n, m, g, p, fp8)
            for m, n, k, g in gemms
        )
        return fwd, bwd

    def _wgrad_s(self, device: Device, gemms, fp8: bool = False) -> float:
        """Seconds of the weight-gradient GEMMs ``[k x m] @ [m x n]`` of ``(m, n, k, groups)``
        GEMMs: the part of :meth:`_gemms_s`'s backward a zero-bubble schedule runs as its W
        pass (Qi et al. ICLR 2024 §2: for a linear layer it has the FLOPs of the
        input-gradient GEMM)."""
        p = self.spec.dtype_bytes
        return sum(gemm_time_s(device, k, n, m, g, p, fp8) for m, n, k, g in gemms)

    def _embedding_cost(self, shard: Shard, device: Device) -> LayerCost:
        m = self.spec
        t, _, sp, sp_div, p, _, _, _, _, hsb, x_bytes = self._dims(shard)
        vocab = padded_vocab(m.vocab, t)
        sharded, replicated = self._embedding_params(vocab)
        act = ((hsb if m.dropout else 0.0) + (p * hsb if m.encoder else 0.0)) / sp_div
        ew = p * hsb + ((2 * p + 1) * hsb if m.dropout else 0.0)  # lookup write, dropout
        fwd_s = ew / sp_div / device.achieved_hbm_bw_bytes_per_s
        # the word embedding's dense weight gradient, written and accumulated every microbatch
        grad_bytes = (vocab / t) * m.hidden * (p + EMBEDDING_GRAD_ACCUMULATE_BYTES_PER_WEIGHT)
        grad_s = grad_bytes / device.achieved_hbm_bw_bytes_per_s + 2 * device.kernel_overhead_s
        tp_fwd: list[Collective] = []
        tp_bwd: list[Collective] = []
        if t > 1:
            tp_fwd.append(
                Collective(
                    CollectiveOp.REDUCE_SCATTER if sp else CollectiveOp.ALL_REDUCE,
                    GroupKind.TP,
                    x_bytes,
                )
            )
            if sp:  # the backward of a reduce-scatter is an all-gather
                tp_bwd.append(Collective(CollectiveOp.ALL_GATHER, GroupKind.TP, x_bytes))
        return LayerCost(
            dense_params=sharded / t + replicated,
            fwd_flops=0.0,
            fwd_s=fwd_s,
            bwd_s=2.0 * fwd_s + grad_s,
            act_bytes={mode: act for mode in Recompute},
            boundary_bytes=p * hsb / sp_div,
            fwd_collectives=tuple(tp_fwd),
            bwd_collectives=tuple(tp_bwd),
        )

    def _head_cost(self, ref: LayerRef, shard: Shard, device: Device) -> LayerCost:
        m = self.spec
        t, c, sp, sp_div, p, b, s, h, s_loc, hsb, x_bytes = self._dims(shard)
        vocab = padded_vocab(m.vocab, t)
        tokens = b * s_loc
        sharded, replicated, tied = self._head_params(vocab)
        gemms = [(tokens, vocab / t, h, 1)]  # the LM head, vocabulary-parallel
        if m.encoder:
            gemms.append((tokens, h / t, h, 1))  # MLM transform
        fwd_s, bwd_s = self._gemms_s(device, gemms)
        loss_fwd_s, loss_bwd_s = self._loss_s(tokens * vocab / t, device)
        fwd_s, bwd_s = fwd_s + loss_fwd_s, bwd_s + loss_bwd_s
        n_hidden = 4 if m.encoder else 2  # stored hidden-size tensors (norm / linear inputs)
        act = n_hidden * p * hsb / sp_div + 4.0 * s_loc * b * vocab / t  # fp32 logits, loss
        tp_fwd: list[Collective] = []
        tp_bwd: list[Collective] = []
        if t > 1:
            if sp:
                tp_fwd.append(Collective(CollectiveOp.ALL_GATHER, GroupKind.TP, x_bytes))
            tp_bwd.append(
                Collective(
                    CollectiveOp.REDUCE_SCATTER if sp else CollectiveOp.ALL_REDUCE,
                    GroupKind.TP,
                    x_bytes,
                )
            )
            # vocab-parallel cross entropy: max, sum of exponentials, target logit
            tp_fwd += [Collective(CollectiveOp.ALL_REDUCE, GroupKind.TP, 4.0 * s_loc * b)] * 3
        logits_flops = 2.0 * b * s * h * vocab + (2.0 * b * s * h * h if m.encoder else 0.0)
        return LayerCost(
            dense_params=sharded / t + replicated,
            tied_copy_params=tied / t,
            fwd_flops=logits_flops / (t * c),
            fwd_s=fwd_s,
            bwd_s=bwd_s,
            wgrad_s=self._wgrad_s(device, gemms),
            act_bytes={mode: act for mode in Recompute},
            transient_bytes=self._loss_transient_bytes_per_logit() * s_loc * b * vocab / t,
            fwd_collectives=tuple(tp_fwd),
            bwd_collectives=tuple(tp_bwd),
        )

    def _loss_s(self, logits: float, device: Device) -> tuple[float, float]:
        """Forward and backward seconds of the cross-entropy loss over ``logits`` logits on one
        device: memory-bound kernels, each streaming its operands through HBM once at the
        achieved bandwidth (roofline, as the block's elementwise work) plus the fixed
        per-kernel time (:data:`LOSS_STREAM`, :data:`UNFUSED_MEGATRON_LOSS_STREAM`)."""
        if self.fused_loss and not self.cross_entropy_loss_fusion:
            stream = UNFUSED_MEGATRON_LOSS_STREAM
        else:
            stream = LOSS_STREAM[self.fused_loss]
        (fwd_bytes, fwd_kernels), (bwd_bytes, bwd_kernels) = stream
        hbm = device.achieved_hbm_bw_bytes_per_s
        return (
            logits * fwd_bytes / hbm + fwd_kernels * device.kernel_overhead_s,
            logits * bwd_bytes / hbm + bwd_kernels * device.kernel_overhead_s,
        )

    def _loss_transient_bytes_per_logit(self) -> float:
        """Bytes per logit the loss holds at its peak beyond the 4 stored (the fp32 softmax or
        log-probabilities its backward reads):

        - fused (Megatron-Core ``VocabParallelCrossEntropy``: casts the bf16 logits to fp32,
          saves the softmax and computes the gradient in place): the bf16 logits beside their
          fp32 copy in the forward, the gradient's bf16 cast beside the fp32 one in the
          backward: 2;
        - unfused (torchtitan's ``F.cross_entropy(pred.float(), labels)``): the backward of
          ``nll_loss`` writes a dense fp32 gradient of the log-probabilities and
          ``log_softmax_backward_data`` an fp32 gradient of the logits beside it, both alive
          with the saved log-probabilities: 8 (12 in all)."""
        return 2.0 if self.fused_loss else 8.0

    def _mtp_cost(self, shard: Shard, device: Device) -> LayerCost:
        """One multi-token-prediction module on the last stage (DeepSeek-V3 §2.2): its two
        input norms and the ``2h -> h`` projection (column-parallel), a block of the last
        block's kind, and the output head and loss again (the head's terms without its
        parameters, which are shared)."""
        t, c, _, sp_div, p, b, s, h, s_loc, hsb, _ = self._dims(shard)
        proj_gemms = [(b * s_loc, h / t, 2 * h, 1)]
        fwd_s, bwd_s = self._gemms_s(device, proj_gemms)
        # two norms and the concat
        ew_s = 3 * 2 * p * hsb / sp_div / device.achieved_hbm_bw_bytes_per_s
        proj = LayerCost(
            dense_params=2 * h * h / t + 2 * self._norm_params(),
            fwd_flops=2.0 * b * s * 2 * h * h / (t * c),
            fwd_s=fwd_s + ew_s,
            bwd_s=bwd_s + 2 * ew_s,
            wgrad_s=self._wgrad_s(device, proj_gemms),
            act_bytes={mode: 3 * p * hsb / sp_div for mode in Recompute},
        )
        head = self._head_cost(
            LayerRef(index=-1, kind=LayerKind.HEAD, name="mtp head"), shard, device
        )
        head = replace(head, dense_params=0.0, tied_copy_params=0.0)
        block = self.layer_cost(self.mtp_ref, shard, device)  # the last block's, cached
        return combine(combine(proj, block), head)

    def _block_activations(self, ref: LayerRef, shard: Shard) -> dict:
        """Stored bytes per recompute mode (Korthikanti et al. §4; the inventory of
        :func:`nest.core.blocks.block_tensors`)."""
        m = self.spec
        t, _, _, sp_div, p, b, s, h, s_loc, hsb, _ = self._dims(shard)
        tokens = s_loc * b
        fp8 = self.precision.fp8
        split = {OUTSIDE: sp_div, INSIDE: t, REP: 1}

        def stored(mlp_recomputed: bool, up_recomputed: bool = False, whole=False) -> float:
            out = 0.0
            inventory = block_tensors(
                m,
                ref.moe,
                mlp_recomputed=mlp_recomputed,
                up_recomputed=up_recomputed,
                mlp_whole=whole,
            )
            for elems, where, fp8_input in inventory:
                out += elems * tokens * (1 if fp8 and fp8_input else p) / split[where]
            if m.dropout:
                out += 2 * hsb / sp_div  # the two dropout masks, one byte per element
            if ref.moe and not whole:
                out += 4.0 * tokens * m.num_experts / sp_div  # fp32 router logits
            return out

        kept, kept_mlp = stored(False), stored(True)
        dots = sum(e * tokens * p / split[where] for e, where, _ in dots_inventory(m, ref.moe))
        if ref.moe:
            dots += 4.0 * tokens * m.num_experts / sp_div  # the router's logits (a weight matmul)

        def named(out_proj: bool, qkv: bool = True) -> float:
            inventory = named_inventory(m, out_proj, qkv)
            return sum(e * tokens * p / split[where] for e, where, _ in inventory)

        # Attention core: the softmax output (+ dropout mask and output) of every query against
        # every key (the full s x s matrix, masked) unfused; FlashAttention stores only the fp32
        # log-sum-exp per query and head and recomputes the scores in its backward (Dao et al.
        # 2022): its recompute is charged under every mode.
        core = (p + (1 + p if m.dropout else 0)) * m.heads * tokens * s
        if self.flash_attention:
            core = 4.0 * m.heads * tokens
        return {
            Recompute.NONE: kept + core / t,
            Recompute.SELECTIVE: kept,
            Recompute.MLP: kept_mlp + core / t,
            Recompute.SELECTIVE_MLP: kept_mlp,
            Recompute.OP: self._op_sac_activations(ref, shard),
            Recompute.FULL: p * hsb / sp_div,
            Recompute.DOTS: dots,
            Recompute.MLA_UP: stored(False, up_recomputed=True) + core / t,
            Recompute.MLP_MOE: stored(False, whole=True) + core / t,
            Recompute.MLA_UP_MLP_MOE: stored(False, up_recomputed=True, whole=True) + core / t,
            Recompute.QKV_PROJ: named(False),
            Recompute.QKV_OUT_PROJ: named(True),
            Recompute.NOTHING_SAVEABLE: named(False, qkv=False),
        }

    def _op_sac_activations(self, ref: LayerRef, shard: Shard) -> float:
        """Stored bytes of a block under op-level selective checkpointing
        (:func:`nest.core.blocks.op_sac_inventory`, torchtitan's policy): its inventory, and
        the saved outputs of the kernels and collectives it leaves to the caller:

        - FlashAttention's fp32 log-sum-exp per query and head (the SDPA op's second output;
          Dao et al. 2022). Without FlashAttention (not a torchtitan setting: its attention is
          always an SDPA or FlexAttention kernel, whose outputs the policy saves) the attention
          core is assumed recomputed, as ``selective`` does it, and its output kept;
        - with sequence parallelism, the two reduce-scatters' outputs (``reduce_scatter_tensor``
          is in ``_save_list``), one hidden row per local token each;
        - a MoE block's router top-k (``aten.topk`` is saved by torchtitan's ``SelectiveAC``:
          fp32 scores and int64 expert indices per choice) and, under expert parallelism, the
          dispatch and combine all-to-alls' outputs (``all_to_all_single`` is saved), the
          copies this rank receives and sends back (:meth:`_block_collectives`' volume).

        Dropout masks are not kept (recomputed from the saved RNG state)."""
        m = self.spec
        t, _, sp, sp_div, p, b, _, h, s_loc, _, _ = self._dims(shard)
        tokens = s_loc * b
        split = {OUTSIDE: sp_div, INSIDE: t, REP: 1}
        tensors, _ = op_sac_inventory(m, ref.moe)
        out = sum(elems * tokens * p / split[where] for elems, where, _ in tensors)
        if self.flash_attention:
            out += 4.0 * m.heads * tokens / t
        if sp:
            out += 2 * p * tokens * h / sp_div
        if ref.moe:
            out += (4.0 + 8.0) * m.top_k * tokens / sp_div
            if shard.ep > 1:
                a2a = p * tokens / sp_div * m.top_k * h * self.moe_load_factor(ref, shard)
                out += 2 * a2a
        return out

    def moe_load_factor(self, ref: LayerRef, shard: Shard) -> float:
        """Tokens the most loaded expert-parallel rank of a MoE block receives over the balanced
        share: :func:`dropless_load_factor` of ``ep`` and the ``num_experts / ep`` local experts
        under ``dropless`` routing with ``ep > 1``; 1 when
        routing is ``balanced``, for dense blocks, and with ``ep = 1`` (every rank holds every
        expert and processes all of its own tokens, however the router spreads them)."""
        if not ref.moe or shard.ep == 1 or self.moe_routing == "balanced":
            return 1.0
        return dropless_load_factor(shard.ep, self.spec.num_experts // shard.ep)

    def _moe_kernels_s(self, ref: LayerRef, shard: Shard, device: Device) -> tuple[float, float]:
        """Forward and backward seconds of a MoE block's router and token permutations on one
        device, beyond its expert GEMMs (Megatron-Core ``moe/router.py``, ``moe/moe_utils.py``,
        ``moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``):

        - the router GEMM ``[T x h] @ [h x E]`` on the device's ``T = b s / (c t_sp)`` tokens
          (left out of the FLOP count, as Megatron-LM leaves it) and its softmax and top-k,
          memory-bound over ``T x E`` fp32 logits (:data:`ROUTER_BYTES_PER_LOGIT`);
        - ``permute`` before the dispatch reads the ``T`` tokens once and writes their ``top_k``
          copies, ``unpermute`` after the combine reads the copies and writes the weighted sums
          (the fused kernels of ``--moe-permute-fusion``, Transformer Engine ``moe_permute``):
          ``(1 + top_k) T h p`` bytes each;
        - with ``ep > 1`` and several local experts, ``sort_chunks_by_idxs`` after the dispatch and
          before the combine regroups the received copies by local expert: ``2 R h p`` bytes each,
          ``R`` = the copies this rank's experts receive (:meth:`_block_gemms`'s per-expert tokens
          times the local experts, times :meth:`moe_load_factor`).

        Every kernel is memory-bound at the device's HBM bandwidth (roofline) plus its launch
        overhead; the backward runs the reverse permutations and the router's gradient, the same
        bytes, and the router GEMM's two gradient GEMMs."""
        m = self.spec
        t, _, _, sp_div, p, b, _, h, s_loc, _, _ = self._dims(shard)
        tokens = b * s_loc / sp_div
        local = m.num_experts // shard.ep
        router_f, router_b = self._gemms_s(device, [(tokens, m.num_experts, h, 1)])
        moved = ROUTER_BYTES_PER_LOGIT * tokens * m.num_experts
        moved += 2 * (1 + m.top_k) * tokens * h * p  # permute, unpermute
        kernels = 4  # softmax, top-k, permute, unpermute
        if shard.ep > 1 and local > 1:
            per_expert = self._block_gemms(ref, shard)[EXPERT_FC1][0]
            received = per_expert * local * self.moe_load_factor(ref, shard)
            moved += 2 * (2 * received * h * p)
            kernels += 2
        stream_s = moved / device.achieved_hbm_bw_bytes_per_s + kernels * device.kernel_overhead_s
        return router_f + stream_s, router_b + stream_s

    def _mla_up_recompute(self, device: Device, gemms: dict, fwd_of: dict) -> tuple[float, float]:
        """(seconds, matmul FLOPs) of ``mla_up_proj``'s recompute: MLA's up-projection GEMMs
        (``q_up``, ``kv_up``) forward again with their FP8 casts (0 for a block without them);
        RoPE's elementwise work is left out, as for the other modes."""
        up = {n: g for n, g in gemms.items() if n in ("q_up", "kv_up")}
        if not up:
            return 0.0, 0.0
        seconds = sum(fwd_of[n][0] for n in up) + self._cast_s(up, device)[0]
        return seconds, sum(2.0 * mm * n * k * g for mm, n, k, g in up.values())

    def _mlp_recompute(
        self, ref: LayerRef, shard: Shard, device: Device, gemms: dict, fwd_of: dict
    ) -> tuple[float, float]:
        """(seconds, matmul FLOPs) of recomputing the MLP as :func:`block_tensors` with
        ``mlp_recomputed`` stores it: a dense MLP's forward again (FC1 and FC2, their FP8
        casts, the activation function); a MoE block's routed experts' activation function
        only (``moe_act``: memory-bound, no GEMM). The activation function streams its
        inputs and outputs once (roofline, as :func:`elementwise_bytes_per_token`)."""
        m = self.spec
        t, _, _, _, p, b, _, _, s_loc, _, _ = self._dims(shard)
        act = 3 if m.activation == "swiglu" else 2  # read gate and up, write / read, write
        width = m.top_k * m.expert_ffn if ref.moe else m.ffn_hidden
        seconds = p * width * act * b * s_loc / t / device.achieved_hbm_bw_bytes_per_s
        if ref.moe:
            return seconds, 0.0
        mlp = {name: g for name, g in gemms.items() if name in ("fc1", "fc2")}
        seconds += sum(fwd_of[name][0] for name in mlp) + self._cast_s(mlp, device)[0]
        flops = sum(2.0 * mm * n * k * g for mm, n, k, g in mlp.values())
        return seconds, flops

    def _whole_mlp_recompute(
        self,
        ref: LayerRef,
        shard: Shard,
        device: Device,
        gemms: dict,
        fwd_of: dict,
        moe_fwd_s: float,
    ) -> tuple[float, float]:
        """(seconds, matmul FLOPs) of recomputing the whole MLP as :func:`block_tensors` with
        ``mlp_whole`` stores it (Megatron-Core's ``mlp`` and ``moe`` modules): a dense MLP's
        forward again (:meth:`_mlp_recompute`'s); a MoE layer's whole forward: the routed
        experts' GEMMs (the most loaded rank's, as the forward times them) and activation, the
        shared experts' GEMMs and activation, their FP8 casts, and the router and permutations
        (``moe_fwd_s``, :meth:`_moe_kernels_s`'s forward). The dispatch and combine are the
        caller's collectives."""
        seconds, flops = self._mlp_recompute(ref, shard, device, gemms, fwd_of)
        if not ref.moe:
            return seconds, flops
        m = self.spec
        t, _, _, _, p, b, _, _, s_loc, _, _ = self._dims(shard)
        mlp = {n: g for n, g in gemms.items() if n in EXPERT_LINEARS or n in SHARED_LINEARS}
        seconds += sum(fwd_of[n][0] for n in mlp) + self._cast_s(mlp, device)[0] + moe_fwd_s
        if m.shared_ffn:  # the shared experts' activation function, as _mlp_recompute streams it
            act = 3 if m.activation == "swiglu" else 2
            seconds += p * m.shared_ffn * act * b * s_loc / t / device.achieved_hbm_bw_bytes_per_s
        return seconds, sum(2.0 * mm * n * k * g for mm, n, k, g in mlp.values())

    def _named_modes(
        self,
        ref: LayerRef,
        shard: Shard,
        device: Device,
        gemms,
        fwd_of,
        fwd_coll,
        rest_s: float,
        rest_flops: float,
    ) -> dict:
        """``qkv_proj``'s, ``qkv_out_proj``'s and ``nothing_saveable``'s (seconds, FLOPs,
        collectives) recomputed: ``rest_s`` and ``rest_flops``, the attention core's kernel and
        the elementwise work (as ``dots`` reruns them, with FlashAttention's recompute of the
        scores in its backward), and :meth:`_named_recompute`'s GEMMs and collectives."""
        out = {}
        for mode, keep_out, keep_qkv in (
            (Recompute.QKV_PROJ, False, True),
            (Recompute.QKV_OUT_PROJ, True, True),
            (Recompute.NOTHING_SAVEABLE, False, False),
        ):
            s, f, coll = self._named_recompute(
                ref, shard, device, gemms, fwd_of, fwd_coll, keep_out, keep_qkv
            )
            out[mode] = (rest_s + s, rest_flops + f, coll)
        return out

    def _named_recompute(
        self,
        ref: LayerRef,
        shard: Shard,
        device: Device,
        gemms: dict,
        fwd_of: dict,
        fwd_coll: tuple,
        out_proj: bool,
        qkv: bool = True,
    ) -> tuple[float, float, tuple]:
        """(seconds, matmul FLOPs, collectives) of what a block under ``qkv_proj`` (``out_proj``
        False), ``qkv_out_proj`` or ``nothing_saveable`` (``qkv`` and ``out_proj`` False) runs
        again beyond the attention core and the elementwise work (the caller's): the GEMMs
        whose outputs the backward reads and :func:`nest.core.blocks.named_inventory` does not
        keep, with their FP8 casts. The output projection (not under ``qkv_out_proj``: its
        output rebuilds the residual stream the MLP's norm reads) and a dense MLP's FC1 (the
        activation's input); FC2's output feeds a residual addition only and is not rerun. Q,
        K, V's projections (and MLA's down- and up-projections) under ``nothing_saveable``
        only: the attention core and the latent norms read their outputs. A MoE layer's router,
        permutations and routed experts' GEMMs (the combine weighs their outputs by the
        router's probabilities, whose gradient reads them) and the shared experts' FC1 (their
        FC2 feeds the residual sum only). The collectives: with sequence parallelism the
        all-gather before the attention (``nothing_saveable`` only), the forward's
        tensor-parallel one after the output projection (not under ``qkv_out_proj``) and,
        with sequence parallelism, the all-gather before the MLP; a MoE layer's dispatch and
        combine. Not the context-parallel K/V gather: as under ``selective``, the backward's
        gather serves the rerun core. The tensor-parallel ones are found by their ``role``
        (:class:`Collective`)."""
        names = {"fc1", "sh_fc1"} | (EXPERT_LINEARS if ref.moe else set())
        if not out_proj:
            names.add("proj")
        if not qkv:
            names |= {"qkv", "q", "q_down", "q_up", "kv_down", "kv_up"}
        rerun = {n: g for n, g in gemms.items() if n in names}
        seconds = sum(fwd_of[n][0] for n in rerun) + self._cast_s(rerun, device)[0]
        if ref.moe:
            seconds += self._moe_kernels_s(ref, shard, device)[0]
        tp = {x.role: x for x in fwd_coll if x.axis is GroupKind.TP}
        wanted = ("mlp_in",) + (() if qkv else ("attn_in",)) + (() if out_proj else ("attn_out",))
        coll = [
            tp[role] for role in ("attn_in", "attn_out", "mlp_in") if role in wanted and role in tp
        ]
        coll += [x for x in fwd_coll if x.axis is GroupKind.EP]
        flops = sum(2.0 * mm * n * k * g for mm, n, k, g in rerun.values())
        return seconds, flops, tuple(coll)

    def _op_sac_recompute(
        self,
        ref: LayerRef,
        shard: Shard,
        device: Device,
        fwd_of: dict,
        gemms: dict,
        fwd_coll: tuple,
        rest_s: float,
    ) -> tuple[float, float, tuple]:
        """(seconds, matmul FLOPs, collectives) of the GEMMs and collectives op-level selective
        checkpointing runs again (:func:`nest.core.blocks.op_sac_inventory`): every second mm
        of the block, each a ``[tokens x k] @ [k x n]`` split as :meth:`_block_gemms` splits
        its fused linear; a MoE block's routed experts' GEMMs (``torch._grouped_mm`` is not in
        the save list; as :meth:`_block_cost` times them, the most loaded rank's); of the
        forward collectives ``fwd_coll``, the tensor-parallel all-gathers (or all-reduces),
        which are not in the save list (the reduce-scatters', the context-parallel attention
        kernel's and the all-to-alls' outputs are); and ``rest_s``, the rest of the forward,
        which reruns whole (elementwise work, FP8 casts, the router and permutations). Without
        FlashAttention no attention kernel's output is saved: the core's GEMMs
        (:meth:`_attention_s`) run again too."""
        t, _, _, sp_div, _, b, _, _, s_loc, _, _ = self._dims(shard)
        tokens = b * s_loc
        fp8 = self.precision.fp8
        pieces = []
        for lin in op_sac_inventory(self.spec, ref.moe)[1]:
            if lin.split == COL:
                pieces.append((tokens, lin.n / t, lin.k, 1))
            elif lin.split == ROW:
                pieces.append((tokens, lin.n, lin.k / t, 1))
            else:  # MLA's down-projections, on the local tokens under SP
                pieces.append((tokens / sp_div, lin.n, lin.k, 1))
        seconds = rest_s + sum(self._gemms_s(device, [g], fp8)[0] for g in pieces)
        flops = sum(2.0 * mm * n * k * g for mm, n, k, g in pieces)
        if not self.flash_attention:
            attn_s, core_flops, _, _ = self._attention_s(ref, shard, device)
            seconds, flops = seconds + attn_s, flops + core_flops
        for name in EXPERT_LINEARS & fwd_of.keys():
            seconds += fwd_of[name][0]
            mm, n, k, g = gemms[name]
            flops += 2.0 * mm * n * k * g
        rerun = (CollectiveOp.ALL_GATHER, CollectiveOp.ALL_REDUCE)
        coll = tuple(x for x in fwd_coll if x.axis is GroupKind.TP and x.op in rerun)
        return seconds, flops, coll

    def _block_gemms(self, ref: LayerRef, shard: Shard) -> dict[str, tuple]:
        """The block's GEMMs on one device, ``name -> (m, n, k, groups)``: ``m`` tokens of the
        device's sequence chunk (all of them after sequence parallelism's all-gather), weights
        split over ``t`` as :mod:`nest.core.blocks` says. A MoE block's experts: ``E / ep``
        local experts, each receiving ``tokens x top_k x ep / E`` tokens when the router
        balances them (as the published Megatron MoE benchmarks force), times the capacity
        factor when one pads them (GShard, Lepikhin et al. 2021, §2.2). The router's GEMM is
        left out, as its FLOPs are."""
        m = self.spec
        t, _, _, sp_div, _, b, _, _, s_loc, _, _ = self._dims(shard)
        tokens = b * s_loc
        local = m.num_experts // shard.ep
        e = shard.expert_tp
        # experts split over e < t (MoE parallel folding) take the t / e sequence-parallel shards
        # of the tokens instead of their all-gather
        moe_tokens = tokens * e / t
        per_expert = moe_tokens * m.top_k * shard.ep / m.num_experts * (m.capacity_factor or 1.0)
        gemms = {}
        for lin in attention_linears(m) + mlp_linears(m, ref.moe):
            if lin.split == COL:
                gemms[lin.name] = (tokens, lin.n / t, lin.k, 1)
            elif lin.split == ROW:
                gemms[lin.name] = (tokens, lin.n, lin.k / t, 1)
            elif lin.split == ECOL:
                gemms[lin.name] = (per_expert, lin.n / e, lin.k, local)
            elif lin.split == EROW:
                gemms[lin.name] = (per_expert, lin.n, lin.k / e, local)
            elif lin.name != "router":  # MLA's down-projections, on the local tokens under SP
                gemms[lin.name] = (tokens / sp_div, lin.n, lin.k, 1)
        return gemms

    def _cast_s(self, gemms: dict[str, tuple], device: Device) -> tuple[float, float]:
        """Forward and backward seconds of the FP8 casts of a block's GEMMs
        (:mod:`nest.core.precision`): the inputs no norm produced, forward; every output
        gradient, backward; memory-bound."""
        per_elem = self.precision.cast_bytes_per_element(device.fp8_any_layout)
        if not per_elem:
            return 0.0, 0.0
        fwd = sum(mm * k * g for name, (mm, _, k, g) in gemms.items() if name not in NORM_FED)
        bwd = sum(mm * n * g for mm, n, _, g in gemms.values())
        return (
            per_elem * fwd / device.achieved_hbm_bw_bytes_per_s,
            per_elem * bwd / device.achieved_hbm_bw_bytes_per_s,
        )

    def _attention_s(
        self, ref: LayerRef, shard: Shard, device: Device
    ) -> tuple[float, float, float, float]:
        """(forward seconds of the attention core, its counted FLOPs on this device, seconds
        of its unfused memory-bound work in the forward and in the backward: the softmax's and
        its dropout's, :func:`unfused_core_bytes_per_score`; 0 with FlashAttention, whose kernel
        time holds its softmax). Its backward: :meth:`_attention_bwd_s`."""
        m = self.spec
        t, _, _, _, p, b, s, _, s_loc, _, _ = self._dims(shard)
        core, core_flops, key_length = self._fused_attention_work(ref, shard)
        if self.flash_attention:
            attn_s = attention_time_s(
                device,
                core_flops,
                key_length,
                causal=not m.encoder,
                done_fraction=core.done_fraction,
            )
            return attn_s, core_flops, 0.0, 0.0
        # unfused: the scores Q K^T and their product with V, batched over heads, on the full
        # (masked) matrix
        heads = b * m.heads / t
        attn_s = gemm_time_s(device, s_loc, s, core.qk, heads, p) + gemm_time_s(
            device, s_loc, core.v, s, heads, p
        )
        core_elems = m.heads * s_loc * s * b
        fwd_bytes, bwd_bytes = unfused_core_bytes_per_score(p, m.dropout, self._softmax_read(ref))
        hbm = device.achieved_hbm_bw_bytes_per_s
        return (
            attn_s,
            core_flops,
            fwd_bytes * core_elems / t / hbm,
            bwd_bytes * core_elems / t / hbm,
        )

    def _attention_bwd_s(self, ref: LayerRef, shard: Shard, device: Device, fwd_s: float) -> float:
        """Backward seconds of the attention core beyond FlashAttention's recomputation of the
        scores (which every recompute mode carries: half the forward's seconds, ``none_s`` in
        :meth:`_block_cost`): the fused kernel's published backward
        (:func:`nest.core.kernels.attention_bwd_time_s`) less that half; twice the forward
        (the two gradient products of each of its two) when unfused."""
        if not self.flash_attention:
            return 2.0 * fwd_s
        core, core_flops, key_length = self._fused_attention_work(ref, shard)
        whole_s = attention_bwd_time_s(
            device,
            core_flops,
            key_length,
            causal=not self.spec.encoder,
            done_fraction=core.done_fraction,
        )
        return whole_s - SCORE_RECOMPUTE_PER_FWD * fwd_s

    def _fused_attention_work(self, ref: LayerRef, shard: Shard) -> tuple:
        """(the block's attention core, its counted forward FLOPs on one device, the key length
        its fused kernel runs on): a context-parallel ring runs the kernel in blocks of
        ``s / c`` keys."""
        t, c, _, _, _, b, s, *_ = self._dims(shard)
        core = attention_core(self.spec, ref.local)
        return core, b * s * core.flops_per_token() / (t * c), min(core.keys, s / c)

    def _softmax_read(self, ref: LayerRef) -> float:
        """The share of each score row the unfused softmax loads: one half for global causal
        attention (Megatron's upper-triangular kernel), the whole row otherwise (its
        ``scaled_masked_softmax`` for an encoder or a windowed block;
        :func:`unfused_core_bytes_per_score`)."""
        return 0.5 if not (self.spec.encoder or ref.local) else 1.0

    def _elementwise_s(self, ref: LayerRef, shard: Shard, device: Device) -> float:
        """Seconds of a block's memory-bound elementwise work outside the attention core
        (norms, residual adds, activation function, dropout, RoPE): it streams its inputs and
        outputs through HBM once at the achieved bandwidth (roofline model, Williams et al.,
        CACM 2009); the operator list is Korthikanti et al.'s §4.1; each of its kernels pays the
        fixed per-kernel time."""
        m = self.spec
        t, _, _, sp_div, p, b, _, _, s_loc, hsb, _ = self._dims(shard)
        ew = elementwise_bytes_per_token(m, ref.moe, p)
        ew_bytes = s_loc * b * (ew[OUTSIDE] / sp_div + ew[INSIDE] / t + ew[REP])
        if m.dropout:
            ew_bytes += 2 * (2 * p + 1) * hsb / sp_div
        launch_s = elementwise_kernels(m) * device.kernel_overhead_s
        return ew_bytes / device.achieved_hbm_bw_bytes_per_s + launch_s

    def _block_cost(self, ref: LayerRef, shard: Shard, device: Device) -> LayerCost:
        m = self.spec
        t, c, sp, sp_div, p, b, s, h, s_loc, hsb, x_bytes = self._dims(shard)
        vocab = padded_vocab(m.vocab, t)
        flops = self._fwd_flops(ref, b * s, vocab) / (t * c)
        sharded, replicated, exp_sharded, exp_replicated = self._block_params(ref.moe)
        ep = shard.ep if ref.moe else 1
        fp8 = self.precision.fp8
        gemms = self._block_gemms(ref, shard)
        load = self.moe_load_factor(ref, shard)
        fwd_of = self._gemm_s_by_name(device, gemms, load)
        gemm_fwd = sum(f for f, _ in fwd_of.values())
        gemm_bwd = sum(b_ for _, b_ in fwd_of.values())
        cast_fwd, cast_bwd = self._cast_s(gemms, device)
        attn_s, core_flops, core_ew_s, core_ew_bwd_s = self._attention_s(ref, shard, device)
        block_ew_s = self._elementwise_s(ref, shard, device)
        ew_s = block_ew_s + core_ew_s
        moe_fwd, moe_bwd = self._moe_kernels_s(ref, shard, device) if ref.moe else (0.0, 0.0)
        fwd_s = gemm_fwd + cast_fwd + attn_s + ew_s + moe_fwd
        # the unfused core's softmax and dropout backward move their own bytes, not 2x the forward's
        bwd_s = gemm_bwd + cast_bwd + 2.0 * block_ew_s + core_ew_bwd_s + moe_bwd
        bwd_s += self._attention_bwd_s(ref, shard, device, attn_s)
        core_s = attn_s + core_ew_s
        # FlashAttention's backward recomputes S = QK^T (half the forward) in every mode
        none_s = SCORE_RECOMPUTE_PER_FWD * core_s if self.flash_attention else 0.0
        none_flops = SCORE_RECOMPUTE_PER_FWD * core_flops if self.flash_attention else 0.0
        fwd_coll, bwd_coll, mlp_coll, whole_coll = self._block_collectives(
            ref, shard, device, fwd_of, attn_s
        )
        mlp_s, mlp_flops = self._mlp_recompute(ref, shard, device, gemms, fwd_of)
        whole_s, whole_flops = self._whole_mlp_recompute(ref, shard, device, gemms, fwd_of, moe_fwd)
        up_s, up_flops = self._mla_up_recompute(device, gemms, fwd_of)
        op_s, op_flops, op_coll = self._op_sac_recompute(
            ref, shard, device, fwd_of, gemms, fwd_coll, cast_fwd + ew_s + moe_fwd
        )
        rerun = {  # mode -> (seconds, FLOPs, collectives) it reruns beyond FlashAttention's
            Recompute.NONE: (0.0, 0.0, ()),
            # the backward's K/V gather serves the recompute too
            Recompute.SELECTIVE: (core_s, core_flops, ()),
            # a dense MLP's tensor-parallel forward collectives
            Recompute.MLP: (mlp_s, mlp_flops, mlp_coll),
            Recompute.SELECTIVE_MLP: (core_s + mlp_s, core_flops + mlp_flops, mlp_coll),
            Recompute.OP: (op_s, op_flops, op_coll),
            Recompute.FULL: (fwd_s, flops, fwd_coll),
            # the attention core and the memory-bound work (norms, activation) run again; the
            # weight matmuls' outputs are kept (nest.core.blocks.dots_inventory); ew_s already
            # holds the core's elementwise part, so the core adds its kernel alone
            Recompute.DOTS: (attn_s + ew_s, core_flops, ()),
            Recompute.MLA_UP: (up_s, up_flops, ()),
            # the MLP's (a MoE layer's: its tensor-parallel ones and the dispatch and combine)
            Recompute.MLP_MOE: (whole_s, whole_flops, whole_coll),
            Recompute.MLA_UP_MLP_MOE: (up_s + whole_s, up_flops + whole_flops, whole_coll),
            **self._named_modes(  # JAX's named policies
                ref, shard, device, gemms, fwd_of, fwd_coll, attn_s + ew_s, core_flops
            ),
        }
        # and every mode pays FlashAttention's recompute of the scores (above) on top
        extra = {mode: (x + none_s, f + none_flops, co) for mode, (x, f, co) in rerun.items()}
        dense_params = sharded / t + replicated
        expert_params = (exp_sharded / shard.expert_tp + exp_replicated) / ep if ref.moe else 0.0
        cache = self.precision.weight_cache_bytes_per_param(device.fp8_any_layout)
        return LayerCost(
            dense_params=dense_params,
            expert_params=expert_params,
            fwd_flops=flops,
            fwd_s=fwd_s,
            bwd_s=bwd_s,
            wgrad_s=sum(  # the most loaded rank's expert GEMMs, as fwd_of's
                (load if name in EXPERT_LINEARS else 1.0) * self._wgrad_s(device, [g], fp8)
                for name, g in gemms.items()
            ),
            recompute_s={mode: e[0] for mode, e in extra.items()},
            recompute_flops={mode: e[1] for mode, e in extra.items()},
            act_bytes=self._block_activations(ref, shard),
            resident_bytes=cache * sum(n * k * g for _, n, k, g in gemms.values()),
            boundary_bytes=p * hsb / sp_div,
            fwd_collectives=fwd_coll,
            bwd_collectives=bwd_coll,
            recompute_collectives={mode: e[2] for mode, e in extra.items()},
        )

    def _gemm_s_by_name(
        self, device: Device, gemms: dict[str, tuple], load: float
    ) -> dict[str, tuple[float, float]]:
        """Forward and backward seconds of each of a block's GEMMs, the expert ones scaled to
        the most loaded rank's tokens (``load``: :meth:`moe_load_factor`)."""
        out = {name: self._gemms_s(device, [g], self.precision.fp8) for name, g in gemms.items()}
        for name in EXPERT_LINEARS & out.keys():
            out[name] = (load * out[name][0], load * out[name][1])
        return out

    def _block_collectives(
        self, ref: LayerRef, shard: Shard, device: Device, fwd_of: dict, attn_s: float
    ):
        """The block's forward and backward collectives, with the compute each may hide behind
        under :class:`Overlap` (``fwd_of``: forward and backward seconds per GEMM), and the
        forward collectives of a dense MLP, which recomputing it repeats."""
        m = self.spec
        t, c, sp, sp_div, p, b, s, _, s_loc, _, x_bytes = self._dims(shard)
        ov = self.overlap
        slow = COMM_SMS / (device.sm_count - COMM_SMS) if device.sm_count > COMM_SMS else 0.0

        def coll(
            op: CollectiveOp,
            axis: GroupKind,
            n_bytes: float,
            hidden_s: float = 0.0,
            least: float = 0.0,
            role: str = "",
        ):
            slowdown = slow if hidden_s > 0 else 0.0
            return Collective(op, axis, n_bytes, hidden_s, least, slowdown, role)

        def summed(names) -> tuple[float, float]:
            got = [fwd_of[n] for n in names if n in fwd_of]
            return sum(f for f, _ in got), sum(b_ for _, b_ in got)

        attn_in = summed(("qkv", "q", "q_down", "q_up", "kv_down", "kv_up"))
        mlp = (summed(("fc1", "sh_fc1")), summed(("fc2", "sh_fc2")))
        tp_fwd, tp_bwd = self._tp_collectives(ref, shard, coll, (attn_in, fwd_of["proj"]), mlp)
        cp_fwd: list[Collective] = []
        cp_bwd: list[Collective] = []
        if c > 1:
            core = attention_core(m, ref.local)
            # K and V of the whole sequence (MLA: the heads' up-projected keys and values, as
            # Megatron-Core's MLA exchanges them)
            kv_width = m.heads * (core.qk + core.v) if m.attention == "mla" else 2 * m.kv_dim
            kv_bytes = p * s * b * kv_width / t
            share = (c - 1) / c if ov.cp else 0.0
            cp_fwd.append(coll(CollectiveOp.ALL_GATHER, GroupKind.CP, kv_bytes, share * attn_s))
            half_bwd = self._attention_bwd_s(ref, shard, device, attn_s) / 2
            cp_bwd += [  # each under half the backward's attention
                coll(CollectiveOp.ALL_GATHER, GroupKind.CP, kv_bytes, share * half_bwd),
                coll(CollectiveOp.REDUCE_SCATTER, GroupKind.CP, kv_bytes, share * half_bwd),
            ]
        ep_fwd: list[Collective] = []
        ep_bwd: list[Collective] = []
        if ref.moe and shard.ep > 1:
            # tokens this device holds; the most loaded rank receives moe_load_factor times more
            a2a_bytes = p * (s_loc * b / sp_div) * m.top_k * m.hidden
            a2a_bytes *= self.moe_load_factor(ref, shard)
            attn_fwd = attn_in[0] + fwd_of["proj"][0] + attn_s
            attn_bwd = attn_in[1] + fwd_of["proj"][1]
            attn_bwd += self._attention_bwd_s(ref, shard, device, attn_s)
            hide_f = attn_fwd / 2 if ov.ep else 0.0
            hide_b = attn_bwd / 2 if ov.ep else 0.0
            # DeepEP sends a token once per remote domain (nest.core.alphabeta)
            op = deepep_op(m.top_k) if self.moe_dispatcher == "deepep" else CollectiveOp.ALL_TO_ALL
            ep_fwd = [coll(op, GroupKind.EP, a2a_bytes, hide_f)] * 2  # dispatch, combine
            ep_bwd = [coll(op, GroupKind.EP, a2a_bytes, hide_b)] * 2
        mlp_tp = [x for x in tp_fwd if x.role in ("mlp_in", "mlp_out")]
        mlp_fwd = () if ref.moe else tuple(mlp_tp)
        whole_fwd = tuple(mlp_tp + ep_fwd)
        return (
            tuple(tp_fwd + cp_fwd + ep_fwd),
            tuple(tp_bwd + cp_bwd + ep_bwd),
            mlp_fwd,
            whole_fwd,
        )

    def _tp_collectives(self, ref: LayerRef, shard: Shard, coll, attention, mlp):
        """The block's tensor-parallel collectives, forward and backward: with sequence
        parallelism an all-gather before and a reduce-scatter after the attention and the MLP
        (each ``(forward, backward)`` seconds of its first and its second GEMMs in ``attention``
        and ``mlp``, which ``--tp-comm-overlap`` hides them under); without it two all-reduces
        each way (Korthikanti et al. §4.2.2)."""
        m = self.spec
        t, _, sp, _, p, b, _, _, s_loc, _, x_bytes = self._dims(shard)
        ov = self.overlap
        tp_fwd: list[Collective] = []
        tp_bwd: list[Collective] = []
        if t > 1 and sp:
            last = 1.0 / TP_OVERLAP_SPLITS
            # MLA with sequence parallelism gathers its latents, not the hidden state: the
            # down-projections run on the local s / t tokens (Megatron-Core
            # multi_latent_attention.py), so the all-gather is of q_lora + kv_lora + rope wide
            # rows (plus the hidden state when the query is projected at full rank)
            attn_gather = x_bytes
            if m.attention == "mla":
                latent = (m.q_lora_rank or m.hidden) + m.kv_lora_rank + m.qk_rope_head_dim
                attn_gather = p * s_loc * b * latent
            pairs = [(*attention, True, attn_gather, "attn")]
            # a MoE block with whole experts (etp 1) all-gathers no tokens for them: each tensor
            # rank dispatches its own sequence shard; shared experts still split over tp
            if not ref.moe or shard.etp is None or m.shared_experts:
                pairs.append((*mlp, not ref.moe, x_bytes, "mlp"))
            for (f1, b1), (f2, b2), overlapped, gather, part in pairs:
                on = ov.tp and overlapped
                hide = (lambda seconds: seconds) if on else (lambda seconds: 0.0)
                # backward halves of each GEMM: data gradient first, then weight gradient
                tp_fwd += [
                    coll(
                        CollectiveOp.ALL_GATHER, GroupKind.TP, gather, hide(f1), role=f"{part}_in"
                    ),
                    coll(
                        CollectiveOp.REDUCE_SCATTER,
                        GroupKind.TP,
                        x_bytes,
                        hide(f2),
                        last if on else 0.0,
                        role=f"{part}_out",
                    ),
                ]
                tp_bwd += [
                    coll(CollectiveOp.ALL_GATHER, GroupKind.TP, x_bytes, hide(b2 / 2)),
                    coll(CollectiveOp.REDUCE_SCATTER, GroupKind.TP, gather, hide(b1 / 2)),
                ]
        elif t > 1:
            tp_fwd += [  # after the attention and after the MLP
                Collective(CollectiveOp.ALL_REDUCE, GroupKind.TP, x_bytes, role=role)
                for role in ("attn_out", "mlp_out")
            ]
            tp_bwd += [Collective(CollectiveOp.ALL_REDUCE, GroupKind.TP, x_bytes)] * 2
        return tp_fwd, tp_bwd
