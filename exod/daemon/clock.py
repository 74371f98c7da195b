"""The seam's clock: what every timer of the daemon runs on. The supervisor's is the event
loop's monotonic clock; unit tests drive a fake one (tests/unit/fakes.py), so the state
machine, the ladder, on-demand starts, idle stops and hang watches run there in milliseconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer: ...
