"""The converter: a tool's parameters, bounded (exod.runner.serving.json_bounds), walked into
Lark rules that write each value in a literal syntax (exod.runner.formats.literals.syntax), its
keys in the schema's order or sorted where the syntax sorts them. `$ref`s become rules of their
own, `allOf`s of plain objects are merged, alternatives the syntax cannot write are left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

from exod.core.request_rules import RequestError
from exod.runner.formats.grammar_parts import parameters
from exod.runner.formats.literals.syntax import DEPTH, KEY_CHARS, Grammar, Syntax, constant, rep
from exod.runner.serving import json_bounds

_FREE_REF = f"#/$defs/{json_bounds.ANY}_"  # where `bounded` points a free value
# The patterns `bounded` writes into patternProperties to bound the keys beyond `properties`:
# keys of at most KEY_CHARS characters take the extra schema, longer ones nothing.
_SHORT_KEYS = f"^(?s:.){{0,{KEY_CHARS}}}$"
_LONG_KEYS = f"^(?s:.){{{KEY_CHARS + 1},}}$"
# Keywords the converter does not implement: a strict tool that uses one is refused, a lenient
# one has it left out (as the engine's lenient JSON mode leaves out what it does not know).
_UNFORCED = ("pattern", "format", "minProperties", "maxProperties", "uniqueItems", "contains",
             "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
             "dependencies", "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_HARMLESS: tuple[Any, ...] = (None, False, 0, {}, [])  # their values that constrain nothing
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


class Unwritable(Exception):
    """A value the converter cannot write in a format's syntax (or a keyword it does not
    implement, for a strict tool)."""


class Writer:
    """One tool's arguments as rules of `g` (named `t<index>_...`), in a syntax."""

    def __init__(self, g: Grammar, index: int, fn: dict[str, Any], strict: bool,
                 kind: str) -> None:
        self.g, self.prefix, self.strict, self.kind = g, f"t{index}", strict, kind
        self.name = fn["name"]
        self.root = json_bounds.bounded(parameters(fn))
        self.made = 0
        self.refs: dict[tuple[str, int, str], str] = {}

    def arguments(self, syn: Syntax) -> str:
        """The members of the call's arguments (no braces: the format writes its own)."""
        try:
            root = self.merged(self.root if isinstance(self.root, dict) else {}, 0)
            self.check(root)
            if self.strict and any(isinstance(root.get(k), list) for k in ("anyOf", "oneOf")):
                raise Unwritable("alternatives (`anyOf`) over the arguments as a whole")
            return self.members(root, syn, 0)
        except Unwritable as e:
            if self.strict:
                raise self.error(e) from e
            key = syn.free_key(self.g, f"{syn.tag.upper()}_KEY", [])
            return self.sequence([], f"{key} {syn.colon} {self.g.free(syn.of_values)}",
                                 syn.comma)

    def error(self, e: Unwritable) -> RequestError:
        return RequestError(f"`tools`: {self.name!r} is strict, and its parameters hold {e}, "
                            f"which this model's call format ({self.kind}) cannot force",
                            "tools")

    def rule(self, body: str, hint: str = "v") -> str:
        self.made += 1
        return self.g.define(f"{self.prefix}_{hint}{self.made}", body)

    def write(self, s: Any, syn: Syntax, depth: int) -> str:
        """A value of schema `s` where one must be: what cannot be written is the free value
        (lenient) or the request's error (strict)."""
        try:
            return self.value(s, syn, depth)
        except Unwritable as e:
            if self.strict:
                raise self.error(e) from e
            return self.g.free(syn)

    def value(self, s: Any, syn: Syntax, depth: int) -> str:
        if s is False:
            raise Unwritable("a schema that allows no value")
        if not isinstance(s, dict) or json_bounds.is_free(s):
            return self.g.free(syn)
        ref = s.get("$ref")
        if isinstance(ref, str) and ref.startswith(_FREE_REF) and ref[len(_FREE_REF):].isdigit():
            return self.g.free(syn, int(ref[len(_FREE_REF):]))
        if depth > DEPTH:  # merges that lead back to themselves
            return self.g.free(syn)
        self.check(s)
        if isinstance(ref, str) and json_bounds.is_free(_without(s, "$ref")):
            return self.ref(ref, syn, depth)
        if "$ref" in s or "allOf" in s:
            return self.value(self.merged(s, depth), syn, depth + 1)
        if "const" in s:
            return self.consts([s["const"]], syn)
        if isinstance(s.get("enum"), list):
            return self.consts(s["enum"], syn)
        for key in ("anyOf", "oneOf"):  # oneOf as anyOf: which one matched is not enforced
            if isinstance(s.get(key), list):
                rest = _without(s, key)
                members = [m if json_bounds.is_free(rest) or not isinstance(m, dict)
                           else {**rest, **m} for m in s[key]]
                return self.either([partial(self.value, m, syn, depth) for m in members])
        types = _types(s)
        if types is None:
            return self.g.free(syn)
        if "integer" in types and "number" in types:
            types.remove("integer")
        return self.either([partial(self.typed, s, t, syn, depth) for t in types])

    def either(self, makers: list[Callable[[], str]]) -> str:
        """Any one of the alternatives: those the syntax cannot write are left out (the values
        written stay valid), unless all are."""
        out: list[str] = []
        why = Unwritable("no alternative at all")
        for make in makers:
            try:
                out.append(make())
            except Unwritable as e:
                why = e
        if not out:
            raise why
        out = list(dict.fromkeys(out))
        return out[0] if len(out) == 1 else "(" + " | ".join(out) + ")"

    def typed(self, s: dict[str, Any], t: str, syn: Syntax, depth: int) -> str:
        if t == "null":
            return syn.null
        if t == "boolean":
            return f"({syn.true} | {syn.false})"
        if t in ("integer", "number"):
            return self.number(s, t)
        if t == "string":
            low, high = _int(s.get("minLength")), s.get("maxLength")
            high = high if isinstance(high, int) and not isinstance(high, bool) else None
            if high is not None and high < low:
                raise Unwritable("a string shorter than its `minLength`")
            return syn.string(self.g, low, high)
        if t == "array":
            return self.array(s, syn, depth)
        if t == "object":
            if not syn.objects:
                raise Unwritable("an object inside a call")
            return self.rule(f'"{{" {self.members(s, syn, depth)} "}}"')
        raise Unwritable(f"the type {t!r}")

    def number(self, s: dict[str, Any], t: str) -> str:
        bounds = {k: s[k] for k in _NUMBER_KEYS if k in s}
        default: dict[str, Any] = {"minimum": -json_bounds.INT_BOUND,
                                   "maximum": json_bounds.INT_BOUND}
        if t == "number":
            default["multipleOf"] = float(f"1e-{json_bounds.FRACTION_DIGITS}")
        if bounds == default:
            return self.g.number(t == "integer")
        # The schema's own bounds: the engine's number, which each of these syntaxes reads.
        schema = {"type": t, **bounds, "x-guidance": json_bounds.options(self.strict)}
        return self.rule(f"%json {json.dumps(schema)}", "n")

    def check(self, s: dict[str, Any]) -> None:
        """A strict tool's keyword the converter does not implement: the request's error at
        once (an alternative that holds one is not left out: the client asked for it)."""
        if self.strict:
            found = next((k for k in _UNFORCED if s.get(k) not in _HARMLESS), None)
            if found is not None:
                raise self.error(Unwritable(f"`{found}`"))

    def ref(self, ref: str, syn: Syntax, depth: int) -> str:
        """A definition, a rule of its own on each level of `$ref`s it is reached at; past
        DEPTH levels (a recursive schema), the free value."""
        if depth >= DEPTH:
            return self.g.free(syn)
        key = (ref, depth, syn.tag)
        if key not in self.refs:
            target = json_bounds.pointer(self.root, ref)
            if target is None:
                raise Unwritable(f"a `$ref` to nothing here ({ref})")
            self.refs[key] = name = f"{self.prefix}_r{len(self.refs)}_{depth}"
            try:
                self.g.define(name, self.value(target, syn, depth + 1))
            except Unwritable:
                del self.refs[key]
                raise
        return self.refs[key]

    def merged(self, s: dict[str, Any], depth: int) -> dict[str, Any]:
        """A `$ref` beside other keywords, or an `allOf`, as one schema: the one member that
        says anything, or plain objects merged (their properties and required keys)."""
        parts: list[Any] = [_without(s, "$ref", "allOf")]
        if isinstance(s.get("$ref"), str):
            parts.append({"$ref": s["$ref"]})
        members = s.get("allOf")
        parts += members if isinstance(members, list) else []
        found: list[dict[str, Any]] = []
        for p in parts:
            for _ in range(DEPTH - depth):  # a chain of `$ref`s, followed
                if not (isinstance(p, dict) and isinstance(p.get("$ref"), str)
                        and json_bounds.is_free(_without(p, "$ref"))):
                    break
                if p["$ref"].startswith(_FREE_REF):
                    break
                p = json_bounds.pointer(self.root, p["$ref"])
            if p is False:
                raise Unwritable("an `allOf` that allows no value")
            if isinstance(p, dict) and not json_bounds.is_free(_without(p, "$defs",
                                                                         "definitions")):
                found.append(_without(p, "$defs", "definitions"))
        if len(found) <= 1:
            return found[0] if found else {}
        if not all(_plain_object(p) for p in found):
            raise Unwritable("an `allOf` of more than plain objects")
        props: dict[str, Any] = {}
        for p in found:
            for k, v in (p.get("properties") or {}).items():
                if k in props and props[k] != v:
                    raise Unwritable(f"an `allOf` that describes {k!r} twice")
                props[k] = v
        required = [k for p in found for k in p.get("required") or () if isinstance(k, str)]
        out = {"type": "object", "properties": props, "required": list(dict.fromkeys(required))}
        if "additionalProperties" in parts[0]:  # the merged object's own: else closed
            out["additionalProperties"] = parts[0]["additionalProperties"]
        return out

    def consts(self, values: list[Any], syn: Syntax) -> str:
        out = [v for v in (constant(self.g, x, syn) for x in values) if v is not None]
        if not out:
            raise Unwritable("values this format cannot write")
        return out[0] if len(out) == 1 else "(" + " | ".join(dict.fromkeys(out)) + ")"

    def array(self, s: dict[str, Any], syn: Syntax, depth: int) -> str:
        if isinstance(s.get("prefixItems"), list):
            prefix, tail = s["prefixItems"], s.get("items", True)
        elif isinstance(s.get("items"), list):
            prefix, tail = s["items"], s.get("additionalItems", True)
        else:
            prefix, tail = [], s.get("items", True)
        low, high = _int(s.get("minItems")), s.get("maxItems")
        high = high if isinstance(high, int) and not isinstance(high, bool) else None
        for cap in (syn.max_items, len(prefix) if tail is False else None):
            if cap is not None:
                high = cap if high is None else min(high, cap)
        if high is not None and low > high:
            raise Unwritable("an array longer than this format writes one")
        isyn = syn.of_items
        elems = [self.write(p, isyn, depth) for p in prefix[:high]]
        more = tail is not False and (high is None or high > len(prefix))
        item = self.write(tail, isyn, depth) if more else ""
        inner = _items(elems, item, low, high, syn.comma)
        return self.rule(f'"[" {inner} "]"' if inner else '"[" "]"')

    def members(self, s: dict[str, Any], syn: Syntax, depth: int) -> str:
        """An object's members between its braces: its properties in order (sorted, where the
        syntax sorts), each required one written, then keys beyond them where allowed."""
        given = s.get("properties")
        props: dict[str, Any] = given if isinstance(given, dict) else {}
        required = {k for k in s.get("required") or () if isinstance(k, str)}
        extra = s.get("additionalProperties")
        extra = True if extra is True else extra if isinstance(extra, dict) else None
        patterns = s.get("patternProperties")
        for pattern, v in (patterns.items() if isinstance(patterns, dict) else ()):
            if pattern == _SHORT_KEYS:
                extra = v
            elif pattern != _LONG_KEYS and self.strict:
                raise Unwritable("`patternProperties`")
        named = list(dict.fromkeys([*props, *sorted(required - set(props))]))
        if syn.sort_keys:
            named.sort(key=str.lower)  # as Jinja's dictsort: case-insensitive, stable
        vsyn = syn.of_values
        out: list[tuple[str, bool]] = []
        for k in named:
            schema = props.get(k, True if extra is None else extra)
            key = syn.key(self.g, k)
            if key is None or schema is False:
                if k in required:
                    raise Unwritable(f"the required key {k!r}, which it cannot write")
                continue  # an optional key it cannot write: left out
            out.append((f"{key} {syn.colon} {self.write(schema, vsyn, depth)}", k in required))
        more = None
        if extra is not None and extra is not False:
            key = syn.free_key(self.g, self.rule_name("K"), named)
            more = f"{key} {syn.colon} {self.write(extra, vsyn, depth)}"
        return self.sequence(out, more, syn.comma)

    def rule_name(self, hint: str) -> str:
        self.made += 1
        return f"{self.prefix}_{hint}{self.made}".upper()

    def sequence(self, members: list[tuple[str, bool]], extra: str | None, comma: str) -> str:
        """Members in order, the optional ones may be left out, `extra` (keys beyond them) any
        number of times after them; separated by `comma`, none leading. Built from the end:
        `after` is the rest once something is written (a rule), `first` the rest before
        anything is (an expression, a rule where an optional member leads to it)."""
        after = self.rule(f"({comma} {extra})*", "s") if extra else ""
        first = f"({extra} ({comma} {extra})*)?" if extra else ""
        for i in reversed(range(len(members))):
            member, required = members[i]
            head = f"{member} {after}".strip()
            if i == 0 or not members[i - 1][1]:  # else a required member before drops it
                first = head if required else (f"{head} | {self.rule(first, 's')}" if first
                                               else f"({head})?")
            if i:  # the first member's rest has nothing before it: no `after`
                after = self.rule(f"{comma} {head}" if required
                                  else f"({comma} {member})? {after}".strip(), "s")
        return self.rule(first, "s") if first else ""


