"""The cost model against published measured runs (``python -m nest.validate``)."""

import csv
import statistics
from pathlib import Path

import pytest

from nest.app import validate
from nest.core.axes import Schedule
from nest.core.errors import UserError
from nest.cost import evaluate

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "experiments" / "validation" / "cases.csv"
VISIBLE = ROOT.parent / "shared" / "validation" / "visible.csv"


def _unmet(target: str, now: str, why: str):
    return pytest.mark.xfail(strict=True, reason=f"target {target}; now {now}: {why}")


@pytest.fixture(scope="module")
def summary():
    return validate.run(CASES, None, echo=lambda _: None)


def test_every_case_is_predicted_and_fits(summary):
    """The configurations ran for real, so the memory model must let them fit, and it does for
    every time row: DeepSpeed's ZeRO-3 530B run on 640 GPUs (SC21 Table 2) and the two
    Megatron-Bridge 405B runs on Blackwell fit on the memory CUDA exposes (79.3 GiB of an A100
    80GB, 178.4 of a B200, 187.3 of a GB200: conf/device), Megatron-Bridge 25.11's FP8 rows
    with the FP8 primary weights its recipes set (Qwen3-30B-A3B on 16 H100 was 8 GiB over
    without them), dgxc-benchmarking's DeepSeek-V3 on 512 H100 with the ``mla_up_proj``
    recompute its launch script sets, MaxText's ten ``remat_policy=minimal`` runs on TPU v5p
    with JAX's dots policy (``recompute=dots``; scored as Megatron's selective they were 31-59
    GiB over). Every case is predicted: the 12 MoE runs whose experts ran with etp 1 under
    tp > 1 (Megatron-Core's MoE parallel folding) and the 28 multislice MaxText runs (ZeRO-3
    within a slice, data parallel across slices: hybrid sharding) included, and the 84 runs of
    the zero-bubble paper's Tables 4 and 6 (1F1B, interleaved, ZB-1p, ZB-2p, ZB-V), the four
    A100 runs of the Megatron-LM README's MFU table (selective recompute, sequence parallelism,
    up to 512 GPUs) and the 4 long-context runs of Megatron-MoE-ModelZoo's Qwen3-235B TP4 layout
    (16K-128K tokens, the MoE layer recomputed), and the 23 FSDP runs of NVIDIA's MaxText and
    Paxml recipes on H100 (ZeRO-3 within shard groups of 8-256 GPUs, replicated across). One
    time row is called out of memory (OUT_OF_MEMORY_WHY): Llama 3 405B on 8,192 H100 under
    Megatron's interleaved warm-up, by 3.6 %. Paxml's five GPT-3 175B FP8 runs fit with their
    ``SAVE_QKV_OUT_PROJ`` policy scored as itself (``qkv_out_proj``; 9.85 GiB over as the
    stand-in ``selective_mlp``), and Megatron-Bridge's three Megatron-FSDP runs on GB200 fit
    with the activation offload of their recipes (40 of 80 blocks for Llama 3 70B, 95 of 126
    for Llama 3.1 405B: ``activation_offload_blocks``)."""
    assert summary["cases"] == 321
    assert summary["predicted"] == 321
    assert summary["out_of_memory"] == 1


PAXML_GPU = "NVIDIA_dgxc_benchmarking_H100_Paxml_FSDP"
OUT_OF_MEMORY_WHY = {  # (source, case): why the memory model calls this published run OOM
    (
        "DeepSpeed_issue5305_memory",
        "dp2 + tp4, no recompute: 45.0 G (github:deepspeedai/DeepSpeed#5305)",
    ): (
        "the row lacks what the run kept: Megatron TP4 without recompute at 32,768 tokens keeps "
        "66 GiB of activations by Korthikanti et al.'s inventory without sequence parallelism "
        "(58.6 GiB in all with it, still above the 45 G measured in all); the issue states "
        "neither sequence parallelism nor the ZeRO stage, so no setting is picked to fit"
    ),
    (
        "Dubey2024_Llama3_Table4",
        "Llama 3 405B, 8192 GPUs, TP8 CP1 PP16 DP64, seq 8192, 32 seqs per DP rank (Table 4 of "
        "'The Llama 3 Herd of Models'; the same table in Balaji, SC'24 talk, as quoted at "
        "glennklockwood.com/garden/llama-3.1)",
    ): (
        "run as Megatron's interleaved schedule (8 one-layer chunks per rank, N = PP: the "
        "paper's N is flexible and unstated), pipeline rank 1 holds 141 chunk activations at 32 "
        "microbatches (Megatron's warm-up: 17.6 stages' worth against 1F1B's 15): 82.1 GiB of "
        "79.2, 3.6 % over; the paper trains these 8K sequences without activation "
        "checkpointing by deallocating each stage's input and output tensors and choosing N "
        "for memory (arXiv 2407.21783 §3.3.2), which the model does not express; the same "
        "layout at 16 microbatches (16,384 GPUs) fits"
    ),
}
"""The published runs the memory model still calls out of memory, over every row (time and
memory): 16 of 212 before issue 23's fixes (15 time rows, 1 memory row), 1 after them, 2 since
the Llama 3 rows run the interleaved schedule Meta describes (issue 22); of 324 with the
zero-bubble paper's 112 rows; of 332 with Megatron-MoE-ModelZoo's 4 long-context Qwen3 rows and
the Megatron-LM README's 4 A100 rows; 10 of 362 with NVIDIA's 23 MaxText and Paxml FSDP rows
on H100 (Paxml's five GPT-3 175B runs) and Megatron-Bridge's 7 FSDP-source rows (3 of them
Megatron-FSDP runs that offload activations to the CPU); 2 since those three offload the first
40 / 95 blocks' activations (``activation_offload_blocks``, their recipes'
cpu_offloading_num_layers) and Paxml's ``SAVE_QKV_OUT_PROJ`` policy is scored as itself
(``qkv_out_proj``: 10 bytes per token and hidden unit per block where the stand-in
``selective_mlp`` kept 13, 13.5 GiB less on the 175B runs, which were 9.85 GiB short)."""


def test_published_runs_called_out_of_memory_are_the_pinned_ones(summary):
    """``nest.validate``'s fits verdict over all rows (``fits_verdict``): every row has one, and
    the runs it calls out of memory are exactly those of OUT_OF_MEMORY_WHY, each with its
    shortfall in the note."""
    verdict = summary["fits_verdict"]
    assert verdict["runs"] == 321 + summary["memory"]["n"] == 362
    called = {(r["source"], r["case"]) for r in verdict["out_of_memory"]}
    assert called == set(OUT_OF_MEMORY_WHY)
    assert all("GiB short" in r["note"] for r in verdict["out_of_memory"])


@_unmet(
    "every published run fits",
    f"{len(OUT_OF_MEMORY_WHY)} of 362 called out of memory",
    "; ".join(OUT_OF_MEMORY_WHY.values()),
)
def test_accuracy_every_published_run_fits(summary):
    assert not summary["fits_verdict"]["out_of_memory"]


HYBRID = {  # source: multislice rows, ZeRO-3 sharded within a slice, replicated across slices
    "MaxText_TPU_v5e_README": 20,
    "MaxText_TPU_v5p_README": 8,
    # GPU: MaxText's 512-2048 GPU runs (shard groups of 128), Paxml's GPT-3 175B on 256-2048
    # (128) and GPT-3 5B on every count (8, one node)
    "NVIDIA_dgxc_benchmarking_H100_MaxText_FSDP": 6,
    PAXML_GPU: 12,
}


def test_rows_that_shard_within_groups_and_replicate_across_are_scored_as_hsdp():
    """A MaxText multislice run (``ici_fsdp`` within a slice, ``dcn_data`` across slices) names
    its shard group in ``zero_group``; it is scored with ``zero_shard = zero_group`` (hybrid
    sharding: ZeRO-3 gathers within the slice, the gradient shard all-reduced across slices),
    never as ZeRO-3 over every chip (whose gathers would cross the data-centre network)."""
    counts: dict[str, int] = {}
    for row in _rows():
        if (row.get("zero_group") or "").strip() and row["zero_group"] != row["dp"]:
            _, plan = validate.problem_and_plan(row)
            assert plan.zero_shard == int(row["zero_group"])
            assert plan.config.zero_replicas == int(row["dp"]) // int(row["zero_group"]) > 1
            assert validate.predict(row).predicted is not None
            counts[row["source"]] = counts.get(row["source"], 0) + 1
    assert counts == HYBRID


def test_megatron_fsdp_rows_shard_over_the_group_the_archive_defines():
    """Megatron-Bridge's performance archive defines its FSDP column as "FSDP > 0: use FSDP
    with sharding group size = #GPUs / (TP x PP)" (github:NVIDIA-NeMo/Megatron-Bridge@4ab94dfa:
    docs/performance-summary-archive.md, Nomenclature), and its recipes run Megatron-FSDP with
    ``data_parallel_sharding_strategy = "optim_grads_params"`` (weights, gradients and
    optimizer state sharded: ZeRO-3; scripts/performance/utils/helpers.py at v0.1.0rc3 and
    v0.2.0). Every Megatron-FSDP row of the source is therefore scored as ZeRO-3 with one shard
    group of #GPUs / (TP x PP) ranks, the prefetching runtime; every other row of it (FSDP 0)
    keeps the distributed optimizer (ZeRO-1)."""
    rows = [r for r in _rows() if r["source"] == MBFSDP]
    fsdp = [r for r in rows if "Megatron-FSDP" in r["case"]]
    assert len(rows) == 7 and len(fsdp) == 4
    for row in rows:
        problem, plan = validate.problem_and_plan(row)
        if row in fsdp:
            group = int(row["gpus"]) // (int(row["tp"]) * int(row["pp"]))
            assert plan.config.zero_stage == 3 and group == plan.config.dp
            assert plan.zero_shard in (None, group)  # None: one group of all dp ranks
            assert problem.training.zero3_runtime == "prefetch"
        else:
            assert plan.config.zero_stage == 1


def test_megatron_fsdp_gb200_rows_fit_only_with_their_recipes_partial_offload():
    """Megatron-Bridge's GB200 Megatron-FSDP recipes offload the activations of the first 40 of
    Llama 3 70B's 80 layers and 95 of Llama 3.1 405B's 126 (``cpu_offloading_num_layers``,
    weights not: ``cpu_offloading_weights = False``; scripts/performance/utils/helpers.py at
    Megatron-Bridge v0.1.0rc3, scripts/performance/utils/overrides.py at v0.4.2). The rows state
    it (``activation_offload_blocks``); with it the memory model has them fit, keeping the other
    40 / 31 blocks' activations on the device and the offloaded ones' on the host; without it
    they are called out of memory (no recompute: every block's activations on the GPU)."""
    rows = [r for r in _rows() if (r.get("activation_offload_blocks") or "").strip()]
    assert {(r["source"], r["model"], r["activation_offload_blocks"]) for r in rows} == {
        (MBFSDP, "llama3_70b", "40"),
        (MBFSDP, "llama3_405b", "95"),
    }
    assert len(rows) == 3
    for row in rows:
        problem, plan = validate.problem_and_plan(row)
        n = int(row["activation_offload_blocks"])
        assert plan.activation_offload and plan.activation_offload_blocks == n
        memory = evaluate(problem, plan).ranks[0].memory
        kept = problem.model.spec.layers - n
        per_block = memory.host_activations_bytes / n  # identical blocks, one microbatch
        assert memory.activations_bytes > kept * per_block  # plus the embedding and head's
        assert memory.total_bytes <= memory.capacity_bytes
        problem, plan = validate.problem_and_plan(dict(row, activation_offload_blocks=""))
        on_device = evaluate(problem, plan).ranks[0].memory
        assert on_device.total_bytes > on_device.capacity_bytes
        assert memory.activations_bytes + memory.host_activations_bytes == pytest.approx(
            on_device.activations_bytes
        )


def test_a_zero_group_equal_to_dp_is_the_plan_without_it():
    """``zero_group`` equal to ``dp`` (one shard group over all data-parallel ranks) is nest's
    ZeRO-3, so the row scores exactly as with the column blank."""
    row = next(r for r in _rows() if r["source"] == TPU_V5P and not r.get("zero_group"))
    same = dict(row, zero_group=row["dp"])
    assert validate.predict(same).predicted == validate.predict(row).predicted


def test_head_dim_column_sets_the_attention_width():
    """MaxText's 16B (global_parameter_scale 16, commit 76bd53b): hidden 5120 with 32 heads of
    256, so q, k, v and o are 5120 x 8192 each, not 5120 x 5120; the problem's parameters grow by
    4 x 5120 x (8192 - 5120) per block over the same row without ``head_dim``."""
    row = next(r for r in _rows() if r["source"] == TPU_V5E and r["hidden"] == "5120")
    with_dim, _ = validate.problem_and_plan(row)
    without, _ = validate.problem_and_plan(dict(row, head_dim=""))
    blocks = int(row["layers"])
    extra = with_dim.model.total_params() - without.model.total_params()
    assert extra == blocks * 4 * 5120 * (8192 - 5120)


# ------------------------------------------------------------------------------ accuracy
# The targets docs/trust/fidelity.md states (median <= 5 %, max <= 15 %, no source
# median above 10 %), asserted as stated. A target the model does not meet today is a strict
# xfail whose reason gives the target, the current value and why: it turns red (XPASS) the day
# the model meets it, and docs/trust/fidelity.md must then be updated.
TARGET_MEDIAN = 0.05
TARGET_MAX = 0.15
TARGET_SOURCE_MEDIAN = 0.10

