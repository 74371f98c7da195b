"""OpenAI Responses requests (`POST /v1/responses`, stateless) onto the one request every
dialect becomes (exod.api.request.GenRequest).

What each field is, is the dialect's table (exod.api.dialects.responses.fields); each field
passes the core's rules under the name the client sent (`max_output_tokens`,
`input[3].arguments`), so an error names what the client sent. Codex's `namespace` tools are
unfolded into functions named `NAMESPACE__NAME` (Codex's own flat spelling); a call to one
comes back with `name` and `namespace` apart, as Codex's tool router reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exod.api.fields import ImageReader, Reading
from exod.api.dialects.responses.fields import RESPONSES
from exod.api.request import GenRequest, http, pictured, tool_names
from exod.api.seal import Sealer, Seals
from exod.core import images
from exod.core import request_rules as rules
from exod.core.images import Pictures, Source
from exod.wire.messages import Generate, ToolChoice

# A local chat template has one thinking switch (`enable_thinking`), not a scale of effort.
EFFORT_THINKS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True,
                 "xhigh": True}
SUMMARIES = ("auto", "concise", "detailed")
ROLES = ("user", "assistant", "system", "developer")
FORMATS = ("text", "json_object", "json_schema")
CALL_KEYS = ("call_id", "name", "arguments")
DELIMITER = "__"  # Codex's, between a namespace and a function's name
# What the response object repeats of the request as it came (exod.api.dialects.
# responses_output), and no rule of its own reads as text and numbers: it must be JSON exod can
# write (a lone surrogate cut a stream after its head; NaN made an answer no JSON).
ECHOED = ("metadata", "tools", "tool_choice", "text", "reasoning")


@dataclass(frozen=True)
class ResponsesView:
    """What the answer needs beyond the core's."""

    # The functions of namespace tools: the name the model was offered -> (namespace, name).
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)
    encrypted: bool = False  # include: reasoning.encrypted_content


def flat_name(namespace: str, name: str) -> str:
    """A namespace's function as one name (Codex's `canonical_flat_name`)."""
    return f"{namespace.rstrip('_')}{DELIMITER}{name.lstrip('_')}"


@http
def parse(body: Any, sealer: Sealer, strict: bool = False) -> tuple[GenRequest, ResponsesView]:
    r = Reading(RESPONSES, strict)
    b = rules.body(body)
    r.keys(b, "body")
    for key in ECHOED:
        rules.plain(b.get(key), key)
    messages = []
    if b.get("instructions") is not None:
        messages.append({"role": "system",
                         "content": rules.text_field(b["instructions"], "instructions")})
    pics = Pictures()
    messages += _input(b.get("input"), r, sealer.seals(), pics)
    shown = pictured(pics, messages)
    listed, origins, namespaces = _tools(b.get("tools"), r)
    choice, function = _tool_choice(b.get("tool_choice"), listed, r)
    gen = Generate(
        id="", kind="chat", messages=messages,
        max_tokens=rules.max_tokens(b.get("max_output_tokens"), "max_output_tokens",
                                    rules.DEFAULT_MAX_TOKENS_CHAT),
        temperature=rules.number("temperature", b.get("temperature")),
        top_p=rules.number("top_p", b.get("top_p")),
        tools=rules.for_template(listed), strict_tools=rules.strict_tools(listed),
        tool_choice=choice, tool_name=function,
        parallel_tool_calls=rules.flag(b.get("parallel_tool_calls"), "parallel_tool_calls",
                                       True),
        response_format=_text(b.get("text"), choice, r),
        chat_template_kwargs=_reasoning(b.get("reasoning"), r),
        names={"messages": "input", "max_tokens": "max_output_tokens",
               "response_format": "text.format",
               "response_format.json_schema.schema": "text.format.schema",
               **tool_names(origins), **shown.names},
        images=shown.images)
    stream = rules.stream(b.get("stream"))
    # response.completed carries the usage: the core's usage chunk gives it.
    return (GenRequest(gen, rules.model(b.get("model")), stream, stream, r.ignored,
                       tuple(pics.sources)),
            ResponsesView(namespaces, _include(b.get("include"), r)))


