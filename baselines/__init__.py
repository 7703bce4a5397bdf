"""Baseline planners, one module each, all behind :class:`nest.planner.Planner`."""
