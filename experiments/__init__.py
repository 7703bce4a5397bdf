"""Experiments: sweeps that reproduce the paper's results, aggregation and benchmarks."""
