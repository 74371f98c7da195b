"""The response objects of the OpenAI API (chat completion, chat completion chunk, text
completion), from the typed answer (exod.api.reply); exod.api.sse frames them as events. Tool
calls as OpenAI returns them: `message.tool_calls` (ids, `function.arguments` as JSON text) in
a whole response, and `delta.tool_calls` when streaming: a call's index, id and name first,
then its arguments in pieces, which a client joins by index.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from exod import __version__
from exod.wire import messages as m
from exod.api.reply import Call, Reply, Usage
from exod.api.stop_reasons import wording

FINGERPRINT = f"exod-{__version__}"


def usage(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt, "completion_tokens": u.completion,
            "total_tokens": u.prompt + u.completion,
            "prompt_tokens_details": {"cached_tokens": u.cached},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning}}


def whole_call(call: Call) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def streamed_call(call: Call, index: int) -> list[list[dict[str, Any]]]:
    """The `delta.tool_calls` of each chunk that carries call number `index`."""
    head = [{"index": index, "id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": ""}}]
    return [head] + [[{"index": index, "function": {"arguments": piece}}]
                     for piece in call.pieces()]


def _entry(e: m.TokenLogprob) -> dict[str, Any]:
    return {"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
            "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes}
                             for t in e.top]}


@dataclass
class ChatObjects:
    """Builds every object of one response: all share the id, `created` and model.
    `logprobs`: the request asked for them (chat: `logprobs: true`; completions: `logprobs: N`),
    so each choice carries them, in the endpoint's own shape."""

    kind: str  # "chat" | "completion"
    model: str
    include_usage: bool = False
    logprobs: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    _offset: int = 0  # characters of text sent so far (the legacy shape's text_offset)

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
        self.id = self.id or f"{prefix}-{secrets.token_hex(12)}"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}

    def _logprobs(self, entries: Sequence[m.TokenLogprob] | None) -> dict[str, Any] | None:
        if not self.logprobs or entries is None:
            return None
        if self.kind == "chat":
            return {"content": [_entry(e) for e in entries], "refusal": None}
        offsets = []
        for e in entries:  # where each token starts in the text (its own text, as sent)
            offsets.append(self._offset)
            self._offset += len(e.token)
        return {"tokens": [e.token for e in entries],
                "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{t.token: t.logprob for t in e.top} for e in entries],
                "text_offset": offsets}

    # ---- streaming ------------------------------------------------------------------------
    def chunk(self, text: str | None = None, finish_reason: str | None = None,
              role: bool = False, tool_calls: list[dict[str, Any]] | None = None,
              reasoning: str = "", logprobs: Sequence[m.TokenLogprob] | None = None
              ) -> dict[str, Any]:
        """One chunk carrying a piece of text (and of reasoning, and the logprobs of its
        tokens), the role (first chunk), a piece of tool calls (`streamed_call`), or the
        finish reason."""
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
                delta["content"] = ""
            if text is not None:
                delta["content"] = text
            if tool_calls is not None:
                delta["tool_calls"] = tool_calls
            if reasoning:
                delta["reasoning_content"] = reasoning
            choice: dict[str, Any] = {"index": 0, "delta": delta,
                                      "logprobs": self._logprobs(logprobs),
                                      "finish_reason": finish_reason}
            out = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": self._logprobs(logprobs),
                      "finish_reason": finish_reason}
            out = self._head("text_completion")
        out["choices"] = [choice]
        if self.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, u: Usage) -> dict[str, Any]:
        """The extra last chunk of `stream_options.include_usage`: no choices, the usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(u)}

    # ---- whole ----------------------------------------------------------------------------
    def whole(self, reply: Reply) -> dict[str, Any]:
        finish_reason = wording(reply.stop).openai
        text = reply.text
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
            if reply.calls:  # as OpenAI: no content beside calls is null, not ""
                message["tool_calls"] = [whole_call(c) for c in reply.calls]
                message["content"] = text or None
            if reply.reasoning:
                message["reasoning_content"] = reply.reasoning
            choice: dict[str, Any] = {"index": 0, "message": message,
                                      "logprobs": self._logprobs(reply.logprobs),
                                      "finish_reason": finish_reason}
            out = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": self._logprobs(reply.logprobs),
                      "finish_reason": finish_reason}
            out = self._head("text_completion")
        out["choices"] = [choice]
        out["usage"] = usage(reply.usage)
        return out
