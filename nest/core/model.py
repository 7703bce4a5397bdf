"""Model description: a transformer spec and its chain of layers.

A model is a chain: embedding, ``L`` transformer blocks, head (final norm, LM head, loss, and the
multi-token-prediction modules when there are any). The embedding and the head are layers of
their own (the NEST artifact copied the head into every block; docs/nest_paper.md §4.3).

Blocks come in kinds. A block's **attention** is grouped-query attention (MHA when
``kv_heads == heads``, MQA when 1) with an explicit ``head_dim``, or multi-head latent attention
(``attention: mla``, DeepSeek-V2/V3: low-rank query and key/value projections and a decoupled
RoPE head); it attends to the whole sequence (global) or to a local ``window`` (a sliding window,
or fixed chunks as Llama 4), with ``global_every`` saying which blocks stay global. A block's
**MLP** is dense (``ffn_hidden``) or a mixture of experts (``num_experts`` routed experts of
``moe_ffn_hidden``, ``top_k`` per token, plus ``shared_experts`` every token runs). Which blocks
are MoE: none of the first ``first_dense_layers`` (DeepSeek's ``first_k_dense_replace``), then
block ``i`` iff ``i % moe_layer_freq == moe_layer_phase`` (Megatron-Core's ``moe_layer_freq``
has phase 0; Llama 4's ``interleave_moe_layer_step`` is phase ``step - 1``).

The per-layer formulas (FLOPs, parameters, activation bytes, collectives) live in
:mod:`nest.core.layers`; this module holds the spec and builds the chain.
"""

from dataclasses import dataclass

