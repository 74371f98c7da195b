"""A group's control connections without mlx: the handshake (both sides, every refusal), the
version line, rank 0's listener under strangers, and the bounds on what a rank reads. Real
sockets (socketpairs, and rank 0's listener on 127.0.0.1); the same attacks against live
groups are in tests/integration/test_group_knocks.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exod.wire.protocol import HEADER, encode, to_wire
from exod.runner.group import control, wire
from exod.runner.group.handshake import (RANK, HandshakeRefused, LeaderHandshake, mac,
                                         worker_handshake)
from exod.runner.group.plan import Plan

KEY = b"k" * 32


def lead(sock: socket.socket, key: bytes, size: int, taken: set[int]) -> int:
    """Rank 0's side of one handshake over a blocking socket."""
    shake = LeaderHandshake(key, size, taken)
    while shake.rank is None:
        data = sock.recv(4096)
        if not data:
            raise HandshakeRefused("closed")
        try:
            sock.sendall(shake.feed(data))
        except HandshakeRefused as e:
            sock.sendall(e.reply)
            raise
    return shake.rank


def handshake(leader_key: bytes, worker_key: bytes, rank: int, size: int = 3,
              taken: tuple[int, ...] = ()) -> tuple[object, object]:
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    out: dict[str, object] = {}

    def worker() -> None:
        try:
            worker_handshake(b, worker_key, rank)
            out["worker"] = "ok"
        except wire.ControlLost as e:
            out["worker"] = e
        finally:
            b.close()

    t = threading.Thread(target=worker)
    t.start()
    try:
        out["leader"] = lead(a, leader_key, size, set(taken))
    except HandshakeRefused as e:
        out["leader"] = e
    finally:
        a.close()
    t.join(10)
    return out["leader"], out.get("worker")


def test_a_rank_that_holds_the_key_is_welcome() -> None:
    assert handshake(KEY, KEY, 2) == (2, "ok")


def test_strangers_and_fake_leaders_are_refused_and_told_why() -> None:
    leader, worker = handshake(KEY, b"x" * 32, 1)
    assert isinstance(worker, wire.ControlLost)  # the worker does not trust rank 0 ...
    assert isinstance(leader, HandshakeRefused)  # ... which gets nothing from it
    for rank, taken, why in ((0, (), "outside 1..2"), (3, (), "outside 1..2"),
                             (-5, (), "outside"), (1, (1,), "already connected")):
        leader, worker = handshake(KEY, KEY, rank, taken=taken)
        assert isinstance(leader, HandshakeRefused) and why in str(leader), (rank, leader)
        # A rank of ours that spoke our version hears why.
        assert f"rank 0 refused this rank: claims rank {rank}" in str(worker), worker


@pytest.mark.parametrize("data, why", [
    (b"\x00\x00\x00\x01" + b"\0" * 60, "not an exod rank (bad greeting)"),
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not an exod rank"),
    (b"x" * 100, "not an exod rank"),
    (wire.PREAMBLE + HEADER.pack(1 << 30), "exceeds the 4096 limit"),
    (wire.PREAMBLE + encode({"type": "proof", "rank": 1, "proof": "00" * 32}),
     "unknown message type 'proof'"),
    (wire.PREAMBLE + encode({"type": "greeting", "nonce": "zz"}), "32 bytes in hex"),
    (wire.PREAMBLE + b"\x00\x00\x00\x02[]", "a frame must hold a JSON object"),
])
def test_garbage_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(HandshakeRefused, match=None) as e:
        LeaderHandshake(KEY, 2, set()).feed(data)
    assert why in str(e.value), e.value


def test_a_rank_of_another_version_is_refused_naming_both() -> None:
    """The version line opens every connection in every version: EXOD-GROUP-5's own greeting
    was that line then 32 bytes of nonce."""
    shake = LeaderHandshake(KEY, 2, set())
    with pytest.raises(HandshakeRefused) as e:
        shake.feed(b"EXOD-GROUP-5\n" + os.urandom(32))
    assert str(e.value) == ("it speaks EXOD-GROUP-5, this rank EXOD-GROUP-8 (every host of a "
                            "group must run the same exod version)")
    assert e.value.reply.startswith(wire.PREAMBLE)  # so a later version can read why

    # And a worker facing a rank 0 of another version.
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(5)
        a.sendall(b"EXOD-GROUP-9\n" + encode({"type": "refusal", "reason": "whatever"}))
        with pytest.raises(wire.ControlLost) as lost:
            worker_handshake(b, KEY, 1)
        assert str(lost.value) == ("rank 0 speaks EXOD-GROUP-9, this rank EXOD-GROUP-8 (every "
                                   "host of a group must run the same exod version)")


