"""The daemon's runner link over a real socketpair, in an event loop, with the test playing the
runner: hello first, then the runner's spec before anything else the daemon says, requests
multiplexed by id, cancel, late events dropped, lifecycle reports handed on, a runner that goes
away fails every open request (never a hang), a malformed or unexpected message is a protocol
error reported once (a fetcher's message from a runner too, and the other way round), and a
writer that outpaces the socket keeps frame order."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from exod.wire import messages as m
from exod.wire.options import RunnerOptions
from exod.core.shards import Shard
from exod.daemon.channel import MAX_RUNNER_FRAME, RunnerChannel
from exod.wire.protocol import FrameDecoder, encode, from_wire
from exod.wire.specs import RUNNER_FIRST, RunnerSpec

SPEC = RunnerSpec(version=m.VERSION, instance="x", model=Path("/m"), kind="text",
                  parallelism="pipeline", shard=Shard(0, 1, 0, 4, 4), width=2, heartbeat=5.0,
                  parent_pid=1, options=RunnerOptions(), group=None, prompt_cache_folder=None,
                  chat_template_kwargs={})


class FakeRunner:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = FrameDecoder()
        self.frames = 0  # read so far
        self.spec: RunnerSpec | None = None

    def send(self, msg: m.FromRunner | dict[str, Any]) -> None:
        self.sock.sendall(encode(msg if isinstance(msg, dict) else m.to_wire(msg)))

    def hello(self, version: int = m.VERSION) -> None:
        self.send(m.Hello(version=version, pid=1234))

    def _received(self, n: int) -> list[m.ToRunner]:
        """The next n requests; the spec, the first frame, is kept apart."""
        out: list[m.ToRunner] = []
        while len(out) < n:
            for f in self.decoder.feed(self.sock.recv(1 << 20)):
                self.frames += 1
                if self.frames == 1:
                    self.spec = from_wire(f, RUNNER_FIRST)
                else:
                    out.append(m.decode_to_runner(f))
        return out

    async def received(self, n: int) -> list[m.ToRunner]:
        """Read from a thread, so the event loop (the link) keeps running meanwhile."""
        return await asyncio.to_thread(self._received, n)


class Recorder:
    def __init__(self) -> None:
        self.messages: list[m.FromRunner] = []
        self.broken: list[str] = []
        self.event = asyncio.Event()

    def on_message(self, msg: m.FromRunner) -> None:
        self.messages.append(msg)
        self.event.set()

    def on_broken(self, why: str) -> None:
        self.broken.append(why)
        self.event.set()


def pair() -> tuple[RunnerChannel[m.FromRunner], FakeRunner, Recorder]:
    daemon_end, runner_end = socket.socketpair()
    runner_end.settimeout(10)
    rec = Recorder()
    link = RunnerChannel(daemon_end, {}, SPEC, m.decode_from_runner, rec.on_message,
                         rec.on_broken)
    return link, FakeRunner(runner_end), rec


def generate(**kw: Any) -> m.Generate:
    return m.Generate(id="", kind=kw.pop("kind", "chat"), max_tokens=8, **kw)


def test_requests_are_multiplexed_by_id_and_cancelled() -> None:
    async def scenario() -> None:
        link, runner, _ = pair()
        runner.hello()
        a = link.open(generate(messages=[]))
        b = link.open(generate(kind="completion", prompt="x"))
        ga, gb = await runner.received(2)
        assert isinstance(ga, m.Generate) and isinstance(gb, m.Generate)
        assert ga.id != gb.id and gb.prompt == "x"
        runner.send(m.Prefill(ga.id, 2048, 3000))  # progress: the stream goes on
        runner.send(m.Text(gb.id, "B"))
        runner.send(m.Text(ga.id, "A"))
        runner.send(m.Done(ga.id, "stop", 3, 1))
        assert await a.next() == m.Prefill(ga.id, 2048, 3000)
        assert await a.next() == m.Text(ga.id, "A")
        assert await a.next() == m.Done(ga.id, "stop", 3, 1) and a.finished
        assert await b.next() == m.Text(gb.id, "B")
        assert link.in_flight == 1
        b.close()  # the client went away
        assert await runner.received(1) == [m.Cancel(gb.id)]
        runner.send(m.Text(gb.id, "late"))  # dropped, nobody waits for it
        a.close()  # finished already: no cancel
        assert link.send(m.Shutdown(drain=1.5))
        assert await runner.received(1) == [m.Shutdown(drain=1.5)]
        assert link.in_flight == 0
        link.close("test over")
        runner.sock.close()

    asyncio.run(scenario())


def test_a_request_with_images_reaches_the_runner_whole() -> None:
    """The link sets the request's id and sends it as it is: its images stay typed (a rebuild
    from the wire's dicts failed every request with an image)."""
    async def scenario() -> None:
        link, runner, _ = pair()
        runner.hello()
        sent = generate(messages=[{"role": "user", "content": [
            {"type": "image", "image": 0}, {"type": "text", "text": "what is it?"}]}],
            images=[m.Image("R0lGODlh")])
        link.open(sent)
        (got,) = await runner.received(1)
        assert isinstance(got, m.Generate) and got.id and got.images == sent.images
        assert got.messages == sent.messages
        link.close("test over")
        runner.sock.close()

    asyncio.run(scenario())


