"""The group's control connections: rank 0 → every other rank, plain TCP: an 8-byte header
(command, payload length), then the payload (a serving plan, exod.runner.group.lockstep).

Why not mx.distributed for these too: the ring backend polls while it waits, so a rank idling
in `recv` burns ~40-60% of a core, forever, on a service meant to idle for months. A blocking
TCP read costs nothing. Tensors (hidden states, logits, all_sum) still go through MLX; only the
"what next" messages, which a worker waits for most of its life, come this way.

Rank 0 listens on EXOD_GROUP_CONTROL (its own address, one port past the ranks' ports); each
other rank connects and proves, by an HMAC challenge-response over the group's secret (the file
named by EXOD_CLUSTER_KEY_FILE), that it belongs to the group and which rank it is; rank 0
proves the same to it. A connection that fails is closed and rank 0 keeps waiting for the real
rank: a stranger can neither take a rank's place nor feed a worker plans. Payloads are bounds
checked (MAX_PAYLOAD bytes at most, before anything is allocated); anything odd is ControlLost.

The handshake (HMAC-SHA256, labels keep one side's answer from serving as the other's):
  worker → rank 0:  MAGIC, nonce_w (32 bytes)
  rank 0 → worker:  nonce_0 (32), HMAC(key, "exod-leader" nonce_w nonce_0)
  worker → rank 0:  rank (4), HMAC(key, "exod-worker" nonce_0 nonce_w rank)
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import socket
import struct
import time
from collections.abc import Callable, Collection

HEADER = struct.Struct("!iI")  # command, payload bytes
HELLO = struct.Struct("!i")  # the connecting rank
MAGIC = b"EXOD-GROUP-5\n"  # 3: load barrier on these connections; 5: no WAIT; another fails
NONCE = 32
MAC = hashlib.sha256().digest_size
MIN_KEY = 16
# Rank 0 takes connections one at a time: a silent stranger holds it up this long at most,
# while a real rank waits its turn (its own wait is bounded by the group's timeout).
HANDSHAKE_TIMEOUT = 2.0
# A plan carries at most a few requests, each no bigger than a daemon frame (64 MiB): rank 0
# splits a bigger plan, and a worker refuses anything past this before allocating it.
MAX_PAYLOAD = 256 * 1024 * 1024


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


def cluster_key() -> bytes:
    """The group's shared secret, from the file the daemon names (never from argv/env)."""
    path = os.environ.get("EXOD_CLUSTER_KEY_FILE")
    if not path:
        raise ControlLost("no group key: EXOD_CLUSTER_KEY_FILE is not set")
    try:
        with open(path, "rb") as f:
            key = f.read(4096)
    except OSError as e:
        raise ControlLost(f"cannot read the group key {path}: {e.strerror}") from None
    key = key.strip()
    if len(key) < MIN_KEY:
        raise ControlLost(f"the group key {path} is shorter than {MIN_KEY} bytes")
    return key


def _mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


class Refused(Exception):
    """One connection failed the handshake (the listener goes on)."""


def leader_handshake(conn: socket.socket, key: bytes, size: int,
                     taken: Collection[int]) -> int:
    """Rank 0's side: the rank the peer proved it is; Refused otherwise."""
    try:
        hello = _read(conn, len(MAGIC) + NONCE, "a would-be rank")
    except ControlLost as e:
        raise Refused(str(e)) from None
    if not hello.startswith(MAGIC):
        raise Refused("not an exod rank (bad greeting)")
    nonce_w, nonce_0 = hello[len(MAGIC):], os.urandom(NONCE)
    try:
        conn.sendall(nonce_0 + _mac(key, b"exod-leader", nonce_w, nonce_0))
        reply = _read(conn, HELLO.size + MAC, "a would-be rank")
    except (OSError, ControlLost) as e:
        raise Refused(str(e)) from None
    rank_bytes, mac = reply[:HELLO.size], reply[HELLO.size:]
    if not hmac.compare_digest(mac, _mac(key, b"exod-worker", nonce_0, nonce_w, rank_bytes)):
        raise Refused("failed to prove it holds the group's key")
    (rank,) = HELLO.unpack(rank_bytes)
    if not 1 <= rank < size:
        raise Refused(f"claims rank {rank}, outside 1..{size - 1}")
    if rank in taken:
        raise Refused(f"claims rank {rank}, which is already connected")
    return rank


