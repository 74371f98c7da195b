"""A hostile neighbour on a group's control port while the group re-forms after `exoctl
restart`: hundreds of connections at once, silent, talking garbage, dripping a valid greeting a
byte at a time, or greeting like a rank and then saying nothing. The group must form as if no
one knocked: at its first attempt, with no rank lost (a rank whose handshake a stranger's
connection pushed out used to exit 76, and the group restarted, twice in 2 runs of 3).

Real runners (the tiny model, 2 layers), real sockets. Rank 1 connects 2 s late (the group
double), so that it does so in the middle of the flood."""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exod.wire.protocol import encode, to_wire
from exod.runner.group import control
from exod.runner.group.wire import NONCE, PREAMBLE, Greeting
from tests.harness import Daemon, port_block

GREETING = PREAMBLE + encode(to_wire(Greeting("ab" * NONCE)))
# What a stranger does once connected: bytes to send, seconds between two of them, and how
# long it holds the connection (until rank 0 drops it, at most).
KINDS: list[tuple[bytes, float, float]] = [
    (b"", 0.0, 0.0),  # a port scan: connect, and leave at once
    (b"", 0.0, 10.0),  # silent: holds the connection open
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0.0, 10.0),  # garbage
    (b"", 0.0, 0.0),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 32, 0.0, 10.0),  # TLS
    (GREETING, 0.15, 10.0),  # a valid greeting, dripped a byte at a time
    (b"", 0.0, 0.0),
    (GREETING, 0.0, 10.0),  # a rank's greeting, then silence (no key, so no proof)
    (b"EXOD-GROUP-6\n\x00\x00", 0.0, 10.0),  # the version line, then half a frame header
]


@dataclass
class _Conn:
    sock: socket.socket
    data: bytes
    every: float
    until: float
    due: float = 0.0
    connected: bool = False


class Flood:
    """Keeps `width` strangers' connections to `port` open at once, each doing one of KINDS,
    and opens a new one for each that ends (refused, dropped by rank 0, or done): one thread,
    non-blocking sockets."""

    def __init__(self, port: int, width: int = 400) -> None:
        self.port, self.width = port, width
        self.landed = 0  # connections that reached a listener
        self.stop = threading.Event()
        self.sel = selectors.DefaultSelector()
        self.conns: dict[socket.socket, _Conn] = {}
        self.n = 0
        self.thread = threading.Thread(target=self._run, name="flood")

    def __enter__(self) -> Flood:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(30)
        for c in list(self.conns.values()):
            self._end(c)
        self.sel.close()

    def _run(self) -> None:
        while not self.stop.is_set():
            while len(self.conns) < self.width:
                self._open()
            now = time.monotonic()
            wake = min((c.due for c in self.conns.values() if c.connected and c.data),
                       default=now + 0.05)
            for key, events in self.sel.select(max(0.0, min(wake - now, 0.05))):
                c = self.conns.get(key.fileobj)  # type: ignore[call-overload]
                if c is not None:
                    self._event(c, events)
            now = time.monotonic()
            for c in [c for c in self.conns.values() if c.connected and c.data and c.due <= now]:
                self._send(c, now)
            for c in [c for c in self.conns.values() if c.connected and c.until <= now]:
                self._end(c)

    def _open(self) -> None:
        data, every, hold = KINDS[self.n % len(KINDS)]
        self.n += 1
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.conns[s] = _Conn(s, data, every, hold)
        self.sel.register(s, selectors.EVENT_WRITE)

    def _event(self, c: _Conn, events: int) -> None:
        if not c.connected:
            if c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._end(c)
                time.sleep(0.002)  # nobody listens (yet, or any more): knock again soon
                return
            c.connected, c.until = True, time.monotonic() + c.until
            self.landed += 1
            self.sel.modify(c.sock, selectors.EVENT_READ)
            self._send(c, time.monotonic())
            return
        try:
            if not c.sock.recv(4096):
                self._end(c)
        except OSError:
            self._end(c)

    def _send(self, c: _Conn, now: float) -> None:
        n = 1 if c.every else len(c.data)
        try:
            sent = c.sock.send(c.data[:n])
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self._end(c)
            return
        c.data, c.due = c.data[sent:], now + c.every

    def _end(self, c: _Conn) -> None:
        self.sel.unregister(c.sock)
        del self.conns[c.sock]
        c.sock.close()


def test_a_flood_of_strangers_never_restarts_a_group_re_forming(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path]) -> None:
    base = port_block(3)
    d = daemons({"instances": {"pp": {
        "model": str(tiny_model_factory(layers=2)), "shards": 2, "port_base": base,
        "backoff": {"initial": "100ms", "jitter": 0},
        "env": {"EXOD_DOUBLE": "group", "EXOD_DOUBLE_GROUP_RANK": "1",
                "EXOD_DOUBLE_CONTROL_DELAY": "2"}}}}, name="knocks")
    d.start()
    first = d.until_state("pp", "ready")
    with Flood(base + 2) as flood:
        d.ctl("restart", "pp")
        again = d.until_instance(
            "pp", lambda i: i["state"] == "ready" and {r["pid"] for r in i["ranks"]}.isdisjoint(
                r["pid"] for r in first["ranks"]), what="the group formed again")
        landed = flood.landed
    exits = [e["extra"] for e in d.events(event="exit", instance="pp")]
    # The first group's two ranks, asked to stop; none of the second's.
    assert sorted(e["pid"] for e in exits) == sorted(r["pid"] for r in first["ranks"]), (
        [(e["rank"], e["code"]) for e in exits],
        [line for line in d.log_text().splitlines() if "rank 0" in line or "peer" in line])
    assert all(e["code"] == 0 for e in exits), exits
    assert again["restarts"] == first["restarts"], (first["restarts"], again["restarts"])
    assert landed > 2 * control.MAX_HANDSHAKES, landed  # they did knock, hard
    print(f"{landed} strangers' connections landed while the group re-formed")
