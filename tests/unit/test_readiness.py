"""When exod tells the service manager READY=1, and the start timeout's extensions, on the
fake seam's clock (exod.daemon.readiness): a tick while an autostart instance loads, none once
it settled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exod.config.schema import Instance
from exod.core.shards import pipeline_shards
from exod.daemon.instance import InstanceRuntime
from exod.daemon.readiness import EXTEND_BY, TICK, Readiness
from tests.unit.fakes import FakeDaemon


class FakeService:
    def __init__(self) -> None:
        self.sent: list[tuple[float, str, Any]] = []
        self.clock: FakeDaemon | None = None

    def _note(self, what: str, arg: Any) -> None:
        assert self.clock is not None
        self.sent.append((self.clock.now(), what, arg))

    def ready(self, status: str | None = None) -> None:
        self._note("ready", status)

    def status(self, text: str) -> None:
        self._note("status", text)

    def extend_timeout(self, seconds: float) -> None:
        self._note("extend", seconds)


class Daemon(FakeDaemon):
    def summary(self) -> str:
        return ", ".join(f"{i.name} {i.state}" for i in self.ordered())


def test_the_start_timeout_is_extended_while_loading_and_ready_follows() -> None:
    daemon = Daemon(0.0)
    service = FakeService()
    service.clock = daemon
    inst = daemon.add(InstanceRuntime(Instance(name="a", model=Path("/m")),
                                      pipeline_shards(4, 1), daemon))
    readiness = Readiness("instances", service)  # type: ignore[arg-type]
    inst.start()
    readiness.spawned(daemon, daemon.now())
    daemon.advance(3 * TICK)
    extends = [(t, arg) for t, what, arg in service.sent if what == "extend"]
    assert extends == [(n * TICK, EXTEND_BY) for n in range(4)]
    (pid,) = daemon.pids(inst)
    daemon.load(pid)
    readiness.update(daemon, daemon.now())
    assert service.sent[-1] == (3 * TICK, "ready", "a ready")
    daemon.advance(10 * TICK)  # settled: no tick is left
    assert daemon.pending() == [] and not [s for s in service.sent if s[0] > 3 * TICK]