SC21_T1 = "Narayanan2021_SC21_Table1"
MEGATRON = "MegatronLM_README_H100_weak_scaling"
LLAMA3 = "Dubey2024_Llama3_Table4"
SC21_T2 = "Narayanan2021_SC21_Table2"
AUTOMODEL = "NeMoAutomodel_PerfSummary_H100_BF16"
PAIRS = "NVIDIA_dgxc_benchmarking_H100_pairs"
DSV3 = "NVIDIA_dgxc_benchmarking_H100_DeepSeekV3_BF16"
MBRIDGE = "MegatronBridge_perf_H100_FP8"
MOEZOO = "MoEZoo_Qwen3_235B_H100_BF16"
MOEZOO_SWEEP = "MoEZoo_Qwen3_235B_256xH100"
MOEZOO_LC = "MoEZoo_Qwen3_235B_H100_BF16_long_context"
GB200_PAIRS = "NVIDIA_dgxc_benchmarking_GB200_pairs"
BLACKWELL = "MegatronBridge_perf_Blackwell"
MBFSDP = "MegatronBridge_perf_FSDP"
TPU_V5E = "MaxText_TPU_v5e_README"
TPU_V5P = "MaxText_TPU_v5p_README"
MI355X = "MLPerf_Training_v5.1_AMD_MI355X"
TORCHTITAN = "torchtitan_performance_A100_FSDP2"
ZB_T4 = "Qi2024_ZeroBubble_Table4"
ZB_T6 = "Qi2024_ZeroBubble_Table6"
README_A100 = "Korthikanti2022_MegatronLM_README_A100"
MAXTEXT_GPU = "NVIDIA_dgxc_benchmarking_H100_MaxText_FSDP"
ORIGINAL = (SC21_T1, MEGATRON, LLAMA3, SC21_T2, AUTOMODEL)
"""The sources of the BF16 cost model (v2), before FP8 and the new shapes."""


LLAMA3_WHY = (
    "run as the interleaved schedule of arXiv 2407.21783 §3.3.2 in the one layout its sentence "
    "allows (8 one-layer chunks per rank, the first only the embedding, the last only the "
    "output and loss), the 8K rows are +6.8 % (8,192 GPUs) and +5.7 % (16,384) and the 128K "
    "CP16 row +31.3 %: there the attention scores, counted in full as Megatron counts them, "
    "are 57 % of the model FLOPs, and the paper states neither its FLOP convention (with the "
    "causal half counted the row would read -6.3 %; not adopted, no source) nor its document "
    "masks' share"
)
DSV3_MAX_WHY = (
    "TP1 PP8 VP2 EP64 on 1,024 H100 (v25.08.02) predicted slow, 41.8 s against 36.2 s (+15.6 %; "
    "+14.9 % before the attention backward took cuDNN's published backward rate, 0.5 to 0.6 "
    "of the forward's seconds more per layer): scored as its recipe runs it, the whole MoE layer "
    "recomputed with both all-to-alls (mla_up_proj mlp moe) over DeepEP; the two TP2 runs are "
    "within 6.5 %"
)
SC21_T2_WHY = (
    "ZeRO-3 rows over-predicted up to 2.7x (+171 % on 1536 GPUs, +154 % on 2240) with every "
    "gather and reduce-scatter exposed, as DeepSpeed 2021's device-wide synchronise around each "
    "parameter's gather runs them (zero3_runtime=synchronous): the measured step (67 s) is 4x its "
    "compute (15 s) while the modelled collectives take 10 s (108 GB/s per GPU over NVLink and "
    "the node's 8 NICs). One collective per weight tensor on NCCL's flat ring adds at most 7 s "
    "(2240 GPUs). The measured floors match each GPU moving its whole share over its own "
    "200 Gb/s NIC (all six rows within 21 % so), which no source found explains"
)
PAIRS_WHY = (
    "Nemotron4 340B FP8 on 256 GPUs predicted 21.1 % slow (its BF16 row 14.9 %); Grok-1's FP8 "
    "rows predicted 14-15 % fast (its BF16 rows 5-6 %): the model's FP8 speed-up of the MoE "
    "blocks is larger than measured"
)
MOEZOO_WHY = (
    "TP4 PP8 VP4 EP8 (no recompute) predicted 44 % fast and the fastest of the five, measured "
    "the slowest (29.0 s); TP2 PP32 VP3 EP8 20 % fast. Every flag was checked against the "
    "published commands (Megatron-MoE-ModelZoo 8017e11 examples/qwen3/run_235b.sh, the "
    "table's commit): etp 1, so each tensor rank dispatches its own sequence shard (no "
    "TP-duplicated tokens, Megatron-LM 1e057005 token_dispatcher.py), and none of the "
    "modelled terms of either layout (TP collectives, the p2p of 96 one-layer chunks, the "
    "31 / (3 x 512) bubble) comes near the gap. Both ran on Megatron-LM main (1e057005) with "
    "the smallest expert GEMMs (512 and 1,024 tokens per expert per microbatch, 4,096 in the "
    "other three) and the most schedule steps per rank (3,072 block-microbatches; 1,536 "
    "one-layer chunk-microbatches against 512 three-layer ones), which points at host time "
    "per MoE layer and per step (the dispatcher's host sync, per-expert launches; the commands "
    "capture no CUDA graphs: model_configs/benchmarking/Qwen3-235B-A22B.yaml at 8017e11) that "
    "no published figure gives: the issue time of the kernels the model lists, at the 5-20 us "
    "per launch of HolisticTraceAnalysis's docs, is at most 0.27x the modelled device time; "
    "the cross-node EP32 rows with DeepEP -2 and -8 %, the Megatron-FSDP row +8 % (the three "
    "'norm, act' rows scored with moe_act recomputed: +0.3 to +0.4 % each, no change of order; "
    "all five with Megatron-LM's unfused cross entropy, as their yaml runs it: PP32 -22.8 -> "
    "-20.1 %, TP4 -45.1 -> -44.5 %). The same TP4 EP8 layout at 16K-128K tokens (MOEZOO_LC, "
    "2,048 or more tokens per expert) is predicted within 6.5 %: the misses are a cost per block "
    "and microbatch at 16 local experts, not a per-token one"
)
GB200_WHY = (
    "the FP8 rows predicted fast (-0.1 to -19.7 %; BF16 -10.4 to +2.0 %) at the derived in-step "
    "GEMM rate (0.567: H100's calibrated 0.778 of its micro-benchmark ceiling, times GB200's "
    "0.729): Llama 3.1 405B's FP8 rows -17.7 to -19.7 %, Llama 4 Maverick's -14.4 to -15.4 %, "
    "Grok-1's -12.1 to -13.6 %, with an FP8 GEMM level 1.98x the BF16 one (1.77x on H100); every "
    "FP8-only cost Transformer Engine pays is charged from its source (casts 1.4 % of the 405B "
    "FP8 step, without the transposed copy Blackwell's any-layout FP8 GEMMs do not need; "
    "docs/plan/precision.md) and none is near the gap, so the FP8 GEMM itself runs slower in "
    "the step than the shape-sweep micro-benchmark's best says (the measured pairs imply "
    "about 1.75-1.78x on the dense models), while OpenXLA's measured B200 table gives isolated FP8 "
    "GEMMs 1.86-2.13x the bf16 speed at its largest shapes (69-550 GFLOP), above the model's "
    "1.78-1.93x there (tests/test_kernels.py): the gap is not the isolated GEMM's rate at these "
    "shapes. The shape-aware compute model (tiles over GB200's 152 SMs, 4.1 us per kernel, HBM at "
    "the measured 0.872, cuDNN attention by length) moved the BF16 rows by -4.9 to +2.4 %"
)
BLACKWELL_WHY = (
    "Qwen3-30B-A3B on 8 B200 at microbatch 1 predicted +212 % and Qwen3-235B-A22B on 64 B200 "
    "+81 %: the release's host-bound dropless MoE layer, not a cost of the layout (the 25.11 "
    "all-to-all dispatcher syncs the host before each MoE layer's exchange; the same B200 layout "
    "printed 18,066 tokens/s with capacity-padded token-drop in 25.09 against 9,299 dropless, "
    "the microbatch-4 recipe 27,136 in 26.04.01, predicted +16 %; no published host time per "
    "MoE layer to charge: docs/trust/fidelity.md, fine-grained small MoE; the issue time of "
    "the 32 kernels per block the model lists, at 20 us per launch, is 0.46x its device time); "
    "Qwen3-30B-A3B at microbatch 4 on GB200 with its recipe's HybridEP dispatcher +37 % (-20 % "
    "against the same layout's 40,706 in 26.06), "
    "DeepSeek-V3 +15 %, Llama 3.1 405B on 128 B200 +10.0 % (with the FP8 primary weights the "
    "25.11 recipes set: one-byte weight gathers, no per-iteration weight cast); Llama 3 8B "
    "(sequence 8,192) +3 % on B200 and +6 % on GB200 (-3 and -2 % under the flat compute "
    "model, which charged the causal attention in full at the GEMM rate; now half of it at "
    "cuDNN's measured rate, 0.634 of peak at 8,192 keys x the in-step 0.778); 405B on GB200 "
    "+5 %, Qwen3-235B BF16 -1 %"
)
MBFSDP_WHY = (
    "every GB200 row predicted fast, the Megatron-FSDP runs and the same releases' non-FSDP "
    "MXFP8 runs alike: Llama 3 70B on 64 GB200 +12.7 % FSDP / +14.3 % TP2 PP4 VP5 (26.04.01) and "
    "+19.3 / +17.5 % (25.09), Llama 3.1 405B on 128 GB200 +28.1 % FSDP TP2 / +41.8 % TP4 PP8 "
    "CP2 VP8 (25.09), Llama 3 8B on 8 H100 (FSDP 8, 5 blocks recomputed) -11.4 %. Not the FSDP "
    "term: the model hides the ZeRO-3 gathers and reduce-scatters under the layers' compute "
    "(70B: 0.44 s of collectives per microbatch under 3.4 s of compute, 0.008 s exposed; 405B: "
    "1.43 s under 4.3 s, 0.014 s exposed), and the FSDP-to-alternative speed ratios are "
    "predicted 1.121 / 1.141 for 70B against 1.138 / 1.124 measured; the GB200 FP8 in-step "
    "rate is (GB200 pairs: FP8 rows -18 to -20 % in step time). Nor the activation offload of "
    "the first 40 / 40 / 95 blocks over NVLink-C2C (activation_offload_blocks): at the preset's "
    "225 GB/s per direction its copies, 0.645 / 0.645 / 0.723 s each way per microbatch, hide "
    "under 1.08 / 1.08 / 1.39 s of forward compute (the copies out alone, exposed, would read "
    "-5.1 / +0.5 / +10.0 %); and the 405B MXFP8 run on GB200 (578) was slower "
    "than the same layout on B200 in the same release (622), which no GB200 preset can give"
)
MI355X_WHY = (
    "Llama 3.1 8B FP8 on 8 MI355X predicted 11.0 % slower than the MLPerf run at the derived "
    "in-step rate (0.487: H100's 0.778 of the ceiling x MI355X's 0.626); +10.8 % when the preset "
    "ran at its ceiling"
)
TPU_WHY = (
    "at the TPU in-step rate calibrated on the v5e runs of 1, 4 and 16 slices (0.829, 0.898 of "
    "v5e's 0.923 ceiling; v5p at the same share of v5e's ceiling, assumed for want of a v5p GEMM "
    "micro-benchmark) each model size keeps one level across its sweep, where v5e's published "
    "rates fall 10-18 % from 1 to 32 slices: 64B +5.7 to +26.1 % and 128B -15.5 to +2.5 %; "
    "v5p 512B -27.5 and -24.5 %, whose tensor-parallel (ici_tensor 16) collectives are charged "
    "as exposed (no MaxText script or README of that commit says XLA overlaps them), v5p 1T "
    "on one v5p-4096 (2,048 chips) -15.7 %, v5p 128B on 2 x v5p-512 +11.9 %"
)
MBRIDGE_WHY = (
    "Qwen3-30B-A3B PP2 VP24 (25.11, dropless) predicted at 2.60x the measured throughput with "
    "the EP all-to-all overlap its recipe sets (moe_a2a_overlap, Megatron-Bridge 7af9601c): the "
    "same layout printed 10,494 tokens/s with capacity-padded token-drop in 25.09 and PP2 VP12 "
    "went from 5,113 to 9,058 between 26.02 and 26.02.01, a release's host-bound MoE layer "
    "(docs/trust/fidelity.md, fine-grained small MoE); the PP1 EP16 run (26.06) 49.4 % fast "
    "with its recipe's HybridEP dispatcher (priced as deepep; 15.2 % slow as a plain "
    "all-to-all): at microbatch 1 it takes 0.46 s per 4,096-token microbatch, as the B200 "
    "microbatch-1 runs do (0.42-0.44 s) on a GPU with 2.3x its FP8 peak; the folded Qwen3-235B "
    "run (25.11, TP2 EP32 etp 1) 14.3 % slow. The host time that would explain them is not "
    "charged: the issue time of the kernels the model lists (32-50 per block and microbatch, "
    "at the 5-20 us per launch of HolisticTraceAnalysis's docs) is at most 0.21x the modelled "
    "device time of these rows, and no published profile counts a Transformer Engine MoE "
    "block's launches"
)
XLA_FSDP_WHY = (
    "NVIDIA's two JAX recipes on DGX H100 miss in opposite directions, and not by communication "
    "(every ZeRO-3 gather and reduce-scatter is modelled under the next layer's compute, as "
    "XLA's pipelined collectives run them): the step's compute rate is the recipe's"
)
MAXTEXT_GPU_WHY = (
    f"{XLA_FSDP_WHY}. MaxText Llama 3 70B (jax 25.01 image), its remat_policy save_qkv_proj "
    "scored as itself (qkv_proj; full recompute, the stand-in before, also reran the Q/K/V "
    "projections and FC2, 1.37 s of the BF16 step): BF16 +0.2 to +3.2 %, FP8 +9.8 to +14.8 %, "
    "with 2.1 s of ZeRO-3 collectives a step and 0.04 s of them exposed; the BF16 run executes "
    "589 GFLOP per token, 9.6 PFLOP per GPU per step in 15.56 s, 620 TFLOP/s or 0.63 of peak "
    "with the attention and the memory-bound work included, about the level nest's GPU "
    "calibration (NeMo / Transformer Engine runs) gives its largest GEMMs, 0.625, while its "
    "FP8 twin runs 1.63-1.72x faster where the model's FP8 rate gives 1.529x (FlashAttention's "
    "recompute of the scores, charged in its backward under every policy, is BF16 in both)"
)
PAXML_GPU_WHY = (
    f"{XLA_FSDP_WHY}. Paxml (pax 2024-03-04 image) predicted fast on every row: GPT-3 175B FP8 "
    "-28.5 to -33.4 % (measured 7.47 to 8.02 s from 128 to 2,048 GPUs, predicted 5.34 s at "
    "every count with its SAVE_QKV_OUT_PROJ policy scored as itself, qkv_out_proj: the "
    "selective_mlp stand-in before also reran FC2 and read -23.1 to -28.4 %, 5.74 s, while "
    "calling the runs out of memory), GPT-3 5B BF16 -18.7 to "
    "-20.8 % and FP8 -23.2 to -27.8 % (0.07 s of ZeRO-3 collectives a step): the 5B BF16 run "
    "executes 32 GFLOP per token with its dots recompute, 0.26 PFLOP per GPU per step in "
    "0.634 s, 414 TFLOP/s or 0.42 of peak, where nest runs the same work in 0.516 s; "
    "one GEMM rate cannot score both recipes, and none is fitted to either"
)

