"""What the daemon and its zygote (exod.runner.start.zygote) say to each other, and how.

One SOCK_SEQPACKET socketpair: a datagram is one message, the JSON of one of the dataclasses
below (exod.wire.protocol's to_wire/from_wire, checked field by field), and a `Fork` carries the
runner's three descriptors (its channel, stdout and stderr) as SCM_RIGHTS. The zygote speaks
first, once: `ZygoteReady` when its imports are done, or `ZygoteDeclined` with the reason it
cannot fork runners here. Then each `Fork` is answered by `Forked` (the runner's pid) or
`ForkFailed`, one at a time.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any, ClassVar

from exod.wire.protocol import ProtocolError, from_wire, to_wire

MAX_DATAGRAM = 1 << 20  # a Fork holds a whole environment
FORK_FDS = 3  # channel, stdout, stderr


@dataclass(frozen=True)
class ZygoteReady:
    type: ClassVar[str] = "zygote_ready"
    pid: int


@dataclass(frozen=True)
class ZygoteDeclined:
    type: ClassVar[str] = "zygote_declined"
    reason: str


@dataclass(frozen=True)
class Fork:
    """Start a runner with this environment; its descriptors ride along."""

    type: ClassVar[str] = "fork"
    env: dict[str, str]


@dataclass(frozen=True)
class Forked:
    type: ClassVar[str] = "forked"
    pid: int


@dataclass(frozen=True)
class ForkFailed:
    type: ClassVar[str] = "fork_failed"
    reason: str


FROM_ZYGOTE: dict[str, type[Any]] = {c.type: c for c in (ZygoteReady, ZygoteDeclined, Forked,
                                                         ForkFailed)}
TO_ZYGOTE: dict[str, type[Any]] = {Fork.type: Fork}


def send(sock: socket.socket, msg: Any, fds: list[int] | None = None) -> None:
    data = json.dumps(to_wire(msg), separators=(",", ":")).encode()
    socket.send_fds(sock, [data], fds or [])


def recv(sock: socket.socket, allowed: dict[str, type[Any]], max_fds: int = 0
         ) -> tuple[Any, list[int]] | None:
    """The next message and the descriptors it carried; None at the end of the stream.
    ProtocolError (its descriptors closed) for anything else."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_DATAGRAM, max_fds)
    if not data:
        close_fds(fds)
        return None
    try:
        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise ProtocolError("not a JSON object")
        return from_wire(obj, allowed), fds
    except (ValueError, ProtocolError) as e:
        close_fds(fds)
        raise ProtocolError(f"zygote wire: {e}") from None


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
