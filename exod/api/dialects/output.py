"""How a generation's result leaves the API: the seam between the core, which renders OpenAI
chat completion objects and chunks, and the dialect a request came in.

The core calls, in order: `seen` for every event of the request (side facts a dialect may
need: the prompt's length from Prefill, the stop sequence from Done), then either `whole` once,
or `begin`, `chunk` for each chunk, and `end` (or `failed` for an error after the stream began).
"""

from __future__ import annotations

from typing import Any, Protocol

from exod.wire import messages as m
from exod.api import sse
from exod.api.errors import ApiError


class Output(Protocol):
    # A stream's headers: Server-Sent Events, but for Ollama's NDJSON.
    stream_headers: dict[str, str]

    def seen(self, ev: m.Event) -> None: ...

    def whole(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def begin(self) -> bytes: ...

    def chunk(self, obj: dict[str, Any]) -> bytes: ...

    def failed(self, err: ApiError) -> bytes: ...

    def end(self) -> bytes: ...


class OpenAiOutput:
    """Chat Completions itself: objects as they are, chunks as `data:` lines, `[DONE]` last."""

    stream_headers = sse.HEADERS

    def seen(self, ev: m.Event) -> None:
        pass

    def whole(self, obj: dict[str, Any]) -> dict[str, Any]:
        return obj

    def begin(self) -> bytes:
        return b""

    def chunk(self, obj: dict[str, Any]) -> bytes:
        return sse.frame(obj)

    def failed(self, err: ApiError) -> bytes:
        return sse.frame(err.body())

    def end(self) -> bytes:
        return sse.DONE
