"""Anthropic Messages requests (`POST /v1/messages`, `/v1/messages/count_tokens`) onto the one
request every dialect becomes (exod.api.request.GenRequest).

What each field is, is the dialect's table (exod.api.dialects.anthropic.fields); each field
passes the core's rules under the name the client sent (`stop_sequences`,
`tools[0].input_schema`), so an error names what the client sent.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from exod.api.errors import ApiError
from exod.api.limit_errors import QUOTA_CODE
from exod.api.dialects.anthropic.fields import MESSAGES
from exod.api.fields import Reading
from exod.api.request import GenRequest, http, pictured, tool_names
from exod.api.seal import Sealer, Seals
from exod.core import context_edits, images
from exod.core import request_rules as rules
from exod.core.images import Pictures, Source
from exod.wire.messages import Generate, ToolChoice

# Thinking and effort map onto the chat template's switch (`enable_thinking`): a local
# template has no effort scale, only on or off.
EFFORT_THINKS = {"low": False, "medium": True, "high": True, "xhigh": True, "max": True}
THINKING = ("enabled", "disabled", "adaptive")
DISPLAYS = ("summarized", "omitted")
TOOL_KEYS = ("name", "description", "input_schema", "strict")
CALL_KEYS = ("id", "name", "input")
BLOCK_KINDS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image")


@dataclass(frozen=True)
class AnthropicView:
    """What the answer needs beyond the core's."""

    omit_thinking: bool = False  # thinking.display: omitted
    edits: bool = False  # context_management was asked for: the answer reports it


@http
def parse(body: Any, sealer: Sealer, strict: bool = False,
          count_only: bool = False) -> tuple[GenRequest, AnthropicView]:
    r = Reading(MESSAGES, strict)
    b = rules.body(body)
    r.keys(b, "count" if count_only else "body")
    messages = _system(b.get("system"), r)
    seals = sealer.seals()
    pics = Pictures()
    for i, msg in enumerate(rules.messages(b.get("messages"))):
        messages += _message(msg, f"messages[{i}]", r, seals, pics)
    shown = pictured(pics, messages)
    listed, origins = _tools(b.get("tools"), r)
    choice, function, parallel = _tool_choice(b.get("tool_choice"), listed, r)
    thinks, budget, omit = _thinking(b, r, count_only)
    fmt = _output_config(b.get("output_config"), choice, r)
    thinks = fmt[1] if thinks is None else thinks
    edits = _context_management(b.get("context_management"), r)
    names = {**tool_names(origins), "response_format": "output_config.format",
             "context_edits": "context_management",
             "response_format.json_schema.schema": "output_config.format.schema"}
    gen = Generate(
        id="", kind="chat", messages=messages, count_only=count_only,
        max_tokens=1 if count_only else rules.max_tokens(
            rules.required(b.get("max_tokens"), "max_tokens"), "max_tokens"),
        stop=[] if count_only else rules.stop(b.get("stop_sequences"), "stop_sequences"),
        temperature=rules.number("temperature", b.get("temperature")),
        top_p=rules.number("top_p", b.get("top_p")), top_k=rules.top_k(b.get("top_k")),
        tools=rules.for_template(listed), strict_tools=rules.strict_tools(listed),
        tool_choice=choice, tool_name=function, parallel_tool_calls=parallel,
        response_format=fmt[0],
        chat_template_kwargs={} if thinks is None else {"enable_thinking": thinks},
        think_budget=budget, names={**names, **shown.names}, context_edits=edits,
        images=shown.images)
    stream = False if count_only else rules.stream(b.get("stream"))
    # A stream's message_delta carries the usage: the core's usage chunk gives it.
    return (GenRequest(gen, rules.model(b.get("model")), stream, stream, r.ignored,
                       tuple(pics.sources)),
            AnthropicView(omit, b.get("context_management") is not None))


def _system(raw: Any, r: Reading) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"role": "system", "content": rules.text(raw, "system")}]
    return [{"role": "system", "content": _texts(raw, "system", r, "system", "\n\n")}]


def _texts(raw: Any, param: str, r: Reading, kind: str, sep: str = "") -> str:
    """Text blocks (what a system prompt or a tool result holds) as text; `kind`: their
    variants' table."""
    if isinstance(raw, str):
        return rules.text(raw, param)
    return sep.join(r.texts(raw, param, kind, "system" if kind == "system" else "text"))


