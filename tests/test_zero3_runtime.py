"""ZeRO-3's synchronous runtime (issue 22 item 1, SC21 Table 2's DeepSpeed ZeRO-3 rows).

DeepSpeed ZeRO-3 v0.3.13-v0.5.x calls ``torch.cuda.synchronize()`` before every parameter's
all-gather (``_allgather_param``, ``deepspeed/runtime/zero/partition_parameters.py`` at v0.3.15,
2c2a7f31) and after every submodule fetch (``_synchronize_communication``,
``deepspeed/runtime/zero/stage3.py``, same commit): no collective runs under compute
(``training.zero3_runtime=synchronous``, :mod:`nest.cost.fsdp`). Checked here: every gather and
reduce-scatter is then exposed, exactly what the prefetching runtime hides is added to the step,
a bad value is a one-line error, the SC21 rows select it and the FSDP2 rows do not, and ``nest
== brute`` with it on random small problems (the DP reads the same chain as the evaluator).
"""

import csv
import dataclasses
import random

import pytest

from baselines.brute import plans_to_score
from nest.app import validate
from nest.app.config import build_training
from nest.core.errors import UserError
from nest.core.problem import ZERO3_RUNTIMES, Training
from nest.cost import evaluate
from nest.dp.space import SpaceOptions

from .randomcase import assert_nest_equals_brute
from .test_nest_dp import tiny_case
from .test_validate import AUTOMODEL, CASES, SC21_T2, TORCHTITAN
from .test_zero3_recompute_hiding import MAX_PLANS, slow_network


def _rows(source: str) -> list[dict]:
    with open(CASES, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["source"] == source]


def _synchronous(problem):
    training = dataclasses.replace(problem.training, zero3_runtime="synchronous")
    return dataclasses.replace(problem, training=training)


@pytest.mark.parametrize("value", ["sync", "", "Synchronous"])
def test_a_bad_runtime_is_a_one_line_error_naming_the_choices(value):
    with pytest.raises(UserError) as err:
        Training(global_batch=8, zero3_runtime=value)
    message = str(err.value)
    assert "\n" not in message and repr(value) in message
    assert all(choice in message for choice in ZERO3_RUNTIMES)
    with pytest.raises(UserError):
        build_training({"global_batch": 8, "zero3_runtime": value})


def test_the_config_default_is_prefetch_and_synchronous_is_read():
    assert build_training({"global_batch": 8}).zero3_runtime == "prefetch"
    assert build_training({"global_batch": 8, "zero3_runtime": "synchronous"}).zero3_runtime == (
        "synchronous"
    )


@pytest.mark.parametrize("row", _rows(SC21_T2)[:6], ids=lambda r: r["gpus"])
def test_synchronous_exposes_every_collective_and_adds_exactly_what_prefetch_hides(row):
    """On each SC21 ZeRO-3 row (pp 1, one chunk): under ``synchronous`` the chunk's exposed
    ZeRO-3 time equals all of its gathers and reduce-scatters; the traffic itself is the same
    as under ``prefetch``; and the step grows by exactly what prefetching hid, once per
    microbatch (nothing else in the step depends on the runtime)."""
    assert row["case"].startswith("ZeRO-3") and row["zero3_runtime"] == "synchronous"
    problem, plan = validate.problem_and_plan(row)
    assert problem.training.zero3_runtime == "synchronous"
    sync = evaluate(problem, plan)
    prefetch_problem = dataclasses.replace(
        problem, training=dataclasses.replace(problem.training, zero3_runtime="prefetch")
    )
    pre = evaluate(prefetch_problem, plan)
    (s,), (p,) = sync.stages, pre.stages
    assert s.zero3_comm_s > 0
    assert s.zero3_exposed_s == pytest.approx(s.zero3_comm_s, rel=1e-12)
    assert s.zero3_comm_s == pytest.approx(p.zero3_comm_s, rel=1e-12)
    assert p.zero3_exposed_s < p.zero3_comm_s
    hidden_s = plan.num_microbatches * (p.zero3_comm_s - p.zero3_exposed_s)
    assert sync.iteration_time_s == pytest.approx(pre.iteration_time_s + hidden_s, rel=1e-9)


def test_only_the_deepspeed_2021_rows_select_the_synchronous_runtime():
    """The six SC21 Table 2 ZeRO-3 rows ran DeepSpeed's 2021 ZeRO-3; the PTD-P rows (Megatron,
    no ZeRO-3) and every FSDP2 row (NeMo Automodel, torchtitan) prefetch."""
    with open(CASES, newline="") as fh:
        rows = list(csv.DictReader(fh))
    synchronous = [r for r in rows if (r.get("zero3_runtime") or "") == "synchronous"]
    assert len(synchronous) == 6
    assert all(r["source"] == SC21_T2 and r["case"].startswith("ZeRO-3") for r in synchronous)
    for source in (AUTOMODEL, TORCHTITAN):
        for row in _rows(source):
            problem, _ = validate.problem_and_plan(row)
            assert problem.training.zero3_runtime == "prefetch"


def test_nest_equals_brute_with_the_synchronous_zero3_runtime():
    """``nest`` equals ``brute`` with ZeRO-3 forced under the synchronous runtime (every recompute
    mode, 1F1B or ZB-H2), on random small problems over a slow network where ZeRO-3's traffic
    is a large part of each stage: the DP's chains are the evaluator's."""
    agreed = 0
    for seed in range(60):
        problem, options = tiny_case(seed)
        if problem.model.spec.layers < 2:
            continue
        rng = random.Random(seed * 7 + 3)
        options = {
            **options,
            "zero_stages": [3],
            "recompute": ["none", rng.choice(["selective", "mlp"]), "full"],
            "schedules": rng.choice([["1f1b"], ["1f1b", "zb_h2"]]),
        }
        if plans_to_score(problem, SpaceOptions(**options), MAX_PLANS) > MAX_PLANS:
            continue
        problem = _synchronous(slow_network(problem, rng.choice([1.0, 1e-2])))
        if assert_nest_equals_brute(problem, options, (seed, options)) is not None:
            agreed += 1
    assert agreed >= 15, agreed
