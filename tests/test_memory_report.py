"""The memory breakdown a user acts on: terms that add up, the loss's bytes per logit, and the
``memory fix:`` line of a plan that does not fit."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines.fixed import FixedPlanner
from nest.app.summary import format_summary, memory_table
from nest.core.axes import Recompute
from nest.core.layers import AnalyticModel, Shard, padded_vocab
from nest.cost import evaluate
from nest.planner import knobs, largest_term, memory_fix

from .conftest import make_cluster, make_problem, make_spec
from .randomcase import random_case

SEEDS = st.integers(0, 2**31 - 1)


@settings(max_examples=120, deadline=None)
@given(SEEDS)
def test_terms_are_disjoint_parts_of_the_total(seed):
    """Every rank's terms are non-negative and sum to its total; the FP8 copies are part of the
    weights, the communication buffers part of the transient; activations are per microbatch
    times the microbatches in flight."""
    problem, planner = random_case(seed)
    report = evaluate(problem, planner.solve(problem))
    for rank in report.ranks:
        m = rank.memory
        terms = m.terms()
        assert all(v >= -1e-9 * m.total_bytes for v in terms.values()), terms
        assert sum(terms.values()) == pytest.approx(m.total_bytes, rel=1e-12)
        assert 0 <= m.fp8_copies_bytes <= m.weights_bytes
        assert 0 <= m.comm_buffers_bytes <= m.transient_bytes
        assert m.activations_bytes == pytest.approx(
            m.activations_per_microbatch_bytes * m.in_flight_microbatches, rel=1e-12
        )
    assert report.to_dict()["ranks"][0]["memory"]["terms"] == report.ranks[0].memory.terms()


def test_zero3_gathered_weights_are_the_communication_buffer():
    """Under ZeRO-3 the layer at the peak holds its weights gathered beyond the device's shard
    (``(1 - 1/dp)`` of them, ZeRO SC20 §5.3); below stage 3 there is no such buffer."""
    problem = make_problem()
    plan = FixedPlanner(tp=1, pp=1, dp=8, microbatch_size=1, zero_stage=3).solve(problem)
    m = evaluate(problem, plan).ranks[0].memory
    assert m.comm_buffers_bytes > 0
    below = dataclasses.replace(plan, config=dataclasses.replace(plan.config, zero_stage=2))
    assert evaluate(problem, below).ranks[0].memory.comm_buffers_bytes == 0


def test_loss_bytes_per_logit_fused_and_unfused():
    """Worked example of the head's bytes per logit (``b s V / t`` logits per device). Both keep
    the fp32 softmax / log-probabilities (4 bytes) for the backward. Megatron-Core's fused
    ``VocabParallelCrossEntropy`` then holds the bf16 logits beside the fp32 copy (2 more);
    PyTorch's ``F.cross_entropy(logits.float())`` (torchtitan) holds the dense fp32 gradient of
    the log-probabilities (``nll_loss_backward``) and of the logits
    (``log_softmax_backward_data``) at once (8 more): 6 and 12 bytes per logit."""
    spec = make_spec()
    cluster = make_cluster()
    shard = Shard(tp=2, sp=True, mbs=2)
    logits = 2 * spec.seq_len * padded_vocab(spec.vocab, 2) / 2
    for fused, extra in ((True, 2.0), (False, 8.0)):
        model = AnalyticModel(spec, flash_attention=True, fused_loss=fused)
        cost = model.layer_cost(model.chain[-1], shard, cluster.device)
        assert cost.transient_bytes == pytest.approx(extra * logits, rel=1e-12)
        hidden = 2 * 2 * spec.seq_len * 2 * spec.hidden / 2  # two stored bf16 hidden tensors
        assert cost.act_bytes[Recompute.NONE] == pytest.approx(hidden + 4 * logits, rel=1e-12)


def _over_memory_plan():
    """A tiny problem on a device too small for its activations without recompute."""
    problem = make_problem(make_spec(seq_len=512, layers=8), global_batch=16)
    plan = FixedPlanner(tp=1, pp=1, dp=8, microbatch_size=2, recompute="none").solve(problem)
    report = evaluate(problem, plan)
    m = report.ranks[0].memory
    need_full = evaluate(problem, dict(knobs(plan))["recompute=full on every stage"])
    # a capacity between what recompute=full needs and what the plan needs
    capacity = (m.total_bytes + need_full.ranks[0].memory.total_bytes) / 2
    device = dataclasses.replace(problem.cluster.device, hbm_bytes=capacity)
    problem = dataclasses.replace(
        problem, cluster=dataclasses.replace(problem.cluster, device=device)
    )
    return problem, plan, evaluate(problem, plan)


def test_memory_fix_names_the_largest_term_and_a_knob_that_fits():
    problem, plan, report = _over_memory_plan()
    assert not report.feasible
    line = memory_fix(problem, plan, report)
    term, _ = largest_term(report.ranks[0].memory)
    assert term == "activations"
    assert line.startswith("memory fix: pipeline rank 0 is ")
    assert "largest term is stored activations" in line
    assert "cheapest knob that fits:" in line
    # the knob it names does fit, and saves what it says
    label = line.split("cheapest knob that fits: ")[1].split(", saves")[0]
    after = evaluate(problem, dict(knobs(plan))[label])
    assert after.feasible
    saved = report.ranks[0].memory.total_bytes - after.ranks[0].memory.total_bytes
    assert f"saves {saved / 2**30:.2f} GiB" in line
    # and it is the fastest of the knobs that fit
    for other in knobs(plan):
        scored = evaluate(problem, other[1])
        if scored.feasible:
            assert after.iteration_time_s <= scored.iteration_time_s


def test_no_memory_fix_for_a_plan_that_fits_and_a_table_that_adds_up():
    problem = make_problem()
    plan = FixedPlanner(tp=1, pp=2, dp=4, microbatch_size=1).solve(problem)
    report = evaluate(problem, plan)
    assert report.feasible and memory_fix(problem, plan, report) is None
    table = memory_table(report)
    assert len(table) == 2 + len(report.ranks)
    summary = format_summary(problem, plan, report)
    assert "memory per device (GiB)" in summary and "memory fix:" not in summary
    for rank, line in zip(report.ranks, table[2:], strict=True):
        cells = line.split()
        assert sum(float(c) for c in cells[1:9]) == pytest.approx(float(cells[9]), abs=0.05)
        assert float(cells[9]) == pytest.approx(rank.memory.total_bytes / 2**30, abs=0.005)


def test_summary_of_a_plan_over_memory_carries_the_fix():
    problem, plan, report = _over_memory_plan()
    assert "memory fix:" in format_summary(problem, plan, report)


def test_nest_and_megatron_out_of_memory_errors_carry_the_memory_fix():
    """When nothing fits, nest's error (its configuration of least memory, split evenly in the
    least-storing mode) and Megatron's (its least-memory plan tried) end with the memory fix:
    the largest term and what would help. Nest's least-memory plan is already at ZeRO-3 and full
    recompute, so no single knob fits: the line says so."""
    from baselines.megatron import MegatronPlanner
    from nest.core.errors import Infeasible
    from nest.core.model import ModelSpec
    from nest.dp.planner import NestPlanner

    from .conftest import make_device

    problem = make_problem(
        ModelSpec(name="x", hidden=256, layers=4, heads=4, ffn_hidden=1024, vocab=512, seq_len=64),
        make_cluster(fanouts=(4,), device=make_device(hbm_bytes=2**20)),
        global_batch=8,
    )
    with pytest.raises(Infeasible) as nest_error:
        NestPlanner().solve(problem)
    reason = nest_error.value.reason
    assert "; memory fix: pipeline rank " in reason and "its largest term is" in reason
    assert "no single knob fits" in reason or "add devices" in reason
    assert "\n" not in reason
    with pytest.raises(Infeasible) as megatron_error:
        MegatronPlanner().solve(problem)
    assert "; memory fix: pipeline rank " in megatron_error.value.reason
