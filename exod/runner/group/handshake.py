"""How a rank proves it belongs to its group, on rank 0's control port (exod.runner.group.wire).

Each side proves, by an HMAC challenge-response over the group's secret (the file its start-up
spec names), that it holds the key; the worker proves which rank it is too. Labels
keep one side's answer from serving as the other's:
  worker → rank 0:  version line, Greeting(nonce_w)
  rank 0 → worker:  version line, Challenge(nonce_0, HMAC(key, "exod-leader" nonce_w nonce_0))
  worker → rank 0:  Proof(rank, HMAC(key, "exod-worker" nonce_0 nonce_w rank))
  rank 0 → worker:  Welcome (or a GroupRefusal, e.g. of a rank already connected)
A rank of another version is refused by whichever side reads the other's version line first,
naming both versions.

Rank 0's side is a state machine fed bytes as they come (`LeaderHandshake`, no I/O), so rank 0
runs every connection's handshake at once (exod.runner.group.control): a stranger on the port,
silent or talkative, never holds up a real rank. A worker's side is a plain blocking exchange.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from collections.abc import Collection
from typing import Any

from exod.core.text import clip
from exod.wire.protocol import FrameDecoder, ProtocolError, encode, from_wire, to_wire
from exod.runner.group import wire
from exod.runner.group.wire import (
    HANDSHAKE_FRAME, MAX_LINE, NONCE, OURS, PREAMBLE, Challenge, ControlLost, Greeting,
    GroupRefusal, Proof, Welcome,
)

RANK = struct.Struct("!i")  # how a rank is bound into its proof
SAME_VERSION = "every host of a group must run the same exod version"


class HandshakeRefused(Exception):
    """One connection failed the handshake (the listener goes on). `reply` is what the peer
    is told before the connection closes (nothing, for what is no exod rank at all)."""

    def __init__(self, reason: str, reply: bytes = b"") -> None:
        super().__init__(reason)
        self.reply = reply


def mac(key: bytes, label: bytes, *parts: bytes) -> str:
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).hexdigest()


class LeaderHandshake:
    """Rank 0's side of one connection. `feed` takes the bytes that came and returns those to
    send back; `rank` is set once the peer proved which rank it is (and is not one of `taken`,
    the ranks connected by then). HandshakeRefused otherwise."""

    def __init__(self, key: bytes, size: int, taken: Collection[int]) -> None:
        self.key, self.size, self.taken = key, size, taken
        self.rank: int | None = None
        self._line = b""
        self._frames: FrameDecoder | None = None  # once the version line is read
        self._nonce_w = self._nonce_0 = b""
        self._said = b""  # our version line, once sent

    @property
    def greeted(self) -> bool:
        """The peer sent a valid header (version line and greeting), as a rank does at once:
        it has been challenged, and its proof is awaited."""
        return bool(self._nonce_w)

    def feed(self, data: bytes) -> bytes:
        if self._frames is None:
            end = (self._line + data).find(b"\n")
            if end < 0:
                self._line += data
                if len(self._line) > MAX_LINE:
                    raise HandshakeRefused("not an exod rank (bad greeting)")
                return b""
            data = self._line + data
            self._line, data = data[:end + 1], data[end + 1:]
            self._version(self._line)
            self._frames = FrameDecoder(HANDSHAKE_FRAME)
        try:
            objs = self._frames.feed(data)
        except ProtocolError as e:
            raise self._refuse(f"bad handshake message: {e}") from None
        return b"".join(self._step(obj) for obj in objs)

    def _version(self, line: bytes) -> None:
        theirs = wire.version_of(line)
        if theirs is None:
            raise HandshakeRefused("not an exod rank (bad greeting)")
        if line != PREAMBLE:
            raise self._refuse(f"it speaks {theirs}, this rank {OURS} ({SAME_VERSION})",
                               f"rank 0 speaks {OURS}, this rank {theirs} ({SAME_VERSION})")

    def _refuse(self, reason: str, told: str | None = None) -> HandshakeRefused:
        """A refusal the peer hears too: it wrote a version line, so it can read why."""
        line, self._said = (b"" if self._said else PREAMBLE), PREAMBLE
        refusal = GroupRefusal(clip(told or reason, 500))
        return HandshakeRefused(reason, line + encode(to_wire(refusal)))

    def _step(self, obj: dict[str, Any]) -> bytes:
        if self.rank is not None:
            raise self._refuse("sent more than the handshake")
        try:
            msg = from_wire(obj, {Greeting.type: Greeting} if not self._nonce_w
                            else {Proof.type: Proof})
        except ProtocolError as e:
            raise self._refuse(f"bad handshake message: {e}") from None
        if isinstance(msg, Greeting):
            self._nonce_w, self._nonce_0 = bytes.fromhex(msg.nonce), os.urandom(NONCE)
            proof = mac(self.key, b"exod-leader", self._nonce_w, self._nonce_0)
            self._said = PREAMBLE
            return PREAMBLE + encode(to_wire(Challenge(self._nonce_0.hex(), proof)))
        assert isinstance(msg, Proof)
        rank = RANK.pack(msg.rank) if -2**31 <= msg.rank < 2**31 else b""
        if not hmac.compare_digest(msg.proof, mac(self.key, b"exod-worker", self._nonce_0,
                                                  self._nonce_w, rank)):
            raise self._refuse("failed to prove it holds the group's key")
        if not 1 <= msg.rank < self.size:
            raise self._refuse(f"claims rank {msg.rank}, outside 1..{self.size - 1}")
        if msg.rank in self.taken:
            raise self._refuse(f"claims rank {msg.rank}, which is already connected")
        self.rank = msg.rank
        return encode(to_wire(Welcome()))


def worker_handshake(sock: socket.socket, key: bytes, rank: int) -> None:
    """A worker's side; ControlLost when the other end is not rank 0 of our group (or is of
    another version, or refused us: the reason says which), and its kind Closed when rank 0
    let the connection go without a verdict (the worker may try again)."""
    nonce_w = os.urandom(NONCE)
    wire.send(sock, PREAMBLE + encode(to_wire(Greeting(nonce_w.hex()))))
    try:
        line = wire.read_line(sock, "rank 0")
    except ControlLost as e:
        raise type(e)(f"rank 0 closed the connection during the handshake (not an exod of "
                      f"{OURS}, or not rank 0 of this group)") from None
    theirs = wire.version_of(line)
    if theirs is None:
        raise ControlLost("the process on rank 0's control port is no exod rank")
    if line != PREAMBLE:
        raise ControlLost(f"rank 0 speaks {theirs}, this rank {OURS} ({SAME_VERSION})")
    msg = wire.recv(sock, {Challenge.type: Challenge, GroupRefusal.type: GroupRefusal},
                    limit=HANDSHAKE_FRAME)
    if isinstance(msg, GroupRefusal):
        raise ControlLost(f"rank 0 refused this rank: {msg.reason}")
    nonce_0 = bytes.fromhex(msg.nonce)
    if not hmac.compare_digest(msg.proof, mac(key, b"exod-leader", nonce_w, nonce_0)):
        raise ControlLost("the process on rank 0's control port failed to prove it holds the "
                          "group's key (another program, or a different cluster_key_file)")
    proof = mac(key, b"exod-worker", nonce_0, nonce_w, RANK.pack(rank))
    wire.send(sock, encode(to_wire(Proof(rank, proof))))
    answer = wire.recv(sock, {Welcome.type: Welcome, GroupRefusal.type: GroupRefusal},
                       limit=HANDSHAKE_FRAME)
    if isinstance(answer, GroupRefusal):
        raise ControlLost(f"rank 0 refused this rank: {answer.reason}")
