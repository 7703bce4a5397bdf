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
"""

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
    # file: (published parameters, relative tolerance the published rounding allows)
    "llama2_7b.json": (6_738_415_616, 1e-9),
    "mistral_7b.json": (7.24e9, 0.005),
    "mixtral_8x7b.json": (46.7e9, 0.005),
    "qwen2_0.5b.json": (0.49e9, 0.01),
    "gpt2.json": (124e6, 0.005),
    "bert_base_uncased.json": (110e6, 0.01),
    "llama3.1_8b.json": (8.03e9, 0.001),
    "qwen2.5_7b.json": (7.61e9, 0.001),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_sizes(name):
    published, tol = PUBLISHED[name]
    model = AnalyticModel(spec_from_hf_config(DATA / name))
    assert model.total_params() == pytest.approx(published, rel=tol)


def test_every_shipped_config_is_tested():
    assert {p.name for p in DATA.glob("*.json")} == set(PUBLISHED)


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
