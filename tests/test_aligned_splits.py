"""The bounds price the groups that keep the tensor index fixed (data, context, hybrid shard and
replicate groups) over ``T(n, tp)`` (nest/dp/bounds.py ``Floors.splits``): a group with one
device per aligned block of ``tp`` ids can only split as those tuples. Checked here on every
group of every rank of structured placements (every rank order with ``tp`` innermost) on
hierarchies whose fanouts are and are not multiples of ``tp``; the bounds themselves are checked
against each configuration's optimum by the bound tests (tests/test_search_caches.py,
test_nest_interleaved.py, test_hsdp.py, test_graph.py)."""

import itertools

import numpy as np
import pytest

from nest.core.axes import Axis, GroupKind, Recompute
from nest.core.plan import group_arrays, place
from nest.dp.bounds import Floors

from .conftest import make_cluster, make_problem, make_spec

KEPT_TENSOR_INDEX = (
    GroupKind.CP,
    GroupKind.DENSE_DP,
    GroupKind.ZERO_SHARD,
    GroupKind.ZERO_REPLICATE,
)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize(
    "fanouts", [(4, 2), (8, 4), (2, 2, 2), (6, 4), (3, 4, 2), (4, 3), (8, 2, 3)]
)
def test_groups_keeping_the_tensor_index_split_inside_t_n_tp(fanouts):
    """Every group of the kinds that keep the tensor index fixed, on every rank of every
    structured placement (all degrees dividing the devices, every rank order with ``tp``
    innermost, every hybrid shard degree), has its level split among ``T(n, tp)``; and the
    subset is strictly smaller than ``T(n)`` somewhere (it tightens)."""
    cluster = make_cluster(fanouts=fanouts)
    floors = Floors(make_problem(make_spec(), cluster), tuple(Recompute))
    n_dev = int(np.prod(fanouts))
    checked = narrower = 0
    for tp, cp, dp in itertools.product(_divisors(n_dev), repeat=3):
        if n_dev % (tp * cp * dp):
            continue
        pp = n_dev // (tp * cp * dp)
        for rest in itertools.permutations((Axis.CP, Axis.DP, Axis.PP)):
            grid = place(tp=tp, cp=cp, dp=dp, pp=pp, rank_order=(Axis.TP, *rest))
            for shard in [None] + [z for z in _divisors(dp) if 1 < z < dp]:
                for r in range(pp):
                    arrays = group_arrays(grid[r], 1, None, shard)
                    for kind in KEPT_TENSOR_INDEX:
                        if kind not in arrays:
                            continue
                        for group in arrays[kind]:
                            n = len(group)
                            if n <= 1:
                                continue
                            split = cluster.group_factors(group)
                            mask = floors.splits(n, tp)
                            row = np.all(floors._tuples == np.array(split), axis=1)
                            assert mask[row].all(), (fanouts, tp, cp, dp, rest, kind, split)
                            checked += 1
                            narrower += mask.sum() < floors.splits(n, 1).sum()
    assert checked > 100, checked
    assert narrower > 0
