"""When to tell the service manager READY=1, and keeping STATUS= current.

Policy `daemon`: ready once the control socket is up and every autostart instance is spawned.
Policy `instances`: ready once every autostart instance has settled (ready, or failed: then
STATUS says which), and meanwhile each layer of progress extends the start timeout by
EXTEND_WINDOW, so a long but progressing load never hits TimeoutStartSec. exod itself never
times a load out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from exod.core.states import State
from exod.daemon.instance import InstanceRuntime
from exod.daemon.manager_notify import ServiceNotifier


class Daemon(Protocol):
    """What readiness needs of the daemon."""

    @property
    def stopping(self) -> bool: ...

    def ordered(self) -> Sequence[InstanceRuntime]: ...

    def summary(self) -> str: ...

EXTEND_WINDOW = 300.0  # seconds allowed for the NEXT layer; renewed on every layer

SETTLED = (State.READY, State.FAILED, State.STOPPED)


class Readiness:
    def __init__(self, policy: str, service: ServiceNotifier) -> None:
        self.policy = policy
        self.service = service
        self.ready_sent = False
        self._spawned = False
        self._progress_seen = 0.0  # newest layer-progress time already answered with EXTEND
        self.reload_error: str | None = None  # sticky in STATUS until a reload succeeds

    def spawned(self, sup: Daemon, now: float) -> None:
        self._spawned = True
        self.update(sup, now)

    def update(self, sup: Daemon, now: float) -> None:
        if sup.stopping or not self._spawned:
            return
        summary = self.line(sup)
        if self.ready_sent:
            self.service.status(summary)
            return
        autostart = [i for i in sup.ordered() if i.config.autostart]
        if self.policy == "daemon" or all(i.state in SETTLED for i in autostart):
            self.ready_sent = True
            self.service.ready(summary)
            return
        self.service.status(summary)
        # Every layer of progress counts, a restarted load's included (its count starts over).
        latest = max((r.last_progress or 0.0 for i in autostart for r in i.ranks), default=0.0)
        if latest > self._progress_seen:
            self._progress_seen = latest
            self.service.extend_timeout(EXTEND_WINDOW)

    def line(self, sup: Daemon) -> str:
        if self.reload_error:
            return f"{self.reload_error}; {sup.summary()}"
        return sup.summary()

    def reloading(self) -> None:
        # Before the first READY=1 systemd is still waiting for the start: a RELOADING/READY
        # pair now would end `systemctl start` early. The start's own READY=1 comes later.
        if self.ready_sent:
            self.service.reloading()

    def reloaded(self, sup: Daemon, now: float, error: str | None) -> None:
        """READY=1 closes every RELOADING=1, a failed reload included (STATUS says so)."""
        self.reload_error = error
        if self.ready_sent:
            self.service.ready(self.line(sup))
        else:
            self.update(sup, now)
