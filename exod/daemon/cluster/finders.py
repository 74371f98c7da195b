"""The transport seam of discovery: what says where other nodes may be. Each finder calls
`found(host, port, hint)` (hint: the node id it claims, "" when unknown) for every endpoint
it learns of; discovery then asks each by the same signed exchange, whoever found it.

Two now: seed addresses (`cluster.peers`) and mDNS/DNS-SD (exod.daemon.cluster.mdns). Another
transport (a Thunderbolt bridge's addresses, say) is a third finder: docs/cluster.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from exod.core.listen import parse_peer

Found = Callable[[str, int, str], None]


class Finder(Protocol):
    async def start(self, found: Found) -> None: ...

    async def close(self) -> None: ...


class Seeds:
    """`cluster.peers`: asked from the start, and always."""

    def __init__(self, peers: Sequence[str], default_port: int) -> None:
        self.endpoints = [parse_peer(p, default_port) for p in peers]

    async def start(self, found: Found) -> None:
        for host, port in self.endpoints:
            found(host, port, "")

    async def close(self) -> None:
        pass
