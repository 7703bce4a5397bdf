"""Random small problems and valid structured plans, drawn from a seed."""

import random
from itertools import permutations

from baselines.fixed import FixedPlanner
from nest.core.axes import Optimizer, Recompute, divisors
from nest.core.model import ModelSpec

from .conftest import make_cluster, make_device, make_problem

RANK_ORDERS: tuple[str, ...] = tuple(
    ",".join(("tp", *rest)) for rest in permutations(("cp", "dp", "pp"))
)
"""Every rank order the space allows: ``tp`` innermost, any order of ``cp, dp, pp`` above it
(nest/dp/space.py; tests/test_space_oracle.py checks the space uses exactly these six)."""


def random_rank_orders(rng: random.Random) -> list[str]:
    """One or two of :data:`RANK_ORDERS`, for a random restriction of the space: the exactness
    suites (nest == brute) draw from all six, not a fixed subset."""
    return rng.sample(RANK_ORDERS, rng.randint(1, 2))


def random_shape(rng: random.Random, *, heads: int, layers: int, moe: bool) -> dict:
    """The modern fields of a random :class:`ModelSpec` (``{}`` for about half the draws): MLA
    or GQA with its own ``head_dim``, KV groups and Q/K norms; a sliding or chunked window with
    global blocks every 2nd or 3rd block (or none); for a MoE model, routed experts of their own
    width, a shared expert, first dense blocks and MoE every 2nd block; an MTP module. Widths
    are multiples of 8, so every tensor-parallel degree the heads allow divides them."""
    if rng.random() < 0.5:
        return {}
    kw: dict = {}
    if rng.random() < 0.4:
        kw.update(
            attention="mla",
            q_lora_rank=rng.choice([None, 16]),
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=rng.choice([8, 16]),
        )
    else:
        kw.update(
            head_dim=rng.choice([None, 16, 32]),
            kv_heads=rng.choice([heads, heads // 2]),
            qk_norm=rng.random() < 0.5,
        )
    if rng.random() < 0.6:
        kw.update(
            window=rng.choice([8, 16]),
            local_attention=rng.choice(["sliding", "chunked"]),
            global_every=rng.choice([0, 2, 3]),
        )
    if moe:
        freq = rng.choice([1, 2])
        kw.update(
            moe_ffn_hidden=rng.choice([None, 64]),
            shared_experts=rng.choice([0, 1]),
            first_dense_layers=rng.choice([0, 1]),
            moe_layer_freq=freq,
            moe_layer_phase=rng.randrange(freq),
        )
        first, phase = kw["first_dense_layers"], kw["moe_layer_phase"]
        if not any(i >= first and i % freq == phase for i in range(layers)):
            kw.update(first_dense_layers=0, moe_layer_phase=0)  # block 0 is MoE then
    kw["mtp_layers"] = int(rng.random() < 0.4)
    return kw


def shape_rng(seed: int) -> random.Random:
    """The generator of a case's :func:`random_shape` draws, apart from the case's own stream:
    a case keeps the base problem and plan it drew before the modern fields existed."""
    return random.Random(f"shape-{seed}")


def random_problem(
    rng: random.Random, *, hbm_gib: float | None = None, shapes: random.Random | None = None
):
    n_levels = rng.randint(1, 3)
    fanouts = tuple(rng.choice([1, 2, 2, 4]) for _ in range(n_levels))
    if fanouts[0] == 1:
        fanouts = (2,) + fanouts[1:]
    bws = tuple(sorted((rng.uniform(5, 900) for _ in fanouts), reverse=True))
    lats = tuple(sorted(rng.uniform(0, 20) for _ in fanouts))
    moe = rng.random() < 0.3
    base = dict(
        name="rand",
        hidden=rng.choice([64, 128, 256]),
        layers=rng.randint(1, 6),
        heads=rng.choice([4, 8]),
        ffn_hidden=rng.choice([256, 512]),
        vocab=rng.choice([500, 1000, 4096]),
        seq_len=rng.choice([32, 64, 128]),
        activation=rng.choice(["gelu", "swiglu"]),
        dropout=rng.random() < 0.5,
        tied_embeddings=rng.random() < 0.5,
        num_experts=4 if moe else 1,
        top_k=2 if moe else 1,
    )
    if shapes is not None:
        base.update(random_shape(shapes, heads=base["heads"], layers=base["layers"], moe=moe))
    spec = ModelSpec(**base)
    device = make_device(
        hbm_bytes=(hbm_gib if hbm_gib is not None else rng.choice([0.05, 0.5, 4])) * 2**30,
        peak_flops_per_s=rng.uniform(10, 1000) * 1e12,
        matmul_efficiency=rng.uniform(0.3, 1.0),
    )
    cluster = make_cluster(fanouts=fanouts, bws_gbps=bws, lat_us=lats, device=device)
    problem = make_problem(
        spec,
        cluster,
        flash=rng.random() < 0.5,
        global_batch=rng.choice([4, 8, 16]),
        microbatch_sizes=(1, 2),
        optimizer=rng.choice([Optimizer.ADAM, Optimizer.SGD]),
        overlap_grad_sync=rng.random() < 0.5,
        grad_bytes=rng.choice([2, 4]),
    )
    return problem


def random_planner(rng: random.Random, problem) -> FixedPlanner:
    spec = problem.model.spec
    n = problem.cluster.num_devices
    widths = [spec.heads, spec.ffn_hidden, spec.expert_ffn, spec.shared_ffn]
    if spec.attention == "gqa":
        widths.append(spec.num_kv_heads)
    tp = rng.choice([t for t in divisors(n) if all(w % t == 0 for w in widths)])
    rest = n // tp
    pp = rng.choice([p for p in divisors(rest) if p <= spec.layers + 2])
    rest //= pp
    cp = rng.choice([c for c in divisors(rest) if spec.seq_len % (2 * c) == 0])
    rest //= cp
    gb = problem.training.global_batch
    dp = rng.choice([d for d in divisors(rest) if gb % d == 0])
    mbs = rng.choice([b for b in problem.training.microbatch_sizes if gb % (b * dp) == 0])
    etp = rng.choice([None, 1]) if spec.is_moe and tp > 1 else None  # 1: whole experts
    fold = tp if etp == 1 else 1
    ep = (
        rng.choice([e for e in divisors(dp * cp * fold) if spec.num_experts % e == 0])
        if spec.is_moe
        else 1
    )
    modes = [rng.choice(list(Recompute)).value for _ in range(pp)]
    cuts = sorted(rng.sample(range(1, spec.layers + 2), pp - 1))
    bounds = [0, *cuts, spec.layers + 2]
    partition = [bounds[i + 1] - bounds[i] for i in range(pp)]
    order = ["tp", "cp", "dp", "pp"]
    rng.shuffle(order)
    return FixedPlanner(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        microbatch_size=mbs,
        recompute=modes,
        zero_stage=rng.randint(0, 3),
        layer_partition=partition,
        rank_order=",".join(order),
    )


def random_case(seed: int, *, shapes: bool = False, **kw):
    """A random problem and plan; ``shapes``: about half the models draw the modern fields
    (:func:`random_shape`) on top of the same base draws."""
    rng = random.Random(seed)
    problem = random_problem(rng, shapes=shape_rng(seed) if shapes else None, **kw)
    planner = random_planner(rng, problem)
    return problem, planner


def assert_nest_equals_brute(problem, options: dict, what):
    """``nest`` against ``brute`` (every plan of the same space through ``evaluate``) on one
    problem: the same infeasibility and, when nothing fits, the same smallest peak memory (above
    the device's); else nest's objective equals brute's to 1e-9. Returns
    brute's plan, or None when nothing fits. ``what`` labels a failure (seed, options)."""
    import pytest

    from baselines.brute import BrutePlanner
    from nest.core.errors import Infeasible
    from nest.dp.planner import NestPlanner

    try:
        oracle = BrutePlanner(**options).solve(problem)
    except Infeasible as exc:
        oracle, oracle_need = None, exc.min_memory_bytes
    try:
        found = NestPlanner(**options).solve(problem)
    except Infeasible as exc:
        found, found_need = None, exc.min_memory_bytes
    if oracle is None or found is None:
        assert oracle is None and found is None, (what, oracle, found)
        # both report the smallest peak memory of any plan of the space
        assert found_need == pytest.approx(oracle_need, rel=1e-9), what
        assert found_need > problem.cluster.device.hbm_bytes, what
        return None
    assert found.objective_s == pytest.approx(oracle.objective_s, rel=1e-9), (
        what,
        found.objective_s,
        oracle.objective_s,
    )
    return oracle


def nest_equals_brute_over_seeds(case, recompute: list, seeds=range(60), max_plans=20_000):
    """:func:`assert_nest_equals_brute` on ``case(seed)``'s problems (a ``(problem, options)``
    maker) with ``recompute`` as the searched modes, skipping spaces of more than ``max_plans``
    plans; returns how many agreed with a plan and the modes their optimal stages use."""
    from baselines.brute import count_plans
    from nest.dp.space import SpaceOptions

    used, agreed = set(), 0
    for seed in seeds:
        problem, options = case(seed)
        options = {**options, "recompute": recompute}
        if count_plans(problem, SpaceOptions(**options)) > max_plans:
            continue
        oracle = assert_nest_equals_brute(problem, options, (seed, options))
        if oracle is not None:
            agreed += 1
            used |= {s.recompute for s in oracle.stages}
    return agreed, used
