"""`strict: true` tools whose calls are not forced (`tool_choice: auto`): the arguments of such a
call are checked, once the call is parsed, against the tool's `parameters` by the grammar engine
that forces calls (llguidance, with the instance's bounds), so a strict schema means the same
thing whether the call was forced or not. A call that does not validate is dropped and logged,
as one that does not parse is (exod.runner.formats.splitter).

The engine reads the arguments one byte per token (a tokenizer of the 256 bytes, built here):
what is checked is the JSON text, whatever the model's tokenizer. It reads an object's
properties in the order its schema lists them, so the arguments are written in that order
first (`ordered`): the order of keys means nothing in JSON. The schema is bounded as a forced
call's is (exod.runner.serving.json_bounds). Its regular expressions run in linear time, and its
fuel bounds every step: no schema a client sends can stall the runner, as a backtracking
validator could on a hostile `pattern`. No mlx here: unit-tested on its own.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import llguidance

from exod.wire.options import GrammarLimits
from exod.core.request_rules import RequestError
from exod.core.text import clip
from exod.runner.serving import json_bounds

EOS = 256
MAX_VISITS = 10_000  # schema nodes `ordered` may look at for one call: past it, keys stay as sent
_lock = threading.Lock()
_bytes: llguidance.LLTokenizer | None = None


class _ByteTokens:
    """One token per byte, and an end token: what llguidance's TokenizerWrapper reads."""

    eos_token_id = EOS
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"</s>"]
    special_token_ids = [EOS]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)


def byte_tokenizer() -> llguidance.LLTokenizer:
    global _bytes
    with _lock:
        if _bytes is None:
            _bytes = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokens()), slices=[])
        return _bytes


class ArgsCheck:
    """The strict tools of one request, each compiled once (where the request is read: a schema
    the engine cannot take is a 400 naming it), and checked after each call."""

    def __init__(self, tools: list[dict[str, Any]], strict: list[str],
                 limits: GrammarLimits, named: Callable[[str], str] = str) -> None:
        self._schemas: dict[str, Any] = {}
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        for i, t in enumerate(tools):
            f = t["function"]
            if f["name"] not in strict:
                continue
            param = named(f"tools[{i}].function.parameters")  # as the client spelled it
            schema = json_bounds.bounded(f.get("parameters") or {"type": "object"})
            self._schemas[f["name"]] = schema
            self._matchers[f["name"]] = _matcher(schema, limits, param)

    def __bool__(self) -> bool:
        return bool(self._matchers)

    def error(self, name: str, arguments: str) -> str | None:
        """Why the arguments (a JSON object's text) do not validate; None when they do, or
        when the tool is not strict."""
        matcher = self._matchers.get(name)
        if matcher is None:
            return None
        text = canonical(ordered(json.loads(arguments), self._schemas[name]))
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate in a string"
        matcher = matcher.deep_copy()  # the compiled one stays fresh (a reset keeps an error)
        if matcher.consume_tokens(list(data)) and matcher.is_accepting():
            return None
        why = matcher.get_error() if matcher.is_error() else "the arguments end too soon"
        return clip(why, 200, flat=True)


def _matcher(schema: Any, limits: GrammarLimits, param: str) -> llguidance.LLMatcher:
    """The engine's matcher of `schema` (bounded already), strict: enforceable whole."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), overrides=json_bounds.options(strict=True))
        matcher = llguidance.LLMatcher(
            byte_tokenizer(), grammar, log_level=0, limits=llguidance.LLParserLimits(
                max_grammar_size=limits.max_size, max_lexer_states=limits.max_lexer_states,
                initial_lexer_fuel=limits.compile_fuel, step_lexer_fuel=limits.step_fuel,
                verbose_errors=False))
    except Exception as e:  # noqa: BLE001 -- ValueError for a bad schema; a panic for a big one
        raise RequestError(f"`{param}`: a strict tool's parameters must be enforceable whole "
                           f"by the grammar engine: {_clip(str(e))}", param) from None
    if matcher.is_error():
        raise RequestError(f"`{param}`: a strict tool's parameters must be enforceable whole "
                           f"by the grammar engine: {_clip(matcher.get_error())}", param)
    return matcher


def canonical(value: Any) -> str:
    """Compact JSON as the engine writes it: a float with an integral value as an integer (JSON
    Schema counts 1.0 as an integer; the engine's integers have no point), other floats without
    an exponent (a bounded number has none: exod.runner.serving.json_bounds), DEL escaped."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_text(k)}:{canonical(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 2 ** 53:
            return str(int(value))
        return format(Decimal(repr(value)), "f")
    if isinstance(value, str):
        return _text(value)
    return json.dumps(value)


def _text(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def ordered(value: Any, schema: Any) -> Any:
    """`value` with each object's keys in the order its schemas list them (following local
    `$ref`s and the branches of `allOf`, `anyOf` and `oneOf`), keys they do not list after, as
    sent. Looks at MAX_VISITS schema nodes at most."""
    budget = [MAX_VISITS]
    return _ordered(value, [schema], schema, budget)


def _ordered(value: Any, schemas: list[Any], root: Any, budget: list[int]) -> Any:
    if not isinstance(value, (dict, list)):
        return value
    found = _expand(schemas, root, budget)
    if isinstance(value, list):
        out = []
        for i, item in enumerate(value):
            subs = [s["items"] for s in found if isinstance(s.get("items"), dict)]
            subs += [s["prefixItems"][i] for s in found
                     if isinstance(s.get("prefixItems"), list) and i < len(s["prefixItems"])]
            out.append(_ordered(item, subs, root, budget))
        return out
    order: list[str] = []
    for s in found:
        props = s.get("properties")
        if isinstance(props, dict):
            order += [k for k in props if k not in order]
    keys = [k for k in order if k in value] + [k for k in value if k not in order]
    result = {}
    for k in keys:
        subs = [s["properties"][k] for s in found
                if isinstance(s.get("properties"), dict) and k in s["properties"]]
        subs += [s["additionalProperties"] for s in found
                 if isinstance(s.get("additionalProperties"), dict)]
        result[k] = _ordered(value[k], subs, root, budget)
    return result


def _expand(schemas: list[Any], root: Any, budget: list[int]) -> list[dict[str, Any]]:
    """The object schemas that may apply to one value: `schemas` and what they refer to."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    stack = list(reversed(schemas))
    while stack and budget[0] > 0:
        s = stack.pop()
        if not isinstance(s, dict) or id(s) in seen:
            continue
        seen.add(id(s))
        budget[0] -= 1
        out.append(s)
        more: list[Any] = []
        ref = s.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            more.append(json_bounds.pointer(root, ref))
        for key in ("allOf", "anyOf", "oneOf"):
            if isinstance(s.get(key), list):
                more += s[key]
        stack += reversed(more)
    return out


def _clip(text: str) -> str:
    return clip(text, 300, flat=True)