ZB2P_WHY = (
    "ZB-2p is the paper's searched schedule (activation limit 2p M_B) run with optimizer "
    "post-validation (§4), scored as ZB-H2, the handcrafted schedule of that memory, under a "
    "synchronised optimizer step: on the paper's own profiled T_F, T_B, T_W (Table 9) the "
    "cost model's ZB-H2 bubble is 9.9 % at 6.2B m 24 (the synchronised floor (p - 1) T_F), the "
    "paper's post-validated ZB-H2 6.98 % and its ZB-2p 0.29 % (Table 5), so the rows of ZB-2p "
    "read -7.2 % (6.2B m 24), -9.4 and -8.0 % (28.3B m 96, 128) while ZB-1p, whose bubble the "
    "paper gives as ZB-H1's, reads -1.3 to +8.8 %"
)
ZB_T4_MAX_WHY = (
    f"{ZB2P_WHY}; and 1F1B-I over-predicted on the small models (1.5B +9.3 to +10.0 %, 14.6B "
    "+10.6 to +12.1 %), whose forward the cost model puts 7-18.5 % below the paper's own profile "
    "(Table 9; docs/trust/fidelity.md, SC21 Table 1 and the A100 rows)"
)
ZBV_T6_WHY = (
    "ZB-V reads -2.1 to -8.9 %: the paper ran it with optimizer post-validation (§4; the "
    "fork's --enable-optimizer-post-validation), where consecutive iterations overlap and its "
    "bubble is near zero, and the cost model's ZB-V keeps the synchronised step's floor "
    "(p - 1) T_F; and the 28.3B runs on 32 GPUs (4 nodes) read -3.3 to -8.9 % for every "
    "schedule, 1F1B included (-5.1 to -6.4 %), a per-microbatch cost rather than a schedule's "
    "(on the paper's own profile of that model, Table 9, the modelled weight-gradient pass is 15 % "
    "slower than its T_W: docs/trust/fidelity.md, SC21 Table 1)"
)
ZB_ORDER_WHY = (
    "9 of 21 sweeps are ordered as measured and 1F1B is last in all 21; the other 12 swap "
    "neighbours: 1F1B-I above ZB-1p where the two were measured within 2.1 % (1.5B m 32 and 64, "
    "6.2B m 64; 1F1B-I reads +9.3 to +10.0 % on 1.5B), ZB-2p below 1F1B-I on 6.2B (measured 4.32 "
    f"against 4.01 at m 24: {ZB2P_WHY}) and, in Table 6, ZB-V below ZB-2p* where ZB-V was "
    f"measured 0.5 to 5 % above it ({ZBV_T6_WHY}), and ZB-1p, measured "
    "within 1.4 to 3.6 % of ZB-V and ZB-2p*, trades places with them on 6.2B m 128, 14.6B "
    "m 192 and 28.3B m 256"
)


@pytest.mark.parametrize(
    "source",
    [
        SC21_T1,
        MEGATRON,
        LLAMA3,
        pytest.param(SC21_T2, marks=_unmet("source median <= 10 %", "12.9 %", SC21_T2_WHY)),
        AUTOMODEL,
        PAIRS,
        DSV3,
        pytest.param(MBRIDGE, marks=_unmet("source median <= 10 %", "49.4 %", MBRIDGE_WHY)),
        MOEZOO,
        MOEZOO_LC,
        GB200_PAIRS,
        BLACKWELL,  # 9.98 %: met by 0.02 points since the published attention backward
        pytest.param(MBFSDP, marks=_unmet("source median <= 10 %", "17.5 %", MBFSDP_WHY)),
        TPU_V5E,
        TPU_V5P,
        pytest.param(MI355X, marks=_unmet("source median <= 10 %", "11.0 %", MI355X_WHY)),
        TORCHTITAN,
        ZB_T4,
        ZB_T6,
        README_A100,
        MAXTEXT_GPU,
        pytest.param(PAXML_GPU, marks=_unmet("source median <= 10 %", "24.8 %", PAXML_GPU_WHY)),
    ],
)
def test_accuracy_no_source_median_above_10_percent(summary, source):
    assert summary["by_source"][source]["median_abs_error"] <= TARGET_SOURCE_MEDIAN


@pytest.mark.parametrize(
    "source",
    [
        SC21_T1,
        pytest.param(
            MEGATRON,
            marks=_unmet(
                "max <= 15 %",
                "19.0 %",
                "1.7B over-predicted by 19 % and 7.1B by 15 % with the per-kernel time, the "
                "achieved HBM bandwidth and the loss over the 131k-vocabulary logits counted; "
                "32B under-predicted by 18.6 % (TP8 DP48 at microbatch 1, the README's unpublished "
                "microbatch: its fp32 gradient reduce-scatter alone outlasts the last backward "
                "2.6 times). Not modelled: the compute slowdown while the DP gradient "
                "reduce-scatter shares the SMs, the host-side (CPU dispatch) time",
            ),
        ),
        pytest.param(LLAMA3, marks=_unmet("max <= 15 %", "31.3 %", LLAMA3_WHY)),
        pytest.param(SC21_T2, marks=_unmet("max <= 15 %", "171 %", SC21_T2_WHY)),
        AUTOMODEL,
        pytest.param(PAIRS, marks=_unmet("max <= 15 %", "21.1 %", PAIRS_WHY)),
        pytest.param(DSV3, marks=_unmet("max <= 15 %", "15.6 %", DSV3_MAX_WHY)),
        pytest.param(MBRIDGE, marks=_unmet("max <= 15 %", "160 %", MBRIDGE_WHY)),
        pytest.param(MOEZOO, marks=_unmet("max <= 15 %", "44.1 %", MOEZOO_WHY)),
        MOEZOO_LC,
        pytest.param(GB200_PAIRS, marks=_unmet("max <= 15 %", "19.7 %", GB200_WHY)),
        pytest.param(BLACKWELL, marks=_unmet("max <= 15 %", "212 %", BLACKWELL_WHY)),
        pytest.param(MBFSDP, marks=_unmet("max <= 15 %", "41.8 %", MBFSDP_WHY)),
        pytest.param(TPU_V5E, marks=_unmet("max <= 15 %", "26.1 %", TPU_WHY)),
        pytest.param(TPU_V5P, marks=_unmet("max <= 15 %", "27.5 %", TPU_WHY)),
        MI355X,
        TORCHTITAN,
        ZB_T4,
        ZB_T6,
        MAXTEXT_GPU,  # 14.8 % since cuDNN's attention tables on H100
        pytest.param(PAXML_GPU, marks=_unmet("max <= 15 %", "33.4 %", PAXML_GPU_WHY)),
    ],
)
def test_accuracy_every_source_max_within_15_percent(summary, source):
    assert summary["by_source"][source]["max_abs_error"] <= TARGET_MAX


@_unmet(
    "median <= 5 % over all cases",
    "5.7 %",
    f"the GB200 pairs: {GB200_WHY}; the TPU rows: {TPU_WHY}; the MoE sources: {BLACKWELL_WHY}; "
    f"the XLA FSDP recipes on H100: {MAXTEXT_GPU_WHY}; {PAXML_GPU_WHY}",
)
def test_accuracy_median_within_5_percent(summary):
    assert summary["median_abs_error"] <= TARGET_MEDIAN


HELD_OUT_WHY = (
    f"the held-out sources above: GB200 pairs {GB200_WHY}; TPU {TPU_WHY}; "
    f"Blackwell {BLACKWELL_WHY}; MoE-ModelZoo Qwen3-235B {MOEZOO_WHY}; Megatron-Bridge FSDP "
    f"{MBFSDP_WHY}; MaxText on H100 {MAXTEXT_GPU_WHY}; Paxml on H100 {PAXML_GPU_WHY}"
)


def test_every_row_is_calibration_or_held_out(summary):
    """The declared splits (``validate.CALIBRATION_SPLITS``, the only rows ``python -m
    nest.calibrate`` fits on) are the 15 BF16 rows of the dgxc H100 pairs and the 12 MaxText v5e
    runs on 1, 4 and 16 slices; the 294 other predicted rows are held out, the FP8 twins, the
    v5e runs on 2, 8 and 32 slices, Megatron-Bridge's FSDP source and dgxc's MaxText and Paxml
    FSDP recipes on H100 (other sources than the pairs) included."""
    splits = summary["by_split"]
    assert splits["calibration"]["n"] == 15 + 12
    assert splits["held-out"]["n"] == summary["predicted"] - 27
    for source, n in ((PAIRS, 15), (TPU_V5E, 12)):
        parts = summary["by_source_split"][source]
        assert set(parts) == {"calibration", "held-out"}
        assert parts["calibration"]["n"] == parts["held-out"]["n"] == n
    assert all(
        set(parts) == {"held-out"}
        for s, parts in summary["by_source_split"].items()
        if s not in (PAIRS, TPU_V5E)
    )


def test_regression_split_errors_pin_the_current_model(summary):
    """Pins (not accuracy): calibration rows median 5.2 % / max 18.8 % (the H100 pairs' 2.3 /
    14.9 % with the v5e split's 6.3 / 18.8 %); held-out rows median 5.8 % / max 212 % on 294
    rows (6.1 % / 221 % before the attention backward took the published cuDNN backward rates
    and the GPU rate re-fitted, 0.617 -> 0.625; 6.1 % before MaxText's remat_policy full was
    scored as JAX's nothing_saveable and the TPU rate recalibrated, 0.900 -> 0.829; 6.4 % before
    MaxText's and Paxml's named remat policies were scored as themselves, qkv_proj and
    qkv_out_proj; 5.6 % on the 264 before dgxc's 23 MaxText and Paxml FSDP rows on H100 and
    Megatron-Bridge's 7 FSDP-source rows, 10.9-43.0 % off; 5.9 % before every
    Megatron-LM-derived row ran the cross entropy its code had, unfused; 5.96 % on the 256
    before the Megatron README's A100 rows and ModelZoo's long-context Qwen3 rows, 5.95 % before
    the unfused attention core's backward bytes and Blackwell's shape-aware compute model, which
    move them in opposite directions; 7.2 % before the TPU rate, 9.0 % before the zero-bubble
    paper's 84 rows)."""
    cal, held = summary["by_split"]["calibration"], summary["by_split"]["held-out"]
    assert cal["median_abs_error"] == pytest.approx(0.052, abs=0.005)
    assert cal["max_abs_error"] == pytest.approx(0.188, abs=0.005)
    assert held["median_abs_error"] == pytest.approx(0.058, abs=0.005)
    assert held["max_abs_error"] == pytest.approx(2.115, abs=0.005)
    pairs = summary["by_source_split"][PAIRS]["calibration"]
    assert pairs["median_abs_error"] == pytest.approx(0.023, abs=0.005)
    assert pairs["max_abs_error"] == pytest.approx(0.149, abs=0.005)
    v5e = summary["by_source_split"][TPU_V5E]
    assert v5e["calibration"]["median_abs_error"] == pytest.approx(0.062, abs=0.005)
    assert v5e["held-out"]["median_abs_error"] == pytest.approx(0.077, abs=0.005)
    assert v5e["held-out"]["max_abs_error"] == pytest.approx(0.261, abs=0.005)