def _message(raw: Any, param: str, r: Reading, seals: Seals,
             pics: Pictures) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: a user turn's tool results become `tool` messages
    (first, as chat templates expect them right after the assistant's calls). A `system` turn
    stays in place: the runner moves it into the leading system turn when the model's template
    takes system turns only first."""
    rules.obj(raw, param)
    r.keys(raw, "message", param)
    role = rules.one_of(raw.get("role"), ("user", "assistant", "system"), f"{param}.role")
    content = raw.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": rules.text(content, f"{param}.content")}]
    if role == "system":
        return [{"role": "system", "content": _texts(content, f"{param}.content", r, "result")}]
    blocks = []
    for block, where in r.items(content, f"{param}.content", "block", "content block"):
        r.keys(block, block["type"], where)
        blocks.append((block["type"], block, where))
    if role == "assistant":
        return [_assistant(blocks, r, seals)]
    return _user(blocks, r, pics)


def _user(blocks: list[tuple[str, dict[str, Any], str]], r: Reading,
          pics: Pictures) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for kind, block, where in blocks:
        if kind == "text":
            parts.append({"type": "text",
                          "text": rules.text_field(block.get("text"), f"{where}.text")})
        elif kind == "image":
            parts.append(pics.add(_image(block, where, r)))
        elif kind == "tool_result":
            text = _texts(block.get("content", ""), f"{where}.content", r, "result")
            if rules.flag(block.get("is_error"), f"{where}.is_error"):
                text = f"Error: {text}"
            call_id = rules.text_field(block.get("tool_use_id"), f"{where}.tool_use_id")
            results.append({"role": "tool", "content": text, "tool_call_id": call_id})
        else:
            raise rules.RequestError(f"`{where}.type` {kind!r} belongs to an assistant turn",
                                     f"{where}.type")
    return results + ([{"role": "user", "content": images.joined(parts)}] if parts else [])


def _image(block: dict[str, Any], where: str, r: Reading) -> Source:
    """An image block's picture: its `source`, base64 bytes or a URL."""
    source = rules.obj(block.get("source"), f"{where}.source")
    if not r.variant(source.get("type"), "source", f"{where}.source"):
        raise rules.RequestError(f"`{where}.source.type` must be base64 or url",
                                 f"{where}.source.type")
    kind = source["type"]
    r.keys(source, kind, f"{where}.source")
    if kind == "base64":
        return replace(images.base64_data(source.get("data"), f"{where}.source.data"),
                       where=where)
    return replace(images.image_url(source.get("url"), f"{where}.source.url"), where=where)


def _assistant(blocks: list[tuple[str, dict[str, Any], str]], r: Reading,
               seals: Seals) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for kind, block, where in blocks:
        if kind == "text":
            texts.append(rules.text_field(block.get("text"), f"{where}.text"))
        elif kind == "thinking":
            thinking.append(_thought(block, where, r, seals))
        elif kind == "tool_use":
            if not isinstance(block.get("input"), dict):
                raise rules.RequestError(f"`{where}.input` must be an object", f"{where}.input")
            calls.append(rules.call(block.get("id"), block.get("name"), block["input"], where,
                                    CALL_KEYS))
        elif kind in ("tool_result", "image"):
            raise rules.RequestError(f"`{where}.type` {kind!r} belongs to a user turn",
                                     f"{where}.type")
        # redacted_thinking: Anthropic's encrypted thinking, no text a local model could read
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if any(thinking):
        out["reasoning_content"] = "".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def _thought(block: dict[str, Any], where: str, r: Reading, seals: Seals) -> str:
    """A thinking block's text: as sent, or (empty, as `display: omitted` returns it) the one
    its signature seals; a signature exod did not make is ignored, and reported."""
    text = rules.text_field(block.get("thinking", ""), f"{where}.thinking")
    if text or not block.get("signature"):
        return text
    sealed = seals.open(block["signature"], f"{where}.signature")
    if sealed is None:
        r.ignore(f"{where}.signature")
        return ""
    return sealed


def _tools(raw: Any, r: Reading) -> tuple[list[dict[str, Any]], list[str]]:
    if raw is None:
        return [], []
    listed, origins = [], []
    for tool, param in r.items(raw, "tools", "tool", "tool", rules.MAX_TOOLS, "custom"):
        r.keys(tool, "tool", param)
        if tool.get("defer_loading") is True:  # left out until a tool search: none here
            continue
        rules.schema(tool.get("input_schema"), f"{param}.input_schema")
        listed.append(rules.function(tool, param, TOOL_KEYS))
        origins.append(f"{param}.input_schema")
    return rules.unique(listed, "tools"), origins


def _tool_choice(raw: Any, listed: list[dict[str, Any]],
                 r: Reading) -> tuple[ToolChoice, str | None, bool]:
    """(chat's tool_choice, the named tool, parallel calls)."""
    if raw is None:
        return "auto", None, True
    r.keys(rules.obj(raw, "tool_choice"), "tool_choice", "tool_choice")
    kind = rules.one_of(raw.get("type"), ("auto", "any", "tool", "none"), "tool_choice.type")
    parallel = not rules.flag(raw.get("disable_parallel_tool_use"),
                              "tool_choice.disable_parallel_tool_use")
    if kind == "tool":
        return "function", rules.named(raw.get("name"), listed, "tool_choice.name"), parallel
    chosen: ToolChoice = "required" if kind == "any" else "auto" if kind == "auto" else "none"
    rules.choice(chosen, listed, "tool_choice")
    return chosen, None, parallel


def _thinking(b: dict[str, Any], r: Reading,
              count_only: bool) -> tuple[bool | None, int | None, bool]:
    """(the template's switch or None, the thinking budget, whether thinking is omitted)."""
    raw = b.get("thinking")
    if raw is None:
        return None, None, False
    r.keys(rules.obj(raw, "thinking"), "thinking_config", "thinking")
    kind = rules.one_of(raw.get("type"), THINKING, "thinking.type")
    display = raw.get("display")
    omit = display is not None and rules.one_of(display, DISPLAYS, "thinking.display") == \
        "omitted"
    budget = None
    if kind == "enabled":
        budget = rules.integer(rules.required(raw.get("budget_tokens"), "thinking.budget_tokens"),
                               "thinking.budget_tokens", 1, 1, rules.MAX_THINK_BUDGET)
        if not count_only:  # checked as Anthropic checks it (then enforced by the runner)
            rules.below(budget, b.get("max_tokens"), "thinking.budget_tokens", "max_tokens")
    elif raw.get("budget_tokens") is not None:
        raise rules.RequestError("`thinking.budget_tokens` needs `type: enabled`",
                                 "thinking.budget_tokens")
    return kind != "disabled", budget, omit


def _output_config(raw: Any, choice: str,
                   r: Reading) -> tuple[dict[str, Any] | None, bool | None]:
    """(response_format, the switch `effort` asks for)."""
    if raw is None:
        return None, None
    r.keys(rules.obj(raw, "output_config"), "output_config", "output_config")
    effort = raw.get("effort")
    thinks = None if effort is None else \
        EFFORT_THINKS[rules.one_of(effort, tuple(EFFORT_THINKS), "output_config.effort")]
    fmt = raw.get("format")
    if fmt is None:
        return None, thinks
    r.keys(rules.obj(fmt, "output_config.format"), "format", "output_config.format")
    rules.one_of(fmt.get("type"), ("json_schema",), "output_config.format.type")
    return rules.json_output(rules.required(fmt.get("schema"), "output_config.format.schema"),
                             True, choice, "output_config.format",
                             "output_config.format.schema"), thinks


def _context_management(raw: Any, r: Reading) -> list[dict[str, Any]]:
    if raw is None:
        return []
    r.keys(rules.obj(raw, "context_management"), "context_management", "context_management")
    out = []
    for e, where in r.items(raw.get("edits") or [], "context_management.edits", "edit", "edit",
                            16):
        kind = e["type"]
        r.keys(e, "clear_thinking" if kind == context_edits.THINKING else "clear_tool_uses", where)
        for key in context_edits.AMOUNTS:
            if isinstance(e.get(key), dict):
                r.keys(e[key], f"amount.{key}", f"{where}.{key}")
        out.append(context_edits.edit(e, kind, where))
    return out


# ---- errors in Anthropic's shape ---------------------------------------------------------
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def error_status(e: ApiError) -> int:
    """An instance that cannot take the request now (loading, restarting, stopping) is what
    Anthropic calls overloaded: 529, which its clients retry like a 503. So is a key's quota
    used up (exod.api.limit_errors), whose `x-should-retry: false` stops their retries."""
    return 529 if e.status == 503 or e.code == QUOTA_CODE else e.status


def error_body(e: ApiError) -> dict[str, Any]:
    status = error_status(e)
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.said("anthropic")}}
