"""``solver=recipes``: published layouts and NVIDIA's rule table, as data with their sources.

What is checked: every entry names its source and its numbers agree with the published line it
quotes; each entry, run on the model, devices, batch and hardware it was published for, gives
back its published degrees; the rule table's numbers agree with its published text and a run
applies each rule (size row, MoE, sequence length, TP inside the node, row order); a layout that
cannot run falls back to the table with the reason, and every adaptation is recorded.
"""

import re
from pathlib import Path

import hydra
import pytest
import yaml
from hydra.utils import instantiate

import nest.app.cli
from baselines.recipes import RecipesPlanner, load_recipes
from nest.app.config import build_problem
from nest.core.build import PlanSettings, build_plan
from nest.core.errors import Infeasible, InvalidConfiguration, UserError
from nest.core.units import GiB
from nest.cost import evaluate
from nest.dp.space import chunk_split

from .conftest import make_cluster, make_problem, make_spec

DATA = load_recipes()
ENTRIES = DATA["recipes"]
TABLE = DATA["rule_table"]
CONF = Path(nest.app.cli.CONF_DIR)
DEVICE_PRESETS = {p.stem for p in (CONF / "device").glob("*.yaml")}


def compose(*overrides):
    with hydra.initialize_config_dir(config_dir=nest.app.cli.CONF_DIR, version_base="1.3"):
        return hydra.compose(config_name="config", overrides=list(overrides))


def solve(*overrides, solver=()):
    cfg = compose("solver=recipes", *solver, *overrides)
    problem = build_problem(cfg)
    return problem, instantiate(cfg.solver, _convert_="all").solve(problem)


def number(text: str) -> int:
    return int(text.replace(",", ""))


# ------------------------------------------------------------------------------- the entries


def test_every_entry_has_a_source_and_matches_its_preset():
    assert len({e["id"] for e in ENTRIES}) == len(ENTRIES)
    for e in ENTRIES:
        assert e["source"].strip() and len(e["source"]) > 40, e["id"]
        url = e["url"]
        pinned = re.search(r"github\.com/[^/]+/[^/]+/blob/[0-9a-f]{40}/", url)
        assert pinned or url.startswith("https://arxiv.org/abs/"), (e["id"], url)
        preset = yaml.safe_load((CONF / "model" / f"{e['model']}.yaml").read_text())
        assert (e["layers"], e["hidden"]) == (preset["layers"], preset["hidden"]), e["id"]
        assert e["device"] is None or e["device"] in DEVICE_PRESETS or e["device"] == "h100_96gb"
        assert e["gpus"] % (e["tp"] * e["cp"] * e["pp"]) == 0, e["id"]
        assert e["recompute"] in (None, "none", "selective", "full")
        assert e["zero_stage"] in (1, 2, 3)


