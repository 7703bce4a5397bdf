"""``export=megatron|torchtitan``: launcher arguments for a plan, and the nearest expressible plan.

Flag names are the upstream ones (NVIDIA/Megatron-LM megatron/training/arguments.py @ 000c4ac24f61;
pytorch/torchtitan torchtitan/config/job_config.py @ 000204a4a8bf). Expected values are derived
from the plan (degrees, microbatches, blocks per stage), and the warning path's evaluated cost is
recomputed here from an independently built plan.
"""

import json
import tomllib

import pytest

from baselines.fixed import FixedPlanner
from nest.cost import evaluate
from nest.errors import UserError
from nest.export import export_plan, targets_of
from nest.export.megatron import megatron_args

from .conftest import make_cluster, make_problem, make_spec
from .test_cli import run_case

# Megatron-LM flags (arguments.py @ 000c4ac24f61) the exporter may emit.
MEGATRON_FLAGS = {
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--sequence-parallel",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--use-distributed-optimizer",
    "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy",
    "--ckpt-format",
    "--num-layers-per-virtual-pipeline-stage",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout",
    "--use-tp-pp-dp-mapping",
}


@pytest.fixture(scope="module")
def problem():
    return make_problem(make_spec(layers=8, heads=8), make_cluster(fanouts=(4, 4)), global_batch=32)


def fixed(problem, **kw):
    kw.setdefault("microbatch_size", 1)
    return FixedPlanner(**kw).solve(problem)


def flags(problem, plan) -> dict:
    out = {}
    for arg in megatron_args(problem, plan):
        name, _, value = arg.partition(" ")
        assert name in MEGATRON_FLAGS
        out[name] = value.strip('"')
    return out


def test_megatron_uniform_plan(problem):
    plan = fixed(problem, tp=2, pp=2, dp=4, recompute="full", zero_stage=1)
    got = flags(problem, plan)
    assert got == {
        "--tensor-model-parallel-size": "2",
        "--pipeline-model-parallel-size": "2",
        "--context-parallel-size": "1",
        "--expert-model-parallel-size": "1",
        "--micro-batch-size": "1",
        "--global-batch-size": str(plan.microbatch_size * plan.num_microbatches * plan.dp),
        "--sequence-parallel": "",
        "--recompute-granularity": "full",
        "--recompute-method": "uniform",
        "--recompute-num-layers": "1",
        "--use-distributed-optimizer": "",
    }
    exp = export_plan(problem, plan, "megatron")
    assert not exp.warnings
    assert exp.exported_iteration_time_s == evaluate(problem, plan).iteration_time_s


@pytest.mark.parametrize(
    "partition, expected",
    [
        (
            [3, 2, 2, 1],
            {"--decoder-first-pipeline-num-layers": "3", "--decoder-last-pipeline-num-layers": "1"},
        ),
        ([2, 2, 2, 2], {}),
        ([1, 3, 2, 2], {"--pipeline-model-parallel-layout": "Et|ttt|tt|ttL"}),
        ([1, 4, 5], {"--pipeline-model-parallel-layout": "E|tttt|ttttL"}),  # chain layers
    ],
)
def test_megatron_partitions(problem, partition, expected):
    plan = fixed(problem, tp=1, pp=len(partition), dp=4, layer_partition=partition)
    got = flags(problem, plan)
    uneven = {k: v for k, v in got.items() if "layers" in k or "layout" in k}
    assert uneven == expected
    assert not export_plan(problem, plan, "megatron").warnings


