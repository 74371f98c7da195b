"""The group's control connections: rank 0 → every other rank, plain TCP, carrying the group's
commands (exod.runner.group.wire) after a handshake (exod.runner.group.handshake).

Why not mx.distributed for these too: the ring backend polls while it waits, so a rank idling
in `recv` burns a good part of a core (`python -m bench group_start`), forever, on a service
meant to idle for months; a blocking TCP read costs nothing. Tensors still go through MLX;
only the "what next" messages, which a worker waits for most of its life, come this way.

Rank 0 listens on the control address of its spec (`exod.wire.specs.GroupSpec.control`: its own
address, one port past the ranks' ports) until every other rank has connected and proved it
holds the group's key (the file the spec names), then closes the port. It runs every
connection's handshake at once, each bounded by HANDSHAKE_TIMEOUT: strangers (a port scanner,
a peer of another version), how many and however slow, neither delay the real ranks nor take
their place, nor push a rank's handshake out (see _Acceptor). Messages are bounds checked
before anything is allocated; anything odd is ControlLost.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exod.wire import messages as m
from exod.runner.group.handshake import (SAME_VERSION, HandshakeRefused, LeaderHandshake,
                                         worker_handshake)
from exod.runner.group.wire import Closed, ControlLost
from exod.runner.link.log import WARNING, log
from exod.runner.link.report import Reporter
from exod.secret_file import KEY_BYTES, SecretFileError, read_secret

HANDSHAKE_TIMEOUT = 2.0  # a real rank answers in a round trip; a silent stranger goes then
MAX_HANDSHAKES = 64  # at once in each pool (see _Acceptor); past it the pool's oldest goes
ACCEPT_BATCH = 64  # connections taken per wake-up, so a flood of them never starves the rest
BACKLOG = 1024  # past it the kernel drops a connect, which a rank retries only a second later
OnRefused = Callable[[str, str], None]  # (peer's address, why)


class ControlAddressInUse(Exception):
    pass


def control_address(address: str) -> tuple[str, int]:
    """`host:port` (`[v6]:port`) as a socket takes it."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _tune(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small frame per step
    sock.settimeout(None)
    return sock


def cluster_key(path: Path) -> bytes:
    """The group's shared secret, from the file the daemon names (the secret itself never
    travels in a spec, an argv or the environment): a secret file (exod.secret_file's rule) of
    KEY_BYTES at least."""
    try:
        return read_secret(path, KEY_BYTES)
    except SecretFileError as e:
        raise ControlLost(f"the group key: {e}") from None


def _listen(host: str, port: int) -> socket.socket:
    srv = socket.socket(_family(host), socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((host, port))
        srv.listen(BACKLOG)  # a flood of connects must not crowd a rank out of the backlog
    except OSError as e:
        srv.close()
        if e.errno == errno.EADDRINUSE:
            raise ControlAddressInUse(f"{host}:{port}") from None
        raise ControlLost(f"cannot listen on {host}:{port}: {e.strerror}") from None
    srv.setblocking(False)
    return srv


@dataclass
class _Knock:
    """One connection whose handshake is under way."""

    conn: socket.socket
    peer: str
    shake: LeaderHandshake
    deadline: float


class _Acceptor:
    """Rank 0's listener: every connection's handshake at once, in one thread (no I/O blocks).

    Connections wait in two pools, oldest first, each of MAX_HANDSHAKES at most: those that
    have not sent a valid header yet, and those challenged, whose proof is awaited. A rank
    sends its header with its connect, so it is read at the accept and moves on at once: a
    crowd of strangers that say nothing, or say it a byte at a time, pushes out only its own
    kind. Strangers that greet like a rank and then fall silent crowd the second pool, where
    the oldest goes first: a rank answers its challenge in one round trip, and one let go all
    the same connects again (connect_to_leader)."""

    def __init__(self, srv: socket.socket, key: bytes, size: int,
                 on_refused: OnRefused | None) -> None:
        self.srv, self.key, self.size, self.on_refused = srv, key, size, on_refused
        self.sel = selectors.DefaultSelector()
        self.sel.register(srv, selectors.EVENT_READ)
        self.unheard: dict[socket.socket, _Knock] = {}  # no valid header yet
        self.greeted: dict[socket.socket, _Knock] = {}  # challenged: the proof is awaited
        self.ranks: dict[int, socket.socket] = {}

    def run(self, deadline: float) -> dict[int, socket.socket]:
        while len(self.ranks) < self.size - 1:
            now = time.monotonic()
            if now >= deadline:
                host, port = self.srv.getsockname()[:2]
                raise ControlLost(f"only {len(self.ranks)} of {self.size - 1} ranks connected "
                                  f"to {host}:{port} within the group's timeout")
            wake = min([deadline, *(k.deadline for k in self._knocks())])
            for key, _ in self.sel.select(max(0.0, wake - now)):
                if key.fileobj is self.srv:
                    self._accept()
                elif (k := self._find(key.fileobj)) is not None:  # type: ignore[arg-type]
                    self._advance(k)
            now = time.monotonic()
            for k in [k for k in self._knocks() if k.deadline <= now]:
                self._drop(k, f"no handshake within {HANDSHAKE_TIMEOUT:g}s")
        return self.ranks

    def close(self, keep: bool) -> None:
        for k in list(self._knocks()):
            self._drop(k, None)
        if not keep:
            for conn in self.ranks.values():
                conn.close()
        self.sel.close()

    def _knocks(self) -> list[_Knock]:
        return [*self.unheard.values(), *self.greeted.values()]

    def _find(self, conn: socket.socket) -> _Knock | None:
        return self.unheard.get(conn) or self.greeted.get(conn)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):  # then the connections already open get their turn
            try:
                conn, peer = self.srv.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of descriptors: the pending ones get their turn later
                return
            conn.setblocking(False)
            k = _Knock(conn, str(peer[0]), LeaderHandshake(self.key, self.size, self.ranks),
                       time.monotonic() + HANDSHAKE_TIMEOUT)
            self.unheard[conn] = k
            self.sel.register(conn, selectors.EVENT_READ)
            self._advance(k)  # a rank's header came with its connect: read it now
            self._crowd(self.unheard)

    def _crowd(self, pool: dict[socket.socket, _Knock]) -> None:
        while len(pool) > MAX_HANDSHAKES:
            self._drop(next(iter(pool.values())), "too many handshakes at once")

    def _advance(self, k: _Knock) -> None:
        try:
            data = k.conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(k, e.strerror or str(e))
            return
        if not data:
            self._drop(k, "closed the connection during the handshake")
            return
        try:
            reply = k.shake.feed(data)
        except HandshakeRefused as e:
            self._drop(k, str(e), e.reply)
            return
        if reply and not self._say(k, reply):
            return
        if k.shake.rank is not None:
            self._forget(k)
            self.ranks[k.shake.rank] = _tune(k.conn)
        elif k.shake.greeted and k.conn in self.unheard:
            del self.unheard[k.conn]
            self.greeted[k.conn] = k
            self._crowd(self.greeted)

    def _say(self, k: _Knock, data: bytes) -> bool:
        """A handshake's reply, a few hundred bytes into a fresh socket's empty buffer: all
        of it goes at once, or the peer is not reading as a rank does."""
        try:
            sent = k.conn.send(data)
        except OSError as e:
            sent, why = 0, e.strerror or str(e)
        else:
            why = "does not read its handshake"
        if sent == len(data):
            return True
        self._drop(k, why)
        return False

    def _forget(self, k: _Knock) -> None:
        self.sel.unregister(k.conn)
        self.unheard.pop(k.conn, None)
        self.greeted.pop(k.conn, None)

    def _drop(self, k: _Knock, why: str | None, reply: bytes = b"") -> None:
        self._forget(k)
        if reply:
            try:
                k.conn.send(reply)  # best effort: why, for a rank of ours that can read it
            except OSError:
                pass
        k.conn.close()
        if why is not None and self.on_refused is not None:
            self.on_refused(k.peer, why)


