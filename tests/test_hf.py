"""``model=hf``: Hugging Face config.json files read as JSON into the analytic model.

Published sizes (the model cards / papers, as cited in data/README.md):
- Llama-2 7B: 6,738,415,616 parameters (Hugging Face meta-llama/Llama-2-7b-hf, safetensors 6.74B).
- Mistral 7B v0.1: 7.24B (Hugging Face mistralai/Mistral-7B-v0.1, safetensors 7.24B).
- Mixtral 8x7B: 46.7B total, 12.9B active (Mistral AI, "Mixtral of experts", Dec 2023).
- Qwen2-0.5B: 0.49B, 0.35B non-embedding (Qwen2 technical report, arXiv 2407.10671, Table 1).
- GPT-2 small: 124M (Hugging Face openai-community/gpt2, "124M parameters").
- BERT-base: 110M (Devlin et al. 2019, §3).
- Llama-3.1-8B: 8.03B (Hugging Face meta-llama/Llama-3.1-8B, safetensors 8.03B).
- Qwen2.5-7B: 7.61B, 6.53B non-embedding (Hugging Face Qwen/Qwen2.5-7B model card).
- DeepSeek-V3: 671B main model (the MTP module's 14B besides; deepseek-ai/DeepSeek-V3 README).
- Kimi K2: 1T total, 32B activated (MoonshotAI/Kimi-K2 README).
- Qwen3-235B-A22B: 235B / 22B activated; Qwen3-30B-A3B: 30.5B / 3.3B; Qwen3-32B: 32.8B (model
  cards).
- gpt-oss-120b: 116.8B total / 5.1B active; gpt-oss-20b: 20.9B / 3.6B; active counts leave out
  the input embedding (gpt-oss model card, arXiv 2508.10925).
- Llama 4 Maverick: 400B total / 17B active; Scout: 17B active (its 109B total includes the
  vision encoder; meta-llama/llama-models MODEL_CARD.md).
- Gemma 3 27B: 27B (Gemma 3 technical report, arXiv 2503.19786).
Their config.json field values, and how each maps to the spec, are in data/README.md.
"""

import dataclasses
import json
from pathlib import Path

import pytest

import nest.app.cli
from nest.app.hf import DEFAULT_TRAINING_SEQ_LEN, FAMILIES, load_hf_model, spec_from_hf_config
from nest.app.results import ROW_FILE, run_recorded
from nest.core.errors import UserError
from nest.core.layers import AnalyticModel

from .test_cli import compose, run_case

DATA = Path(nest.app.cli.CONF_DIR).parent / "data" / "hf"

