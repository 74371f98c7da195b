"""Tools and structured output (what the model can take is the runner's: its template, the
grammar engine)."""

from __future__ import annotations

from typing import Any

from exod.core.request_rules.base import (RequestError, array, depth, flag, name,
                                          text_field)

MAX_TOOLS = 128  # OpenAI's own limit on `tools`
MAX_SCHEMA_BYTES = 64 * 1024  # default of an instance's grammar.max_schema_kib
TOOL_CHOICES = ("none", "auto", "required")
FUNCTION_KEYS = ("name", "description", "parameters", "strict")  # chat completions' spelling


def schema(raw: Any, param: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise RequestError(f"`{param}` must be a JSON schema (an object)", param)
    return depth(raw, param)


def tools(raw: Any) -> list[dict[str, Any]]:
    """Chat completions' `tools`: functions with unique names; what the chat template
    receives."""
    if raw is None:
        return []
    array(raw, "tools", MAX_TOOLS, what="tools")
    return unique([tool(t, f"tools[{i}]") for i, t in enumerate(raw)], "tools")


def tool(raw: Any, param: str) -> dict[str, Any]:
    f = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(f, dict):
        raise RequestError(f'`{param}` must be {{"type": "function", "function": {{...}}}}',
                           param)
    return function(f, f"{param}.function")


def function(raw: dict[str, Any], param: str,
             keys: tuple[str, str, str, str] = FUNCTION_KEYS) -> dict[str, Any]:
    """A function tool from its name, description, parameters and strict flag (the keys of
    `raw` at `param`, as the dialect spells them: Anthropic's `input_schema`), as the chat
    template takes it; `strict` stays beside it for `strict_tools`."""
    at = {k: f"{param}.{k}" for k in keys}
    name_key, description_key, parameters_key, strict_key = keys
    fn: dict[str, Any] = {"name": name(raw.get(name_key), at[name_key])}
    if raw.get(description_key) is not None:
        fn["description"] = text_field(raw[description_key], at[description_key])
    if raw.get(parameters_key) is not None:
        fn["parameters"] = schema(raw[parameters_key], at[parameters_key])
    out: dict[str, Any] = {"type": "function", "function": fn}
    if flag(raw.get(strict_key), at[strict_key]):
        out["strict"] = True  # not for the template: strict_tools takes it off
    return out


def unique(listed: list[dict[str, Any]], param: str) -> list[dict[str, Any]]:
    """Tools with unique names, as templates take them (their `strict` mark taken off: see
    `strict_tools`)."""
    if len(listed) > MAX_TOOLS:
        raise RequestError(f"`{param}` must be an array of at most {MAX_TOOLS} tools", param)
    names = [t["function"]["name"] for t in listed]
    if len(set(names)) < len(names):
        raise RequestError(f"`{param}`: two tools have the same name", param)
    return listed


def strict_tools(listed: list[dict[str, Any]]) -> list[str]:
    """The names of the tools marked strict by `function`: a call's arguments must follow the
    tool's parameters, forced or validated (exod.runner.serving.strict_args); the parameters
    must be enforceable whole by the grammar engine."""
    return [t["function"]["name"] for t in listed if t.get("strict")]


def for_template(listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as the chat template receives them (no `strict` mark)."""
    return [{"type": "function", "function": t["function"]} for t in listed]


def tool_choice(raw: Any, listed: list[dict[str, Any]]) -> tuple[str, str | None]:
    """Chat completions' `tool_choice`: ("none" | "auto" | "required" | "function", the named
    function or None)."""
    if raw is None or raw in TOOL_CHOICES:
        return choice(raw or "auto", listed, "tool_choice"), None
    f = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(f, dict):
        raise RequestError('`tool_choice` must be "none", "auto", "required" or {"type": '
                           '"function", "function": {"name": ...}}', "tool_choice")
    return "function", named(f.get("name"), listed, "tool_choice")


def choice(kind: str, listed: list[dict[str, Any]], param: str) -> str:
    """A choice that needs no name ("none", "auto", "required"), against the tools."""
    if kind == "required" and not listed:
        raise RequestError(f"`{param}` is required but `tools` is empty", param)
    return kind


def named(raw: Any, listed: list[dict[str, Any]], param: str) -> str:
    """The one tool a choice names, which must be among the tools."""
    if not isinstance(raw, str):
        raise RequestError(f"`{param}` must name a tool", param)
    if raw not in {t["function"]["name"] for t in listed}:
        raise RequestError(f"`{param}` names {raw[:64]!r}, which is not in `tools`", param)
    return raw


def response_format(raw: Any, choice: str) -> dict[str, Any] | None:
    """Chat completions' `response_format`: None (text), {"type": "json_object"}, or
    {"type": "json_schema", "schema", "strict"}."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if raw is None:
        return None
    if kind not in ("text", "json_object", "json_schema"):
        raise RequestError('`response_format.type` must be "text", "json_object" or '
                           '"json_schema"', "response_format")
    if raw.get("json_schema") is not None and kind != "json_schema":  # it would go unused
        raise RequestError("`response_format.json_schema` needs `type: json_schema`",
                           "response_format.json_schema")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_output(None, False, choice, "response_format")
    spec, param = raw.get("json_schema"), "response_format.json_schema"
    if not isinstance(spec, dict):
        raise RequestError(f"`{param}` must be an object with `name` and `schema`", param)
    name(spec.get("name"), f"{param}.name")
    return json_output(spec.get("schema", {}), flag(spec.get("strict"), f"{param}.strict"),
                       choice, "response_format", f"{param}.schema")


def json_output(raw_schema: Any, strict: bool, choice: str, param: str,
                schema_param: str = "") -> dict[str, Any]:
    """Structured output (the dialect's `param`): any JSON object when `raw_schema` is None,
    else JSON that follows it (its field at `schema_param`)."""
    if choice in ("required", "function"):  # the call's arguments follow the tool's parameters
        raise RequestError(f"`{param}` cannot be combined with a `tool_choice` that forces a "
                           "tool call", param)
    if raw_schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "strict": strict,
            "schema": schema(raw_schema, schema_param or param)}


def schema_bytes(size: int, limit: int, param: str) -> None:
    """A request's schemas (compact JSON bytes) within the instance's grammar.max_schema_kib."""
    if size > limit:
        raise RequestError(f"`{param}`: the schemas are {size} bytes as compact JSON, more than "
                           f"this instance's grammar.max_schema_kib ({limit >> 10} KiB)", param)