def worker_handshake(sock: socket.socket, key: bytes, rank: int) -> None:
    """A worker's side; ControlLost when the other end is not rank 0 of our group."""
    nonce_w = os.urandom(NONCE)
    try:
        sock.sendall(MAGIC + nonce_w)
    except OSError as e:
        raise ControlLost(str(e)) from None
    answer = _read(sock, NONCE + MAC, "rank 0")
    nonce_0, mac = answer[:NONCE], answer[NONCE:]
    if not hmac.compare_digest(mac, _mac(key, b"exod-leader", nonce_w, nonce_0)):
        raise ControlLost("the process on rank 0's control port failed to prove it holds the "
                          "group's key (another program, or a different cluster_key_file)")
    rank_bytes = HELLO.pack(rank)
    try:
        sock.sendall(rank_bytes + _mac(key, b"exod-worker", nonce_0, nonce_w, rank_bytes))
    except OSError as e:
        raise ControlLost(str(e)) from None


def accept_workers(size: int, timeout: float,
                   on_refused: Callable[[str], None] | None = None) -> dict[int, socket.socket]:
    """Rank 0: one authenticated connection from each of ranks 1..size-1, within `timeout`
    (they joined the MLX group moments ago; one that does not connect is as good as lost)."""
    key = cluster_key()
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
                conn, peer = srv.accept()
            except TimeoutError:
                raise ControlLost(f"only {len(out)} of {size - 1} ranks connected to "
                                  f"{host}:{port} within {timeout:g}s") from None
            conn.settimeout(max(0.01, min(HANDSHAKE_TIMEOUT, deadline - time.monotonic())))
            try:
                rank = leader_handshake(conn, key, size, out)
            except Refused as e:
                conn.close()
                if on_refused is not None:
                    on_refused(f"refused a control connection from {peer[0]}: {e}")
                continue
            out[rank] = _tune(conn)
        return out
    finally:
        srv.close()


def connect_to_leader(rank: int, timeout: float) -> socket.socket:
    """Ranks 1..N-1: connect to rank 0 (retrying while it is not listening yet)."""
    key = cluster_key()
    host, port = control_address()
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5)
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ControlLost(f"cannot reach rank 0 at {host}:{port}: {e}") from None
            time.sleep(0.1)  # rank 0 binds moments after the MLX group forms
            continue
        try:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            worker_handshake(sock, key, rank)
        except BaseException:
            sock.close()
            raise
        return _tune(sock)


def send(sock: socket.socket, cmd: int, payload: bytes = b"") -> None:
    if len(payload) > MAX_PAYLOAD:
        raise ControlLost(f"a message of {len(payload)} bytes is past the {MAX_PAYLOAD} limit")
    try:
        sock.sendall(HEADER.pack(cmd, len(payload)) + payload)
    except OSError as e:
        raise ControlLost(str(e)) from None


def recv(sock: socket.socket, limit: int = MAX_PAYLOAD, peer: str = "rank 0"
         ) -> tuple[int, bytes]:
    """The next message (command, payload) from `peer`, its length checked against `limit`
    before any of it is read: ControlLost past it, which no rank may be made to allocate."""
    cmd, length = HEADER.unpack(_read(sock, HEADER.size, peer))
    if length > limit:
        raise ControlLost(f"bad message from {peer} (command {cmd}, {length} bytes; at most "
                          f"{limit})")
    return cmd, _read(sock, length, peer) if length else b""


def _read(sock: socket.socket, n: int, peer: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except OSError as e:
            raise ControlLost(str(e)) from None
        if not chunk:
            raise ControlLost(f"{peer} closed the group's control connection")
        buf += chunk
    return bytes(buf)