def test_lifecycle_reports_are_handed_on_after_hello() -> None:
    async def scenario() -> None:
        link, runner, rec = pair()
        runner.hello()
        runner.send(m.LoadProgress(2, 4))
        runner.send(m.Status(m.Phase.CONNECTING, "connecting", attempt=3))
        runner.send(m.Ready(vocab_size=1024, context_length=2048))
        while len(rec.messages) < 3:
            rec.event.clear()
            await asyncio.wait_for(rec.event.wait(), 10)
        assert rec.messages == [m.LoadProgress(2, 4),
                                m.Status(m.Phase.CONNECTING, "connecting", attempt=3),
                                m.Ready(vocab_size=1024, context_length=2048)]
        assert link.hello == m.Hello(version=m.VERSION, pid=1234) and rec.broken == []
        link.close("test over")
        runner.sock.close()

    asyncio.run(scenario())


def test_runner_gone_fails_open_requests_after_delivering_its_last_events() -> None:
    async def scenario() -> None:
        link, runner, rec = pair()
        runner.hello()
        s = link.open(generate())
        (g,) = await runner.received(1)
        runner.send(m.Text(g.id, "last words"))
        runner.sock.close()  # the runner died
        assert await s.next() == m.Text(g.id, "last words")
        err = await asyncio.wait_for(s.next(), 10)
        assert isinstance(err, m.Error) and err.code == "runner_gone"
        assert link.closed and not link.send(m.Cancel("x"))
        late = link.open(generate())  # a request after the end fails at once
        assert isinstance(await late.next(), m.Error)
        assert rec.broken == []  # a runner that leaves broke no protocol

    asyncio.run(scenario())


@pytest.mark.parametrize("frames, why", [
    ([m.LoadProgress(1, 2)], "progress before hello"),
    ([m.Hello(version=m.VERSION + 1, pid=1)], "speaks version"),
    ([m.Hello(version=m.VERSION, pid=1), {"type": "bogus"}], "unknown message type"),
    ([m.Hello(version=m.VERSION, pid=1), {"type": "progress", "loaded": "1", "total": 2}],
     "progress.loaded"),
    ([m.Hello(version=m.VERSION, pid=1), {"type": "ready", "extra": 1}], "unknown field"),
], ids=["before-hello", "version", "unknown-type", "bad-field", "extra-field"])
def test_a_protocol_error_is_reported_once_and_fails_open_requests(
        frames: list[Any], why: str) -> None:
    async def scenario() -> None:
        link, runner, rec = pair()
        s = link.open(generate())
        for f in frames:
            runner.send(f)
        runner.send(m.LoadProgress(1, 2))  # never read: the link stopped at the error
        await asyncio.wait_for(rec.event.wait(), 10)
        assert len(rec.broken) == 1 and why in rec.broken[0], rec.broken
        assert rec.messages == []
        err = await asyncio.wait_for(s.next(), 10)
        assert isinstance(err, m.Error) and err.code == "runner_gone"
        assert link.closed
        runner.sock.close()

    asyncio.run(scenario())


