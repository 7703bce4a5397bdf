"""The shape of one transformer block: its linear layers and the tensors it keeps.

A block kind (:class:`nest.core.model.ModelSpec`, a block's MoE-ness and attention span) is
written down once here as data, and every per-layer formula of :mod:`nest.core.layers`
(parameters, FLOPs, GEMM times, stored activations, FP8 casts) is a sum over these lists, so a
new attention or MLP kind adds rows, not formulas.

**Linear layers** (:func:`attention_linears`, :func:`mlp_linears`): ``(name, k, n, split)``, a
``k -> n`` weight; ``split`` says how tensor parallelism cuts it (Megatron-Core):

- ``col``: column-parallel, the output split over ``t`` (QKV, MLA's up-projections, FC1);
- ``row``: row-parallel, the input split over ``t`` (attention output, FC2);
- ``rep``: replicated on every tensor rank (MLA's down-projections, Megatron-Core's
  "duplicated" linears, which run on the sequence-parallel shard of the tokens; the router);
- ``ecol``/``erow``: a routed expert's FC1/FC2, one per expert, experts split over ``ep`` and each
  expert's weight over ``t`` as ``col``/``row``.

Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2", arXiv 2405.04434, §2.1.2-2.1.3, eq.
(9)-(19)): the query is projected down to ``q_lora_rank`` and up to ``heads x (nope + rope)``;
the keys and values share a down-projection to ``kv_lora_rank`` (plus one decoupled rotary key
of ``rope`` width shared by the heads), projected up to ``heads x (nope + v)``; the output
projection takes ``heads x v``. Grouped-query attention (Ainslie et al. 2023): Q is ``a d``
wide, K and V ``g d`` each, with ``d`` the head dimension.

**Stored tensors** (:func:`block_tensors`): per token, ``(elements, where, fp8_input)``, the
inventory of Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
MLSys 2023, §4.1 (norm inputs, the attention and MLP inputs, Q/K/V, the attention output, the
MLP's intermediates), generalised to the widths above. ``where``: ``outside`` the tensor-parallel
region (split over ``t`` only with sequence parallelism), ``inside`` it (split over ``t``), or
``rep`` (replicated on every tensor rank: MLA's gathered latents; Megatron-Core runs MLA's
down-projections on the sequence-parallel shard and all-gathers their outputs).
``fp8_input``: the tensor is the input of an FP8 GEMM and is saved in FP8 under
``precision=fp8`` (:mod:`nest.core.precision`).
"""

import dataclasses
from dataclasses import dataclass

from nest.core.model import ModelSpec

COL, ROW, REP, ECOL, EROW = "col", "row", "rep", "ecol", "erow"

NORM_FED = frozenset({"qkv", "q", "q_down", "kv_down", "q_up", "kv_up", "fc1", "sh_fc1"})
"""Linears whose input a normalisation produces: Transformer Engine fuses their FP8 cast into
the norm (``LayerNormLinear``), so no separate cast kernel runs."""


@dataclass(frozen=True, slots=True)
class Linear:
    name: str
    k: int
    """Input width."""
    n: int
    """Output width."""
    split: str
    """How tensor parallelism cuts it (module docstring)."""

    @property
    def params(self) -> int:
        return self.k * self.n

    @property
    def fp8(self) -> bool:
        """Runs in FP8 under ``precision=fp8`` (every block linear but the router)."""
        return self.name != "router"


def gate_factor(spec: ModelSpec) -> int:
    """FC1 outputs per FFN unit: 2 for a gated MLP (SwiGLU, GeGLU: gate and up), else 1."""
    return 2 if spec.activation == "swiglu" else 1


def attention_linears(spec: ModelSpec) -> tuple[Linear, ...]:
    """The attention's linear layers (module docstring)."""
    h, a = spec.hidden, spec.heads
    if spec.attention == "mla":
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        rq, rkv = spec.q_lora_rank, spec.kv_lora_rank
        query = (
            (Linear("q_down", h, rq, REP), Linear("q_up", rq, a * qk, COL))
            if rq
            else (Linear("q", h, a * qk, COL),)
        )
        return (
            *query,
            Linear("kv_down", h, rkv + spec.qk_rope_head_dim, REP),
            Linear("kv_up", rkv, a * (spec.qk_nope_head_dim + spec.v_head_dim), COL),
            Linear("proj", a * spec.v_head_dim, h, ROW),
        )
    d = spec.d_head
    return (
        Linear("qkv", h, a * d + 2 * spec.kv_dim, COL),
        Linear("proj", a * d, h, ROW),
    )


