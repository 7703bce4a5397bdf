"""A :class:`~nest.core.model.ModelSpec` from a Hugging Face ``config.json`` (JSON only, never
code).

``model=hf model.config_path=PATH`` reads the file with :func:`json.load` and nothing else: no
``transformers`` import, no ``trust_remote_code``, no file of the model folder but ``config.json``.
The family is taken from ``model_type`` (falling back to the first ``architectures`` entry); the
fields read per family are in :data:`FAMILIES` and the reader functions below. A field absent
from the file takes the default of the family's ``transformers`` configuration class.

===========  ======================================================================================
family       fields (Hugging Face name -> ModelSpec field)
===========  ======================================================================================
llama,       hidden_size -> hidden, num_hidden_layers -> layers, num_attention_heads -> heads,
mistral,     num_key_value_heads -> kv_heads (absent: heads), head_dim -> head_dim (absent:
qwen2,       hidden / heads), intermediate_size -> ffn_hidden, vocab_size -> vocab,
mixtral      tie_word_embeddings -> tied_embeddings (absent: false), hidden_act silu -> SwiGLU,
             RMSNorm, RoPE, no biases; Mixtral: num_local_experts -> num_experts,
             num_experts_per_tok -> top_k
deepseek_v2, MLA (attention: mla): q_lora_rank (null: full-rank query), kv_lora_rank,
deepseek_v3, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; intermediate_size -> ffn_hidden (the
kimi_k2      dense blocks), n_routed_experts -> num_experts, num_experts_per_tok -> top_k,
             moe_intermediate_size -> moe_ffn_hidden, n_shared_experts -> shared_experts (each
             moe_intermediate_size wide), first_k_dense_replace and moe_layer_freq -> the MoE
             blocks, num_nextn_predict_layers -> mtp_layers, attention_bias -> bias
qwen3,       the llama fields plus head_dim, per-head Q/K RMSNorm (qk_norm); Qwen3-MoE:
qwen3_moe    num_experts, num_experts_per_tok, moe_intermediate_size, decoder_sparse_step and
             mlp_only_layers -> the MoE blocks; use_sliding_window, sliding_window,
             max_window_layers or layer_types -> window
gpt_oss      the llama fields plus head_dim; every block MoE: num_local_experts,
             num_experts_per_tok, experts of intermediate_size; biases; layer_types and
             sliding_window -> window, global_every (sliding, full, sliding, ...: 2)
llama4,      text_config: intermediate_size_mlp -> ffn_hidden, num_local_experts,
llama4_text  num_experts_per_tok, intermediate_size -> moe_ffn_hidden and one shared expert,
             interleave_moe_layer_step (or moe_layers) -> the MoE blocks, use_qk_norm -> qk_norm,
             layer_types (else no_rope_layers / no_rope_layer_interval: the NoPE blocks are
             global) and attention_chunk_size -> chunked window, global_every
gemma3,      text_config: the llama fields plus head_dim, hidden_activation gelu -> a gated GELU
gemma3_text  (GeGLU: three matrices, as SwiGLU), qk_norm, layer_types (else
             sliding_window_pattern) and sliding_window -> window, global_every; tied
gpt2         n_embd, n_layer, n_head, n_inner (null: 4 n_embd), vocab_size, n_positions; GELU,
             LayerNorm, biases, learned positions, tied embeddings, dropout if resid_pdrop > 0
bert         hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
             max_position_embeddings, type_vocab_size (must be 2); GELU, LayerNorm, biases,
             learned positions, tied MLM decoder, pooler, dropout if hidden_dropout_prob > 0
===========  ======================================================================================

Layer patterns are first computed as the family's own code defines them (which blocks are MoE,
which attend locally), then written in the spec's terms: MoE blocks as ``first_dense_layers``,
``moe_layer_freq`` and ``moe_layer_phase``; local blocks as ``window`` with ``global_every`` (0:
every block local). A pattern those cannot express (``mlp_only_layers`` other than the first
blocks, a ``moe_layers`` list that is not every n-th block, ``layer_types`` whose global blocks
are not every n-th one, sliding and chunked blocks mixed, an unknown layer type) is a one-line
error naming the field and its value. A vision-language config (``llama4``, ``gemma3``) is
planned as its ``text_config``, with a notice that the vision tower is left out.

Notices (:attr:`HfModel.notes`, printed after the summary), for what the analytic model leaves
out and what changes little: GPT-OSS's attention sinks and clamped SwiGLU (``swiglu_limit``);
Gemma's post-attention and post-MLP norms; logit soft-capping; Q/K/V/O biases of a model whose
MLP has none (``attention_bias`` on Qwen3, Llama 4, Gemma 3); DeepSeek's group-limited routing
(``n_group`` / ``topk_group``). Fields that change no cost are not read: RoPE settings (but for
the training length below), router scoring and scaling, ``query_pre_attn_scalar``, Llama 4's
NoPE layers (beyond their full attention) and attention temperature tuning.

Name: ``model.name``, else the config's ``_name_or_path``, else the file: its folder for a
``config.json`` (``org/name`` inside a Hugging Face cache, ``models--org--name/snapshots/REV/``),
its stem for any other file name. Published hub configs carry no ``_name_or_path``.

Sequence length (the training length every cost depends on), first that applies:

1. ``model.seq_len``, when given;
2. the pre-training context the config states, ``rope_scaling.original_max_position_embeddings``,
   when it is below ``max_position_embeddings`` (Llama 3.1: 8192 of 131072; that is the length its
   base pre-training ran at before the RoPE context extension);
3. ``max_position_embeddings`` (``n_positions`` for GPT-2) when it is at most
   :data:`DEFAULT_TRAINING_SEQ_LEN` (4096);
4. :data:`DEFAULT_TRAINING_SEQ_LEN` otherwise (Qwen2.5-7B's 131072, Mistral's 32768).

The longest context a model accepts is not the length it is trained at; rules 2 and 4 print a
one-line notice saying so and how to change it, and the summary always says which rule gave the
length. A ``model.seq_len`` beyond a learned position table (GPT-2, BERT) is an error.

Approximations, stated: Qwen2's Q/K/V projections carry biases but its other linears do not; the
spec's ``bias`` is all-or-nothing, so Qwen2 is read without biases (``(h + 2 g d)`` parameters per
block, 0.006 % of Qwen2-0.5B). Mistral's sliding-window attention is costed as full attention over
``seq_len`` (equal when ``seq_len <= sliding_window``). Llama 4's Q/K L2 norm has no weights;
``use_qk_norm`` is read as the spec's per-head Q/K norm (``2 d`` parameters per block).
"""

