"""The modern model presets (conf/model/*.yaml) against their published parameter counts.

Each preset is composed as the CLI composes it (Hydra, :func:`nest.app.config.load_preset`), its
:meth:`~nest.core.layers.AnalyticModel.model_stats` compared with the figure the model's card or
report publishes, quoted below with its source.

**Tolerance.** A count matches when it lies within 1 % of the published figure, or within half a
unit of the figure's last published digit when that is wider. Cards round their counts ("37B",
"3.6B"): a figure printed to two digits only says the count lies within half a unit of its last
digit, so 1 % alone would fail a correct count (36.6B is "37B"); a figure printed to four digits
("116.8B") is held to 1 %, which catches a wrong shape (a missing or doubled attention, expert or
embedding matrix moves these counts by several %) but not the small terms the presets say they
leave out (router biases, attention sinks, Gemma's extra norms: below 0.01 %).

**Conventions.** ``params_total`` and ``params_active`` count the embedding and the output head;
multi-token-prediction modules are ``params_mtp``. Where a card counts differently the test
compares with the matching key and says so: gpt-oss, DeepSeek-V3 and Kimi K2 publish active
counts without the input embedding (a lookup, no matmul): ``params_active_non_embedding``.
"""

import pytest

from nest.app.config import build_model_spec, load_preset
from nest.core.layers import AnalyticModel

B = 1e9


def stats(name: str) -> dict:
    return AnalyticModel(build_model_spec(load_preset("model", name))).model_stats()


def within_published(count: float, published: float, digits_unit: float) -> bool:
    """The module's rule: within 1 % of ``published``, or within half of ``digits_unit`` (the
    unit of its last printed digit, e.g. 1e9 for "37B", 0.1e9 for "3.6B") when that is wider."""
    return abs(count - published) <= max(0.01 * published, 0.5 * digits_unit)


# (preset, stats key, published count, unit of its last printed digit, source)
PUBLISHED = [
    (
        "deepseek_v3",
        "params_total",
        671 * B,
        B,
        "deepseek-ai/DeepSeek-V3 README.md: '671B total parameters'; README_WEIGHTS.md: main "
        "model 'Total parameters: 671B' (the 685B on Hugging Face adds the MTP module)",
    ),
    (
        "deepseek_v3",
        "params_active_non_embedding",
        37 * B,
        B,
        "DeepSeek-V3 README.md: '37B activated for each token'. The config's shapes give 37.55B "
        "with the input embedding (which would print as 38B) and 36.63B without it, so the card "
        "counts as gpt-oss does (no input embedding)",
    ),
    (
        "deepseek_v3",
        "params_active_non_embedding",
        36.6 * B,
        0.1 * B,
        "an earlier DeepSeek-V3 README_WEIGHTS.md (copied in tenstorrent/tt-metal "
        "models/demos/deepseek_v3/reference): 'Activation parameters: 36.6B (including 0.9B for "
        "the output Head)', i.e. without the input embedding",
    ),
    (
        "deepseek_v3",
        "params_mtp",
        11.5 * B,
        0.1 * B,
        "DeepSeek-V3 README_WEIGHTS.md: the MTP module has '11.5B unique parameters, excluding "
        "the shared 0.9B Embedding and 0.9B output Head'",
    ),
    (
        "kimi_k2",
        "params_total",
        1000 * B,
        1000 * B,
        "MoonshotAI/Kimi-K2 README.md model summary: 'Total Parameters 1T' (one printed digit: "
        "a loose bound, 1,026.4B here; the 1.04T quoted elsewhere has no primary source we "
        "could read, and this count is 1.3 % below it)",
    ),
    (
        "kimi_k2",
        "params_active_non_embedding",
        32 * B,
        B,
        "MoonshotAI/Kimi-K2 README.md: 'Activated Parameters 32B'. The DeepSeek-V3 architecture, "
        "counted as DeepSeek counts it (without the input embedding: 31.69B; with it 32.86B, "
        "which would print as 33B)",
    ),
    (
        "qwen3_235b_a22b",
        "params_total",
        235 * B,
        B,
        "Qwen/Qwen3-235B-A22B model card: 'Number of Parameters: 235B in total and 22B activated'",
    ),
    ("qwen3_235b_a22b", "params_active", 22 * B, B, "Qwen/Qwen3-235B-A22B model card: 22B"),
    (
        "qwen3_30b_a3b",
        "params_total",
        30.5 * B,
        0.1 * B,
        "Qwen/Qwen3-30B-A3B model card, as quoted by apxml.com/models/qwen3-30b-a3b: '30.5 "
        "billion parameters in total'",
    ),
    (
        "qwen3_32b",
        "params_total",
        32.8 * B,
        0.1 * B,
        "Qwen/Qwen3-32B model card, as quoted by apxml.com/models/qwen3-32b: '32.8 billion "
        "parameters'",
    ),
    (
        "gpt_oss_120b",
        "params_total",
        116.8 * B,
        0.1 * B,
        "gpt-oss model card (arXiv 2508.10925): 'gpt-oss-120b: 116.8B total parameters (5.1B "
        "active)'",
    ),
    (
        "gpt_oss_120b",
        "params_active_non_embedding",
        5.1 * B,
        0.1 * B,
        "gpt-oss model card: '5.1B active'; its active counts leave out the input embedding "
        "(5.71B with it)",
    ),
    (
        "gpt_oss_20b",
        "params_total",
        20.9 * B,
        0.1 * B,
        "gpt-oss model card: 'gpt-oss-20b: 20.9B total parameters (3.6B active)'",
    ),
    (
        "gpt_oss_20b",
        "params_active_non_embedding",
        3.6 * B,
        0.1 * B,
        "gpt-oss model card: '3.6B active', without the input embedding (4.19B with it)",
    ),
    (
        "llama4_maverick",
        "params_total",
        400 * B,
        B,
        "meta-llama/llama-models models/llama4/MODEL_CARD.md: '17B (Activated) 400B (Total)'; "
        "the text model's shapes alone give 400.7B",
    ),
    ("llama4_maverick", "params_active", 17 * B, B, "llama4 MODEL_CARD.md: '17B (Activated)'"),
    ("llama4_scout", "params_active", 17 * B, B, "llama4 MODEL_CARD.md: '17B (Activated)'"),
    (
        "gemma3_27b",
        "params_total",
        27 * B,
        B,
        "Gemma 3 Technical Report (arXiv 2503.19786): models 'ranging in scale from 1 to 27 "
        "billion parameters' (the nominal 27B; the report's per-part table was not retrievable)",
    ),
]


