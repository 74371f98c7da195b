"""The daemon's runner link over a real socketpair, in an event loop, with the test playing the
runner: requests multiplexed by id, cancel, late events dropped, a runner that goes away fails
every open request (never a hang), and a writer that outpaces the socket keeps frame order."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from exod.daemon.link import Link
from exod.protocol import FrameDecoder, encode


class FakeRunner:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = FrameDecoder()

    def send(self, **msg: Any) -> None:
        self.sock.sendall(encode(msg))

    def received(self, n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < n:
            out += self.decoder.feed(self.sock.recv(1 << 20))
        return out


def pair() -> tuple[socket.socket, FakeRunner]:
    daemon_end, runner_end = socket.socketpair()
    daemon_end.setblocking(False)
    runner_end.settimeout(10)
    return daemon_end, FakeRunner(runner_end)


def test_requests_are_multiplexed_by_id_and_cancelled() -> None:
    async def scenario() -> None:
        sock, runner = pair()
        link = Link(asyncio.get_running_loop(), sock, {})
        a = link.open({"kind": "chat", "messages": []})
        b = link.open({"kind": "completion", "prompt": "x"})
        ga, gb = runner.received(2)
        assert ga["op"] == gb["op"] == "generate" and ga["id"] != gb["id"]
        assert gb["prompt"] == "x"
        runner.send(id=gb["id"], ev="text", text="B")
        runner.send(id=ga["id"], ev="text", text="A")
        runner.send(id=ga["id"], ev="done", finish_reason="stop")
        assert (await a.next())["text"] == "A"
        assert (await a.next())["ev"] == "done" and a.finished
        assert (await b.next())["text"] == "B"
        assert link.in_flight == 1
        b.close()  # the client went away
        assert runner.received(1) == [{"op": "cancel", "id": gb["id"]}]
        runner.send(id=gb["id"], ev="text", text="late")  # dropped, nobody waits for it
        a.close()  # finished already: no cancel
        assert link.send({"op": "shutdown", "drain": 1.5})
        assert runner.received(1) == [{"op": "shutdown", "drain": 1.5}]
        assert link.in_flight == 0
        link.close("test over")
        sock.close()
        runner.sock.close()

    asyncio.run(scenario())


def test_runner_gone_fails_open_requests_after_delivering_its_last_events() -> None:
    async def scenario() -> None:
        sock, runner = pair()
        link = Link(asyncio.get_running_loop(), sock, {})
        s = link.open({"kind": "chat"})
        (g,) = runner.received(1)
        runner.send(id=g["id"], ev="text", text="last words")
        runner.sock.close()  # the runner died
        assert (await s.next())["text"] == "last words"
        err = await asyncio.wait_for(s.next(), 10)
        assert err["ev"] == "error" and err["code"] == "runner_gone"
        assert link.closed and not link.send({"op": "cancel", "id": "x"})
        late = link.open({"kind": "chat"})  # a request after the end fails at once
        assert (await late.next())["ev"] == "error"
        sock.close()

    asyncio.run(scenario())


def test_a_full_socket_buffers_in_order() -> None:
    async def scenario() -> None:
        sock, runner = pair()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        link = Link(asyncio.get_running_loop(), sock, {})
        big = "x" * 50_000
        for i in range(20):
            assert link.send({"op": "generate", "id": f"r{i}", "prompt": big})
        got: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        while len(got) < 20:  # read from a thread while the loop flushes the rest
            got += await loop.run_in_executor(None, runner.received, 1)
        assert [m["id"] for m in got] == [f"r{i}" for i in range(20)]
        link.close("test over")
        sock.close()
        runner.sock.close()

    asyncio.run(scenario())


def test_engine_stats_go_to_their_handler_and_never_to_a_request() -> None:
    async def scenario() -> None:
        sock, runner = pair()
        link = Link(asyncio.get_running_loop(), sock, {})
        seen: list[dict[str, Any]] = []
        link.on_stats = seen.append
        a = link.open({"kind": "completion", "prompt": "x"})
        (ga,) = runner.received(1)
        runner.send(ev="stats", stats={"width": 8, "active": 1})
        runner.send(ev="stats", stats="not an object")  # ignored, not a crash
        runner.send(id=ga["id"], ev="done", finish_reason="stop")
        assert (await a.next())["ev"] == "done"
        assert seen == [{"width": 8, "active": 1}]
        link.close("test over")

    asyncio.run(scenario())