import json
from dataclasses import dataclass
from pathlib import Path

from nest.core.errors import UserError
from nest.core.model import ModelSpec

GATED = {"silu", "swiglu"}
GELU = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu"}

DEFAULT_TRAINING_SEQ_LEN = 4096
"""Training length when neither ``model.seq_len`` nor the config's pre-training context says one and
``max_position_embeddings`` is longer. 4096 is the length Llama 2 was pre-trained at (Touvron et al.
2023, arXiv 2307.09288, §2.2 and Table 1) and the main pre-training stage of Qwen2 and Qwen2.5
before their long-context stages (Qwen2 report arXiv 2407.10671 §3.2; Qwen2.5 report arXiv
2412.15115 §3.3), and no longer than any shipped decoder's published pre-training length (Llama 3
and Mistral 7B trained at 8192)."""


@dataclass(frozen=True, slots=True)
class HfModel:
    """A config's spec with where its name and sequence length came from."""

    spec: ModelSpec
    seq_len_source: str
    """Which rule gave ``spec.seq_len`` (module docstring), in words."""
    notes: tuple[str, ...] = ()
    """One-line notices for the user, printed after the summary: a sequence length the config did
    not state as trained, and what the analytic model leaves out of this config (module
    docstring)."""


def _where(path: Path) -> str:
    return f"model.config_path={path}"


def _get(cfg: dict, key: str, path: Path, default=None, *, required: bool = True):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if required and default is None:
        raise UserError(
            f"{_where(path)}: the config has no {key!r}; is it a Hugging Face config.json of a "
            f"{cfg.get('model_type', '?')} model?"
        )
    return default


