"""``python -m nest.validate``: the command line of :mod:`nest.app.validate`."""

from nest.app.validate import main

if __name__ == "__main__":
    raise SystemExit(main())
