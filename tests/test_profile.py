"""``model=profile``: the schema (round trips, bad input) and the profile model's semantics.

The oracle: a profile written from the analytic model at tp = cp = ep = 1 (where no layer issues a
collective) must make the shared evaluator return exactly what the analytic model gives, on
random plans, and the NEST planner the same optimum.
"""

import json
from dataclasses import replace

import pytest

from baselines.fixed import FixedPlanner
from nest.core.axes import LayerKind, Recompute
from nest.core.errors import UserError
from nest.core.layers import Shard
from nest.core.problem import Problem
from nest.cost import evaluate
from nest.cost.collectives import COLLECTIVE_TIME
from nest.dp.planner import NestPlanner
from nest.profile import ProfileModel, profile_to_dict, read_profile, write_profile
from nest.profile.convert import profile_of
from nest.profile.schema import profile_from_dict

from .conftest import make_cluster, make_problem, make_spec
from .randomcase import random_case
from .test_cli import REPO_ROOT, compose, run_case


def tiny_profile(**kw):
    """A profile of the analytic tiny model at tp 1 and 2, microbatch 1 and 2."""
    problem = make_problem(make_spec(layers=3), make_cluster(fanouts=(4, 2)))
    shards = [Shard(tp=t, sp=t > 1, mbs=b) for t in (1, 2) for b in (1, 2)]
    return replace(profile_of(problem.model, problem.cluster.device, shards=shards), **kw)


def as_problem(profile, base: Problem, **kw) -> Problem:
    return Problem(model=ProfileModel(profile, **kw), cluster=base.cluster, training=base.training)


# ------------------------------------------------------------------------------ files
@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_round_trip(tmp_path, suffix):
    prof = tiny_profile(name="tiny", seq_len=64)
    path = tmp_path / f"tiny{suffix}"
    write_profile(prof, path)
    # CSV has no top-level fields: they come from the config (model.name, ...), as here
    assert read_profile(path, name="tiny", seq_len=64, tp_collectives="modelled") == prof


def test_milliseconds_are_converted_and_defaults_apply():
    d = profile_to_dict(tiny_profile())
    layer = d["measurements"][0]["layers"][1]
    layer["fwd_ms"] = 1000 * layer.pop("fwd_s")
    got = profile_from_dict(d).measurements[0].layers[1]
    assert got.fwd_s == pytest.approx(d["measurements"][0]["layers"][1]["fwd_ms"] / 1000)
    bare = {
        "measurements": [
            {"layers": [dict(fwd_s=1, bwd_s=2, param_bytes=3, act_none_bytes=4, boundary_bytes=5)]}
        ]
    }
    p = profile_from_dict(bare)
    m = p.measurements[0]
    assert (m.tp, m.cp, m.ep, m.microbatch_size, p.tp_collectives) == (1, 1, 1, 1, "measured")
    assert m.layers[0].kind is LayerKind.BLOCK and m.layers[0].act_full_bytes is None


def _bad_layer(**change):
    layer = dict(
        kind="block", fwd_s=1.0, bwd_s=2.0, param_bytes=10, act_none_bytes=5, boundary_bytes=2
    )
    layer.update(change)
    return {"measurements": [{"layers": [{k: v for k, v in layer.items() if v is not ...}]}]}


