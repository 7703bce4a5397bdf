"""DeepEP's dispatch and combine (``training.moe_dispatcher=deepep``, nest/core/alphabeta.py).

Source of the mechanism: github:deepseek-ai/DeepEP ``docs/legacy.md`` ("Normal kernels with
NVLink and RDMA forwarding"): a token bound for several experts of another node crosses the
network once, to the same local rank there, and is forwarded over NVLink; the combine mirrors it.
"""

import dataclasses

import numpy as np
import pytest

from nest.core.alphabeta import all_to_all_forms, dedup_factor, deepep_forms, deepep_op
from nest.core.axes import GroupKind
from nest.core.errors import UserError
from nest.core.layers import AnalyticModel
from nest.core.problem import Problem, Training
from nest.cost import evaluate
from nest.graph.build import graph_cluster
from nest.graph.generators import hierarchy_graph

from .conftest import make_cluster, make_problem, make_spec
from .test_nest_dp import assert_nest_equals_brute, tiny_case


def test_dedup_factor_worked_example():
    """Qwen3-235B's EP32 over 4 DGX nodes (MoE-ModelZoo's cross-node rows): top-8 of experts
    spread evenly over 32 ranks, 8 per node. A plain all-to-all sends ``8 x 24/32 = 6`` of a
    token's 8 copies over InfiniBand; DeepEP sends one per remote node it reaches, ``3 x (1 -
    (3/4)^8) = 2.70`` on average: ``f = 2.70 / 6 = 0.450``."""
    f = dedup_factor(np.array([[8.0, 4.0]]), 8)[0]
    assert f == pytest.approx(3 * (1 - 0.75**8) / 6)
    assert f == pytest.approx(0.44995, abs=1e-5)
    # top-1 routing sends one copy wherever it goes: nothing to deduplicate
    assert dedup_factor(np.array([[8.0, 4.0]]), 1)[0] == pytest.approx(1.0)


def test_deepep_is_the_all_to_all_inside_one_domain():
    """A group inside one NVLink domain has nothing to forward: the same form as the
    all-to-all, whatever the top-k."""
    k = np.array([[8.0, 1.0, 1.0], [4.0, 1.0, 1.0], [2.0, 1.0, 1.0]])
    bw, alpha = np.array([400e9, 50e9, 25e9]), np.array([1e-6, 5e-6, 10e-6])
    for top_k in (1, 2, 8):
        a, c = deepep_forms(k, bw, alpha, top_k)
        a2, c2 = all_to_all_forms(k, bw, alpha)
        np.testing.assert_allclose(a, a2)
        np.testing.assert_allclose(c, c2)


def test_deepep_never_costs_more_than_the_all_to_all_on_random_splits():
    """On any split of any hierarchy whose bandwidth never rises going up (a hierarchy's
    bottleneck bandwidths: ``Hierarchy.bw`` is a running minimum), DeepEP's form is at most the
    all-to-all's (``f <= 1`` and the forwarded share costs ``(k_0-1)/k_0 / bw_0 <= 1 / bw_l``),
    with the same latency; it is strictly less when the group spans domains and ``K > 1``."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        levels = int(rng.integers(2, 4))
        k = rng.integers(1, 9, size=(1, levels)).astype(float)
        bw = np.minimum.accumulate(rng.uniform(5e9, 900e9, size=levels))
        alpha = rng.uniform(0, 1e-5, size=levels)
        top_k = int(rng.integers(1, 9))
        a, c = deepep_forms(k, bw, alpha, top_k)
        a2, c2 = all_to_all_forms(k, bw, alpha)
        assert a[0] <= a2[0] * (1 + 1e-12)
        assert c[0] == pytest.approx(c2[0])
        if top_k > 1 and k[0, 0] > 1 and k[0, 1:].prod() > 1:
            assert a[0] < a2[0]


def moe_problem(dispatcher: str, fanouts=(4, 4)):
    return make_problem(
        make_spec(layers=4, heads=8, num_experts=8, top_k=4, seq_len=128),
        make_cluster(fanouts=fanouts),
        global_batch=32,
        moe_dispatcher=dispatcher,
    )


def test_evaluate_uses_deepep_only_where_experts_span_domains():
    """The same plan: with expert ranks across two 4-GPU nodes DeepEP's step is faster (its EP
    time smaller); with the expert group inside one node the two dispatchers cost the same."""
    from baselines.fixed import FixedPlanner

    def ep_s(dispatcher, ep):
        problem = moe_problem(dispatcher)
        plan = FixedPlanner(tp=1, pp=1, dp=16, ep=ep, microbatch_size=1).solve(problem)
        report = evaluate(problem, plan)
        return sum(s.ep_comm_s for s in report.stages), report.iteration_time_s

    across_a2a, across_deepep = ep_s("alltoall", 8), ep_s("deepep", 8)
    assert across_deepep[0] < across_a2a[0] and across_deepep[1] < across_a2a[1]
    inside_a2a, inside_deepep = ep_s("alltoall", 4), ep_s("deepep", 4)
    assert inside_deepep == pytest.approx(inside_a2a)


def test_layers_issue_the_deepep_op_with_the_models_top_k():
    problem = moe_problem("deepep")
    model = problem.model
    ref = next(r for r in model.chain if r.moe)
    from nest.core.layers import Shard

    cost = model.layer_cost(ref, Shard(tp=1, cp=1, ep=4), problem.cluster.device)
    colls = cost.fwd_collectives + cost.bwd_collectives
    assert {c.op for c in colls if c.axis == GroupKind.EP} == {deepep_op(4)}


def test_nest_equals_brute_force_with_deepep_on_random_moe_problems():
    """The search's floors take DeepEP's forms like any other (a hierarchy's floor forms are its
    forms, minimised over every split): ``nest`` and ``brute`` agree to 1e-9 on random small MoE
    problems dispatched with DeepEP."""
    agreed = tried = 0
    seed = 3000
    while tried < 25:
        seed += 1
        problem, options = tiny_case(seed)
        spec = problem.model.spec
        if not spec.is_moe or len(problem.cluster.levels) < 2:
            continue
        tried += 1
        training = dataclasses.replace(problem.training, moe_dispatcher="deepep")
        model = AnalyticModel(
            spec,
            flash_attention=training.flash_attention,
            overlap=training.overlap,
            precision=training.numerics,
            moe_routing=training.moe_routing,
            moe_dispatcher="deepep",
        )
        problem = Problem(model=model, cluster=problem.cluster, training=training)
        agreed += assert_nest_equals_brute(problem, options, (seed, options)) is not None
    assert agreed >= 12, agreed


def test_bad_dispatcher_and_graph_cluster_are_one_line_errors():
    with pytest.raises(UserError, match=r"training.moe_dispatcher='nccl'; use one of"):
        Training(global_batch=8, moe_dispatcher="nccl")
    problem = moe_problem("deepep")
    graph = graph_cluster("tree", problem.cluster.device, hierarchy_graph(problem.cluster))
    with pytest.raises(UserError, match="moe_dispatcher=deepep on a cluster given as a graph"):
        Problem(model=problem.model, cluster=graph, training=problem.training)
    other = AnalyticModel(problem.model.spec, moe_dispatcher="alltoall")
    with pytest.raises(UserError, match="built for moe_dispatcher=alltoall"):
        Problem(model=other, cluster=problem.cluster, training=problem.training)