def mlp_linears(spec: ModelSpec, moe: bool) -> tuple[Linear, ...]:
    """The MLP's linear layers: a dense FFN, or one routed expert (``ecol``/``erow``), the
    shared experts (as one FFN of their summed width) and the router."""
    h, gate = spec.hidden, gate_factor(spec)
    if not moe:
        f = spec.ffn_hidden
        return (Linear("fc1", h, gate * f, COL), Linear("fc2", f, h, ROW))
    fe, fs = spec.expert_ffn, spec.shared_ffn
    out = [Linear("efc1", h, gate * fe, ECOL), Linear("efc2", fe, h, EROW)]
    if fs:
        out += [Linear("sh_fc1", h, gate * fs, COL), Linear("sh_fc2", fs, h, ROW)]
    out.append(Linear("router", h, spec.num_experts, REP))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Core:
    """The attention core of one block: ``heads`` heads of query/key width ``qk`` and value
    width ``v`` attending to ``keys`` keys per query (counted as FLOP counts count them)."""

    heads: int
    qk: int
    v: int
    keys: int
    done_fraction: float
    """Share of the counted score FLOPs a causal kernel computes (unmasked part)."""

    def flops_per_token(self) -> float:
        """Forward FLOPs per query: ``Q K^T`` and ``P V`` (2 FLOP per multiply-add)."""
        return 2.0 * self.heads * (self.qk + self.v) * self.keys


def attention_core(spec: ModelSpec, local: bool) -> Core:
    """The block's attention core. Keys per query: the whole sequence (global), the window
    (sliding) or the chunk (chunked), without a causal discount, as Megatron-LM counts global
    attention; a causal kernel computes half of a global or chunked score matrix, and
    ``1 - w / (2 s)`` of a sliding window ``w`` (query ``i`` sees ``min(i + 1, w)`` keys)."""
    s = spec.seq_len
    keys = min(spec.window, s) if local and spec.window else s
    if local and spec.local_attention == "sliding" and keys < s:
        done = 1.0 - keys / (2.0 * s)
    else:
        done = 0.5
    if spec.attention == "mla":
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        return Core(spec.heads, qk, spec.v_head_dim, keys, done)
    return Core(spec.heads, spec.d_head, spec.d_head, keys, done)


OUTSIDE, INSIDE = "outside", "inside"


