"""What the HTTP API needs of the daemon: a narrow view, so the API never imports the
supervisor (which starts it). Instances are the daemon's own runtimes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime
    from exod.control_messages import Snapshot
    from exod.daemon.log_ring import LogRings


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
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def instance(self, name: str) -> InstanceRuntime | None: ...

    def ordered(self) -> Sequence[InstanceRuntime]: ...

    def snapshot(self) -> Snapshot: ...

    def listen(self, fn: Callable[[InstanceRuntime], None]) -> Callable[[], None]: ...

    def missing_memory(self, inst: InstanceRuntime) -> int:
        """Bytes short of what `inst` needs to start here now (0 or less: it fits)."""
        ...
