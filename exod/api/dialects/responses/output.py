"""OpenAI Responses answers, from the typed answer (exod.api.reply).

Whole: a `response` object whose `output` holds items in the order they were generated:
`reasoning` (thinking text), `message` (with an `output_text` part), `function_call`s.
Streamed: `response.created`, `response.in_progress`, then for each item
`response.output_item.added`, its part (`response.content_part.added`, for a message or a
reasoning item) and deltas (`response.output_text.delta`, `response.reasoning_text.delta`,
`response.function_call_arguments.delta`), their `...done` events and
`response.output_item.done`; last `response.completed` (or `response.incomplete` when
max_output_tokens cut it short, or `error` then `response.failed` when the generation failed).
Every event carries a `sequence_number`. A call to a namespace's function comes back with
`name` and `namespace` apart (Codex's router joins them). With `include:
["reasoning.encrypted_content"]`, a reasoning item carries `encrypted_content`, its text sealed
(exod.api.seal), which the next turn may send back instead of the text.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from exod.wire import messages as m
from exod.api import sse
from exod.api.dialects.responses.request import ResponsesView
from exod.api.errors import ApiError
from exod.api.reply import Call, Called, Delta, Finished, Reply, Usage
from exod.api.seal import Sealer
from exod.api.stop_reasons import StopReason, wording
from exod.api.window_errors import CODE as CONTEXT_EXCEEDED


class _Item:
    """One output item being built: a message, a reasoning item or a function call."""

    def __init__(self, kind: str, index: int, call: Call | None = None,
                 seal: Callable[[str], str] | None = None,
                 namespaced: tuple[str, str] | None = None) -> None:
        self.kind = kind
        self.index = index
        prefix = {"function_call": "fc", "reasoning": "rs", "message": "msg"}[kind]  # OpenAI's
        self.id = f"{prefix}_{secrets.token_hex(12)}"
        self.text = ""
        self.call = call
        self.seal = seal  # a reasoning item's encrypted_content, when asked for
        self.namespaced = namespaced  # (namespace, name) of a namespace's function

    def json(self, done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        if self.kind == "message":
            parts = [{"type": "output_text", "text": self.text, "annotations": [],
                      "logprobs": []}] if done else []
            return {"id": self.id, "type": "message", "status": status, "role": "assistant",
                    "content": parts}
        if self.kind == "reasoning":
            content = [{"type": "reasoning_text", "text": self.text}] if done else []
            out: dict[str, Any] = {"id": self.id, "type": "reasoning", "summary": [],
                                   "content": content, "status": status}
            if self.seal is not None:
                out["encrypted_content"] = self.seal(self.text) if done else None
            return out
        return {"id": self.id, "type": "function_call", "status": status,
                "call_id": self.call_id, "name": self.name,
                **({"namespace": self.namespaced[0]} if self.namespaced else {}),
                "arguments": self.text if done else ""}

    @property
    def call_id(self) -> str:
        return self.call.id if self.call is not None and self.call.id else self.id

    @property
    def name(self) -> str:
        """A call's function as the client named it: a namespace's apart from its name."""
        if self.namespaced is not None:
            return self.namespaced[1]
        return self.call.name if self.call is not None else ""


def _part(item: _Item, text: str) -> dict[str, Any]:
    if item.kind == "message":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


class ResponsesOutput:
    stream_headers = sse.HEADERS

    def __init__(self, model: str, body: dict[str, Any], view: ResponsesView | None = None,
                 sealer: Sealer | None = None) -> None:
        self.model = model
        self.body = body
        self.view = view or ResponsesView()
        self.seal = sealer.seal if sealer is not None and self.view.encrypted else None
        self.id = f"resp_{secrets.token_hex(12)}"
        self.created = int(time.time())
        self._seq = 0
        self._items: list[_Item] = []
        self._open: _Item | None = None
        self._tool_items: dict[int, _Item] = {}

    def seen(self, ev: m.Event) -> None:
        pass

    # ---- the response object ---------------------------------------------------------------
    def _response(self, status: str, usage: Usage | None,
                  stop: StopReason | None = None) -> dict[str, Any]:
        # The request's fields as it sent them: each passed its rule, or is ECHOED (plain JSON).
        b = self.body
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": [i.json(True) for i in self._items]
            if status != "in_progress" else [],
            "error": None, "incomplete_details": {"reason": wording(stop).incomplete}
            if status == "incomplete" else None,
            "instructions": b.get("instructions"), "metadata": b.get("metadata") or {},
            "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "temperature": b.get("temperature"), "top_p": b.get("top_p"),
            "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
            "max_output_tokens": b.get("max_output_tokens"), "previous_response_id": None,
            "reasoning": b.get("reasoning"), "store": False,
            "text": b.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
            "usage": None}
        if usage is not None:
            out["usage"] = {
                "input_tokens": usage.prompt,
                "input_tokens_details": {"cached_tokens": usage.cached},
                "output_tokens": usage.completion,
                "output_tokens_details": {"reasoning_tokens": usage.reasoning},
                "total_tokens": usage.prompt + usage.completion}
        return out

    def _ended(self, end: Finished) -> dict[str, Any]:
        return self._response(wording(end.stop).responses, end.usage, end.stop)

    # ---- whole -----------------------------------------------------------------------------
    def whole(self, reply: Reply) -> dict[str, Any]:
        if reply.reasoning:
            self._new("reasoning").text = reply.reasoning
        if reply.text:
            self._new("message").text = reply.text
        for call in reply.calls:
            self._new("function_call", call).text = call.arguments
        return self._ended(reply.finished)

    def _new(self, kind: str, call: Call | None = None) -> _Item:
        item = _Item(kind, len(self._items), call, self.seal if kind == "reasoning" else None,
                     self.view.namespaces.get(call.name) if call is not None else None)
        self._items.append(item)
        return item

    # ---- streamed --------------------------------------------------------------------------
    def _event(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._seq, **data}
        self._seq += 1
        return sse.frame(body, kind)

    def begin(self) -> bytes:
        started = self._response("in_progress", None)
        return self._event("response.created", response=started) + \
            self._event("response.in_progress", response=started)

    def delta(self, d: Delta) -> bytes:
        if isinstance(d, Called):
            return self._call(d.index, d.call)
        if isinstance(d, Finished):
            kind = f"response.{wording(d.stop).responses}"  # completed, or incomplete
            return self._close() + self._event(kind, response=self._ended(d))
        out = b""
        if d.reasoning:
            out += self._text("reasoning", d.reasoning)
        if d.text:
            out += self._text("message", d.text)
        return out

    def _start(self, item: _Item) -> bytes:
        out = self._close()
        self._open = item
        out += self._event("response.output_item.added", output_index=item.index,
                           item=item.json(False))
        if item.kind != "function_call":
            out += self._event("response.content_part.added", item_id=item.id,
                               output_index=item.index, content_index=0, part=_part(item, ""))
        return out

    def _text(self, kind: str, piece: str) -> bytes:
        out = b""
        if self._open is None or self._open.kind != kind:
            out += self._start(self._new(kind))
        item = self._open
        assert item is not None
        item.text += piece
        name = "response.output_text.delta" if kind == "message" else \
            "response.reasoning_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        return out + self._event(name, item_id=item.id, output_index=item.index,
                                 content_index=0, delta=piece, **extra)

    def _call(self, index: int, call: Call) -> bytes:
        """A function_call item: added, then its arguments in pieces."""
        item = self._tool_items[index] = self._new("function_call", call)
        out = self._start(item)
        for piece in call.pieces():
            item.text += piece
            out += self._event("response.function_call_arguments.delta", item_id=item.id,
                               output_index=item.index, delta=piece)
        return out

    def _close(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        out = b""
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "message":
            part = {"type": "output_text", "text": item.text, "annotations": [], "logprobs": []}
            out += self._event("response.output_text.done", **where, content_index=0,
                               text=item.text, logprobs=[])
            out += self._event("response.content_part.done", **where, content_index=0,
                               part=part)
        elif item.kind == "reasoning":
            out += self._event("response.reasoning_text.done", **where, content_index=0,
                               text=item.text)
            out += self._event("response.content_part.done", **where, content_index=0,
                               part=_part(item, item.text))
        else:
            out += self._event("response.function_call_arguments.done", **where,
                               name=item.name, arguments=item.text)
        return out + self._event("response.output_item.done", output_index=item.index,
                                 item=item.json(True))

    def failed(self, err: ApiError) -> bytes:
        """OpenAI's two events for a failure: `error` (exod's code, which the SDK's stream
        yields) and `response.failed`, the response's last event (its `error` in OpenAI's
        codes, with the items finished so far), which agents such as Codex read."""
        out = self._close() + self._event("error", code=err.code, message=err.message,
                                          param=err.param)
        response = self._response("failed", None)
        code = "rate_limit_exceeded" if err.status == 429 else "server_error"
        if err.code == CONTEXT_EXCEEDED:  # Codex's own message for it
            code = CONTEXT_EXCEEDED
        response["error"] = {"code": code, "message": err.message}
        return out + self._event("response.failed", response=response)

    def end(self) -> bytes:
        return b""  # response.completed (or response.failed) already ended the stream