def _include(raw: Any, r: Reading) -> bool:
    """Whether reasoning items carry `encrypted_content`."""
    if raw is None:
        return False
    wanted = [value for i, value in enumerate(rules.array(raw, "include", 64))
              if r.variant(value, "include", f"include[{i}]", key="")]
    return "reasoning.encrypted_content" in wanted


def _input(raw: Any, r: Reading, seals: Seals, pics: Pictures) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": rules.text(raw, "input")}]
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []  # a reasoning item belongs to the assistant turn after it
    for item, param in r.items(rules.array(raw, "input", nonempty=True, what="items"), "input",
                               "item", "item", default="message"):
        kind = item.get("type", "message")
        r.keys(item, kind, param)
        if kind == "message":
            msg = _message(item, param, r, pics)
            if msg["role"] == "assistant" and reasoning:
                msg["reasoning_content"] = "".join(reasoning)
                reasoning = []
            out.append(msg)
        elif kind == "function_call":
            _call(item, param, out, reasoning)
            reasoning = []
        elif kind == "function_call_output":
            tool = {"role": "tool",
                    "tool_call_id": rules.text_field(item.get("call_id"), f"{param}.call_id"),
                    "content": _output(item.get("output"), f"{param}.output", r)}
            if item.get("name") is not None:
                tool["name"] = rules.name(_called(item, param), f"{param}.name")
            out.append(tool)
        else:  # reasoning
            reasoning += _reasoning_texts(item, param, r, seals)
    return out


def _called(item: dict[str, Any], param: str) -> str:
    """The name of the function an item names, as the model was offered it."""
    name = rules.text_field(item.get("name"), f"{param}.name")
    namespace = item.get("namespace")
    if namespace in (None, ""):
        return name
    return flat_name(rules.text_field(namespace, f"{param}.namespace"), name)


def _reasoning_texts(item: dict[str, Any], param: str, r: Reading,
                     seals: Seals) -> list[str]:
    """A reasoning item's text: its `content` (what exod returns); else the reasoning its
    `encrypted_content` seals (exod's: Codex sends that back, without the content); else its
    `summary` (what OpenAI returns), the best account of the reasoning the client has."""
    found: dict[str, list[str]] = {}
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        for j, part in enumerate(rules.array(item.get(key) or [], f"{param}.{key}")):
            where = f"{param}.{key}[{j}]"
            if not (isinstance(part, dict) and part.get("type") == part_type):
                raise rules.RequestError(f"`{where}` must be a {part_type} part", where)
            found.setdefault(key, []).append(rules.text_field(part.get("text"),
                                                              f"{where}.text"))
    if found.get("content"):
        return found["content"]
    sealed = item.get("encrypted_content")
    if sealed:
        text = seals.open(sealed, f"{param}.encrypted_content")
        if text is not None:
            return [text]
        r.ignore(f"{param}.encrypted_content")  # another server's, or altered
    return found.get("summary") or []


def _output(raw: Any, param: str, r: Reading) -> str:
    """A tool's output: a string, or text parts (joined)."""
    if isinstance(raw, str):
        return rules.text(raw, param)
    return "".join(r.texts(raw, param, "output_part", "part"))


def _message(item: dict[str, Any], param: str, r: Reading,
             pics: Pictures) -> dict[str, Any]:
    role = rules.one_of(item.get("role"), ROLES, f"{param}.role")
    raw = item.get("content")
    where = f"{param}.content"
    content = rules.text(raw, where) if isinstance(raw, str) else images.joined(
        r.content(raw, where, "part", "part", pics, {"input_image": _image(r)}))
    # Chat templates know `system`; `developer` is OpenAI's newer name for it.
    return {"role": "system" if role == "developer" else role, "content": content}


def _image(r: Reading) -> ImageReader:
    def read(part: dict[str, Any], where: str) -> Source:
        r.keys(part, "image_part", where)
        return images.image_url(part.get("image_url"), f"{where}.image_url")
    return read


def _call(item: dict[str, Any], param: str, out: list[dict[str, Any]],
          reasoning: list[str]) -> None:
    """A function call joins the assistant turn just before it, or starts one."""
    call_id = rules.text_field(item.get("call_id"), f"{param}.call_id")
    rules.text_field(item.get("arguments"), f"{param}.arguments")
    call = rules.call(call_id, _called(item, param), item["arguments"], param, CALL_KEYS)
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
        return
    turn: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
    if reasoning:
        turn["reasoning_content"] = "".join(reasoning)
    out.append(turn)


