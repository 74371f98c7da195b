"""The cluster's node table: who is a member, who went stale, and every refusal.

One owner (exod.daemon.cluster.discovery) feeds it what it verified and what it refused; this
decides each node's state and what is worth one log line. Pure: the caller gives the time (a
monotonic clock).

- member: its newest signed announcement was taken within `peer_timeout`;
- stale: a member not heard for `peer_timeout` (kept, shown, not counted on until heard again);
- foreign: an announcement refused (another key, no MAC, a bad MAC, a replay...), one row per
  address and kind of refusal, whatever node it claimed to be: a forged record that names a
  member changes nothing of that member.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from exod.core.nodes import Link, NodeInfo

MAX_REFUSALS = 64  # rows of refusals kept; the oldest goes first


class NodeState(enum.Enum):
    MEMBER = "member"
    STALE = "stale"
    FOREIGN = "foreign"


@dataclass
class Member:
    info: NodeInfo
    address: str  # where its newest announcement came from
    first_heard: float
    last_heard: float
    sent: float  # its newest taken record's own time (wall clock): older ones change nothing
    links: tuple[Link, ...] = ()  # what it measured of its own links
    stale: bool = False  # as of the last `tick`
    seconds_per_mib: float | None = None  # this node's link to it, as measured here


@dataclass
class RefusalEntry:
    address: str
    kind: str  # what was wrong, in one word: a row and a log line per (address, kind)
    reason: str  # the words shown and logged
    claimed: str  # the node id the record claimed, "" when none could be read
    first: float
    last: float
    count: int = 1


@dataclass(frozen=True)
class Row:
    node_id: str
    name: str
    state: NodeState
    last_heard: float  # monotonic
    address: str
    info: NodeInfo | None = None  # members and stale ones
    reason: str = ""  # foreign ones
    count: int = 0  # foreign ones: how many times refused


@dataclass
class Membership:
    self_id: str
    peer_timeout: float
    forget_after: float = 600.0  # a refusal not repeated for this long is dropped
    members: dict[str, Member] = field(default_factory=dict)
    refusals: dict[tuple[str, str], RefusalEntry] = field(default_factory=dict)

    def heard(self, info: NodeInfo, links: tuple[Link, ...], sent: float, address: str,
              now: float) -> str | None:
        """A verified announcement; what to log ("joined", "back"), or None."""
        if info.node_id == self.self_id:
            return None
        m = self.members.get(info.node_id)
        if m is None:
            self.members[info.node_id] = Member(info, address, now, now, sent, links)
            return "joined"
        if sent <= m.sent:
            return None  # older than what was taken: a relayed copy, out of order
        event = "back" if m.stale or now - m.last_heard > self.peer_timeout else None
        m.info, m.address, m.last_heard, m.sent, m.links = info, address, now, sent, links
        m.stale = False
        return event

    def refused(self, address: str, kind: str, reason: str, claimed: str, now: float) -> bool:
        """A refused announcement; True when it is the first of its kind from `address` (then
        it is worth its one log line)."""
        self._forget(now)
        r = self.refusals.get((address, kind))
        if r is not None:
            r.last, r.count, r.reason = now, r.count + 1, reason
            r.claimed = claimed or r.claimed
            return False
        if len(self.refusals) >= MAX_REFUSALS:
            oldest = min(self.refusals, key=lambda k: self.refusals[k].last)
            del self.refusals[oldest]
        self.refusals[(address, kind)] = RefusalEntry(address, kind, reason, claimed, now, now)
        return True

    def tick(self, now: float) -> list[Member]:
        """Members that have gone stale since the last tick (each worth a log line)."""
        self._forget(now)
        out = []
        for m in self.members.values():
            if not m.stale and now - m.last_heard > self.peer_timeout:
                m.stale = True
                out.append(m)
        return out

    def state(self, node_id: str, now: float) -> NodeState | None:
        m = self.members.get(node_id)
        if m is not None:
            return NodeState.STALE if now - m.last_heard > self.peer_timeout else \
                NodeState.MEMBER
        if any(r.claimed == node_id for r in self.refusals.values()):
            return NodeState.FOREIGN
        return None

    def current(self, now: float) -> list[NodeInfo]:
        """The members heard within `peer_timeout`: the only nodes placement may use."""
        return [m.info for m in self.members.values()
                if now - m.last_heard <= self.peer_timeout]

    def measured(self, node_id: str, seconds_per_mib: float) -> None:
        m = self.members.get(node_id)
        if m is not None:
            m.seconds_per_mib = seconds_per_mib

    def links(self, now: float) -> list[Link]:
        """Links among this node and its current members: its own measurements, and those its
        members announced of theirs."""
        alive = {self.self_id} | {i.node_id for i in self.current(now)}
        out: dict[tuple[str, str], Link] = {}
        for m in self.members.values():
            for link in m.links:
                if link.a in alive and link.b in alive:
                    out[(link.a, link.b)] = link
        for m in self.members.values():
            if m.seconds_per_mib is not None and m.info.node_id in alive:
                out[(self.self_id, m.info.node_id)] = Link(self.self_id, m.info.node_id,
                                                           m.seconds_per_mib)
        return sorted(out.values(), key=lambda link: (link.a, link.b))

    def own_links(self) -> tuple[Link, ...]:
        """What this node measured of its links, to announce."""
        return tuple(Link(self.self_id, m.info.node_id, m.seconds_per_mib)
                     for m in sorted(self.members.values(), key=lambda m: m.info.node_id)
                     if m.seconds_per_mib is not None)

    def rows(self, now: float) -> list[Row]:
        out = [Row(m.info.node_id, m.info.name, self.state(m.info.node_id, now) or
                   NodeState.MEMBER, m.last_heard, m.address, m.info)
               for m in sorted(self.members.values(), key=lambda m: m.info.name)]
        out += [Row(r.claimed or "?", "", NodeState.FOREIGN, r.last, r.address, None,
                    r.reason, r.count)
                for r in sorted(self.refusals.values(), key=lambda r: (r.address, r.kind))]
        return out

    def _forget(self, now: float) -> None:
        for key in [k for k, r in self.refusals.items() if now - r.last > self.forget_after]:
            del self.refusals[key]
