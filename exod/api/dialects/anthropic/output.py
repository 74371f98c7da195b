"""Anthropic Messages answers, from the typed answer (exod.api.reply).

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
from exod.api.dialects.anthropic.request import AnthropicView, error_body
from exod.api.errors import ApiError
from exod.api.reply import Call, Called, Delta, Finished, Piece, Reply, Usage
from exod.api.seal import Sealer
from exod.api.stop_reasons import StopReason, wording


def event(name: str, data: dict[str, Any]) -> bytes:
    return sse.frame({"type": name, **data}, name)


def usage(u: Usage | None) -> dict[str, Any]:
    """Anthropic's counts: `input_tokens` are the prompt's tokens not read from the cache, so
    that the prompt is `input_tokens + cache_read_input_tokens` (+ the creation count, always
    0 here). Claude Code adds them up to know how full the context window is, and compacts by
    it: a cached token counted twice would make it compact at half the window."""
    u = u or Usage(0, 0)
    return {"input_tokens": max(u.prompt - u.cached, 0), "output_tokens": u.completion,
            "cache_read_input_tokens": u.cached, "cache_creation_input_tokens": 0}


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

    def __init__(self, model: str, view: AnthropicView | None = None,
                 sealer: Sealer | None = None) -> None:
        self.model = model
        self.view = view or AnthropicView()
        self.sealer = sealer
        self.id = f"msg_{secrets.token_hex(12)}"
        self.prompt_tokens = 0
        self._thought = ""  # the open thinking block's text, for its signature
        self._block: tuple[str, int] | None = None  # (kind, tool index) of the open block
        self._index = -1
        self._over = False  # message_delta (or an error event) was sent: nothing more but stop
        self._failed = False  # an error event ends an Anthropic stream: no message_stop after

    def seen(self, ev: m.Event) -> None:
        if isinstance(ev, m.Prefill) and ev.total:
            self.prompt_tokens = ev.total

    def _signature(self, text: str) -> str:
        return self.sealer.seal(text) if self.sealer is not None else ""

    def _managed(self, end: Finished | None) -> dict[str, Any]:
        """`context_management`, when the request asked for it."""
        applied = list(end.applied_edits) if end is not None else []
        return {"context_management": {"applied_edits": applied}} if self.view.edits else {}

    @staticmethod
    def _stop(end: Finished | None) -> dict[str, Any]:
        stop = end.stop if end is not None else None
        sequence = (end.stop_sequence if end is not None and stop is StopReason.STOP_SEQUENCE
                    else None)
        return {"stop_reason": wording(stop).anthropic, "stop_sequence": sequence}

    # ---- whole ---------------------------------------------------------------------------
    def whole(self, reply: Reply) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if reply.reasoning:
            text = reply.reasoning
            content.append({"type": "thinking", "signature": self._signature(text),
                            "thinking": "" if self.view.omit_thinking else text})
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for call in reply.calls:
            content.append({"type": "tool_use", "id": call.id, "name": call.name,
                            "input": tool_input(call.arguments)})
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, **self._stop(reply.finished), "usage": usage(reply.usage),
                **self._managed(reply.finished)}

    # ---- streamed ------------------------------------------------------------------------
    def begin(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
        return event("message_start", {"message": message}) + event("ping", {})

    def delta(self, d: Delta) -> bytes:
        if isinstance(d, Called):
            return self._tool_use(d.index, d.call)
        if isinstance(d, Finished):
            return self._close() + self._finished(d)
        return self._piece(d)

    def _piece(self, d: Piece) -> bytes:
        out = b""
        if d.reasoning:
            out += self._open("thinking")
            self._thought += d.reasoning
            if not self.view.omit_thinking:
                out += self._delta({"type": "thinking_delta", "thinking": d.reasoning})
        if d.text:
            out += self._open("text") + self._delta({"type": "text_delta", "text": d.text})
        return out

    def _tool_use(self, index: int, call: Call) -> bytes:
        """A tool_use block: its id and name first, then its arguments in pieces."""
        out = self._close()
        self._index += 1
        self._block = ("tool_use", index)
        out += event("content_block_start", {"index": self._index, "content_block": {
            "type": "tool_use", "id": call.id, "name": call.name, "input": {}}})
        for piece in call.pieces():
            out += self._delta({"type": "input_json_delta", "partial_json": piece})
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

    def _finished(self, end: Finished | None) -> bytes:
        self._over = True
        return event("message_delta", {"delta": self._stop(end),
                                       "usage": usage(end.usage if end else None),
                                       **self._managed(end)})

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

    def seen(self, ev: m.Event) -> None:
        pass

    def whole(self, reply: Reply) -> dict[str, Any]:
        n = reply.usage.prompt
        applied = reply.finished.applied_edits
        if not applied:
            return {"input_tokens": n}
        before = n + sum(e.get("cleared_input_tokens", 0) for e in applied)
        return {"input_tokens": n, "context_management": {"original_input_tokens": before}}

    # A count is never streamed (its request has no `stream`): nothing below is called.
    def begin(self) -> bytes:
        return b""

    def delta(self, d: Delta) -> bytes:
        return b""

    def failed(self, err: ApiError) -> bytes:
        return b""

    def end(self) -> bytes:
        return b""