def block_tensors(
    spec: ModelSpec,
    moe: bool,
    *,
    mlp_recomputed: bool = False,
    up_recomputed: bool = False,
    mlp_whole: bool = False,
) -> list[tuple[float, str, bool]]:
    """Stored tensors per token, ``(elements, where, fp8_input)`` (module docstring), without
    the attention core's (:func:`attention_core`; the caller adds them by kernel) and the
    dropout masks.

    ``mlp_recomputed``: what is left when the MLP is recomputed in the backward, as
    Megatron-Core's ``--recompute-modules`` does it (``TransformerConfig.recompute_modules``):
    a dense block's ``mlp`` checkpoints the whole MLP, which keeps only its input (stored
    anyway) and drops the FC1 output and the FC2 input; a MoE block's ``moe_act``
    checkpoints the experts' activation function with output discarding, which drops each
    routed copy's FC2 input (the activation's output) and keeps the FC1 output it is
    recomputed from. The shared experts are not recomputed (Megatron's separate
    ``shared_experts`` module).

    ``up_recomputed``: Megatron-Core's ``mla_up_proj`` recompute module
    (``megatron/core/transformer/multi_latent_attention.py``: the up-projections and RoPE run
    under ``CheckpointWithoutOutput``, whose outputs are discarded once the attention core has
    run and recomputed before its backward): an MLA block keeps no Q, K, V (Q only when it has
    a query latent, ``q_lora_rank``; without one the query projection reads the hidden state);
    the latents it recomputes them from are kept anyway. Other blocks are unchanged.

    ``mlp_whole``: Megatron-Core's ``mlp`` and ``moe`` modules together (normal checkpointing
    of the whole dense MLP, ``transformer_layer.py``, and of the whole MoE layer,
    ``moe/moe_layer.py`` ``MoELayer.forward``: router, dispatch, routed and shared experts,
    combine; Megatron-LM@84cf979c): the block keeps the MLP's input and nothing of the MLP,
    no routed copy, no FC1 output, no shared-expert tensor (the router's logits are the
    caller's, which drops them too)."""
    h, a = spec.hidden, spec.heads
    gate = gate_factor(spec)
    out = [
        (h, OUTSIDE, False),  # input of the first norm
        (h, OUTSIDE, True),  # attention input (the norm's output)
        (h, OUTSIDE, False),  # input of the second norm
        (h, OUTSIDE, not moe),  # MLP input: a MoE router reads it in BF16
    ]
    if spec.attention == "mla":
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        rq, rkv, rope = spec.q_lora_rank or 0, spec.kv_lora_rank, spec.qk_rope_head_dim
        if not (up_recomputed and rq):
            out.append((a * qk, INSIDE, False))  # Q
        if not up_recomputed:
            out += [(a * qk, INSIDE, False), (a * spec.v_head_dim, INSIDE, False)]  # K, V
        out.append((a * spec.v_head_dim, INSIDE, True))  # output projection input
        # the latents: the down-projections' outputs on the local tokens (norm inputs), and
        # the gathered, normalised latents every tensor rank's up-projection reads
        if rq:
            out += [(rq, OUTSIDE, False), (rq, REP, True)]
        out += [(rkv + rope, OUTSIDE, False), (rkv, REP, True)]
    else:
        q, kv = a * spec.d_head, spec.kv_dim
        out += [(q, INSIDE, False), (kv, INSIDE, False), (kv, INSIDE, False), (q, INSIDE, True)]
        if spec.qk_norm:
            out += [(q + kv, INSIDE, False)]  # Q and K before their norms
    if mlp_whole:
        return out
    if moe:
        fe, fs = spec.expert_ffn, spec.shared_ffn
        for _ in range(spec.top_k):  # each token's copy sent to an expert
            out += [(h, INSIDE, True), (gate * fe, INSIDE, False)]
            if not mlp_recomputed:
                out.append((fe, INSIDE, True))  # the activation's output, FC2's input
        if fs:
            out += [(gate * fs, INSIDE, False), (fs, INSIDE, True)]
    elif not mlp_recomputed:
        f = spec.ffn_hidden
        out += [(gate * f, INSIDE, False), (f, INSIDE, True)]  # FC1 output, FC2 input
    return out


def dots_inventory(spec: ModelSpec, moe: bool) -> list[tuple[float, str, bool]]:
    """Stored tensors per token, ``(elements, where, fp8_input)``, of a block under JAX's
    ``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims``
    (:attr:`nest.core.axes.Recompute.DOTS`; MaxText's ``remat_policy: minimal``,
    ``MaxText/layers/models.py`` at
    github:AI-Hypercomputer/maxtext@76bd53b0f44caf989c88189afadeb1062f9254f0).

    The policy lets the backward keep the outputs of ``dot_general`` calls without batch
    dimensions (the weight matmuls; the attention's score and value products have batch and
    head dimensions, the attention kernel is a custom call) and recompute everything else from
    the block's input, which the layer scan carries. JAX keeps a saveable value only where the
    backward reads it: Q, K and V (the attention core's inputs), the MLP's FC1 outputs (the
    activation's inputs: two with a gate), MLA's down-projection outputs (its latent norms'
    inputs) and its up-projections' Q, K, V. The outputs of the attention's output projection
    and of FC2 feed only residual additions, whose backward reads nothing, so they are not
    kept; the norms' outputs, the attention output and the activation's output are
    recomputed. A MoE block keeps each routed copy's and the shared experts' FC1 outputs (the
    caller adds the router's logits)."""
    h, a = spec.hidden, spec.heads
    gate = gate_factor(spec)
    out = [(h, OUTSIDE, False)]  # the block's input (the scan's carry)
    if spec.attention == "mla":
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        out += [(a * qk, INSIDE, False), (a * qk, INSIDE, False)]
        out.append((a * spec.v_head_dim, INSIDE, False))
        if spec.q_lora_rank:
            out.append((spec.q_lora_rank, OUTSIDE, False))
        out.append((spec.kv_lora_rank + spec.qk_rope_head_dim, OUTSIDE, False))
    else:
        out += [(a * spec.d_head, INSIDE, False), (spec.kv_dim, INSIDE, False)]
        out.append((spec.kv_dim, INSIDE, False))
    if moe:
        out += [(gate * spec.expert_ffn, INSIDE, False)] * spec.top_k
        if spec.shared_ffn:
            out.append((gate * spec.shared_ffn, INSIDE, False))
    else:
        out.append((gate * spec.ffn_hidden, INSIDE, False))
    return out


