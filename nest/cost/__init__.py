"""The one shared cost model: :func:`evaluate` scores any plan on any problem.

``evaluate`` is a composition of public terms, which the planners call too (scalars or numpy
rows alike): :mod:`~nest.cost.collectives` (alpha-beta collectives and p2p on a level split),
:mod:`~nest.cost.groups` (a pipeline rank's communication groups, the slowest group's cost),
:mod:`~nest.cost.compute` (a layer's compute, recompute and collectives under a recompute mode),
:mod:`~nest.cost.state` (model state with ZeRO sharding, DP sync, ZeRO-3 traffic, optimizer step),
:mod:`~nest.cost.memory` (activations, peak buffers, a rank's total) and
:mod:`~nest.cost.pipeline` (schedules, in-flight microbatches, exposed sync).
"""

from nest.cost.evaluate import check_plan, evaluate

__all__ = ["check_plan", "evaluate"]
