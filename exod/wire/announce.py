"""A node's signed announcement, and the one exchange of them between two nodes.

The record names the cluster by an id derived from its key (never the key), the node
(`NodeInfo`), the links it measured, its wall-clock time and a random nonce, and `reply_to`: the
nonce of the hello it answers ("" in a hello). It travels as `{"record": {...}, "mac": HEX}`,
the MAC an HMAC-SHA256 with the cluster's key over the record's canonical JSON (sorted keys, no
spaces), so every field is covered. `open_record` checks, in order: JSON, a MAC at all, the
cluster id, the MAC (in constant time), then every field as its type says; a `Refused` names
the kind and says why in a line. The time and the nonce are the receiver's to judge
(exod.core.replay).

The exchange, over TCP, one JSON line each way: the asking node sends its signed record as a
hello (with `probe`: bytes it wants after the answer, to time the link); the other answers with
its own signed record replying to that hello, then the probe's bytes; or `{"refused": WHY}`
and nothing of itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from exod.core.nodes import Link, NodeInfo
from exod.wire.protocol import ProtocolError, decode_as, to_wire

MAX_LINE = 256 * 1024  # a record: hundreds of models fit
MAX_PROBE = 4 * 2**20
_ID_LABEL = b"exod cluster id\n"
_MAC_LABEL = b"exod cluster record 1\n"


@dataclass(frozen=True)
class Record:
    cluster: str  # cluster_id(key)
    node: NodeInfo
    time: float  # the sender's wall clock, seconds since the epoch
    nonce: str
    links: tuple[Link, ...] = ()
    reply_to: str = ""  # the hello's nonce this answers; "" in a hello


class Refused(Exception):
    """An announcement not taken: `kind` in one word (a row and a log line each), `reason`
    the line shown, `claimed` the node id it names, when that could be read."""

    def __init__(self, kind: str, reason: str, claimed: str = "") -> None:
        super().__init__(reason)
        self.kind, self.reason, self.claimed = kind, reason, claimed


def cluster_id(key: bytes) -> str:
    """The cluster's public name: a hash of its key, from which the key cannot be found."""
    return hashlib.sha256(_ID_LABEL + key).hexdigest()[:16]


def new_nonce() -> str:
    return secrets.token_hex(16)


def canonical(record: Any) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def mac(key: bytes, record: Any) -> str:
    return hmac.new(key, _MAC_LABEL + canonical(record), hashlib.sha256).hexdigest()


def seal(record: Record, key: bytes) -> dict[str, Any]:
    """The record as it travels: its JSON object and the MAC over it."""
    body = to_wire(record)
    return {"record": body, "mac": mac(key, body)}


def open_record(signed: Any, key: bytes) -> Record:
    """The record `signed` carries, proven by `key`; Refused otherwise."""
    if not isinstance(signed, dict) or not isinstance(signed.get("record"), dict):
        raise Refused("not-exod", "not an exod announcement")
    body = signed["record"]
    claimed = body.get("node", {}).get("node_id", "") if isinstance(body.get("node"), dict) \
        else ""
    claimed = claimed if isinstance(claimed, str) else ""
    given = signed.get("mac")
    if not isinstance(given, str) or not given:
        raise Refused("unsigned", "unsigned: it proves no cluster key", claimed)
    if body.get("cluster") != cluster_id(key):
        raise Refused("other-cluster", "another cluster's key (its cluster id "
                      f"{str(body.get('cluster'))[:16]!r})", claimed)
    try:
        expected = mac(key, body)
    except (TypeError, ValueError):
        raise Refused("malformed", "malformed record", claimed) from None
    if not hmac.compare_digest(expected, given):
        raise Refused("bad-mac", "bad MAC: forged, or altered on the way", claimed)
    try:
        return decode_as(body, Record, "record")
    except ProtocolError as e:
        raise Refused("malformed", f"malformed record: {e}", claimed) from None


def hello_line(signed: dict[str, Any], probe: int) -> bytes:
    return json.dumps({"hello": signed, "probe": probe}).encode() + b"\n"


def answer_line(signed: dict[str, Any]) -> bytes:
    return json.dumps({"answer": signed}).encode() + b"\n"


def refused_line(reason: str) -> bytes:
    return json.dumps({"refused": reason}).encode() + b"\n"


def parse_line(line: bytes) -> dict[str, Any]:
    """One line of the exchange as a JSON object; Refused("not-exod") otherwise."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise Refused("not-exod", "not an exod announcement (not JSON)") from None
    if not isinstance(obj, dict):
        raise Refused("not-exod", "not an exod announcement")
    return obj