PUBLISHED = {
    # file: (published parameters, relative tolerance the published rounding allows); the main
    # model, without its multi-token-prediction modules (DeepSeek-V3 states them apart)
    "llama2_7b.json": (6_738_415_616, 1e-9),
    "mistral_7b.json": (7.24e9, 0.005),
    "mixtral_8x7b.json": (46.7e9, 0.005),
    "qwen2_0.5b.json": (0.49e9, 0.01),
    "gpt2.json": (124e6, 0.005),
    "bert_base_uncased.json": (110e6, 0.01),
    "llama3.1_8b.json": (8.03e9, 0.001),
    "qwen2.5_7b.json": (7.61e9, 0.001),
    # the new ones: half a unit of the published figure's last digit
    "deepseek_v3.json": (671e9, 0.5 / 671),
    "kimi_k2.json": (1e12, 0.05),  # "1T"
    "qwen3_235b_a22b.json": (235e9, 0.5 / 235),
    "qwen3_30b_a3b.json": (30.5e9, 0.05 / 30.5),
    "qwen3_32b.json": (32.8e9, 0.05 / 32.8),
    "gpt_oss_120b.json": (116.8e9, 0.05 / 116.8),
    "gpt_oss_20b.json": (20.9e9, 0.05 / 20.9),
    "llama4_maverick.json": (400e9, 5 / 400),  # "400B": the nearest ten billion
    "gemma3_27b.json": (27e9, 0.5 / 27),
}
ACTIVE = {
    # file: (published activated parameters, half a unit of its last digit, whether it counts the
    # input embedding); DeepSeek-V3's 37B, Kimi K2's 32B and Qwen3-30B-A3B's 3.3B are left out:
    # neither convention reproduces them within their rounding (37.6 / 36.6, 32.9 / 31.7, 3.35
    # / 3.04), the cards do not say which parameters they count
    "mixtral_8x7b.json": (12.9e9, 0.05 / 12.9, True),
    "qwen3_235b_a22b.json": (22e9, 0.5 / 22, True),
    "gpt_oss_120b.json": (5.1e9, 0.05 / 5.1, False),
    "gpt_oss_20b.json": (3.6e9, 0.05 / 3.6, False),
    "llama4_maverick.json": (17e9, 0.5 / 17, True),
    "llama4_scout.json": (17e9, 0.5 / 17, True),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_sizes(name):
    published, tol = PUBLISHED[name]
    model = AnalyticModel(spec_from_hf_config(DATA / name))
    assert model.total_params() - model.mtp_params() == pytest.approx(published, rel=tol)


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_activated_parameters_match_the_published_counts(name):
    published, tol, with_input_embedding = ACTIVE[name]
    spec = spec_from_hf_config(DATA / name)
    active = AnalyticModel(spec).active_params()
    if not with_input_embedding:
        active -= spec.vocab * spec.hidden
    assert active == pytest.approx(published, rel=tol)


def test_every_shipped_config_is_tested():
    assert {p.name for p in DATA.glob("*.json")} == set(PUBLISHED) | set(ACTIVE)


def test_qwen2_non_embedding_and_mixtral_active_parameters():
    """Qwen2-0.5B: 0.35B without embeddings (tied: one V x h table); Mixtral: 12.9B active."""
    qwen = spec_from_hf_config(DATA / "qwen2_0.5b.json")
    q = AnalyticModel(qwen)
    non_embedding = q.total_params() - qwen.vocab * qwen.hidden
    assert non_embedding == pytest.approx(0.35e9, rel=0.03)
    mix = spec_from_hf_config(DATA / "mixtral_8x7b.json")
    m = AnalyticModel(mix)
    expert_mlp = 3 * mix.hidden * mix.ffn_hidden
    active = m.total_params() - mix.layers * (mix.num_experts - mix.top_k) * expert_mlp
    assert active == pytest.approx(12.9e9, rel=0.005)


def test_fields_map_to_the_spec():
    s = spec_from_hf_config(DATA / "mixtral_8x7b.json")
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.ffn_hidden, s.vocab) == (
        4096,
        32,
        32,
        8,
        14336,
        32000,
    )
    assert (s.num_experts, s.top_k, s.activation, s.norm, s.position) == (
        8,
        2,
        "swiglu",
        "rmsnorm",
        "rope",
    )
    assert not s.tied_embeddings
    g = spec_from_hf_config(DATA / "gpt2.json")
    assert (g.ffn_hidden, g.tied_embeddings, g.position, g.max_position) == (
        3072,
        True,
        "learned",
        1024,
    )
    b = spec_from_hf_config(DATA / "bert_base_uncased.json", seq_len=128)
    assert b.encoder and b.seq_len == 128 and b.max_position == 512
    assert spec_from_hf_config(DATA / "qwen2_0.5b.json").tied_embeddings


def test_the_hf_llama2_equals_the_llama2_preset(tmp_path):
    """The preset was written from the same model card: same plan, same iteration time."""
    _, _, hf, _, _ = run_case(
        tmp_path / "hf", "model=hf", f"model.config_path={DATA / 'llama2_7b.json'}"
    )
    _, _, preset, _, _ = run_case(tmp_path / "preset", "model=llama2_7b")
    assert hf["status"] == preset["status"] == "feasible"
    assert hf["plan"] == preset["plan"]
    assert hf["iteration_time_s"] == preset["iteration_time_s"]
    assert hf["model"] == "meta-llama/Llama-2-7b-hf"


def test_seq_len_override_from_the_command_line(tmp_path):
    cfg = compose("model=hf", f"model.config_path={DATA / 'mistral_7b.json'}", "model.seq_len=4096")
    from nest.app.config import build_problem

    assert build_problem(cfg).model.seq_len == 4096