# ---- helpers -----------------------------------------------------------------------------------
def _items(elems: list[str], item: str, low: int, high: int | None, comma: str) -> str:
    """An array's items between its brackets: `elems` at their places (prefixItems), then
    `item` (none where ""), `low` to `high` in all."""
    n = len(elems)
    tail_low, tail_high = max(0, low - n), None if high is None else high - n
    expr = ""
    if item and tail_high != 0:
        if n:
            expr = rep(f"({comma} {item})", tail_low, tail_high)
        else:  # the first item has no comma before it
            more = rep(f"({comma} {item})", max(0, tail_low - 1),
                       None if tail_high is None else tail_high - 1)
            expr = f"{item} {more}".strip()
            expr = expr if tail_low else f"({expr})?"
    for i in reversed(range(n)):
        seq = f"{elems[i] if i == 0 else f'{comma} {elems[i]}'} {expr}".strip()
        expr = seq if i < low else f"({seq})?"
    return expr


def _without(s: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in s.items() if k not in keys}


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _types(s: dict[str, Any]) -> list[str] | None:
    """The types a schema allows; without `type`, the one its keywords describe (None: any)."""
    t = s.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return list(dict.fromkeys(x for x in t if isinstance(x, str)))
    for kind, words in (("object", ("properties", "additionalProperties", "required",
                                    "patternProperties")),
                        ("array", ("items", "prefixItems", "minItems", "maxItems")),
                        ("string", ("minLength", "maxLength", "pattern", "format")),
                        ("number", _NUMBER_KEYS)):
        if any(w in s for w in words):
            return [kind]
    return None


_OBJECT_WORDS = frozenset({"type", "properties", "required", "additionalProperties",
                           "title", "description", "default", "examples", "$comment"})


def _plain_object(s: dict[str, Any]) -> bool:
    return _OBJECT_WORDS.issuperset(s) and s.get("type", "object") == "object" \
        and isinstance(s.get("properties", {}), dict)
