"""OpenAI Responses requests (`POST /v1/responses`, stateless) as chat completions bodies,
which exod.api.schema then checks like any other.

exod keeps no responses: `store: true`, `previous_response_id`, `conversation` and item
references are refused with the reason, as are OpenAI's built-in tools. A field either maps
onto the chat request or is refused by name; `NO_EFFECT` lists the few that cannot change an
answer here (README).
"""

from __future__ import annotations

from typing import Any

from exod.api.dialects import keys, names
from exod.api.errors import ApiError, bad_request

NO_EFFECT = ("metadata", "user", "safety_identifier", "prompt_cache_key",
             "prompt_cache_retention", "prompt_cache_options", "service_tier", "stream_options")
MAPPED = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
          "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning", "stream",
          "store", "previous_response_id", "conversation", "background", "include",
          "truncation")
STATELESS = "exod's Responses API is stateless: it keeps no responses"
# A local chat template has one thinking switch (`enable_thinking`), not a scale of effort.
EFFORT_THINKS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True,
                 "xhigh": True}
# OpenAI's summary settings: exod writes no summary (the reasoning is returned whole as the
# item's content) whichever a client asks for, so only OpenAI's own values pass.
SUMMARIES = (None, "auto", "concise", "detailed")
# Asked for by agents that replay reasoning between turns; exod returns reasoning as text.
INCLUDE_NO_EFFECT = ("reasoning.encrypted_content",)


def to_chat(body: Any, origins: list[names.Origin] | None = None) -> dict[str, Any]:
    """The chat completions body of a Responses request; `origins`, when given, is filled with
    the Responses parameter each chat message came from."""
    origins = [] if origins is None else origins
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for key in body:
        if key not in MAPPED + NO_EFFECT:
            raise bad_request(f"`{key}` is not supported by exod's Responses API", key)
    _stateless(body)
    chat: dict[str, Any] = {"model": body.get("model")}
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise bad_request("`instructions` must be a string", "instructions")
        messages.append({"role": "system", "content": body["instructions"]})
        origins.append(("instructions", False))
    messages += _input(body.get("input"), origins)
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stream") is not None:
        chat["stream"] = body["stream"]
        if body["stream"] is True:  # response.completed carries the usage
            chat["stream_options"] = {"include_usage": True}
    _tools(body, chat)
    _text(body.get("text"), chat)
    _reasoning(body.get("reasoning"), chat)
    return chat


def _stateless(body: dict[str, Any]) -> None:
    if body.get("store") is True:
        raise bad_request(f"`store: true` is not supported: {STATELESS} (send `store: false` "
                          "and the whole conversation in `input`)", "store")
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise bad_request(f"`{key}` is not supported: {STATELESS} (send the whole "
                              "conversation in `input`)", key)
    if body.get("background") is True:
        raise bad_request("`background: true` is not supported: responses are answered on "
                          "the request's own connection", "background")
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list):
            raise bad_request("`include` must be an array", "include")
        for i, item in enumerate(include):
            if item not in INCLUDE_NO_EFFECT:
                raise bad_request(f"`include[{i}]` {item!r} is not supported", f"include[{i}]")
    if body.get("truncation") not in (None, "disabled"):
        raise bad_request("`truncation` must be disabled: exod never drops part of the "
                          "conversation; a prompt beyond the context window is refused",
                          "truncation")


# Keys of input items that cannot change the answer: what exod's own output items carry, which
# clients send back unchanged (`id`, `status`, a message's `phase` label), caching hints, empty
# echoes, a call made directly by the model; and reasoning OpenAI encrypted, which no local
# model can read (as Anthropic's redacted thinking).
ITEM_KEYS = {"message": ("type", "role", "content"),
             "function_call": ("type", "call_id", "name", "arguments"),
             "function_call_output": ("type", "call_id", "output", "name"),
             "reasoning": ("type", "summary", "content")}
ITEM_HARMLESS: dict[str, keys.Harmless] = {
    "id": keys.anything, "status": keys.anything, "phase": keys.anything,
    "caller": keys.direct, "namespace": keys.empty, "encrypted_content": keys.anything}
PART_KEYS = {"input_text": ("type", "text"), "output_text": ("type", "text")}
PART_HARMLESS: dict[str, keys.Harmless] = {
    "prompt_cache_breakpoint": keys.anything, "annotations": keys.empty,
    "logprobs": keys.anything}


def _input(value: Any, origins: list[names.Origin]) -> list[dict[str, Any]]:
    if isinstance(value, str):
        origins.append(("input", False))
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("`input` must be a string or a non-empty array of items", "input")
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []  # a reasoning item belongs to the assistant turn after it
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"`{param}` must be an object", param)
        kind = item.get("type", "message")
        if not isinstance(kind, str):  # a list or an object: no item type (and unhashable)
            raise bad_request(f"`{param}.type` must be a string", f"{param}.type")
        if kind in ITEM_KEYS:
            keys.check(item, param, ITEM_KEYS[kind], ITEM_HARMLESS)
        before = len(out)
        if kind == "message":
            msg = _message(item, param)
            if msg["role"] == "assistant" and reasoning:
                msg["reasoning_content"] = "".join(reasoning)
                reasoning = []
            out.append(msg)
            origins.append((param, True))
        elif kind == "function_call":
            _call(item, param, out, reasoning)
            reasoning = []
            origins += [(param, False)] * (len(out) - before)
        elif kind == "function_call_output":
            tool = {"role": "tool", "tool_call_id": _string(item, "call_id", param),
                    "content": _content(item.get("output"), f"{param}.output")}
            if item.get("name") is not None:
                tool["name"] = _string(item, "name", param)
            out.append(tool)
            origins.append((f"{param}.output", False))
        elif kind == "reasoning":
            reasoning += _reasoning_texts(item, param)
        elif kind == "item_reference":
            raise bad_request(f"`{param}.type` item_reference is not supported: {STATELESS}",
                              f"{param}.type")
        else:
            raise bad_request(f"`{param}.type` {kind!r} is not supported (message, "
                              "function_call, function_call_output and reasoning are)",
                              f"{param}.type")
    return out


