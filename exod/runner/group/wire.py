"""What a group's control connections carry (rank 0 ↔ each other rank, plain TCP; see
exod.runner.group.control for why not mx.distributed): exod.wire.protocol's frames of typed
messages, after a version line.

A connection opens with each side's version line, `EXOD-GROUP-<VERSION>\\n` (every version
starts so, and so can name another's), then the handshake (exod.runner.group.handshake):
  worker → rank 0:  Greeting
  rank 0 → worker:  Challenge, or GroupRefusal (a reason)
  worker → rank 0:  Proof
  rank 0 → worker:  Welcome, or GroupRefusal
Then the group's commands. Rank 0 → a worker: Plan (what to replay on its engine,
exod.runner.group.plan), GroupHeartbeat, GroupShutdown, Go. A worker → rank 0: ShardLoaded.

A field added or a message changed is a new VERSION: a rank of another version is refused,
with both versions named, by either end. Pure but for the socket reads and writes; no mlx.
"""

from __future__ import annotations

import errno
import re
import socket
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from exod.wire.protocol import HEADER, ProtocolError, encode, from_wire, parse, to_wire
from exod.runner.group.plan import Plan

VERSION = 8  # 3: load barrier on these connections; 5: no WAIT; 6: typed frames;
# 7: the prompt cache's disk tier in plans (Admit's disk entry, Warm, ClearCacheOp); 8: See.cached
PREAMBLE = b"EXOD-GROUP-%d\n" % VERSION
MAX_LINE = 32  # a version line is shorter: anything longer is no exod rank
# A plan carries at most a few requests, each no bigger than a daemon frame (64 MiB): rank 0
# splits a bigger plan, and a worker refuses anything past this before allocating it.
MAX_PAYLOAD = 256 * 1024 * 1024
HANDSHAKE_FRAME = 4096  # before a peer proved anything, it gets no more memory than this
NONCE = 32


class ControlLost(Exception):
    """A control connection broke, or its peer said something no rank of ours would."""


class Closed(ControlLost):
    """The peer closed (or reset) the connection without a word: no verdict on us. During a
    handshake, rank 0 does so to a connection it had to let go (crowded out by strangers, or
    past its time), so a worker connects again."""


_GONE = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


def version_of(line: bytes) -> str | None:
    """`EXOD-GROUP-5` for a version line, None for anything else."""
    found = re.fullmatch(rb"(EXOD-GROUP-\d{1,6})\n", line)
    return found.group(1).decode() if found else None


OURS = PREAMBLE.decode().strip()


def _hex(value: str, nbytes: int, what: str) -> None:
    if len(value) != 2 * nbytes or value.strip("0123456789abcdef"):
        raise ProtocolError(f"{what}: expected {nbytes} bytes in hex")


# ---- the handshake ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Greeting:
    type: ClassVar[str] = "greeting"
    nonce: str  # hex

    def __post_init__(self) -> None:
        _hex(self.nonce, NONCE, "greeting.nonce")


@dataclass(frozen=True)
class Challenge:
    """Rank 0's nonce, and its proof that it holds the group's key."""

    type: ClassVar[str] = "challenge"
    nonce: str
    proof: str

    def __post_init__(self) -> None:
        _hex(self.nonce, NONCE, "challenge.nonce")
        _hex(self.proof, 32, "challenge.proof")


@dataclass(frozen=True)
class GroupRefusal:
    type: ClassVar[str] = "refusal"
    reason: str

    def __post_init__(self) -> None:
        if len(self.reason) > 500:
            raise ProtocolError("refusal: a reason longer than 500 characters")


@dataclass(frozen=True)
class Proof:
    """Which rank the worker is, and its proof that it holds the group's key."""

    type: ClassVar[str] = "proof"
    rank: int
    proof: str

    def __post_init__(self) -> None:
        _hex(self.proof, 32, "proof.proof")


@dataclass(frozen=True)
class Welcome:
    """The worker is rank `rank` of the group: it may send what follows (until then it sends
    nothing more, so rank 0 reads no byte of the commands while it reads the handshake)."""

    type: ClassVar[str] = "welcome"


# ---- the group's commands -----------------------------------------------------------------------
@dataclass(frozen=True)
class GroupHeartbeat:
    """Idle liveness check: every rank joins an all_sum."""

    type: ClassVar[str] = "heartbeat"


@dataclass(frozen=True)
class GroupShutdown:
    """The group stops: barrier, then exit 0."""

    type: ClassVar[str] = "shutdown"


@dataclass(frozen=True)
class ShardLoaded:
    """A worker has loaded its shard (to rank 0)."""

    type: ClassVar[str] = "loaded"


@dataclass(frozen=True)
class Go:
    """Every rank has loaded (to the workers)."""

    type: ClassVar[str] = "go"


ToWorker = Plan | GroupHeartbeat | GroupShutdown | Go
TO_WORKER: dict[str, type[Any]] = {c.type: c for c in typing.get_args(ToWorker)}
TO_LEADER: dict[str, type[Any]] = {ShardLoaded.type: ShardLoaded}
Command = ToWorker | ShardLoaded


# ---- on a socket --------------------------------------------------------------------------------
def frame(msg: Any, limit: int = MAX_PAYLOAD) -> bytes:
    """One message's frame (encoded once, sent to every worker)."""
    data = encode(to_wire(msg))
    if len(data) - HEADER.size > limit:
        raise ControlLost(f"a message of {len(data)} bytes is past the {limit} limit")
    return data


def send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError as e:
        raise _lost(e) from None


def _lost(e: OSError) -> ControlLost:
    return (Closed if e.errno in _GONE else ControlLost)(str(e))


def recv(sock: socket.socket, allowed: dict[str, type[Any]], limit: int = MAX_PAYLOAD,
         peer: str = "rank 0") -> Any:
    """The next message from `peer`, one of `allowed`: its length is checked against `limit`
    before any of it is read (no rank may be made to allocate more), then every field."""
    (length,) = HEADER.unpack(read(sock, HEADER.size, peer))
    if length > limit:
        raise ControlLost(f"bad message from {peer} ({length} bytes; at most {limit})")
    try:
        return from_wire(parse(read(sock, length, peer)), allowed)
    except ProtocolError as e:
        raise ControlLost(f"bad message from {peer}: {e}") from None


def read(sock: socket.socket, n: int, peer: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except OSError as e:
            raise _lost(e) from None
        if not chunk:
            raise Closed(f"{peer} closed the group's control connection")
        buf += chunk
    return bytes(buf)


def read_line(sock: socket.socket, peer: str) -> bytes:
    """The peer's version line (MAX_LINE bytes at most), byte by byte: what follows it is the
    handshake's frames, not ours to take."""
    line = b""
    while not line.endswith(b"\n") and len(line) < MAX_LINE:
        line += read(sock, 1, peer)
    return line
