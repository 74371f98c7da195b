"""The memory the daemon frees goes back to the system, so that its resident size stays flat
for months.

Under a mixed load with chaos (`python -m bench soak`; docs/benchmarks.md), the daemon's
Python objects stayed flat, yet its RSS rose: glibc keeps freed blocks in the middle of its
heap (request bodies, frames and answers of every size) and returns only the top of it. Its
`malloc_trim(0)` hands every free page back; macOS's `malloc_zone_pressure_relief` does the same
for its zones. A trim is cheap (docs/benchmarks.md, `soak`), so the daemon does it once a
`period` after a busy one, on the seam's clock, and never while idle.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

from loguru import logger

from exod.daemon.clock import Clock, Timer

PERIOD = 60.0  # seconds between two trims of a busy daemon


def _releaser() -> Callable[[], None] | None:
    """The C library's call that returns free heap pages, or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        if sys.platform == "darwin":
            relief = libc.malloc_zone_pressure_relief
            relief.argtypes, relief.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_size_t
            return lambda: relief(None, 0)
        trim = libc.malloc_trim  # glibc; musl and others have none
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        return lambda: trim(0)
    except (OSError, AttributeError):
        return None


class HeapTrim:
    """Trims the heap once a `period` when something happened since the last trim
    (`touched`): an idle daemon does no work for it."""

    def __init__(self, clock: Clock, period: float = PERIOD,
                 release: Callable[[], None] | None = None) -> None:
        self.clock = clock
        self.period = period
        self.release = release if release is not None else _releaser()
        self.busy = False
        self.trims = 0
        self._timer: Timer | None = None

    def touched(self) -> None:
        """Something allocated and freed memory (a request, a runner's exit): a trim is due
        within a period."""
        self.busy = True
        if self._timer is None and self.release is not None:
            self._timer = self.clock.call_at(self.clock.now() + self.period, self._due)

    def _due(self) -> None:
        self._timer = None
        if not self.busy or self.release is None:
            return
        self.busy = False
        try:
            self.release()
        except OSError as e:  # never worth more than a line
            logger.warning("returning free memory to the system failed: {}", e)
            return
        self.trims += 1

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