def named_inventory(
    spec: ModelSpec, out_proj: bool, qkv: bool = True
) -> list[tuple[float, str, bool]]:
    """Stored tensors per token, ``(elements, where, fp8_input)``, of a block under a JAX
    policy that saves named tensors only, ``jax.checkpoint_policies.save_only_these_names``:
    the block's input (the layer scan's carry), Q, K and V, and with ``out_proj`` the attention
    output projection's output (:attr:`nest.core.axes.Recompute.QKV_PROJ` and
    ``QKV_OUT_PROJ``); without ``qkv`` (and ``out_proj``) the block's input alone, JAX's
    remat with no saveable value (:attr:`nest.core.axes.Recompute.NOTHING_SAVEABLE`).

    - ``nothing_saveable``: MaxText's ``remat_policy: full`` passes ``policy=None`` to
      ``nn.remat`` (github:AI-Hypercomputer/maxtext@76bd53b0f44caf989c88189afadeb1062f9254f0
      ``MaxText/layers/models.py``), which ``jax.checkpoint`` reads as
      ``jax.checkpoint_policies.nothing_saveable`` (github:jax-ml/jax@cec06d1
      ``jax/_src/ad_checkpoint.py``, ``remat_partial_eval``: ``policy = params['policy'] or
      nothing_saveable``): nothing inside the block is saved, and what is rerun is the staged
      jaxpr after ``pe.dce_jaxpr`` ("keeping only instantiated outputs which are unknown"),
      so only what the backward reads;
    - ``qkv_proj``: MaxText's ``remat_policy: save_qkv_proj`` saves ``query_proj``,
      ``key_proj``, ``value_proj`` (and the fused ``qkv_proj``, one of the two is produced),
      github:AI-Hypercomputer/maxtext@d9a4b64e235a749e89e5281f68acad010a739c8e
      ``MaxText/layers/models.py`` (the policy) and ``MaxText/layers/attentions.py``
      (``Attention.__call__`` names the projections' outputs after RoPE: ``a d`` for Q,
      ``kv_dim`` for K and V);
    - ``qkv_out_proj``: praxis's ``AutodiffCheckpointType.SAVE_QKV_OUT_PROJ`` saves
      ``combined_qkv_proj`` (the fused ``3 x a x d`` projection's output, before its bias)
      and ``out_proj`` (the output projection's, ``h`` wide),
      github:google/praxis@feeaff19915ca9c3de8b372b7427d15c81f0d757
      ``praxis/layers/checkpoint_policy.py`` (unchanged since 5c6d86f, 2023-07-27) and
      ``praxis/layers/attentions.py`` (``CombinedQKVProjectionLayer``,
      ``DotProductAttention``).

    Every other value, named or not, is recomputed from what is kept where the backward reads
    it (the norms' outputs, the attention core's output and its softmax statistics, the MLP's
    FC1 outputs and activation; a MoE block's router logits and expert intermediates): no
    MLP tensor is kept. An MLA block keeps its Q, K and V (the up-projections' outputs:
    ASSUMED, neither source names MLA's tensors at these commits) and none of its latents.
    Saved values are the GEMMs' outputs, in the activation precision even under FP8."""
    h, a = spec.hidden, spec.heads
    out = [(h, OUTSIDE, False)]  # the block's input (the scan's carry)
    if not qkv:
        return out
    if spec.attention == "mla":
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        out += [(a * qk, INSIDE, False), (a * qk, INSIDE, False)]
        out.append((a * spec.v_head_dim, INSIDE, False))
    else:
        out += [(a * spec.d_head, INSIDE, False), (spec.kv_dim, INSIDE, False)]
        out.append((spec.kv_dim, INSIDE, False))
    if out_proj:
        out.append((h, OUTSIDE, False))  # the output projection's output (a residual summand)
    return out


