"""Asking a cluster peer for a model's files: the signed request and the signed manifest.

One JSON line on the cluster endpoint, `{"file": {"ask": {...}, "mac": HEX}}`: the asker's node
id, its wall-clock time, a nonce, the model by hub name and revision, and what it wants: the
snapshot's manifest (`path` ""), or one file of it by its name in the snapshot from `offset`
on. The MAC is an HMAC-SHA256 with the cluster's key over the ask's canonical JSON, under a
label of its own (a file ask is never an announcement, nor one the other way round). The
answer is one line: `{"manifest": {...}, "reply_to": NONCE, "mac": HEX}` (signed too: it
carries the hashes the bytes are checked against), `{"file": {"size": N, "offset": O}}`
followed by the bytes from O to N, or `{"refused": WHY}`.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from exod.wire.announce import Refused, canonical, cluster_id
from exod.wire.protocol import ProtocolError, decode_as, to_wire

_ASK_LABEL = b"exod cluster file ask 1\n"
_MANIFEST_LABEL = b"exod cluster file manifest 1\n"


@dataclass(frozen=True)
class FileAsk:
    cluster: str  # cluster_id(key)
    node: str  # the asker's node id (for the log)
    time: float  # the asker's wall clock
    nonce: str
    repo: str  # hub name, org/name
    revision: str  # a commit, branch or tag
    path: str = ""  # a file of the snapshot; "": its manifest
    offset: int = 0

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ProtocolError("file ask: a negative offset")


def _mac(key: bytes, label: bytes, body: Any) -> str:
    return hmac.new(key, label + canonical(body), hashlib.sha256).hexdigest()


def sign_ask(ask: FileAsk, key: bytes) -> dict[str, Any]:
    body = to_wire(ask)
    return {"ask": body, "mac": _mac(key, _ASK_LABEL, body)}


def open_ask(signed: Any, key: bytes) -> FileAsk:
    """The ask `signed` carries, proven by `key`; Refused (kinds as announcements') otherwise.
    Its time and nonce are the receiver's to judge (exod.core.replay)."""
    if not isinstance(signed, dict) or not isinstance(signed.get("ask"), dict) \
            or not isinstance(signed.get("mac"), str):
        raise Refused("unsigned", "unsigned file request")
    body = signed["ask"]
    if body.get("cluster") != cluster_id(key):
        raise Refused("other-cluster", "a file request of another cluster's key")
    try:
        expected = _mac(key, _ASK_LABEL, body)
    except (TypeError, ValueError):
        raise Refused("malformed", "malformed file request") from None
    if not hmac.compare_digest(signed["mac"], expected):
        raise Refused("bad-mac", "file request with a bad MAC: forged, or altered on the way")
    try:
        ask: FileAsk = decode_as(body, FileAsk, "ask")
    except ProtocolError as e:
        raise Refused("malformed", f"malformed file request: {e}") from None
    return ask


def sign_manifest(manifest: dict[str, Any], reply_to: str, key: bytes) -> dict[str, Any]:
    body = {"manifest": manifest, "reply_to": reply_to}
    return {**body, "mac": _mac(key, _MANIFEST_LABEL, body)}


def open_manifest(answer: dict[str, Any], reply_to: str, key: bytes) -> dict[str, Any]:
    """The manifest of a signed answer to the ask of nonce `reply_to`; ValueError otherwise."""
    body = {"manifest": answer.get("manifest"), "reply_to": answer.get("reply_to")}
    if body["reply_to"] != reply_to or not isinstance(body["manifest"], dict):
        raise ValueError("the manifest does not answer this request")
    if not hmac.compare_digest(str(answer.get("mac", "")), _mac(key, _MANIFEST_LABEL, body)):
        raise ValueError("the manifest's MAC is wrong")
    return dict(body["manifest"])
