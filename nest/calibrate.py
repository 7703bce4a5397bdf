"""``python -m nest.calibrate``: the command line of :mod:`nest.app.calibrate`."""

from nest.app.calibrate import main

if __name__ == "__main__":
    raise SystemExit(main())
