"""The paper's fixed baseline tables as data: conversion, coverage, and what each row becomes."""

import json
from collections import Counter
from functools import cache
from math import ceil

import hydra
import pytest

import nest.app.cli
from baselines.paper_table import PaperTablePlanner, artifact_split
from experiments.convert_paper_tables import (
    OUT,
    PRESET_OF,
    default_source,
    dump_rows,
    load_rows,
    rows_from_tables,
    tables_from_rows,
)
from nest.app.config import build_problem
from nest.core.errors import InvalidConfiguration, NotPublished, UserError
from nest.cost import evaluate

from .conftest import assert_not_faster_than_peak

ROWS = load_rows()
CLUSTER_OF_SETUP = {"tpuv4_fatTree": "tpuv4_fattree", "h100_spineLeaf": "h100_spineleaf"}


def compose(*overrides):
    with hydra.initialize_config_dir(config_dir=nest.app.cli.CONF_DIR, version_base="1.3"):
        return hydra.compose(config_name="config", overrides=list(overrides))


@cache
def problem(cluster: str, devices: int, model: str, mbs: int):
    cfg = compose(
        f"cluster={cluster}",
        f"cluster.devices={devices}",
        f"model={model}",
        "training.global_batch=4096",
        f"training.microbatch_sizes=[{mbs}]",
    )
    return build_problem(cfg)


def split_setup(setup: str) -> tuple[str, int]:
    base, _, mbs = setup.partition("_mbs")
    return base, int(mbs or 1)


# ------------------------------------------------------------------------------- conversion


def test_the_committed_file_is_the_converters_output():
    assert OUT.read_text() == dump_rows(ROWS)
    keys = [(r["setup"], r["devices"], r["table"], r["artifact_model"]) for r in ROWS]
    assert len(keys) == len(set(keys)) == 150
    assert all(r["model"] == PRESET_OF[r["artifact_model"]] for r in ROWS)


def test_conversion_round_trips():
    assert rows_from_tables(tables_from_rows(ROWS)) == ROWS


@pytest.mark.skipif(not default_source().is_file(), reason="shared/reference-instances not beside")
def test_every_row_of_the_artifacts_tables_is_represented():
    source = json.loads(default_source().read_text())
    assert tables_from_rows(ROWS) == source
    leaves = sum(len(m) for d in source.values() for t in d.values() for m in t.values())
    assert leaves == len(ROWS)


def test_artifact_split():
    """The artifact's fixed-configuration rule: ceil(L/p) blocks per stage, in order."""
    assert artifact_split(32, 8) == [4] * 8
    assert artifact_split(32, 6) == [6, 6, 6, 6, 6, 2]
    assert artifact_split(80, 41) == [2] * 40 + [0]  # the last stage keeps only the head
    assert artifact_split(32, 15) == [3] * 10 + [2, 0, 0, 0, 0]


# ------------------------------------------------------------------------------- every row


def expected_reasons(row: dict) -> list[str]:
    """Which rules a row breaks, recomputed from the artifact's fields alone (the oracle)."""
    setup, mbs = split_setup(row["setup"])
    n = row["devices"]
    ep = 4 if row["artifact_model"] == "mixtral" else 1
    heads = {"bert_large": 16, "llama2_7b": 32, "llama3_70b": 64, "mixtral_8x7b": 32}
    kv = {"llama3_70b": 8, "mixtral_8x7b": 8}
    out = []
    if row["model"] is None:
        return ["no preset"]
    h = heads.get(row["model"], 96)
    if h % row["t"] or kv.get(row["model"], h) % row["t"]:
        out.append("tp")
    blocks = row.get("layer_partition") or artifact_split(row["num_transformer_layers"], row["p"])
    if any(b == 0 for b in blocks[1:-1]):
        out.append("empty")
    if row["p"] * row["d"] * row["t"] * ep > n:
        out.append("devices")
    if 4096 % (mbs * row["d"] * ep):
        out.append("batch")
    return out


def run_row(row: dict):
    setup, mbs = split_setup(row["setup"])
    cluster = CLUSTER_OF_SETUP[setup]
    model = row["model"] or "gpt3_175b"
    planner = PaperTablePlanner(
        table=row["table"],
        setup=setup,
        artifact_model=row["artifact_model"],
        microbatch_size=mbs,
    )
    return problem(cluster, row["devices"], model, mbs), planner


