"""Domain types: errors, units, hardware, the model and its layers, the topology, the problem and
the plan."""
