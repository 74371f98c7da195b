"""The HTTP API as the daemon sees it: what it starts, reloads, reports and stops.

The daemon never imports the API (exod.api sits above it and asks it for everything): whoever
builds the Supervisor (exod.cli.exod) hands it a factory, which the daemon calls once,
when `api.listen` is set (exod.daemon.supervisor.FrontFactory).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from exod.config.schema import Api
from exod.wire.control_status import ApiStatus


class Front(Protocol):
    async def start(self) -> None: ...

    async def stop_listening(self) -> None: ...

    async def close(self) -> None: ...

    async def load_keys(self, api: Api | None = None,
                        instances: Collection[str] | None = None) -> None:
        """Read the keys again (api.keys, api.keys_file) and api.token_file's tokens; raises
        OSError, and keeps the previous ones, when they are unusable. Answers under a secret
        no longer accepted end at once."""
        ...

    def info(self) -> ApiStatus: ...

