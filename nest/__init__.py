"""NEST: network- and memory-aware parallelisation planning for distributed training.

The package holds the problem description (model layer chain, cluster hierarchy, training
settings), the plan, the one shared cost model (:func:`nest.cost.evaluate`) and the planners.
All quantities inside are SI: bytes, seconds, FLOP, bytes/s.
"""

from nest.core.errors import Infeasible, UserError

__all__ = ["Infeasible", "UserError"]