def _int(cfg: dict, key: str, path: Path, default: int | None = None) -> int:
    value = _get(cfg, key, path, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{_where(path)}: {key}={value!r} must be a positive integer")
    return value


def _count(cfg: dict, key: str, path: Path, default: int) -> int:
    """A non-negative integer field (a number of blocks)."""
    value = _get(cfg, key, path, default, required=False)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UserError(f"{_where(path)}: {key}={value!r} must be a non-negative integer")
    return value


def _probability(cfg: dict, key: str, path: Path, default: float) -> float:
    value = _get(cfg, key, path, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0 <= value <= 1:
        raise UserError(
            f"{_where(path)}: {key}={value!r} must be a number from 0 to 1 (a dropout "
            f"probability; {default} when absent)"
        )
    return float(value)


def _flag(cfg: dict, key: str, path: Path, default: bool) -> bool:
    value = _get(cfg, key, path, default)
    if not isinstance(value, bool):
        absent = "true" if default else "false"
        raise UserError(
            f"{_where(path)}: {key}={value!r} must be true or false (a JSON boolean; {absent} "
            "when absent)"
        )
    return value


def _head_dim(cfg: dict, path: Path) -> dict:
    """``head_dim`` when the config states it (Qwen3, Gemma 3, GPT-OSS, Llama 4 use widths other
    than ``hidden / heads``)."""
    return {"head_dim": _int(cfg, "head_dim", path)} if cfg.get("head_dim") is not None else {}


def _list(cfg: dict, key: str, path: Path, length: int | None = None) -> list | None:
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or (length is not None and len(value) != length):
        size = f" of {length} entries (one per block)" if length is not None else ""
        raise UserError(f"{_where(path)}: {key}={_short(value)} must be a list{size}")
    return value


def _short(value) -> str:
    """A value for a one-line message: long lists shortened."""
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:100]}... ({len(value)} entries)"


def _blocks(flags: list[bool]) -> str:
    """The indices of the true flags, runs written as ranges: ``[0-4, 6-47]``."""
    runs: list[list[int]] = []
    for i, flag in enumerate(flags):
        if flag and runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        elif flag:
            runs.append([i, i])
    return "[" + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) + "]"


def _moe_pattern(moe: list[bool], field: str, path: Path) -> dict:
    """``first_dense_layers``, ``moe_layer_freq`` and ``moe_layer_phase`` giving exactly the MoE
    blocks ``moe`` (the config's own rule, computed by the caller), or a one-line refusal naming
    the ``field`` that gave them."""
    layers = len(moe)
    first = next((i for i, m in enumerate(moe) if m), None)
    if first is None:
        raise UserError(
            f"{_where(path)}: {field} leaves no MoE block among the {layers}; a dense model is "
            "read from a dense config (remove the expert fields)"
        )
    for freq in range(1, layers + 1):
        phase = first % freq
        if [i >= first and i % freq == phase for i in range(layers)] == moe:
            return dict(
                first_dense_layers=0 if first == phase else first,
                moe_layer_freq=freq,
                moe_layer_phase=phase,
            )
    raise UserError(
        f"{_where(path)}: {field} makes blocks {_blocks(moe)} MoE; nest expresses MoE blocks as "
        "first dense blocks, then every n-th block (first_dense_layers, moe_layer_freq, "
        "moe_layer_phase); edit the config to such a pattern or write a model preset"
    )


LAYER_TYPES = {
    "full_attention": None,
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
}


def _span(cfg: dict, key: str, path: Path, default: int | None) -> int | None:
    """A window or chunk size in tokens; ``None`` (the key null, or absent without a default):
    blocks of that kind attend globally, as in transformers."""
    value = cfg.get(key, default)
    return None if value is None else _int(cfg, key, path, default)


