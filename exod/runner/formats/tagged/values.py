"""How a parameter's value is written, by its schema: as raw text (a string, a string enum, a
nullable string), as Python's `True`/`False` (a boolean, where the template prints one so), or
as compact JSON; and how the text of a value is read back into JSON by the same schema.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from exod.core.request_rules import RequestError
from exod.runner.formats.grammar_parts import Param, parameters
from exod.runner.serving import json_bounds

TEXT, BOOL, JSON = "text", "bool", "json"  # how a parameter's value is written


def _defs(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: schema[k] for k in ("$defs", "definitions") if k in schema}


def resolved(schema: Any) -> Any:
    """A property's schema with its local `$ref`s followed (the root's definitions kept
    beside it, as Param carries them)."""
    for _ in range(8):  # a chain of references, not a loop of them
        if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str):
            return schema
        target = json_bounds.pointer(schema, schema["$ref"])
        if not isinstance(target, dict):
            return schema
        schema = {**target, **_defs(schema)}
    return schema


def is_text(schema: Any) -> bool:
    """A string and nothing else: written as the text itself."""
    if not isinstance(schema, dict) or any(k in schema for k in ("anyOf", "oneOf", "allOf",
                                                                  "$ref")):
        return False
    if schema.get("type") == "string":
        return True
    return "type" not in schema and Param("", schema, False).enum is not None


_ASIDE = frozenset({"title", "description", "default", "examples", "deprecated", "$defs",
                    "definitions", "$comment"})  # keys beside a union that change nothing


def _text(schema: Any) -> tuple[dict[str, Any], bool] | None:
    """The string a parameter is written as raw text by, and whether it may be null instead
    (`anyOf` a string and null, or `type: [string, null]`: its template writes None as
    `null`, or `None`, which reads back as None); None: not raw text."""
    schema = resolved(schema)
    if is_text(schema):
        return schema, False
    if not isinstance(schema, dict):
        return None
    kinds = schema.get("type")
    if isinstance(kinds, list) and sorted(kinds) == ["null", "string"] and not any(
            k in schema for k in ("anyOf", "oneOf", "allOf", "$ref", "enum", "const")):
        return {**schema, "type": "string"}, True
    for union in ("anyOf", "oneOf"):
        members = schema.get(union)
        if not isinstance(members, list) or len(members) != 2 or not _ASIDE.issuperset(
                set(schema) - {union}):
            continue
        both = [resolved({**m, **_defs(schema)}) for m in members if isinstance(m, dict)]
        texts = [m for m in both if is_text(m)]
        if len(texts) == 1 and any(m.get("type") == "null" and len(set(m) - _ASIDE) == 1
                                   for m in both):
            return texts[0], True
    return None


def written_as(p: Param, strict: bool, tool: str) -> tuple[str, Param]:
    """How parameter `p` of `tool` is written, and by what schema (a nullable string's string).
    A raw string cannot hold a `pattern` or a `format` the engine enforces: a strict tool with
    one is refused, a lenient one goes without it (as the engine's lenient JSON leaves out
    what it cannot enforce)."""
    text = _text(p.schema)
    if text is not None:
        schema = text[0]
        if strict and ("pattern" in schema or "format" in schema):
            raise RequestError(f"`tools`: {tool!r} is strict, and its parameter {p.name!r} has "
                               "a `pattern` or `format`, which this model writes as raw text "
                               "that the grammar cannot enforce", "tools")
        return TEXT, Param(p.name, schema, p.required)
    schema = resolved(p.schema)
    return BOOL if isinstance(schema, dict) and schema.get("type") == "boolean" else JSON, p


def text_keys(tools: Any, name: str) -> dict[str, bool]:
    """The keys of tool `name` whose values are raw text, each with whether it may be null
    (none for a tool not in `tools`)."""
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            root = parameters(fn)
            props = root.get("properties")
            out = {}
            for k, s in props.items() if isinstance(props, dict) else ():
                text = _text({**s, **_defs(root)}) if isinstance(s, dict) else None
                if text is not None:
                    out[k] = text[1]
            return out
    return {}


def read_value(text: str, raw: bool | None) -> Any:
    """A value read back: raw text as it is (`raw` True: or None, where it may be null); else
    JSON, or the Python literal a template's `| string` prints (`True`, `None`, `{'a': 1}`),
    or the text itself."""
    if raw is not None:
        return None if raw and text.strip() in ("null", "None") else text
    s = text.strip()
    try:
        return json.loads(s, parse_constant=_no_constant)
    except ValueError:
        pass
    try:
        v = ast.literal_eval(s)
        json.dumps(v)  # only what JSON can carry (no set, no bytes)
        return v
    except Exception:  # noqa: BLE001 -- literal_eval raises many kinds on what is not one
        return s


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON")  # NaN, Infinity: no client could read them back