@_unmet("held-out median <= 5 % (issue 22)", "5.8 %", HELD_OUT_WHY)
def test_accuracy_held_out_median_within_5_percent(summary):
    assert summary["held_out_targets_met"]["median_abs_error"]


@_unmet("held-out max <= 25 % (issue 22)", "212 %", HELD_OUT_WHY)
def test_accuracy_held_out_max_within_25_percent(summary):
    assert summary["held_out_targets_met"]["max_abs_error"]


@_unmet(
    "no held-out source median above 10 % (issue 22)",
    "49.4 % (Megatron-Bridge H100 FP8)",
    f"{HELD_OUT_WHY}; SC21 Table 2 {SC21_T2_WHY}; Megatron-Bridge H100 FP8 {MBRIDGE_WHY}; "
    f"MI355X {MI355X_WHY}",
)
def test_accuracy_no_held_out_source_median_above_10_percent(summary):
    assert summary["held_out_targets_met"]["source_median_abs_error"]


@_unmet("max <= 15 % over all cases", "212 %", f"{BLACKWELL_WHY}; {SC21_T2_WHY}; {MBRIDGE_WHY}")
def test_accuracy_max_within_15_percent(summary):
    assert summary["max_abs_error"] <= TARGET_MAX


@_unmet(
    "3D parallelism predicted above ZeRO-3 at every scale, as measured "
    "(docs/trust/fidelity.md, Ranking)",
    "ZeRO-3 predicted above at each model's smallest scale (175B on 384 GPUs: 172.7 vs 147.1 "
    "TFLOP/s, measured 144 vs 153; 530B: 175.2 on 640 vs 163.5 on 560, measured 138 vs 171); "
    "at the four larger scales 3D is ranked above, as measured",
    SC21_T2_WHY,
)
def test_accuracy_3d_parallelism_ranked_above_zero3_at_every_scale():
    """SC21 Table 2: at each of the three scales of each model, the 3D-parallel configuration
    (PTD-P) runs faster than ZeRO-3; the prediction must order every such pair as measured."""
    with open(CASES, newline="") as fh:
        rows = sorted(
            (r for r in csv.DictReader(fh) if r["source"] == SC21_T2), key=lambda r: int(r["gpus"])
        )
    for sweep in ("SC21_Table2_174.6B", "SC21_Table2_529.6B"):
        zero3 = [validate.predict(r) for r in rows if r["sweep"] == sweep and "ZeRO-3" in r["case"]]
        ptdp = [validate.predict(r) for r in rows if r["sweep"] == sweep and "PTD-P" in r["case"]]
        assert len(zero3) == len(ptdp) == 3
        for z, d in zip(zero3, ptdp, strict=True):  # the same scale: the k-th smallest of each
            assert d.measured > z.measured  # the published fact the claim rests on
            assert d.predicted > z.predicted, (sweep, d.row["gpus"], d.predicted, z.predicted)


# ---------------------------------------------------------------------------- regressions
# Pins of the current cost model (v2, 2026-12), NOT accuracy: the errors the model makes today,
# to half a percentage point, so that any change of the model's numbers is noticed. A change
# made on purpose updates this table together with docs/trust/fidelity.md.
CURRENT = {  # source: (cases, median |error|, max |error|, signed median)
    SC21_T1: (30, 0.057, 0.099, -0.051),
    MEGATRON: (27, 0.069, 0.190, -0.033),
    LLAMA3: (3, 0.068, 0.313, 0.068),
    SC21_T2: (12, 0.129, 1.707, 0.080),
    AUTOMODEL: (1, 0.057, 0.057, 0.057),
    PAIRS: (30, 0.043, 0.211, 0.013),
    DSV3: (3, 0.065, 0.156, -0.002),
    MBRIDGE: (3, 0.494, 1.604, 0.494),
    MOEZOO: (5, 0.082, 0.441, -0.078),
    MOEZOO_LC: (4, 0.054, 0.065, -0.054),
    GB200_PAIRS: (30, 0.053, 0.197, -0.053),
    BLACKWELL: (9, 0.100, 2.115, 0.100),
    MBFSDP: (7, 0.175, 0.418, 0.175),
    TPU_V5E: (24, 0.063, 0.261, 0.026),
    TPU_V5P: (16, 0.045, 0.275, -0.027),
    MI355X: (1, 0.110, 0.110, -0.110),
    TORCHTITAN: (5, 0.090, 0.104, 0.090),
    ZB_T4: (48, 0.030, 0.121, 0.017),
    ZB_T6: (36, 0.027, 0.089, -0.025),
    README_A100: (4, 0.063, 0.110, -0.042),
    MAXTEXT_GPU: (10, 0.065, 0.148, 0.065),
    PAXML_GPU: (13, 0.248, 0.334, -0.248),
}


@pytest.mark.parametrize("source", sorted(CURRENT))
def test_regression_errors_per_source_pin_the_current_model(summary, source):
    """Pins the current model's per-source errors (the table above), not its accuracy: the
    accuracy targets are the ``test_accuracy_*`` tests."""
    n, median, worst, signed = CURRENT[source]
    s = summary["by_source"][source]
    assert s["n"] == n
    assert s["median_abs_error"] == pytest.approx(median, abs=0.005)
    assert s["max_abs_error"] == pytest.approx(worst, abs=0.005)
    assert s["median_error"] == pytest.approx(signed, abs=0.005)


def test_regression_sweep_kendall_taus_pin_the_current_model(summary):
    """Pins the current model's ranking of every sweep (named or auto-detected; not an accuracy
    target): SC21 Table 2's two six-configuration sweeps +0.73 (175B: 13 of 15 pairs ordered as
    measured) and +0.60 (530B: 12 of 15), the eight GB200 scaling sweeps, all +1 but
    Grok-1's BF16 (+0.33: measured 7.33 / 7.39 / 7.32 s on 128 / 256 / 512 GPUs, a 1 % spread,
    predicted flat to 0.01 s), Megatron-MoE-ModelZoo's five Qwen3-235B layouts (-0.32, pinned
    below) and dgxc-benchmarking's three DeepSeek-V3 runs on H100, auto-detected now that the
    folded ones are scored (+1: measured 48.9 / 52.0 / 36.2 s for TP2 PP8 on 512, TP2 PP16 on
    1024 and TP1 PP8 VP2 on 1024 GPUs, predicted 45.8 / 51.9 / 41.8 s, the last with the
    settings its recipe states: recompute mla_up_proj mlp moe, DeepEP, NeMo's PP layout; -0.33
    while it was scored as full recompute over a plain all-to-all), and MaxText's per-model
    slice-count sweeps, auto-detected now that the multislice rows are scored: the four v5e
    models on 1-32 slices have no tau (every slice count predicted the same to 0.01 %: the
    cross-slice all-reduce is hidden under the backward, so tau-b's predicted ties leave it
    undefined), v5p 1T over 1,024 and 2,048 chips on one and two slices +1 and v5p 128B (128
    and 256 chips, one and two slices) +0.33; dgxc's FSDP recipes on H100: MaxText Llama 3 70B
    BF16 +0.63 and FP8 -0.63, each from its 256-GPU row alone (one shard group of 256, predicted
    0.002 s below the four others, which tie: the measured spreads are 2.9 % and 4.6 %, the
    predicted 0.01 %), Paxml's three sweeps none (every GPU count predicted the same: the
    cross-replica gradient all-reduce is hidden)."""
    taus = {k: (s["n"], s["kendall_tau"]) for k, s in summary["sweeps"].items()}
    maxtext = {
        k: v for k, v in taus.items() if k.startswith(("MaxText_TPU_v5e", "MaxText_TPU_v5p"))
    }
    assert sorted(k for k, (_, t) in maxtext.items() if t is None) == [
        f"{TPU_V5E}:{size}B:seq2048:bf16" for size in ("129.19", "16.27", "32.55", "64.76")
    ]
    assert maxtext[f"{TPU_V5P}:1031.47B:seq2048:bf16"] == (4, pytest.approx(1.0))
    assert maxtext[f"{TPU_V5P}:129.19B:seq2048:bf16"] == (4, pytest.approx(1 / 3))
    assert len(maxtext) == 6
    assert taus["SC21_Table2_174.6B"] == (6, pytest.approx(11 / 15))
    assert taus["SC21_Table2_529.6B"] == (6, pytest.approx(9 / 15))
    assert taus[f"{DSV3}:deepseek_v3:seq4096:bf16"] == (3, pytest.approx(1.0))
    assert taus[MOEZOO_SWEEP][0] == 5
    gb200 = {k: v for k, v in taus.items() if k.startswith(GB200_PAIRS)}
    assert len(gb200) == 8 and len(taus) == 12 + 6 + 5 + len(ZB_TAUS) + len(MBFSDP_SWEEPS)
    for sweep, tau in MBFSDP_SWEEPS.items():
        assert taus[sweep] == (2, pytest.approx(tau)), sweep
    for prec, tau in (("bf16", 0.632), ("fp8", -0.632)):
        assert taus[f"{MAXTEXT_GPU}:llama3_70b:seq8192:{prec}"] == (5, pytest.approx(tau, abs=1e-3))
    assert taus[f"{PAXML_GPU}:175B:seq2048:fp8"] == (5, None)
    assert (
        taus[f"{PAXML_GPU}:5.0B:seq2048:bf16"] == taus[f"{PAXML_GPU}:5.0B:seq2048:fp8"] == (4, None)
    )
    assert taus[f"{GB200_PAIRS}:314B:seq8192:bf16"] == (3, pytest.approx(1 / 3))
    assert sorted(t for _, t in gb200.values()) == [pytest.approx(1 / 3)] + [1.0] * 7


MBFSDP_SWEEPS = {  # Megatron-Bridge: one release's Megatron-FSDP run and its alternative layout
    "MB_FSDP_Llama3_70B_64xGB200_26.04.01": 1.0,  # FSDP64 4,224 > TP2 PP4 VP5 MXFP8 3,712
    "MB_FSDP_Llama3_70B_64xGB200_25.09": 1.0,  # 3,986 > 3,546
    "MB_FSDP_Llama3.1_405B_128xGB200_25.09": 1.0,  # FSDP64 TP2 729 > TP4 PP8 CP2 VP8 578
}


# --------------------------------------------------------------- pipeline schedules (issue 24)
# The zero-bubble paper's Tables 4 and 6 (Qi et al. ICLR 2024, arXiv 2401.10241; the version
# committed as paper.pdf at sail-sg/zero-bubble-pipeline-parallelism@6574e0ea): one sweep per
# (model, microbatch count) over 1F1B, 1F1B-I (interleaved), ZB-1p, ZB-2p (Table 4) and 1F1B,
# ZB-1p, ZB-2p*, ZB-V (Table 6). Issue 24's target: the schedules ordered as measured and every
# row within 10 % where the layout is stated.
ZB_TAUS = {  # sweep: Kendall tau-b of the predicted against the measured order, today
    **{f"Qi2024_ZB_{k}": 1.0 for k in ("1.5B_m24", "14.6B_m48", "14.6B_m64", "14.6B_m128")},
    **{f"Qi2024_ZB_{k}": 1.0 for k in ("28.3B_m96", "28.3B_m128", "28.3B_m256")},
    "Qi2024_ZB_1.5B_m32": 0.913,  # 1F1B-I 13.4 = ZB-1p 13.4 measured (a tie), 14.72 > 14.46
    "Qi2024_ZB_1.5B_m64": 2 / 3,
    "Qi2024_ZB_6.2B_m24": 2 / 3,
    "Qi2024_ZB_6.2B_m32": 2 / 3,
    "Qi2024_ZB_6.2B_m64": 1 / 3,
    "Qi2024_ZBV_6.2B_m48": 1.0,
    "Qi2024_ZBV_6.2B_m64": 1.0,
    "Qi2024_ZBV_6.2B_m128": 1 / 3,
    "Qi2024_ZBV_14.6B_m72": 2 / 3,
    "Qi2024_ZBV_14.6B_m96": 2 / 3,
    "Qi2024_ZBV_14.6B_m192": 0.0,  # 1 / 3 before the published attention backward
    "Qi2024_ZBV_28.3B_m96": 2 / 3,
    "Qi2024_ZBV_28.3B_m128": 2 / 3,
    "Qi2024_ZBV_28.3B_m256": 1 / 3,
}


def test_regression_zero_bubble_sweep_taus_pin_the_current_model(summary):
    """Pins (not accuracy) the ranking of the four schedules in each of the 21 sweeps."""
    got = {k: s["kendall_tau"] for k, s in summary["sweeps"].items() if k.startswith("Qi2024")}
    assert got.keys() == ZB_TAUS.keys()
    assert all(summary["sweeps"][k]["n"] == 4 for k in got)
    for sweep, tau in ZB_TAUS.items():
        assert got[sweep] == pytest.approx(tau, abs=0.001), sweep


@_unmet("every schedule sweep ordered as measured (issue 24)", "9 of 21", ZB_ORDER_WHY)
def test_accuracy_zero_bubble_schedules_ordered_as_measured(summary):
    assert all(summary["sweeps"][k]["kendall_tau"] == pytest.approx(1.0) for k in ZB_TAUS)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(ZB_T4, marks=_unmet("max <= 10 % (issue 24)", "12.1 %", ZB_T4_MAX_WHY)),
        ZB_T6,
    ],
)
def test_accuracy_zero_bubble_throughput_within_10_percent(summary, source):
    assert summary["by_source"][source]["max_abs_error"] <= 0.10


