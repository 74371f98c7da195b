"""Ollama's answers to /api/chat and /api/generate, from the typed answer (exod.api.reply).

Streamed: NDJSON, one object a line: `{"model", "created_at", "message": {"role", "content",
"thinking"?, "tool_calls"?}, "done": false}` (/api/generate: `"response"` in place of
`message`), then one with `done: true`, `done_reason` and Ollama's statistics in nanoseconds.
Whole: that last object with the whole text. A tool call comes whole, its `arguments` an
object, in a line of its own. An error after the stream began is an `{"error": TEXT}` line.

The statistics are timed here, as the runner's events arrive: `load_duration` is the wait
before the runner took the request (its queue, and an on-demand instance's load),
`prompt_eval_duration` the prompt's processing up to the first token, `eval_duration` the
generation after it.

A raw prompt (/api/generate with `raw`, or a suffix: a completion, not a chat) answers its text
alone, as completions do: no thinking, no calls, and logprobs without their bytes.
"""

from __future__ import annotations

import json
import time
from typing import Any

from exod.wire import messages as m
from exod.api.dialects.ollama.objects import error_text, timestamp
from exod.api.dialects.ollama.request import Endpoint
from exod.api.errors import ApiError
from exod.api.reply import Call, Called, Delta, Finished, Reply, Usage
from exod.api.stop_reasons import wording

NDJSON_HEADERS = {"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache",
                  "X-Accel-Buffering": "no"}


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the object Ollama's are (the core only returns calls whose
    arguments parsed; anything else is kept whole rather than lost)."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"value": value}


def ollama_logprobs(entries: tuple[m.TokenLogprob, ...], raw: bool) -> list[dict[str, Any]]:
    """Tokens' logprobs as Ollama's; a raw prompt's as completions' legacy arrays hold them
    (no bytes; the top ones by their text, so two alike count once)."""
    if raw:
        return [{"token": e.token, "logprob": e.logprob, "top_logprobs": [
            {"token": t, "logprob": v} for t, v in {t.token: t.logprob for t in e.top}.items()]}
            for e in entries]
    return [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
             "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes}
                              for t in e.top]} for e in entries]


def ollama_calls(calls: list[Call]) -> list[dict[str, Any]]:
    """Calls whole, each its arguments an object."""
    return [{"id": c.id, "function": {"index": i, "name": c.name,
                                      "arguments": arguments(c.arguments)}}
            for i, c in enumerate(calls)]


class OllamaOutput:
    stream_headers = NDJSON_HEADERS

    def __init__(self, endpoint: Endpoint, model: str, kind: str = "chat",
                 arrived: int | None = None) -> None:
        """`kind`: the generation's ("completion" for a raw prompt); `arrived`: when the
        request came (time.monotonic_ns), from which its durations count."""
        self.endpoint = endpoint
        self.model = model
        self.raw = kind == "completion"
        self.arrived = time.monotonic_ns() if arrived is None else arrived
        self.prefilling: int | None = None  # the runner took the request
        self.first_token: int | None = None
        self.usage: Usage | None = None
        self.finished: int | None = None
        self._calls: list[Call] = []  # streamed calls, sent together before what follows
        self._closed = False  # the last object (done) was written

    # ---- timing ----------------------------------------------------------------------------
    def seen(self, ev: m.Event) -> None:
        now = time.monotonic_ns()
        if isinstance(ev, m.Prefill) and ev.total and self.prefilling is None:
            self.prefilling = now
        elif isinstance(ev, (m.Text, m.Held, m.ToolCall)) and self.first_token is None:
            self.first_token = now
        elif isinstance(ev, m.Done):
            self.finished = now

    def statistics(self) -> dict[str, Any]:
        end = self.finished or time.monotonic_ns()
        took = self.prefilling or self.first_token or end
        first = self.first_token or end
        u = self.usage
        return {"total_duration": end - self.arrived, "load_duration": took - self.arrived,
                "prompt_eval_count": u.prompt if u else 0,
                "prompt_eval_duration": max(0, first - took),
                "eval_count": u.completion if u else 0,
                "eval_duration": max(0, end - first)}

    # ---- objects ----------------------------------------------------------------------------
    def _head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": timestamp(time.time())}

    def _object(self, text: str, thinking: str = "", calls: list[dict[str, Any]] | None = None,
                logprobs: list[dict[str, Any]] | None = None,
                end: Finished | None = None) -> dict[str, Any]:
        out = self._head()
        if self.endpoint == "chat":
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            out["message"] = msg
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        if logprobs:
            out["logprobs"] = logprobs
        out["done"] = end is not None
        if end is not None:
            self.usage = end.usage
            out["done_reason"] = wording(end.stop).ollama
            out.update(self.statistics())
        return out

    def whole(self, reply: Reply) -> dict[str, Any]:
        if self.raw:
            return self._object(reply.text, logprobs=ollama_logprobs(reply.logprobs, True),
                                end=reply.finished)
        return self._object(reply.text, reply.reasoning, ollama_calls(list(reply.calls)),
                            ollama_logprobs(reply.logprobs, False), reply.finished)

    # ---- streamed ---------------------------------------------------------------------------
    def begin(self) -> bytes:
        return b""

    def delta(self, d: Delta) -> bytes:
        if isinstance(d, Called):
            if not self.raw:
                self._calls.append(d.call)
            return b""
        out = self._flush()
        if isinstance(d, Finished):
            if not self._closed:
                self._closed = True
                out += line(self._object("", end=d))
            return out
        thinking = "" if self.raw else d.reasoning
        logprobs = ollama_logprobs(d.logprobs, self.raw)
        if d.text or thinking or logprobs:
            out += line(self._object(d.text, thinking, logprobs=logprobs))
        return out

    def _flush(self) -> bytes:
        """The calls so far, in one line."""
        if not self._calls:
            return b""
        calls, self._calls = ollama_calls(self._calls), []
        return line(self._object("", calls=calls))

    def failed(self, err: ApiError) -> bytes:
        return self._flush() + line({"error": error_text(err)})

    def end(self) -> bytes:
        return b""
