"""Hydra plugins of the NEST planner project (found by Hydra's scan of ``hydra_plugins``)."""
