"""Anthropic Messages answers, from what the chat completions core renders.

Whole: a `message` object with content blocks (thinking, text, tool_use), `stop_reason` and
usage. Streamed: Anthropic's named server-sent events in their order: `message_start`, `ping`,
then for each block `content_block_start`, its deltas (`text_delta`, `thinking_delta`,
`input_json_delta`; a thinking block's `signature_delta` last), `content_block_stop`; then
`message_delta` (stop_reason, usage) and `message_stop`. An error after the stream began is an
`error` event, which ends the stream.

A thinking block's signature seals its text (exod.api.seal): sent back with the text left
out, as `thinking.display: omitted` returns it (no `thinking_delta`), it gives the text back.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from exod.wire import messages as m
from exod.api import sse
from exod.api.dialects.anthropic_request import View, error_body
from exod.api.errors import ApiError
from exod.api.seal import Sealer

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def event(name: str, data: dict[str, Any]) -> bytes:
    return sse.frame({"type": name, **data}, name)


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic's counts: `input_tokens` are the prompt's tokens not read from the cache, so
    that the prompt is `input_tokens + cache_read_input_tokens` (+ the creation count, always
    0 here). Claude Code adds them up to know how full the context window is, and compacts by
    it: a cached token counted twice would make it compact at half the window."""
    u = chat_usage or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    prompt = u.get("prompt_tokens", 0)
    return {"input_tokens": max(prompt - cached, 0), "output_tokens":
            u.get("completion_tokens", 0), "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is (the core only returns calls
    whose arguments parsed; anything else is kept whole rather than lost)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


class AnthropicOutput:
    stream_headers = sse.HEADERS

    def __init__(self, model: str, view: View | None = None,
                 sealer: Sealer | None = None) -> None:
        self.model = model
        self.view = view or View()
        self.sealer = sealer
        self.id = f"msg_{secrets.token_hex(12)}"
        self.prompt_tokens = 0
        self.stop_sequence: str | None = None
        self.applied: list[dict[str, Any]] = []
        self._thought = ""  # the open thinking block's text, for its signature
        self._stopped_by_sequence = False
        self._block: tuple[str, int] | None = None  # (kind, tool index) of the open block
        self._index = -1
        self._finish: str | None = None
        self._over = False  # message_delta (or an error event) was sent: nothing more but stop
        self._failed = False  # an error event ends an Anthropic stream: no message_stop after

    def seen(self, ev: m.Event) -> None:
        if isinstance(ev, m.Prefill) and ev.total:
            self.prompt_tokens = ev.total
        elif isinstance(ev, m.Done):
            self.stop_sequence = ev.stop_sequence
            self.applied = ev.applied_edits

    def _signature(self, text: str) -> str:
        return self.sealer.seal(text) if self.sealer is not None else ""

    def _managed(self) -> dict[str, Any]:
        """`context_management`, when the request asked for it."""
        return {"context_management": {"applied_edits": self.applied}} if self.view.edits \
            else {}

    def _stop_reason(self, finish: str | None) -> str:
        if finish == "stop" and self.stop_sequence is not None:
            return "stop_sequence"
        return STOP_REASONS.get(finish or "stop", "end_turn")

    # ---- whole ---------------------------------------------------------------------------
    def whole(self, obj: dict[str, Any]) -> dict[str, Any]:
        choice = obj["choices"][0]
        msg = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        if msg.get("reasoning_content"):
            text = msg["reasoning_content"]
            content.append({"type": "thinking", "signature": self._signature(text),
                            "thinking": "" if self.view.omit_thinking else text})
        if msg.get("content"):
            content.append({"type": "text", "text": msg["content"]})
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            content.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                            "input": tool_input(fn.get("arguments", ""))})
        reason = self._stop_reason(choice.get("finish_reason"))
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason,
                "stop_sequence": self.stop_sequence if reason == "stop_sequence" else None,
                "usage": usage(obj.get("usage")), **self._managed()}

    # ---- streamed ------------------------------------------------------------------------
    def begin(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
        return event("message_start", {"message": message}) + event("ping", {})

    def chunk(self, obj: dict[str, Any]) -> bytes:
        out = b""
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._open("thinking")
                self._thought += delta["reasoning_content"]
                if not self.view.omit_thinking:
                    out += self._delta({"type": "thinking_delta",
                                        "thinking": delta["reasoning_content"]})
            if delta.get("content"):
                out += self._open("text") + self._delta(
                    {"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                out += self._tool_piece(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        if obj.get("usage"):
            out += self._close() + self._finished(obj["usage"])
        return out

    def _tool_piece(self, call: dict[str, Any]) -> bytes:
        fn = call.get("function") or {}
        out = b""
        index = int(call.get("index", 0))
        if self._block != ("tool_use", index):
            out += self._close()
            self._index += 1
            self._block = ("tool_use", index)
            out += event("content_block_start", {"index": self._index, "content_block": {
                "type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": {}}})
        if fn.get("arguments"):
            out += self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]})
        return out

    def _open(self, kind: str) -> bytes:
        if self._block is not None and self._block[0] == kind:
            return b""
        out = self._close()
        self._index += 1
        self._block = (kind, 0)
        block: dict[str, Any] = {"type": "text", "text": ""} if kind == "text" else \
            {"type": "thinking", "thinking": "", "signature": ""}
        return out + event("content_block_start", {"index": self._index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"index": self._index, "delta": delta})

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        # A thinking block ends with its signature, as Anthropic's do.
        out = b""
        if self._block[0] == "thinking":
            out = self._delta({"type": "signature_delta",
                               "signature": self._signature(self._thought)})
            self._thought = ""
        self._block = None
        return out + event("content_block_stop", {"index": self._index})

    def _finished(self, chat_usage: dict[str, Any] | None) -> bytes:
        self._over = True
        reason = self._stop_reason(self._finish)
        delta = {"stop_reason": reason,
                 "stop_sequence": self.stop_sequence if reason == "stop_sequence" else None}
        return event("message_delta", {"delta": delta, "usage": usage(chat_usage),
                                       **self._managed()})

    def failed(self, err: ApiError) -> bytes:
        self._over = True
        self._failed = True
        return self._close() + event("error", {"error": error_body(err)["error"]})

    def end(self) -> bytes:
        if self._failed:
            return b""
        tail = b"" if self._over else self._close() + self._finished(None)
        return tail + event("message_stop", {})


class CountOutput:
    """`/v1/messages/count_tokens`: the prompt's exact length after the chat template, from a
    request the runner reads (template, tokens, checks) and answers without generating; with
    the length before its context edits, when one applied."""

    stream_headers = sse.HEADERS

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def seen(self, ev: m.Event) -> None:
        if isinstance(ev, m.Done):
            self.applied = ev.applied_edits

    def whole(self, obj: dict[str, Any]) -> dict[str, Any]:
        n = obj["usage"]["prompt_tokens"]
        if not self.applied:
            return {"input_tokens": n}
        before = n + sum(e.get("cleared_input_tokens", 0) for e in self.applied)
        return {"input_tokens": n, "context_management": {"original_input_tokens": before}}

    # A count is never streamed (its request has no `stream`): nothing below is called.
    def begin(self) -> bytes:
        return b""

    def chunk(self, obj: dict[str, Any]) -> bytes:
        return b""

    def failed(self, err: ApiError) -> bytes:
        return b""

    def end(self) -> bytes:
        return b""
