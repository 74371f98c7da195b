"""Server-sent events, as all three APIs stream them (Chat Completions: `data:` lines and
`data: [DONE]` last; Messages and Responses: each event named by an `event:` line too): the one
place an event is framed."""

from __future__ import annotations

import json
from typing import Any

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
           "X-Accel-Buffering": "no"}  # proxies (nginx) must not hold the stream back


def frame(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One event: `event: NAME` when named, then `data:` and the object as compact JSON (or a
    literal such as `[DONE]`), then the blank line that ends it. JSON escapes every line break
    inside a string, so the data is always one line."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"),
                                                           ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


DONE = frame("[DONE]")
