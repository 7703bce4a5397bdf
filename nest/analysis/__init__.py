"""Analyses of plans: the k best, robustness, the simulator, explain."""
