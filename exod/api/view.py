"""What the HTTP API needs of the daemon: a narrow view, so the API never imports the
supervisor (which starts it). Instances are the daemon's own runtimes; what requests need of
them (on-demand starts, queues, hang watches) the daemon's `traffic` answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime
    from exod.control_messages import Snapshot
    from exod.daemon.log_ring import LogRings
    from exod.daemon.traffic import Traffic


class Daemon(Protocol):
    @property
    def phase(self) -> str: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def started(self) -> float:
        """time.monotonic() when the daemon started."""
        ...

    @property
    def reloads(self) -> dict[str, int]: ...

    @property
    def config_errors(self) -> int: ...

    @property
    def logs(self) -> LogRings: ...

    @property
    def traffic(self) -> Traffic: ...

    def instance(self, name: str) -> InstanceRuntime | None: ...

    def ordered(self) -> Sequence[InstanceRuntime]: ...

    def snapshot(self) -> Snapshot: ...