def _write(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_unknown_architecture_is_one_line_listing_the_supported_families(tmp_path):
    path = _write(tmp_path, {"model_type": "falcon", "architectures": ["FalconForCausalLM"]})
    with pytest.raises(UserError) as err:
        spec_from_hf_config(path)
    msg = str(err.value)
    assert "\n" not in msg and "'falcon'" in msg
    for family in FAMILIES:
        assert family in msg
    result, lines = run_case_lines(tmp_path, "model=hf", f"model.config_path={tmp_path}")
    assert result["status"] == "error" and lines == [f"error: {result['error']}"]


def run_case_lines(tmp_path, *overrides):
    lines: list[str] = []
    result = nest.app.cli.run(compose(*overrides), tmp_path / "out", echo=lines.append)
    return result, lines


@pytest.mark.parametrize(
    "cfg, needle",
    [
        ({"model_type": "llama", "hidden_size": 64}, "no 'num_attention_heads'"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 100,
                "max_position_embeddings": 64,
                "hidden_act": "gelu",
            },
            "hidden_act='gelu'",
        ),
        ({"model_type": "bert", "hidden_size": -1}, "hidden_size=-1"),
    ],
)
def test_bad_configs_are_one_line_errors(tmp_path, cfg, needle):
    with pytest.raises(UserError) as err:
        spec_from_hf_config(_write(tmp_path, cfg))
    assert needle in str(err.value) and "\n" not in str(err.value)


def _shipped(name: str, **change) -> dict:
    return {**json.loads((DATA / name).read_text()), **change}


@pytest.mark.parametrize(
    "cfg, needle",
    [
        (
            _shipped("gpt2.json", resid_pdrop="0.1"),
            "resid_pdrop='0.1' must be a number from 0 to 1 (a dropout probability",
        ),
        (
            _shipped("bert_base_uncased.json", hidden_dropout_prob="none"),
            "hidden_dropout_prob='none' must be a number from 0 to 1",
        ),
        (_shipped("bert_base_uncased.json", hidden_dropout_prob=1.5), "hidden_dropout_prob=1.5"),
        (_shipped("gpt2.json", resid_pdrop=True), "resid_pdrop=True must be a number"),
        (
            _shipped("llama2_7b.json", tie_word_embeddings="false"),
            "tie_word_embeddings='false' must be true or false (a JSON boolean; false when absent)",
        ),
        (_shipped("llama2_7b.json", head_dim="128"), "head_dim='128' must be a positive integer"),
    ],
)
def test_wrongly_typed_fields_are_one_line_errors_naming_field_and_value(tmp_path, cfg, needle):
    path = _write(tmp_path, cfg)
    with pytest.raises(UserError) as err:
        spec_from_hf_config(path)
    message = str(err.value)
    assert message.startswith(f"model.config_path={path}: ") and needle in message
    assert "\n" not in message
    result, lines = run_case_lines(tmp_path, "model=hf", f"model.config_path={path}")
    assert result["status"] == "error" and lines == [f"error: {message}"]


def test_dropout_probabilities_are_read_as_numbers(tmp_path):
    def dropout(cfg: dict) -> bool:
        return spec_from_hf_config(_write(tmp_path, cfg)).dropout

    assert dropout(_shipped("gpt2.json", resid_pdrop=0)) is False
    assert dropout(_shipped("gpt2.json", resid_pdrop=0.1)) is True
    no_key = {k: v for k, v in _shipped("gpt2.json").items() if k != "resid_pdrop"}
    assert dropout(no_key) is True  # transformers' default: 0.1


