"""Tools and structured output (what the model can take is the runner's: its template, the
grammar engine)."""

from __future__ import annotations

from typing import Any

from exod.core.request_rules.base import RequestError, depth, flag, known_keys, name, text_field

MAX_TOOLS = 128  # OpenAI's own limit on `tools`
MAX_SCHEMA_BYTES = 64 * 1024  # default of an instance's grammar.max_schema_kib
TOOL_CHOICES = ("none", "auto", "required")
TOOL_KEYS = ("type", "function")
FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def schema(raw: Any, param: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise RequestError(f"`{param}` must be a JSON schema (an object)", param)
    return depth(raw, param)


def tools(raw: Any) -> list[dict[str, Any]]:
    """`tools`: functions with unique names; what the chat template receives."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise RequestError(f"`tools` must be an array of at most {MAX_TOOLS} tools", "tools")
    out = [tool(t, f"tools[{i}]") for i, t in enumerate(raw)]
    names = [t["function"]["name"] for t in out]
    if len(set(names)) < len(names):
        raise RequestError("`tools`: two tools have the same name", "tools")
    return out


def tool(raw: Any, param: str) -> dict[str, Any]:
    f = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(f, dict):
        raise RequestError(f'`{param}` must be {{"type": "function", "function": {{...}}}}',
                           param)
    known_keys(raw, TOOL_KEYS, param)
    known_keys(f, FUNCTION_KEYS, f"{param}.function")
    fn: dict[str, Any] = {"name": name(f.get("name"), f"{param}.function.name")}
    if f.get("description") is not None:
        fn["description"] = text_field(f["description"], f"{param}.function.description")
    if f.get("parameters") is not None:
        fn["parameters"] = schema(f["parameters"], f"{param}.function.parameters")
    # Not for the template: the runner reads it from `strict_tools`.
    flag(f.get("strict"), f"{param}.function.strict")
    return {"type": "function", "function": fn}


def strict_tools(raw: Any) -> list[str]:
    """The names of the tools marked `strict: true` (once `tools` has checked them): a call's
    arguments must follow the tool's parameters, forced or validated (exod.runner.serving.
    strict_args); the parameters must be enforceable whole by the grammar engine."""
    return [t["function"]["name"] for t in raw or [] if t["function"].get("strict") is True]


def tool_choice(raw: Any, listed: list[dict[str, Any]]) -> tuple[str, str | None]:
    """("none" | "auto" | "required" | "function", the named function or None)."""
    if raw is None or raw in TOOL_CHOICES:
        choice = raw or "auto"
        if choice == "required" and not listed:
            raise RequestError("`tool_choice` is required but `tools` is empty", "tool_choice")
        return choice, None
    f = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise RequestError('`tool_choice` must be "none", "auto", "required" or {"type": '
                           '"function", "function": {"name": ...}}', "tool_choice")
    if f["name"] not in {t["function"]["name"] for t in listed}:
        raise RequestError(f"`tool_choice` names {f['name'][:64]!r}, which is not in `tools`",
                           "tool_choice")
    return "function", f["name"]


def response_format(raw: Any, choice: str) -> dict[str, Any] | None:
    """None (text), {"type": "json_object"}, or {"type": "json_schema", "schema", "strict"}."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if raw is None:
        return None
    if kind not in ("text", "json_object", "json_schema"):
        raise RequestError('`response_format.type` must be "text", "json_object" or '
                           '"json_schema"', "response_format")
    if kind == "text":  # a schema beside it would be ignored: refused by name instead
        known_keys(raw, ("type",), "response_format")
        return None
    if choice in ("required", "function"):  # the call's arguments follow the tool's parameters
        raise RequestError("`response_format` cannot be combined with a `tool_choice` that "
                           "forces a tool call", "response_format")
    if kind == "json_object":
        known_keys(raw, ("type",), "response_format")
        return {"type": "json_object"}
    known_keys(raw, ("type", "json_schema"), "response_format")
    spec, param = raw.get("json_schema"), "response_format.json_schema"
    if not isinstance(spec, dict):
        raise RequestError(f"`{param}` must be an object with `name` and `schema`", param)
    known_keys(spec, ("name", "description", "schema", "strict"), param)
    name(spec.get("name"), f"{param}.name")
    return {"type": "json_schema", "strict": flag(spec.get("strict"), f"{param}.strict"),
            "schema": schema(spec.get("schema", {}), f"{param}.schema")}


def schema_bytes(size: int, limit: int, param: str) -> None:
    """A request's schemas (compact JSON bytes) within the instance's grammar.max_schema_kib."""
    if size > limit:
        raise RequestError(f"`{param}`: the schemas are {size} bytes as compact JSON, more than "
                           f"this instance's grammar.max_schema_kib ({limit >> 10} KiB)", param)