def elementwise_kernels(spec: ModelSpec) -> int:
    """Memory-bound (non-GEMM, non-attention) kernels one block's forward launches, the
    operators of :func:`elementwise_bytes_per_token` each as one kernel: two norms, two residual
    adds, the activation function; rotary embeddings (one kernel for Q and K), Q/K norms (one),
    MLA's two latent norms; two dropouts. Each pays the device's fixed per-kernel time
    (:attr:`nest.core.hardware.Device.kernel_overhead_s`), which small models feel: their
    kernels are short, the fixed part is not."""
    count = 5  # 2 norms, 2 residual adds, the activation
    if spec.position == "rope":
        count += 1
    if spec.attention == "mla":
        count += 2
    elif spec.qk_norm:
        count += 1
    if spec.dropout:
        count += 2
    return count


def elementwise_bytes_per_token(spec: ModelSpec, moe: bool, p: int) -> dict[str, float]:
    """HBM bytes per token of the block's memory-bound work, by where it runs (each operator
    streams its inputs and outputs once; Korthikanti et al. §4.1's operator list): norms and
    residual adds outside the tensor-parallel region; the activation function, rotary
    embeddings and Q/K norms inside it; MLA's latent norms on every tensor rank."""
    h = spec.hidden
    act = 3 if spec.activation == "swiglu" else 2  # read gate and up, write / read, write
    ffn = spec.top_k * spec.expert_ffn + spec.shared_ffn if moe else spec.ffn_hidden
    inside = p * ffn * act
    rep = 0.0
    if spec.attention == "mla":
        rope_width = (spec.heads + 1) * spec.qk_rope_head_dim  # the heads' and the shared key
        if spec.position == "rope":
            inside += 2 * p * rope_width
        rep += 2 * p * ((spec.q_lora_rank or 0) + spec.kv_lora_rank)
    else:
        qk_width = spec.heads * spec.d_head + spec.kv_dim
        if spec.position == "rope":
            inside += 2 * p * qk_width
        if spec.qk_norm:
            inside += 2 * p * qk_width
    return {OUTSIDE: 10 * p * h, INSIDE: inside, REP: rep}


TORCHTITAN_MLA_NAMES = {
    "q": "wq",
    "q_down": "wq_a",
    "q_up": "wq_b",
    "kv_down": "wkv_a",
    "kv_up": "wkv_b",
    "proj": "wo",
}
"""torchtitan's names (``torchtitan/models/deepseek_v3/model.py``) of :func:`attention_linears`'
MLA linears."""