def test_missing_file_and_missing_path(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        spec_from_hf_config(tmp_path / "nope" / "config.json")
    with pytest.raises(UserError, match="model.config_path"):
        spec_from_hf_config(None)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        spec_from_hf_config(tmp_path / "bad.json")


def test_no_code_from_the_model_folder_runs(tmp_path):
    """A config that asks for remote code is still read as data: the folder's module never runs."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    cfg = json.loads((DATA / "llama2_7b.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    spec = spec_from_hf_config(_write(tmp_path, cfg))
    assert spec.hidden == 4096
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------
# The training length and the name: never a silent choice
# ------------------------------------------------------------------------------------------------


def _published(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_a_long_context_config_is_planned_at_a_training_length_with_a_notice():
    """Qwen2.5-7B accepts 131,072 tokens; without model.seq_len it is planned at the default
    training length and says so; Llama-3.1-8B states its pre-training context (rope_scaling)."""
    qwen_cfg = _published("qwen2.5_7b.json")
    qwen = load_hf_model(DATA / "qwen2.5_7b.json")
    assert qwen_cfg["max_position_embeddings"] > DEFAULT_TRAINING_SEQ_LEN
    assert qwen.spec.seq_len == DEFAULT_TRAINING_SEQ_LEN
    (notice,) = qwen.notes
    assert "model.seq_len" in notice and f"{qwen_cfg['max_position_embeddings']:,}" in notice
    assert "\n" not in notice and "default training length" in qwen.seq_len_source

    llama_cfg = _published("llama3.1_8b.json")
    llama = load_hf_model(DATA / "llama3.1_8b.json")
    pretrain = llama_cfg["rope_scaling"]["original_max_position_embeddings"]
    assert pretrain < llama_cfg["max_position_embeddings"]
    assert llama.spec.seq_len == pretrain and len(llama.notes) == 1
    assert "original_max_position_embeddings" in llama.seq_len_source

    # a config whose context is a training length: used as is, silently
    llama2 = load_hf_model(DATA / "llama2_7b.json")
    assert llama2.spec.seq_len == _published("llama2_7b.json")["max_position_embeddings"]
    assert llama2.notes == () and llama2.seq_len_source == "the config's max_position_embeddings"


def test_model_seq_len_is_the_users_training_length():
    got = load_hf_model(DATA / "qwen2.5_7b.json", seq_len=32768)
    assert (got.spec.seq_len, got.seq_len_source, got.notes) == (32768, "model.seq_len", ())
    beyond = load_hf_model(DATA / "llama2_7b.json", seq_len=8192)  # RoPE: runs, but says so
    assert beyond.spec.seq_len == 8192 and "beyond" in beyond.notes[0]
    with pytest.raises(UserError, match="model.seq_len=2048 exceeds .*n_positions=1024"):
        load_hf_model(DATA / "gpt2.json", seq_len=2048)  # learned positions: 1024 rows


def test_the_run_prints_and_records_the_length_and_where_it_came_from(tmp_path):
    _, result, report, _, lines = run_case(
        tmp_path, "model=hf", f"model.config_path={DATA / 'qwen2.5_7b.json'}"
    )
    assert report["seq_len"] == DEFAULT_TRAINING_SEQ_LEN
    assert "default training length" in report["seq_len_source"]
    summary = lines[0].splitlines()
    assert f"sequence length {DEFAULT_TRAINING_SEQ_LEN:,} tokens (" in summary[1]
    assert any(line.startswith("note: model.seq_len not set: ") for line in summary)
    # tokens/s are the evaluator's samples/s times the length in use
    assert report["tokens_per_s"] == pytest.approx(
        report["throughput_samples_per_s"] * DEFAULT_TRAINING_SEQ_LEN, rel=1e-12
    )
    qwen = f"model.config_path={DATA / 'qwen2.5_7b.json'}"
    cfg = compose("model=hf", qwen, "print_summary=false")
    run_recorded(nest.app.cli.run, cfg, tmp_path / "row")
    row = json.loads((tmp_path / "row" / ROW_FILE).read_text())
    assert (row["model"], row["seq_len"]) == ("qwen2.5_7b", DEFAULT_TRAINING_SEQ_LEN)


def test_a_config_without_name_or_path_is_named_after_its_file(tmp_path):
    """Published hub configs carry no _name_or_path: the model is named after the file, its
    folder (config.json), or the repository of a Hugging Face cache snapshot; never 'hf'."""
    published = _published("qwen2.5_7b.json")
    assert "_name_or_path" not in published
    assert load_hf_model(DATA / "qwen2.5_7b.json").spec.name == "qwen2.5_7b"
    folder = tmp_path / "Qwen2.5-7B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(published))
    assert load_hf_model(folder).spec.name == "Qwen2.5-7B"
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B" / "snapshots" / "a09a3545"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(published))
    assert load_hf_model(snapshot / "config.json").spec.name == "Qwen/Qwen2.5-7B"
    assert load_hf_model(folder, name="mine").spec.name == "mine"
    _, result, report, _, lines = run_case(
        tmp_path / "run", "model=hf", f"model.config_path={DATA / 'qwen2.5_7b.json'}"
    )
    assert result["model"] == report["model"] == "qwen2.5_7b"
    assert lines[0].splitlines()[0].split(": ")[1].startswith("qwen2.5_7b on ")


# ------------------------------------------------------------------------------------------------
# MLA, MoE layouts, head widths and local attention: the families of the newer configs
# ------------------------------------------------------------------------------------------------

_DSV3 = dict(
    hidden=7168,
    layers=61,
    heads=128,
    kv_heads=None,  # MLA: num_key_value_heads is not a GQA group count
    ffn_hidden=18432,
    vocab=129280,
    attention="mla",
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    num_experts=256,
    top_k=8,
    moe_ffn_hidden=2048,
    shared_experts=1,  # n_shared_experts x moe_intermediate_size
    shared_ffn_hidden=None,
    first_dense_layers=3,  # first_k_dense_replace
    moe_layer_freq=1,
    mtp_layers=1,  # num_nextn_predict_layers
    window=None,
    qk_norm=False,
    bias=False,
    tied_embeddings=False,
    seq_len=4096,  # rope_scaling.original_max_position_embeddings
)
_QWEN3 = dict(qk_norm=True, bias=False, tied_embeddings=False, window=None, seq_len=4096)
_GPT_OSS = dict(
    hidden=2880,
    heads=64,
    kv_heads=8,
    head_dim=64,
    ffn_hidden=2880,
    moe_ffn_hidden=None,  # the experts are intermediate_size wide
    vocab=201088,
    top_k=4,
    bias=True,  # attention_bias, and the experts' biases
    window=128,
    local_attention="sliding",
    global_every=2,  # layer_types: sliding, full, sliding, ...
    qk_norm=False,
    tied_embeddings=False,
    seq_len=4096,
)
_LLAMA4 = dict(
    hidden=5120,
    layers=48,
    heads=40,
    kv_heads=8,
    head_dim=128,
    ffn_hidden=16384,  # intermediate_size_mlp: the dense blocks
    moe_ffn_hidden=8192,  # intermediate_size: each routed expert and the shared one
    shared_experts=1,
    vocab=202048,
    top_k=1,
    window=8192,  # attention_chunk_size
    local_attention="chunked",
    global_every=4,  # every 4th block is NoPE with full attention
    tied_embeddings=False,
)
EXPECTED = {
    # the field values of data/README.md's configs (notes: HF config.json field tables), mapped
    "deepseek_v3.json": _DSV3,
    "kimi_k2.json": {
        **_DSV3,
        "heads": 64,
        "vocab": 163840,
        "num_experts": 384,
        "first_dense_layers": 1,
        "mtp_layers": 0,
    },
    "qwen3_235b_a22b.json": dict(
        _QWEN3,
        hidden=4096,
        layers=94,
        heads=64,
        kv_heads=4,
        head_dim=128,  # 64 x 128 = 8192 != hidden 4096
        ffn_hidden=12288,
        vocab=151936,
        num_experts=128,
        top_k=8,
        moe_ffn_hidden=1536,
        first_dense_layers=0,
        moe_layer_freq=1,  # decoder_sparse_step 1, mlp_only_layers []
        shared_experts=0,
    ),
    "qwen3_30b_a3b.json": dict(
        _QWEN3,
        hidden=2048,
        layers=48,
        heads=32,
        kv_heads=4,
        head_dim=128,
        ffn_hidden=6144,
        vocab=151936,
        num_experts=128,
        top_k=8,
        moe_ffn_hidden=768,
    ),
    "qwen3_32b.json": dict(
        _QWEN3,
        hidden=5120,
        layers=64,
        heads=64,
        kv_heads=8,
        head_dim=128,
        ffn_hidden=25600,
        vocab=151936,
        num_experts=1,
    ),
    "gpt_oss_120b.json": dict(_GPT_OSS, layers=36, num_experts=128),
    "gpt_oss_20b.json": dict(_GPT_OSS, layers=24, num_experts=32),
    "llama4_maverick.json": dict(
        _LLAMA4,
        num_experts=128,
        moe_layer_freq=2,  # interleave_moe_layer_step 2: blocks 1, 3, 5, ... are MoE
        moe_layer_phase=1,
        qk_norm=False,
        seq_len=4096,  # no pre-training context stated: the default
    ),
    "llama4_scout.json": dict(
        _LLAMA4,
        num_experts=16,
        moe_layer_freq=1,
        moe_layer_phase=0,
        qk_norm=True,  # use_qk_norm
        seq_len=8192,  # rope_scaling.original_max_position_embeddings
    ),
    "gemma3_27b.json": dict(
        hidden=5376,
        layers=62,
        heads=32,
        kv_heads=16,
        head_dim=128,
        ffn_hidden=21504,
        vocab=262144,
        activation="swiglu",  # GeGLU: gated, three matrices, as SwiGLU
        window=1024,
        local_attention="sliding",
        global_every=6,  # sliding_window_pattern
        qk_norm=True,
        tied_embeddings=True,
        num_experts=1,
        seq_len=4096,
    ),
}
PRESET_DIFFERENCES = {
    # file: {field: why the shipped config and the preset differ}
    "gemma3_27b.json": {
        "vocab": "MaxText's copy of the config: 262144; the checkpoint's embedding: 262208 rows"
    },
}


def test_every_shipped_config_of_the_newer_families_is_expected():
    newer = {"deepseek_v2", "deepseek_v3", "kimi_k2", "qwen3", "qwen3_moe", "gpt_oss", "llama4"}
    newer |= {"llama4_text", "gemma3", "gemma3_text"}
    shipped = {p.name for p in DATA.glob("*.json") if _published(p.name)["model_type"] in newer}
    assert shipped == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_newer_configs_map_field_by_field(name):
    spec = spec_from_hf_config(DATA / name)
    got = {k: getattr(spec, k) for k in EXPECTED[name]}
    assert got == EXPECTED[name]
    assert (spec.norm, spec.position, spec.activation) == ("rmsnorm", "rope", "swiglu")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_newer_configs_equal_their_model_presets(name):
    """A config and the conf/model preset written from the same model card give the same spec
    (the preset's seq_len is the published pre-training length, the reader's by its rule)."""
    preset_file = Path(nest.app.cli.CONF_DIR) / "model" / f"{Path(name).stem}.yaml"
    if not preset_file.exists():
        pytest.skip(f"no preset {preset_file.name}")
    from nest.app.config import build_model_spec

    preset = build_model_spec(compose(f"model={Path(name).stem}").model)
    spec = spec_from_hf_config(DATA / name)
    differ = PRESET_DIFFERENCES.get(name, {})
    unchanged = {k: getattr(preset, k) for k in differ}
    spec = dataclasses.replace(spec, name=preset.name, seq_len=preset.seq_len, **unchanged)
    assert spec == preset
    for field in differ:
        assert getattr(spec_from_hf_config(DATA / name), field) != getattr(preset, field)


def _text_only(tmp_path: Path, name: str) -> Path:
    """The ``text_config`` of a vision-language config, as the ``*_text`` model's own config."""
    return _write(tmp_path, json.loads((DATA / name).read_text())["text_config"])


@pytest.mark.parametrize("name", ["llama4_scout.json", "gemma3_27b.json"])
def test_a_text_only_config_reads_as_the_text_config_of_the_full_one(tmp_path, name):
    full = load_hf_model(DATA / name)
    text = load_hf_model(_text_only(tmp_path, name), name=full.spec.name)
    assert text.spec == full.spec
    vision = [n for n in full.notes if "vision-language" in n]
    assert len(vision) == 1 and not any("vision" in n for n in text.notes)


def test_deepseek_v2_and_the_architectures_fallback(tmp_path):
    """deepseek_v2 reads as deepseek_v3 does (a full-rank query when q_lora_rank is null, as
    DeepSeek-V2-Lite); a config without model_type goes by its architectures."""
    cfg = _shipped("deepseek_v3.json", model_type="deepseek_v2", q_lora_rank=None)
    del cfg["num_nextn_predict_layers"]
    spec = spec_from_hf_config(_write(tmp_path, cfg))
    assert (spec.attention, spec.q_lora_rank, spec.mtp_layers) == ("mla", None, 0)
    no_type = {k: v for k, v in _shipped("kimi_k2.json").items() if k != "model_type"}
    assert spec_from_hf_config(_write(tmp_path, no_type)).num_experts == 384


def test_moe_and_attention_patterns_the_spec_can_express(tmp_path):
    def read(name, **change):
        return spec_from_hf_config(_write(tmp_path, _shipped(name, **change)))

    first_two = read("qwen3_30b_a3b.json", mlp_only_layers=[0, 1])
    assert (first_two.first_dense_layers, first_two.moe_layer_freq) == (2, 1)
    every_2nd = read("qwen3_30b_a3b.json", decoder_sparse_step=2)  # (i + 1) % 2 == 0: odd blocks
    assert (every_2nd.moe_layer_freq, every_2nd.moe_layer_phase) == (2, 1)
    listed = _shipped("llama4_maverick.json")
    listed["text_config"]["moe_layers"] = list(range(1, 48, 2))
    del listed["text_config"]["interleave_moe_layer_step"]
    spec = spec_from_hf_config(_write(tmp_path, listed))
    assert (spec.moe_layer_freq, spec.moe_layer_phase) == (2, 1)
    sliding = read(
        "qwen3_32b.json", use_sliding_window=True, sliding_window=4096, max_window_layers=0
    )
    assert (sliding.window, sliding.global_every) == (4096, 0)  # every block local
    unused = read("qwen3_32b.json", sliding_window=4096)  # use_sliding_window false
    assert unused.window is None
    full = read("gpt_oss_20b.json", layer_types=["full_attention"] * 24)
    assert full.window is None


def _maverick_with(**text_change) -> dict:
    cfg = _shipped("llama4_maverick.json")
    cfg["text_config"] = {**cfg["text_config"], **text_change}
    return cfg


@pytest.mark.parametrize(
    "cfg, needle",
    [
        (
            _shipped("qwen3_30b_a3b.json", mlp_only_layers=[5]),
            "mlp_only_layers=[5] with decoder_sparse_step=1 makes blocks [0-4, 6-47] MoE",
        ),
        (_maverick_with(moe_layers=[1, 2, 3]), "moe_layers=[1, 2, 3] makes blocks [1-3] MoE"),
        (
            _shipped(
                "gpt_oss_20b.json",
                layer_types=["full_attention", "full_attention"] + ["sliding_attention"] * 22,
            ),
            "layer_types makes blocks [0-1] global; nest expresses global blocks only as every",
        ),
        (
            _shipped("gpt_oss_20b.json", layer_types=[{"type": "full"}] * 24),
            "layer_types has {'type': 'full'}; nest reads full_attention",
        ),
        (
            _shipped("gpt_oss_20b.json", layer_types=["linear_attention"] * 24),
            "layer_types has 'linear_attention'; nest reads full_attention, sliding_attention",
        ),
        (
            _shipped("gpt_oss_20b.json", layer_types=["full_attention"] * 23),
            "must be a list of 24 entries (one per block)",
        ),
        (
            _maverick_with(
                sliding_window=1024,
                layer_types=["sliding_attention", "chunked_attention"] * 24,
            ),
            "layer_types mixes sliding and chunked blocks",
        ),
        (
            _shipped(
                "qwen3_32b.json",
                use_sliding_window=True,
                sliding_window=4096,
                max_window_layers=60,
            ),
            "use_sliding_window=true with max_window_layers=60 makes blocks [0-59] global",
        ),
        (_shipped("gemma3_27b.json", text_config=None), "keeps its language model in text_config"),
        (_shipped("qwen3_235b_a22b.json", head_dim=0), "head_dim=0 must be a positive integer"),
        (
            _shipped("deepseek_v3.json", first_k_dense_replace=61),
            "first_k_dense_replace=61 with moe_layer_freq=1 leaves no MoE block among the 61",
        ),
    ],
)
def test_patterns_nest_cannot_express_are_one_line_refusals(tmp_path, cfg, needle):
    path = _write(tmp_path, cfg)
    with pytest.raises(UserError) as err:
        spec_from_hf_config(path)
    message = str(err.value)
    assert message.startswith(f"model.config_path={path}: ") and needle in message
    assert "\n" not in message
    result, lines = run_case_lines(tmp_path, "model=hf", f"model.config_path={path}")
    assert result["status"] == "error" and lines == [f"error: {message}"]


def test_head_dim_times_heads_need_not_be_the_hidden_size():
    """Qwen3-32B: 64 heads of 128 = 8192 wide attention on a 5120 hidden state; the Q/K/V and
    output projections are that wide (h x (a + 2 g) d and a d x h)."""
    spec = spec_from_hf_config(DATA / "qwen3_32b.json")
    assert spec.heads * spec.d_head == 8192 != spec.hidden
    model = AnalyticModel(spec)
    h, d = spec.hidden, spec.d_head
    attention = h * (spec.heads + 2 * spec.num_kv_heads) * d + spec.heads * d * h
    mlp = 3 * h * spec.ffn_hidden
    norms = 2 * h + 2 * d  # two RMSNorms and the per-head Q and K norms
    assert model.param_count(model.chain[1]) == attention + mlp + norms


NOTICES = {
    # file: one needle per notice (small features the analytic model leaves out); 2,304 = 64
    # heads x 36 blocks
    "gpt_oss_120b.json": [
        "attention sinks (a learned logit per head and block, 2,304",
        "swiglu_limit=7.0",
    ],
    "deepseek_v3.json": ["n_group=8, topk_group=4: group-limited routing"],
    "gemma3_27b.json": ["vision-language", "post-attention and post-MLP RMSNorms"],
    "llama4_maverick.json": ["vision-language"],
    "qwen3_32b.json": [],
    "kimi_k2.json": [],  # n_group 1: no group-limited routing
}


@pytest.mark.parametrize("name", sorted(NOTICES))
def test_small_unmodelled_features_are_notices_not_errors(name):
    model = load_hf_model(DATA / name)
    notes = [n for n in model.notes if not n.startswith("model.seq_len not set")]
    assert len(notes) == len(NOTICES[name])
    for needle in NOTICES[name]:
        assert any(needle in n for n in notes), needle
    assert all("\n" not in n for n in model.notes)


def test_notices_of_fields_set_only_in_some_configs(tmp_path):
    capped = _shipped("gemma3_27b.json")
    capped["text_config"] = {**capped["text_config"], "final_logit_softcapping": 30.0}
    notes = load_hf_model(_write(tmp_path, capped)).notes
    assert any(n.startswith("final_logit_softcapping=30.0: ") for n in notes)
    biased = load_hf_model(_write(tmp_path, _shipped("qwen3_32b.json", attention_bias=True)))
    (note,) = [n for n in biased.notes if n.startswith("attention_bias=true")]
    per_block = (64 + 2 * 8) * 128 + 5120  # Q, K, V biases of their widths and O's of hidden
    assert f"{64 * per_block:,} parameters" in note
    assert not load_hf_model(DATA / "qwen3_32b.json").spec.bias


def test_the_notices_are_printed_after_the_summary(tmp_path):
    _, result, report, _, lines = run_case(
        tmp_path, "model=hf", f"model.config_path={DATA / 'gpt_oss_20b.json'}"
    )
    assert result["status"] == "feasible"
    summary = lines[0].splitlines()
    notes = [i for i, line in enumerate(summary) if line.startswith("note: ")]
    assert notes and notes == list(range(notes[0], notes[0] + len(notes)))
    assert any(summary[i].startswith("note: attention sinks") for i in notes)
    assert any(summary[i].startswith("note: swiglu_limit=7.0: ") for i in notes)
