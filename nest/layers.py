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
  backward pass takes twice the forward.
- Tied embeddings on separate stages: Megatron keeps a copy of the word embedding on the last
  stage; it is counted as ``tied_copy_params``.
- Pipeline boundary: each device sends its (sequence-parallel shard of the) output; without
  sequence parallelism every tensor rank sends the full ``s/c x b x h`` tensor (Megatron-Core).
- Vocabulary padding: Megatron pads ``V`` to a multiple of ``128 * t``
  (``--make-vocab-size-divisible-by 128``).
"""

from dataclasses import dataclass, field
from math import ceil

from nest.axes import LayerKind, Recompute
from nest.hardware import Device
from nest.model import LayerRef, ModelSpec, build_chain

VOCAB_PAD_MULTIPLE = 128  # Megatron-LM --make-vocab-size-divisible-by default


@dataclass(frozen=True, slots=True)
class Shard:
    """How one layer is split: degrees and the microbatch size."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    """Sequence parallelism (Korthikanti et al.); only matters when ``tp > 1``."""
    mbs: int = 1


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective a layer issues; ``n_bytes`` is its full buffer (see nest.cost.collectives)."""

    op: str
    """``all_reduce``, ``all_gather``, ``reduce_scatter`` or ``all_to_all``."""
    axis: str
    """Group it runs over: ``tp``, ``cp`` or ``ep``."""
    n_bytes: float


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
    recompute_s: dict = field(default_factory=dict)
    """Extra backward-pass seconds per recompute mode."""
    recompute_flops: dict = field(default_factory=dict)
    """Matmul FLOPs of that recomputation, per recompute mode."""
    act_bytes: dict = field(default_factory=dict)
    """Stored activation bytes per recompute mode."""
    transient_bytes: float = 0.0
    """Short-lived buffer at this layer's peak (e.g. bf16 logits), beyond stored activations."""
    boundary_bytes: float = 0.0
    """Bytes of the output activation each device sends to the next layer's devices."""
    fwd_collectives: tuple[Collective, ...] = ()
    bwd_collectives: tuple[Collective, ...] = ()
    recompute_collectives: dict = field(default_factory=dict)


def padded_vocab(vocab: int, tp: int) -> int:
    multiple = VOCAB_PAD_MULTIPLE * tp
    return ceil(vocab / multiple) * multiple


