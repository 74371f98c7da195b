"""The group's control connections: rank 0 → every other rank, plain TCP, 16-byte headers.

Why not mx.distributed for these too: the ring backend polls while it waits, so a rank idling
in `recv` burns ~40-60% of a core, forever, on a service meant to idle for months. A blocking
TCP read costs nothing. Tensors (hidden states, logits, all_sum) still go through MLX; only the
small "what next" headers, which a worker waits for most of its life, come this way.

Rank 0 listens on EXOD_GROUP_CONTROL (its own address, one port past the ranks' ports); each
other rank connects and says which rank it is.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time

HEADER = struct.Struct("!4i")  # command, cache id, sequence length, spare
HELLO = struct.Struct("!i")  # the connecting rank


class ControlLost(Exception):
    pass


class ControlAddressInUse(Exception):
    pass


def control_address() -> tuple[str, int]:
    host, _, port = os.environ["EXOD_GROUP_CONTROL"].rpartition(":")
    return host.strip("[]"), int(port)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _tune(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small header per step
    sock.settimeout(None)
    return sock


def accept_workers(size: int, timeout: float) -> dict[int, socket.socket]:
    """Rank 0: one connection from each of ranks 1..size-1, within `timeout` (they joined the
    MLX group moments ago; one that does not connect is as good as lost)."""
    host, port = control_address()
    srv = socket.socket(_family(host), socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            srv.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ControlAddressInUse(f"{host}:{port}") from None
            raise ControlLost(f"cannot listen on {host}:{port}: {e.strerror}") from None
        srv.listen(size)
        deadline = time.monotonic() + timeout
        out: dict[int, socket.socket] = {}
        while len(out) < size - 1:
            srv.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                raise ControlLost(f"only {len(out)} of {size - 1} ranks connected to "
                                  f"{host}:{port} within {timeout:g}s") from None
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            (rank,) = HELLO.unpack(_read(conn, HELLO.size))
            out[rank] = _tune(conn)
        return out
    finally:
        srv.close()


def connect_to_leader(rank: int, timeout: float) -> socket.socket:
    """Ranks 1..N-1: connect to rank 0 (retrying while it is not listening yet)."""
    host, port = control_address()
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5)
            sock.sendall(HELLO.pack(rank))
            return _tune(sock)
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ControlLost(f"cannot reach rank 0 at {host}:{port}: {e}") from None
            time.sleep(0.1)  # rank 0 binds moments after the MLX group forms


def send(sock: socket.socket, cmd: int, cache_id: int, length: int) -> None:
    try:
        sock.sendall(HEADER.pack(cmd, cache_id, length, 0))
    except OSError as e:
        raise ControlLost(str(e)) from None


def recv(sock: socket.socket) -> tuple[int, int, int]:
    cmd, cache_id, length, _ = HEADER.unpack(_read(sock, HEADER.size))
    return cmd, cache_id, length


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError as e:
            raise ControlLost(str(e)) from None
        if not chunk:
            raise ControlLost("rank 0 closed the group's control connection")
        buf += chunk
    return buf