def test_every_row_runs_or_says_why_not():
    """Each row plans (scored by the shared evaluator) or is invalid with every broken rule
    named; never another error. Invalid exactly when the oracle above says so."""
    outcome = Counter()
    for row in ROWS:
        prob, planner = run_row(row)
        expected = expected_reasons(row)
        try:
            plan = planner.solve(prob)
        except InvalidConfiguration as exc:
            assert expected, (row, exc.reason)
            reason = exc.reason
            assert "\n" not in reason
            assert reason.startswith(f"{row['table']} {row['artifact_model']} on {row['setup']}")
            words = {
                "no preset": "no preset",
                "tp": "tp=",
                "empty": "empty",
                "devices": "devices but the cluster has",
                "batch": "does not divide global batch",
            }
            for what in expected:
                assert words[what] in reason, (row, reason)
            outcome["invalid"] += 1
            continue
        assert not expected, (row, expected)
        report = evaluate(prob, plan)
        assert_not_faster_than_peak(prob, plan)
        ep = 4 if row["artifact_model"] == "mixtral" else 1
        assert (plan.pp, plan.tp, plan.dp, plan.ep) == (row["p"], row["t"], row["d"] * ep, ep)
        assert plan.devices_used == row["p"] * row["d"] * row["t"] * ep
        recompute = [s.recompute.value for s in plan.stages]
        if row["model"] == "bert_large":
            assert set(recompute) == {"none"}
        else:
            assert recompute == ["full"] * (row["p"] - 1) + ["none"]
        outcome[report.feasible] += 1
    assert sum(outcome.values()) == len(ROWS)
    assert outcome["invalid"] > 0 and outcome[True] > 0


def find(setup, devices, table, key):
    return next(
        r for r in ROWS if (r["setup"], r["devices"], r["table"], r["artifact_model"])
        == (setup, devices, table, key)
    )  # fmt: skip


def test_a_published_layer_partition_is_used_as_given():
    """MCMC's Llama-2 row at microbatch 2 gives blocks per stage; embedding and head join the
    first and last stage."""
    row = find("tpuv4_fatTree_mbs2", 256, "MCMC", "llama2")
    prob, planner = run_row(row)
    plan = planner.solve(prob)
    blocks = [s.last_layer - s.first_layer + 1 for s in plan.stages]
    expected = list(row["layer_partition"])
    expected[0] += 1
    expected[-1] += 1
    assert blocks == expected and plan.microbatch_size == 2 and plan.devices_used == 240


def test_nearest_valid_variant_is_labelled():
    row = find("tpuv4_fatTree", 512, "Phaze", "llama3")
    prob, planner = run_row(row)
    with pytest.raises(InvalidConfiguration, match=r"dp=12 does not divide global batch 4096"):
        planner.solve(prob)
    near = PaperTablePlanner(table="Phaze", variant="nearest_valid").solve(prob)
    assert near.search["variant"] == "nearest_valid"
    assert near.search["changes"] == ["d12 -> d8 (largest that divides the batch and fits)"]
    assert (near.pp, near.dp) == (41, 8)
    layers = [s.last_layer - s.first_layer + 1 for s in near.stages]
    # the artifact's split: ceil(80/41) = 2 blocks per stage, the embedding with the first, and
    # the last stage left with the head alone
    assert layers == [ceil(80 / 41) + 1] + [2] * 39 + [1]


def test_an_invalid_row_is_a_report_not_a_traceback(tmp_path):
    cfg = compose(
        "solver=paper_table",
        "solver.table=Phaze",
        "model=llama3_70b",
        "cluster=tpuv4_fattree",
        "cluster.devices=512",
        "training.global_batch=4096",
    )
    lines: list[str] = []
    result = nest.app.cli.run(cfg, tmp_path, echo=lines.append)
    report = json.loads((tmp_path / "report.json").read_text())
    assert result["status"] == report["status"] == "invalid"
    assert not (tmp_path / "plan.json").exists()
    assert "p41 x d12 = 492 of 512 devices" in report["error"]
    assert "dp=12 does not divide global batch 4096" in report["error"]
    assert lines == [f"invalid: {report['error']}"]


def test_a_missing_row_is_unpublished_and_a_bad_table_a_user_error(tmp_path):
    prob = problem("tpuv4_fattree", 64, "llama2_7b", 1)
    with pytest.raises(NotPublished, match="has no row for llama2_7b .* rows at 64, 128"):
        PaperTablePlanner(table="Manual", devices=96).solve(prob)
    # the paper publishes no Manual plan for GPT-3 at microbatch 4: a run says so, status
    # "unpublished" (a gap in the data, not a failed plan or a wrong command)
    cfg = compose(
        "solver=paper_manual",
        "model=gpt3_175b",
        "cluster=tpuv4_fattree",
        "cluster.devices=256",
        "training.global_batch=4096",
        "training.microbatch_sizes=[4]",
    )
    result = nest.app.cli.run(cfg, tmp_path, echo=lambda _: None)
    assert result["status"] == "unpublished" and "tpuv4_fatTree_mbs4" in result["error"]
    with pytest.raises(UserError, match="Manual, MCMC, Phaze|one of"):
        PaperTablePlanner(table="Alpa").solve(prob)
