"""How a generation's answer leaves the API: the seam between the one generation path
(exod.api.serving) and the dialect a request came in (exod.api.dialects), each of which renders
the one typed answer (exod.api.reply) in its own shape.

The path calls, in order: `seen` for every event of the request (progress a dialect may time or
count: the prompt's length from Prefill, Ollama's durations), then either `whole` once with the
reply, or `begin`, `delta` for each piece, and `end` (or `failed` for an error after the stream
began).
"""

from __future__ import annotations

from typing import Any, Protocol

from exod.wire import messages as m
from exod.api.errors import ApiError
from exod.api.reply import Delta, Reply


class DialectOutput(Protocol):
    # A stream's headers: Server-Sent Events, but for Ollama's NDJSON.
    stream_headers: dict[str, str]

    def seen(self, ev: m.Event) -> None: ...

    def whole(self, reply: Reply) -> dict[str, Any]: ...

    def begin(self) -> bytes: ...

    def delta(self, d: Delta) -> bytes: ...

    def failed(self, err: ApiError) -> bytes: ...

    def end(self) -> bytes: ...
