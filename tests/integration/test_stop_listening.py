"""A daemon's stop drops no request (issue 45's soak found one reset): at SIGTERM the HTTP API
stops listening at once, answering 503 to every connection its backlog holds, and to every
request already sent on a connection it took; from then on the kernel refuses a connection,
which a client knows was never sent. Requests under way run on through the ladder.

Real daemons, raw sockets: the daemon is frozen (SIGSTOP) while the clients connect and send,
so that their connections wait in the backlog, complete, as they do when a stop comes while
the loop is busy. ~2 CPU-s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.harness import Daemon

pytestmark = pytest.mark.integration

N = 12


def request(i: int) -> bytes:
    body = json.dumps({"model": "t", "max_tokens": 4,
                       "messages": [{"role": "user", "content": f"hello {i}"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


def answer(s: socket.socket) -> tuple[int, dict[str, object]]:
    """The status and JSON body of the one answer on `s`; raises if there is none whole."""
    data = b""
    s.settimeout(60)
    while chunk := s.recv(65536):  # raises ConnectionResetError on a reset
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), data[:200]
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    assert len(body) == length, data[:300]
    return int(head.split()[1]), json.loads(body)


@pytest.fixture()
def daemon(tiny_model: Path) -> Iterator[Daemon]:
    d = Daemon({"defaults": {"stop": {"grace": "2s", "attempts": 1, "interval": "1s"}},
                "instances": {"t": {"model": str(tiny_model)}}}, name="stop-listen")
    try:
        d.start()
        d.until_state("t", "ready")
        yield d
    finally:
        d.close()


def test_connections_waiting_at_a_stop_are_answered_and_later_ones_refused(
        daemon: Daemon) -> None:
    d = daemon
    url = urlsplit(d.api_url())
    where = (url.hostname, url.port)
    runner = int(d.instance("t")["ranks"][0]["pid"])
    assert d.proc is not None
    d.proc.send_signal(signal.SIGSTOP)
    socks = []
    try:
        for i in range(N):
            s = socket.create_connection(where, timeout=10)  # the kernel completes it
            s.sendall(request(i))
            socks.append(s)
        # The runner frozen too: the ladder's first rung then waits its whole grace, and the
        # daemon is still up, stopping, when the next connection is tried below.
        os.kill(runner, signal.SIGSTOP)
        d.proc.send_signal(signal.SIGTERM)
    finally:
        d.proc.send_signal(signal.SIGCONT)
    got = [answer(s) for s in socks]
    for s in socks:
        s.close()
    for status, body in got:
        assert status in (200, 503), (status, body)
        if status == 503:
            err = body["error"]
            assert isinstance(err, dict) and err["message"], body
    deadline = time.monotonic() + 30
    while not (closed := d.events(event="api-closed")):  # the line follows the close
        assert time.monotonic() < deadline, d.log_text()
        time.sleep(0.05)  # polling the daemon's log for it
    assert len(closed) == 1, d.log_text()
    assert d.proc.poll() is None, "the daemon is still stopping: the runner is frozen"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(where, timeout=10).close()
    assert d.proc.wait(60) == 0
    said = closed[0]["message"]
    assert "no longer listening" in said, said