def test_an_oversized_or_garbled_frame_is_a_protocol_error() -> None:
    async def scenario() -> None:
        link, runner, rec = pair()
        runner.sock.sendall(b"\xff\xff\xff\xff")  # a length far beyond the limit
        await asyncio.wait_for(rec.event.wait(), 10)
        assert "exceeds" in rec.broken[0]
        runner.sock.close()

        link, runner, rec = pair()
        runner.sock.sendall(b"\x00\x00\x00\x03{x}")
        await asyncio.wait_for(rec.event.wait(), 10)
        assert "bad JSON" in rec.broken[0]
        runner.sock.close()

        # Within the frame limit but nested beyond the parser's recursion limit.
        link, runner, rec = pair()
        body = b"[" * 100_000 + b"]" * 100_000
        runner.sock.sendall(struct.pack("!I", len(body)) + body)
        await asyncio.wait_for(rec.event.wait(), 10)
        assert "nested too deeply" in rec.broken[0]
        runner.sock.close()

        # A frame bigger than any a runner sends is refused from its length alone.
        link, runner, rec = pair()
        runner.sock.sendall(struct.pack("!I", MAX_RUNNER_FRAME + 1))
        await asyncio.wait_for(rec.event.wait(), 10)
        assert f"{MAX_RUNNER_FRAME + 1} bytes exceeds" in rec.broken[0]
        runner.sock.close()

    asyncio.run(scenario())


def test_a_full_socket_buffers_in_order() -> None:
    async def scenario() -> None:
        link, runner, _ = pair()
        runner.hello()
        big = "x" * 50_000
        for i in range(20):
            assert link.send(m.Generate(id=f"r{i}", kind="completion", max_tokens=1,
                                        prompt=big))
        got = await runner.received(20)
        assert [g.id for g in got if isinstance(g, m.Generate)] == [f"r{i}" for i in range(20)]
        link.close("test over")
        runner.sock.close()

    asyncio.run(scenario())



def test_the_spec_goes_first_once_the_hello_has_the_right_version() -> None:
    async def scenario() -> None:
        link, runner, rec = pair()
        assert link.send(m.Shutdown(drain=2.0))  # held: nothing goes before the spec
        runner.hello()
        assert await runner.received(1) == [m.Shutdown(drain=2.0)]
        assert runner.frames == 2 and runner.spec == SPEC  # the spec, whole, then the rest
        assert rec.broken == []
        link.close("test over")
        runner.sock.close()

        link, runner, rec = pair()
        runner.hello(version=m.VERSION + 1)
        await asyncio.wait_for(rec.event.wait(), 10)
        assert "speaks version" in rec.broken[0]
        runner.sock.settimeout(10)
        assert runner.sock.recv(1 << 20) == b""  # closed, and no spec ever sent
        runner.sock.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("fetcher, msg", [
    (True, m.LoadProgress(1, 2)), (True, m.Text("r1", "x")), (False, m.DownloadProgress(1, 2)),
    (False, m.Fetched("/p", "c" * 40)),
], ids=["progress-from-a-fetcher", "text-from-a-fetcher", "download-from-a-runner",
        "fetched-from-a-runner"])
def test_each_child_is_checked_against_its_own_union(fetcher: bool, msg: Any) -> None:
    async def scenario() -> None:
        daemon_end, child_end = socket.socketpair()
        rec = Recorder()
        decode = m.decode_from_fetcher if fetcher else m.decode_from_runner
        link = RunnerChannel(daemon_end, {}, SPEC, decode, rec.on_message, rec.on_broken)
        child = FakeRunner(child_end)
        child.hello()
        child.send(msg)
        await asyncio.wait_for(rec.event.wait(), 10)
        assert len(rec.broken) == 1 and f"unknown message type '{msg.type}'" in rec.broken[0]
        assert rec.messages == [] and link.closed
        child_end.close()

    asyncio.run(scenario())