@pytest.mark.parametrize(
    "data, needle",
    [
        (_bad_layer(boundary_bytes=...), "missing boundary_bytes"),
        (_bad_layer(fwd_s=..., fwd_us=3.0), "fwd_us' has unit 'us'; use fwd_s or fwd_ms"),
        (
            _bad_layer(param_bytes=..., param_gb=1.0),
            "param_gb' has unit 'gb'; sizes are param_bytes",
        ),
        (_bad_layer(bwd_s=-0.5), "bwd_s=-0.5 is negative"),
        (_bad_layer(fwd_ms=1000.0), "fwd_s=1.0 and fwd_ms=1000.0 give fwd twice; keep one"),
        (
            _bad_layer(recompute_selective_ms=3.0, recompute_selective_s=0.5),
            "recompute_selective_ms=3.0 and recompute_selective_s=0.5 give recompute_selective",
        ),
        (_bad_layer(act_none_bytes="x"), "act_none_bytes='x' must be a finite number"),
        (_bad_layer(speed=3), "unknown field 'speed'"),
        (_bad_layer(kind="attention"), "kind='attention'"),
        ({"measurements": [{"tp": 0, "layers": []}]}, "tp=0 must be a positive integer"),
        ({"measurements": []}, "measurements must be a non-empty list"),
        ({"format": "other", "measurements": [1]}, "format='other'"),
        (
            {
                "measurements": [
                    {
                        "layers": [
                            {
                                "kind": "head",
                                "fwd_s": 1,
                                "bwd_s": 1,
                                "param_bytes": 1,
                                "act_none_bytes": 1,
                                "boundary_bytes": 1,
                            }
                        ]
                    }
                ]
            },
            "has no block layer",
        ),
    ],
)
def test_bad_profiles_are_one_line_errors(data, needle):
    with pytest.raises(UserError) as err:
        profile_from_dict(data)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_measurements_must_list_the_same_chain():
    d = profile_to_dict(tiny_profile())
    d["measurements"][1]["layers"].pop(2)
    with pytest.raises(UserError, match="every measurement lists the whole chain"):
        profile_from_dict(d)
    d = profile_to_dict(tiny_profile())
    d["measurements"][1] = dict(d["measurements"][0])
    with pytest.raises(UserError, match="measured twice"):
        profile_from_dict(d)
    d = profile_to_dict(tiny_profile())
    for m in d["measurements"]:
        m["layers"][2]["kind"] = "embedding"
    with pytest.raises(UserError, match="only the first layer may be one"):
        profile_from_dict(d)


def test_bad_files_through_the_cli_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_bad_layer(fwd_s=-1)))
    lines: list[str] = []
    import nest.app.cli

    result = nest.app.cli.run(
        compose("model=profile", f"model.path={bad}"), tmp_path / "out", echo=lines.append
    )
    assert result["status"] == "error" and "fwd_s=-1 is negative" in result["error"]
    assert lines == [f"error: {result['error']}"]
    result = nest.app.cli.run(compose("model=profile"), tmp_path / "out2", echo=lines.append)
    assert "model.path=FILE" in result["error"]


def _artifact(blocks: int = 2) -> dict:
    """A NEST artifact instance (docs/nest_paper.md §6): an embedding and ``blocks`` blocks,
    tp 1."""
    node = dict(parameterSize=2e6, activationSize=4e6, optimalLatencyFw=10.0, optimalLatencyBw=20.0)
    nodes = [dict(node, id=k, parameterSize=1e6 if k < 0 else 2e6) for k in range(-1, blocks)]
    edges = [dict(sourceId=k, destId=k + 1, communicationCost=1e5) for k in range(-1, blocks - 1)]
    return {"nodes": {"1": nodes}, "edges": {"1": edges}}


@pytest.mark.parametrize(("ep", "microbatches", "batch"), [(1, 4096, 4096), (4, 1024, 4096)])
def test_an_artifact_instance_hints_its_global_batch_in_sequences(
    tmp_path, ep, microbatches, batch
):
    """``mbsInBatch`` is the artifact's ``M = global_batch / (mbs * ep)`` (docs/nest_paper.md
    §2): its Mixtral instances (ep 4, 1024 microbatches) ran a batch of 4096 sequences, as every
    other."""
    path = tmp_path / "inst.json"
    data = _artifact() | {"ep_degree": ep, "mbsInBatch": float(microbatches)}
    data |= {"optimizerAlgorithm": "SGD"}
    path.write_text(json.dumps(data))
    notes = read_profile(path).notes
    assert f"global batch {batch} sequences" in notes[0]
    assert notes[1] == (
        f"to mirror it: training.global_batch={batch} training.microbatch_sizes=[1] "
        "training.optimizer=sgd"
    )


