"""The one shared cost model: :func:`evaluate` scores any plan on any problem."""

from nest.cost.evaluate import check_plan, evaluate

__all__ = ["check_plan", "evaluate"]
