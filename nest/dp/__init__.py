"""The NEST planner: an exact dynamic program over structured plans (see :mod:`nest.dp.planner`)."""