def quoted(e: dict) -> dict:
    """The numbers of the published line an entry's ``source`` quotes, by kind of source."""
    src = " ".join(e["source"].split())
    if row := re.search(r'row "pre_train,[\w.]+,\w+,h100,bf16,([\d,]+)"', src):
        gpus, seq, tp, pp, cp, ep, vp, mbs, gbs = (int(x) for x in row.group(1).split(","))
        return dict(gpus=gpus, seq_len=seq, tp=tp, pp=pp, cp=cp, ep=ep, vp=vp, microbatch=mbs,
                    global_batch=gbs)  # fmt: skip
    if row := re.search(
        r"([\d,]+) GPUs, TP (\d+), CP (\d+), PP (\d+), DP (\d+), sequence length ([\d,]+), "
        r"batch size/DP (\d+)",
        src,
    ):
        gpus, tp, cp, pp, dp, seq, per_dp = (number(x) for x in row.groups())
        return dict(gpus=gpus, tp=tp, cp=cp, pp=pp, dp=dp, seq_len=seq, global_batch=dp * per_dp)
    if row := re.search(r"(\d+) GPUs \(FSDP (\d+), TP (\d+)(?:, PP (\d+))?\)", src):
        gpus, fsdp, tp = (int(x) for x in row.groups()[:3])
        pp = int(row.group(4) or 1)
        local = int(re.search(r"local batch size (\d+)", src).group(1))
        out = dict(gpus=gpus, tp=tp, pp=pp, dp=fsdp, zero_stage=3, recompute="full")
        out["global_batch"] = int(re.search(r"global batch size (\d+)", src).group(1))
        assert out["global_batch"] == fsdp * local
        if pp == 1:
            out["microbatch"] = local  # no pipeline: the local batch is one microbatch
        return out
    if row := re.search(r'"a preset for (\d+) (?:A100|H100) GPUs"', src):
        gpus = int(row.group(1))
        local = int(re.search(r"(?:local_)?batch_size (\d+)", src).group(1))
        tp = int(re.search(r"tensor_parallel_degree (\d+)", src).group(1))
        fsdp = int(re.search(r"FSDP over the rest: (\d+)", src).group(1))
        assert fsdp * tp == gpus
        seq = int(re.search(r"seq_len (\d+)", src).group(1))
        return dict(gpus=gpus, tp=tp, pp=1, cp=1, dp=fsdp, seq_len=seq, microbatch=local,
                    global_batch=fsdp * local, zero_stage=3, recompute="full")  # fmt: skip
    if row := re.search(
        r"num_nodes=(\d+), num_gpus_per_node=(\d+), TP (\d+), PP (\d+), CP (\d+)", src
    ):
        nodes, per, tp, pp, cp = (int(x) for x in row.groups())
        seq = int(re.search(r"seq_length (\d+)", src).group(1))
        gbs = int(re.search(r"global_batch_size (\d+)", src).group(1))
        mbs = int(re.search(r"micro_batch_size (\d+)", src).group(1))
        return dict(gpus=nodes * per, tp=tp, pp=pp, cp=cp, seq_len=seq, global_batch=gbs,
                    microbatch=mbs)  # fmt: skip
    raise AssertionError(f"{e['id']}: no published line found in its source")