def test_the_shipped_artifact_instance_is_llama2_7b():
    """data/profiles/nest_artifact_llama2_64.json (the artifact's llama2_64 instance, reduced to
    the fields read; data/README.md): 32 blocks in seconds, Llama-2 7B's 6.74 B parameters once
    the head copied into every block is held once, and the hint of the artifact's settings."""
    path = REPO_ROOT / "data" / "profiles" / "nest_artifact_llama2_64.json"
    profile = read_profile(path)
    assert len(profile.measurements[0].layers) == 1 + 32 + 1
    assert profile.measurements[0].layers[1].fwd_s == pytest.approx(218.51191714285716e-3)
    assert ProfileModel(profile).total_params() == pytest.approx(6.74e9, rel=1e-3)
    assert (
        "training.global_batch=4096 training.microbatch_sizes=[1] training.optimizer=sgd"
        in (profile.notes[1])
    )


def _drop(node: dict, key: str) -> dict:
    return {k: v for k, v in node.items() if k != key}


def test_an_artifact_instance_reads_in_seconds(tmp_path):
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(_artifact()))
    block = read_profile(path).measurements[0].layers[1]
    assert (block.fwd_s, block.bwd_s, block.boundary_bytes) == (10e-3, 20e-3, 1e5)


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            lambda d: d["nodes"]["1"].__setitem__(2, _drop(d["nodes"]["1"][2], "optimalLatencyBw")),
            "nodes['1'][2] has no 'optimalLatencyBw'; expected the backward time, a number of "
            "milliseconds",
        ),
        (
            lambda d: d["nodes"]["1"][1].update(optimalLatencyFw="fast"),
            "nodes['1'][1] optimalLatencyFw='fast'; expected the forward time, a number of "
            "milliseconds",
        ),
        (
            lambda d: d["nodes"]["1"][0].update(parameterSize=None),
            "nodes['1'][0] parameterSize=None; expected a number of bytes",
        ),
        (
            lambda d: d.update(edges=d["edges"]["1"]),
            "edges is a list; expected an object mapping each tensor width to its edge list",
        ),
        (
            lambda d: d["edges"].update({"1": [[-1, 0, 1e5], [0, 1, 1e5]]}),
            "edges['1'][0] is a list ([-1, 0, 100000.0]); expected an object with sourceId, "
            "destId, communicationCost",
        ),
        (
            lambda d: d["edges"]["1"][1].update(communicationCost="1e5"),
            "edges['1'][1] communicationCost='1e5'; expected the boundary bytes, a number",
        ),
        (lambda d: d.update(ep_degree="four"), "ep_degree='four'; expected a positive integer"),
    ],
)
def test_bad_artifact_instances_are_one_line_errors(tmp_path, change, needle):
    data = _artifact()
    change(data)
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as err:
        read_profile(path)
    message = str(err.value)
    assert message.startswith(f"model.path={path}") and needle in message
    assert "\n" not in message
    lines: list[str] = []
    import nest.app.cli

    result = nest.app.cli.run(
        compose("model=profile", f"model.path={path}"), tmp_path / "out", echo=lines.append
    )
    assert result["status"] == "error" and lines == [f"error: {message}"]


# ------------------------------------------------------------------------------ semantics
def test_profile_of_the_analytic_model_evaluates_identically_on_random_plans():
    checked = 0
    for seed in range(3000):
        problem, planner = random_case(seed)
        if problem.model.spec.is_moe or planner.tp != 1 or planner.cp != 1:
            continue
        modes = [planner.recompute] if isinstance(planner.recompute, str) else planner.recompute
        unmeasured = {"mlp", "selective_mlp", "op", "dots", "mla_up_proj", "mlp_moe"}
        unmeasured |= {"mla_up_proj_mlp_moe", "qkv_proj", "qkv_out_proj", "nothing_saveable"}
        if unmeasured & set(modes):
            continue  # a profile does not measure these modes' shares (its docstring)
        prof = profile_of(
            problem.model,
            problem.cluster.device,
            shards=[Shard(mbs=b) for b in problem.training.microbatch_sizes],
        )
        try:
            plan = planner.solve(problem)
        except UserError:
            continue
        a, b = evaluate(problem, plan), evaluate(as_problem(prof, problem), plan)
        assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)
        for x, y in zip(a.ranks, b.ranks, strict=True):
            assert y.memory.total_bytes == pytest.approx(x.memory.total_bytes, rel=1e-12)
            assert y.dp_sync_s == pytest.approx(x.dp_sync_s, rel=1e-12)
        assert b.feasible == a.feasible
        checked += 1
    assert checked >= 30


