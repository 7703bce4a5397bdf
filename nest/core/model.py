"""Model description: a transformer spec and its chain of layers.

A model is a chain: embedding, ``L`` transformer blocks, head (final norm, LM head, loss). The
embedding and the head are layers of their own (the NEST artifact copied the head into every block;
docs/nest_paper.md §4.3). Blocks are dense or mixture-of-experts; ``moe_layer_freq`` mixes them
(Megatron-Core's convention: block ``i`` is MoE iff ``i % moe_layer_freq == 0``).

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
    """FFN intermediate size ``F`` (per expert for MoE)."""
    vocab: int
    """Vocabulary size ``V`` (unpadded)."""
    seq_len: int
    """Training sequence length ``s``."""
    kv_heads: int | None = None
    """Key/value heads ``g`` (GQA); ``None`` means ``heads`` (multi-head attention)."""
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
    moe_layer_freq: int = 1
    """Block ``i`` is MoE iff ``num_experts > 1`` and ``i % moe_layer_freq == 0``."""
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
        if self.hidden % self.heads:
            raise UserError(
                f"model {self.name}: hidden={self.hidden} is not divisible by heads={self.heads}"
            )
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
        if self.moe_layer_freq < 1:
            raise UserError(f"model {self.name}: moe_layer_freq={self.moe_layer_freq} must be >= 1")
        if self.dtype_bytes not in (1, 2, 4):
            raise UserError(f"model {self.name}: dtype_bytes={self.dtype_bytes}; use 1, 2 or 4")

    @property
    def num_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``g * d``."""
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def block_is_moe(self, block: int) -> bool:
        return self.is_moe and block % self.moe_layer_freq == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerRef:
    """A position in the chain: which kind of layer sits there."""

    index: int
    kind: LayerKind
    name: str
    moe: bool = False

    @property
    def signature(self) -> tuple:
        """Kind and MoE-ness: equal signatures mean equal costs for the analytic model (its cost
        cache key); a model's ``cost_key`` says when two of its layers cost the same."""
        return (self.kind, self.moe)


def build_chain(spec: ModelSpec) -> tuple[LayerRef, ...]:
    """The layer chain of a spec: embedding, blocks 0..L-1, head."""
    chain = [LayerRef(index=0, kind=LayerKind.EMBEDDING, name="embedding")]
    for block in range(spec.layers):
        moe = spec.block_is_moe(block)
        chain.append(
            LayerRef(
                index=block + 1,
                kind=LayerKind.BLOCK,
                name=f"block{block}" + ("(moe)" if moe else ""),
                moe=moe,
            )
        )
    chain.append(LayerRef(index=spec.layers + 1, kind=LayerKind.HEAD, name="head"))
    return tuple(chain)
