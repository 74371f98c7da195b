"""The runner's channel (exod.runner.link.channel) over a real socketpair: a batch step's events go
out in one write, whole and in order, and a channel whose daemon is gone says so."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from exod.wire import messages as m
from exod.wire.protocol import FrameDecoder
from exod.runner.link.channel import Channel
from exod.runner.link.lifecycle import Lifecycle

EVENTS: list[m.FromRunner] = [m.Text("r1", "héllo "), m.Prefill("r2", 32, 900),
                              m.Text("r3", "€"), m.Done("r1", "length", 12, 4)]


class Writes:
    """Counts the writes made on a real socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.calls = 0

    def sendall(self, data: bytes) -> None:
        self.calls += 1
        self.sock.sendall(data)


def read(sock: socket.socket, n: int) -> list[m.FromRunner]:
    decoder, got = FrameDecoder(), []
    sock.settimeout(10)
    while len(got) < n:
        got += [m.decode_from_runner(f) for f in decoder.feed(sock.recv(65536))]
    return got


def test_a_steps_events_go_in_one_write_in_order() -> None:
    ours, daemon = socket.socketpair()
    with ours, daemon:
        channel = Channel(None, Lifecycle(None))
        writes = Writes(ours)
        channel.end.sock = writes  # type: ignore[assignment]
        assert channel.send_all(EVENTS)
        assert writes.calls == 1
        assert read(daemon, len(EVENTS)) == EVENTS
        assert not channel.send_all([])  # nothing to say: no write at all
        assert writes.calls == 1


def test_a_gone_daemon_makes_sending_fail_quietly() -> None:
    ours, daemon = socket.socketpair()
    daemon.close()
    with ours:
        channel = Channel(None, Lifecycle(None))
        channel.end.sock = ours
        assert not channel.send_all(EVENTS)
        assert not channel.send(EVENTS[0])


def test_a_daemon_killed_with_our_bytes_unread_stops_the_runner_with_stderr_gone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of the daemon: its end of the channel closes with the runner's heartbeats still
    unread (the runner reads ECONNRESET, a broken channel) and its end of the runner's stderr
    closes too. The broken channel is logged to that stderr, which fails (EPIPE): the stop
    must be requested all the same, or nothing ever stops this runner (CI saw one outlive its
    daemon)."""
    r, w = os.pipe()
    os.close(r)
    monkeypatch.setattr(sys, "stderr", open(w, "w", encoding="utf-8"))  # a reader-less pipe
    ours, daemon = socket.socketpair()
    life = Lifecycle(None)
    channel = Channel(ours.detach(), life)
    channel.start()  # the hello sits unread on the daemon's side
    daemon.close()
    assert life.stop.wait(5), "the runner was never asked to stop"
    assert life.reason == "daemon gone (channel closed)"
    assert channel.broken  # ECONNRESET: the daemon went with our bytes unread