def _attention_pattern(types: list, field: str, path: Path, windows: dict[str, int | None]) -> dict:
    """``window``, ``local_attention`` and ``global_every`` of a per-block list of Hugging Face
    ``layer_types`` (``windows``: the span of each local kind, ``None`` when the config sets
    none, which makes that kind global), or a one-line refusal naming ``field``."""
    for kind in types:
        if not isinstance(kind, str) or kind not in LAYER_TYPES:
            raise UserError(
                f"{_where(path)}: {field} has {kind!r}; nest reads full_attention, "
                "sliding_attention and chunked_attention blocks only"
            )
    local = [LAYER_TYPES[t] is not None and windows.get(LAYER_TYPES[t]) is not None for t in types]
    kinds = sorted({LAYER_TYPES[t] for t, is_local in zip(types, local, strict=True) if is_local})
    if not kinds:
        return {}
    if len(kinds) > 1:
        raise UserError(
            f"{_where(path)}: {field} mixes sliding and chunked blocks; a spec has one kind of "
            "local attention (local_attention: sliding or chunked); edit the config or write a "
            "model preset"
        )
    out = dict(window=windows[kinds[0]], local_attention=kinds[0])
    layers = len(local)
    if all(local):
        return {**out, "global_every": 0}
    for every in range(2, layers + 1):
        if all(local[i] == ((i + 1) % every != 0) for i in range(layers)):
            return {**out, "global_every": every}
    raise UserError(
        f"{_where(path)}: {field} makes blocks {_blocks([not f for f in local])} global; nest "
        "expresses global blocks only as every n-th block, block i global iff (i + 1) % "
        "global_every == 0; edit the config to such a pattern or write a model preset"
    )


def _gated(cfg: dict, path: Path, family: str, key: str = "hidden_act") -> None:
    act = str(cfg.get(key, "silu"))
    if act not in GATED:
        raise UserError(
            f"{_where(path)}: {key}={act!r}; the {family} family is read as a gated SiLU MLP "
            "(SwiGLU), so only silu is supported"
        )


def _attention_bias_note(cfg: dict, path: Path, fields: dict, notes: list[str]) -> None:
    """Q/K/V/O biases without MLP biases: left out (the spec's ``bias`` is all-or-nothing)."""
    if _flag(cfg, "attention_bias", path, False):
        heads, kv, d = fields["heads"], fields["kv_heads"], fields.get("head_dim")
        d = d if d is not None else fields["hidden"] // heads
        count = fields["layers"] * ((heads + 2 * kv) * d + fields["hidden"])
        notes.append(
            f"attention_bias=true: the attention's Q/K/V/O biases ({count:,} parameters) are left "
            "out (the spec's bias covers every linear, and this MLP has none)"
        )


def _decoder(cfg: dict, path: Path, family: str, notes: list[str]) -> dict:
    """Llama, Mistral, Qwen2 and Mixtral: pre-norm RMSNorm decoders with SwiGLU and RoPE."""
    _gated(cfg, path, family)
    out = {**_gqa(cfg, path, tied=False), "ffn_hidden": _int(cfg, "intermediate_size", path)}
    if family == "mixtral":
        out["num_experts"] = _int(cfg, "num_local_experts", path)
        out["top_k"] = _int(cfg, "num_experts_per_tok", path)
    return out


def _gqa(cfg: dict, path: Path, *, tied: bool) -> dict:
    """The fields every grouped-query RMSNorm/RoPE decoder below shares."""
    heads = _int(cfg, "num_attention_heads", path)
    return dict(
        hidden=_int(cfg, "hidden_size", path),
        layers=_int(cfg, "num_hidden_layers", path),
        heads=heads,
        kv_heads=_int(cfg, "num_key_value_heads", path, heads),
        **_head_dim(cfg, path),
        vocab=_int(cfg, "vocab_size", path),
        seq_len=_int(cfg, "max_position_embeddings", path),
        activation="swiglu",
        norm="rmsnorm",
        bias=False,
        position="rope",
        tied_embeddings=_flag(cfg, "tie_word_embeddings", path, tied),
        dropout=False,
    )


