"""One instance's idle clock, held by the instance and dropped with it: when it was last used
(the one clock: a request ended, or an on-demand start was asked for or became ready), and,
for an on-demand instance, when it stops for want of requests.

`idle_stop_after` stops it through the ladder once no request has come for that long; a
request's own keep-alive (Ollama's `keep_alive`), within the instance's bounds, sets that window
until the next request ends (0: stop once no request is in flight, which a later request that
asks nothing does not undo). The timer runs on the instance's seam's clock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

from exod.config.schema import Instance
from exod.core.durations import format_duration
from exod.core.keep_alive import bounded
from exod.core.states import State
from exod.daemon.clock import Clock, Timer
from exod.daemon.lane import Lane

if TYPE_CHECKING:
    from loguru import Logger


class IdleOwner(Protocol):
    """What an idle clock reads of its instance (exod.daemon.instance), and its stop."""

    @property
    def config(self) -> Instance: ...

    @property
    def seam(self) -> Clock: ...

    @property
    def state(self) -> State: ...

    @property
    def retired(self) -> bool: ...

    @property
    def lane(self) -> Lane: ...

    @property
    def log(self) -> Logger: ...

    def stop(self) -> None: ...


class IdleClock:
    def __init__(self, inst: IdleOwner) -> None:
        self.inst = inst
        self.last_used: float | None = None  # on the seam's clock; None: never used yet
        self.asked: float | None = None  # the idle window the last request set, bounded
        self._due: tuple[float, Timer] | None = None  # when it stops idle, and its timer

    def window(self) -> float:
        """How long the instance stays up with no request: what the last request asked for
        (within its keep_alive bounds), else its `idle_stop_after`."""
        return self.inst.config.idle_stop_after if self.asked is None else self.asked

    def finished(self, keep_alive: float | None = None) -> None:
        """A request ended; `keep_alive`: the idle window it asked for (seconds, math.inf:
        never, 0: stop once idle), None: none. Restarts the idle clock."""
        if self.inst.config.on_demand:
            if keep_alive is not None:
                self.asked = bounded(keep_alive, self.inst.config.keep_alive)
            elif self.asked != 0:  # a stop asked for waits for the in-flight ones
                self.asked = None
        self.used()

    def used(self) -> None:
        """A request finished (or an on-demand start became ready): restart the idle clock."""
        self.last_used = now = self.inst.seam.now()
        if not self.inst.config.on_demand:
            return
        if self._due is not None:
            self._due[1].cancel()
            self._due = None
        after = self.window()
        if not math.isinf(after):
            self._due = (now + after, self.inst.seam.call_at(now + after, self._idle_due))

    def stops_at(self) -> float:
        """When the instance is due to stop for want of requests, on the seam's clock
        (math.inf: never, as an instance that is always on, or whose window is never)."""
        return self._due[0] if self._due is not None else math.inf

    def _idle_due(self) -> None:
        self._due = None
        inst = self.inst
        if inst.retired or inst.state is not State.READY or inst.lane.busy:
            return  # busy now: the request that is running will restart the clock
        idle_for = inst.seam.now() - (self.last_used or 0.0)
        asked = " (as a request's keep_alive asked)" if self.asked is not None else ""
        inst.log.info("idle for {}{}: stopping until the next request", format_duration(idle_for),
                      asked)
        self.asked = None
        inst.stop()
