"""Where a request goes when its instance's rank 0 runs on another node: that node's HTTP API.

Chosen only from what this node was told by its operator (the instance's `hosts`) and by its
cluster (members whose announcements proved the key): nothing a client sends names a place to
connect to. Pure: the API's proxy (exod.api.proxy) connects.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from exod.core.nodes import NodeInfo


@dataclass(frozen=True)
class Upstream:
    node: str  # the node's name (`hosts[0].name`), for people
    host: str  # an address of it
    port: int  # its API's port

    @property
    def origin(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def choose(node: str, address: str, members: Iterable[NodeInfo], own_port: int) -> Upstream:
    """Rank 0's node `node`, at `address` (its `hosts` entry): its API port is what the member
    of that name announces, else this node's own (`own_port`: nodes set up alike). A name
    rather than an IP is replaced by the member's first announced address, where there is one:
    the other node's Host allow-list takes any IP, but a name only when it is told it."""
    member = next((n for n in members if n.name == node and n.api_port > 0), None)
    if member is None:
        return Upstream(node, address, own_port)
    host = address if _is_ip(address) or not member.addresses else member.addresses[0]
    return Upstream(node, host, member.api_port)


def announced(instance: str, members: Iterable[NodeInfo], me: str) -> Upstream | None:
    """The member other than this node (`me`: its node id) that announces it runs the rank 0
    of `instance` (an instance this node's config does not name), at its first announced
    address; the first by name where several do. None: no member does."""
    found = sorted((n for n in members if n.node_id != me and instance in n.serves
                    and n.api_port > 0 and n.addresses), key=lambda n: (n.name, n.node_id))
    if not found:
        return None
    return Upstream(found[0].name, found[0].addresses[0], found[0].api_port)


def elsewhere(members: Iterable[NodeInfo], me: str, here: Iterable[str]
              ) -> dict[str, str]:
    """The instances members other than this node announce, that this node's config does not
    name (`here`), each with the node that serves it (the one `announced` picks)."""
    mine = set(here)
    out: dict[str, str] = {}
    for n in sorted(members, key=lambda n: (n.name, n.node_id)):
        if n.node_id == me or n.api_port <= 0 or not n.addresses:
            continue
        for name in n.serves:
            if name not in mine:
                out.setdefault(name, n.name)
    return dict(sorted(out.items()))
