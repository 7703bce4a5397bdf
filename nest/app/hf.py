"""A :class:`~nest.core.model.ModelSpec` from a Hugging Face ``config.json`` (JSON only, never
code).

``model=hf model.config_path=PATH`` reads the file with :func:`json.load` and nothing else: no
``transformers`` import, no ``trust_remote_code``, no file of the model folder but ``config.json``.
The family is taken from ``model_type`` (falling back to the first ``architectures`` entry); the
fields read per family are in :data:`FAMILIES` and :func:`_decoder` / :func:`_gpt2` / :func:`_bert`:

=========  ========================================================================================
family     fields (Hugging Face name -> ModelSpec field)
=========  ========================================================================================
llama,     hidden_size -> hidden, num_hidden_layers -> layers, num_attention_heads -> heads,
mistral,   num_key_value_heads -> kv_heads (absent: heads), intermediate_size -> ffn_hidden,
qwen2,     vocab_size -> vocab, tie_word_embeddings -> tied_embeddings (absent: false, the
mixtral    transformers default of these classes), hidden_act silu -> SwiGLU, RMSNorm, RoPE, no
           biases; Mixtral: num_local_experts -> num_experts, num_experts_per_tok -> top_k
gpt2       n_embd, n_layer, n_head, n_inner (null: 4 n_embd), vocab_size, n_positions; GELU,
           LayerNorm, biases, learned positions, tied embeddings, dropout if resid_pdrop > 0
bert       hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
           max_position_embeddings, type_vocab_size (must be 2); GELU, LayerNorm, biases,
           learned positions, tied MLM decoder, pooler, dropout if hidden_dropout_prob > 0
=========  ========================================================================================

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
``seq_len`` (equal when ``seq_len <= sliding_window``).
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
    """One-line notices for the user (a sequence length the config did not state as trained)."""


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


def _check_head_dim(cfg: dict, path: Path, hidden: int, heads: int) -> None:
    head_dim = _int(cfg, "head_dim", path) if cfg.get("head_dim") is not None else None
    if head_dim is not None and head_dim * heads != hidden:
        raise UserError(
            f"{_where(path)}: head_dim={head_dim} x num_attention_heads={heads} != "
            f"hidden_size={hidden}; decoupled head sizes are not supported (the layer formulas "
            "assume head_dim = hidden / heads)"
        )


def _decoder(cfg: dict, path: Path, family: str) -> dict:
    """Llama, Mistral, Qwen2 and Mixtral: pre-norm RMSNorm decoders with SwiGLU and RoPE."""
    act = str(cfg.get("hidden_act", "silu"))
    if act not in GATED:
        raise UserError(
            f"{_where(path)}: hidden_act={act!r}; the {family} family is read as a gated SiLU MLP "
            "(SwiGLU), so only silu is supported"
        )
    hidden = _int(cfg, "hidden_size", path)
    heads = _int(cfg, "num_attention_heads", path)
    _check_head_dim(cfg, path, hidden, heads)
    out = dict(
        hidden=hidden,
        layers=_int(cfg, "num_hidden_layers", path),
        heads=heads,
        kv_heads=_int(cfg, "num_key_value_heads", path, heads),
        ffn_hidden=_int(cfg, "intermediate_size", path),
        vocab=_int(cfg, "vocab_size", path),
        seq_len=_int(cfg, "max_position_embeddings", path),
        activation="swiglu",
        norm="rmsnorm",
        bias=False,
        position="rope",
        tied_embeddings=_flag(cfg, "tie_word_embeddings", path, False),
        dropout=False,
    )
    if family == "mixtral":
        out["num_experts"] = _int(cfg, "num_local_experts", path)
        out["top_k"] = _int(cfg, "num_experts_per_tok", path)
    return out


def _gpt2(cfg: dict, path: Path, family: str) -> dict:
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


def _bert(cfg: dict, path: Path, family: str) -> dict:
    act = str(cfg.get("hidden_act", "gelu"))
    if act not in GELU:
        raise UserError(f"{_where(path)}: hidden_act={act!r}; BERT is read with GELU")
    types = cfg.get("type_vocab_size", 2)
    if types != 2:
        raise UserError(
            f"{_where(path)}: type_vocab_size={types!r}; the BERT layer formulas count 2 token "
            "types (BERT-base/large)"
        )
    hidden = _int(cfg, "hidden_size", path)
    heads = _int(cfg, "num_attention_heads", path)
    _check_head_dim(cfg, path, hidden, heads)
    return dict(
        hidden=hidden,
        layers=_int(cfg, "num_hidden_layers", path),
        heads=heads,
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
}
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "MixtralForCausalLM": "mixtral",
    "GPT2LMHeadModel": "gpt2",
    "BertForPreTraining": "bert",
    "BertForMaskedLM": "bert",
    "BertModel": "bert",
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
    fields = FAMILIES[family](cfg, path, family)
    name = name or default_name(cfg, path)
    fields["seq_len"], source, notes = _training_seq_len(cfg, path, family, fields, name, seq_len)
    return HfModel(spec=ModelSpec(name=name, **fields), seq_len_source=source, notes=notes)


def spec_from_hf_config(
    path_like, *, name: str | None = None, seq_len: int | None = None
) -> ModelSpec:
    """The spec of a Hugging Face config file (:func:`load_hf_model` without the provenance)."""
    return load_hf_model(path_like, name=name, seq_len=seq_len).spec
