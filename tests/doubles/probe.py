"""A probe double: the real probe (exod.runner.split.probe), held back until the test lets it go.
The daemon runs it in place of the real one when its environment says
`EXOD_PROBE_MODULE=tests.doubles.probe`. With EXOD_PROBE_GATE naming a file, it first creates
that file + ".started" (the test waits for it), then waits until the gate file exists (polled),
then answers as the real probe does."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from exod.runner.split.probe import main

if __name__ == "__main__":
    gate = os.environ.get("EXOD_PROBE_GATE")
    if gate:
        Path(gate + ".started").touch()
        while not Path(gate).exists():
            time.sleep(0.02)
    sys.exit(main())
