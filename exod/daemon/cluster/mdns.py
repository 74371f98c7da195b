"""mDNS/DNS-SD (python-zeroconf): this node registered as `ID._exod._tcp.local.`, and every
other such service browsed for, as Bonjour on a Mac sees them.

The TXT record carries only the node id and the record format's version: what a node is comes
from its signed record, asked of its endpoint. A TXT record is neither signed nor fresh (mDNS
caches it for minutes, longer than an announcement's time window) and a record with its models
would not fit one packet, so it says only where to ask. IPv4 only: link-local IPv6 needs a
zone that a peer's address cannot carry.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

from loguru import logger

from exod.daemon.cluster.finders import Found

SERVICE = "_exod._tcp.local."
RESOLVE_MS = 3000


class Mdns:
    def __init__(self, ident: str, port: int, addresses: Sequence[str]) -> None:
        self.ident, self.port = ident, port
        self.addresses = [a for a in addresses if ipaddress.ip_address(a).version == 4]
        self.zc: Any = None
        self.browser: Any = None
        self.found: Found | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self, found: Found) -> None:
        from zeroconf import IPVersion
        from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

        self.found = found
        self.zc = AsyncZeroconf(ip_version=IPVersion.V4Only)
        if self.addresses:
            info = AsyncServiceInfo(
                SERVICE, f"{self.ident}.{SERVICE}", port=self.port,
                addresses=[socket.inet_aton(a) for a in self.addresses],
                properties={"id": self.ident, "v": "1"}, server=f"exod-{self.ident}.local.")
            await self.zc.async_register_service(info)
        self.browser = AsyncServiceBrowser(self.zc.zeroconf, [SERVICE],
                                           handlers=[self._on_change])

    def _on_change(self, zeroconf: Any, service_type: str, name: str,
                   state_change: Any) -> None:
        from zeroconf import ServiceStateChange

        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            task = asyncio.get_running_loop().create_task(self._resolve(name))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _resolve(self, name: str) -> None:
        from zeroconf.asyncio import AsyncServiceInfo

        info = AsyncServiceInfo(SERVICE, name)
        if not await info.async_request(self.zc.zeroconf, RESOLVE_MS) or not info.port:
            logger.debug("cluster: mDNS: {} did not resolve", name)
            return
        raw = info.properties.get(b"id") or b""
        hint = raw.decode("utf-8", "replace")[:64] if isinstance(raw, bytes) else ""
        if hint == self.ident:
            return
        assert self.found is not None
        for address in info.parsed_addresses():
            self.found(address, info.port, hint)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.browser is not None:
            await self.browser.async_cancel()
        if self.zc is not None:
            await self.zc.async_unregister_all_services()
            await self.zc.async_close()
