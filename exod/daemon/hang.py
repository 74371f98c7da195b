"""Hang detection while serving: requests in flight and no progress for `hang_after`.

Progress is what the runner sends for a request (every generated piece of text, the end), never
a heartbeat: a runner stuck in a collective can still send those. It counts when it arrives,
not when the client reads it: a client that stops reading slows nobody's runner, and a request
the runner is done with (ended, or cut off for a client reading too slowly) is not in flight,
even while its handler still waits on the client's socket. Nothing is watched while no
request is in flight, so loading (which has no requests) is never timed, and an idle instance
costs no timer at all.
"""

from __future__ import annotations

from collections.abc import Callable

from exod.core.durations import format_duration
from exod.daemon.channel import RequestStream
from exod.daemon.clock import Clock, Timer


class HangWatch:
    def __init__(self, clock: Clock, hang_after: float,
                 on_hung: Callable[[float], None]) -> None:
        self.clock = clock
        self.hang_after = hang_after
        self.on_hung = on_hung  # called with hang_after, once per hang
        self.streams: set[RequestStream] = set()
        self.last_progress = 0.0
        self._timer: Timer | None = None

    def opened(self, stream: RequestStream) -> None:
        if not self.streams:  # the clock starts when work starts, not at the last idle event
            self.last_progress = self.clock.now()
            self._schedule()
        self.streams.add(stream)

    def progress(self) -> None:
        self.last_progress = self.clock.now()

    def closed(self, stream: RequestStream) -> None:
        self.streams.discard(stream)
        if not self.streams and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        self._timer = self.clock.call_at(self.last_progress + self.hang_after, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self.streams:
            return
        if all(s.finished for s in self.streams):  # handlers waiting on their clients only
            self.last_progress = self.clock.now()
            self._schedule()
            return
        # Against the deadline the timer was set for, not a difference that rounds below it.
        if self.clock.now() < self.last_progress + self.hang_after:
            self._schedule()  # progress came meanwhile: look again a full window after it
            return
        # Said with the configured window ("no progress for 5m"), which the silence reached.
        waiting = sum(not s.finished for s in self.streams)
        message = (f"the instance is hung: no progress for {format_duration(self.hang_after)} "
                   f"with {waiting} request(s) in flight; it is being restarted")
        for stream in list(self.streams):
            stream.fail("hung", message)
        self.streams.clear()
        self.on_hung(self.hang_after)
