"""Tool calls as OpenAI returns them: `message.tool_calls` (ids, `function.arguments` as JSON
text) in a whole response, and `delta.tool_calls` when streaming: a call's index, id and name
first, then its arguments in pieces, which a client joins by index."""

from __future__ import annotations

import secrets
from typing import Any

from exod.wire import messages as m

ARGUMENT_PIECE = 64  # characters of arguments per streamed chunk


def call_id(ev: m.ToolCall | None = None) -> str:
    """The call's id: the runner's where the model's format shapes ids (Mistral's nine
    letters and digits, which its template demands back), else one of OpenAI's shape."""
    if ev is not None and ev.call_id:
        return ev.call_id
    return f"call_{secrets.token_hex(12)}"


def whole_call(ev: m.ToolCall) -> dict[str, Any]:
    return {"id": call_id(ev), "type": "function",
            "function": {"name": ev.name, "arguments": ev.arguments}}


def streamed_call(ev: m.ToolCall, index: int) -> list[list[dict[str, Any]]]:
    """The `delta.tool_calls` of each chunk that carries call number `index`."""
    head = [{"index": index, "id": call_id(ev), "type": "function",
             "function": {"name": ev.name, "arguments": ""}}]
    args = ev.arguments
    return [head] + [[{"index": index, "function": {"arguments": args[i:i + ARGUMENT_PIECE]}}]
                     for i in range(0, len(args), ARGUMENT_PIECE)]