# Qi et al. arXiv 2401.10241 Table 9: profiled T_F, T_B, T_W (ms; T_B the input-gradient pass)
# of ZB-2p, and Table 5: the bubble rates (cost - m (T_F + T_B + T_W)) / cost the paper computes
# from them for 1F1B, ZB-1p (equal to ZB-H1's at every setting) and ZB-2p.
ZB_PROFILES = {  # (model, stages p, microbatches m): (T_F, T_B, T_W), (1F1B, ZB-1p, ZB-2p) bubble
    ("1.5B", 8, 24): ((18.522, 18.086, 9.337), (0.2431, 0.1585, 0.0433)),
    ("1.5B", 8, 32): ((18.513, 18.086, 9.331), (0.1985, 0.1242, 0.0039)),
    ("1.5B", 8, 64): ((18.546, 18.097, 9.321), (0.1240, 0.0674, 0.0026)),
    ("6.2B", 8, 24): ((29.718, 29.444, 19.927), (0.2347, 0.1323, 0.0029)),
    ("6.2B", 8, 32): ((29.802, 29.428, 19.530), (0.1898, 0.1045, 0.0022)),
    ("6.2B", 8, 64): ((29.935, 29.621, 19.388), (0.1091, 0.0554, 0.0010)),
    ("14.6B", 16, 48): ((11.347, 11.248, 8.132), (0.2552, 0.1397, 0.0066)),
    ("14.6B", 16, 64): ((11.307, 11.254, 8.101), (0.2082, 0.1088, 0.0054)),
    ("14.6B", 16, 128): ((11.325, 11.308, 8.109), (0.1251, 0.0576, 0.0028)),
    ("28.3B", 32, 96): ((10.419, 10.207, 7.715), (0.2646, 0.1421, 0.0038)),
    ("28.3B", 32, 128): ((10.408, 10.204, 7.703), (0.2168, 0.1106, 0.0029)),
    ("28.3B", 32, 256): ((10.402, 10.248, 7.698), (0.1352, 0.0594, 0.0018)),
}


def _equal_stage_throughput(schedule: Schedule, p: int, m: int, f: float, b: float, w: float):
    """``m (T_F + T_B + T_W) / T``: one minus the bubble rate of the cost model's pipeline time
    ``T`` (:mod:`nest.cost.pipeline`) on ``p`` equal stages."""
    from nest.cost.pipeline import pipeline_time_s, rank_pipeline_terms

    u, t, e = rank_pipeline_terms(f, b + w, w, schedule)
    total = pipeline_time_s([t] * p, m, schedule, 1, sum_terms_s=[u] * p, tail_terms_s=[e] * p)
    return m * (f + b + w) / total


@pytest.mark.parametrize("setting", sorted(ZB_PROFILES))
def test_zero_bubble_papers_profile_puts_the_zb2p_gap_in_the_schedule(setting):
    """Why the ZB-2p rows are under-predicted (ZB2P_WHY) while ZB-1p's are not: on the paper's
    own profiled passes (Table 9, no stage cost of ours involved) the cost model's pipeline
    formulas give ZB-1p's throughput as the paper's Table 5 does (ZB-H1's formula, within 2 %,
    the remainder the paper's T_comm on the critical path) and 1F1B's (within 3.5 %), but
    ZB-2p's 3.5 to 11 % lower: ZB-2p is the paper's searched schedule under optimizer
    post-validation (§3.1, §4), scored as the handcrafted ZB-H2 under a synchronised step,
    whose floor (p - 1) T_F alone is 9.9 to 10.6 % of these iterations at the smallest m."""
    _, p, m = setting
    (f, b, w), (bubble_1f1b, bubble_1p, bubble_2p) = ZB_PROFILES[setting]
    one_f_one_b = _equal_stage_throughput(Schedule.ONE_F_ONE_B, p, m, f, b, w)
    assert one_f_one_b / (1 - bubble_1f1b) - 1 == pytest.approx(0.0175, abs=0.0175)
    zb_h1 = _equal_stage_throughput(Schedule.ZB_H1, p, m, f, b, w)
    assert zb_h1 / (1 - bubble_1p) - 1 == pytest.approx(0.0, abs=0.02)
    zb_h2 = _equal_stage_throughput(Schedule.ZB_H2, p, m, f, b, w)
    assert -0.11 < zb_h2 / (1 - bubble_2p) - 1 < -0.035
    assert zb_h2 == pytest.approx(m * (f + b + w) / (m * (f + b + w) + (p - 1) * f))


ZB_PROFILE_ROWS = {  # Table 9's setting -> the Table 4 row of that layout (its ZB-2p run)
    ("1.5B", 8, 24): "1.5B, 8 GPUs PP8, mbs 6 x 24 microbatches, ZB-2p: 14.5 ",
    ("6.2B", 8, 24): "6.2B, 8 GPUs PP8, mbs 3 x 24 microbatches, ZB-2p: 4.32 ",
    ("14.6B", 16, 48): "14.6B, 16 GPUs PP16, mbs 1 x 48 microbatches, ZB-2p: 1.81 ",
    ("28.3B", 32, 96): "28.3B, 32 GPUs PP32, mbs 1 x 96 microbatches, ZB-2p: 0.99 ",
}
ZB_SMALL_FORWARD_WHY = (
    "the 1.5B stage's modelled forward is 18.5 % below the profiled T_F (its B within 3.5 %, its "
    "W +20 %); hidden 2304 at microbatch 6 puts 26 % of the modelled forward in the attention core "
    "and the elementwise work, more than any other layout, which the model may under-charge; "
    "not settled (docs/trust/fidelity.md, SC21 Table 1 and the A100 rows)"
)
ZB_WGRAD_WHY = (
    "T_W is the weight-gradient GEMMs alone, modelled 15-20 % slower than profiled: the A100 "
    "GEMM level is derived (0.676 = H100's in-step share 0.778 x A100's ceiling 0.869, "
    "nest/core/kernels.py), and these passes ran at 0.89-0.93 of the A100 ceiling; the rate "
    "is not set from a validation source's own profile"
)


def _modelled_passes_ms(setting) -> tuple[float, float, float]:
    """The modelled forward, input-gradient and weight-gradient passes (ms) of a middle stage
    (its blocks, no embedding or head) of the Table 4 layout of ``setting``."""
    from nest.core.layers import Shard

    row = _row(ZB_PROFILE_ROWS[setting])
    problem, _ = validate.problem_and_plan(row)
    model, device = problem.model, problem.cluster.device
    blocks = int(row["layer_partition"].split(";")[1])
    cost = model.layer_cost(model.chain[1], Shard(mbs=int(row["microbatch"])), device)
    return (
        1e3 * blocks * cost.fwd_s,
        1e3 * blocks * (cost.bwd_s - cost.wgrad_s),
        1e3 * blocks * cost.wgrad_s,
    )


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(s, marks=_unmet("|T_F error| <= 7 %", "-18.5 %", ZB_SMALL_FORWARD_WHY))
        if s[0] == "1.5B"
        else s
        for s in sorted(ZB_PROFILE_ROWS)
    ],
)
def test_zero_bubble_profiled_forward_pass_on_a100(setting):
    """A held-out per-pass check on A100 (no FlashAttention, fp16, TP 1): the modelled forward
    of a middle pipeline stage against the zero-bubble paper's profiled ``T_F`` (Qi et al.
    arXiv 2401.10241 Table 9, ZB_PROFILES) within 7 %: 6.2B -2.6 %, 14.6B -6.9 %, 28.3B +0.9 %
    (docs/trust/fidelity.md, "SC21 Table 1 and the A100 rows")."""
    f, _, _ = _modelled_passes_ms(setting)
    t_f = ZB_PROFILES[setting][0][0]
    assert abs(f / t_f - 1) <= 0.07


@_unmet("|T_W error| <= 10 % at every size", "+15 to +20 %", ZB_WGRAD_WHY)
def test_zero_bubble_profiled_weight_gradient_pass_on_a100():
    """The paper's profiled weight-gradient pass ``T_W`` (Table 9) is pure GEMM work: it bounds
    the A100's in-step GEMM rate. The modelled pass is within 10 % of it at every size."""
    for setting in ZB_PROFILE_ROWS:
        _, _, w = _modelled_passes_ms(setting)
        assert abs(w / ZB_PROFILES[setting][0][2] - 1) <= 0.10, setting


def test_sweeps_are_auto_detected_per_source_model_metric_and_precision():
    """Rows without a ``sweep`` id form one sweep per source, model, metric and precision when at
    least three are predicted; two rows (one pair) are no sweep."""

    def outcome(gpus, measured, predicted, precision="bf16", source="S"):
        row = {"source": source, "model_params_b": "8", "seq": "4096", "layers": "32",
               "hidden": "4096", "gpus": gpus, "precision": precision}  # fmt: skip
        return validate.Outcome(row, "step_time_s", measured, predicted, True)

    rows = [outcome("8", 3.0, 2.0), outcome("16", 2.0, 3.0), outcome("32", 1.0, 1.0)]
    (sweep,) = validate.sweeps(rows).values()
    assert sweep["n"] == 3 and sweep["kendall_tau"] == pytest.approx(1 / 3)
    assert validate.sweeps(rows[:2]) == {}
    mixed = rows[:2] + [outcome("32", 1.0, 1.0, precision="fp8")]
    assert validate.sweeps(mixed) == {}
    other = rows[:2] + [outcome("32", 1.0, 1.0, source="T")]
    assert validate.sweeps(other) == {}


def test_regression_moezoo_qwen3_layout_ranking_pins_the_current_model(summary):
    """Pins (not a target) Kendall tau-b of Megatron-MoE-ModelZoo's five Qwen3-235B layouts on 256
    H100 (step times 17.6, 17.6, 19.7, 24.2, 29.0 s; one pair tied in the measured order): of the
    9 untied pairs 4 are ordered as measured and 5 reversed, (4 - 5) / sqrt(9 x 10) = -0.11:
    the TP2 PP8 VP4 EP32 DeepEP layout (19.7 s) predicted 19.39 s, 0.01 s above the PP32 one
    (24.2 s, predicted 19.38), a near-tie that the published attention backward tipped (+0.11
    before, at 19.26 and 19.35 s; -0.32 before the unfused cross entropy put the PP32 layout,
    whose last rank holds the loss chunk, above the TP2 PP8 and Megatron-FSDP ones; -0.53
    before ZeRO-3's traffic hid under the Megatron-FSDP row's recomputation)."""
    sweep = summary["sweeps"][MOEZOO_SWEEP]
    assert sweep["n"] == 5
    assert sweep["kendall_tau"] == pytest.approx(-1 / 90**0.5)


@_unmet("Kendall tau >= 0.8", "-0.11", MOEZOO_WHY)
def test_accuracy_moezoo_qwen3_layouts_ranked_as_measured(summary):
    """The issue's target: the five Qwen3-235B layouts ranked in the measured order."""
    assert summary["sweeps"][MOEZOO_SWEEP]["kendall_tau"] >= 0.8


def _row(prefix: str, **changes) -> dict:
    """The validation row whose case starts with ``prefix``, with ``changes`` to its columns."""
    with open(CASES, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["case"].startswith(prefix)]
    assert len(rows) == 1, prefix
    return {**rows[0], **changes}


def test_fine_grained_moe_releases_bracket_the_prediction():
    """Why the 25.11 Qwen3-30B-A3B rows are over-predicted 2-3x (``BLACKWELL_WHY``,
    ``MBRIDGE_WHY``; docs/trust/fidelity.md, "Fine-grained small MoE"): the layouts' throughput
    moves with the Megatron-Bridge release, and the model, which has no release in it, lies
    within the releases' spread. Published tokens/s per GPU
    (NVIDIA-NeMo/Megatron-Bridge@4ab94dfad36641cabdeb96452b21bf676aac4772:
    docs/performance-summary-archive.md): 8 GB200 EP8 MBS 4 GBS 512 MXFP8, 23,766 in 25.11
    (L571) and 40,706 in 26.06 (L130); 8 B200 EP8 GBS 512 MXFP8 at MBS 4, 27,136 in 26.04.01
    (L247); 16 H100 PP2 VP24 EP8 MBS 2 GBS 512, 10,494 with capacity-padded token-drop in 25.09
    (L632), the expert FLOPs of the forced-balance dropless 25.11 row, without the EP all-to-all
    overlap the 25.11 recipe adds (25.09, Megatron-Bridge 6725f704: ``scripts/performance/
    run_script.py`` sets ``overlap_moe_expert_parallel_comm`` for DeepSeek-V3 on H100 only).
    Against the later or token-drop releases the prediction is within issue 22's held-out max
    (25 %)."""
    gb200 = validate.predict(_row("Qwen3-30B-A3B 8xGB200")).predicted
    assert 23_766 < gb200 < 40_706
    b200_mbs4 = validate.predict(_row("Qwen3-30B-A3B 8xB200", microbatch="4")).predicted
    assert abs(b200_mbs4 / 27_136 - 1) <= 0.25
    h100 = validate.predict(
        _row("Qwen3-30B-A3B 16xH100 FP8-CS TP1 PP2 VP24", ep_comm_overlap="false")
    ).predicted
    assert abs(h100 / 10_494 - 1) <= 0.25


