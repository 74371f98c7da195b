"""When to tell the service manager READY=1, and keeping STATUS= current.

Policy `daemon`: ready once the control socket is up and every autostart instance is spawned.
Policy `instances`: ready once every autostart instance has settled (ready, or failed: then
STATUS says which). Meanwhile, for as long as an autostart instance is downloading its model, or
is starting or loading and one of its runners is alive, the start timeout is extended on a fixed
tick: the download, the import, the wait for peers, a layer that takes an hour. A start then
lasts as long as the download and the load, and the unit's TimeoutStartSec only fires when exod
itself is stuck (no tick comes). exod itself never times a download or a load out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from exod.core.states import State
from exod.daemon.clock import Clock, Timer
from exod.daemon.instance import InstanceRuntime
from exod.daemon.manager_notify import ServiceNotifier


class ReadinessSource(Clock, Protocol):
    """What readiness needs of the daemon (its tick runs on the seam's clock)."""

    @property
    def stopping(self) -> bool: ...

    def ordered(self) -> Sequence[InstanceRuntime]: ...

    def summary(self) -> str: ...


TICK = 5.0  # seconds between two extensions of the start timeout
EXTEND_BY = 3 * TICK  # each one covers the next tick, with room for a busy moment of the loop

SETTLED = (State.READY, State.FAILED, State.STOPPED)
LOADING = (State.STARTING, State.LOADING)


class Readiness:
    def __init__(self, policy: str, service: ServiceNotifier) -> None:
        self.policy = policy
        self.service = service
        self.ready_sent = False
        self._spawned = False
        self._tick: Timer | None = None
        self.reload_error: str | None = None  # sticky in STATUS until a reload succeeds

    def spawned(self, sup: ReadinessSource, now: float) -> None:
        self._spawned = True
        self.update(sup, now)

    def update(self, sup: ReadinessSource, now: float) -> None:
        if sup.stopping or not self._spawned:
            return
        summary = self.line(sup)
        if self.ready_sent:
            self.service.status(summary)
            return
        autostart = [i for i in sup.ordered() if i.config.always_on]
        if self.policy == "daemon" or all(i.state in SETTLED for i in autostart):
            self.ready_sent = True
            self.service.ready(summary)
            return
        self.service.status(summary)
        if self._tick is None:
            self._on_tick(sup)

    def _on_tick(self, sup: ReadinessSource) -> None:
        """Extend the start timeout while a runner of a starting autostart instance lives."""
        self._tick = None
        if self.ready_sent or sup.stopping:
            return
        if any(i.config.always_on and (i.state in LOADING and i.alive() or i.download)
               for i in sup.ordered()):
            self.service.extend_timeout(EXTEND_BY)
            self._tick = sup.call_at(sup.now() + TICK, lambda: self._on_tick(sup))

    def line(self, sup: ReadinessSource) -> str:
        if self.reload_error:
            return f"{self.reload_error}; {sup.summary()}"
        return sup.summary()

    def reloading(self) -> None:
        # Before the first READY=1 systemd is still waiting for the start: a RELOADING/READY
        # pair now would end `systemctl start` early. The start's own READY=1 comes later.
        if self.ready_sent:
            self.service.reloading()

    def reloaded(self, sup: ReadinessSource, now: float, error: str | None) -> None:
        """READY=1 closes every RELOADING=1, a failed reload included (STATUS says so)."""
        self.reload_error = error
        if self.ready_sent:
            self.service.ready(self.line(sup))
        else:
            self.update(sup, now)
