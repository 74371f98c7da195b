"""What a chat is generated from: its messages, as the chat template receives them (roles,
text, tool calls and their results, reasoning), and /v1/completions' prompt."""

from __future__ import annotations

import json
from typing import Any

from exod.core.request_rules.base import (RequestError, array, depth, name, obj, text,
                                          text_field)
from exod.core.request_rules.tools import MAX_TOOLS

ROLES = ("system", "developer", "user", "assistant", "tool")
# The keys of a message that reach the chat template. `reasoning_content` is an assistant's
# thinking, the key Qwen3's and DeepSeek's templates read (what they do with it is theirs: Qwen3
# shows only the thinking after the last user turn). Which other keys a dialect's messages may
# hold, and what becomes of them, is its field table (exod.api.dialects).
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")
CALL_KEYS = ("id", "function.name", "function.arguments")  # chat completions' spelling


def messages(raw: Any, param: str = "messages") -> list[Any]:
    return array(raw, param, nonempty=True, what="messages")


def message(raw: Any, param: str) -> dict[str, Any]:
    """A chat completions message as the template takes it (its keys checked by the dialect's
    table before)."""
    obj(raw, param)
    role = raw.get("role")
    if role not in ROLES:
        raise RequestError(f"`{param}.role` must be one of {', '.join(ROLES)}", f"{param}.role")
    # Chat templates know `system`; `developer` is OpenAI's newer name for it.
    return {"role": "system" if role == "developer" else role,
            "content": content(raw.get("content"), f"{param}.content"),
            **turn(raw, role, param)}


def content(raw: Any, param: str) -> str | list[dict[str, Any]]:
    """A message's text: a string, or an array of text parts (joined); or, as a dialect gives a
    content that shows pictures (exod.core.images.Pictures), its text and image parts."""
    if raw is None:
        return ""
    if isinstance(raw, list):
        if any(isinstance(part, dict) and part.get("type") == "image" for part in raw):
            return [_part(part, f"{param}[{j}]") for j, part in enumerate(raw)]
        parts = []
        for j, part in enumerate(raw):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise RequestError(f"`{param}[{j}]`: only text parts are supported", param)
            parts.append(part["text"])
        raw = "".join(parts)
    elif not isinstance(raw, str):
        raise RequestError(f"`{param}` must be a string or an array of text parts", param)
    return text(raw, param)


def _part(part: Any, param: str) -> dict[str, Any]:
    """A text or image part of a content that shows pictures."""
    if isinstance(part, dict) and part.get("type") == "text" and set(part) == {"type", "text"}:
        return {"type": "text", "text": text_field(part["text"], param)}
    if isinstance(part, dict) and part.get("type") == "image" and set(part) == {"type", "image"}:
        return part
    raise RequestError(f"`{param}`: not a text or image part", param)


def prompt(raw: Any) -> str:
    """/v1/completions' prompt: one string (or an array of one)."""
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if not isinstance(raw, str):
        raise RequestError("`prompt` must be a string (batches and token arrays are not "
                           "supported)", "prompt")
    text(raw, "prompt")
    if not raw:
        raise RequestError("`prompt` must not be empty", "prompt")
    return raw


def prompt_ids(ids: list[int], vocab: int, param: str) -> None:
    """The prompt as tokens: not empty, and every token must index the embedding table
    (`vocab` rows): a tokenizer may know more tokens (added ones) than the model has rows,
    and a client can spell them."""
    if not ids:
        raise RequestError("the prompt is empty", param)
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise RequestError(f"the prompt holds token id {bad[0]}, outside the model's vocabulary "
                           f"(ids 0 to {vocab - 1})", param)


def turn(raw: dict[str, Any], role: str, param: str) -> dict[str, Any]:
    """A message's structure, kept for the chat template: an assistant's `tool_calls` and
    `reasoning_content`, a tool message's `tool_call_id`, a `name`."""
    out: dict[str, Any] = {}
    if raw.get("tool_calls") is not None:
        calls = past_calls(raw["tool_calls"], role, f"{param}.tool_calls")
        if calls:  # an empty list (an echoed answer without calls) is no calls
            out["tool_calls"] = calls
    if raw.get("reasoning_content") not in (None, ""):
        out["reasoning_content"] = reasoning(raw["reasoning_content"], role,
                                             f"{param}.reasoning_content")
    call_id = raw.get("tool_call_id")
    if role == "tool" and not (isinstance(call_id, str) and call_id):
        raise RequestError(f"`{param}.tool_call_id` must name the call this message answers",
                           f"{param}.tool_call_id")
    if call_id is not None:
        if role != "tool":
            raise RequestError(f"`{param}.tool_call_id` belongs to a tool message",
                               f"{param}.tool_call_id")
        out["tool_call_id"] = text(call_id, f"{param}.tool_call_id")
    if raw.get("name") is not None:
        out["name"] = name(raw["name"], f"{param}.name")
    return out


def reasoning(raw: Any, role: str, param: str) -> str:
    """An assistant's thinking of an earlier turn, for templates that show it again."""
    if role != "assistant":
        raise RequestError(f"`{param}`: only an assistant message has reasoning", param)
    return text_field(raw, param)


def past_calls(raw: Any, role: str, param: str) -> list[dict[str, Any]]:
    if role != "assistant":
        raise RequestError(f"`{param}`: only an assistant message has tool calls", param)
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise RequestError(f"`{param}` must be an array of at most {MAX_TOOLS} calls", param)
    return [past_call(c, f"{param}[{i}]") for i, c in enumerate(raw)]


def past_call(raw: Any, param: str) -> dict[str, Any]:
    """A chat completions call made earlier (`{"type": "function", "function": {"name",
    "arguments"}}`), as templates take it."""
    f = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(f, dict) or raw.get("type", "function") != "function":
        raise RequestError(f'`{param}` must be {{"type": "function", "function": {{"name": '
                           '..., "arguments": ...}}}}', param)
    return call(raw.get("id"), f.get("name"), f.get("arguments", {}), param)


def call(ident: Any, fn: Any, arguments: Any, param: str,
         keys: tuple[str, str, str] = CALL_KEYS) -> dict[str, Any]:
    """A call made earlier, from its id, name and arguments (at `param` + `keys`, as the
    dialect spells them), as templates take it: arguments as an object (clients send them as
    JSON text, or as the object)."""
    id_at, name_at, args_at = (f"{param}.{k}" for k in keys)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            arguments = None
    if not isinstance(arguments, dict):
        raise RequestError(f"`{args_at}` must be a JSON object (as text or as is)", args_at)
    out = {"type": "function", "function": {"name": name(fn, name_at),
                                            "arguments": depth(arguments, args_at)}}
    if ident is not None and not isinstance(ident, str):
        raise RequestError(f"`{id_at}` must be a string", id_at)
    return {**out, "id": text(ident, id_at)} if ident else out