@pytest.mark.parametrize(
    ("name", "key", "published", "unit", "source"),
    PUBLISHED,
    ids=[f"{p[0]}-{p[1]}-{p[2] / B:g}B" for p in PUBLISHED],
)
def test_preset_matches_its_published_parameter_count(name, key, published, unit, source):
    count = stats(name)[key]
    assert within_published(count, published, unit), (name, key, count / B, source)


@pytest.mark.xfail(
    strict=True,
    reason="Qwen/Qwen3-30B-A3B's card prints '3.3B activated' (apxml.com quoting the card); the "
    "config's shapes give 3.353B (notes §2b recompute the same by hand: 128 experts x top-8 of "
    "3 x 2048 x 768 over 48 blocks is 1.81B, attention 0.91B, embedding + head 0.62B), which "
    "rounds to 3.4B, 0.053B (1.6 %) above the card, just outside the rule (0.05B); the card "
    "seems to truncate, and no finer published figure was found",
)
def test_qwen3_30b_a3b_active_against_its_card_figure():
    assert within_published(stats("qwen3_30b_a3b")["params_active"], 3.3 * B, 0.1 * B)


@pytest.mark.xfail(
    strict=True,
    reason="llama4 MODEL_CARD.md prints '109B (Total)' for Scout; the text model's shapes give "
    "107.77B, 1.2 % below. The gap is presumably the vision encoder and projector (early "
    "fusion; the card does not say what it counts), which nest does not model, and neither a "
    "text-only count nor the vision encoder's size is published, so nothing published can be "
    "compared with the text model (Maverick's 400B, by contrast, is met by its text model)",
)
def test_llama4_scout_total_against_the_published_multimodal_count():
    assert within_published(stats("llama4_scout")["params_total"], 109 * B, B)


def test_the_tolerance_rule_is_the_wider_of_one_percent_and_half_a_digit():
    """The rule, on the figures above: "37B" admits 36.5-37.5B (half a digit is wider than
    1 %), "116.8B" admits 1 % (1.168B; half a digit would be 0.05B)."""
    assert within_published(36.6 * B, 37 * B, B) and not within_published(37.55 * B, 37 * B, B)
    assert within_published(115.7 * B, 116.8 * B, 0.1 * B)
    assert not within_published(115.6 * B, 116.8 * B, 0.1 * B)


def test_non_embedding_active_count_leaves_out_exactly_the_input_embedding():
    """``params_active_non_embedding`` is ``params_active`` less the ``vocab x hidden`` lookup
    table; a tied matrix is the output head too, so it stays (gemma3_27b)."""
    for name in ("gpt_oss_120b", "deepseek_v3", "gemma3_27b"):
        spec = build_model_spec(load_preset("model", name))
        s = stats(name)
        lookup = 0 if spec.tied_embeddings else spec.vocab * spec.hidden
        assert s["params_active"] - s["params_active_non_embedding"] == lookup, name


def test_presets_keep_the_configs_layer_patterns():
    """The block patterns the presets' comments describe, read off the composed specs:
    DeepSeek-V3's first three dense blocks, Llama 4 Maverick's odd MoE blocks, gpt-oss's
    alternating window starting with a sliding block, Gemma 3's 10 global of 62, Llama 4's
    every fourth global (NoPE) block."""

    def spec(name):
        return build_model_spec(load_preset("model", name))

    ds = spec("deepseek_v3")
    assert [ds.block_is_moe(i) for i in range(5)] == [False, False, False, True, True]
    assert sum(ds.block_is_moe(i) for i in range(ds.layers)) == 58
    mav = spec("llama4_maverick")
    assert [i for i in range(mav.layers) if mav.block_is_moe(i)] == list(range(1, 48, 2))
    assert [i for i in range(mav.layers) if not mav.block_is_local(i)] == list(range(3, 48, 4))
    oss = spec("gpt_oss_120b")
    assert [oss.block_is_local(i) for i in range(4)] == [True, False, True, False]
    gemma = spec("gemma3_27b")
    globals_ = [i for i in range(gemma.layers) if not gemma.block_is_local(i)]
    assert globals_ == list(range(5, 62, 6)) and len(globals_) == 10
    kimi = spec("kimi_k2")
    assert [kimi.block_is_moe(i) for i in range(3)] == [False, True, True]