class AnalyticModel:
    """Per-layer costs of a :class:`ModelSpec` from published formulas.

    Costs are cached per (layer signature, shard, device) on the instance.
    """

    def __init__(self, spec: ModelSpec, *, flash_attention: bool = False) -> None:
        self.spec = spec
        self.flash_attention = flash_attention
        self.chain: tuple[LayerRef, ...] = build_chain(spec)
        self.notes: tuple[str, ...] = ()
        self._cache: dict = {}

    @property
    def name(self) -> str:
        return self.spec.name

    def cost_key(self, ref: LayerRef) -> tuple:
        """Layers with equal keys have equal costs under every shard (the analytic formulas
        depend on the layer's kind and whether it is MoE only)."""
        return ref.signature

    @property
    def seq_len(self) -> int:
        return self.spec.seq_len

    # ----------------------------------------------------------------- validity of a shard
    def shard_rules(self) -> list[str]:
        m = self.spec
        rules = [f"tp must divide heads={m.heads} and the FFN size"]
        if m.is_moe:
            rules.append(f"ep must divide num_experts={m.num_experts} and dp*cp")
        return rules

    def shard_problem(self, shard: Shard) -> str | None:
        """Why this model cannot be split this way (None if it can)."""
        m = self.spec
        if m.heads % shard.tp or m.num_kv_heads % shard.tp:
            return (
                f"tp={shard.tp} must divide heads={m.heads} and kv_heads={m.num_kv_heads} of "
                f"{m.name}"
            )
        if m.ffn_hidden % shard.tp:
            return f"tp={shard.tp} must divide ffn_hidden={m.ffn_hidden} of {m.name}"
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
        """Unique parameters of a layer (unsharded, unpadded vocabulary)."""
        m = self.spec
        if ref.kind is LayerKind.EMBEDDING:
            return self._embedding_params(m.vocab)[0] + self._embedding_params(m.vocab)[1]
        if ref.kind is LayerKind.HEAD:
            sharded, replicated, _ = self._head_params(m.vocab)
            return sharded + replicated
        sharded, replicated, expert_sharded, expert_replicated = self._block_params(ref.moe)
        return sharded + replicated + expert_sharded + expert_replicated

    def total_params(self) -> float:
        return sum(self.param_count(ref) for ref in self.chain)

    def model_flops_per_sample(self) -> float:
        """Model FLOPs of one sequence, forward + backward (3x forward), no recompute."""
        m = self.spec
        tokens = m.seq_len
        total = 0.0
        for ref in self.chain:
            total += self._fwd_flops(ref, tokens, m.vocab)
        return 3.0 * total

    # ----------------------------------------------------------------- parameters
    def _norm_params(self) -> int:
        return 2 * self.spec.hidden if self.spec.norm == "layernorm" else self.spec.hidden

    def _mlp_params(self) -> tuple[float, float]:
        """(tensor-sharded, replicated) parameters of one MLP."""
        m = self.spec
        mats = 3 if m.activation == "swiglu" else 2
        sharded = mats * m.hidden * m.ffn_hidden
        replicated = 0.0
        if m.bias:
            sharded += m.ffn_hidden * (mats - 1)  # column-parallel biases (fc1, and gate)
            replicated += m.hidden  # row-parallel output bias
        return sharded, replicated

    def _block_params(self, moe: bool) -> tuple[float, float, float, float]:
        """(dense sharded, dense replicated, expert sharded, expert replicated) of one block."""
        m = self.spec
        h, kvd = m.hidden, m.kv_dim
        sharded = h * (h + 2 * kvd) + h * h
        replicated = 2 * self._norm_params()
        if m.bias:
            sharded += h + 2 * kvd
            replicated += h
        mlp_sharded, mlp_replicated = self._mlp_params()
        if moe:
            replicated += h * m.num_experts  # router
            return sharded, replicated, m.num_experts * mlp_sharded, m.num_experts * mlp_replicated
        return sharded + mlp_sharded, replicated + mlp_replicated, 0.0, 0.0

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
        """(vocab-sharded, replicated, tied copy) parameters of the head."""
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
        return sharded + vocab * h, replicated, 0.0

    # ----------------------------------------------------------------- flops
    def _fwd_flops(self, ref: LayerRef, tokens: float, vocab: int) -> float:
        """Forward FLOPs of a layer for ``tokens`` tokens of sequences of length ``s``."""
        m = self.spec
        h, s = m.hidden, m.seq_len
        if ref.kind is LayerKind.EMBEDDING:
            return 0.0
        if ref.kind is LayerKind.HEAD:
            flops = 2.0 * tokens * h * vocab
            if m.encoder:
                flops += 2.0 * tokens * h * h  # MLM transform
            return flops
        attn = 2.0 * tokens * h * (h + 2 * m.kv_dim) + 2.0 * tokens * h * h + 4.0 * tokens * s * h
        mats = 3 if m.activation == "swiglu" else 2
        mlp = 2.0 * tokens * h * m.ffn_hidden * mats
        if ref.moe:
            mlp *= m.top_k
        return attn + mlp

    # ----------------------------------------------------------------- the cost
    def layer_cost(self, ref: LayerRef, shard: Shard, device: Device) -> LayerCost:
        key = (ref.signature, shard, device)
        cost = self._cache.get(key)
        if cost is None:
            cost = self._layer_cost(ref, shard, device)
            self._cache[key] = cost
        return cost

    def _layer_cost(self, ref: LayerRef, shard: Shard, device: Device) -> LayerCost:
        m = self.spec
        t, c = shard.tp, shard.cp
        sp = shard.sp and t > 1
        sp_div = t if sp else 1
        p = m.dtype_bytes
        b, s, h = shard.mbs, m.seq_len, m.hidden
        s_loc = s / c
        hsb = s_loc * b * h  # elements of one hidden activation on this device's sequence chunk
        vocab = padded_vocab(m.vocab, t)
        flops = self._fwd_flops(ref, b * s, vocab) / (t * c)
        fwd_s = flops / device.achieved_flops_per_s
        x_bytes = p * hsb  # the collective buffer of a hidden activation
        tp_fwd: list[Collective] = []
        tp_bwd: list[Collective] = []

        if ref.kind is LayerKind.EMBEDDING:
            sharded, replicated = self._embedding_params(vocab)
            act = ((hsb if m.dropout else 0.0) + (p * hsb if m.encoder else 0.0)) / sp_div
            ew = p * hsb + ((2 * p + 1) * hsb if m.dropout else 0.0)  # lookup write, dropout
            fwd_s = ew / sp_div / device.hbm_bw_bytes_per_s
            if t > 1:
                tp_fwd.append(Collective("reduce_scatter" if sp else "all_reduce", "tp", x_bytes))
                if sp:  # the backward of a reduce-scatter is an all-gather
                    tp_bwd.append(Collective("all_gather", "tp", x_bytes))
            return LayerCost(
                dense_params=sharded / t + replicated,
                fwd_flops=flops,
                fwd_s=fwd_s,
                bwd_s=2.0 * fwd_s,
                act_bytes={mode: act for mode in Recompute},
                boundary_bytes=p * hsb / sp_div,
                fwd_collectives=tuple(tp_fwd),
                bwd_collectives=tuple(tp_bwd),
            )

        if ref.kind is LayerKind.HEAD:
            sharded, replicated, tied = self._head_params(vocab)
            n_hidden = 4 if m.encoder else 2  # stored hidden-size tensors (norm / linear inputs)
            act = (
                n_hidden * p * hsb / sp_div + 4.0 * s_loc * b * vocab / t
            )  # fp32 logits for the loss
            if t > 1:
                if sp:
                    tp_fwd.append(Collective("all_gather", "tp", x_bytes))
                tp_bwd.append(Collective("reduce_scatter" if sp else "all_reduce", "tp", x_bytes))
                # vocab-parallel cross entropy: max, sum of exponentials, target logit
                tp_fwd += [Collective("all_reduce", "tp", 4.0 * s_loc * b)] * 3
            return LayerCost(
                dense_params=sharded / t + replicated,
                tied_copy_params=tied / t,
                fwd_flops=flops,
                fwd_s=fwd_s,
                bwd_s=2.0 * fwd_s,
                act_bytes={mode: act for mode in Recompute},
                transient_bytes=p * s_loc * b * vocab / t,  # bf16 logits before the fp32 cast
                fwd_collectives=tuple(tp_fwd),
                bwd_collectives=tuple(tp_bwd),
            )

        # ---- transformer block
        sharded, replicated, exp_sharded, exp_replicated = self._block_params(ref.moe)
        ep = shard.ep if ref.moe else 1
        mats = 3 if m.activation == "swiglu" else 2
        # Tensors outside the tensor-parallel region: norm inputs, QKV and MLP inputs, dropout
        # masks (Korthikanti §4.1); sharded over t only with sequence parallelism.
        outside = 4 * p * hsb + (2 * hsb if m.dropout else 0.0)
        # Inside the TP region: Q, K, V, the output projection input, the MLP's intermediates.
        inside = p * s_loc * b * (h + 2 * m.kv_dim) + p * hsb
        ffn_elems = s_loc * b * m.ffn_hidden * mats
        if ref.moe:
            inside += m.top_k * (p * hsb + p * ffn_elems)  # dispatched token copies, expert MLPs
            outside += 4.0 * s_loc * b * m.num_experts  # fp32 router logits
        else:
            inside += p * ffn_elems
        # Attention core: softmax output (+ dropout mask and output), a x s_loc x s per sequence.
        # FlashAttention stores only the fp32 log-sum-exp per query and head, and recomputes the
        # scores in its backward pass (Dao et al. 2022): it stores 4 a s b bytes and its backward
        # recompute is charged under every mode.
        core_elems = m.heads * s_loc * s * b
        core = (p + (1 + p if m.dropout else 0)) * core_elems
        if self.flash_attention:
            core = 4.0 * m.heads * s_loc * b
        act = {
            Recompute.NONE: outside / sp_div + inside / t + core / t,
            Recompute.SELECTIVE: outside / sp_div + inside / t,
            Recompute.FULL: p * hsb / sp_div,
        }
        if t > 1:
            pair = (
                [
                    Collective("all_gather", "tp", x_bytes),
                    Collective("reduce_scatter", "tp", x_bytes),
                ]
                if sp
                else [Collective("all_reduce", "tp", x_bytes)]
            )
            tp_fwd += pair * 2  # attention and MLP
            tp_bwd += pair * 2
        cp_fwd: list[Collective] = []
        cp_bwd: list[Collective] = []
        if c > 1:
            kv_bytes = p * s * b * 2 * m.kv_dim / t  # K and V of the whole sequence
            cp_fwd.append(Collective("all_gather", "cp", kv_bytes))
            cp_bwd += [
                Collective("all_gather", "cp", kv_bytes),
                Collective("reduce_scatter", "cp", kv_bytes),
            ]
        ep_coll: list[Collective] = []
        if ref.moe and ep > 1:
            a2a_bytes = p * (s_loc * b / sp_div) * m.top_k * h  # tokens this device holds
            ep_coll = [Collective("all_to_all", "ep", a2a_bytes)] * 2  # dispatch and combine
        fwd_coll = tuple(tp_fwd + cp_fwd + ep_coll)
        # Memory-bound elementwise work (norms, residual adds, activation function, dropout,
        # RoPE, softmax) streams its inputs and outputs through HBM once (roofline model,
        # Williams et al., CACM 2009); the operator list is Korthikanti et al.'s §4.1.
        ew_outside = 10 * p * hsb + (2 * (2 * p + 1) * hsb if m.dropout else 0.0)
        ew_inside = p * s_loc * b * m.ffn_hidden * (3 if m.activation == "swiglu" else 2)
        if ref.moe:
            ew_inside *= m.top_k
        if m.position == "rope":
            ew_inside += 2 * p * s_loc * b * (h + m.kv_dim)
        ew_core = (
            0.0
            if self.flash_attention
            else (2 * p + ((2 * p + 1) if m.dropout else 0)) * core_elems
        )
        hbm = device.hbm_bw_bytes_per_s
        fwd_s += (ew_outside / sp_div + ew_inside / t) / hbm + ew_core / t / hbm
        core_flops = 4.0 * b * s * s * h / (t * c)
        core_s = core_flops / device.achieved_flops_per_s + ew_core / t / hbm
        # FlashAttention's backward recomputes S = QK^T (half of the core's forward FLOPs), which
        # is why its backward costs 2.5x its forward rather than 2x (Dao 2023, FlashAttention-2).
        none_s = 0.5 * core_s if self.flash_attention else 0.0
        none_flops = 0.5 * core_flops if self.flash_attention else 0.0
        return LayerCost(
            dense_params=sharded / t + replicated,
            expert_params=(exp_sharded / t + exp_replicated) / ep if ref.moe else 0.0,
            fwd_flops=flops,
            fwd_s=fwd_s,
            bwd_s=2.0 * fwd_s,
            recompute_s={
                Recompute.NONE: none_s,
                Recompute.SELECTIVE: core_s,
                Recompute.FULL: fwd_s + none_s,
            },
            recompute_flops={
                Recompute.NONE: none_flops,
                Recompute.SELECTIVE: core_flops,
                Recompute.FULL: flops + none_flops,
            },
            act_bytes=act,
            boundary_bytes=p * hsb / sp_div,
            fwd_collectives=fwd_coll,
            bwd_collectives=tuple(tp_bwd + cp_bwd + ep_coll),
            recompute_collectives={
                Recompute.NONE: (),
                Recompute.SELECTIVE: (),  # the backward's K/V gather serves the recompute too
                Recompute.FULL: fwd_coll,
            },
        )
