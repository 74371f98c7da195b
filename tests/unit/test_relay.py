"""The daemon's side of the hop (docs/design/hop.md): relaying a stream's events to its client
leaves nothing for the event loop to finish later. The async generators it reads the events
through are closed with the answer (left to the garbage collector, each cost the loop a
wake-up and a task of its own), and the answer's end goes out in one write."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from exod.api import serving
from exod.api.dialects.openai.output import OpenAiOutput
from exod.api.dialects.openai.request import parse_chat
from exod.wire import messages as m


class Stream:
    """A request's events as the runner's channel hands them over."""

    def __init__(self, events: list[m.Event]) -> None:
        self.events = list(events)
        self.closed = False

    async def next(self) -> m.Event:
        return self.events.pop(0)

    def close(self) -> None:
        self.closed = True


class Meter:
    failed_code: int | None = None

    def event(self, ev: m.Event) -> None:
        pass


class Account:
    def event(self, ev: m.Event) -> None:
        pass

    async def finish(self, status: int) -> None:
        pass


def relay(events: list[m.Event], stream: bool
          ) -> tuple[str, list[tuple[str, bool]], Stream, int]:
    """One answer relayed to a real HTTP client: its body, the generators it was read
    through (each: whether it was closed when the relay returned), the stream, and the
    writes of the answer's last event and after."""
    made: list[Any] = []
    closed: list[tuple[str, bool]] = []
    wrapped = {name: getattr(serving, name) for name in ("_events", "_after")}

    def keep(name: str) -> Any:
        def make(*args: Any) -> AsyncGenerator[m.Event, None]:
            gen = wrapped[name](*args)
            made.append(gen)
            return gen  # type: ignore[no-any-return]
        return make

    req = parse_chat({"model": "tiny", "stream": stream,
                      "messages": [{"role": "user", "content": "hi"}]})
    source = Stream(events)
    writes: list[bytes] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        write = transport.write

        def counted(data: Any) -> None:
            writes.append(bytes(data))
            write(data)

        transport.write = counted  # type: ignore[method-assign]
        resp = await serving.Serving._relay(None, request, req, source,  # type: ignore[arg-type]
                                            Meter(), OpenAiOutput(req),  # type: ignore[arg-type]
                                            Account())  # type: ignore[arg-type]
        # Before the loop's own shutdown closes whatever is left (asyncio.run does).
        closed.extend((g.ag_code.co_name, g.ag_frame is None) for g in made)
        return resp

    async def run() -> str:
        app = web.Application()
        app.router.add_post("/", handler)
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/", json={})
            return await resp.text()

    for name in wrapped:
        setattr(serving, name, keep(name))
    try:
        body = asyncio.run(run())
    finally:
        for name, fn in wrapped.items():
            setattr(serving, name, fn)
    ends = [i for i, w in enumerate(writes) if b'"finish_reason":"length"' in w]
    return body, closed, source, len(writes) - ends[-1] if ends else 0


EVENTS: list[m.Event] = [m.Prefill("r1", 0, 0), m.Prefill("r1", 5, 5), m.Text("r1", "Hi"),
                         m.Done("r1", "length", 5, 1)]


def test_a_stream_closes_what_it_read_the_events_through() -> None:
    body, closed, source, tail = relay(EVENTS, stream=True)
    assert '"content":"Hi"' in body and body.rstrip().endswith("data: [DONE]")
    assert closed == [("_events", True), ("_after", True)], "left for the garbage collector"
    assert source.closed
    assert tail == 1  # the finish, [DONE] and the body's end: one write


def test_a_whole_answer_closes_them_too() -> None:
    body, closed, source, _ = relay(EVENTS, stream=False)
    assert json.loads(body)["choices"][0]["message"]["content"] == "Hi"
    assert closed == [("_events", True)]
    assert source.closed