def _tools(raw: Any, r: Reading) -> tuple[list[dict[str, Any]], list[str],
                                          dict[str, tuple[str, str]]]:
    """The function tools (namespaces unfolded), where each came from, and the namespaces'."""
    if raw is None:
        return [], [], {}
    listed, origins = [], []
    namespaces: dict[str, tuple[str, str]] = {}
    for tool, param in r.items(raw, "tools", "tool", "tool"):
        if tool["type"] == "function":
            r.keys(tool, "tool", param)
            if tool.get("defer_loading") is True:  # left out until a tool search: none here
                continue
            listed.append(rules.function(tool, param))
            origins.append(f"{param}.parameters")
            continue
        r.keys(tool, "namespace", param)
        namespace = rules.name(tool.get("name"), f"{param}.name")
        for inner, where in r.items(tool.get("tools") or [], f"{param}.tools", "nested", "tool",
                                    rules.MAX_TOOLS):
            r.keys(inner, "nested", where)
            if inner.get("defer_loading") is True:
                continue
            function = rules.function(inner, where)
            name = function["function"]["name"]
            # Each part within OpenAI's 64 characters, as the client checked it; the flat name
            # may be longer (an MCP server's long name before a tool's): Codex sends such.
            flat = function["function"]["name"] = flat_name(namespace, name)
            listed.append(function)
            origins.append(f"{where}.parameters")
            namespaces[flat] = (namespace, name)
    return rules.unique(listed, "tools"), origins, namespaces


def _tool_choice(raw: Any, listed: list[dict[str, Any]],
                 r: Reading) -> tuple[ToolChoice, str | None]:
    if raw is None or raw in rules.TOOL_CHOICES:
        chosen: ToolChoice = "required" if raw == "required" else "none" if raw == "none" \
            else "auto"
        rules.choice(chosen, listed, "tool_choice")
        return chosen, None
    if not (isinstance(raw, dict) and raw.get("type") == "function"):
        raise rules.RequestError("`tool_choice` must be none, auto, required or {type: "
                                 "function, name}", "tool_choice")
    r.keys(raw, "tool_choice", "tool_choice")
    name = raw.get("name")
    if isinstance(name, str) and raw.get("namespace"):
        name = flat_name(rules.text_field(raw["namespace"], "tool_choice.namespace"), name)
    return "function", rules.named(name, listed, "tool_choice.name")


def _text(raw: Any, choice: str, r: Reading) -> dict[str, Any] | None:
    if raw is None:
        return None
    r.keys(rules.obj(raw, "text"), "text", "text")
    fmt = raw.get("format")
    if fmt is None:
        return None
    r.keys(rules.obj(fmt, "text.format"), "format", "text.format")
    kind = rules.one_of(fmt.get("type"), FORMATS, "text.format.type")
    if kind != "json_schema":  # a schema beside them would go unused
        for key in ("name", "schema", "strict"):
            if fmt.get(key) is not None:
                raise rules.RequestError(f"`text.format.{key}` needs `type: json_schema`",
                                         f"text.format.{key}")
        return None if kind == "text" else rules.json_output(None, False, choice, "text.format")
    rules.name(fmt.get("name"), "text.format.name")
    return rules.json_output(fmt.get("schema", {}),
                             rules.flag(fmt.get("strict"), "text.format.strict"), choice,
                             "text.format", "text.format.schema")


def _reasoning(raw: Any, r: Reading) -> dict[str, Any]:
    if raw is None:
        return {}
    r.keys(rules.obj(raw, "reasoning"), "reasoning_config", "reasoning")
    for key in ("summary", "generate_summary"):  # exod returns the reasoning whole, as content
        if raw.get(key) is not None:
            rules.one_of(raw[key], SUMMARIES, f"reasoning.{key}")
    effort = raw.get("effort")
    if effort is None:
        return {}
    return {"enable_thinking": EFFORT_THINKS[rules.one_of(effort, tuple(EFFORT_THINKS),
                                                          "reasoning.effort")]}
