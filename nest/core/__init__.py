"""Domain types: errors, units, hardware, the model and its layers, the topology, the problem and
the plan; and what the cost model and a graph network share (:mod:`nest.core.fabric`: the
questions the cost model asks a network and the cost classes it gets back;
:mod:`nest.core.alphabeta`: the alpha-beta formulas both evaluate). Imports nothing else of the
package (tests/test_layering.py)."""