def _reasoning_texts(item: dict[str, Any], param: str) -> list[str]:
    """A reasoning item's text: its `content` (what exod returns), else its `summary` (what
    OpenAI returns), which is the best account of the reasoning the client has."""
    found: dict[str, list[str]] = {}
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise bad_request(f"`{param}.{key}` must be an array", f"{param}.{key}")
        for j, part in enumerate(parts):
            where = f"{param}.{key}[{j}]"
            if not (isinstance(part, dict) and part.get("type") == part_type
                    and isinstance(part.get("text"), str)):
                raise bad_request(f"`{where}` must be a {part_type} part", where)
            keys.check(part, where, ("type", "text"))
            found.setdefault(key, []).append(part["text"])
    return found.get("content") or found.get("summary") or []


def _string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"`{param}.{key}` must be a string", f"{param}.{key}")
    return value


def _content(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"`{param}` must be a string or an array of text parts", param)
    parts = []
    for j, part in enumerate(value):
        if not (isinstance(part, dict) and part.get("type") in ("input_text", "output_text")
                and isinstance(part.get("text"), str)):
            raise bad_request(f"`{param}[{j}]`: only input_text and output_text parts are "
                              "supported (exod serves text models)", f"{param}[{j}]")
        keys.check(part, f"{param}[{j}]", PART_KEYS[part["type"]], PART_HARMLESS)
        parts.append(part["text"])
    return "".join(parts)


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise bad_request(f"`{param}.role` must be user, assistant, system or developer",
                          f"{param}.role")
    return {"role": role, "content": _content(item.get("content"), f"{param}.content")}


def _call(item: dict[str, Any], param: str, out: list[dict[str, Any]],
          reasoning: list[str]) -> None:
    """A function call joins the assistant turn just before it, or starts one."""
    call = {"id": _string(item, "call_id", param), "type": "function",
            "function": {"name": _string(item, "name", param),
                         "arguments": _string(item, "arguments", param)}}
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
        return
    turn: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
    if reasoning:
        turn["reasoning_content"] = "".join(reasoning)
    out.append(turn)


def _tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("`tools` must be an array of tools", "tools")
        chat["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is None:
        return
    if choice in ("none", "auto", "required"):
        chat["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        keys.check(choice, "tool_choice", ("type", "name"))
        chat["tool_choice"] = {"type": "function",
                               "function": {"name": _string(choice, "name", "tool_choice")}}
    else:
        raise bad_request("`tool_choice` must be none, auto, required or {type: function, "
                          "name}", "tool_choice")


def _tool(tool: Any, i: int) -> dict[str, Any]:
    param = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_request(f"`{param}` must be an object", param)
    kind = tool.get("type")
    if kind != "function":
        raise bad_request(f"`{param}.type` {kind!r}: OpenAI's built-in tools (web search, file "
                          "search, code interpreter, ...) are not available here; define a "
                          "function tool", f"{param}.type")
    keys.check(tool, param, ("type", "name", "description", "parameters", "strict"),
               {"defer_loading": keys.false})
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _text(text: Any, chat: dict[str, Any]) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise bad_request("`text` must be an object", "text")
    for key in text:
        if key not in ("format", "verbosity"):
            raise bad_request(f"`text.{key}` is not supported", f"text.{key}")
    if text.get("verbosity") not in (None, "medium"):
        raise bad_request("`text.verbosity` other than medium is not supported: a local model "
                          "has no verbosity setting", "text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return
    if isinstance(fmt, dict) and fmt.get("type") in ("text", "json_object"):
        keys.check(fmt, "text.format", ("type",))  # a schema beside them would be ignored
        if fmt["type"] == "json_object":
            chat["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        keys.check(fmt, "text.format", ("type", "name", "schema", "strict", "description"))
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    else:
        raise bad_request("`text.format.type` must be text, json_object or json_schema",
                          "text.format")


# Chat fields the core may name in an error, as this dialect calls them.
RENAMED = (("max_tokens", "max_output_tokens"), ("response_format.json_schema", "text.format"),
           ("response_format", "text.format"), ("chat_template_kwargs", "reasoning.effort"),
           ("tool_choice.function", "tool_choice"))


def renamed(e: ApiError, origins: list[names.Origin]) -> ApiError:
    return names.renamed(e, origins, RENAMED, "parameters")


def _reasoning(reasoning: Any, chat: dict[str, Any]) -> None:
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise bad_request("`reasoning` must be an object", "reasoning")
    for key in reasoning:
        if key not in ("effort", "summary", "generate_summary"):
            raise bad_request(f"`reasoning.{key}` is not supported", f"reasoning.{key}")
    for key in ("summary", "generate_summary"):  # exod returns the reasoning whole, as content
        if reasoning.get(key) not in SUMMARIES:
            raise bad_request(f"`reasoning.{key}` must be one of {', '.join(SUMMARIES[1:])}",
                              f"reasoning.{key}")
    effort = reasoning.get("effort")
    if effort is None:
        return
    if not isinstance(effort, str) or effort not in EFFORT_THINKS:  # a list: unhashable
        raise bad_request(f"`reasoning.effort` must be one of {', '.join(EFFORT_THINKS)}",
                          "reasoning.effort")
    chat["chat_template_kwargs"] = {"enable_thinking": EFFORT_THINKS[effort]}