class Refusals:
    """What rank 0 says of the connections it refuses while the group forms: a log line per
    reason at most every LOG_EVERY seconds (a port scanner knocks thousands of times), and a
    peer of another exod version in the rank's status too, which is what an operator must fix."""

    LOG_EVERY = 10.0

    def __init__(self, report: Reporter, attempt: int, size: int) -> None:
        self.report, self.attempt, self.size = report, attempt, size
        self._logged: dict[str, float] = {}
        self._shown = ""

    def refused(self, peer: str, why: str) -> None:
        now = time.monotonic()
        if now - self._logged.get(why, -self.LOG_EVERY) >= self.LOG_EVERY:
            self._logged[why] = now
            log(f"refused a control connection from {peer}: {why}", WARNING)
        if SAME_VERSION in why and why != self._shown:  # a peer of another version
            self._shown = why
            self.report.status(m.Phase.CONNECTING, f"connecting to {self.size - 1} peer"
                               f"{'s' if self.size > 2 else ''} (attempt {self.attempt}); "
                               f"refused {peer}: {why}", attempt=self.attempt)


def probe(address: str) -> None:
    """ControlAddressInUse now if something already listens on rank 0's control address. Rank 0
    listens there only once the MLX group has formed, when its peers already wait on it: a
    port found taken then made the round's cause a race between rank 0's report and a peer's
    giving up on it. Anything else about the address is left to the real listen."""
    try:
        _listen(*control_address(address)).close()
    except ControlLost:
        pass


def accept_workers(address: str, key_file: Path, size: int, timeout: float,
                   on_refused: OnRefused | None = None) -> dict[int, socket.socket]:
    """Rank 0: one authenticated connection from each of ranks 1..size-1 on `address`, within
    `timeout` (they joined the MLX group moments ago; one that does not connect is as good as
    lost)."""
    key = cluster_key(key_file)
    srv = _listen(*control_address(address))
    acceptor = _Acceptor(srv, key, size, on_refused)
    done = False
    try:
        ranks = acceptor.run(time.monotonic() + timeout)
        done = True
        return ranks
    finally:
        acceptor.close(keep=done)
        srv.close()


def connect_to_leader(address: str, key_file: Path, rank: int,
                      timeout: float) -> socket.socket:
    """Ranks 1..N-1: connect to rank 0 at `address` (retrying while it is not listening yet,
    and when it let our connection go before its verdict: strangers crowded it out)."""
    key = cluster_key(key_file)
    host, port = control_address(address)
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
        except Closed:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)  # not a verdict: knock again, as a rank that came late would
            continue
        except BaseException:
            sock.close()
            raise
        return _tune(sock)