def test_nest_on_the_profile_finds_the_analytic_optimum():
    for seed in (0, 3, 5, 9, 11):  # dense models on 4, 2, 4, 4 and 16 devices
        problem, _ = random_case(seed)
        assert not problem.model.spec.is_moe
        prof = profile_of(
            problem.model,
            problem.cluster.device,
            shards=[Shard(mbs=b) for b in problem.training.microbatch_sizes],
        )
        planner = NestPlanner(tp=[1], cp=[1])
        a = planner.solve(problem)
        b = NestPlanner().solve(as_problem(prof, problem))  # only tp = cp = 1 was measured
        assert (b.tp, b.cp) == (1, 1)
        assert b.objective_s == pytest.approx(a.objective_s, rel=1e-9)


def test_only_measured_widths_are_valid():
    problem = make_problem(make_spec(layers=3), make_cluster(fanouts=(4, 2)))
    model = ProfileModel(tiny_profile())
    assert model.shard_problem(Shard(tp=2, sp=True)) is None
    reason = model.shard_problem(Shard(tp=4, sp=True))
    assert "tp=4" in reason and "(tp=1, cp=1, ep=1), (tp=2, cp=1, ep=1)" in reason
    plan = NestPlanner().solve(as_problem(tiny_profile(), problem))
    assert plan.tp in (1, 2)
    with pytest.raises(UserError, match="no measurement at tp=4"):
        FixedPlanner(tp=4, pp=1, dp=2).solve(as_problem(tiny_profile(), problem))


def test_measured_tp_collectives_are_in_the_times_and_modelled_ones_are_added():
    problem = make_problem(make_spec(layers=3), make_cluster(fanouts=(4, 2)))
    plan = FixedPlanner(tp=2, pp=1, dp=4, microbatch_size=1).solve(problem)
    measured = evaluate(as_problem(tiny_profile(tp_collectives="measured"), problem), plan)
    modelled = evaluate(as_problem(tiny_profile(tp_collectives="modelled"), problem), plan)
    assert measured.stages[0].tp_comm_s == 0.0
    cluster = problem.cluster
    factors = cluster.group_factors(plan.stages[0].devices[0][0])
    layers = tiny_profile().measurements[2].layers  # tp=2, mbs=1
    per_block = [
        4 * COLLECTIVE_TIME["all_reduce"](layer.boundary_bytes, factors, cluster)
        for layer in layers
        if layer.kind is LayerKind.BLOCK
    ]
    assert modelled.stages[0].tp_comm_s == pytest.approx(sum(per_block), rel=1e-12)
    tp1 = FixedPlanner(tp=1, pp=1, dp=8, microbatch_size=1).solve(problem)
    assert (
        evaluate(as_problem(tiny_profile(tp_collectives="modelled"), problem), tp1)
        .stages[0]
        .tp_comm_s
        == 0.0
    )


def _one_block_profile(**layer):
    base = dict(fwd_s=1.0, bwd_s=2.0, param_bytes=8, act_none_bytes=100, boundary_bytes=10)
    base.update(layer)
    emb = dict(
        kind="embedding", fwd_s=0.1, bwd_s=0.2, param_bytes=4, act_none_bytes=0, boundary_bytes=7
    )
    return ProfileModel(
        profile_from_dict({"measurements": [{"layers": [emb, {"kind": "block", **base}]}]})
    )