@pytest.mark.parametrize("e", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_entry_numbers_agree_with_the_published_line_they_quote(e):
    got = quoted(e)
    if "dp" in got:
        assert got.pop("dp") == e["gpus"] // (e["tp"] * e["cp"] * e["pp"])
    assert {k: e[k] for k in got} == got


def device_overrides(e: dict) -> list[str]:
    """The project's hardware closest to the published one (H100 96 GB: the H100 preset with
    96 GB; no GPU named: H100)."""
    if e["device"] == "h100_96gb":
        return ["device@cluster.device=h100_sxm", "cluster.device.hbm_gb=96"]
    return [f"device@cluster.device={e['device'] or 'h100_sxm'}"]


@pytest.mark.parametrize("e", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_an_entry_reproduces_its_published_layout_at_its_published_scale(e):
    """Model, devices (8 per node), batch and hardware as published: the plan has the published
    degrees, DP from the devices, the published microbatch, depth and ZeRO stage, no idle
    device, and lists no adaptation of a published value."""
    mbs = f"[{e['microbatch']}]" if e["microbatch"] else "[1,2,4]"
    problem, plan = solve(
        f"model={e['model']}",
        f"model.seq_len={e['seq_len']}",
        "cluster=dgx_8x8",
        f"cluster.devices={e['gpus']}",
        *device_overrides(e),
        f"training.global_batch={e['global_batch']}",
        f"training.microbatch_sizes={mbs}",
        solver=[f"solver.entry={e['id']}"],
    )
    assert evaluate(problem, plan).feasible
    got = (plan.tp, plan.cp, plan.pp, plan.ep, plan.dp)
    assert got == (e["tp"], e["cp"], e["pp"], e["ep"], e["gpus"] // (e["tp"] * e["cp"] * e["pp"]))
    assert plan.zero_stage == e["zero_stage"]
    assert plan.sequence_parallel == e["sequence_parallel"]
    if e["microbatch"] is not None:
        assert plan.microbatch_size == e["microbatch"]
    if e["vp"] is not None:
        assert plan.virtual_stages == e["vp"]
    if e["recompute"] is not None:
        assert {s.recompute.value for s in plan.stages} == {e["recompute"]}
    search = plan.search
    assert (search["source"], search["entry"], search["devices_idle"]) == ("published", e["id"], 0)
    assert all("not published" in a for a in search["adapted"]), search["adapted"]


def nearest(problem_overrides: list[str]) -> list[str]:
    problem = build_problem(compose(*problem_overrides))
    return [e["id"] for e in RecipesPlanner().entries_for(problem, DATA)[0]]


def test_the_entry_nearest_in_device_count_is_tried_first():
    base = ["model=llama3_405b", "cluster=dgx_8x8"]
    assert nearest([*base, "cluster.devices=16384"])[0] == "llama3_paper_405b_16k"
    assert nearest([*base, "cluster.devices=8192"])[0] == "llama3_paper_405b_8k"
    assert nearest([*base, "cluster.devices=1024"])[0] == "nemo_llama31_405b_h100"
    # 128K tokens: only the long-context layout is for this sequence length
    assert nearest([*base, "cluster.devices=1024", "model.seq_len=131072"]) == [
        "llama3_paper_405b_16k_long"
    ]
    # 64 GPUs of Llama-3 70B: NeMo (H100) and torchtitan (A100) tie on scale; the device decides
    seventy = ["model=llama3_70b", "cluster=dgx_8x8", "cluster.devices=64"]
    assert nearest(seventy)[0] == "nemo_llama3_70b_h100"
    a100 = nearest([*seventy, "device@cluster.device=a100_80gb"])
    assert a100[0] == "torchtitan_llama3_70b_a100"


def test_the_fastest_published_layout_is_kept_and_each_is_the_one_scored():
    """Llama-3.1 405B on 2,048 GPUs: every entry for its sequence length is adapted and scored;
    the plan is the fastest, and each entry's time is what running that entry alone gives."""
    case = ["model=llama3_405b", "cluster=dgx_8x8", "cluster.devices=2048"]
    case += ["training.global_batch=1024", "training.microbatch_sizes=[1]"]
    problem, plan = solve(*case)
    times = {s["entry"]: s["iteration_time_s"] for s in plan.search["entries_scored"]}
    skipped = plan.search.get("entries_skipped", [])
    at_8k = [e for e in ENTRIES if e["model"] == "llama3_405b" and e["seq_len"] == 8192]
    assert len(times) + len(skipped) == len(at_8k) >= 4
    assert plan.search["entry"] == min(times, key=times.get)
    assert plan.objective_s == min(times.values())
    for entry, t in times.items():
        _, alone = solve(*case, solver=[f"solver.entry={entry}"])
        assert alone.objective_s == pytest.approx(t, rel=1e-12)
    _, near = solve(*case, solver=["solver.pick=nearest"])
    first = nearest(case)[0]  # 1024 and 4096 tie on scale: the file order decides
    assert near.search["entry"] == first if first in times else near.search["entry"] in times


# ------------------------------------------------------------------------------- adaptation


def test_a_layout_run_at_another_scale_keeps_its_degrees_and_records_every_change():
    problem, plan = solve("model=gpt3_175b", "cluster=dgx_8x8", "cluster.devices=1024")
    assert (plan.tp, plan.cp, plan.pp, plan.virtual_stages) == (4, 1, 8, 6)
    assert plan.dp == 32 and plan.search["entry"] == "nemo_gpt3_175b_h100"
    adapted = " | ".join(plan.search["adapted"])
    assert "devices 128 -> 1024" in adapted
    assert "global batch 256 -> 1024" in adapted
    assert "dp 4 -> 32" in adapted


def test_a_published_depth_that_cannot_run_drops_to_the_largest_that_can():
    """GPT-3's vp=6 with 12 microbatches per replica: interleaving needs them divisible by
    pp=8 (Megatron), so no depth above 1 runs; the plan says so."""
    problem, plan = solve(
        "model=gpt3_175b",
        "cluster=dgx_8x8",
        "cluster.devices=128",
        "training.global_batch=48",
        "training.microbatch_sizes=[1]",
    )
    assert (plan.tp, plan.pp, plan.dp, plan.num_microbatches) == (4, 8, 4, 12)
    assert plan.virtual_stages == 1
    assert any(a.startswith("vp 6 -> 1") and "divide by pp" in a for a in plan.search["adapted"])


def test_a_published_microbatch_the_run_does_not_offer_is_replaced_and_recorded():
    problem, plan = solve(
        "model=llama3_70b",
        "cluster=dgx_8x8",
        "cluster.devices=64",
        "device@cluster.device=a100_80gb",
        "training.global_batch=64",
        "training.microbatch_sizes=[1,2]",
        solver=["solver.entry=torchtitan_llama3_70b_a100"],
    )
    assert plan.search["entry"] == "torchtitan_llama3_70b_a100"
    assert plan.microbatch_size in (1, 2)
    assert any(a.startswith("microbatch 8 -> ") for a in plan.search["adapted"])


def test_a_layout_that_cannot_run_falls_back_to_the_rule_table_with_the_reason():
    """Mixtral's recipe on 16 GPUs: pp 4 leaves dp 4, and ep 8 must divide dp x cp."""
    problem, plan = solve("model=mixtral_8x7b", "cluster=dgx_8x8", "cluster.devices=16")
    search = plan.search
    assert search["source"] == "rule_table"
    assert "nemo_mixtral_8x7b_h100" in search["fallback"] and "ep=8" in search["fallback"]
    assert evaluate(problem, plan).feasible


def test_a_model_changed_from_its_preset_uses_no_entry():
    problem, plan = solve("model=llama2_7b", "model.layers=16")
    assert plan.search["source"] == "rule_table"
    assert "is for 32 blocks" in plan.search["fallback"]


def test_a_hugging_face_card_of_a_preset_finds_its_recipes():
    """``model=hf`` on Llama-2 7B's config.json has another name but the preset's architecture:
    the same entry, the same plan and time as ``model=llama2_7b``, and the match is recorded."""
    card = str(Path(nest.app.cli.CONF_DIR).parent / "data" / "hf" / "llama2_7b.json")
    _, hf = solve("model=hf", f"model.config_path={card}")
    _, preset = solve("model=llama2_7b")
    assert hf.search["entry"] == preset.search["entry"] == "nemo_llama2_7b"
    assert "llama2_7b's architecture" in hf.search["model_match"]
    assert "model_match" not in preset.search
    assert hf.objective_s == pytest.approx(preset.objective_s, rel=1e-12)


def test_a_chosen_entry_must_fit_the_model_and_run_or_say_why():
    with pytest.raises(UserError, match="solver.entry='nope'"):
        solve("model=llama2_7b", solver=["solver.entry=nope"])
    with pytest.raises(UserError, match="is for llama3_405b"):
        solve("model=llama2_7b", solver=["solver.entry=nemo_llama31_405b_h100"])
    with pytest.raises(InvalidConfiguration, match="= 128 devices, the cluster has 64"):
        solve("model=llama3_405b", solver=["solver.entry=nemo_llama31_405b_h100"])
    with pytest.raises(UserError, match="solver.source='best'"):
        solve("model=llama2_7b", solver=["solver.source=best"])
    with pytest.raises(UserError, match="solver.pick='best'"):
        solve("model=llama2_7b", solver=["solver.pick=best"])


def test_nothing_fits_is_infeasible_with_the_memory_it_would_need():
    with pytest.raises(Infeasible) as info:
        solve("model=llama3_405b", "cluster=dgx_8x8", "cluster.devices=16")
    assert info.value.min_memory_bytes > 80 * GiB


# ------------------------------------------------------------------------------- the rule table


def parse_size_text(text: str) -> dict:
    """``TP=4-8 + PP=2-4 + CP=2 + DP`` -> ranges; ``DP only`` -> all 1."""
    out = {"tp": [1, 1], "pp": [1, 1], "cp": None}
    for axis, lo, hi in re.findall(r"(TP|PP|CP)=(\d+)(?:-(\d+))?", text):
        out[axis.lower()] = [int(lo), int(hi or lo)]
    return out


def test_the_table_rows_agree_with_their_published_text():
    bounds = [0]
    for row in TABLE["dense"]:
        assert {k: row[k] for k in ("tp", "pp", "cp")} == parse_size_text(row["text"])
        lo, hi = re.fullmatch(r"(?:< )?(\d+)(?:-(\d+))?B", row["size"]).groups()
        assert row["max_params_b"] == int(hi or lo) and bounds[-1] == (int(lo) if hi else 0)
        bounds.append(row["max_params_b"])
    for row in TABLE["sequence"]:
        k = {"2K": 2048, "8K": 8192, "32K": 32768}
        span = re.match(r"(?:< (\w+)|(\w+)-(\w+)|(\w+)\+):", row["text"]).groups()
        lo = k.get(span[1] or span[3], 0)
        hi = k.get(span[0] or span[2])
        assert (row["min_seq"], row["max_seq"]) == (lo, hi)
        cp = re.search(r"CP=(\d+)(?:-(\d+))?", row["text"])
        assert row["cp"] == (None if cp is None else [int(cp[1]), int(cp[2] or cp[1])])
    assert parse_size_text("TP=1-2")["tp"] == TABLE["moe"]["tp"]


# Parameter counts (docs/plan/presets.md): BERT-large 0.34B, Llama-2 7B 6.74B, Mixtral 46.7B,
# Llama-3 70B 70.55B, GPT-3 174.6B, Llama-3.1 405B 405.9B; sequence lengths from the presets.
PUBLISHED_RULE = {
    # model: (size row, tp range, pp range, cp)
    "bert_large": ("< 1B", {1}, {1}, 1),  # seq 512: no CP
    "llama2_7b": ("1-10B", {2, 4}, {1}, 1),  # seq 4096: SP, no CP
    "llama3_70b": ("70-175B", {8}, set(range(4, 9)), 2),  # seq 8192: CP 2
    "gpt3_175b": ("70-175B", {8}, set(range(4, 9)), 1),  # seq 2048
    "llama3_405b": ("175-500B", {8}, set(range(8, 17)), 2),
    "mixtral_8x7b": ("10-70B", {1, 2}, set(range(2, 5)), 1),  # MoE: TP 1-2, PP from its row
}


@pytest.mark.parametrize("model", sorted(PUBLISHED_RULE))
def test_the_rule_table_is_applied_as_published(model):
    row, tps, pps, cp = PUBLISHED_RULE[model]
    problem, plan = solve(
        f"model={model}",
        "cluster=dgx_8x8",
        "cluster.devices=1024",
        "training.microbatch_sizes=[1]",
        solver=["solver.source=rules"],
    )
    assert plan.search["source"] == "rule_table" and plan.search["rule"]["row"] == row
    assert plan.tp in tps and plan.pp in pps and plan.cp == cp
    assert plan.zero_stage == 1 and plan.sequence_parallel == (plan.tp > 1)
    used = plan.tp * plan.cp * plan.pp * plan.dp
    assert plan.devices_used == used and plan.dp == 1024 // (plan.tp * plan.cp * plan.pp)
    if model == "mixtral_8x7b":
        assert plan.ep == 8 and "moe" in plan.search["rule"]
    assert evaluate(problem, plan).feasible


def tiny_table(tmp_path: Path, params: float, **over) -> str:
    """A rule table scaled to a test model of ``params`` parameters: rows below 0.5x, below 2x
    and below 100x its size, so the model sits in the middle row."""
    b = params / 1e9
    table = {
        "url": "test",
        "dense": [
            {"size": "small", "max_params_b": b / 2, "text": "DP only", "tp": [1, 1], "pp": [1, 1]},
            {"size": "mid", "max_params_b": 2 * b, "text": "TP=2-4", "tp": [2, 4], "pp": [1, 1]},
            {
                "size": "big",
                "max_params_b": 100 * b,
                "text": "TP=2 + PP=2-4",
                "tp": [2, 2],
                "pp": [2, 4],
            },  # fmt: skip
        ],
        "moe": {"tp": [1, 2], "text": "TP 1-2"},
        "sequence": [
            {"text": "short", "min_seq": 0, "max_seq": 64, "cp": None},
            {"text": "long: CP=2", "min_seq": 64, "max_seq": None, "cp": [2, 2]},
        ],
        "zero_stage": 1,
    }
    table.update(over)
    path = tmp_path / "recipes.yaml"
    path.write_text(yaml.safe_dump({"recipes": [], "rule_table": table}))
    return str(path)


def rules(path: str) -> RecipesPlanner:
    return RecipesPlanner(source="rules", recipes_file=path)


def test_tp_stays_inside_the_node_and_the_faster_of_the_range_is_kept(tmp_path):
    spec = make_spec(seq_len=32)
    small_node = make_problem(spec, make_cluster(fanouts=(2, 4)))
    path = tiny_table(tmp_path, small_node.model.total_params())
    plan = rules(path).solve(small_node)
    assert plan.search["rule"]["row"] == "mid" and plan.tp == 2  # 4 does not fit a node of 2
    wide = make_problem(spec, make_cluster(fanouts=(4, 2)))
    plan = rules(path).solve(wide)
    assert plan.tp in (2, 4)
    for tp in (2, 4):  # every microbatch of the other TP degree is no faster
        for mbs in (1, 2):
            other = build_plan(
                wide,
                PlanSettings(tp=tp, dp=8 // tp, microbatch_size=mbs, zero_stage=1,
                             sequence_parallel=True),
            )  # fmt: skip
            assert plan.objective_s <= evaluate(wide, other).iteration_time_s + 1e-12


def test_the_sequence_rule_sets_context_parallelism(tmp_path):
    problem = make_problem(make_spec(seq_len=64), make_cluster(fanouts=(4, 2)))
    plan = rules(tiny_table(tmp_path, problem.model.total_params())).solve(problem)
    assert plan.cp == 2 and plan.search["rule"]["sequence"] == "long: CP=2"


def test_rows_are_walked_up_for_memory_and_down_for_devices(tmp_path):
    spec = make_spec(layers=8, seq_len=32, vocab=64)  # blocks outweigh embedding and head
    roomy = make_problem(spec, make_cluster(fanouts=(4, 2)))
    path = tiny_table(tmp_path, roomy.model.total_params())
    # the own row ("mid": no pipeline) needs more memory than the devices have; "big" pipelines
    mid = build_plan(roomy, PlanSettings(tp=4, dp=2, microbatch_size=1, recompute="full",
                                         zero_stage=1, sequence_parallel=True))  # fmt: skip
    need = evaluate(roomy, mid).peak_memory_bytes
    tight = make_problem(spec, make_cluster(fanouts=(4, 2), hbm_bytes=need * 0.97))
    plan = rules(path).solve(tight)
    assert plan.search["rule"]["row"] == "big" and plan.search["rule"]["own_row"] == "mid"
    assert plan.pp in (2, 4) and evaluate(tight, plan).feasible
    # a model of the "big" row on 2 devices: its TP 2 x PP 2-4 do not fit; the rows below run
    two = make_problem(spec, make_cluster(fanouts=(2,)))
    path = tiny_table(tmp_path, two.model.total_params() / 10)
    plan = rules(path).solve(two)
    assert plan.search["rule"]["own_row"] == "big" and plan.search["rule"]["row"] == "mid"
    assert (plan.tp, plan.pp) == (2, 1)


def test_moe_takes_the_largest_expert_degree_the_replicas_allow(tmp_path):
    spec = make_spec(num_experts=4, top_k=2, activation="swiglu", seq_len=32)
    problem = make_problem(spec, make_cluster(fanouts=(2, 4)), global_batch=16)
    plan = rules(tiny_table(tmp_path, problem.model.total_params())).solve(problem)
    assert plan.tp in (1, 2) and plan.ep == 4 and (plan.dp * plan.cp) % 4 == 0
    assert "moe" in plan.search["rule"]


def test_chunk_split_follows_megatron():
    assert chunk_split(32, 8) == [5, 4, 4, 4, 4, 4, 4, 5]  # blocks evenly, embedding + head
    assert chunk_split(126, 64) == [2] * 64  # embedding and loss counted as layers
    assert chunk_split(126, 16) == [8] * 16  # = Llama 3's one block fewer on the end stages
    assert chunk_split(9, 4) is None and chunk_split(4, 8) is None