def _deepseek(cfg: dict, path: Path, family: str, notes: list[str]) -> dict:
    """DeepSeek-V2/V3 and Kimi K2: multi-head latent attention, DeepSeekMoE (shared experts, the
    first ``first_k_dense_replace`` blocks dense), multi-token prediction."""
    _gated(cfg, path, family)
    layers = _int(cfg, "num_hidden_layers", path)
    q_lora = cfg.get("q_lora_rank")
    out = dict(
        hidden=_int(cfg, "hidden_size", path),
        layers=layers,
        heads=_int(cfg, "num_attention_heads", path),
        ffn_hidden=_int(cfg, "intermediate_size", path),
        vocab=_int(cfg, "vocab_size", path),
        seq_len=_int(cfg, "max_position_embeddings", path),
        attention="mla",
        q_lora_rank=None if q_lora is None else _int(cfg, "q_lora_rank", path),
        kv_lora_rank=_int(cfg, "kv_lora_rank", path),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", path),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", path),
        v_head_dim=_int(cfg, "v_head_dim", path),
        activation="swiglu",
        norm="rmsnorm",
        bias=_flag(cfg, "attention_bias", path, False),
        position="rope",
        tied_embeddings=_flag(cfg, "tie_word_embeddings", path, False),
        dropout=False,
    )
    out["mtp_layers"] = _count(cfg, "num_nextn_predict_layers", path, 0)
    if cfg.get("n_routed_experts") is None:
        return out  # a dense DeepSeek: every block has the dense MLP
    first = _count(cfg, "first_k_dense_replace", path, 0)
    freq = _int(cfg, "moe_layer_freq", path, 1)
    moe = [i >= first and i % freq == 0 for i in range(layers)]
    field = f"first_k_dense_replace={first} with moe_layer_freq={freq}"
    out.update(
        num_experts=_int(cfg, "n_routed_experts", path),
        top_k=_int(cfg, "num_experts_per_tok", path),
        moe_ffn_hidden=_int(cfg, "moe_intermediate_size", path),
        **_moe_pattern(moe, field, path),
    )
    out["shared_experts"] = _count(cfg, "n_shared_experts", path, 0)
    groups, top_groups = cfg.get("n_group"), cfg.get("topk_group")
    if isinstance(groups, int) and isinstance(top_groups, int) and 0 < top_groups < groups:
        notes.append(
            f"n_group={groups}, topk_group={top_groups}: group-limited routing (a token's experts "
            f"in at most {top_groups} of {groups} expert groups) is not modelled; the expert "
            "all-to-all is costed without it"
        )
    return out


def _qwen3(cfg: dict, path: Path, family: str, notes: list[str]) -> dict:
    """Qwen3 and Qwen3-MoE: GQA with its own ``head_dim`` and per-head Q/K RMSNorm."""
    _gated(cfg, path, family)
    out = _gqa(cfg, path, tied=False)
    out.update(ffn_hidden=_int(cfg, "intermediate_size", path), qk_norm=True)
    layers = out["layers"]
    _attention_bias_note(cfg, path, out, notes)
    # transformers' Qwen3Config: sliding_window counts only with use_sliding_window, for the
    # blocks from max_window_layers on
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") is True else None
    if window is not None:
        window = _int(cfg, "sliding_window", path)
    types = _list(cfg, "layer_types", path, layers)
    field = "layer_types"
    if types is None:
        start = _count(cfg, "max_window_layers", path, 28) if window is not None else layers
        types = ["sliding_attention" if i >= start else "full_attention" for i in range(layers)]
        field = f"use_sliding_window=true with max_window_layers={start}"
    spans = {"sliding": window, "chunked": _span(cfg, "attention_chunk_size", path, None)}
    out.update(_attention_pattern(types, field, path, spans))
    if family == "qwen3_moe" and cfg.get("num_experts") not in (None, 0):
        step = _int(cfg, "decoder_sparse_step", path, 1)
        dense = _list(cfg, "mlp_only_layers", path) or []
        moe = [i not in dense and (i + 1) % step == 0 for i in range(layers)]
        field = f"mlp_only_layers={_short(dense)} with decoder_sparse_step={step}"
        out.update(
            num_experts=_int(cfg, "num_experts", path),
            top_k=_int(cfg, "num_experts_per_tok", path),
            moe_ffn_hidden=_int(cfg, "moe_intermediate_size", path),
            **_moe_pattern(moe, field, path),
        )
    return out


def _gpt_oss(cfg: dict, path: Path, family: str, notes: list[str]) -> dict:
    """GPT-OSS: every block MoE (experts of ``intermediate_size``), biased linears, every other
    block a sliding window, attention sinks."""
    _gated(cfg, path, family)
    out = _gqa(cfg, path, tied=False)
    layers = out["layers"]
    top_k_key = "num_experts_per_tok" if "num_experts_per_tok" in cfg else "experts_per_token"
    out.update(
        ffn_hidden=_int(cfg, "intermediate_size", path),
        bias=True,
        num_experts=_int(cfg, "num_local_experts", path),
        top_k=_int(cfg, top_k_key, path),
    )
    types = _list(cfg, "layer_types", path, layers)
    field = "layer_types"
    if types is None:  # transformers' GptOssConfig default: sliding, full, sliding, ...
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        field = "the default layer_types"
    spans = {
        "sliding": _span(cfg, "sliding_window", path, 128),
        "chunked": _span(cfg, "attention_chunk_size", path, None),
    }
    out.update(_attention_pattern(types, field, path, spans))
    notes.append(
        f"attention sinks (a learned logit per head and block, {out['heads'] * layers:,} "
        "parameters) are left out of the costs"
    )
    limit = cfg.get("swiglu_limit")
    if limit is not None:
        notes.append(
            f"swiglu_limit={limit}: the clamped SwiGLU is costed as SwiGLU (the clamp is one more "
            "element-wise operation)"
        )
    return out


