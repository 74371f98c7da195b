"""Anthropic Messages requests (`POST /v1/messages`, `/v1/messages/count_tokens`) as chat
completions bodies, which exod.api.schema then checks like any other.

A field either maps onto the chat request or is refused by name. The few that cannot change
an answer here are accepted and have no effect (`NO_EFFECT`, listed in the README). Parameter
names in errors are Anthropic's (`messages[2].content[0].tool_use_id`), so a client sees the
field it sent.
"""

from __future__ import annotations

import json
from typing import Any

from exod.api.dialects import keys, names
from exod.api.errors import ApiError, bad_request

# Cannot change the answer of a local model: billing, routing and caching hints (exod's prompt
# cache is automatic), a caller's own labels.
NO_EFFECT = ("metadata", "cache_control", "service_tier", "inference_geo", "speed")
MAPPED = ("model", "messages", "max_tokens", "system", "stop_sequences", "stream",
          "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking", "output_config")
COUNT_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking",
                "output_config")
# Thinking and effort map onto the chat template's switch (`enable_thinking`): a local
# template has no effort scale, only on or off. `budget_tokens` goes to the runner apart
# (think_budget, which chat completions has no field for), where it bounds the reasoning.
EFFORT_THINKS = {"low": False, "medium": True, "high": True, "xhigh": True, "max": True}


def to_chat(body: Any, count_only: bool = False,
            origins: list[names.Origin] | None = None) -> dict[str, Any]:
    """The chat completions body of a Messages request (or of a count_tokens one); `origins`,
    when given, is filled with the Messages parameter each chat message came from."""
    origins = [] if origins is None else origins
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    allowed = COUNT_FIELDS if count_only else MAPPED + NO_EFFECT
    for key in body:
        if key not in allowed:
            raise bad_request(f"`{key}` is not supported by exod's Messages API", key)
    chat: dict[str, Any] = {"model": body.get("model")}
    messages = _system(body.get("system"))
    origins += [("system", False)] * len(messages)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("`messages` must be a non-empty array of messages", "messages")
    for i, msg in enumerate(raw):
        turn = _message(msg, i)
        messages += turn
        origins += [(f"messages[{i}]", True)] * len(turn)
    chat["messages"] = messages
    if not count_only:
        _generation_fields(body, chat)
    _tools(body, chat)
    _thinking(body, chat)
    return chat


def _generation_fields(body: dict[str, Any], chat: dict[str, Any]) -> None:
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise bad_request("`max_tokens` is required", "max_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens == 0:
        raise bad_request("`max_tokens` must be at least 1 (warming the prompt cache with 0 is "
                          "not supported)", "max_tokens")
    chat["max_tokens"] = max_tokens
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stream") is not None:
        chat["stream"] = body["stream"]
        if body["stream"] is True:  # the usage of message_delta comes from the usage chunk
            chat["stream_options"] = {"include_usage": True}


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    return [{"role": "system", "content": _texts(system, "system")}]


def _texts(blocks: Any, param: str) -> str:
    """Text blocks (the only kind a system prompt or a tool result may hold here) as text."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad_request(f"`{param}` must be a string or an array of text blocks", param)
    out = []
    for j, block in enumerate(blocks):
        if not (isinstance(block, dict) and block.get("type") == "text"
                and isinstance(block.get("text"), str)):
            raise bad_request(f"`{param}[{j}]`: only text blocks are supported here",
                              f"{param}[{j}]")
        keys.check(block, f"{param}[{j}]", BLOCK_KEYS["text"], BLOCK_HARMLESS)
        out.append(block["text"])
    return "\n\n".join(out) if param == "system" else "".join(out)


def _message(msg: Any, i: int) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: a user turn's tool results become `tool` messages
    (first, as chat templates expect them right after the assistant's calls)."""
    param = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise bad_request(f"`{param}` must be an object", param)
    keys.check(msg, param, ("role", "content"))
    role = msg.get("role")
    if role not in ("user", "assistant", "system"):
        raise bad_request(f"`{param}.role` must be user, assistant or system", f"{param}.role")
    content = msg.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"`{param}.content` must be a string or an array of content blocks",
                          f"{param}.content")
    if role == "system":
        return [{"role": "system", "content": _texts(content, f"{param}.content")}]
    if role == "assistant":
        return [_assistant(content, param)]
    return _user(content, param)


