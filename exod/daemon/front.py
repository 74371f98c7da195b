"""The HTTP API as the daemon sees it: what it starts, reloads, reports and stops.

The daemon never imports the API (exod.api sits above it and asks it for everything): whoever
builds the Supervisor (exod.cli.exod) hands it a factory, which the daemon calls once,
when `api.listen` is set (exod.daemon.supervisor.FrontFactory).
"""

from __future__ import annotations

from typing import Protocol

from exod.wire.control_status import ApiStatus


class Front(Protocol):
    async def start(self) -> None: ...

    async def stop_listening(self) -> None: ...

    async def close(self) -> None: ...

    def load_tokens(self) -> None: ...

    def info(self) -> ApiStatus: ...

