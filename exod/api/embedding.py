"""The embeddings and rerank path of the HTTP API: the same daemon path as a generation (the
instance found and started on demand by exod.daemon.traffic, a place in its admission queue,
its runner's link, the hang watch, cancellation when the client leaves, metering), then the
runner's Vectors gathered and written in the dialect's shape.

`Embedder.run` is the one path; each dialect writes its answer from `Embedded`: OpenAI's
embeddings object and the Jina/Cohere rerank object in exod.api.dialects.embeddings.output,
Ollama's /api/embed and /api/embeddings in exod.api.dialects.ollama.embed.
"""

from __future__ import annotations

import array
import asyncio
import base64
import dataclasses
import json
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from exod.wire import messages as m
from exod.api.access import KEY_ID, key_of
from exod.api.accounting import Account, accounted
from exod.api.dialects.embeddings.request import EmbedRequest
from exod.api.errors import ApiError, runner_error
from exod.api.ignored import header
from exod.api.metrics import Meter
from exod.api.serving import Serving, refusal
from exod.daemon.channel import RequestStream, TooLarge
from exod.daemon.refusals import NotAdmitted
from exod.wire.protocol import MAX_FRAME

BIG_ANSWER = 1 << 20  # bytes of results past which the JSON is written in a thread


@dataclass(frozen=True)
class Embedded:
    """The runner's answer: each input's result in order (float32 little-endian bytes: a
    vector, or a rerank's one score), and the tokens it read."""

    results: list[bytes]
    prompt_tokens: int
    waited_ns: int = 0  # before the runner took the request: the queue, an on-demand load

    def floats(self, i: int) -> list[float]:
        values = array.array("f", self.results[i])
        if sys.byteorder != "little":
            values.byteswap()
        return values.tolist()

    def score(self, i: int) -> float:
        value: float = struct.unpack("<f", self.results[i][:4])[0]
        return value


class Embedder:
    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    async def run(self, request: web.Request, req: EmbedRequest,
                  keep_alive: float | None = None) -> Embedded:
        """Serve a checked request: its results once the runner has given them all; raises
        ApiError (the daemon's refusal, the runner's error). `keep_alive`: the idle window it
        asks for (Ollama's, exod.core.keep_alive), None: the instance's own."""
        self.serving.metrics.ignored.record(req.dialect, req.ignored)
        # Its key's limits and usage as a generation's (exod.api.accounting): in flight, the
        # input's tokens per minute and in the quotas, a line in the usage log.
        account = Account(self.serving.sup.usage, key_of(request), req.dialect, req.model)
        async with accounted(account) as outcome:
            got = await self._run(request, req, keep_alive, account)
            outcome.status = 200
            return got

    async def _run(self, request: web.Request, req: EmbedRequest, keep_alive: float | None,
                   account: Account) -> Embedded:
        arrived = time.monotonic_ns()
        with self.serving.metered() as meter:
            meter.inputs(req.embed.count)
            lease = await self.serving.admit(req.model, req.embed.kind, meter, keep_alive,
                                             key_of(request))
            account.instance = lease.instance.name
            try:
                async with lease:
                    waited = time.monotonic_ns() - arrived
                    try:
                        stream = lease.open(req.embed)
                    except TooLarge as e:
                        raise ApiError(413, f"The request is {e.size} bytes once encoded for "
                                            f"the runner, more than the {MAX_FRAME >> 20} MiB "
                                            "a runner takes: send fewer inputs.",
                                       "invalid_request_error", "request_too_large",
                                       req.embed.named("texts")) from None
                    try:  # watched for a hang by the lease
                        with self.serving.live.hold(request.get(KEY_ID, b""), stream):
                            got = await _gather(stream, req.embed.count, meter, account)
                    finally:
                        stream.close()  # cancels the work unless it finished
            except NotAdmitted as e:
                raise refusal(e) from None
            meter.status = 200
            return dataclasses.replace(got, waited_ns=waited)


async def _gather(stream: RequestStream, count: int, meter: Meter, account: Account
                  ) -> Embedded:
    results: list[bytes | None] = [None] * count
    while True:
        ev = await stream.next()
        meter.event(ev)
        account.event(ev)
        if isinstance(ev, m.Vectors):
            data = base64.b64decode(ev.data)
            size = len(data) // ev.count
            if ev.start + ev.count > count or size * ev.count != len(data):
                raise ApiError(500, "the runner sent results that do not fit the request",
                               "server_error", "internal")
            for k in range(ev.count):
                results[ev.start + k] = data[k * size:(k + 1) * size]
        elif isinstance(ev, m.Done):
            if any(r is None for r in results):
                raise ApiError(500, "the runner ended the request before every result",
                               "server_error", "internal")
            return Embedded([r for r in results if r is not None], ev.prompt_tokens)
        elif isinstance(ev, m.Error):
            raise runner_error(ev)


async def json_answer(body: dict[str, Any], size: int, ignored: tuple[str, ...]
                      ) -> web.Response:
    """The answer as JSON, written off the loop when it is large (thousands of vectors)."""
    text = await asyncio.to_thread(json.dumps, body) if size > BIG_ANSWER else json.dumps(body)
    return web.Response(text=text, content_type="application/json", headers=header(ignored))