def test_at_the_micro_benchmark_ceiling_every_source_is_over_predicted():
    """Why the presets' GEMM level is an assumption below the cited ceiling: with every kernel at
    its isolated micro-benchmark rate (``--matmul-efficiency ceiling``) the model predicts more
    throughput than measured for every Megatron, DeepSpeed or Meta source (median signed error:
    SC21 Table 1 +14.7 %, Megatron-Core H100 +15.7 %, SC21 Table 2 +32.0 %, the FSDP2 row
    +33.6 % with its gathers prefetched, Llama 3's Table 4 +29.5 %), so kernels inside a training
    step run slower than in isolation. Llama 3 joins the others since its rows run the
    interleaved schedule Meta describes (LLAMA3_WHY); as 1F1B, with a 16-stage bubble that
    schedule does not have, they came to -0.3 % at the ceiling. At the assumed level no source is
    over-predicted by more than 12 % at the median. The claim is about the BF16 sources it was
    made on (``ORIGINAL``); the FP8 and new-shape sources score step times, whose error has the
    other sign."""
    at_ceiling = validate.run(CASES, None, echo=lambda _: None, matmul_efficiency="ceiling")
    kernel_bound = {k: at_ceiling["by_source"][k] for k in ORIGINAL}
    assert len(kernel_bound) == 5
    assert all(s["median_error"] > 0 for s in kernel_bound.values())
    default = validate.run(CASES, None, echo=lambda _: None)
    assert all(default["by_source"][k]["median_error"] < 0.12 for k in ORIGINAL)


def test_fsdp2_run_within_15_percent_once_its_gathers_are_prefetched(summary):
    """NeMo Automodel's Llama3 70B on 64 H100 (FSDP2 over 32 ranks x CP 2, BF16, the row's
    ``fsdp2_prefetch``): 866.77 tokens/s per GPU measured. With every ZeRO-3 gather and
    reduce-scatter exposed the model predicts 579 (-33.2 %); FSDP2 prefetches each layer's
    gather under the previous layer's compute and reduce-scatters under the next backward
    (:mod:`nest.cost.fsdp`), and the issue's target for this row is 15 %. The prefetch is what
    closes the gap: the same row with nothing hidden is still more than 15 % slow."""
    s = summary["by_source"][AUTOMODEL]
    assert s["n"] == 1 and s["max_abs_error"] <= TARGET_MAX
    row = _case(AUTOMODEL, "70.6")
    problem, plan = validate.problem_and_plan(row)
    report = evaluate(problem, plan)
    (stage,) = report.stages
    assert 0 < stage.zero3_exposed_s < stage.zero3_comm_s
    hidden_s = plan.num_microbatches * (stage.zero3_comm_s - stage.zero3_exposed_s)
    tokens = problem.training.global_batch * problem.model.seq_len
    exposed = tokens / (report.iteration_time_s + hidden_s) / report.devices_used
    assert exposed < (1 - TARGET_MAX) * float(row["measured_value"])


def test_bad_matmul_efficiency_flag_is_one_line_error(capsys, tmp_path):
    for bad in ("2", "abc", "0"):
        code = validate.main([str(CASES), "--out", str(tmp_path), "--matmul-efficiency", bad])
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --matmul-efficiency") and "\n" not in err


def test_kendall_tau_counts_agreeing_and_reversed_pairs():
    """Kendall's tau-b (Kendall 1945), worked by hand. ``[1, 2, 3]`` against ``[1, 3, 2]``: of
    the 3 pairs, 2 agree and 1 is reversed, no ties: (2 - 1) / 3. ``[1, 1, 2]`` against
    ``[5, 6, 7]``: 3 pairs, 2 agree, the first pair is tied in the measured order only, so
    (2 - 0) / sqrt((3 - 1) (3 - 0)) = 2 / sqrt(6). ``[1, 2, 2, 3]`` against ``[1, 3, 2, 2]``:
    6 pairs; agree (1,2) (1,3) (1,4), reversed (2,4), tied measured (2,3), tied predicted
    (3,4), tied both none: (3 - 1) / sqrt(5 * 5) = 0.4."""
    assert validate.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert validate.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert validate.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert validate.kendall_tau([1, 1, 2], [5, 6, 7]) == pytest.approx(2 / 6**0.5)
    assert validate.kendall_tau([1, 2, 2, 3], [1, 3, 2, 2]) == pytest.approx(0.4)
    assert validate.kendall_tau([1], [2]) is None
    assert validate.kendall_tau([1, 1], [2, 3]) is None  # nothing measured to order


def test_kendall_tau_b_equals_its_covariance_form_on_random_orders_with_ties():
    """Property: tau-b equals its covariance form (Kendall 1945), ``sum sgn(dm) sgn(dp) /
    sqrt(sum sgn(dm)^2 * sum sgn(dp)^2)`` over all pairs, computed independently here, on
    random integer lists with many ties (scipy's ``kendalltau`` computes the same)."""
    import random

    def sgn(x):
        return (x > 0) - (x < 0)

    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(2, 9)
        a = [rng.randint(0, 3) for _ in range(n)]
        b = [rng.randint(0, 3) for _ in range(n)]
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        num = sum(sgn(a[i] - a[j]) * sgn(b[i] - b[j]) for i, j in pairs)
        den = (
            sum(sgn(a[i] - a[j]) ** 2 for i, j in pairs)
            * sum(sgn(b[i] - b[j]) ** 2 for i, j in pairs)
        ) ** 0.5
        ours = validate.kendall_tau(a, b)
        if den == 0:
            assert ours is None
        else:
            assert ours == pytest.approx(num / den, abs=1e-12)


def test_outcome_error_is_relative_to_the_measurement():
    row = {"source": "x"}
    o = validate.Outcome(row, "tflops_per_gpu", 400.0, 440.0, True)
    assert o.error == pytest.approx(0.10)


@pytest.mark.skipif(not VISIBLE.is_file(), reason="shared/validation/visible.csv not beside")
def test_visible_set_reads_with_defaults(tmp_path):
    summary = validate.run(VISIBLE, tmp_path, echo=lambda _: None)
    assert summary["predicted"] == summary["cases"]
    assert (tmp_path / "validation.csv").read_text().count("\n") == summary["cases"] + 1