def test_a_byte_at_a_time_is_as_good() -> None:
    """Rank 0 is fed whatever the network delivers: a handshake split anywhere still works."""
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    done: list[object] = []

    class Trickle:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def sendall(self, data: bytes) -> None:
            for i in range(len(data)):
                self.sock.sendall(data[i:i + 1])

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    def worker() -> None:
        worker_handshake(Trickle(b), KEY, 1)  # type: ignore[arg-type]
        done.append(None)

    t = threading.Thread(target=worker)
    t.start()
    shake = LeaderHandshake(KEY, 2, set())
    with a, b:
        while shake.rank is None:
            a.sendall(shake.feed(a.recv(1)))
        t.join(10)
    assert shake.rank == 1 and done == [None]


# ---- messages, bounded -------------------------------------------------------------------------
def test_messages_are_bounds_checked_and_typed() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(HEADER.pack(1 << 30))  # refused before anything is allocated
        with pytest.raises(wire.ControlLost, match="1073741824 bytes; at most 4096"):
            wire.recv(b, wire.TO_WORKER, limit=4096)
    a, b = socket.socketpair()
    with a, b:
        wire.send(a, encode({"type": "rm", "x": 1}))
        with pytest.raises(wire.ControlLost, match="unknown message type 'rm'"):
            wire.recv(b, wire.TO_WORKER)
        wire.send(a, wire.frame(Plan(step=True)) + wire.frame(wire.GroupHeartbeat()))
        assert wire.recv(b, wire.TO_WORKER) == Plan(step=True)
        assert wire.recv(b, wire.TO_WORKER) == wire.GroupHeartbeat()
        with pytest.raises(wire.ControlLost, match="past the 10 limit"):
            wire.frame(Plan(), limit=10)
    assert to_wire(wire.Go()) == {"type": "go"}


# ---- rank 0's listener --------------------------------------------------------------------------
WHERE: tuple[str, Path] = ("", Path())  # rank 0's control address and the key, as a spec says


@pytest.fixture
def group_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    key = tmp_path / "key"
    key.write_bytes(KEY)
    key.chmod(0o600)  # a secret: closed to other users
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.setitem(globals(), "WHERE", (f"127.0.0.1:{port}", key))
    yield port