def test_recompute_semantics():
    model = _one_block_profile()
    cost = model.layer_cost(model.chain[1], Shard())
    assert cost.act_bytes[Recompute.FULL] == 7  # the layer's input: the embedding's boundary
    assert cost.act_bytes[Recompute.SELECTIVE] == 100  # unknown selective = none
    assert cost.recompute_s == {
        Recompute.NONE: 0.0,
        Recompute.SELECTIVE: 0.0,
        Recompute.MLP: 0.0,  # unknown MLP share: mlp = none, selective_mlp = selective
        Recompute.SELECTIVE_MLP: 0.0,
        Recompute.OP: 0.0,  # unknown op-level share: op = none
        Recompute.FULL: 1.0,
        Recompute.DOTS: 0.0,  # unknown: dots = none
        Recompute.MLA_UP: 0.0,  # unknown: mla_up_proj = none
        Recompute.MLP_MOE: 0.0,  # unknown whole-MLP share: mlp_moe = none
        Recompute.MLA_UP_MLP_MOE: 0.0,
        Recompute.QKV_PROJ: 0.0,  # unknown: JAX's named policies = none
        Recompute.QKV_OUT_PROJ: 0.0,
        Recompute.NOTHING_SAVEABLE: 1.0,  # unknown FC2 share: nothing_saveable = full
    }
    assert cost.act_bytes[Recompute.MLP] == cost.act_bytes[Recompute.NONE]
    model = _one_block_profile(act_selective_bytes=40, recompute_selective_ms=300, act_full_bytes=9)
    cost = model.layer_cost(model.chain[1], Shard())
    assert cost.act_bytes[Recompute.SELECTIVE] == 40 and cost.act_bytes[Recompute.FULL] == 9
    assert cost.recompute_s[Recompute.SELECTIVE] == pytest.approx(0.3)


def test_microbatch_scaling():
    model = _one_block_profile()
    one = model.layer_cost(model.chain[1], Shard(mbs=1))
    three = model.layer_cost(model.chain[1], Shard(mbs=3))
    assert (three.fwd_s, three.bwd_s) == (3 * one.fwd_s, 3 * one.bwd_s)
    assert three.act_bytes[Recompute.NONE] == 3 * one.act_bytes[Recompute.NONE]
    assert three.boundary_bytes == 30 and three.dense_params == one.dense_params == 4
    strict = ProfileModel(model.profile, microbatch_scaling="none")
    with pytest.raises(UserError, match="measured at microbatch sizes \\[1\\]"):
        strict.layer_cost(strict.chain[1], Shard(mbs=2))
    # a measured microbatch size is used as measured
    prof = tiny_profile()
    exact = ProfileModel(prof).layer_cost(ProfileModel(prof).chain[1], Shard(mbs=2))
    assert exact.fwd_s == prof.measurements[1].layers[1].fwd_s


def test_csv_profile_runs_from_the_cli(tmp_path):
    path = tmp_path / "tiny.csv"
    write_profile(tiny_profile(), path)
    _, result, report, plan, _ = run_case(
        tmp_path / "out",
        "solver=nest",
        "model=profile",
        f"model.path={path}",
        "model.seq_len=64",
        "model.tp_collectives=modelled",
        "cluster=dgx_8x8",
        "training.global_batch=16",
    )
    assert result["status"] == "optimal" and result["model"] == "tiny"
    assert report["plan"]["tp"] in (1, 2)
    assert report["tokens_per_s"] == pytest.approx(16 * 64 / report["iteration_time_s"])
    assert report["mfu"] > 0  # the profile carries fwd_flops


def test_a_blocks_only_profile_gets_end_layers_and_runs_every_planner(tmp_path):
    block = dict(fwd_s=0.01, bwd_s=0.02, param_bytes=2e6, act_none_bytes=4e6, boundary_bytes=1e5)
    path = tmp_path / "blocks.json"
    path.write_text(json.dumps({"measurements": [{"layers": [block] * 4}]}))
    model = ProfileModel(read_profile(path))
    kinds = [ref.kind for ref in model.chain]
    assert kinds == [LayerKind.EMBEDDING, *[LayerKind.BLOCK] * 4, LayerKind.HEAD]
    assert model.spec.layers == 4 and model.total_params() == 4 * 1e6
    for solver in ("megatron", "nest", "fixed"):
        extra = ["solver.pp=2", "solver.layer_partition=[3,1]"] if solver == "fixed" else []
        _, result, report, _, _ = run_case(
            tmp_path / solver,
            f"solver={solver}",
            "model=profile",
            f"model.path={path}",
            "export=megatron",
            *extra,
        )
        assert result["status"] in ("optimal", "feasible"), result.get("error")
        assert report["export"]["megatron"]["exported_plan"]["blocks_per_stage"][0] >= 1
    assert report["export"]["megatron"]["exported_plan"]["blocks_per_stage"] == [3, 1]