# The keys of each content block exod reads, and those it accepts without use: the caching
# hint Claude Code sends on blocks (exod's prompt cache needs none), empty echoes of what the
# answer held, a call made directly by the model (no programmatic caller here).
BLOCK_KEYS = {"text": ("type", "text"), "tool_use": ("type", "id", "name", "input"),
              "tool_result": ("type", "tool_use_id", "content", "is_error"),
              "thinking": ("type", "thinking", "signature"),
              "redacted_thinking": ("type", "data")}
BLOCK_HARMLESS: dict[str, keys.Harmless] = {
    "cache_control": keys.anything, "citations": keys.empty, "caller": keys.direct,
    "toolset_name": keys.empty}


def _block(block: Any, param: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise bad_request(f"`{param}` must be a content block with a `type`", param)
    works = BLOCK_KEYS.get(block["type"])
    if works is not None:
        keys.check(block, param, works, BLOCK_HARMLESS)
    return block["type"], block


def _string(block: dict[str, Any], key: str, param: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise bad_request(f"`{param}.{key}` must be a string", f"{param}.{key}")
    return value


def _user(content: list[Any], param: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, raw in enumerate(content):
        where = f"{param}.content[{j}]"
        kind, block = _block(raw, where)
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "tool_result":
            text = _texts(block.get("content", ""), f"{where}.content")
            if block.get("is_error") not in (None, True, False):
                raise bad_request(f"`{where}.is_error` must be a boolean", f"{where}.is_error")
            if block.get("is_error") is True:
                text = f"Error: {text}"
            results.append({"role": "tool", "content": text,
                            "tool_call_id": _string(block, "tool_use_id", where)})
        else:
            raise bad_request(f"`{where}.type` {kind!r} is not supported (exod serves text "
                              "models: text and tool_result blocks)", f"{where}.type")
    return results + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def _assistant(content: list[Any], param: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, raw in enumerate(content):
        where = f"{param}.content[{j}]"
        kind, block = _block(raw, where)
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "thinking":
            thinking.append(_string(block, "thinking", where))
        elif kind == "redacted_thinking":
            continue  # Anthropic's encrypted thinking: no text a local model could read
        elif kind == "tool_use":
            if not isinstance(block.get("input"), dict):
                raise bad_request(f"`{where}.input` must be an object", f"{where}.input")
            calls.append({"id": _string(block, "id", where), "type": "function",
                          "function": {"name": _string(block, "name", where),
                                       "arguments": json.dumps(block["input"])}})
        else:
            raise bad_request(f"`{where}.type` {kind!r} is not supported in an assistant turn "
                              "(text, thinking and tool_use are)", f"{where}.type")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def _tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("`tools` must be an array of tools", "tools")
        chat["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise bad_request("`tool_choice.type` must be auto, any, tool or none", "tool_choice")
    kind = choice["type"]
    keys.check(choice, "tool_choice", ("type", "disable_parallel_tool_use")
               + (("name",) if kind == "tool" else ()))
    if kind == "tool":
        chat["tool_choice"] = {"type": "function",
                               "function": {"name": _string(choice, "name", "tool_choice")}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise bad_request("`tool_choice.disable_parallel_tool_use` must be a boolean",
                              "tool_choice.disable_parallel_tool_use")
        chat["parallel_tool_calls"] = not parallel


# A tool's keys that cannot change the answer: the caching hint, how finely the call's input
# streams (exod streams it as the core decodes it), tool search's deferral left off.
TOOL_HARMLESS: dict[str, keys.Harmless] = {
    "cache_control": keys.anything, "eager_input_streaming": keys.anything,
    "defer_loading": keys.false}


def _tool(tool: Any, i: int) -> dict[str, Any]:
    param = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_request(f"`{param}` must be an object", param)
    kind = tool.get("type", "custom")
    if kind != "custom":
        raise bad_request(f"`{param}.type` {kind!r}: Anthropic's server tools are not "
                          "available here; define a custom tool with `input_schema`",
                          f"{param}.type")
    keys.check(tool, param, ("type", "name", "description", "input_schema", "strict"),
               TOOL_HARMLESS)
    function: dict[str, Any] = {"name": tool.get("name"),
                                "parameters": tool.get("input_schema")}
    if "description" in tool:
        function["description"] = tool["description"]
    if "strict" in tool:
        function["strict"] = tool["strict"]
    if not isinstance(function["parameters"], dict):
        raise bad_request(f"`{param}.input_schema` must be a JSON schema object",
                          f"{param}.input_schema")
    return {"type": "function", "function": function}


def _thinking(body: dict[str, Any], chat: dict[str, Any]) -> None:
    thinks: bool | None = None
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise bad_request("`thinking.type` must be enabled, disabled or adaptive",
                              "thinking.type")
        keys.check(thinking, "thinking", {"enabled": ("type", "budget_tokens", "display"),
                                          "adaptive": ("type", "display")}.get(kind, ("type",)))
        if thinking.get("display") not in (None, "summarized"):
            raise bad_request("`thinking.display` must be summarized: exod returns the "
                              "thinking whole (omitting it is not supported)", "thinking.display")
        if kind == "enabled":
            _budget(thinking.get("budget_tokens"), body.get("max_tokens"))
        thinks = kind != "disabled"
    config = body.get("output_config")
    if config is not None:
        if not isinstance(config, dict):
            raise bad_request("`output_config` must be an object", "output_config")
        for key in config:
            if key not in ("format", "effort"):
                raise bad_request(f"`output_config.{key}` is not supported",
                                  f"output_config.{key}")
        effort = config.get("effort")
        if effort is not None:
            if not isinstance(effort, str) or effort not in EFFORT_THINKS:  # a list: unhashable
                raise bad_request("`output_config.effort` must be one of "
                                  f"{', '.join(EFFORT_THINKS)}", "output_config.effort")
            thinks = EFFORT_THINKS[effort] if thinks is None else thinks
        _format(config.get("format"), chat)
    if thinks is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": thinks}


def think_budget(body: Any) -> int | None:
    """The tokens of reasoning a request allows (`thinking.budget_tokens`, once to_chat has
    checked the body): the runner closes the think block past them. None: unbounded."""
    thinking = body.get("thinking") if isinstance(body, dict) else None
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget: int = thinking["budget_tokens"]
    return budget


def _budget(budget: Any, max_tokens: Any) -> None:
    """Checked as Anthropic checks it (then enforced by the runner: think_budget)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise bad_request("`thinking.budget_tokens` must be a positive integer",
                          "thinking.budget_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and budget >= max_tokens:
        raise bad_request("`thinking.budget_tokens` must be less than `max_tokens`",
                          "thinking.budget_tokens")


def _format(fmt: Any, chat: dict[str, Any]) -> None:
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" \
            or not isinstance(fmt.get("schema"), dict):
        raise bad_request("`output_config.format` must be {type: json_schema, schema: {...}}",
                          "output_config.format")
    keys.check(fmt, "output_config.format", ("type", "schema"))
    chat["response_format"] = {"type": "json_schema",
                               "json_schema": {"name": "output", "schema": fmt["schema"],
                                               "strict": True}}


# ---- errors in Anthropic's shape ---------------------------------------------------------
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


# Chat fields the core may name in an error, as this dialect calls them.
RENAMED = (("stop", "stop_sequences"), ("response_format.json_schema", "output_config.format"),
           ("response_format", "output_config.format"), ("chat_template_kwargs", "thinking"),
           ("parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
           ("tool_choice.function", "tool_choice"))


def renamed(e: ApiError, origins: list[names.Origin]) -> ApiError:
    return names.renamed(e, origins, RENAMED, "input_schema")


def error_status(e: ApiError) -> int:
    """An instance that cannot take the request now (loading, restarting, stopping) is what
    Anthropic calls overloaded: 529, which its clients retry like a 503."""
    return 529 if e.status == 503 else e.status


def error_body(e: ApiError) -> dict[str, Any]:
    status = error_status(e)
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}
