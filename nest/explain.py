"""``python -m nest.explain``: the command line of :mod:`nest.analysis.explain`."""

from nest.analysis.explain import main

if __name__ == "__main__":
    raise SystemExit(main())