def _llama4(cfg: dict, path: Path, family: str, notes: list[str]) -> dict:
    """Llama 4 (its ``text_config``): MoE blocks of routed experts and one shared expert of
    ``intermediate_size`` every ``interleave_moe_layer_step``-th block, dense blocks of
    ``intermediate_size_mlp``, chunked attention except every ``no_rope_layer_interval``-th
    (NoPE) block."""
    _gated(cfg, path, family)
    out = _gqa(cfg, path, tied=False)
    layers = out["layers"]
    out.update(
        ffn_hidden=_int(cfg, "intermediate_size_mlp", path),
        qk_norm=_flag(cfg, "use_qk_norm", path, True),
    )
    _attention_bias_note(cfg, path, out, notes)
    types = _list(cfg, "layer_types", path, layers)
    field = "layer_types"
    if types is None:  # transformers' Llama4TextConfig: RoPE blocks chunked, NoPE blocks full
        rope = _list(cfg, "no_rope_layers", path, layers)
        if rope:
            field = "no_rope_layers"
        else:
            every = _int(cfg, "no_rope_layer_interval", path, 4)
            rope = [int((i + 1) % every != 0) for i in range(layers)]
            field = f"no_rope_layer_interval={every}"
        types = ["chunked_attention" if r else "full_attention" for r in rope]
    spans = {
        "sliding": _span(cfg, "sliding_window", path, None),
        "chunked": _span(cfg, "attention_chunk_size", path, 8192),
    }
    out.update(_attention_pattern(types, field, path, spans))
    experts = _int(cfg, "num_local_experts", path)
    if experts > 1:
        listed = _list(cfg, "moe_layers", path)
        if listed is not None:
            moe = [i in listed for i in range(layers)]
            field = f"moe_layers={_short(listed)}"
        else:
            step = _int(cfg, "interleave_moe_layer_step", path, 1)
            moe = [i % step == step - 1 for i in range(layers)]
            field = f"interleave_moe_layer_step={step}"
        out.update(
            num_experts=experts,
            top_k=_int(cfg, "num_experts_per_tok", path),
            moe_ffn_hidden=_int(cfg, "intermediate_size", path),
            shared_experts=1,
            **_moe_pattern(moe, field, path),
        )
    return out


def _gemma3(cfg: dict, path: Path, family: str, notes: list[str]) -> dict:
    """Gemma 3 (its ``text_config``): GeGLU MLP, per-head Q/K RMSNorm, every
    ``sliding_window_pattern``-th block global, the others a sliding window; tied embeddings."""
    act = str(cfg.get("hidden_activation", "gelu_pytorch_tanh"))
    if act not in GELU:
        raise UserError(
            f"{_where(path)}: hidden_activation={act!r}; Gemma 3 is read as a gated GELU MLP "
            "(GeGLU)"
        )
    out = _gqa(cfg, path, tied=True)
    layers = out["layers"]
    out.update(ffn_hidden=_int(cfg, "intermediate_size", path), qk_norm=True)
    _attention_bias_note(cfg, path, out, notes)
    types = _list(cfg, "layer_types", path, layers)
    field = "layer_types"
    if types is None:  # transformers' Gemma3TextConfig default
        every = _int(cfg, "sliding_window_pattern", path, 6)
        types = [
            "sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)
        ]
        field = f"sliding_window_pattern={every}"
    spans = {
        "sliding": _span(cfg, "sliding_window", path, 4096),
        "chunked": _span(cfg, "attention_chunk_size", path, None),
    }
    out.update(_attention_pattern(types, field, path, spans))
    notes.append(
        f"Gemma's post-attention and post-MLP RMSNorms (4 norms per block, not 2) are left out: "
        f"{2 * out['hidden'] * layers:,} parameters and their activations"
    )
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            notes.append(f"{key}={cfg[key]}: the logit soft-capping (a tanh) is not costed")
    return out