from nest.core.axes import LayerKind
from nest.core.errors import UserError


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A transformer, in the terms of its published configuration."""

    name: str
    hidden: int
    """Hidden size ``h``."""
    layers: int
    """Number of transformer blocks ``L``."""
    heads: int
    """Attention (query) heads ``a``."""
    ffn_hidden: int
    """FFN intermediate size ``F`` of a dense block (and of each expert unless
    ``moe_ffn_hidden`` is set)."""
    vocab: int
    """Vocabulary size ``V`` (unpadded)."""
    seq_len: int
    """Training sequence length ``s``."""
    kv_heads: int | None = None
    """Key/value heads ``g`` (GQA); ``None`` means ``heads`` (multi-head attention)."""
    head_dim: int | None = None
    """Width ``d`` of one attention head; ``None`` means ``hidden / heads``. Qwen3 and Gemma 3
    use 128 whatever the hidden size."""
    attention: str = "gqa"
    """``gqa`` (multi-head, grouped-query or multi-query by ``kv_heads``) or ``mla``
    (multi-head latent attention, DeepSeek-V2 §2.1: the fields below)."""
    q_lora_rank: int | None = None
    """MLA: rank of the query's down-projection; ``None``: the query is projected at full rank."""
    kv_lora_rank: int = 0
    """MLA: rank of the joint key/value compression (the latent a token caches)."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key width without rotary embedding."""
    qk_rope_head_dim: int = 0
    """MLA: per-head width of the decoupled rotary query/key (the rotary key is shared by all
    heads)."""
    v_head_dim: int = 0
    """MLA: per-head value width."""
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys (Qwen3, Gemma 3)."""
    window: int | None = None
    """Local attention span in tokens (a sliding window, or a chunk); ``None``: every block
    attends to the whole sequence."""
    local_attention: str = "sliding"
    """``sliding`` (each query attends to the ``window`` tokens before it: Mistral, GPT-OSS,
    Gemma) or ``chunked`` (to its own chunk of ``window`` tokens: Llama 4)."""
    global_every: int = 1
    """With a ``window``: block ``i`` attends globally iff ``(i + 1) % global_every == 0``
    (GPT-OSS 2, Gemma 3 6, Llama 4 4); 1 would make every block global, so a window needs
    ``global_every`` of at least 2, or 0 for no global blocks at all."""
    activation: str = "gelu"
    """``gelu`` (two FFN matrices) or ``swiglu`` (gated: three FFN matrices)."""
    norm: str = "layernorm"
    """``layernorm`` (weight and bias) or ``rmsnorm`` (weight only)."""
    bias: bool = True
    """Linear layers carry biases (GPT, BERT) or not (Llama, Mixtral)."""
    position: str = "learned"
    """``learned`` absolute position embeddings (GPT, BERT) or ``rope`` (no parameters)."""
    max_position: int | None = None
    """Rows of the learned position table; ``None`` means ``seq_len``."""
    tied_embeddings: bool = False
    """The LM head shares the embedding matrix."""
    dropout: bool = False
    """Dropout layers present (their 1-byte masks count in activation memory)."""
    num_experts: int = 1
    """Experts per MoE block; 1 means a dense model."""
    top_k: int = 1
    """Experts each token is routed to."""
    moe_ffn_hidden: int | None = None
    """FFN size of each routed expert; ``None`` means ``ffn_hidden`` (Mixtral). DeepSeek-V3:
    2048, with ``ffn_hidden`` 18432 for its dense blocks."""
    shared_experts: int = 0
    """Experts every token of a MoE block runs besides its routed ones (DeepSeekMoE)."""
    shared_ffn_hidden: int | None = None
    """FFN size of each shared expert; ``None`` means the routed experts' size."""
    first_dense_layers: int = 0
    """The first blocks are dense whatever ``moe_layer_freq`` says (``first_k_dense_replace``)."""
    moe_layer_freq: int = 1
    """Block ``i`` (past the first dense ones) is MoE iff ``num_experts > 1`` and
    ``i % moe_layer_freq == moe_layer_phase``."""
    moe_layer_phase: int = 0
    """See ``moe_layer_freq``; in ``[0, moe_layer_freq)``."""
    mtp_layers: int = 0
    """Multi-token-prediction depth (DeepSeek-V3 §2.2): each module is a projection of
    ``[h; embedding]`` to ``h``, one transformer block of the last block's kind, and the shared
    output head, run on the last pipeline stage."""
    capacity_factor: float | None = None
    """MoE expert capacity as a multiple of the balanced share of tokens (GShard's capacity
    factor: each expert's GEMM is padded to it); None: dropless with the router balancing the
    tokens, as the published Megatron-Core MoE benchmarks force."""
    encoder: bool = False
    """BERT-style encoder: token-type embeddings, embedding norm, MLM head and pooler."""
    dtype_bytes: int = 2
    """Bytes per element of weights and activations (bf16/fp16)."""

    def __post_init__(self) -> None:
        for field_name in ("hidden", "layers", "heads", "ffn_hidden", "vocab", "seq_len"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 1:
                raise UserError(
                    f"model {self.name}: {field_name}={value!r} must be a positive integer"
                )
        if self.head_dim is None and self.hidden % self.heads:
            raise UserError(
                f"model {self.name}: hidden={self.hidden} is not divisible by heads={self.heads}; "
                "set head_dim"
            )
        for field_name in ("head_dim", "q_lora_rank", "window"):
            value = getattr(self, field_name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise UserError(
                    f"model {self.name}: {field_name}={value!r} must be a positive integer or null"
                )
        for field_name in (
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "shared_experts",
            "first_dense_layers",
            "mtp_layers",
            "global_every",
        ):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 0:
                raise UserError(
                    f"model {self.name}: {field_name}={value!r} must be a non-negative integer"
                )
        self._check_attention()
        self._check_moe()
        g = self.num_kv_heads
        if g < 1 or self.heads % g:
            raise UserError(f"model {self.name}: kv_heads={g} must divide heads={self.heads}")
        if self.activation not in ("gelu", "swiglu"):
            raise UserError(
                f"model {self.name}: activation={self.activation!r}; use gelu or swiglu"
            )
        if self.norm not in ("layernorm", "rmsnorm"):
            raise UserError(f"model {self.name}: norm={self.norm!r}; use layernorm or rmsnorm")
        if self.position not in ("learned", "rope"):
            raise UserError(f"model {self.name}: position={self.position!r}; use learned or rope")
        if self.capacity_factor is not None and not self.capacity_factor >= 1:
            raise UserError(
                f"model {self.name}: capacity_factor={self.capacity_factor} must be >= 1 (or null "
                "for dropless routing)"
            )
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise UserError(
                f"model {self.name}: need 1 <= top_k={self.top_k} <= num_experts={self.num_experts}"
            )
        if self.dtype_bytes not in (1, 2, 4):
            raise UserError(f"model {self.name}: dtype_bytes={self.dtype_bytes}; use 1, 2 or 4")

    def _check_attention(self) -> None:
        if self.attention not in ("gqa", "mla"):
            raise UserError(f"model {self.name}: attention={self.attention!r}; use gqa or mla")
        if self.attention == "mla":
            missing = [
                k
                for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
                if getattr(self, k) < 1
            ]
            if missing:
                raise UserError(
                    f"model {self.name}: attention=mla needs {', '.join(missing)} >= 1 (the "
                    "ranks and head widths of its config)"
                )
        if self.local_attention not in ("sliding", "chunked"):
            raise UserError(
                f"model {self.name}: local_attention={self.local_attention!r}; use sliding or "
                "chunked"
            )
        if self.window is not None and self.global_every == 1:
            raise UserError(
                f"model {self.name}: window={self.window} with global_every=1 makes every block "
                "global; set global_every (e.g. 2: every second block global, 0: none) or "
                "window=null"
            )

    def _check_moe(self) -> None:
        for field_name in ("moe_ffn_hidden", "shared_ffn_hidden"):
            value = getattr(self, field_name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise UserError(
                    f"model {self.name}: {field_name}={value!r} must be a positive integer or null"
                )
        if self.moe_layer_freq < 1:
            raise UserError(f"model {self.name}: moe_layer_freq={self.moe_layer_freq} must be >= 1")
        if not 0 <= self.moe_layer_phase < self.moe_layer_freq:
            raise UserError(
                f"model {self.name}: moe_layer_phase={self.moe_layer_phase} must be in "
                f"[0, moe_layer_freq={self.moe_layer_freq})"
            )
        if self.is_moe and not any(self.block_is_moe(i) for i in range(self.layers)):
            raise UserError(
                f"model {self.name}: num_experts={self.num_experts} but no block is MoE "
                f"(first_dense_layers={self.first_dense_layers}, moe_layer_freq="
                f"{self.moe_layer_freq}); lower first_dense_layers"
            )
        if self.shared_experts and not self.is_moe:
            raise UserError(
                f"model {self.name}: shared_experts={self.shared_experts} needs num_experts > 1"
            )

    @property
    def num_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def d_head(self) -> int:
        """Width of one (GQA) attention head: ``head_dim``, else ``hidden / heads``."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) of GQA: ``g * d``."""
        return self.num_kv_heads * self.d_head

    @property
    def expert_ffn(self) -> int:
        """FFN size of one routed expert."""
        return self.moe_ffn_hidden if self.moe_ffn_hidden is not None else self.ffn_hidden

    @property
    def shared_ffn(self) -> int:
        """FFN width all shared experts of a MoE block add up to (0 without them)."""
        size = self.shared_ffn_hidden if self.shared_ffn_hidden is not None else self.expert_ffn
        return self.shared_experts * size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def block_is_moe(self, block: int) -> bool:
        return (
            self.is_moe
            and block >= self.first_dense_layers
            and block % self.moe_layer_freq == self.moe_layer_phase
        )

    def block_is_local(self, block: int) -> bool:
        """Whether block ``block`` attends to a local window (module docstring)."""
        if self.window is None:
            return False
        return self.global_every == 0 or (block + 1) % self.global_every != 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerRef:
    """A position in the chain: which kind of layer sits there."""

    index: int
    kind: LayerKind
    name: str
    moe: bool = False
    local: bool = False
    """The block attends to a local window (:attr:`ModelSpec.window`)."""

    @property
    def signature(self) -> tuple:
        """Kind, MoE-ness and attention span: equal signatures mean equal costs for the
        analytic model (its cost cache key); a model's ``cost_key`` says when two of its layers
        cost the same."""
        return (self.kind, self.moe, self.local)


def build_chain(spec: ModelSpec) -> tuple[LayerRef, ...]:
    """The layer chain of a spec: embedding, blocks 0..L-1, head."""
    chain = [LayerRef(index=0, kind=LayerKind.EMBEDDING, name="embedding")]
    for block in range(spec.layers):
        moe = spec.block_is_moe(block)
        local = spec.block_is_local(block)
        chain.append(
            LayerRef(
                index=block + 1,
                kind=LayerKind.BLOCK,
                name=f"block{block}" + ("(moe)" if moe else "") + ("(local)" if local else ""),
                moe=moe,
                local=local,
            )
        )
    chain.append(LayerRef(index=spec.layers + 1, kind=LayerKind.HEAD, name="head"))
    return tuple(chain)
