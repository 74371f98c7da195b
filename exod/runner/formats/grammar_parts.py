"""The parts every forced grammar is built from (Lark, llguidance's dialect): a tool's arguments
as JSON, its parameters one by one (formats that write a call parameter by parameter), and a
bounded repetition of calls. Pure: grammars are text here; the engine compiles them
(exod.runner.serving.grammar).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from exod.core.request_rules import RequestError
from exod.runner.formats.base import Allowed
from exod.runner.serving import json_bounds

_META = set("\\.+*?()|[]{}^$#&-~/")  # what a regex of the engine must escape


def rx(text: str) -> str:
    """`text` as itself inside a `/.../` regex of the engine."""
    return "".join("\\" + c if c in _META else c for c in text)


def quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def repeat(rule: str, sep: str, most: int) -> str:
    """`rule`, then up to `most - 1` more, each after `sep` (a Lark expression, "" for none)."""
    if most <= 1:
        return rule
    return f"{rule} ({sep} {rule}){{0,{most - 1}}}" if sep else f"{rule}{{1,{most}}}"


def parameters(fn: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters: a JSON schema of an object ({"type": "object"} when it has none)."""
    params = fn.get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def json_args(fn: dict[str, Any], allowed: Allowed) -> str:
    """A tool's arguments as compact JSON, bounded (exod.runner.serving.json_bounds): the
    parameters are a schema's root, so their local `$ref`s resolve as the client meant.
    Lenient (keywords the engine does not implement left out) unless the tool is strict."""
    return json_bounds.json_rule(parameters(fn), fn["name"] in allowed.strict)


def choice(allowed: Allowed, write: Callable[[int, dict[str, Any]], list[str]],
           name: str = "call_body") -> list[str]:
    """`name: fn_0 | fn_1 | ...`, and the rules `write(i, fn)` gives each allowed tool (they
    define `fn_i`)."""
    rules = [f"{name}: {' | '.join(f'fn_{i}' for i in range(len(allowed.functions)))}\n"]
    for i, fn in enumerate(allowed.functions):
        rules += write(i, fn)
    return rules


@dataclass(frozen=True)
class Param:
    """One property of a tool's parameters, as formats that write a call parameter by
    parameter take it: `schema` carries the root's definitions, so a `$ref` still resolves."""

    name: str
    schema: Any
    required: bool

    @property
    def enum(self) -> list[str] | None:
        """A string enum (or const): written as one of its values, raw."""
        s = self.schema
        if not isinstance(s, dict):
            return None
        values = s.get("enum", [s["const"]] if "const" in s else None)
        if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
            return values
        return None


def params(fn: dict[str, Any], param: str = "tools") -> Iterator[Param]:
    """The properties of a tool's parameters, in the schema's order. A tool whose parameters
    allow keys beyond `properties` cannot be written parameter by parameter: 400."""
    root = parameters(fn)
    props = root.get("properties") or {}
    if not isinstance(props, dict):
        props = {}
    extra = root.get("additionalProperties")
    if extra not in (None, False) or root.get("patternProperties"):
        raise RequestError(f"`{param}`: {fn['name']!r} takes keys beyond its `properties`, "
                           "which this model's call format cannot force", param)
    defs = {k: root[k] for k in ("$defs", "definitions") if k in root}
    required = set(root.get("required") or ())
    for name, schema in props.items():
        yield Param(name, {**schema, **defs} if isinstance(schema, dict) else schema,
                    name in required)


def json_value(p: Param, strict: bool) -> str:
    """A parameter's value as compact JSON (its own schema, bounded)."""
    return json_bounds.json_rule(p.schema, strict)