def _gpt2(cfg: dict, path: Path, family: str, notes: list[str]) -> dict:
    act = str(cfg.get("activation_function", "gelu_new"))
    if act not in GELU:
        raise UserError(f"{_where(path)}: activation_function={act!r}; GPT-2 is read with GELU")
    hidden = _int(cfg, "n_embd", path)
    inner = cfg.get("n_inner")
    return dict(
        hidden=hidden,
        layers=_int(cfg, "n_layer", path),
        heads=_int(cfg, "n_head", path),
        ffn_hidden=4 * hidden if inner is None else _int(cfg, "n_inner", path),
        vocab=_int(cfg, "vocab_size", path),
        seq_len=_int(cfg, "n_positions", path),
        max_position=_int(cfg, "n_positions", path),
        activation="gelu",
        norm="layernorm",
        bias=True,
        position="learned",
        tied_embeddings=_flag(cfg, "tie_word_embeddings", path, True),
        dropout=_probability(cfg, "resid_pdrop", path, 0.1) > 0,
    )


def _bert(cfg: dict, path: Path, family: str, notes: list[str]) -> dict:
    act = str(cfg.get("hidden_act", "gelu"))
    if act not in GELU:
        raise UserError(f"{_where(path)}: hidden_act={act!r}; BERT is read with GELU")
    types = cfg.get("type_vocab_size", 2)
    if types != 2:
        raise UserError(
            f"{_where(path)}: type_vocab_size={types!r}; the BERT layer formulas count 2 token "
            "types (BERT-base/large)"
        )
    return dict(
        hidden=_int(cfg, "hidden_size", path),
        layers=_int(cfg, "num_hidden_layers", path),
        heads=_int(cfg, "num_attention_heads", path),
        ffn_hidden=_int(cfg, "intermediate_size", path),
        vocab=_int(cfg, "vocab_size", path),
        seq_len=_int(cfg, "max_position_embeddings", path),
        max_position=_int(cfg, "max_position_embeddings", path),
        activation="gelu",
        norm="layernorm",
        bias=True,
        position="learned",
        tied_embeddings=_flag(cfg, "tie_word_embeddings", path, True),
        dropout=_probability(cfg, "hidden_dropout_prob", path, 0.1) > 0,
        encoder=True,
    )


FAMILIES = {
    "llama": _decoder,
    "mistral": _decoder,
    "qwen2": _decoder,
    "mixtral": _decoder,
    "gpt2": _gpt2,
    "bert": _bert,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3,
    "gpt_oss": _gpt_oss,
    "llama4": _llama4,
    "llama4_text": _llama4,
    "gemma3": _gemma3,
    "gemma3_text": _gemma3,
}
MULTIMODAL = {"llama4", "gemma3"}
"""Vision-language families: their language model is the ``text_config``."""
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "MixtralForCausalLM": "mixtral",
    "GPT2LMHeadModel": "gpt2",
    "BertForPreTraining": "bert",
    "BertForMaskedLM": "bert",
    "BertModel": "bert",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GptOssForCausalLM": "gpt_oss",
    "Llama4ForConditionalGeneration": "llama4",
    "Llama4ForCausalLM": "llama4_text",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma3ForCausalLM": "gemma3_text",
}


def read_config(path_like) -> tuple[dict, Path]:
    """The parsed JSON of a ``config.json`` (a folder means its ``config.json``)."""
    if path_like is None or str(path_like).strip() == "":
        raise UserError(
            "model=hf needs model.config_path=PATH/config.json (a Hugging Face config file)"
        )
    path = Path(str(path_like)).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(
            f"{_where(path)} does not exist (relative paths are taken from the directory you ran "
            f"from, {Path.cwd()}); give the path of a Hugging Face config.json"
        )
    try:
        with path.open(encoding="utf-8") as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{_where(path)} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{_where(path)}: expected a JSON object, got {type(cfg).__name__}")
    return cfg, path