def listen(size: int, timeout: float) -> tuple[threading.Thread, dict[str, Any],
                                               list[tuple[str, str]]]:
    out: dict[str, Any] = {}
    refused: list[tuple[str, str]] = []

    def run() -> None:
        try:
            out["ranks"] = control.accept_workers(*WHERE, size, timeout,
                                                  lambda peer, why: refused.append((peer, why)))
        except wire.ControlLost as e:
            out["lost"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out, refused


def knock(port: int, first: bytes = b"") -> socket.socket:
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except ConnectionRefusedError:
            time.sleep(0.01)  # rank 0 is not listening yet
    if first:
        s.sendall(first)
    return s


STRANGERS: list[bytes] = [b"", b"EXOD-GROUP-6", b"EXOD-GROUP-6\n\x00\x00", b"GET / HTTP/1.0\r\n",
                          b"EXOD-GROUP-5\n" + b"\0" * 32]


def test_strangers_holding_the_port_open_do_not_delay_the_real_ranks(group_env: int) -> None:
    """Rank 0 once took one handshake at a time, each given 2 s: 30 silent strangers ahead of a
    rank held it up for a minute, past the group's timeout. Now every handshake runs at once."""
    t, out, refused = listen(3, 30.0)
    strangers = [knock(group_env, STRANGERS[i % len(STRANGERS)]) for i in range(30)]
    start = time.monotonic()
    ranks: list[socket.socket] = []
    for rank in (1, 2):
        sock = knock(group_env)
        sock.settimeout(10)
        worker_handshake(sock, KEY, rank)
        ranks.append(sock)
    t.join(30)
    took = time.monotonic() - start
    assert sorted(out["ranks"]) == [1, 2], out
    assert took < control.HANDSHAKE_TIMEOUT, took  # not one stranger's timeout waited for
    for s in strangers + ranks:
        s.close()
    for c in out["ranks"].values():
        c.close()
    # Whoever spoke got refused for what it said (the rest were left when the ranks came).
    reasons = {why for _, why in refused}
    assert "it speaks EXOD-GROUP-5, this rank EXOD-GROUP-8 (every host of a group must run " \
           "the same exod version)" in reasons, reasons
    assert "not an exod rank (bad greeting)" in reasons, reasons


def test_rank_0_refuses_impostors_and_takes_the_real_rank(group_env: int) -> None:
    """Strangers reach rank 0's control port first (the old protocol's rank 1, one of ours
    without the key, one that says nothing): the rank that holds the key is the one taken."""
    t, out, refused = listen(2, 30.0)
    first = knock(group_env, b"\x00\x00\x00\x01" + b"\0" * 64)  # the old "I am rank 1"
    with knock(group_env) as second:
        second.settimeout(10)
        with pytest.raises(wire.ControlLost, match="failed to prove"):
            worker_handshake(second, b"w" * 32, 1)  # the protocol, but not the key
    third = knock(group_env)  # says nothing: no longer waited for
    real = control.connect_to_leader(*WHERE, 1, 30)
    t.join(30)
    assert list(out["ranks"]) == [1]
    assert sorted(refused) == [("127.0.0.1", "closed the connection during the handshake"),
                               ("127.0.0.1", "not an exod rank (bad greeting)")], refused
    out["ranks"][1].sendall(b"ping")
    assert real.recv(4) == b"ping"  # the connection kept is the real rank's
    for s in (first, third, real, out["ranks"][1]):
        s.close()


def test_a_silent_stranger_is_dropped_in_time_and_a_flood_of_them_too(group_env: int) -> None:
    t, out, refused = listen(2, 30.0)
    silent = knock(group_env)
    flood = [knock(group_env) for _ in range(control.MAX_HANDSHAKES + 10)]
    sock = knock(group_env)
    sock.settimeout(10)
    worker_handshake(sock, KEY, 1)  # past the cap, the oldest went: not the newest
    t.join(30)
    assert list(out["ranks"]) == [1]
    assert ("127.0.0.1", "too many handshakes at once") in refused
    silent.settimeout(10)
    assert silent.recv(1) == b""  # dropped
    for s in [sock, *flood, *out["ranks"].values()]:
        s.close()

    t, out, refused = listen(2, 30.0)
    with knock(group_env) as stranger:
        stranger.settimeout(10)
        start = time.monotonic()
        assert stranger.recv(1) == b""  # told nothing, and dropped on time
        assert control.HANDSHAKE_TIMEOUT - 0.1 <= time.monotonic() - start < 10
        with knock(group_env) as sock:
            sock.settimeout(10)
            worker_handshake(sock, KEY, 1)
            t.join(30)
    assert refused[0] == ("127.0.0.1", f"no handshake within {control.HANDSHAKE_TIMEOUT:g}s")
    for c in out["ranks"].values():
        c.close()


def greet(port: int) -> tuple[socket.socket, bytes, wire.Challenge]:
    """The first half of rank 1's handshake, by hand: its header, and rank 0's challenge."""
    nonce_w = os.urandom(wire.NONCE)
    sock = knock(port, wire.PREAMBLE + encode(to_wire(wire.Greeting(nonce_w.hex()))))
    sock.settimeout(10)
    assert wire.read_line(sock, "rank 0") == wire.PREAMBLE
    return sock, nonce_w, wire.recv(sock, {wire.Challenge.type: wire.Challenge}, limit=4096)


def prove(sock: socket.socket, nonce_w: bytes, challenge: wire.Challenge) -> object:
    """The second half: rank 1's proof, and rank 0's answer."""
    proof = mac(KEY, b"exod-worker", bytes.fromhex(challenge.nonce), nonce_w, RANK.pack(1))
    wire.send(sock, encode(to_wire(wire.Proof(1, proof))))
    return wire.recv(sock, {wire.Welcome.type: wire.Welcome,
                            wire.GroupRefusal.type: wire.GroupRefusal},
                     limit=4096)


def crowded(refused: list[tuple[str, str]], n: int) -> None:
    """Until rank 0 has let n connections go for want of room (it runs in its own thread)."""
    deadline = time.monotonic() + 30
    while sum(why == "too many handshakes at once" for _, why in refused) < n:
        assert time.monotonic() < deadline, refused[-5:]
        time.sleep(0.01)  # rank 0's thread reports through a list


def test_strangers_crowding_in_mid_handshake_never_push_a_rank_out(group_env: int) -> None:
    """Rank 1 has greeted and been challenged when hundreds of strangers connect, saying
    nothing, a partial header, or a byte of one. Rank 0 let the oldest handshake go past
    MAX_HANDSHAKES at once: rank 1's, which then left its group (exit 76) and the group
    restarted. Only strangers' connections go; rank 1 proves itself and is taken."""
    t, out, refused = listen(2, 30.0)
    sock, nonce_w, challenge = greet(group_env)
    firsts = [b"", b"EXOD-GROUP-6", b"E", wire.PREAMBLE + b"\x00"]
    strangers = [knock(group_env, firsts[i % len(firsts)])
                 for i in range(3 * control.MAX_HANDSHAKES)]
    crowded(refused, 2 * control.MAX_HANDSHAKES)
    assert prove(sock, nonce_w, challenge) == wire.Welcome()
    t.join(30)
    assert list(out["ranks"]) == [1]
    for s in [sock, *strangers, *out["ranks"].values()]:
        s.close()


def test_strangers_that_greet_like_a_rank_crowd_out_their_own_kind(group_env: int) -> None:
    """Strangers that send a rank's header (it proves nothing) wait for their proof in a pool
    of their own, which the silent crowd does not touch; past its size, its oldest goes."""
    t, out, refused = listen(2, 30.0)
    greeters = [greet(group_env)[0] for _ in range(control.MAX_HANDSHAKES)]
    silent = [knock(group_env) for _ in range(2 * control.MAX_HANDSHAKES)]
    crowded(refused, control.MAX_HANDSHAKES)
    for g in greeters:  # none of them went for the silent ones
        g.setblocking(False)
        with pytest.raises(BlockingIOError):
            g.recv(1)
    sock, nonce_w, challenge = greet(group_env)
    greeters[0].settimeout(10)
    assert greeters[0].recv(1) == b""  # the oldest greeter went, for the newest
    assert prove(sock, nonce_w, challenge) == wire.Welcome()
    t.join(30)
    assert list(out["ranks"]) == [1]
    for s in [sock, *greeters, *silent, *out["ranks"].values()]:
        s.close()


def test_a_worker_let_go_without_a_verdict_connects_again(group_env: int) -> None:
    """Rank 0 closes a connection it has no room for without a word (it cannot tell a rank
    from a stranger before the proof): the worker connects again, and is taken."""
    srv = socket.create_server(("127.0.0.1", group_env))
    srv.settimeout(30)  # a worker that gives up must not leave rank 0 waiting forever
    got: dict[str, Any] = {}

    def rank_0() -> None:
        with srv:
            first, _ = srv.accept()
            first.close()  # let go, mid-handshake
            conn, _ = srv.accept()
            conn.settimeout(10)
            got["rank"] = lead(conn, KEY, 2, set())
            got["conn"] = conn

    t = threading.Thread(target=rank_0)
    t.start()
    sock = control.connect_to_leader(*WHERE, 1, 30)
    t.join(30)
    assert got["rank"] == 1
    for s in (sock, got["conn"]):
        s.close()
    # A verdict is final: a rank 0 that proves nothing is not knocked on again.
    srv = socket.create_server(("127.0.0.1", group_env))
    srv.settimeout(30)
    calls = []

    def impostor() -> None:
        with srv:
            while True:
                conn, _ = srv.accept()
                calls.append(conn)
                with conn:
                    conn.settimeout(10)
                    try:
                        lead(conn, b"x" * 32, 2, set())
                    except HandshakeRefused:
                        return

    t = threading.Thread(target=impostor)
    t.start()
    with pytest.raises(wire.ControlLost, match="failed to prove it holds the group's key"):
        control.connect_to_leader(*WHERE, 1, 30)
    t.join(30)
    assert len(calls) == 1


def test_no_rank_within_the_timeout_is_a_lost_group(group_env: int) -> None:
    t, out, _ = listen(2, 0.5)
    t.join(30)
    assert "only 0 of 1 ranks connected" in str(out["lost"])
    # The port is closed again: a later stranger finds nobody.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", group_env), timeout=5)


def test_refusals_are_logged_sparingly_and_a_version_shows_in_status(
        capsys: pytest.CaptureFixture[str]) -> None:
    said: list[Any] = []

    class Report:
        def status(self, *args: Any, **kw: Any) -> None:
            said.append((args, kw))

    r = control.Refusals(Report(), 3, 2)  # type: ignore[arg-type]
    for _ in range(100):
        r.refused("10.0.0.9", "not an exod rank (bad greeting)")
    version = "it speaks EXOD-GROUP-5, this rank EXOD-GROUP-8 (every host of a group must run " \
              "the same exod version)"
    r.refused("10.0.0.2", version)
    r.refused("10.0.0.2", version)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["<4>refused a control connection from 10.0.0.9: not an exod rank (bad "
                     "greeting)", f"<4>refused a control connection from 10.0.0.2: {version}"]
    assert len(said) == 1 and said[0][0][1].endswith(f"refused 10.0.0.2: {version}"), said