def torchtitan_matmuls(spec: ModelSpec, moe: bool) -> tuple[Linear, ...]:
    """The ``aten.mm`` calls of one block's forward in torchtitan's order, which op-level
    selective checkpointing counts (:func:`op_sac_inventory`). Each ``nn.Linear`` is one mm, so
    the fused linears of :func:`attention_linears` / :func:`mlp_linears` come apart:

    - attention (``torchtitan/models/llama/model.py`` at 9dec370, ``Attention.forward``:
      ``self.wq(x), self.wk(x), self.wv(x)``, then ``self.wo``): ``wq``, ``wk``, ``wv``, ``wo``;
      MLA (``torchtitan/models/deepseek_v3/model.py``): ``wq`` (or ``wq_a``, ``wq_b``),
      ``wkv_a``, ``wkv_b``, ``wo``;
    - dense MLP (``FeedForward.forward``: ``self.w2(F.silu(self.w1(x)) * self.w3(x))``): ``w1``,
      ``w3`` (gated MLPs only), ``w2``; a MoE block's shared experts the same. The routed
      experts run ``torch._grouped_mm`` and the router's gate is force-recomputed
      (``SelectiveAC.Config.force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]``,
      ``torchtitan/distributed/activation_checkpoint.py``), so neither is counted."""
    h, a, gate = spec.hidden, spec.heads, gate_factor(spec)
    if spec.attention == "mla":  # the same linears in the same order, under torchtitan's names
        attention = tuple(
            dataclasses.replace(x, name=TORCHTITAN_MLA_NAMES[x.name])
            for x in attention_linears(spec)
        )
    else:
        q, kv = a * spec.d_head, spec.kv_dim
        attention = (
            Linear("wq", h, q, COL),
            Linear("wk", h, kv, COL),
            Linear("wv", h, kv, COL),
            Linear("wo", q, h, ROW),
        )
    f = (spec.shared_ffn if moe else spec.ffn_hidden) or 0
    if not f:
        return attention
    up = (Linear("w1", h, f, COL),) + ((Linear("w3", h, f, COL),) if gate == 2 else ())
    return (*attention, *up, Linear("w2", f, h, ROW))


OP_SAC_WHERE = {COL: INSIDE, ROW: REP, REP: OUTSIDE}
"""Where a saved mm output lives (:func:`block_tensors`' ``where``): a column-parallel output
is split over ``t``; a row-parallel mm's output is the full-width partial sum on every tensor
rank before its reduction (``rep``: not split); a replicated linear (MLA's down-projections)
runs on the sequence-parallel shard (``outside``)."""


def op_sac_inventory(
    spec: ModelSpec, moe: bool
) -> tuple[list[tuple[float, str, bool]], tuple[Linear, ...]]:
    """Stored tensors per token and recomputed matmuls of one block under op-level selective
    activation checkpointing (:attr:`nest.core.axes.Recompute.OP`), torchtitan's
    ``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``.

    The policy (``_apply_ac_to_transformer_block``, ``torchtitan/parallelisms/
    parallelize_llama.py`` at 9dec370, 2024-12-26, the commit of
    ``benchmarks/llama3_h100_202412_torchtitan.md``; the same rule in ``SelectiveAC``,
    ``torchtitan/distributed/activation_checkpoint.py``, 2026) saves the outputs of the ops of
    ``_save_list`` (``aten.mm``, the flash / efficient SDPA kernels, ``reduce_scatter_tensor``,
    ``abs`` and ``max``) except every second ``aten.mm`` of the block's forward (the mm counter
    restarts in each block's checkpoint context), and recomputes everything else when the
    backward reaches the block (``early_stop=False``: the whole forward reruns, saved ops
    returning their cached outputs). Per token, stored:

    - the block's input (the checkpoint's argument), ``outside``;
    - the output of the 1st, 3rd, 5th, ... mm of :func:`torchtitan_matmuls` (:data:`OP_SAC_WHERE`);
    - the attention kernel's output (the caller adds its fp32 log-sum-exp and, with tensor
      and sequence parallelism, the reduce-scatters' outputs; the expert all-to-alls' under
      expert parallelism; the router's top-k);

    all in the compute dtype (an mm's output is bf16 under FP8 too). Nothing of the norms,
    rotary embeddings, activation function or residual adds is kept. Recomputed: the 2nd, 4th,
    ... mm (returned), plus (the caller) the routed experts' GEMMs, the router, and all the
    block's elementwise work. Llama 3 8B (``wq wk wv wo w1 w3 w2``): ``wq``, ``wv``, ``w1``,
    ``w2`` saved; ``wk``, ``wo``, ``w3`` recomputed."""
    out: list[tuple[float, str, bool]] = [(spec.hidden, OUTSIDE, False)]  # the block's input
    recomputed = []
    for count, lin in enumerate(torchtitan_matmuls(spec, moe), start=1):
        if count % 2 == 0:
            recomputed.append(lin)
        else:
            out.append((lin.n, OP_SAC_WHERE[lin.split], False))
    width = spec.v_head_dim if spec.attention == "mla" else spec.d_head
    out.append((spec.heads * width, INSIDE, False))  # the attention kernel's output
    return out, tuple(recomputed)