def family_of(cfg: dict, path: Path) -> str:
    model_type = cfg.get("model_type")
    if model_type in FAMILIES:
        return model_type
    for arch in cfg.get("architectures") or []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    shown = model_type if model_type is not None else (cfg.get("architectures") or ["?"])[0]
    raise UserError(
        f"{_where(path)}: model_type={shown!r} is not supported; supported families: "
        f"{', '.join(sorted(FAMILIES))}"
    )


def default_name(cfg: dict, path: Path) -> str:
    """``_name_or_path``, else the folder of a ``config.json`` (``org/name`` in a Hugging Face
    cache), else the file's stem."""
    given = cfg.get("_name_or_path")
    if isinstance(given, str) and given.strip():
        return given.strip()
    if path.name != "config.json":
        return path.stem
    folder = path.resolve().parent
    repo = folder.parent.parent.name  # .../models--org--name/snapshots/<revision>/config.json
    if folder.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return folder.name or path.stem


def _training_seq_len(
    cfg: dict, path: Path, family: str, fields: dict, name: str, seq_len
) -> tuple[int, str, tuple[str, ...]]:
    """The training length, the rule that gave it, and the notice to print (module docstring)."""
    key = "n_positions" if family == "gpt2" else "max_position_embeddings"
    context = fields["seq_len"]
    learned = fields.get("position") == "learned"
    if seq_len is not None:
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
            raise UserError(f"model.seq_len={seq_len!r} must be a positive integer")
        if learned and seq_len > context:
            raise UserError(
                f"model.seq_len={seq_len} exceeds {_where(path)}'s {key}={context} (a learned "
                f"position table has {context} rows); use model.seq_len <= {context}"
            )
        notes = ()
        if seq_len > context:
            notes = (
                f"model.seq_len={seq_len:,} is beyond {name}'s {key} of {context:,} (the longest "
                "context it was built for)",
            )
        return seq_len, "model.seq_len", notes
    rope = cfg.get("rope_scaling")
    original = rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None
    if isinstance(original, int) and not isinstance(original, bool) and 0 < original < context:
        chosen = original
        rule = "its pre-training context, rope_scaling.original_max_position_embeddings"
    elif context > DEFAULT_TRAINING_SEQ_LEN:
        chosen, rule = DEFAULT_TRAINING_SEQ_LEN, "the default training length"
    else:
        return context, f"the config's {key}", ()
    notice = (
        f"model.seq_len not set: {name} is planned at {chosen:,} tokens per sequence ({rule}), "
        f"not at its {key} of {context:,}; set model.seq_len=N to plan another training length"
    )
    return chosen, f"{rule}; the config's {key} is {context:,}", (notice,)


def load_hf_model(path_like, *, name: str | None = None, seq_len: int | None = None) -> HfModel:
    """The spec of a Hugging Face config file, named and with its training length chosen as the
    module docstring says."""
    cfg, path = read_config(path_like)
    family = family_of(cfg, path)
    model_cfg, notes = _language_model(cfg, path, family)
    fields = FAMILIES[family](model_cfg, path, family, notes)
    name = name or default_name(cfg, path)
    fields["seq_len"], source, seq_notes = _training_seq_len(
        model_cfg, path, family, fields, name, seq_len
    )
    spec = ModelSpec(name=name, **fields)
    return HfModel(spec=spec, seq_len_source=source, notes=(*seq_notes, *notes))


def _language_model(cfg: dict, path: Path, family: str) -> tuple[dict, list[str]]:
    """The part of the config that describes the language model: a vision-language config's
    ``text_config`` (with the top level's ``tie_word_embeddings`` when the text part has none),
    else the whole config; and the notice that the vision tower is left out."""
    if family not in MULTIMODAL:
        return cfg, []
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise UserError(
            f"{_where(path)}: model_type={family!r} keeps its language model in text_config, "
            f"which is {_short(text)}; give the full config.json (or the {family}_text config)"
        )
    inherited = {k: cfg[k] for k in ("tie_word_embeddings",) if k in cfg}
    note = (
        f"model_type={family!r} is a vision-language model: its text_config (the language model) "
        "is planned; the vision encoder and projector are left out"
    )
    return {**inherited, **text}, [note]


def spec_from_hf_config(
    path_like, *, name: str | None = None, seq_len: int | None = None
) -> ModelSpec:
    """The spec of a Hugging Face config file (:func:`load_hf_model` without the provenance)."""
    return load_hf_model(path_like, name=name, seq_len=seq_len).spec
