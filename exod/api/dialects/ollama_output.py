"""Ollama's answers to /api/chat and /api/generate, from what the chat completions core renders.

Streamed: NDJSON, one object a line: `{"model", "created_at", "message": {"role", "content",
"thinking"?, "tool_calls"?}, "done": false}` (/api/generate: `"response"` in place of
`message`), then one with `done: true`, `done_reason` and Ollama's statistics in nanoseconds.
Whole: that last object with the whole text. A tool call comes whole, its `arguments` an
object, in a line of its own. An error after the stream began is an `{"error": TEXT}` line.

The statistics are timed here, as the runner's events arrive: `load_duration` is the wait
before the runner took the request (its queue, and an on-demand instance's load),
`prompt_eval_duration` the prompt's processing up to the first token, `eval_duration` the
generation after it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from exod.wire import messages as m
from exod.api.dialects.ollama_request import Endpoint
from exod.api.errors import ApiError
from exod.api.ollama.objects import error_text, timestamp

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


def ollama_logprobs(chunk_logprobs: Any) -> list[dict[str, Any]]:
    """Chat completions' `logprobs.content` (or completions' legacy arrays) as Ollama's."""
    if not isinstance(chunk_logprobs, dict):
        return []
    if "content" in chunk_logprobs:
        return [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
                 "top_logprobs": [{"token": t["token"], "logprob": t["logprob"],
                                   "bytes": t["bytes"]} for t in e["top_logprobs"]]}
                for e in chunk_logprobs["content"] or []]
    return [{"token": tok, "logprob": lp,
             "top_logprobs": [{"token": t, "logprob": v} for t, v in (top or {}).items()]}
            for tok, lp, top in zip(chunk_logprobs.get("tokens") or [],
                                    chunk_logprobs.get("token_logprobs") or [],
                                    chunk_logprobs.get("top_logprobs") or [], strict=False)]


class OllamaOutput:
    stream_headers = NDJSON_HEADERS

    def __init__(self, endpoint: Endpoint, model: str) -> None:
        self.endpoint = endpoint
        self.model = model
        self.arrived = time.monotonic_ns()
        self.prefilling: int | None = None  # the runner took the request
        self.first_token: int | None = None
        self.done: m.Done | None = None
        self.finished: int | None = None
        self._calls: list[dict[str, Any]] = []  # a streamed call's pieces, joined
        self._closed = False  # the last object (done) was written

    # ---- timing ----------------------------------------------------------------------------
    def seen(self, ev: m.Event) -> None:
        now = time.monotonic_ns()
        if isinstance(ev, m.Prefill) and ev.total and self.prefilling is None:
            self.prefilling = now
        elif isinstance(ev, (m.Text, m.Held, m.ToolCall)) and self.first_token is None:
            self.first_token = now
        elif isinstance(ev, m.Done):
            self.done, self.finished = ev, now

    def statistics(self) -> dict[str, Any]:
        end = self.finished or time.monotonic_ns()
        took = self.prefilling or self.first_token or end
        first = self.first_token or end
        done = self.done
        return {"total_duration": end - self.arrived, "load_duration": took - self.arrived,
                "prompt_eval_count": done.prompt_tokens if done else 0,
                "prompt_eval_duration": max(0, first - took),
                "eval_count": done.completion_tokens if done else 0,
                "eval_duration": max(0, end - first)}

    # ---- objects ----------------------------------------------------------------------------
    def _head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": timestamp(time.time())}

    def _object(self, text: str, thinking: str = "", calls: list[dict[str, Any]] | None = None,
                logprobs: list[dict[str, Any]] | None = None, done: bool = False,
                reason: str | None = None) -> dict[str, Any]:
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
        out["done"] = done
        if done:
            # A tool call ends a turn as a stop does: Ollama has no other reason for it.
            out["done_reason"] = "length" if reason == "length" else "stop"
            out.update(self.statistics())
        return out

    def whole(self, obj: dict[str, Any]) -> dict[str, Any]:
        choice = obj["choices"][0]
        msg = choice.get("message") or {}
        text = msg.get("content") if "message" in choice else choice.get("text")
        calls = [{"id": c.get("id"), "function": {"index": i, "name": c["function"]["name"],
                                                  "arguments": arguments(
                                                      c["function"]["arguments"])}}
                 for i, c in enumerate(msg.get("tool_calls") or [])]
        return self._object(text or "", msg.get("reasoning_content") or "", calls,
                            ollama_logprobs(choice.get("logprobs")), True,
                            choice.get("finish_reason"))

    # ---- streamed ---------------------------------------------------------------------------
    def begin(self) -> bytes:
        return b""

    def chunk(self, obj: dict[str, Any]) -> bytes:
        out = b""
        for choice in obj.get("choices") or []:
            delta = choice.get("delta")
            text = (delta or {}).get("content") if delta is not None else choice.get("text")
            pieces = (delta or {}).get("tool_calls") or []
            if pieces:
                self._join(pieces)
                continue
            out += self._flush()
            thinking = (delta or {}).get("reasoning_content") or ""
            logprobs = ollama_logprobs(choice.get("logprobs"))
            if text or thinking or logprobs:
                out += line(self._object(text or "", thinking, logprobs=logprobs))
            if choice.get("finish_reason") is not None and not self._closed:
                self._closed = True
                out += line(self._object("", done=True, reason=choice["finish_reason"]))
        return out

    def _join(self, pieces: list[dict[str, Any]]) -> None:
        for piece in pieces:
            fn = piece.get("function") or {}
            if "id" in piece:  # a call's head: its id and name
                self._calls.append({"id": piece["id"], "name": fn.get("name", ""),
                                    "arguments": ""})
            elif self._calls:
                self._calls[-1]["arguments"] += fn.get("arguments", "")

    def _flush(self) -> bytes:
        """The calls joined so far, in one line: each whole, its arguments an object."""
        if not self._calls:
            return b""
        calls = [{"id": c["id"], "function": {"index": i, "name": c["name"],
                                              "arguments": arguments(c["arguments"])}}
                 for i, c in enumerate(self._calls)]
        self._calls = []
        return line(self._object("", calls=calls))

    def failed(self, err: ApiError) -> bytes:
        return self._flush() + line({"error": error_text(err)})

    def end(self) -> bytes:
        return b""
