"""The one driver of the termination ladder (exod.core.ladder), for runners' ranks and for
fetchers alike: it performs each step through `act` when its deadline comes, on the seam's
clock, until the process is reaped. What a step does to the process is the owner's."""

from __future__ import annotations

from collections.abc import Callable

from exod.config.schema import StopPolicy
from exod.core.ladder import LadderRun, Step
from exod.daemon.clock import Clock, Timer


class LadderDriver:
    def __init__(self, clock: Clock, policy: StopPolicy, act: Callable[[Step], None]) -> None:
        self.clock = clock
        self.act = act
        self.run = LadderRun(policy, clock.now())
        self._timer: Timer | None = None
        self._done = False

    def begin(self) -> None:
        """Perform the first step (the ask) now, and wait for the next."""
        self.act(self.run.first)
        self._schedule()

    @property
    def current(self) -> Step:
        return self.run.current

    def time_to_kill(self, now: float) -> float:
        return self.run.time_to_kill(now)

    def hurry(self) -> None:
        """A second stop signal: skip what is left of rung 1's grace."""
        if not self._done:
            self.run.skip_grace(self.clock.now())
            self._schedule()

    def reaped(self) -> None:
        """The process is gone: nothing more to send."""
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._done:  # `act` may have seen the process reaped
            self._timer = self.clock.call_at(self.run.deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._done:
            return
        step = self.run.due(self.clock.now())
        if step is not None:
            self.act(step)
        self._schedule()