def test_missing_file_is_one_line_error(capsys, tmp_path):
    assert validate.main([str(tmp_path / "none.csv"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def _rows() -> list[dict]:
    with open(CASES, newline="") as fh:
        return list(csv.DictReader(fh))


def _case(source: str, params_b: str) -> dict:
    with open(CASES, newline="") as fh:
        return next(
            r
            for r in csv.DictReader(fh)
            if r["source"] == source and r["model_params_b"] == params_b
        )


def test_a_row_is_scored_with_its_published_schedule_and_partition():
    """Korthikanti et al. 2022 (arXiv 2205.05198, §6) ran 175B/530B/1T with the interleaved
    schedule, 3 chunks per rank: a row's ``schedule`` and ``virtual_stages`` must reach the plan,
    and interleaving shrinks the bubble of the same configuration (SC21 §2.2.2: by ``v``)."""
    row = _case("Narayanan2021_SC21_Table1", "145.6")  # 80 layers, pp 8: 8 x 3 chunks do not
    row = dict(row, layers="96", pp="8")  # divide 80, so use 96 layers (GPT-3 depth)
    problem, plain = validate.problem_and_plan(row)
    _, inter = validate.problem_and_plan(dict(row, schedule="interleaved", virtual_stages="3"))
    assert plain.schedule is Schedule.ONE_F_ONE_B and plain.virtual_stages == 1
    assert inter.schedule is Schedule.INTERLEAVED and inter.virtual_stages == 3
    assert len(inter.stages) == 8 * 3
    t_plain = evaluate(problem, plain)
    t_inter = evaluate(problem, inter)
    assert t_inter.bubble_s < t_plain.bubble_s


def test_a_row_is_scored_with_its_published_layer_partition():
    row = dict(_case("Narayanan2021_SC21_Table1", "39.1"), layer_partition="20;28")  # 48 blocks
    _, plan = validate.problem_and_plan(row)
    blocks = [s.last_layer - s.first_layer + 1 for s in plan.stages]
    assert blocks == [20 + 1, 28 + 1]  # the embedding joins the first stage, the head the last


def test_a_bad_layer_partition_is_one_line_error():
    row = dict(_case("Narayanan2021_SC21_Table1", "39.1"), layer_partition="20,x")
    with pytest.raises(UserError, match=r"layer_partition='20,x'.*separated by ';'"):
        validate.problem_and_plan(row)


def _mixtral_row(**changes) -> dict:
    """A Megatron-Core H100 row given Mixtral 8x7B's shape (Hugging Face
    mistralai/Mixtral-8x7B-v0.1 config.json, as conf/model/mixtral_8x7b.yaml) on 64 GPUs."""
    row = dict(
        _case("MegatronLM_README_H100_weak_scaling", "7.1"),
        model_params_b="46.7",
        layers="32",
        hidden="4096",
        heads="32",
        kv_heads="8",
        ffn="14336",
        vocab="32000",
        seq="4096",
        gpus="64",
        tp="1",
        pp="1",
        dp="64",
        global_batch_seqs="256",
        activation="swiglu",
        norm="rmsnorm",
        bias="false",
        position="rope",
        num_experts="8",
        top_k="2",
        ep="8",
    )
    row.update(changes)
    return row


def test_moe_columns_make_a_mixtral_problem():
    """``num_experts``, ``top_k`` and ``ep`` reach the model and the plan: a row with Mixtral
    8x7B's shape has its published 46.7B parameters (Jiang et al. 2024, arXiv 2401.04088 §2:
    "46.7B total parameters") and 8 expert ranks; without the columns a row stays dense."""
    problem, plan = validate.problem_and_plan(_mixtral_row())
    spec = problem.model.spec
    assert (spec.num_experts, spec.top_k, plan.ep) == (8, 2, 8)
    assert problem.model.total_params() == pytest.approx(46.7e9, rel=0.001)
    dense = {k: v for k, v in _mixtral_row().items() if k not in ("num_experts", "top_k", "ep")}
    problem, plan = validate.problem_and_plan(dense)
    assert (problem.model.spec.num_experts, plan.ep) == (1, 1)
    assert problem.model.total_params() < 15e9  # one expert: a dense 13B-class model


def test_bad_moe_values_are_one_line_errors():
    """As for any bad row: the row is reported with a one-line error naming the value, the run
    goes on."""
    for changes, named in (
        ({"ep": "3"}, "ep=3"),  # 3 ranks cannot share 8 experts
        ({"ep": "x"}, "ep='x'"),
        ({"ep": "0"}, "ep='0'"),
        ({"top_k": "9"}, "top_k=9"),
    ):
        outcome = validate.predict(_mixtral_row(**changes))
        assert outcome.predicted is None
        assert outcome.note.startswith("error:") and named in outcome.note
        assert "\n" not in outcome.note
    with pytest.raises(UserError, match=r"ep='x' must be a positive whole number"):
        validate.problem_and_plan(_mixtral_row(ep="x"))


def test_tokens_metric_agrees_with_the_model_flop_metric():
    """Tokens per second per GPU times the model FLOPs of a token is the model TFLOP/s per GPU:
    the two metrics of one run, read through the same evaluation."""
    row = _mixtral_row()
    tokens = validate.predict(dict(row, measured_metric="tokens_per_s_per_gpu"))
    tflops = validate.predict(dict(row, measured_metric="tflops_per_gpu"))
    problem, plan = validate.problem_and_plan(row)
    report = evaluate(problem, plan)
    per_token = report.model_flops_per_iteration / (
        problem.training.global_batch * problem.model.seq_len
    )
    assert tokens.predicted * per_token / 1e12 == pytest.approx(tflops.predicted, rel=1e-9)


def test_bad_numbers_in_any_column_are_one_line_row_errors():
    """Every numeric column, not only the MoE ones: text, a fraction where a count is due, a
    blank required number, and a bad measured value are each a one-line error on that row that
    names the column and the text, and the run goes on (no traceback)."""
    for changes, named in (
        ({"tp": "x"}, "tp='x' is not a number"),
        ({"pp": "1.5"}, "pp='1.5' is not a whole number"),
        ({"hidden": ""}, "hidden is blank"),
        ({"nvlink_gbps": "fast"}, "nvlink_gbps='fast' is not a number"),
        ({"microbatch": "nan"}, "microbatch='nan' is not a finite number"),
        ({"measured_value": "n/a"}, "measured_value='n/a' is not a number"),
        ({"measured_value": "0"}, "measured_value='0' must be above 0"),
        ({"ep": "inf"}, "ep='inf' must be a positive whole number"),
        ({"num_experts": "nan"}, "num_experts='nan' must be a positive whole number"),
        ({"head_dim": "0"}, "head_dim='0' must be a positive whole number"),
        ({"zero_group": "x"}, "zero_group='x' must be a positive whole number"),
        ({"gpu": ""}, "gpu '' is not known"),
    ):
        outcome = validate.predict(_mixtral_row(**changes))
        assert outcome.predicted is None, changes
        assert outcome.note.startswith("error:") and named in outcome.note, outcome.note
        assert "\n" not in outcome.note


def test_a_csv_without_a_required_column_names_it(tmp_path):
    """A header that lacks a column every row needs is refused before any row, naming it."""
    row = _mixtral_row()
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, [c for c in row if c != "tp"], extrasaction="ignore")
        writer.writeheader()
        writer.writerow(row)
    with pytest.raises(UserError, match=r"lacks the columns \['tp'\]"):
        validate.run(path, None, echo=lambda *a: None)


def test_a_csv_that_is_not_utf8_is_one_line_error(tmp_path):
    """A file in another encoding is refused naming it, not a UnicodeDecodeError."""
    path = tmp_path / "runs.csv"
    path.write_bytes(",".join(validate.REQUIRED_COLUMNS).encode() + b"\nGr\xfc\xdfe\n")
    with pytest.raises(UserError, match="is not UTF-8 text"):
        validate.run(path, None, echo=lambda *a: None)


# ------------------------------------------------------------------- FP8 and the new shapes
# docs/trust/fidelity.md, FP8: the predicted BF16/FP8 speed-up (BF16 step time over FP8 step
# time) within +-0.10 of the measured one on every pair of NVIDIA's dgxc-benchmarking recipes
# (H100 and GB200, same layout in both precisions), and the FP8 rows' median |error| <= 10 %
# on each machine's sources.
TARGET_RATIO = 0.10
TARGET_FP8_MEDIAN = 0.10
RATIO_WHY = "the model's FP8 speed-up is larger than measured"
PAIR_RATIOS = {  # pair: (measured speed-up, predicted today): measured from cases.csv
    "GPT-3 175B NeMo 128xH100": (1.477, 1.553),
    "GPT-3 175B NeMo 1024xH100": (1.452, 1.552),
    "Llama3.1 8B NeMo2 8xH100": (1.315, 1.360),
    "Llama3.1 8B NeMo2 128xH100": (1.292, 1.361),
    "Llama3.1 70B NeMo 64xH100": (1.397, 1.444),
    "Llama3.1 70B NeMo 2048xH100": (1.350, 1.444),
    "Llama3.1 405B NeMo2 512xH100": (1.522, 1.535),
    "Llama3.1 405B NeMo2 2048xH100": (1.582, 1.535),
    "Nemotron4 15B NeMo2 16xH100": (1.381, 1.414),
    "Nemotron4 15B NeMo 2048xH100": (1.362, 1.383),
    "Nemotron4 340B NeMo2 256xH100": (1.482, 1.407),
    "Nemotron4 340B NeMo 2048xH100": (1.387, 1.407),
    "Grok-1 314B NeMo 512xH100": (1.243, 1.371),
    "Grok-1 314B NeMo 2048xH100": (1.231, 1.372),
    "Llama4 Maverick NeMo2 512xH100": (1.148, 1.242),
    "Grok-1 314B NeMo2 128xGB200": (1.383, 1.601),
    "Grok-1 314B NeMo2 256xGB200": (1.415, 1.602),
    "Grok-1 314B NeMo2 512xGB200": (1.410, 1.602),
    "Llama3.1 405B NeMo2 128xGB200": (1.525, 1.712),
    "Llama3.1 405B NeMo2 256xGB200": (1.534, 1.712),
    "Llama3.1 405B NeMo2 512xGB200": (1.523, 1.688),
    "Nemotron4 340B NeMo2 weak 128xGB200": (1.476, 1.520),
    "Nemotron4 340B NeMo2 weak 256xGB200": (1.444, 1.508),
    "Nemotron4 340B NeMo2 weak 512xGB200": (1.439, 1.505),
    "Nemotron4 340B NeMo2 strong 128xGB200": (1.496, 1.529),
    "Nemotron4 340B NeMo2 strong 256xGB200": (1.479, 1.514),
    "Nemotron4 340B NeMo2 strong 512xGB200": (1.494, 1.513),
    "Llama4 Maverick NeMo2 128xGB200": (1.277, 1.383),
    "Llama4 Maverick NeMo2 256xGB200": (1.263, 1.383),
    "Llama4 Maverick NeMo2 512xGB200": (1.263, 1.382),
    "Llama3 70B MaxText 128xH100": (1.715, 1.529),
    "Llama3 70B MaxText 256xH100": (1.628, 1.529),
    "Llama3 70B MaxText 512xH100": (1.679, 1.529),
    "Llama3 70B MaxText 1024xH100": (1.645, 1.529),
    "Llama3 70B MaxText 2048xH100": (1.702, 1.529),
    "GPT-3 5B Paxml 16xH100": (1.349, 1.428),
    "GPT-3 5B Paxml 32xH100": (1.331, 1.428),
    "GPT-3 5B Paxml 64xH100": (1.340, 1.428),
    "GPT-3 5B Paxml 128xH100": (1.302, 1.428),
}
RATIO_UNMET = {  # pair: why (the measured and predicted speed-ups are in PAIR_RATIOS)
    **{
        f"Llama3 70B MaxText {n}xH100": "the model's FP8 speed-up is smaller than measured "
        "(1.63-1.72, above every NeMo H100 pair's 1.15-1.58): flax's FP8 dot (delayed scaling) "
        f"under XLA keeps more of the FP8 rate than the model gives it; {MAXTEXT_GPU_WHY}"
        for n in (128, 512, 1024, 2048)
    },
    **{
        f"GPT-3 5B Paxml {n}xH100": f"{RATIO_WHY} (1.30-1.35 measured); {PAXML_GPU_WHY}"
        for n in (128,)
    },
    "Grok-1 314B NeMo 512xH100": f"{RATIO_WHY} for MoE blocks (its FP8 rows -14 %, BF16 -5 %)",
    "Grok-1 314B NeMo 2048xH100": f"{RATIO_WHY} for MoE blocks (its FP8 rows -15 %, BF16 -6 %)",
    **{
        f"Grok-1 314B NeMo2 {n}xGB200": f"{RATIO_WHY} for MoE blocks (its FP8 rows -12.1 to -13.6 "
        "%, BF16 -1.0 to -0.0 %); on GB200 the FP8 GEMM level is 1.98x the BF16 one (1.77x on H100)"
        for n in (128, 256, 512)
    },
    **{
        f"Llama3.1 405B NeMo2 {n}xGB200": f"{RATIO_WHY} (its FP8 rows -17.7 to -19.7 %, BF16 -8.8 "
        "to -10.4 %); on GB200 the FP8 GEMM level is 1.98x the BF16 one (1.77x on H100)"
        for n in (128, 256, 512)
    },
    **{
        f"Llama4 Maverick NeMo2 {n}xGB200": f"{RATIO_WHY} for MoE blocks (its FP8 rows -14.4 to "
        "-15.4 %, BF16 -6.6 to -7.4 %): +0.093 to +0.106 under the flat compute model, which "
        "charged the causal attention in full at the GEMM rate; the shape model's cuDNN "
        "attention (BF16 in both precisions) is faster, so the FP8 GEMMs weigh more"
        for n in (128, 256, 512)
    },
}


def _pair_params():
    params = []
    for label, (measured, predicted) in PAIR_RATIOS.items():
        marks = ()
        if label in RATIO_UNMET:
            now = (
                f"measured {measured:.3f}, predicted {predicted:.3f} ({predicted - measured:+.3f})"
            )
            marks = _unmet("speed-up within +-0.10", now, RATIO_UNMET[label])
        params.append(pytest.param(label, marks=marks, id=label))
    return params


@pytest.fixture(scope="module")
def pairs(summary):
    return {p["label"]: p for p in summary["precision_pairs"]}


def test_the_pairs_are_nvidias_h100_and_gb200_recipes_in_both_precisions(pairs):
    """15 NeMo pairs on H100 and 15 on GB200, 5 MaxText and 4 Paxml FSDP pairs on H100: each BF16
    row has an FP8 twin of the same layout, and the measured speed-up is the published step
    times' ratio (dgxc-benchmarking READMEs; 1.15-1.58 for NeMo, 1.63-1.72 for MaxText, 1.30-1.35
    for Paxml)."""
    assert set(pairs) == set(PAIR_RATIOS)
    for label, (measured, _) in PAIR_RATIOS.items():
        assert pairs[label]["measured_ratio"] == pytest.approx(measured, abs=5e-4)
        source = GB200_PAIRS if label.endswith("xGB200") else PAIRS
        source = (
            MAXTEXT_GPU if " MaxText " in label else PAXML_GPU if " Paxml " in label else source
        )
        assert pairs[label]["source"] == source


@pytest.mark.parametrize("label", _pair_params())
def test_accuracy_fp8_speedup_within_a_tenth_on_every_pair(pairs, label):
    p = pairs[label]
    assert abs(p["predicted_ratio"] - p["measured_ratio"]) <= TARGET_RATIO, p


FP8_GROUPS = {  # machine: (its sources, FP8 rows, median |error| today)
    "H100": ((PAIRS, MBRIDGE), 18, 0.052),
    "GB200 dgxc": ((GB200_PAIRS,), 15, 0.125),
    "B200/GB200 Megatron-Bridge": ((BLACKWELL,), 8, 0.123),
    "MI355X MLPerf": ((MI355X,), 1, 0.110),
    "H100 MaxText / Paxml FSDP": ((MAXTEXT_GPU, PAXML_GPU), 14, 0.248),
}


def _fp8_median(summary, group: str) -> float:
    sources, n, _ = FP8_GROUPS[group]
    errors = [e for s in sources for e in summary["fp8_abs_errors_by_source"][s]]
    assert len(errors) == n
    return statistics.median(errors)


@pytest.mark.parametrize(
    "group",
    [
        "H100",
        pytest.param(
            "GB200 dgxc",
            marks=_unmet(
                "FP8 median <= 10 %",
                "12.5 %",
                f"{GB200_WHY}; 10.4 % under the flat compute model, 9.9 % before ZeRO-1/2's "
                "weight all-gather hid under the first forward (Megatron-Core "
                "--overlap-param-gather), which made these rows faster still",
            ),
        ),
        pytest.param(
            "B200/GB200 Megatron-Bridge",
            marks=_unmet("FP8 median <= 10 %", "12.3 %", BLACKWELL_WHY),
        ),
        pytest.param("MI355X MLPerf", marks=_unmet("FP8 median <= 10 %", "11.0 %", MI355X_WHY)),
        pytest.param(
            "H100 MaxText / Paxml FSDP",
            marks=_unmet("FP8 median <= 10 %", "24.8 %", f"{MAXTEXT_GPU_WHY}; {PAXML_GPU_WHY}"),
        ),
    ],
)
def test_accuracy_fp8_rows_median_within_10_percent(summary, group):
    """The FP8 rows of each machine's sources (H100: the 15 pairs' and Megatron-Bridge's 3 MoE
    runs, two Qwen3-30B-A3B and one Qwen3-235B-A22B, scored in step time or tokens per second):
    median |error| <= 10 %."""
    assert _fp8_median(summary, group) <= TARGET_FP8_MEDIAN


def test_regression_fp8_speedups_pin_the_current_model(pairs, summary):
    """Pins the predicted speed-ups of PAIR_RATIOS and the FP8 medians (not accuracy)."""
    for label, (_, predicted) in PAIR_RATIOS.items():
        assert pairs[label]["predicted_ratio"] == pytest.approx(predicted, abs=0.005), label
    for group, (_, _, median) in FP8_GROUPS.items():
        assert _fp8_median(summary, group) == pytest.approx(median, abs=0.005), group


def test_a_pair_is_found_only_between_rows_that_differ_in_precision():
    """Two rows of one source and layout pair up; changing any layout column breaks the pair."""
    bf16 = _case(PAIRS, "8.0")
    fp8 = next(r for r in _rows() if r["case"] == bf16["case"].replace("BF16", "FP8"))

    def outcome(row, measured):
        return validate.Outcome(row, row["measured_metric"], measured, measured, True)

    (pair,) = validate.precision_pairs([outcome(bf16, 12.0), outcome(fp8, 8.0)])
    assert pair["measured_ratio"] == pytest.approx(1.5)
    other = dict(fp8, microbatch="2")
    assert validate.precision_pairs([outcome(bf16, 12.0), outcome(other, 8.0)]) == []


def test_7b_fp8_plan_that_does_not_fit_where_bf16_does_names_the_missing_memory():
    """Megatron-LM issue #1237: a 7B model on H100 runs with ``--bf16`` and runs out of memory
    with FP8 (``--fp8-format hybrid``, delayed scaling with an amax history, no FP8 parameters;
    no pipeline parallelism; ``--recompute-granularity selective`` did not help). The issue gives
    no memory figures, batch or tensor degree, so the check spans those on one 8-GPU DGX H100
    node: Llama-2 7B (conf/model/llama2_7b), sequence 4096, distributed optimizer. Where the
    model says BF16 fits and FP8 does not, the FP8 row's note says how many GiB are missing and
    what the rank holds; the difference is Transformer Engine's cached FP8 weight and its
    transpose (2 bytes per parameter of the blocks' linear layers: TE issue #1261), and
    selective recompute does not close it (as reported). FP8 parameters
    (``--fp8-param-gather``), which make the FP8 copy the weight, fit."""
    row = dict(
        source="Megatron-LM#1237",
        case="7B FP8 OOM",
        model_params_b="6.7",
        model="llama2_7b",
        seq="4096",
        gpus="8",
        tp="1",
        pp="1",
        dp="8",
        global_batch_seqs="64",
        microbatch="2",
        zero_stage="1",
        recompute="selective",
        gpu="H100-80GB (DGX H100)",
        measured_metric="step_time_s",
        measured_value="1",
    )
    bf16 = validate.predict(row)
    fp8 = validate.predict(dict(row, precision="fp8", fp8_recipe="delayed"))
    assert bf16.feasible is True and fp8.feasible is False
    assert fp8.note.startswith("model says out of memory: ") and "GiB short" in fp8.note
    short_gib = float(fp8.note.split("memory: ")[1].split(" GiB short")[0])
    problem, plan = validate.problem_and_plan(dict(row, precision="fp8"))
    report = evaluate(problem, plan)
    (rank,) = report.ranks
    assert short_gib == pytest.approx(
        (rank.memory.total_bytes - rank.memory.capacity_bytes) / 2**30, abs=0.01
    )
    _, plan16 = validate.problem_and_plan(row)
    (rank16,) = evaluate(*validate.problem_and_plan(row)).ranks
    spec = problem.model.spec
    linear = (
        problem.model.total_params()
        - 2 * spec.vocab * spec.hidden
        - (2 * spec.layers + 1) * spec.hidden
    )
    assert rank.memory.weights_bytes - rank16.memory.weights_bytes == pytest.approx(2 * linear)
    assert validate.predict(dict(row, precision="fp8", recompute="none")).feasible is False
    gathered = validate.predict(dict(row, precision="fp8", fp8_param_gather="true"))
    assert gathered.feasible is True


# ----------------------------------------------------------------------- what a row asks for
def test_a_gpu_is_scored_only_under_its_exact_name():
    """Any text containing "H100" used to be scored as the 80 GB SXM part; now an H100 PCIe (or
    any unknown name) is a one-line error listing the accepted names."""
    row = _mixtral_row()
    for gpu in ("H100 PCIe", "H100", "NVIDIA H100-80GB (DGX H100) x8", "A100-SXM-40GB"):
        outcome = validate.predict(dict(row, gpu=gpu))
        assert outcome.predicted is None and f"gpu {gpu!r} is not known" in outcome.note
        assert "H100-80GB (DGX H100)" in outcome.note and "\n" not in outcome.note
    for gpu in validate.GPUS:
        assert validate.predict(dict(row, gpu=gpu)).predicted is not None


def test_a_row_may_name_its_own_device_preset():
    """``gpu_preset`` names any conf/device preset (``gpu`` is then a label): an H200 row is scored
    with the H200's memory (the 143,156 MiB CUDA exposes of its "141 GB",
    conf/device/h200_sxm.yaml), an unknown preset is a one-line error listing them."""
    row = dict(_mixtral_row(), gpu="H200 SXM (our cluster)", gpu_preset="h200_sxm")
    problem, _ = validate.problem_and_plan(row)
    assert problem.cluster.device.hbm_bytes == pytest.approx(143156 * 2**20, rel=1e-6)
    outcome = validate.predict(dict(row, gpu_preset="b300"))
    assert (
        outcome.predicted is None
        and "gpu_preset='b300' is not a conf/device preset" in outcome.note
    )
    assert "h100_sxm" in outcome.note and "\n" not in outcome.note


def test_a_row_may_name_its_cluster_preset_and_nvlink_domain():
    """``cluster_preset`` names a conf/cluster preset: its first level is the row's NVLink domain
    and its second the network, with the preset's device and link speeds. A GB200 NVL72 rack
    joins 72 GPUs by NVLink 5 (NVIDIA GB200 NVL72 data sheet), so 72 GPUs are one domain; a run
    on fewer GPUs has them all in one; ``nvlink_domain`` gives the domain a run used (the dgxc
    GB200 rows: 64, as 128-512 GPUs are not multiples of 72); a size that does not divide the
    GPUs, or an unknown preset, is a one-line error naming the column."""
    row = next(r for r in _rows() if r["source"] == GB200_PAIRS and r["gpus"] == "128")
    problem, _ = validate.problem_and_plan(row)
    cluster = problem.cluster
    assert cluster.device.name == "gb200" and cluster.device.peak_flops_per_s == 2500e12
    assert [lv.fanout for lv in cluster.levels] == [64, 2]
    assert cluster.levels[0].bw_bytes_per_s == 900e9 and cluster.levels[1].bw_bytes_per_s == 50e9
    for gpus, domain, fanouts in (("72", "", [72, 1]), ("144", "", [72, 2]), ("8", "", [8, 1])):
        changed = dict(row, gpus=gpus, nvlink_domain=domain)
        assert [lv.fanout for lv in validate.build_row_cluster(changed).levels] == fanouts
    b200 = next(r for r in _rows() if r["source"] == BLACKWELL and r["gpu"].startswith("B200"))
    assert validate.problem_and_plan(b200)[0].cluster.device.name == "b200"
    for changes, named in (
        ({"nvlink_domain": "48"}, "gpus=128 is not a multiple of 48 GPUs per node"),
        ({"nvlink_domain": "x"}, "nvlink_domain='x' must be a positive whole number"),
        ({"cluster_preset": "nvl72"}, "cluster_preset='nvl72' is not a conf/cluster preset"),
        ({"cluster_preset": "leaf_spine"}, "cluster_preset='leaf_spine' is a graph"),
    ):
        outcome = validate.predict(dict(row, **changes))
        assert outcome.predicted is None and named in outcome.note, outcome.note
        assert "\n" not in outcome.note


def test_unknown_precision_or_recipe_is_a_one_line_row_error():
    for changes, named in (
        ({"precision": "fp4"}, "training.precision='fp4'"),
        ({"precision": "fp8", "fp8_recipe": "rowwise"}, "training.fp8_recipe='rowwise'"),
        ({"fp8_param_gather": "true"}, "fp8_param_gather=true needs training.precision=fp8"),
        ({"precision": "fp8", "fp8_recipe": "mxfp8"}, "mxfp8 needs Blackwell"),
        ({"precision": "fp8", "gpu": "A100-SXM-80GB"}, "has no FP8 tensor cores"),
        ({"fp8_param_gather": "maybe"}, "'maybe' as yes/no"),
    ):
        outcome = validate.predict(_mixtral_row(**changes))
        assert outcome.predicted is None, changes
        assert named in outcome.note and "\n" not in outcome.note, outcome.note


def test_a_model_preset_gives_the_shape_and_the_columns_must_agree():
    """``model`` names a conf/model preset: its shape (here DeepSeek-V3's MLA, shared expert,
    dense first blocks and MTP module) with the row's sequence length; a shape column that
    disagrees, or an unknown preset, is a one-line error."""
    row = next(r for r in _rows() if r["source"] == DSV3 and r["tp"] == "1")
    problem, plan = validate.problem_and_plan(row)
    spec = problem.model.spec
    assert (spec.attention, spec.shared_experts, spec.first_dense_layers, spec.mtp_layers) == (
        "mla",
        1,
        3,
        1,
    )
    assert spec.seq_len == int(row["seq"]) and plan.ep == 64
    for changes, named in (
        ({"layers": "60"}, "layers='60' but model preset 'deepseek_v3' has 61"),
        ({"bias": "true"}, "bias='true' but model preset 'deepseek_v3' has False"),
        ({"model": "deepseek_v4"}, "model='deepseek_v4' is not a conf/model preset"),
    ):
        outcome = validate.predict(dict(row, **changes))
        assert outcome.predicted is None and named in outcome.note, outcome.note
        assert "\n" not in outcome.note
    assert validate.predict(dict(row, layers="61", top_k="8")).predicted is not None


def test_a_head_dim_column_must_agree_with_the_model_preset():
    """Llama 4 Maverick's preset has 40 heads of 128 on hidden 5120: ``head_dim`` 128 agrees,
    64 is a one-line error naming both."""
    row = next(r for r in _rows() if r.get("model") == "llama4_maverick")
    assert validate.predict(dict(row, head_dim="128")).predicted is not None
    outcome = validate.predict(dict(row, head_dim="64"))
    assert outcome.predicted is None
    assert "head_dim='64' but model preset 'llama4_maverick' has 128" in outcome.note


QWEN3_30B_RECIPES = {  # case prefix: (moe_dispatcher, ep_comm_overlap) its recipe sets
    # 25.11 (Megatron-Bridge v0.2.0, 7af9601c, scripts/performance/configs/qwen3/
    # workload_base_configs.py): QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG moe_a2a_overlap=True,
    # turned by utils/helpers.py set_moe_a2a_overlap_overrides into
    # overlap_moe_expert_parallel_comm = True; no flex backend
    "Qwen3-30B-A3B 16xH100 FP8-CS TP1 PP2 VP24": ("alltoall", "true"),
    # 26.06 (4ab94dfa, src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py,
    # qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config): moe_flex_dispatcher_backend = "hybridep",
    # moe_a2a_overlap = False
    "Qwen3-30B-A3B 16xH100 FP8 TP1 PP1 EP16": ("deepep", "false"),
    # 25.11: QWEN3_30B_A3B_GB200_FP8_MX_BASE_CONFIG moe_flex_dispatcher_backend="hybridep"
    "Qwen3-30B-A3B 8xGB200 FP8-MX TP1 PP1 EP8": ("deepep", "false"),
    # 25.11: QWEN3_30B_A3B_B200_FP8_MX_BASE_CONFIG sets no flex backend, no a2a overlap
    "Qwen3-30B-A3B 8xB200 FP8-MX TP1 PP1 EP8": ("alltoall", "false"),
}


def test_the_qwen3_30b_rows_run_the_dispatcher_and_overlap_their_recipes_set():
    """Megatron-Bridge's Qwen3-30B-A3B rows carry their recipe's dispatcher (HybridEP, DeepEP's
    hybrid-ep branch behind the flex dispatcher, is priced as ``deepep``) and EP all-to-all
    overlap, as the recipes of the rows' releases set them (QWEN3_30B_RECIPES)."""
    rows = [r for r in _rows() if r["case"].startswith("Qwen3-30B-A3B")]
    assert len(rows) == len(QWEN3_30B_RECIPES)
    for prefix, (dispatcher, overlap) in QWEN3_30B_RECIPES.items():
        (row,) = [r for r in rows if r["case"].startswith(prefix)]
        assert (row.get("moe_dispatcher") or "alltoall") == dispatcher, prefix
        assert (row.get("ep_comm_overlap") or "false") == overlap, prefix


HOST_LAUNCH_HIGH_S = 20e-6
"""The top of the CPU time per kernel launch "usually" seen in PyTorch traces, 5-20 us
(HolisticTraceAnalysis, ``docs/source/features/cuda_kernel_launch_stats.rst`` at 0c2146a8, "Short
GPU kernels"): a range from a trace tool's docs, not a micro-benchmark, so no cost term."""


def _listed_kernels_host_share(row: dict) -> float:
    """The largest, over a row's pipeline stages, of (kernels the cost model charges a fixed
    per-kernel time for) x HOST_LAUNCH_HIGH_S / (the stage's modelled device compute per
    microbatch). The count is the derivative of the stage's compute in the device's
    ``kernel_overhead_s`` and ``fp8_kernel_overhead_s`` (FP8 GEMMs' own, where set), one of
    which every listed kernel adds once."""
    import dataclasses

    def stages(bump_s):
        problem, plan = validate.problem_and_plan(row)
        device = problem.cluster.device
        fp8_s = device.fp8_kernel_overhead_s
        device = dataclasses.replace(
            device,
            kernel_overhead_s=device.kernel_overhead_s + bump_s,
            fp8_kernel_overhead_s=None if fp8_s is None else fp8_s + bump_s,
        )
        problem = dataclasses.replace(
            problem, cluster=dataclasses.replace(problem.cluster, device=device)
        )
        return {
            s.index: s.compute_fwd_s + s.compute_bwd_s + s.recompute_s
            for s in evaluate(problem, plan).stages
        }

    base, bumped = stages(0.0), stages(1e-6)
    shares = [(bumped[i] - t) / 1e-6 * HOST_LAUNCH_HIGH_S / t for i, t in base.items()]
    assert min(shares) > 0  # every stage launches kernels the model lists
    return max(shares)


@pytest.mark.parametrize(
    "source, case, most",
    [(MBRIDGE, "", 0.21), (BLACKWELL, "Qwen3-30B", 0.46), (MOEZOO, "", 0.27), (MEGATRON, "", 0.15)],
)
def test_host_issue_time_of_the_listed_kernels_would_not_bind(source, case, most):
    """Why no host-time term (docs/trust/fidelity.md, fine-grained small MoE): a step is at
    least its kernels' CPU issue time, but for the kernels the model lists even 20 us per launch
    stays under the modelled device time of every stage of the over-predicted rows (the
    Megatron-Core small GPTs and the MoE sources: at most ``most`` of it, as the WHY texts
    say), so ``max(device, host)`` would move none of them."""
    rows = {r["case"]: r for r in _rows() if r["source"] == source and case in r["case"]}
    assert rows
    share = max(_listed_kernels_host_share(r) for r in rows.values())
    assert share == pytest.approx(most, abs=0.005)


def test_a_bad_activation_offload_blocks_is_a_one_line_row_error_naming_the_column():
    """``activation_offload_blocks`` is blank (no partial count) or the number of first blocks
    whose activations go to host memory: a non-number, zero, a fraction, or more blocks than the
    model has is a one-line row error naming the value and what the column takes."""
    row = next(
        r for r in _rows() if r["source"] == MBFSDP and r["activation_offload_blocks"].strip()
    )
    for value, named in (
        ("abc", "activation_offload_blocks='abc' must be a positive whole number"),
        ("0", "activation_offload_blocks='0' must be a positive whole number"),
        ("2.5", "activation_offload_blocks='2.5' must be a positive whole number"),
        ("999", "activation_offload_blocks=999 but the model has 80 blocks; use at most 80"),
    ):
        outcome = validate.predict(dict(row, activation_offload_blocks=value))
        assert outcome.predicted is None and named in outcome.note, outcome.note
        assert "\n" not in outcome.note and "blank: 1" not in outcome.note