def test_megatron_interleaving_rank_order_and_zero3(problem):
    plan = fixed(problem, tp=1, pp=2, dp=4, schedule="interleaved", virtual_stages=2)
    assert flags(problem, plan)["--num-layers-per-virtual-pipeline-stage"] == "2"
    plan = fixed(problem, tp=2, pp=2, dp=2, rank_order="tp,pp,dp")
    assert "--use-tp-pp-dp-mapping" in flags(problem, plan)
    plan = fixed(problem, tp=2, pp=1, dp=8, zero_stage=3)
    got = flags(problem, plan)
    assert got["--use-megatron-fsdp"] == "" and got["--ckpt-format"] == "fsdp_dtensor"
    assert got["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert "--use-distributed-optimizer" not in got


def test_megatron_warns_on_per_stage_recompute_with_the_nearest_plans_cost(problem):
    plan = fixed(problem, tp=1, pp=2, dp=4, recompute=["full", "none"])
    exp = export_plan(problem, plan, "megatron")
    nearest = fixed(problem, tp=1, pp=2, dp=4, recompute="full")  # built independently
    want = evaluate(problem, nearest).iteration_time_s
    assert exp.exported_iteration_time_s == pytest.approx(want, rel=1e-12)
    assert exp.plan_iteration_time_s == evaluate(problem, plan).iteration_time_s
    (warning,) = exp.warnings
    assert "per-stage recompute" in warning and f"{want:.4f} s" in warning
    assert "--recompute-granularity full" in exp.text
    assert exp.exported_plan["recompute"] == ["full", "full"]


def test_megatron_warns_on_a_foreign_rank_order_and_gpipe(problem):
    plan = fixed(problem, tp=2, cp=2, pp=1, dp=2, rank_order="tp,dp,cp,pp")
    exp = export_plan(problem, plan, "megatron")
    nearest = fixed(problem, tp=2, cp=2, pp=1, dp=2, rank_order="tp,cp,dp,pp")
    assert exp.exported_iteration_time_s == pytest.approx(
        evaluate(problem, nearest).iteration_time_s, rel=1e-12
    )
    assert "rank order tp,dp,cp,pp" in exp.warnings[0]
    gpipe = fixed(problem, tp=1, pp=2, dp=4, schedule="gpipe")
    exp = export_plan(problem, gpipe, "megatron")
    assert "GPipe" in exp.warnings[0]
    assert exp.exported_plan["schedule"] == "1f1b"


def toml_of(exp) -> dict:
    return tomllib.loads(exp.text)


def test_torchtitan_fsdp_plan(problem):
    plan = fixed(problem, tp=2, pp=2, dp=4, zero_stage=3, recompute="selective")
    exp = export_plan(problem, plan, "torchtitan")
    assert not exp.warnings
    t = toml_of(exp)
    par = t["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (4, 1)
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (2, 2)
    assert par["pipeline_parallel_split_points"] == ["layers.4"]
    assert par["pipeline_parallel_schedule"] == "1F1B"
    assert t["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert t["training"]["global_batch_size"] == 32
    assert t["training"]["local_batch_size"] == 32 // 4


def test_torchtitan_zero1_exports_the_better_of_ddp_and_fsdp(problem):
    plan = fixed(problem, tp=1, pp=2, dp=8, zero_stage=1, schedule="interleaved", virtual_stages=2)
    exp = export_plan(problem, plan, "torchtitan")
    options = {
        z: evaluate(
            problem,
            fixed(
                problem, tp=1, pp=2, dp=8, zero_stage=z, schedule="interleaved", virtual_stages=2
            ),
        )
        for z in (0, 3)
    }
    best = min(options, key=lambda z: (not options[z].feasible, options[z].iteration_time_s))
    assert exp.exported_iteration_time_s == pytest.approx(options[best].iteration_time_s, rel=1e-12)
    assert "ZeRO-1" in exp.warnings[0] and f"used ZeRO-{best}" in exp.warnings[0]
    par = toml_of(exp)["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_split_points"] == ["layers.2", "layers.4", "layers.6"]


def test_torchtitan_moves_a_head_only_stage(problem):
    plan = fixed(problem, tp=1, pp=3, dp=4, layer_partition=[5, 4, 1])  # chain layers
    exp = export_plan(problem, plan, "torchtitan")
    assert "starts without a transformer block" in exp.warnings[0]
    assert exp.exported_plan["blocks_per_stage"] == [4, 3, 1]
    assert toml_of(exp)["parallelism"]["pipeline_parallel_split_points"] == ["layers.4", "layers.7"]
    nearest = fixed(problem, tp=1, pp=3, dp=4, layer_partition=[5, 3, 2])
    assert exp.exported_iteration_time_s == pytest.approx(
        evaluate(problem, nearest).iteration_time_s, rel=1e-12
    )


def test_targets_and_cli(tmp_path):
    assert targets_of(None) == [] and targets_of("megatron") == ["megatron"]
    assert targets_of(["torchtitan", "megatron"]) == ["torchtitan", "megatron"]
    with pytest.raises(UserError, match="export='deepspeed'"):
        targets_of("deepspeed")
    _, result, report, _, lines = run_case(tmp_path, "export=[megatron,torchtitan]")
    assert (tmp_path / "megatron_args.sh").read_text().count("--tensor-model-parallel-size") == 1
    tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    saved = json.loads((tmp_path / "export_megatron_args.json").read_text())
    assert saved["exported_iteration_time_s"] == report["iteration_time_s"]
    assert set(report["export"]) == {"megatron", "torchtitan"}
    assert any("--pipeline-model-parallel-size" in line for line in lines)
    _, bad, _, _, lines = run_case(tmp_path / "bad", "export=deepspeed")
    assert bad["status"] == "error" and lines == [f"error: {bad['error']}"]
