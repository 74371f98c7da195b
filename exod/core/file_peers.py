"""Which cluster peers to ask for a hub model's files, in the order to ask them. Pure.

A peer is a member that announces the repository (at the commit asked for, when one is): a
pinned revision is a commit, and only peers holding it can serve it; a branch or tag is
resolved by the peer that answers, from its own cache. Peers on the fastest measured link from
this node come first, then those never measured; ties by name, so every try asks in the same
order. A peer with no address or no cluster port cannot be asked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exod.core.nodes import Link, NodeInfo


@dataclass(frozen=True)
class PeerSource:
    node_id: str
    name: str
    host: str
    port: int


def holders(members: Iterable[NodeInfo], me: str, repo: str, commit: str | None) -> list[NodeInfo]:
    """The members but this node that hold `repo` (at `commit`, when given)."""
    return [n for n in members if n.node_id != me and n.addresses and n.control_port and any(
        m.name == repo and m.revision and (commit is None or m.revision == commit)
        for m in n.models)]


def choose(members: Iterable[NodeInfo], links: Iterable[Link], me: str, repo: str,
           commit: str | None) -> list[PeerSource]:
    """The peers to ask, best first (the module's docstring says the order)."""
    speed: dict[str, float] = {}
    for link in links:
        other = link.b if link.a == me else link.a if link.b == me else None
        if other is not None and link.seconds_per_mib > 0:
            speed[other] = min(speed.get(other, link.seconds_per_mib), link.seconds_per_mib)
    found = holders(members, me, repo, commit)
    found.sort(key=lambda n: (n.node_id not in speed, speed.get(n.node_id, 0.0), n.name,
                              n.node_id))
    return [PeerSource(n.node_id, n.name, n.addresses[0], n.control_port) for n in found]
