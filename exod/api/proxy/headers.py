"""Which headers cross the hop, each way. Hop-by-hop headers (RFC 9110 §7.6.1, and whatever a
`Connection` header names) belong to one connection; framing and the peer's own identity
(Host, Content-Length, Date, Server) are set anew by each side. The rest passes unchanged,
`Authorization` and `x-api-key` included: rank 0's node checks the client's own key."""

from __future__ import annotations

from collections.abc import Iterable

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"})
REQUEST_OWN = frozenset({"host", "content-length"})
ANSWER_OWN = frozenset({"content-length", "date", "server"})
# Set on the hop: a node that gets a request already sent on never sends it on again (two
# nodes whose configs disagree about where rank 0 runs would pass it back and forth).
HOP = "Exod-Proxied-By"


def _named_by_connection(headers: Iterable[tuple[str, str]]) -> set[str]:
    return {name.strip().lower() for k, v in headers if k.lower() == "connection"
            for name in v.split(",") if name.strip()}


def _kept(headers: list[tuple[str, str]], own: frozenset[str]) -> list[tuple[str, str]]:
    dropped = HOP_BY_HOP | own | _named_by_connection(headers)
    return [(k, v) for k, v in headers if k.lower() not in dropped]


def onward(headers: Iterable[tuple[str, str]], node: str) -> list[tuple[str, str]]:
    """The client's request headers as sent to rank 0's node, marked as sent on by `node`."""
    kept = _kept(list(headers), REQUEST_OWN)
    return [*[(k, v) for k, v in kept if k.lower() != HOP.lower()], (HOP, node)]


def back(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Rank 0's node's answer headers as relayed to the client."""
    return _kept(list(headers), ANSWER_OWN)
