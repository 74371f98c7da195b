"""Formats that write arguments in a literal syntax of their own, not JSON: Gemma 4's
(`call:NAME{key:<|"|>text<|"|>,n:1}`), FunctionGemma's (`<escape>` strings) and the pythonic one
(LFM2: `[NAME(key="text", n=1)]`).

Calls are forced by one converter: a tool's parameters, bounded as every grammar exod builds
from a JSON schema is (exod.runner.serving.json_bounds: no keys beyond `properties`, 16 integral
and 10 fraction digits, free values 16 containers deep), walked into Lark rules that write each
value in the format's syntax (a `Syntax`: its strings, keys, separators, literals, and whether
keys are sorted, as Gemma's templates `dictsort` them). What the converter cannot write is, for
a strict tool, the request's error (400, `tools`), and for a lenient one the free value.
Numbers are written as JSON writes them (every one of these syntaxes reads a JSON number), so a
bounded number is the engine's own (`%json`).
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from exod.core.request_rules import RequestError
from exod.runner.formats.base import Allowed, Call, Literal, ToolFormat
from exod.runner.formats.grammar_parts import choice, parameters, quoted, repeat, rx
from exod.runner.serving import json_bounds

DEPTH = json_bounds.ANY_DEPTH  # `$ref`s followed on one path at most, and free values' nesting
KEY_CHARS = json_bounds.KEY_CHARS
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
_INT = r"-?(?:0|[1-9][0-9]{0,15})"
_FRACTION = rf"(?:\.[0-9]{{1,{json_bounds.FRACTION_DIGITS}}})?"
# A Python string's escapes that mean what JSON's mean (`\/` does not: Python keeps it as it
# is), and no lone surrogate (Python keeps a pair as two characters, JSON joins it).
_PY_ESCAPE = r"""\\(?:["'\\nrtbf]|u(?:[0-9a-cefA-CEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))"""


class Unwritable(Exception):
    """A value the converter cannot write in a format's syntax (or a keyword it does not
    implement, for a strict tool)."""


# ---- syntaxes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Syntax:
    """How a literal syntax writes JSON values; Lark expressions throughout. `tag` names the rules
    a grammar shares (strings, free values); `values` is the syntax of an object's values and
    `items` of an array's (None: this one)."""

    tag: str
    colon: str = quoted(":")
    comma: str = quoted(",")
    true: str = quoted("true")
    false: str = quoted("false")
    null: str = quoted("null")
    sort_keys: bool = False  # keys in `dictsort`'s order (case-insensitive)
    objects: bool = True  # whether it writes objects as values at all
    max_items: int | None = None  # items an array holds at most (its parser's limit)
    values: Syntax | None = None
    items: Syntax | None = None

    @property
    def of_values(self) -> Syntax:
        return self.values or self

    @property
    def of_items(self) -> Syntax:
        return self.items or self

    def key(self, g: _Grammar, name: str) -> str | None:
        """A named key as Lark; None: one this syntax (its parser) cannot carry."""
        raise NotImplementedError

    def free_key(self, g: _Grammar, name: str, named: list[str]) -> str:
        """The terminal `name`: a key beyond `named`, of at most KEY_CHARS characters."""
        raise NotImplementedError

    def string(self, g: _Grammar, low: int, high: int | None) -> str:
        """Any string of `low` to `high` characters."""
        raise NotImplementedError

    def text(self, g: _Grammar, value: str) -> str | None:
        """The string `value`; None: one it cannot write."""
        raise NotImplementedError


@dataclass(frozen=True)
class Raw(Syntax):
    """Gemma's: a string is its text between two delimiters (a special token each in the model's
    vocabulary, so no escapes), keys bare. `banned`: characters no string may hold (where the
    parser cuts at one); `key_chars`: a regex class of what a bare key is made of."""

    delim: str = ""
    banned: str = ""
    key_chars: str = r"\w"

    def key(self, g: _Grammar, name: str) -> str | None:
        return quoted(name) if re.fullmatch(f"{self.key_chars}+", name) else None

    def free_key(self, g: _Grammar, name: str, named: list[str]) -> str:
        body = f"/{self.key_chars}{{1,{KEY_CHARS}}}/"
        return g.define(name, _except(body, [quoted(k) for k in named]))

    def string(self, g: _Grammar, low: int, high: int | None) -> str:
        d = g.lit(self.delim)
        chars = f"[^{rx(self.banned)}]" if self.banned else "."
        if _special(d):  # text can never hold the token: any text up to it
            body = g.define(f"{self.tag}_STR{_suffix(low, high)}".upper(),
                         f"/(?s:{chars}{_span(low, high)})/")
            return f"{d} {body} {d}"
        # A text delimiter: the string ends at its first occurrence, as the parser cuts it.
        body = g.define(f"{self.tag}_str{_suffix(low, high)}",
                     f"/(?s:{chars}{_span(low, high)}){rx(self.delim)}/", lazy=True)
        return f"{d} {body}"

    def text(self, g: _Grammar, value: str) -> str | None:
        if self.delim in value or any(c in value for c in self.banned):
            return None
        d = g.lit(self.delim)
        return f"{d} {quoted(value)} {d}" if value else f"{d} {d}"


@dataclass(frozen=True)
class Json(Syntax):
    """JSON's strings without escapes and without `banned` (FunctionGemma's arrays, which its
    parser reads with json.loads once it has cut them at the first `,` or `}`)."""

    banned: str = ""

    def _chars(self) -> str:
        return f'[^"\\\\\\x00-\\x1f{rx(self.banned)}]'

    def key(self, g: _Grammar, name: str) -> str | None:
        return self.text(g, name)

    def free_key(self, g: _Grammar, name: str, named: list[str]) -> str:
        body = f'/"{self._chars()}{{0,{KEY_CHARS}}}"/'
        return g.define(name, _except(body, [quoted(json.dumps(k)) for k in named]))

    def string(self, g: _Grammar, low: int, high: int | None) -> str:
        return g.define(f"{self.tag}_STR{_suffix(low, high)}".upper(),
                        f'/"{self._chars()}{_span(low, high)}"/')

    def text(self, g: _Grammar, value: str) -> str | None:
        if not re.fullmatch(f"{self._chars()}*", value):
            return None
        return quoted(json.dumps(value, ensure_ascii=False))


@dataclass(frozen=True)
class Python(Syntax):
    """Python's literals as mlx-lm's pythonic parser reads them (ast.literal_eval, with JSON's
    true/false/null taken too): strings in either quote with escapes, keys as strings, or as
    bare names (`bare`: a call's keyword arguments)."""

    bare: bool = False

    def key(self, g: _Grammar, name: str) -> str | None:
        if not self.bare:
            return self.text(g, name)
        return quoted(name) if name.isidentifier() and not keyword.iskeyword(name) else None

    def free_key(self, g: _Grammar, name: str, named: list[str]) -> str:
        if self.bare:
            body = f"/[A-Za-z_][A-Za-z0-9_]{{0,{KEY_CHARS - 1}}}/"
            return g.define(name, _except(body, [quoted(k) for k in (*keyword.kwlist, *named)]))
        shared = self.string(g, 0, KEY_CHARS)
        forms = [quoted(f) for k in named for f in _py_forms(k)]
        return g.define(name, _except(shared, forms))

    def string(self, g: _Grammar, low: int, high: int | None) -> str:
        span = _span(low, high)
        body = "|".join(f"{q}(?:[^{q}\\\\\\x00-\\x1f]|{_PY_ESCAPE}){span}{q}" for q in "\"'")
        return g.define(f"{self.tag}_STR{_suffix(low, high)}".upper(), f"/{body}/")

    def text(self, g: _Grammar, value: str) -> str | None:
        return "(" + " | ".join(quoted(f) for f in _py_forms(value)) + ")"


def _py_forms(value: str) -> list[str]:
    """A string as JSON writes it and as Python's repr does (both are Python literals)."""
    return list(dict.fromkeys((json.dumps(value, ensure_ascii=False), repr(value))))


# Gemma 4: `key:value` sorted at every level, strings between `<|"|>`, null as Jinja prints
# Python's None (the template's `{{ argument }}`; Gemma4.parse reads it).
GEMMA4 = Raw("g4", null=quoted("None"), sort_keys=True, delim='<|"|>')
# FunctionGemma, as mlx-lm's parser reads it: the call ends at the first `}` (no objects, no
# `}` in a string), a value other than a string ends at the first `,` (arrays of one item at
# most, read as JSON), a key at the first `:`. Sorted, as Gemma's templates write keys.
_FUNCTION_GEMMA_ITEMS = Json("fgj", objects=False, max_items=1, banned=",}")
FUNCTION_GEMMA = Raw("fg", sort_keys=True, objects=False, max_items=1,
                     items=_FUNCTION_GEMMA_ITEMS, delim="<escape>", banned="}",
                     key_chars="[^:{},]")
# LFM2: `name(key=value, ...)`; inside, dicts as JSON (`tojson`) or Python's repr writes them,
# `, ` and `: ` between their parts; the literals of both.
_TRUE, _FALSE, _NULL = '("True" | "true")', '("False" | "false")', '("None" | "null")'
_PYTHON_VALUES = Python("py", colon=quoted(": "), comma=quoted(", "), true=_TRUE, false=_FALSE,
                        null=_NULL)
PYTHONIC = Python("pyk", colon=quoted("="), comma=quoted(", "), true=_TRUE, false=_FALSE,
                  null=_NULL, bare=True, values=_PYTHON_VALUES, items=_PYTHON_VALUES)


# ---- the converter -----------------------------------------------------------------------------
class _Grammar:
    """The rules of one grammar, the shared ones once; `lit`: a marker as Lark."""

    def __init__(self, lit: Literal) -> None:
        self.lit = lit
        self.rules: dict[str, str] = {}

    def define(self, name: str, body: str, lazy: bool = False) -> str:
        if name not in self.rules:
            self.rules[name] = f"{name}{'[lazy]' if lazy else ''}: {body}\n"
        return name

    def text(self) -> str:
        return "".join(self.rules.values())

    def number(self, integer: bool) -> str:
        """A number within json_bounds' default bounds: 16 integral digits, 10 fraction ones."""
        if integer:
            return self.define("LIT_INT", f"/{_INT}/")
        return self.define("LIT_NUM", f"/{_INT}{_FRACTION}/")

    def free(self, syn: Syntax, level: int = DEPTH) -> str:
        """Any JSON value the syntax writes, `level` containers deep at most."""
        name = f"{syn.tag}_any{level}"
        if name in self.rules:
            return name
        if level == 0:
            return self.define(name, " | ".join((syn.string(self, 0, None), self.number(False),
                                                 syn.true, syn.false, syn.null)))
        alts = [self.free(syn, 0)]
        if syn.max_items != 0:
            item = self.free(syn.of_items, level - 1)
            more = _rep(f"({syn.comma} {item})", 0,
                        None if syn.max_items is None else syn.max_items - 1)
            alts.append(f'"[" ({item} {more})? "]"')
        if syn.objects:
            key = syn.free_key(self, f"{syn.tag.upper()}_KEY", [])
            member = f"{key} {syn.colon} {self.free(syn.of_values, level - 1)}"
            alts.append(f'"{{" ({member} ({syn.comma} {member})*)? "}}"')
        return self.define(name, " | ".join(alts))


class _Writer:
    """One tool's arguments as rules of `g` (named `t<index>_...`), in a syntax."""

    def __init__(self, g: _Grammar, index: int, fn: dict[str, Any], strict: bool,
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
        out = [v for v in (_literal(self.g, x, syn) for x in values) if v is not None]
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
def _literal(g: _Grammar, v: Any, syn: Syntax) -> str | None:
    """A JSON value (an enum's, a const) as the syntax writes it; None: one it cannot."""
    if v is None:
        return syn.null
    if isinstance(v, bool):
        return syn.true if v else syn.false
    if isinstance(v, (int, float)):
        return quoted(json.dumps(v))
    if isinstance(v, str):
        return syn.text(g, v)
    if isinstance(v, list):
        if syn.max_items is not None and len(v) > syn.max_items:
            return None
        items = [_literal(g, x, syn.of_items) for x in v]
        if any(x is None for x in items):
            return None
        return '"[" ' + f" {syn.comma} ".join(x for x in items if x) + (' "]"' if v else '"]"')
    if isinstance(v, dict):
        if not syn.objects:
            return None
        keys = sorted(v, key=str.lower) if syn.sort_keys else list(v)
        parts = []
        for k in keys:
            key, value = syn.key(g, k), _literal(g, v[k], syn.of_values)
            if key is None or value is None:
                return None
            parts.append(f"{key} {syn.colon} {value}")
        return '"{" ' + f" {syn.comma} ".join(parts) + (' "}"' if parts else '"}"')
    return None


def _items(elems: list[str], item: str, low: int, high: int | None, comma: str) -> str:
    """An array's items between its brackets: `elems` at their places (prefixItems), then
    `item` (none where ""), `low` to `high` in all."""
    n = len(elems)
    tail_low, tail_high = max(0, low - n), None if high is None else high - n
    expr = ""
    if item and tail_high != 0:
        if n:
            expr = _rep(f"({comma} {item})", tail_low, tail_high)
        else:  # the first item has no comma before it
            more = _rep(f"({comma} {item})", max(0, tail_low - 1),
                        None if tail_high is None else tail_high - 1)
            expr = f"{item} {more}".strip()
            expr = expr if tail_low else f"({expr})?"
    for i in reversed(range(n)):
        seq = f"{elems[i] if i == 0 else f'{comma} {elems[i]}'} {expr}".strip()
        expr = seq if i < low else f"({seq})?"
    return expr


def _rep(expr: str, low: int, high: int | None) -> str:
    """`expr` `low` to `high` times (None: no end); "" for none at all."""
    if high == 0:
        return ""
    if high is None:
        return f"{expr}*" if low == 0 else f"{expr}+" if low == 1 else f"{expr}{{{low},}}"
    return f"{expr}{{{low}}}" if low == high else f"{expr}{{{low},{high}}}"


def _span(low: int, high: int | None) -> str:
    if high is None:
        return "*" if low == 0 else f"{{{low},}}"
    return f"{{{low},{high}}}"


def _suffix(low: int, high: int | None) -> str:
    return f"_{low}_{'n' if high is None else high}"


def _except(body: str, literals: list[str]) -> str:
    """A terminal: `body`, but none of `literals` (Lark strings)."""
    return f"{body} & ~({' | '.join(literals)})" if literals else body


def _special(lark: str) -> bool:
    """Whether a marker, as `lit` wrote it, is a special token (`<[id]>`), never text."""
    return lark.startswith("<")


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


def _named(fn: dict[str, Any], ok: Callable[[str], bool], kind: str) -> str:
    """A tool's name, if the format's parser reads it back: else the request's error."""
    name = fn["name"]
    if not ok(name):
        raise RequestError(f"`tools`: {name!r} is not a name this model's call format "
                           f"({kind}) can write", "tools")
    return str(name)


def _calls(allowed: Allowed, lit: Literal, syn: Syntax, kind: str,
           head: Callable[[dict[str, Any]], tuple[str, str]]) -> str:
    """`call_body`: one call of any allowed tool, `head(fn)` (Lark) before its arguments and
    the closing after; then the converter's rules."""
    g = _Grammar(lit)

    def fn(i: int, f: dict[str, Any]) -> list[str]:
        opening, closing = head(f)
        body = _Writer(g, i, f, f["name"] in allowed.strict, kind).arguments(syn)
        return [f"fn_{i}: {' '.join(x for x in (opening, body, closing) if x)}\n"]
    return "".join(choice(allowed, fn)) + g.text()


# ---- the formats -------------------------------------------------------------------------------
_NONE = re.compile(r"(?<=[:\[,])None(?=[,}\]])")


@dataclass(frozen=True)
class Gemma4(ToolFormat):
    """`<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, one after another: keys bare and
    sorted, strings between `<|"|>` tokens, as Gemma 4's template `format_argument` writes."""

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        def head(f: dict[str, Any]) -> tuple[str, str]:
            name = _named(f, lambda n: re.fullmatch(r"[\w-]+", n) is not None, self.kind)
            return quoted(f"call:{name}{{"), quoted("}")
        return (f"{top}: {repeat('call', '', allowed.most)}\n"
                f"call: {lit(self.start)} call_body {lit(self.end)}\n"
                + _calls(allowed, lit, GEMMA4, self.kind, head))

    def parse(self, body: str, tools: Any) -> list[Call]:
        """mlx-lm's parser, and the template's null: Jinja prints None as `None`, which that
        parser's JSON does not read; outside strings it is read as null."""
        try:
            return super().parse(body, tools)
        except ValueError:
            parts = body.split('<|"|>')
            fixed = '<|"|>'.join(_NONE.sub("null", p) if i % 2 == 0 else p
                                 for i, p in enumerate(parts))
            if fixed == body:
                raise
            return super().parse(fixed, tools)


@dataclass(frozen=True)
class FunctionGemma(ToolFormat):
    """`<start_function_call>call:NAME{key:<escape>text<escape>,n:1}<end_function_call>`, one
    after another, as mlx-lm's parser reads it (see FUNCTION_GEMMA for what it cannot carry)."""

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        def head(f: dict[str, Any]) -> tuple[str, str]:
            name = _named(f, lambda n: re.fullmatch(r"\w+", n) is not None, self.kind)
            return quoted(f"call:{name}{{"), quoted("}")
        return (f"{top}: {repeat('call', '', allowed.most)}\n"
                f"call: {lit(self.start)} call_body {lit(self.end)}\n"
                + _calls(allowed, lit, FUNCTION_GEMMA, self.kind, head))


def _python_name(name: str) -> bool:
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in name.split("."))


@dataclass(frozen=True)
class Pythonic(ToolFormat):
    """`<|tool_call_start|>[NAME(key="text", n=1), ...]<|tool_call_end|>`: every call of the
    turn in one list, arguments as Python keyword arguments (LFM2)."""

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        def head(f: dict[str, Any]) -> tuple[str, str]:
            return quoted(f"{_named(f, _python_name, self.kind)}("), quoted(")")
        calls = repeat("call_body", quoted(", "), allowed.most)
        return (f'{top}: {lit(self.start)} "[" {calls} "]" {lit(self.end)}\n'
                + _calls(allowed, lit, PYTHONIC, self.kind, head))


# mlx-lm's parser module -> the class that forces calls in that format.
KINDS: dict[str, type[ToolFormat]] = {"gemma4": Gemma4, "function_gemma": FunctionGemma,
                                      "pythonic": Pythonic}
